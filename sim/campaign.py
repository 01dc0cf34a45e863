"""``make campaign``: the crash campaign at scale, in chunks run in parallel.

A campaign of ``--points`` crash points is cut into chunks of ``--chunk`` points. Each
chunk is one simulator run of the campaign test of ``tb/test_ckpt.py`` (it formats the
device, measures the uncrashed window, then per point trains, fails the power at a
random cycle or in a directed phase, recovers and checks every invariant bit for bit;
``docs/verification.md``, "The crash campaign"), with its own seed: chunk ``i`` of a
campaign started at ``--seed S`` runs with seed ``S + i``, so a campaign is a range of
seeds and two campaigns over disjoint ranges merge into one (``--merge``). Chunks
alternate between the two variants of the test: ``campaign`` (one power failure per
point) and ``recovery`` (a second power failure during the recovery, drawn over its
measured length), unless ``--variants`` names one.

Chunks run on all local cores (``--jobs``, processes), or on a Dask cluster
(``--dask ADDRESS``, or ``--dask local`` for a local one with ``--jobs`` workers): the
optional extra ``cluster`` installs Dask distributed. Every worker must see this
checkout at the same path (a shared file system, or the same clone on each machine);
the simulator build is made once, before the chunks start, and shared by file lock.

The summary (``--out``, default ``build/campaign/summary.json``) counts points tried and
survived, hangs (a point whose wait timed out, or a chunk that ended without its
result), corruptions (a point whose checks found a wrong table, MLP slot or commit
word), the phases the power failures caught and, for the recovery variant, where in the
recovery the second failures fell. Every failed point lists the command that replays its
chunk (same seed, same points: the run is deterministic for a seed). The counts also go
into ``build/bench/robustness.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from hw.config import load_config

from .fuzz import update_robustness
from .runner import BUILD, build, run

__all__ = ["VARIANTS", "Chunk", "chunks", "main", "merge", "run_chunk", "summarise"]

#: The campaign variants: the cocotb test each chunk of it runs (``tb/test_ckpt.py``).
VARIANTS = {"campaign": "test_crash_campaign", "recovery": "test_crash_during_recovery"}

#: The summary's figures ``build/bench/robustness.json`` takes.
ROBUSTNESS_KEYS = ("crash_points_tried", "crash_points_survived", "hangs", "corruptions")

#: Failure kinds (the exception a point's check raised) counted as hangs; the others
#: (``AssertionError``: a wrong table, slot or commit word) as corruptions.
HANG_KINDS = ("TimeoutError",)


@dataclass(frozen=True)
class Chunk:
    """One simulator run of ``points`` crash points of ``variant`` with ``seed``."""
    index: int
    seed: int
    points: int
    variant: str
    config: str
    sim: str
    inject_fault: int | None = None     # a point whose tables are changed after recovery

    def replay(self) -> str:
        """The command that runs this chunk again, alone."""
        return (f"python -m sim.campaign --points {self.points} --chunk {self.points} "
                f"--seed {self.seed} --variants {self.variant} --config {self.config} "
                f"--sim {self.sim}")


def chunks(points: int, chunk: int, seed: int, variants: Iterable[str], config: str,
           sim: str) -> list[Chunk]:
    """``points`` crash points cut into chunks of at most ``chunk``, seeds ``seed``,
    ``seed + 1``, ..., variants taken in turn."""
    if points < 1 or chunk < 1:
        raise ValueError(f"points and chunk must be positive, not {points} and {chunk}")
    variants = list(variants)
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r}; choose from {sorted(VARIANTS)}")
    out, left = [], points
    while left:
        i = len(out)
        n = min(chunk, left)
        out.append(Chunk(i, seed + i, n, variants[i % len(variants)], config, sim))
        left -= n
    return out


def run_chunk(c: Chunk) -> dict:
    """Run chunk ``c`` in the simulator; its result as :func:`summarise` takes it."""
    out = BUILD / "campaign" / "chunks" / f"{c.variant}-{c.config}-{c.sim}-seed{c.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    params = {"n_points": c.points, "out": str(out)}
    if c.inject_fault is not None:
        params["inject_fault"] = c.inject_fault
    t0 = time.monotonic()
    result = run("tb.test_ckpt", "device", load_config(c.config), c.sim,
                 testcase=VARIANTS[c.variant], seed=c.seed, params=params,
                 name=f"campaign-{c.variant}-seed{c.seed}", quiet=True)
    figures = json.loads(out.read_text()) if out.exists() else None
    return {"chunk": asdict(c), "passed": result.ok, "figures": figures,
            "log": str(result.log), "seconds": round(time.monotonic() - t0, 1)}


def summarise(results: list[dict]) -> dict:
    """The campaign's summary from its chunks' results (:func:`run_chunk`)."""
    tried = survived = hangs = corruptions = 0
    phases: dict[str, int] = {}
    tenths, busy = [0] * 10, [0] * 10
    failures, broken = [], []
    for r in sorted(results, key=lambda r: (r["chunk"]["variant"], r["chunk"]["seed"])):
        c = Chunk(**r["chunk"])
        f = r["figures"]
        tried += c.points
        if f is None:               # the run ended without its figures: every point lost
            hangs += 1
            broken.append({"seed": c.seed, "variant": c.variant, "log": r["log"],
                           "replay": c.replay()})
            continue
        survived += f["crash_points_survived"]
        for k, v in f["phases"].items():
            phases[k] = phases.get(k, 0) + v
        rc = f.get("recovery_crashes")
        if rc:
            tenths = [a + b for a, b in zip(tenths, rc["per_tenth"], strict=True)]
            busy = [a + b for a, b in zip(busy, rc["busy_per_tenth"], strict=True)]
        for fail in f["failures"]:
            kind = fail["kind"]
            hangs += kind in HANG_KINDS
            corruptions += kind not in HANG_KINDS
            failures.append({**fail, "variant": c.variant, "replay": c.replay()})
        if not r["passed"] and not f["failures"]:
            # The run's own end-of-run checks failed (protocol, phases, training on).
            broken.append({"seed": c.seed, "variant": c.variant, "log": r["log"],
                           "replay": c.replay()})
    return {
        "crash_points_tried": tried, "crash_points_survived": survived,
        "hangs": hangs, "corruptions": corruptions, "phases": phases,
        "recovery_crashes": {"per_tenth": tenths, "busy_per_tenth": busy},
        "failures": failures, "runs_failed": broken,
        "chunks": [{**r["chunk"], "passed": r["passed"], "seconds": r["seconds"],
                    "survived": r["figures"]["crash_points_survived"] if r["figures"] else 0}
                   for r in results],
    }


def merge(summaries: list[dict]) -> dict:
    """One summary of several campaigns over disjoint seed ranges (each chunk's seed and
    variant may appear once)."""
    seen: set[tuple[str, int]] = set()
    results = []
    for s in summaries:
        for c in s["chunks"]:
            key = (c["variant"], c["seed"])
            if key in seen:
                raise ValueError(f"chunk {key} is in two of the summaries: the campaigns "
                                 f"overlap")
            seen.add(key)
        results.extend(s["results"])
    out = summarise(results)
    out["results"] = results
    return out


def _pool_map(fn: Callable[[Chunk], dict], work: list[Chunk], jobs: int) -> list[dict]:
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(fn, work))


def _dask_map(fn: Callable[[Chunk], dict], work: list[Chunk], jobs: int,
              address: str) -> list[dict]:
    try:
        from distributed import Client, LocalCluster
    except ImportError as e:
        raise SystemExit("Dask distributed is not installed: "
                         ".venv/bin/pip install '.[cluster]'") from e
    if address == "local":
        with LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            return client.gather(client.map(fn, work, pure=False))
    with Client(address) as client:
        return client.gather(client.map(fn, work, pure=False))


def campaign(work: list[Chunk], jobs: int, dask: str | None = None,
             fn: Callable[[Chunk], dict] = run_chunk) -> dict:
    """Run ``work`` (locally on ``jobs`` processes, or on the Dask cluster at ``dask``)
    and summarise it."""
    if fn is run_chunk:                 # one build per simulator, before the chunks share it
        for config, sim in {(c.config, c.sim) for c in work}:
            build("device", load_config(config), sim)
    t0 = time.monotonic()
    results = (_dask_map(fn, work, jobs, dask) if dask
               else _pool_map(fn, work, jobs))
    summary = summarise(results)
    summary["wall_seconds"] = round(time.monotonic() - t0, 1)
    summary["results"] = results
    return summary


def _write(summary: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n")


def _report(s: dict) -> str:
    lost = s["crash_points_tried"] - s["crash_points_survived"]
    return (f"crash points tried {s['crash_points_tried']}, survived "
            f"{s['crash_points_survived']}, lost {lost} (hangs {s['hangs']}, corruptions "
            f"{s['corruptions']}); runs whose own checks failed {len(s['runs_failed'])}; "
            f"phases {s['phases']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.campaign", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--points", type=int, default=200, help="crash points in all")
    ap.add_argument("--chunk", type=int, default=50, help="crash points per simulator run")
    ap.add_argument("--seed", type=int, default=1, help="seed of the first chunk")
    ap.add_argument("--variants", default="campaign,recovery",
                    help="comma-separated, taken in turn by the chunks")
    ap.add_argument("--config", default="small")
    ap.add_argument("--sim", default="verilator", choices=("verilator", "icarus"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--dask", metavar="ADDRESS",
                    help="run the chunks on this Dask scheduler ('local': a local cluster)")
    ap.add_argument("--out", type=Path, default=BUILD / "campaign" / "summary.json")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="SUMMARY",
                    help="merge these summaries into --out instead of running")
    args = ap.parse_args(argv)
    if args.merge:
        summary = merge([json.loads(p.read_text()) for p in args.merge])
    else:
        work = chunks(args.points, args.chunk, args.seed, args.variants.split(","),
                      args.config, args.sim)
        print(f"{args.points} crash points in {len(work)} runs, seeds {work[0].seed} to "
              f"{work[-1].seed}, {args.dask + ' Dask cluster' if args.dask else 'local'}, "
              f"{args.jobs} at a time ...", flush=True)
        summary = campaign(work, args.jobs, args.dask)
    _write(summary, args.out)
    update_robustness({k: summary[k] for k in ROBUSTNESS_KEYS}
                      | {"crash_campaign_summary": str(args.out)})
    print(_report(summary))
    for f in summary["failures"] + summary["runs_failed"]:
        print(f"  replay: {f['replay']}")
    print(f"wrote {args.out}")
    ok = (summary["crash_points_survived"] == summary["crash_points_tried"]
          and not summary["runs_failed"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
