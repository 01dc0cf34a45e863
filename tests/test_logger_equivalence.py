# amaranth: UnusedElaboratable=no
"""UndoLogger split into components (hw/ckpt/logger.py) against the single-block
logger it replaced (tests/_logger_ref.py), cycle by cycle.

Every random test of ``tests/test_ckpt_logger.py`` (ring wrap with duplicates and
evictions, distinct rows, back-to-back duplicates, overflow / commit / restart,
disabled, throughput; random idle cycles, AW/W backpressure and withheld Bs) runs
here with a pair in place of the logger: the bench drives the reference, the new block
sees the same inputs, and at every clock edge every output port of the two must be
equal (a simulator assertion). Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import pytest

from hw.ckpt.logger import UndoLogger

from . import test_ckpt_logger as logger_tests
from ._logger_ref import UndoLoggerRef
from .equivalence import Pair
from .test_ckpt_logger import ROUGH, SMOOTH


def _pair(**params) -> Pair:
    return Pair(UndoLoggerRef(**params), UndoLogger(**params))


CASES = [
    ("test_ring_wraps_with_duplicates_and_evictions", SMOOTH),
    ("test_ring_wraps_with_duplicates_and_evictions", ROUGH),
    ("test_every_distinct_row_once_without_evictions", None),
    ("test_back_to_back_duplicates", SMOOTH),
    ("test_back_to_back_duplicates", ROUGH),
    ("test_overflow_then_commit_then_restart", None),
    ("test_disabled_drops_everything", None),
    ("test_throughput", None),
]


@pytest.mark.parametrize(("name", "traffic"), CASES,
                         ids=[f"{n[5:]}-{'smooth' if t is SMOOTH else 'rough' if t else ''}"
                              for n, t in CASES])
def test_same_as_reference(name, traffic, seed, monkeypatch):
    monkeypatch.setattr(logger_tests, "UndoLogger", _pair)
    test = getattr(logger_tests, name)
    if traffic is None:
        test(seed)
    else:
        test(traffic, seed)
