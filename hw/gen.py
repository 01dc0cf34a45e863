"""Elaborate the device and its blocks to Verilog for one configuration.

Usage::

    python -m hw.gen --config default --out build/verilog            # every design
    python -m hw.gen --config configs/small.toml --design device --out build/verilog

Each design is written to ``<out>/<config>/<module>.v`` with the module name
``tcxl_<design>_<config>``, so several configurations can live in one FPGA project.

Memories of :data:`NO_INIT_BITS` bits or more whose initial contents are all zero (every
memory of this RTL) are written without an initial value: the RTL writes each entry
before it uses what it reads from it (the row store reads entries it never wrote, but
takes a line only when a valid bit, a register that reset clears, says that it was
written) and never relies on a memory's contents after reset (the Icarus
runs, where an unwritten entry reads as X, check it for the ``small`` device's large
memories). An FPGA flow then needs no init file for them, and the Verilog of
the ``default`` device is 9.6 MB instead of 21 MB (its UPDATE accumulator's sums and
row buffer alone are 32 Mbit, written out word by word).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

from amaranth.back import rtlil, verilog

from .config import DeviceConfig, load_config

__all__ = ["DESIGNS", "LINT_WAIVERS", "NO_INIT_BITS", "elaborate", "emit", "main", "module_name"]

#: Memories of at least this many bits are emitted without their (all-zero) initial
#: contents.
NO_INIT_BITS = 1 << 16

#: Verilator warnings Amaranth's Verilog produces by construction, waived by ``make
#: lint`` and the FuseSoC core's lint target (``docs/architecture.md``, "Toolchain").
#: ``WIDTH`` (WIDTHEXPAND, WIDTHTRUNC, WIDTHXZEXPAND): in Amaranth an operator widens its
#: result to hold every value (``a + b`` has one bit more than the wider operand) and an
#: assignment truncates or extends to the target's width; both are the language's defined
#: semantics, and Amaranth's Verilog mixes operand widths by design (it emits constants at
#: their minimal width), so these warnings say nothing about the RTL written here.
LINT_WAIVERS = ["-Wno-UNUSEDSIGNAL", "-Wno-PROCASSINIT", "-Wno-DECLFILENAME",
                "-Wno-CASEINCOMPLETE", "-Wno-WIDTH"]

#: design name -> "module:Class"; every class takes ``config=`` as its only argument.
DESIGNS: dict[str, str] = {
    "device": "hw.top:Device",
    "mem_endpoint": "hw.cxl.mem_endpoint:MemEndpoint",
    "csr_bank": "hw.csr.bank:CsrBank",
    "engine": "hw.engine.engine:Engine",
}


def _factory(design: str) -> Callable[..., object]:
    try:
        target = DESIGNS[design]
    except KeyError:
        raise ValueError(f"design must be one of {', '.join(DESIGNS)}, not {design!r}") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


def module_name(design: str, config: DeviceConfig) -> str:
    return f"tcxl_{design}_{config.tag}"


def elaborate(design: str, config: DeviceConfig):
    return _factory(design)(config=config)


def _emit_memory(emitter, cell_idx, cell) -> None:
    """Amaranth's memory emission without the ``$meminit`` of a large all-zero memory
    (module docstring): the memory cell itself is emitted by its ports."""
    if cell.width * cell.depth >= NO_INIT_BITS and not any(cell.init):
        return
    _AMARANTH_EMIT_MEMORY(emitter, cell_idx, cell)


_AMARANTH_EMIT_MEMORY = rtlil.ModuleEmitter.emit_memory


def to_verilog(block, name: str) -> str:
    """``block`` as Verilog (module ``name``), large zero memories without an initial
    value."""
    rtlil.ModuleEmitter.emit_memory = _emit_memory
    try:
        return verilog.convert(block, name=name, emit_src=False)
    finally:
        rtlil.ModuleEmitter.emit_memory = _AMARANTH_EMIT_MEMORY


def emit(design: str, config: DeviceConfig, out_dir: Path) -> tuple[Path, str]:
    """Write one design's Verilog; returns (path, top module name).

    The file is only rewritten when its text changes, so simulator builds that depend
    on it are not invalidated needlessly.
    """
    name = module_name(design, config)
    block = elaborate(design, config)
    text = to_verilog(block, name)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.v"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path, name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hw.gen", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="default",
                        help="preset name (configs/<name>.toml) or path to a TOML file")
    parser.add_argument("--design", action="append", choices=sorted(DESIGNS),
                        help="design to emit (repeatable; default: all)")
    parser.add_argument("--out", type=Path, default=Path("build/verilog"))
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for design in args.design or list(DESIGNS):
        path, _ = emit(design, config, args.out / config.tag)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
