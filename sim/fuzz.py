"""``make fuzz``: the fuzzers at size.

* The descriptor fuzzer, ``test_descriptor_fuzz`` of ``tb/test_engine.py``: random
  descriptors with bad and meaning-preserving fields combined, bad offsets and indices;
  every completion, table and output buffer checked against the golden models,
  ``ENG_ERR`` after every run of the ring.
* The CXL.mem fuzzer, ``test_cxl_mem_fuzz`` of ``tb/test_device.py``: random M2S Req
  and RwD messages, legal and bad of every kind, every response checked by the host
  agent, the error CSRs every round, PMEM against the golden memory at the end.
* The CXL.cache fuzzer, ``test_cxl_cache_fuzz`` of ``tb/test_coherence.py``: fuzzed
  H2D Req, Rsp and Data messages among coherent engine traffic in GPU memory, every
  snoop answer, request bound and error CSR checked, tables and GPU memory against the
  golden model at the end.

``docs/verification.md`` describes them. Each runs once, in one simulator run, with
``--descriptors``, ``--messages`` and ``--cache-messages`` items (0 skips it), and
writes its figures into ``build/bench/robustness.json`` (the keys it owns; other keys
of the file are kept): ``fuzzed_descriptors``, ``fuzzed_cxl_mem_messages``,
``fuzzed_cxl_cache_messages`` (each with a ``_run`` record), and
``fuzzed_cxl_messages``, the CXL.mem and CXL.cache messages of this run together. A
failure prints the log and the seed that replays it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hw.config import load_config

from .runner import BUILD, run

ROBUSTNESS = BUILD / "bench" / "robustness.json"

#: Per fuzzer: the cocotb module and test, its size parameter, the figure of its output
#: file, and the key that figure gets in ``robustness.json``.
FUZZERS = {
    "descriptors": ("tb.test_engine", "test_descriptor_fuzz", "n_fuzz", "fuzzed_descriptors",
                    "fuzzed_descriptors"),
    "messages": ("tb.test_device", "test_cxl_mem_fuzz", "n_msgs", "fuzzed_cxl_messages",
                 "fuzzed_cxl_mem_messages"),
    "cache": ("tb.test_coherence", "test_cxl_cache_fuzz", "n_msgs",
              "fuzzed_cxl_cache_messages", "fuzzed_cxl_cache_messages"),
}
#: The fuzzers whose messages ``fuzzed_cxl_messages`` adds up.
CXL_FUZZERS = ("messages", "cache")


def update_robustness(figures: dict) -> None:
    """Set ``figures``' keys in ``build/bench/robustness.json``, keeping the others."""
    report = json.loads(ROBUSTNESS.read_text()) if ROBUSTNESS.exists() else {}
    report.update(figures)
    ROBUSTNESS.parent.mkdir(parents=True, exist_ok=True)
    ROBUSTNESS.write_text(json.dumps(report, indent=2) + "\n")


def fuzz(which: str, n: int, config: str, sim: str, seed: int | None) -> dict:
    """Run fuzzer ``which`` over ``n`` items; its figures (``passed`` False on failure)."""
    module, testcase, param, _, _ = FUZZERS[which]
    out = BUILD / "fuzz" / f"{which}-{config}-{sim}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    t0 = time.monotonic()
    result = run(module, "device", load_config(config), sim, testcase=testcase, seed=seed,
                 params={param: n, "out": str(out)}, name=f"fuzz-{which}", quiet=True)
    figures = json.loads(out.read_text()) if out.exists() else {}
    return {"passed": result.ok, "log": str(result.log),
            "seconds": round(time.monotonic() - t0, 1), **figures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--descriptors", type=int, default=10_000)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--cache-messages", type=int, default=100_000)
    ap.add_argument("--config", default="small")
    ap.add_argument("--sim", default="verilator", choices=("verilator", "icarus"))
    ap.add_argument("--seed", type=int)
    args = ap.parse_args(argv)
    failed = 0
    cxl = {}            # CXL fuzzer -> messages of this run
    for which, n in (("descriptors", args.descriptors), ("messages", args.messages),
                     ("cache", args.cache_messages)):
        if n <= 0:
            continue
        print(f"{which} fuzzer: {n} on {args.config}, {args.sim} ...", flush=True)
        r = fuzz(which, n, args.config, args.sim, args.seed)
        if not r["passed"]:
            print(f"  FAILED; log {r['log']} (its first lines give the seed that replays it)")
            failed += 1
            continue
        figure, key = FUZZERS[which][3:]
        update_robustness({key: r[figure], f"{key}_run": {
            **{k: v for k, v in r.items() if k not in ("passed", figure)},
            "config": args.config, "simulator": args.sim}})
        if which in CXL_FUZZERS:
            cxl[which] = r[figure]
        print(f"  {r[figure]} {which}, every one checked; {r['seconds']} s, seed {r['seed']}")
    if cxl:
        update_robustness({"fuzzed_cxl_messages": sum(cxl.values())})
        print(f"  fuzzed_cxl_messages {sum(cxl.values())} ({' + '.join(cxl)})")
    print(f"wrote {ROBUSTNESS}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
