"""Benchmarks: ``make bench`` writes ``build/bench/*.json``.

``mem_endpoint.json``: read/write utilization of the PMEM peak with a 120/40-cycle
PMEM, the latency the endpoint adds to an isolated request, and simulation speed on
each simulator. Figures are measured by cocotb benches (``tb/bench_mem.py``) on the
generated Verilog; nothing here is asserted — the tests do that.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hw.config import load_config

from . import toolenv
from .runner import BUILD, run

__all__ = ["bench_mem_endpoint", "main"]


def _measure(testcase: str, config, sim: str, params: dict, seed: int | None) -> dict:
    out = BUILD / "bench" / "raw" / f"{testcase}-{config.tag}-{sim}.json"
    out.unlink(missing_ok=True)
    result = run("tb.bench_mem", "device", config, sim, testcase=testcase, seed=seed,
                 params={**params, "out": str(out)}, name=f"bench-{testcase}", quiet=True)
    if not result.ok or not out.exists():
        raise RuntimeError(f"{testcase} on {sim} failed; log: {result.log}")
    return json.loads(out.read_text())


def bench_mem_endpoint(config_name: str, sim: str, seed: int | None) -> dict:
    config = load_config(config_name)
    t0 = time.monotonic()
    figures = _measure("bench_endpoint", config, sim, {"lines": 4096}, seed)
    speed = {}
    for s in toolenv.SIMULATORS:
        if not toolenv.have_simulator(s):
            print(f"  {s} not installed: no sim_cycles_per_second for it")
            continue
        n = 6000 if s == "verilator" else 2000
        speed[s] = _measure("bench_sim_speed", config, s, {"n_txn": n}, seed)
    result = {
        "benchmark": "mem_endpoint",
        "simulator": sim,
        **figures,
        "sim_cycles_per_second": {s: v["sim_cycles_per_second"] for s, v in speed.items()},
        "sim_speed_runs": speed,
        "targets": {"read_utilization": ">= 0.95", "write_utilization": ">= 0.95",
                    "added_read_latency_cycles": "<= 4", "added_write_latency_cycles": "<= 4"},
        "wall_seconds": round(time.monotonic() - t0, 1),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--sim", default="verilator", choices=toolenv.SIMULATORS)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    toolenv.setup()
    out_dir = BUILD / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"mem_endpoint benchmark ({args.config}, {args.sim}) ...")
    result = bench_mem_endpoint(args.config, args.sim, args.seed)
    path = out_dir / "mem_endpoint.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "sim_speed_runs"}, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
