"""The performance model (``sim/perfmodel.py``): features from the workload alone, a fit
that recovers known coefficients, predictions and errors computed as documented. The
model's accuracy on real RTL runs is a benchmark figure (``perfmodel.json``), not a
test."""

from __future__ import annotations

import numpy as np
import pytest

from sim import perfmodel as pm
from sim.dlrm import DLRM


def test_features_follow_the_batches(seed):
    w = pm.Point("tiny", 8, batches=5).workload()             # dim 16: one line per row
    feats = pm.features(w, seed)
    assert len(feats) == 5
    mlp_lines = -(-len(DLRM(w, seed).params_bytes()) // 64)
    for b, f in enumerate(feats, start=1):
        assert f["tables"] == w.num_tables == 2
        assert f["pooled_lines"] == 8 * 2
        assert f["undo_lines"] == 2 * f["distinct_lines"]
        assert f["distinct_lines"] <= f["index_lines"] == f["indices"]
        assert f["mlp_copy"] == float(b % w.mlp_ckpt_every == 0)
        assert f["mlp_lines"] == f["mlp_copy"] * mlp_lines
        # 8 x 2 bags hold fewer than the default high-water mark's 768 lines.
        assert f["held_undo_lines"] == f["undo_lines"] and f["excess_undo_lines"] == 0


def test_undo_lines_past_the_hold_are_excess(seed):
    w = pm.Point("tiny", 8, batches=3).workload()
    for f in pm.features(w, seed, hold=4):
        share = 4 / f["index_lines"]                            # one line per row
        assert f["held_undo_lines"] == pytest.approx(f["undo_lines"] * share)
        assert f["held_undo_lines"] + f["excess_undo_lines"] == pytest.approx(f["undo_lines"])
        # The log's share: the excess during the LOOKUP, the held records' writes less
        # the GPU window in the UPDATE, nothing in gpu-direct.
        assert pm.log_cycles("trainingcxl", "lookup", f, 3.0) == 3.0 * f["excess_undo_lines"]
        over = 1e6 / f["held_undo_lines"]
        assert pm.log_cycles("trainingcxl", "update", f, over) == pytest.approx(
            1e6 - f["gpu_step"])
        assert pm.log_cycles("trainingcxl", "update", f, 0.5) == 0.0
        assert pm.log_cycles("baseline", "lookup", f, 3.0) == 0.0


#: The undo-line cost of the synthetic runs (one of ``pm.UNDO_LINE_CYCLES``).
UNDO_LINE_CYCLES = 6.0


def _synthetic_runs(coef: dict, seed: int, noise: float, rng) -> dict:
    """RTL-shaped results whose phases are exactly (or nearly) ``coef``'s model with
    :data:`UNDO_LINE_CYCLES`; ``default`` at 32 samples captures more lines than the
    logger holds."""
    runs = {}
    for point in (*pm.FIT_POINTS[:3], pm.Point("default", 32, 4), pm.Point("tiny", 4),
                  pm.Point("tiny", 16)):
        w = point.workload()
        result = {"runs": {}}
        for mode in ("trainingcxl", "baseline"):
            recs = []
            for b, f in enumerate(pm.features(w, seed), start=1):
                phases = {ph: (float(np.dot(coef[(mode, ph)],
                                            [f[n] for n in pm.PHASE_FEATURES[(mode, ph)]]))
                               + pm.log_cycles(mode, ph, f, UNDO_LINE_CYCLES))
                          * (1 + noise * rng.uniform(-1, 1))
                          for ph in ("lookup", "update", "checkpoint")}
                phases["gpu"] = pm.gpu_cycles(w, mode, f)
                recs.append({"batch": b, "phases": phases, "cycles": sum(phases.values())})
            result["runs"][mode] = {"batches": recs}
        runs[point] = result
    return runs


def test_fit_recovers_the_coefficients(seed):
    rng = np.random.default_rng(seed)
    coef = {k: rng.uniform(1, 50, len(names)) for k, names in pm.PHASE_FEATURES.items()}
    runs = _synthetic_runs(coef, seed, 0.0, rng)
    model = pm.fit(runs, seed)
    assert model.undo_line_cycles == UNDO_LINE_CYCLES
    assert any(f["excess_undo_lines"] > 0 for f in pm.features(pm.Point("default", 32, 4)
                                                                 .workload(), seed))
    for k in pm.PHASE_FEATURES:
        # Columns that never vary apart from the constant (tables within one preset
        # mix) make some coefficients collinear: compare predictions, not coefficients.
        for point in runs:
            for f in pm.features(point.workload(), seed):
                names = pm.PHASE_FEATURES[k]
                want = (float(np.dot(coef[k], [f[n] for n in names]))
                        + pm.log_cycles(*k, f, UNDO_LINE_CYCLES))
                assert model.phase(*k, f) == pytest.approx(want, rel=1e-6, abs=1e-6)
    errors = pm.validate(model, runs, seed)
    assert max(e["relative_error"] for e in errors.values()) < 1e-6


def test_validate_reports_the_relative_error(seed):
    rng = np.random.default_rng(seed)
    coef = {k: rng.uniform(1, 50, len(names)) for k, names in pm.PHASE_FEATURES.items()}
    runs = _synthetic_runs(coef, seed, 0.0, rng)
    model = pm.fit(runs, seed)
    point = next(iter(runs))
    recs = runs[point]["runs"]["trainingcxl"]["batches"]
    for r in recs:                                          # the RTL ran 10 % slower
        r["cycles"] *= 1.1
    err = pm.validate(model, {point: runs[point]}, seed)[f"{point.name}/trainingcxl"]
    assert err["relative_error"] == pytest.approx(1 - 1 / 1.1, abs=1e-4)
