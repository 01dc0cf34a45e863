"""Generated modules lint clean (Verilator -Wall with only the Amaranth waivers of
``docs/architecture.md``, "Toolchain"), so CI keeps the promise of ``make lint``.

The device (which contains every other design as a submodule) is linted for the
``small`` and ``odd`` presets, and the standalone memory endpoint and CSR bank, whose
only difference is that their ports are top-level pins, for ``small``. The ``default``
device (about 170 s, most of it generating its Verilog) and the standalone engine
(about 60 s, its logic being the device's ``engine`` submodule linted here) are left to
``make lint``, which lints every design of every preset, for the CI budget
(``docs/verification.md``, "What CI runs").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hw.config import preset_names
from hw.gen import DESIGNS
from sim import lint, toolenv

#: Left to ``make lint`` (module docstring).
NOT_IN_CI = (("default", "device"), ("small", "engine"))
CASES = [c for c in [(config, "device") for config in preset_names()]
         + [("small", design) for design in DESIGNS if design != "device"]
         if c not in NOT_IN_CI]


@pytest.mark.parametrize("config, design", CASES)
def test_design_lints_clean(config: str, design: str) -> None:
    if not toolenv.have_simulator("verilator"):
        pytest.skip("verilator not installed (make venv)")
    clean, output = lint.lint(design, config)
    assert clean, output


def test_untriggered_processes_are_found() -> None:
    """The check behind the Icarus X of ``docs/coherence.md``: Yosys's one-statement
    ``always @*`` is found, its triggered form is not."""
    text = ("  always @* begin\n    if (\\$auto$t ) begin end\n    a = b;\n  end\n"
            "  always @*\n    err[4] = \\$259 ;\n")
    assert lint.untriggered_processes(text) == [5]


def _lint_text(tmp_path: Path, text: str) -> tuple[bool, str]:
    if not toolenv.have_simulator("verilator"):
        pytest.skip("verilator not installed (make venv)")
    path = tmp_path / "t.v"
    path.write_text(text)
    return lint.lint_file(path, "t")


def test_width_mismatch_is_waived(tmp_path: Path) -> None:
    """Amaranth's widening and truncating assignments (WIDTHEXPAND, WIDTHTRUNC) pass."""
    clean, output = _lint_text(tmp_path, (
        "module t(input [3:0] a, input [7:0] b, output [7:0] y, output [3:0] z);\n"
        "  assign y = a + b[2:0];\n  assign z = b;\nendmodule\n"))
    assert clean, output


@pytest.mark.parametrize("body, warning", [
    ("  assign y = {4'd0, a};\n", "UNDRIVEN"),                 # u is never driven
    ("  assign y = {a, 1};\n  assign u = a;\n", "WIDTHCONCAT"),  # an unsized constant
])
def test_other_warnings_fail(tmp_path: Path, body: str, warning: str) -> None:
    """Every warning outside the Amaranth waivers still fails the lint."""
    clean, output = _lint_text(tmp_path, (
        "module t(input [3:0] a, output [7:0] y, output [3:0] u);\n" + body + "endmodule\n"))
    assert not clean
    assert f"%Warning-{warning}" in output


def test_untriggered_process_fails_lint(tmp_path: Path) -> None:
    """A one-statement ``always @*`` fails the lint although Verilator accepts it."""
    clean, output = _lint_text(tmp_path, (
        "module t(input a, output reg y);\n  always @*\n    y = a;\nendmodule\n"))
    assert not clean
    assert "without a time-zero trigger" in output
