"""pytest set-up shared by every test: simulator environment and the SIM/SEED knobs."""

from __future__ import annotations

import os

import pytest

from sim import toolenv

toolenv.setup()


def simulators() -> list[str]:
    """Simulators to run cocotb tests on: ``SIM`` restricts to one, default both."""
    sim = os.environ.get("SIM")
    return [sim] if sim else list(toolenv.SIMULATORS)


def configs(default: tuple[str, ...]) -> list[str]:
    """Configs to run cocotb tests on: ``CONFIG`` restricts to one, else ``default``."""
    config = os.environ.get("CONFIG")
    return [config] if config else list(default)


def require_simulator(sim: str) -> None:
    if not toolenv.have_simulator(sim):
        hint = "sudo apt-get install -y iverilog" if sim == "icarus" else "make venv"
        pytest.skip(f"{sim} not installed ({hint})")


def seed() -> int | None:
    value = os.environ.get("SEED")
    return int(value) if value else None
