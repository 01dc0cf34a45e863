"""Every cocotb test of the device's test benches runs in some pytest group.

The slow tier runs cocotb tests by name, in groups (one simulator run each). A test that
no group names never runs, silently; this happened to ``test_write_forward_progress``
when its known-bug group was removed. The cocotb tests are found in the source
(top-level ``async def`` decorated with ``cocotb.test``), without a simulator.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from . import test_ckpt_cocotb, test_coherence_cocotb, test_device_cocotb, test_engine_cocotb

ROOT = Path(__file__).resolve().parent.parent


def cocotb_tests(module: str) -> set[str]:
    """Names of the cocotb tests of ``tb/<module>.py``."""
    tree = ast.parse((ROOT / "tb" / f"{module}.py").read_text())
    return {node.name for node in tree.body
            if isinstance(node, ast.AsyncFunctionDef)
            and any("cocotb.test" in ast.unparse(d) for d in node.decorator_list)}


def _named(groups: dict[str, list[str]]) -> set[str]:
    return {name.split("/", 1)[0] for names in groups.values() for name in names}


def _coherence_groups() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for sim in ("verilator", "icarus"):
        for config in ("small", "default"):
            for group, names in test_coherence_cocotb.groups(sim, config).items():
                out[f"{sim}-{config}-{group}"] = names
    return out


GROUPED = {
    "test_device": lambda: test_device_cocotb.GROUPS,
    "test_engine": lambda: test_engine_cocotb.GROUPS,
    "test_ckpt": lambda: test_ckpt_cocotb.GROUPS,
    "test_coherence": _coherence_groups,
}


@pytest.mark.parametrize("module", list(GROUPED))
def test_every_cocotb_test_is_in_a_group(module: str) -> None:
    defined = cocotb_tests(module)
    assert defined, f"no cocotb test found in tb/{module}.py"
    named = _named(GROUPED[module]())
    assert not defined - named, (f"cocotb tests of tb/{module}.py that no group runs: "
                                 f"{sorted(defined - named)}")
    assert not named - defined, (f"groups name tests tb/{module}.py does not define: "
                                 f"{sorted(named - defined)}")
