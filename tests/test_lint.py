"""Generated modules lint clean (Verilator -Wall with only the Amaranth waivers of
``docs/architecture.md``, "Toolchain"), so CI keeps the promise of ``make lint``.

The device (which contains every other design as a submodule) is linted for every
preset; the standalone designs, whose only difference is that their ports are top-level
pins, for the ``default`` preset (``make lint`` lints every design of every preset).
"""

from __future__ import annotations

import pytest

from hw.config import preset_names
from hw.gen import DESIGNS
from sim import lint, toolenv

CASES = [(config, "device") for config in preset_names()] + [
    ("default", design) for design in DESIGNS if design != "device"]


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
