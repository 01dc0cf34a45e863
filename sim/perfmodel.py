"""A performance model calibrated on RTL runs, for sizes the RTL simulation cannot reach.

Each phase of a training iteration (lookup, update, checkpoint) of each RTL mode
(TrainingCXL, gpu-direct) is a linear function of counts that follow from the workload
and a batch's indices alone (:func:`features`): tables, indices, distinct rows, lines
per row, pooled-vector lines, MLP lines on the batches that copy the MLP. TrainingCXL's
undo log adds one mechanism a linear fit cannot follow, modelled as the logger does it
(``docs/checkpoint.md``, "When records are written"): the records of the lines a batch
captures while its LOOKUPs gather are held on chip up to the logger's high-water mark
(:func:`hw.ckpt.logger.hold_lines`); the records of the lines past it are written
during the LOOKUPs (the LOOKUP phase pays for them), and the held ones after them,
behind the GPU's work, where the UPDATE, which waits for the log to drain, pays what
the GPU window does not hide. Both cost :attr:`PerfModel.undo_line_cycles` per undo
line, one fitted constant. The GPU phase is the GPU model itself
(``DLRM.gpu_cycles`` plus, for gpu-direct, its pooling and update FLOPs), as in the RTL
flow. The coefficients are fitted by least squares on the per-batch phase cycles of
RTL runs (:data:`FIT_POINTS`, ``sim/train.py`` on the platform given; the undo-line
cost by a search over :data:`UNDO_LINE_CYCLES`), and the model is then checked on RTL
runs it was not fitted on (:data:`HELDOUT_POINTS`): the relative error of the cycles
per iteration of each mode. ``docs/performance.md`` ("Performance model") has the
figures; ``python -m sim.bench --only perfmodel`` writes ``build/bench/perfmodel.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hw.ckpt.logger import hold_lines
from hw.config import DeviceConfig

from . import embedding
from .dlrm import DLRM
from .workloads import SyntheticClicks, Workload, get_workload

__all__ = ["FIT_POINTS", "HELDOUT_POINTS", "PHASE_FEATURES", "UNDO_LINE_CYCLES", "PerfModel",
           "Point", "features", "fit", "log_cycles", "predict_run"]


@dataclass(frozen=True)
class Point:
    """One RTL run: a preset with ``batch`` samples per batch for ``batches`` batches."""
    preset: str
    batch: int
    batches: int = 3

    @property
    def name(self) -> str:
        return f"{self.preset}-b{self.batch}x{self.batches}"

    def workload(self) -> Workload:
        return get_workload(self.preset).with_overrides(batch=self.batch, batches=self.batches)


#: Runs the coefficients are fitted on, and runs held out to check them (larger batches
#: of each preset, so the check is an extrapolation, as the model's use is). K is 4 in
#: every preset: the ``default`` runs train 4 batches so that the MLP copy (29 KB) is in
#: them; the other presets' MLPs (1.9 and 8.9 MB) would take most of the simulation,
#: so their runs stop at 3 batches and the per-line cost of the copy comes from
#: ``default``.
FIT_POINTS = (Point("default", 4, 4), Point("default", 8, 4), Point("default", 16, 4),
              Point("kaggle-like", 4), Point("kaggle-like", 8),
              Point("multi-hot", 2), Point("multi-hot", 4))
HELDOUT_POINTS = (Point("default", 24, 4), Point("default", 32, 4), Point("kaggle-like", 12),
                  Point("kaggle-like", 16), Point("multi-hot", 6), Point("multi-hot", 8))

#: The linear features of each (mode, phase) (names of :func:`features`' keys). A
#: TrainingCXL UPDATE costs a latency chain per table, its gradient feed reads one
#: gradient vector per bag (``pooled_lines``), and the coalesced update reads and writes
#: every distinct row. (Its accumulation, a cycle per index line, is left out: in these
#: runs the index and distinct-row lines are so correlated that a fit with both gave the
#: index lines a negative cost; ``docs/performance.md``.) The undo log's share of the
#: TrainingCXL LOOKUP and UPDATE is not linear: :func:`log_cycles`.
PHASE_FEATURES: dict[tuple[str, str], tuple[str, ...]] = {
    ("trainingcxl", "lookup"): ("one", "tables", "index_lines"),
    ("trainingcxl", "update"): ("tables", "distinct_lines", "pooled_lines"),
    ("trainingcxl", "checkpoint"): ("mlp_copy", "mlp_lines"),
    ("baseline", "lookup"): ("one", "distinct_lines"),
    ("baseline", "update"): ("one", "distinct_lines"),
    ("baseline", "checkpoint"): ("one", "undo_lines", "mlp_lines"),
}


#: The undo-line costs :func:`fit` tries (cycles per undo-log line written, 0.05 apart).
UNDO_LINE_CYCLES = tuple(round(0.05 * i, 2) for i in range(20, 401))

#: The logger's high-water mark of the configuration the model is fitted on by default
#: (``default``'s ``ckpt_fifo_lines``).
DEFAULT_HOLD_LINES = hold_lines(DeviceConfig().ckpt_fifo_lines)


def features(w: Workload, seed: int, hold: int = DEFAULT_HOLD_LINES) -> list[dict[str, float]]:
    """Per batch ``1..w.batches`` of :class:`SyntheticClicks` with ``seed``: the counts
    the phase models use. ``hold`` is the logger's high-water mark in lines: the undo
    lines of the captured lines up to it are ``held_undo_lines``, the rest
    ``excess_undo_lines`` (the undo lines spread evenly over the captured lines)."""
    lpr = embedding.lines_per_row(w.dim, w.dtype)
    vec_lines = math.ceil(w.dim * np.dtype(w.dtype).itemsize / 64)
    model = DLRM(w, seed)
    mlp_lines = math.ceil(len(model.params_bytes()) / 64)
    gpu_step = float(model.gpu_cycles(w.batch))
    data = SyntheticClicks(w, seed)
    out = []
    for b in range(1, w.batches + 1):
        sparse = data.batch(b - 1).sparse
        n = sum(len(i) for i, _ in sparse)
        d = sum(len(np.unique(i)) for i, _ in sparse)
        copy = float(b % w.mlp_ckpt_every == 0)
        undo = float(d * (1 + lpr))
        held = undo * min(1.0, hold / (n * lpr)) if n else 0.0
        out.append({"one": 1.0, "tables": float(w.num_tables), "index_lines": float(n * lpr),
                    "distinct_lines": float(d * lpr), "undo_lines": undo,
                    "held_undo_lines": held, "excess_undo_lines": undo - held,
                    "pooled_lines": float(w.batch * w.num_tables * vec_lines),
                    "mlp_copy": copy, "mlp_lines": copy * mlp_lines, "indices": float(n),
                    "gpu_step": gpu_step})
    return out


def gpu_cycles(w: Workload, mode: str, f: dict[str, float]) -> float:
    """The GPU phase of the batch with features ``f`` as the RTL flow models it
    (``tb/train_dlrm.py``)."""
    cycles = f["gpu_step"]
    if mode == "baseline":                              # pooling and update on the GPU
        cycles += math.ceil(2 * f["indices"] * w.dim / w.gpu_flops_per_cycle)
    return cycles


def log_cycles(mode: str, phase: str, f: dict[str, float], undo_line_cycles: float) -> float:
    """The undo log's share of a phase at ``undo_line_cycles`` per undo line: for a
    TrainingCXL LOOKUP the records written during it, for its UPDATE what of the held
    records' writes the GPU phase does not hide; nothing elsewhere."""
    if mode != "trainingcxl":
        return 0.0
    if phase == "lookup":
        return undo_line_cycles * f["excess_undo_lines"]
    if phase == "update":
        return max(0.0, undo_line_cycles * f["held_undo_lines"] - f["gpu_step"])
    return 0.0


@dataclass
class PerfModel:
    """Fitted coefficients per (mode, phase), in the order of :data:`PHASE_FEATURES`,
    the cycles per undo-log line and the high-water mark (:func:`features`) they were
    fitted with."""
    coef: dict[tuple[str, str], np.ndarray]
    undo_line_cycles: float = 0.0
    hold: int = DEFAULT_HOLD_LINES

    def phase(self, mode: str, phase: str, f: dict[str, float]) -> float:
        names = PHASE_FEATURES[(mode, phase)]
        return (float(np.dot(self.coef[(mode, phase)], [f[n] for n in names]))
                + log_cycles(mode, phase, f, self.undo_line_cycles))

    def as_dict(self) -> dict:
        return {f"{m}/{p}": dict(zip(PHASE_FEATURES[(m, p)], map(float, c), strict=True))
                for (m, p), c in self.coef.items()} | {
                    "undo_line_cycles": self.undo_line_cycles, "hold_lines": self.hold}


def _records(run: dict) -> list[dict]:
    return [r for r in run["batches"] if not r.get("lost")]


def fit(runs: dict[Point, dict], seed: int, hold: int = DEFAULT_HOLD_LINES) -> PerfModel:
    """Least-squares coefficients from RTL runs (``sim.train`` results keyed by point:
    ``runs[point]["runs"][mode]``) on a configuration whose logger holds ``hold`` lines:
    for each undo-line cost of :data:`UNDO_LINE_CYCLES`, the linear coefficients of
    every phase less its :func:`log_cycles`; the cost with the least squared residual of
    the TrainingCXL phases wins."""
    feats = {point: features(point.workload(), seed, hold) for point in runs}
    samples: dict[tuple[str, str], list[tuple[dict, float]]] = {}
    for (mode, phase) in PHASE_FEATURES:
        samples[(mode, phase)] = [(feats[point][rec["batch"] - 1], float(rec["phases"][phase]))
                                  for point, result in runs.items()
                                  for rec in _records(result["runs"][mode])]

    def solve(key: tuple[str, str], cost: float) -> tuple[np.ndarray, float]:
        names = PHASE_FEATURES[key]
        x = np.asarray([[f[n] for n in names] for f, _ in samples[key]])
        y = np.asarray([y - log_cycles(*key, f, cost) for f, y in samples[key]])
        c = np.linalg.lstsq(x, y, rcond=None)[0]
        r = y - x @ c
        return c, float(r @ r)

    logged = [key for key in PHASE_FEATURES if key[0] == "trainingcxl" and key[1] != "checkpoint"]
    coef = {key: solve(key, 0.0)[0] for key in PHASE_FEATURES if key not in logged}
    best = None
    for cost in UNDO_LINE_CYCLES:
        fits = {key: solve(key, cost) for key in logged}
        err = sum(r for _, r in fits.values())
        if best is None or err < best[0]:
            best = (err, cost, {key: c for key, (c, _) in fits.items()})
    assert best is not None
    return PerfModel(coef | best[2], best[1], hold)


def predict_run(model: PerfModel, w: Workload, seed: int, mode: str) -> dict:
    """Predicted cycles per iteration and per phase of ``mode`` training ``w``."""
    return _predict(model, w, features(w, seed, model.hold), mode)


def _predict(model: PerfModel, w: Workload, feats: list[dict[str, float]], mode: str) -> dict:
    per = {"lookup": 0.0, "gpu": 0.0, "update": 0.0, "checkpoint": 0.0}
    for f in feats:
        for phase in ("lookup", "update", "checkpoint"):
            per[phase] += max(0.0, model.phase(mode, phase, f))
        per["gpu"] += gpu_cycles(w, mode, f)
    n = len(feats)
    return {"cycles_per_iteration": sum(per.values()) / n,
            "phase_cycles_per_iteration": {k: v / n for k, v in per.items()}}


def validate(model: PerfModel, runs: dict[Point, dict], seed: int) -> dict:
    """Relative error of the predicted cycles per iteration against each RTL run."""
    out = {}
    for point, result in runs.items():
        w = point.workload()
        feats = features(w, seed, model.hold)
        for mode in ("trainingcxl", "baseline"):
            recs = _records(result["runs"][mode])
            measured = sum(r["cycles"] for r in recs) / len(recs)
            predicted = _predict(model, w, feats, mode)["cycles_per_iteration"]
            out[f"{point.name}/{mode}"] = {
                "measured": measured, "predicted": round(predicted, 1),
                "relative_error": round(abs(predicted - measured) / measured, 4)}
    return out
