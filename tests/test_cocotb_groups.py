"""Every cocotb test of the device's test benches runs in exactly one pytest group.

The slow tier runs cocotb tests by name, in groups (one simulator run each). A test that
no group names never runs, silently; this happened to ``test_write_forward_progress``
when its known-bug group was removed. The benches tag each test with its group
(``tb.groups.group``) and the pytest modules read the groups from the tags; the cocotb
tests are also found in the source (top-level ``async def`` decorated with
``cocotb.test``), so a test the tags miss is caught. No simulator is needed.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from tb import groups

from . import test_ckpt_cocotb, test_coherence_cocotb, test_device_cocotb, test_engine_cocotb
from .conftest import cocotb_items, every_variant

ROOT = Path(__file__).resolve().parent.parent


def cocotb_tests(module: str) -> set[str]:
    """Names of the cocotb tests of ``tb/<module>.py``."""
    tree = ast.parse((ROOT / "tb" / f"{module}.py").read_text())
    return {node.name for node in tree.body
            if isinstance(node, ast.AsyncFunctionDef)
            and any("cocotb.test" in ast.unparse(d) for d in node.decorator_list)}


#: Modules whose groups come from the tests' tags, and the groups their pytest module runs.
TAGGED = {
    "test_device": test_device_cocotb.GROUPS,
    "test_engine": test_engine_cocotb.GROUPS,
    "test_ckpt": test_ckpt_cocotb.GROUPS,
    "test_coherence": test_coherence_cocotb.GROUPS,
}


@pytest.mark.parametrize("module", list(TAGGED))
def test_every_cocotb_test_is_tagged_and_run_once(module: str) -> None:
    defined = cocotb_tests(module)
    assert defined, f"no cocotb test found in tb/{module}.py"
    found = groups.cocotb_tests(f"tb.{module}")
    assert set(found) == defined, (f"tb/{module}.py defines {sorted(defined)}, its import "
                                   f"has {sorted(found)}")
    untagged = sorted(name for name, (tag, _) in found.items() if tag is None)
    assert not untagged, f"cocotb tests of tb/{module}.py without a @group tag: {untagged}"
    want = Counter(n for _, names in found.values() for n in names)
    run = Counter(n for names in TAGGED[module].values() for n in names)
    assert run == want, (f"tb/{module}.py: variants no group runs "
                         f"{sorted(want - run)}, run more than once or unknown "
                         f"{sorted(run - want)}")


@pytest.mark.parametrize("module", [test_device_cocotb, test_engine_cocotb, test_ckpt_cocotb,
                                    test_coherence_cocotb], ids=lambda m: m.__name__)
def test_icarus_sample_names_groups(module) -> None:
    """A misspelt group in a module's Icarus sample would silently run nothing."""
    assert module.ICARUS_SAMPLE and set(module.ICARUS_SAMPLE) <= set(module.GROUPS)


def test_icarus_runs_its_sample_only_beside_verilator() -> None:
    groups_ = {"a": [], "b": [], "c": []}
    both = [("verilator", "small"), ("verilator", "odd"), ("icarus", "small")]
    assert cocotb_items(both, groups_, ("b",)) == [
        ("verilator", "small", "a"), ("verilator", "small", "b"), ("verilator", "small", "c"),
        ("verilator", "odd", "a"), ("verilator", "odd", "b"), ("verilator", "odd", "c"),
        ("icarus", "small", "b")]
    alone = [("icarus", "small")]                       # SIM=icarus: every group
    assert cocotb_items(alone, groups_, ("b",)) == [("icarus", "small", g) for g in "abc"]
    assert every_variant("verilator", "small", both)
    assert not every_variant("verilator", "odd", both)
    assert not every_variant("icarus", "small", both)
    assert not every_variant("icarus", "small", alone)


def test_a_test_has_one_group() -> None:
    with pytest.raises(ValueError, match="tagged with groups 'a' and 'b'"):
        groups.group("b")(groups.group("a")(lambda dut: None))
    with pytest.raises(ValueError, match="group name must be an identifier, not 'a b'"):
        groups.group("a b")


def test_coherence_variants_are_the_noisy_ones() -> None:
    """Icarus and the default device run each coherence test's noisy variants, and only
    those; Verilator ``small`` runs every variant (checked with the tags above)."""
    every = test_coherence_cocotb.variants("verilator", "small")
    for sim, config in (("icarus", "small"), ("verilator", "default")):
        some = test_coherence_cocotb.variants(sim, config)
        for g, names in every.items():
            noisy = [n for n in names if "noise=False" not in n]
            assert some[g] == noisy, (sim, config, g)
            assert {n.split("/", 1)[0] for n in noisy} == {n.split("/", 1)[0] for n in names}


def test_noisiest_keeps_every_test_with_all_noise_on() -> None:
    names = ["t_plain", "t_r/idle=False/backpressure=False", "t_r/idle=False/backpressure=True",
             "t_r/idle=True/backpressure=False", "t_r/idle=True/backpressure=True",
             "t_h/idle=True/backpressure=True/slow=reads",
             "t_h/idle=True/backpressure=True/slow=writes",
             "t_h/idle=False/backpressure=True/slow=reads",
             "t_c/noise=False/bias=host", "t_c/noise=True/bias=host", "t_c/noise=True",
             "t_c/noise=False"]
    assert groups.noisiest(names) == [
        "t_plain", "t_r/idle=True/backpressure=True",
        "t_h/idle=True/backpressure=True/slow=reads",
        "t_h/idle=True/backpressure=True/slow=writes",
        "t_c/noise=True/bias=host", "t_c/noise=True"]
    # Every test function of the benches keeps at least one variant.
    for module in TAGGED:
        for name, (_, variants) in groups.cocotb_tests(f"tb.{module}").items():
            assert groups.noisiest(variants), f"tb/{module}.py: {name} has no variant left"
