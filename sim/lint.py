"""Verilator ``-Wall`` lint of every generated module.

Usage: ``python -m sim.lint [--config NAME ...]`` (default: every preset). The only
waivers are those ``docs/architecture.md`` ("Toolchain") lists for Amaranth's output; any
other warning fails, and
so does a combinational process Icarus would leave X at time zero
(:func:`untriggered_processes`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from hw.config import load_config, preset_names
from hw.gen import DESIGNS, LINT_WAIVERS, to_verilog

from . import toolenv
from .runner import BUILD, emit_shared

__all__ = ["lint", "lint_block", "lint_file", "main", "standalone_blocks",
           "untriggered_processes"]


def lint(design: str, config_name: str) -> tuple[bool, str]:
    """Lint one design for one config; returns (clean, verilator output)."""
    path, top = emit_shared(design, load_config(config_name))
    return lint_file(path, top)


def standalone_blocks() -> dict:
    """Blocks not yet inside the device top, with representative parameters:
    name -> zero-argument factory."""
    from hw.arith import UNITS
    from hw.bus.axi_arbiter import AxiArbiter
    from hw.cxl.cache_agent import CacheAgent
    from hw.cxl.dcoh import Dcoh
    from hw.cxl.dcoh_gate import DcohGate
    from hw.engine.bag_sequencer import BagSequencer
    from hw.engine.coalesced_update import CoalescedUpdate
    from hw.engine.pool_reduce import PoolReduce
    from hw.engine.row_gather import RowGather

    blocks = dict(UNITS)
    blocks["pool_reduce"] = PoolReduce
    blocks["row_gather"] = lambda: RowGather(addr_width=30, id_width=8)
    blocks["bag_sequencer"] = lambda: BagSequencer(addr_width=30, id_width=8)
    blocks["coalesced_update"] = lambda: CoalescedUpdate(addr_width=30, id_width=8,
                                                         acc_rows=1024, max_items=16)
    blocks["cxl_cache_agent"] = CacheAgent
    blocks["dcoh"] = lambda: Dcoh(cqid_base=2048)
    blocks["dcoh_gate"] = lambda: DcohGate(addr_width=30, id_width=8)
    blocks["axi_arbiter"] = lambda: AxiArbiter(addr_width=30, data_width=512, id_width=8,
                                               priorities=(0, 0, 1))
    return blocks


def lint_block(name: str, factory) -> tuple[bool, str]:
    """Lint one standalone block built by ``factory()``."""
    top = f"tcxl_{name}"
    out = BUILD / "lint" / "blocks"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{top}.v"
    path.write_text(to_verilog(factory(), top))
    return lint_file(path, top)


def untriggered_processes(text: str) -> list[int]:
    """Line numbers of ``always @*`` processes without Yosys's time-zero trigger.

    Yosys writes a process as ``always @* begin if (<trigger>) begin end ...`` so that
    Icarus runs it at time zero; a lone bit assignment (``sig[k].eq(...)`` on its own in
    Amaranth) comes out as a one-statement ``always @*`` without it, which Icarus runs
    only once an input changes: until then the bit is X (IEEE 1364, 9.7.5). Build such
    a signal from separate signals with one ``Cat`` instead."""
    return [n for n, line in enumerate(text.splitlines(), 1)
            if line.strip() == "always @*"]


def lint_file(path: Path, top: str) -> tuple[bool, str]:
    toolenv.setup()
    verilator = toolenv.verilator_root() / "bin" / "verilator"
    proc = subprocess.run(
        [str(verilator), "--lint-only", "-Wall", *LINT_WAIVERS, "--top-module", top, str(path)],
        capture_output=True, text=True)
    output = (proc.stdout + proc.stderr).strip()
    lines = untriggered_processes(path.read_text())
    if lines:
        output += (f"\n{path}: always @* without a time-zero trigger (X on Icarus until an "
                   f"input changes) at lines {lines[:10]}")
    return proc.returncode == 0 and "%Warning" not in output and not lines, output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.lint", description=__doc__.split("\n")[0])
    parser.add_argument("--config", action="append", help="preset or TOML path (repeatable)")
    args = parser.parse_args(argv)
    configs = args.config or preset_names()
    jobs = [(f"{design} ({Path(str(config)).stem})", lint, (design, config))
            for config in configs for design in DESIGNS]
    jobs += [(f"{name} (standalone block)", lint_block, (name, factory))
             for name, factory in standalone_blocks().items()]
    failures = 0
    for label, fn, args_ in jobs:
        clean, output = fn(*args_)
        print(f"{'ok  ' if clean else 'FAIL'} {label}")
        if not clean:
            failures += 1
            print(output)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
