"""What the runner (``sim/runner.py``) hands a cocotb test module through the environment."""

from __future__ import annotations

import json
import os

from hw.config import DeviceConfig

__all__ = ["config", "params"]


def config() -> DeviceConfig:
    """The :class:`DeviceConfig` the simulated Verilog was generated from."""
    return DeviceConfig(**json.loads(os.environ["TCXL_CONFIG"]))


def params() -> dict:
    """Test parameters chosen by the pytest entry point, demo or benchmark."""
    return json.loads(os.environ.get("TCXL_PARAMS", "{}"))
