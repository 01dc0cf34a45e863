"""``make sim``: train a small DLRM through the simulated device, crash, recover, report.

Runs the cocotb module ``tb/train_dlrm.py`` on the device's generated Verilog in two
modes with the same workload, seed and platform (``--platform``, ``sim/platform.py``:
the PMEM timing and the CXL link between the GPU and the device; default
``DEFAULT_PLATFORM``):

* **TrainingCXL**: LOOKUP / UPDATE / COMMIT / MLP_CHECKPOINT descriptors, the pooled
  vectors read over CXL.mem, a power failure at a cycle drawn from the seed (or
  ``--crash-at``), recovery, resume from the last committed batch;
* **baseline**: the same device with its engines idle; the GPU reads raw rows, pools,
  updates and checkpoints in software over CXL.mem.

It prints a progress line per batch, a table per mode (cycles per iteration and their
breakdown, link and PMEM bytes, energy from :mod:`sim.energy`), the speedup and the
energy saving, and writes ``build/sim/train-<preset>-<config>-<sim>.json`` (plus PNG
plots when matplotlib is installed). See ``docs/training.md``.

:func:`reference_train` is the pure-Python golden run both modes are checked against.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import embedding
from .dlrm import DLRM
from .platform import DEFAULT_PLATFORM, platform_arg
from .workloads import SyntheticClicks, Workload, get_workload, parse_override

__all__ = ["SIM_OVERRIDES", "ReferenceRun", "device_bytes", "main", "reference_train",
           "simulation_seconds", "tables_digest"]

#: Overrides of a preset's fields (``Workload.with_overrides``) that ``make sim`` applies
#: so that a run shows the model learning within five minutes of wall time on Verilator
#: with two cores (the two modes run at once). Measured (docs/training.md, "make sim"):
#: a 12-sample batch of the ``default`` preset costs about 22,000 TrainingCXL and 9,400
#: baseline cycles on the ``paper-like`` platform, and the whole run with its crash
#: about three minutes. 36 batches of 12 (432 samples) at learning rate 0.3 lower the
#: held-out loss by at least 0.12 for seeds 0 to 9 (seed 1: 0.80 to 0.46); 10 batches of
#: 8 at the preset's 0.1 did not visibly. Tables, dimensions, MLPs, pooling and K stay
#: the preset's.
SIM_OVERRIDES: dict[str, dict] = {"default": {"batch": 12, "batches": 36, "lr": 0.3}}

MODES = ("trainingcxl", "baseline")
#: Modes run one at a time with ``--mode`` (``make bench``'s system benchmark): the
#: TrainingCXL engines with software checkpointing (``tb/train_dlrm.py``).
ABLATIONS = ("trainingcxl-sw-ckpt",)


@dataclass(frozen=True)
class ReferenceRun:
    """Losses of batches ``first..last`` (1-based ids), the final tables and MLP params."""
    losses: dict[int, float]
    tables: tuple[np.ndarray, ...]
    params: bytes


def reference_train(workload: Workload, seed: int, *, partials: int, first: int = 1,
                    last: int | None = None, tables: Sequence[np.ndarray] | None = None,
                    params: bytes | None = None) -> ReferenceRun:
    """Train batches ``first..last`` (batch id ``b`` is :class:`SyntheticClicks` batch
    ``b - 1``) from ``tables`` (default :func:`sim.dlrm.init_tables`) and MLP ``params``
    (default: ``DLRM(workload, seed)``'s initial ones), pooling with the device's
    accumulation order (``partials = config.reduce_partials``); otherwise exactly
    :func:`sim.dlrm.train_reference`'s step."""
    from .dlrm import init_tables, train_step

    last = workload.batches if last is None else last
    data = SyntheticClicks(workload, seed)
    model = DLRM(workload, seed)
    if params is not None:
        model.load_params(params)
    current = list(init_tables(workload, seed) if tables is None else tables)
    losses = {}
    for b in range(first, last + 1):
        losses[b], current = train_step(model, current, data.batch(b - 1), partials=partials)
    return ReferenceRun(losses, tuple(current), model.params_bytes())


def tables_digest(tables: Sequence[np.ndarray]) -> str:
    """SHA-256 over the tables' packed device images (padding zero), for comparing runs."""
    h = hashlib.sha256()
    for t in tables:
        h.update(embedding.pack_rows(t))
    return h.hexdigest()


# --- the CLI ---------------------------------------------------------------------------

def _sum(records: list[dict], key: str) -> int:
    return sum(r[key] for r in records)


def energy_events(records: list[dict]):
    """:class:`sim.energy.EnergyEvents` of the batches in ``records`` (sums of the
    per-batch counts the cocotb module measured)."""
    from .energy import EnergyEvents

    names = ("cycles", "pmem_read_lines", "pmem_write_lines", "pmem_media_reads",
             "pmem_media_writes", "link_bytes", "gpu_flops", "gpu_busy_cycles", "hbm_bytes",
             "device_fp_adds", "device_fp_muls", "device_sram_lines")
    return EnergyEvents(**{n: _sum(records, n) for n in names})


def summarize(run: dict) -> dict:
    """Per-mode figures from a cocotb result: totals over the batches that count (each
    batch's completed execution), per-iteration means, energy."""
    from .energy import estimate

    recs = run["batches"]
    n = len(recs)
    phases = {k: sum(r["phases"][k] for r in recs) for k in recs[0]["phases"]}
    events = energy_events(recs)
    report = estimate(events)
    held = run["heldout_losses"]
    return {
        "iterations": n,
        "heldout_loss_before": held["0"],
        "heldout_loss_after": held[str(max(map(int, held)))],
        "cycles": events.cycles,
        "cycles_per_iteration": events.cycles / n,
        "phase_cycles_per_iteration": {k: v / n for k, v in phases.items()},
        "link_payload_bytes": _sum(recs, "link_payload_bytes"),
        "link_bytes": events.link_bytes,
        "csr_accesses": _sum(recs, "csr_accesses"),
        "pmem_read_bytes": 64 * events.pmem_read_lines,
        "pmem_write_bytes": 64 * events.pmem_write_lines,
        "pmem_media_reads": events.pmem_media_reads,
        "pmem_media_writes": events.pmem_media_writes,
        "events": events.as_dict(),
        "energy_j": report.as_dict(),
    }


def render_mode(name: str, run: dict, s: dict) -> str:
    per = s["phase_cycles_per_iteration"]
    out = [f"== {name}: {s['iterations']} iterations, {s['cycles']} cycles "
           f"({s['cycles_per_iteration']:.0f} per iteration)"]
    out.append("   per iteration: " + ", ".join(f"{k} {v:.0f}" for k, v in per.items()))
    it = s["iterations"]
    out.append(f"   link: {s['link_payload_bytes'] / it:.0f} payload B/iter "
               f"({s['link_bytes'] / it:.0f} B with headers), {s['csr_accesses'] / it:.1f} "
               f"CSR accesses/iter")
    out.append(f"   PMEM: {s['pmem_read_bytes'] / it:.0f} B read, {s['pmem_write_bytes'] / it:.0f} "
               f"B written per iter; media accesses {s['pmem_media_reads'] / it:.1f} read, "
               f"{s['pmem_media_writes'] / it:.1f} write per iter")
    e = s["energy_j"]
    out.append(f"   energy {e['total_j'] * 1e3:.3f} mJ over {e['seconds'] * 1e3:.3f} ms: "
               + ", ".join(f"{k.removesuffix('_j')} {v * 1e3:.3f}" for k, v in e.items()
                           if k not in ("total_j", "seconds")))
    out.append(f"   loss: {_loss_line(run['losses'])}")
    out.append(f"   held-out loss ({run['heldout_samples']} samples) before training "
               f"{s['heldout_loss_before']:.4f}, after batch "
               f"{max(map(int, run['heldout_losses']))} {s['heldout_loss_after']:.4f}")
    if run.get("crash"):
        c = run["crash"]
        out.append(f"   crash at +{c['at']} cycles during batch {c['in_batch']}: committed "
                   f"{c['committed']}, MLP slot {c['mlp_slot']} of batch {c['mlp_batch']}, "
                   f"{c['rolled_back']} records rolled back; recovery {c['recovery_cycles']} "
                   f"cycles (device {c['device_recovery_cycles']}), lost work {c['lost_cycles']} "
                   f"cycles; resumed at batch {c['committed'] + 1}")
    out.append(f"   reference check: {run['reference_check']}")
    return "\n".join(out)


def _loss_line(losses: dict[str, float], most: int = 12) -> str:
    """The training losses as text: all of them, or the first and last ``most / 2``."""
    keys = sorted(map(int, losses))
    shown = [f"{losses[str(b)]:.4f}" for b in keys]
    if len(shown) > most:
        shown = [*shown[:most // 2], "...", *shown[-most // 2:]]
    return " ".join(shown)


def smooth(values: Sequence[float], window: int) -> np.ndarray:
    """The trailing mean of ``values`` over ``window`` points (fewer at the start)."""
    v = np.asarray(values, float)
    c = np.cumsum(np.concatenate([[0.0], v]))
    lo = np.maximum(np.arange(1, len(v) + 1) - window, 0)
    return (c[1:] - c[lo]) / (np.arange(1, len(v) + 1) - lo)


def plot(result: dict, prefix: str) -> list[str]:
    """Loss curve and cycles breakdown PNGs; [] when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    files = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (mode, run) in enumerate(result["runs"].items()):
        colour = f"C{i}"
        xs = sorted(map(int, run["losses"]))
        ys = [run["losses"][str(x)] for x in xs]
        window = max(1, len(xs) // 8)
        ax.plot(xs, ys, ".", c=colour, alpha=0.3, ms=4)
        ax.plot(xs, smooth(ys, window), c=colour, alpha=0.6, lw=1,
                label=f"{mode}: training loss, mean of the last {window} batches")
        held = run["heldout_losses"]
        hx = sorted(map(int, held))
        ax.plot(hx, [held[str(x)] for x in hx], c=colour, lw=2.2,
                label=f"{mode}: held-out loss ({run['heldout_samples']} samples)")
    if "crash" in result["runs"].get("trainingcxl", {}):
        ax.axvline(result["runs"]["trainingcxl"]["crash"]["in_batch"], ls=":", c="grey",
                   label="power failure")
    ax.set_xlabel("batch")
    ax.set_ylabel("BCE loss")
    ax.legend(fontsize=7)
    fig.tight_layout()
    files.append(f"{prefix}-loss.png")
    fig.savefig(files[-1])
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    modes = list(result["summary"])
    bottom = np.zeros(len(modes))
    for phase in result["summary"][modes[0]]["phase_cycles_per_iteration"]:
        vals = np.array([result["summary"][m]["phase_cycles_per_iteration"][phase]
                         for m in modes])
        ax.bar(modes, vals, bottom=bottom, label=phase)
        bottom += vals
    ax.set_ylabel("cycles per iteration")
    ax.legend()
    fig.tight_layout()
    files.append(f"{prefix}-cycles.png")
    fig.savefig(files[-1])
    plt.close(fig)
    return files


def _run_mode(mode: str, args, overrides: dict, config, crash_at: int | str | None,
              out_dir) -> dict:
    from .runner import _build_dir, run

    raw = (out_dir / "raw"
           / f"train-{mode}-{args.preset}-{config.tag}-{args.sim}-{args.platform}.json")
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.unlink(missing_ok=True)
    params = {"preset": args.preset, "overrides": overrides, "seed": args.seed,
              "mode": mode, "crash_at": crash_at, "platform": args.platform,
              "scratch": args.scratch, "out": str(raw)}
    name = f"train-{mode}-{args.preset}-{args.seed}"
    log = _build_dir("device", config, args.sim, args.waves) / "runs" / name / "sim.log"
    log.unlink(missing_ok=True)
    follower = None if args.verbose else _Follower(log, f"  [{mode}] ")
    t0 = time.monotonic()
    try:
        result = run("tb.train_dlrm", "device", config, args.sim, testcase="train_dlrm",
                     seed=args.seed, params=params, waves=args.waves, name=name,
                     quiet=not args.verbose)
    finally:
        if follower is not None:
            follower.stop()
    wall = time.monotonic() - t0
    if not result.ok or not raw.exists():
        tail = result.log.read_text().splitlines()[-40:] if result.log.exists() else []
        raise RuntimeError(f"{mode} run failed (replay: python -m sim.train --preset "
                           f"{args.preset} --config {args.config} --sim {args.sim} --seed "
                           f"{args.seed} --platform {args.platform} --mode {mode} "
                           f"--scratch {args.scratch}"
                           f"{'' if crash_at in (None, 'auto') else f' --crash-at {crash_at}'}"
                           f"); log "
                           f"{result.log}\n" + "\n".join(tail))
    data = json.loads(raw.read_text())
    data["wall_seconds"] = round(wall, 1)
    data["sim_seconds"] = simulation_seconds(result.log.read_text(), "train_dlrm")
    if follower is None or not follower.printed:
        for r in data["executions"]:
            print(f"  [{mode}] batch {r['batch']:>3}: loss {r['loss']:.4f}, "
                  f"{r['cycles']:>7} cycles"
                  f"{'  (lost to the power failure)' if r.get('lost') else ''}")
    return data


def simulation_seconds(log: str, testcase: str) -> float | None:
    """The wall seconds cocotb reports for ``testcase`` in its summary table (the
    simulation alone: no build, elaboration or simulator start), or None."""
    m = re.search(rf"\.{re.escape(testcase)}\s+PASS\s+[\d.]+\s+([\d.]+)", log)
    return float(m[1]) if m else None


class _Follower:
    """Prints the per-batch progress lines of a running simulation's log as they come."""

    _LINE = re.compile(r"cocotb\.tb\.train_\w+\s+((batch \d+: .*)|(crash at .*))$")

    def __init__(self, path, prefix: str):
        self.path, self.prefix = path, prefix
        self.printed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self.path.exists():
            if self._stop.wait(0.5):
                return
        with open(self.path, errors="replace") as f:
            while True:
                line = f.readline()
                if not line:
                    if self._stop.is_set():
                        return
                    time.sleep(0.2)
                    continue
                m = self._LINE.search(line.rstrip())
                if m:
                    print(self.prefix + m[1], flush=True)
                    self.printed += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _override_arg(text: str) -> tuple[str, object]:
    try:
        return parse_override(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def device_bytes(workload: Workload, config) -> int:
    """An upper bound of the device memory a run lays out: the tables, an undo log with
    a slot for every index a batch can have, four MLP areas (two slots, two staging)."""
    lpr = embedding.lines_per_row(workload.dim, workload.dtype)
    indices = workload.batch * workload.pooling_max * workload.num_tables
    mlp = len(DLRM(workload, 0).params_bytes()) + 64
    return 64 * (sum(workload.table_rows) * lpr
                 + (1 << (indices - 1).bit_length()) * config.log_slot_lines) + 4 * mlp


def main(argv: list[str] | None = None) -> int:
    from hw.config import load_config

    from . import toolenv
    from .energy import saving
    from .runner import BUILD

    parser = argparse.ArgumentParser(prog="python -m sim.train",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--preset", help="workload preset (default: 'default', or 'tiny' "
                        "when 'default' does not fit the config's device memory)")
    parser.add_argument("--config", default="default")
    parser.add_argument("--sim", default="verilator", choices=toolenv.SIMULATORS)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--batches", type=int, help="train this many batches (default: "
                        "SIM_OVERRIDES', or the preset's when --batches, --batch or --set "
                        "is given)")
    parser.add_argument("--batch", type=int, help="samples per batch (default: as --batches)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        type=_override_arg, help="override a field of the workload "
                        "(sim/workloads.py, Workload; a Python literal), repeatable")
    parser.add_argument("--crash-at", type=int, help="power failure this many cycles into "
                        "TrainingCXL training (default: drawn from the seed; negative: none)")
    parser.add_argument("--mode", default="both", choices=("both", *MODES, *ABLATIONS))
    parser.add_argument("--platform", default=DEFAULT_PLATFORM, type=platform_arg,
                        help="PMEM timing and CXL link (default: %(default)s; "
                             "docs/platform.md)")
    parser.add_argument("--scratch", default="gpu", choices=("gpu", "device"),
                        help="where TrainingCXL's indices, offsets, gradients and pooled "
                             "vectors live: GPU memory, reached through CXL.cache "
                             "(default), or device memory over CXL.mem (docs/training.md)")
    parser.add_argument("--out", help="path prefix of the JSON and PNG outputs (default: "
                        "build/sim/train-<preset>-<config>-<sim>)")
    parser.add_argument("--waves", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="show the simulator's log")
    args = parser.parse_args(argv)
    toolenv.setup()
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    config = load_config(args.config)
    if args.preset is None:
        default = get_workload("default").with_overrides(**SIM_OVERRIDES["default"])
        args.preset = "default" if device_bytes(default, config) <= config.hdm_size else "tiny"
    # make sim's defaults, unless the command line shapes the run itself.
    custom = args.batches or args.batch or args.set
    overrides = {} if custom else dict(SIM_OVERRIDES.get(args.preset, {}))
    if args.batches:
        overrides["batches"] = args.batches
    if args.batch:
        overrides["batch"] = args.batch
    overrides.update(args.set)
    workload = get_workload(args.preset).with_overrides(**overrides)
    crash_at = "auto" if args.crash_at is None else (None if args.crash_at < 0
                                                     else args.crash_at)
    print(f"TrainingCXL DLRM training: preset {args.preset} ({workload.batches} batches of "
          f"{workload.batch}, {workload.num_tables} tables, overrides {overrides}), config "
          f"{config.name}, platform {args.platform}, {args.sim}, seed {args.seed}, crash "
          f"{'drawn from the seed' if crash_at == 'auto' else crash_at}")
    out_dir = BUILD / "sim"
    t0 = time.monotonic()
    modes = MODES if args.mode == "both" else (args.mode,)
    # The modes are independent simulations: run them at once (one core each).
    print(" and ".join(modes) + " ...")

    def one(mode: str) -> dict:
        run = _run_mode(mode, args, overrides, config,
                        crash_at if mode == "trainingcxl" else None, out_dir)
        print(f"  {mode}: {run['wall_seconds']} s of wall time", flush=True)
        return run

    with ThreadPoolExecutor(len(modes)) as pool:
        runs = dict(zip(modes, pool.map(one, modes), strict=True))
    summary = {m: summarize(r) for m, r in runs.items()}
    result = {"preset": args.preset, "config": config.name, "sim": args.sim, "seed": args.seed,
              "platform": args.platform,
              "batches": workload.batches, "batch": workload.batch, "overrides": overrides,
              "crash_at": runs.get("trainingcxl", {}).get("crash", {}).get("at"), "runs": runs,
              "summary": summary}
    print()
    for m in modes:
        print(render_mode(m, runs[m], summary[m]))
    if len(modes) == 2:
        tc, base = runs["trainingcxl"], runs["baseline"]
        crash = tc.get("crash")
        same_start = crash is None or crash["mlp_batch"] == crash["committed"]
        if same_start:
            assert tc["tables_digest"] == base["tables_digest"], (
                "TrainingCXL and baseline ended with different tables")
            result["tables_identical"] = True
        speedup = summary["baseline"]["cycles"] / summary["trainingcxl"]["cycles"]
        from .energy import estimate
        sav = saving(estimate(energy_events(base["batches"])),
                     estimate(energy_events(tc["batches"])))
        result["speedup"] = speedup
        result["energy_saving"] = sav
        print()
        print(f"speedup (baseline / TrainingCXL cycles over the same {workload.batches} "
              f"batches, recovery excluded): {speedup:.2f}x")
        print(f"energy saving: {sav * 100:.1f} %")
        print("final tables: " + ("bit-identical in both modes" if same_start else
                                  "each equal to its reference run (the recovered MLP "
                                  "checkpoint lags the tables, so the runs differ)"))
    result["wall_seconds"] = round(time.monotonic() - t0, 1)
    replay = (f"python -m sim.train --preset {args.preset} --config {config.name} --sim "
              f"{args.sim} --seed {args.seed} --platform {args.platform}")
    if result["crash_at"] is not None:
        replay += f" --crash-at {result['crash_at']}"
    if args.mode != "both":
        replay += f" --mode {args.mode}"
    print(f"replay: {replay} (or make sim CONFIG={config.name} SIM={args.sim} "
          f"SEED={args.seed} PLATFORM={args.platform})")
    prefix = Path(args.out or out_dir / f"train-{args.preset}-{config.name}-{args.sim}")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    path = prefix.with_name(prefix.name + ".json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path} ({result['wall_seconds']} s)")
    for f in plot(result, str(prefix)):
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

