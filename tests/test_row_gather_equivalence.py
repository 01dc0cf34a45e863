# amaranth: UnusedElaboratable=no
"""RowGather split into components (hw/engine/row_gather.py) against the single-block
gather it replaced (tests/_row_gather_ref.py), cycle by cycle.

Every data test of tests/test_row_gather.py runs as it is, with its own stimulus
(random descriptors, out-of-order PMEM with jitter, random idle, backpressure on
``o_lines``, ``o_undo`` and AR, a reset in mid-traffic) and its own checks, on
:class:`tests.equivalence.Pair` of the reference and the split block: the bench drives
the reference's ports, both see the same inputs, and every output port of the two must
be equal at every clock edge. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import pytest

from hw.engine.row_gather import RowGather

from . import test_row_gather as block
from ._row_gather_ref import RowGatherRef
from .equivalence import Pair


@pytest.fixture(autouse=True)
def paired(monkeypatch):
    """The block tests build ``Pair(reference, split)`` where they built the block."""
    monkeypatch.setattr(block, "RowGather",
                        lambda **kwargs: Pair(RowGatherRef(**kwargs), RowGather(**kwargs)))


@pytest.mark.parametrize("traffic", ["smooth", "rough"])
@pytest.mark.parametrize("config", list(block.CONFIGS))
def test_lines_in_index_order(config, traffic, seed):
    block.test_lines_in_index_order(config, traffic, seed)


def test_undo_consumer_not_always_ready(seed):
    block.test_undo_consumer_not_always_ready(seed)


def test_capture_off_gives_no_undo(seed):
    block.test_capture_off_gives_no_undo(seed)


def test_reset_in_the_middle_of_traffic(seed):
    block.test_reset_in_the_middle_of_traffic(seed)


@pytest.mark.parametrize("config", ["rob16-id1", "rob256-id8"])
def test_long_random_stress(config, seed):
    block.test_long_random_stress(config, seed)


def test_throughput_at_least_0_9_lines_per_cycle():
    block.test_throughput_at_least_0_9_lines_per_cycle()
