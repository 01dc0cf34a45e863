# amaranth: UnusedElaboratable=no
"""BagSequencer split into components (hw/engine/bag_sequencer.py) against the
single-block sequencer it replaced (tests/_bag_sequencer_ref.py), cycle by cycle.

Every random and directed test of ``tests/test_bag_sequencer.py`` (random descriptors,
one crafted test per status code, the 16 lanes of pass 1, throughput; smooth and rough
traffic: random idle cycles, ``o_rows`` / ``o_status`` backpressure, AR backpressure and
withheld R beats) and the pool test of ``tests/test_sequencer_pool.py`` (1, 2 and 3
sequencers behind the AXI arbiter, so other ID widths) run here with a pair in place of
each sequencer: the bench drives the reference, the new block sees the same inputs, and
at every clock edge every output port of the two must be equal (a simulator
assertion). Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import pytest

import hw.engine.sequencer_pool as pool_module
from hw.engine.bag_sequencer import BagSequencer
from hw.engine.descriptor import Status

from . import test_bag_sequencer as sequencer_tests
from . import test_sequencer_pool as pool_tests
from ._bag_sequencer_ref import BagSequencerRef
from .equivalence import Pair
from .test_bag_sequencer import ROUGH, SMOOTH


def _pair(**params) -> Pair:
    return Pair(BagSequencerRef(**params), BagSequencer(**params))


CASES = [
    ("test_random_descriptors", SMOOTH),
    ("test_random_descriptors", ROUGH),
    ("test_lane_checks", SMOOTH),
    ("test_lane_checks", ROUGH),
    ("test_throughput", None),
]


@pytest.mark.parametrize(("name", "traffic"), CASES,
                         ids=[f"{n[5:]}-{'smooth' if t is SMOOTH else 'rough' if t else ''}"
                              for n, t in CASES])
def test_same_as_reference(name, traffic, seed, monkeypatch):
    monkeypatch.setattr(sequencer_tests, "BagSequencer", _pair)
    test = getattr(sequencer_tests, name)
    if traffic is None:
        test(seed)
    else:
        test(seed, traffic)


@pytest.mark.parametrize("status", sequencer_tests.SEQUENCER_STATUSES, ids=lambda s: s.name)
def test_same_as_reference_crafted(status: Status, seed, monkeypatch):
    monkeypatch.setattr(sequencer_tests, "BagSequencer", _pair)
    sequencer_tests.test_crafted_status(seed, status)


@pytest.mark.parametrize("sequencers", [1, 2, 3])
@pytest.mark.parametrize("rough", [False, True], ids=["smooth", "rough"])
def test_same_as_reference_in_pool(sequencers, rough, seed, monkeypatch):
    monkeypatch.setattr(pool_module, "BagSequencer", _pair)
    traffic, idle_bp = (pool_tests.ROUGH, 0.3) if rough else (pool_tests.SMOOTH, 0.0)
    pool_tests.test_rows_in_order_with_context(seed, sequencers, traffic, idle_bp, idle_bp)
