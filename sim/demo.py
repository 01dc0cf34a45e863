"""``python -m sim.demo``: the CXL.mem demonstration on the generated Verilog (``make
sim`` runs the DLRM training of :mod:`sim.train`).

An emulated GPU identifies the device over CSRs, streams writes and reads through the
CXL.mem endpoint into the PMEM model (120-cycle reads, 40-cycle writes, one line per
cycle peak), runs random mixed traffic with idle cycles and backpressure, sends one
bad request, and every response is checked against a golden memory. This prints
the transactions, bandwidth and latency of each phase and writes them to
``build/sim/demo-<config>-<sim>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hw.config import load_config

from . import toolenv
from .runner import BUILD, run

__all__ = ["main"]

#: A clock an FPGA build of the endpoint can plausibly reach, to turn lines per cycle
#: into bytes per second for the reader (Intel's R-Tile CXL IP hands over at ~545 MHz).
NOMINAL_MHZ = 400


def render(report: dict, sim: str) -> str:
    out = [f"TrainingCXL CXL.mem demonstration: config {report['config']}, {sim}, "
           f"seed {report['seed']} (replay: make sim SEED={report['seed']})", ""]
    out.append("Device identification and status over AXI4-Lite CSRs:")
    out += [f"  {k:<12} {v}" for k, v in report["csr"].items()]
    for phase in report["phases"]:
        lat = phase["latency"]
        gbps = phase["lines_per_cycle"] * 64 * NOMINAL_MHZ / 1000
        out += ["", f"== {phase['name']}: {phase['transactions']} requests, "
                    f"{phase['answered']} answered, {phase['cycles']} cycles"]
        if len(phase["kinds"]) > 1:
            out.append("   " + ", ".join(f"{k} {v}" for k, v in phase["kinds"].items()))
        out += [f"   {s}" for s in phase["sample"]]
        if phase["transactions"] > len(phase["sample"]):
            out.append("   ...")
        out.append(f"   bandwidth {phase['lines_per_cycle']:.3f} lines/cycle "
                   f"({phase['lines_read']} read, {phase['lines_written']} written) "
                   f"= {gbps:.1f} GB/s at {NOMINAL_MHZ} MHz")
        if lat:
            out.append(f"   latency (M2S handshake -> last response) min {lat['min']}, "
                       f"mean {lat['mean']}, p50 {lat['p50']}, p99 {lat['p99']}, "
                       f"max {lat['max']} cycles")
    out += ["", f"{report['responses_checked']} responses checked against the golden memory; "
                f"final PMEM image equal to it; protocol checkers silent. "
                f"{report['cycles']} cycles simulated."]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--sim", default="verilator", choices=toolenv.SIMULATORS)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--waves", action="store_true")
    parser.add_argument("--lines", type=int, default=2048)
    parser.add_argument("--n-txn", type=int, default=3000)
    args = parser.parse_args(argv)
    config = load_config(args.config)
    out = BUILD / "sim" / f"demo-{config.tag}-{args.sim}.json"
    out.unlink(missing_ok=True)
    print(f"Building {config.tag} device for {args.sim} and simulating "
          f"(about a minute on Verilator; progress in the log below) ...", flush=True)
    t0 = time.monotonic()
    result = run("tb.demo_mem", "device", config, args.sim, testcase="demo", seed=args.seed,
                 params={"out": str(out), "lines": args.lines, "n_txn": args.n_txn},
                 waves=args.waves, name="demo", quiet=True)
    print(f"  log: {result.log}")
    if not result.ok or not out.exists():
        print(f"demo FAILED; see {result.log}", file=sys.stderr)
        tail = result.log.read_text().splitlines()[-40:] if result.log.exists() else []
        print("\n".join(tail), file=sys.stderr)
        return 1
    report = json.loads(out.read_text())
    print(render(report, args.sim))
    print(f"\nwall time {time.monotonic() - t0:.0f} s; JSON: {out}")
    if args.waves:
        print(f"waveforms: {result.test_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
