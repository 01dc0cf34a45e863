"""Every generated module of every preset lints clean (Verilator -Wall with only the
Amaranth waivers of TOOLCHAIN.md), so CI keeps the promise of ``make lint``."""

from __future__ import annotations

import pytest

from hw.config import preset_names
from hw.gen import DESIGNS
from sim import lint, toolenv


@pytest.mark.parametrize("design", list(DESIGNS))
@pytest.mark.parametrize("config", preset_names())
def test_design_lints_clean(config: str, design: str) -> None:
    if not toolenv.have_simulator("verilator"):
        pytest.skip("verilator not installed (make venv)")
    clean, output = lint.lint(design, config)
    assert clean, output
