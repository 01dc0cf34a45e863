"""``make fuzz``: the descriptor fuzzer at size.

Runs ``test_descriptor_fuzz`` of ``tb/test_engine.py`` (random descriptors with bad and
meaning-preserving fields combined, bad offsets and indices; every completion, table
and output buffer checked against the golden models, ``ENG_ERR`` after every run of the
ring; ``docs/verification.md``, "Descriptor fuzzer") with ``--descriptors`` of them in
one simulator run, and writes its figures into ``build/bench/robustness.json`` (the
keys it owns: ``fuzzed_descriptors``, ``descriptor_statuses``, ``descriptor_fuzz_seed``;
other keys of the file are kept). A failure prints the seed that replays it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hw.config import load_config

from .runner import BUILD, run

ROBUSTNESS = BUILD / "bench" / "robustness.json"


def fuzz_descriptors(n: int, config: str, sim: str, seed: int | None) -> dict:
    """Run the fuzzer over ``n`` descriptors; its figures (``passed`` False on failure)."""
    out = BUILD / "fuzz" / f"descriptors-{config}-{sim}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    t0 = time.monotonic()
    result = run("tb.test_engine", "device", load_config(config), sim,
                 testcase="test_descriptor_fuzz", seed=seed, params={"n_fuzz": n, "out": str(out)},
                 name="fuzz-descriptors", quiet=True)
    figures = json.loads(out.read_text()) if out.exists() else {}
    return {"passed": result.ok, "log": str(result.log), "seconds": round(time.monotonic() - t0, 1),
            **figures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--descriptors", type=int, default=10_000)
    ap.add_argument("--config", default="small")
    ap.add_argument("--sim", default="verilator", choices=("verilator", "icarus"))
    ap.add_argument("--seed", type=int)
    args = ap.parse_args(argv)
    print(f"descriptor fuzzer: {args.descriptors} descriptors on {args.config}, {args.sim} ...",
          flush=True)
    r = fuzz_descriptors(args.descriptors, args.config, args.sim, args.seed)
    if not r["passed"]:
        print(f"FAILED; log {r['log']}; replay with --seed {r.get('seed', '(see the log)')}")
        return 1
    report = json.loads(ROBUSTNESS.read_text()) if ROBUSTNESS.exists() else {}
    report.update({"fuzzed_descriptors": r["fuzzed_descriptors"],
                   "descriptor_statuses": r["statuses"], "descriptor_fuzz_seed": r["seed"],
                   "descriptor_fuzz_config": args.config, "descriptor_fuzz_simulator": args.sim,
                   "descriptor_fuzz_seconds": r["seconds"]})
    ROBUSTNESS.parent.mkdir(parents=True, exist_ok=True)
    ROBUSTNESS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{r['fuzzed_descriptors']} descriptors, every one as the golden model has it; "
          f"statuses {r['statuses']} ({r['seconds']} s, seed {r['seed']})")
    print(f"wrote {ROBUSTNESS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
