# amaranth: UnusedElaboratable=no
"""ScatterUpdate split into components (hw/engine/scatter_update.py) against the
single-block version it replaced (tests/_scatter_update_ref.py), cycle by cycle.

Every data test of tests/test_scatter_update.py runs again, each configuration and
traffic of it, with the block under test replaced by a :class:`tests.equivalence.Pair`
of the reference and the split block: the bench drives the reference's ports, the split
block sees the same inputs, and every output port of the two must be equal at every
clock edge (on top of the tests' own checks). Each test runs with several seeds (the
``seed`` fixture's, then the next ones); ``SEED=<n>`` replays.
"""

from __future__ import annotations

import pytest

from hw.engine.scatter_update import ScatterUpdate

from . import test_scatter_update as block
from ._scatter_update_ref import ScatterUpdateRef
from .equivalence import Pair

ROUNDS = 1


@pytest.fixture
def paired(monkeypatch):
    """The block tests' ``ScatterUpdate(...)`` builds a pair instead; returns how many."""
    built = []

    def pair(**kwargs):
        built.append(kwargs)
        return Pair(ScatterUpdateRef(**kwargs), ScatterUpdate(**kwargs))

    monkeypatch.setattr(block, "ScatterUpdate", pair)
    return built


@pytest.mark.parametrize("traffic", [block.SMOOTH, block.ROUGH], ids=["smooth", "rough"])
def test_with_evictions(traffic, seed, paired):
    for k in range(ROUNDS):
        block.test_update_with_evictions(traffic, seed + k)
    assert len(paired) == ROUNDS


def test_coalesced_without_evictions(seed, paired):
    for k in range(ROUNDS):
        block.test_update_coalesced_without_evictions(seed + k)
    assert len(paired) == ROUNDS


@pytest.mark.parametrize("traffic", [block.SMOOTH, block.IDLE, block.ROUGH],
                         ids=["smooth", "idle", "rough"])
@pytest.mark.parametrize("pattern", list(block.PATTERNS))
def test_repeated_rows(pattern, traffic, seed, paired):
    for k in range(ROUNDS):
        block.test_repeated_rows_see_previous_updates(pattern, traffic, seed + k)
    assert len(paired) == ROUNDS


def test_throughput_workloads(seed, paired):
    for k in range(ROUNDS):
        block.test_throughput(seed + k)
    assert len(paired) == ROUNDS
