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
from amaranth.hdl import Assert, Elaboratable, Format, Module
from amaranth.lib import wiring

from hw.ckpt.logger import UndoLogger

from . import test_ckpt_logger as logger_tests
from ._logger_ref import UndoLoggerRef
from .test_ckpt_logger import ROUGH, SMOOTH


def ports(dut: wiring.Component, flow) -> list[tuple[str, object]]:
    return [(".".join(map(str, path)), value)
            for path, member, value in dut.signature.flatten(dut) if member.flow == flow]


class _Pair(Elaboratable):
    """The reference (whose ports the bench uses) and the new block on its inputs."""

    def __init__(self, **params):
        self.ref = UndoLoggerRef(**params)
        self.new = UndoLogger(**params)

    def __getattr__(self, name):
        return getattr(self.ref, name)

    def elaborate(self, platform):
        m = Module()
        m.submodules.ref = self.ref
        m.submodules.new = self.new
        for (name, a), (name_b, b) in zip(ports(self.ref, wiring.In),
                                          ports(self.new, wiring.In), strict=True):
            assert name == name_b
            m.d.comb += b.eq(a)
        for (name, a), (_, b) in zip(ports(self.ref, wiring.Out),
                                     ports(self.new, wiring.Out), strict=True):
            m.d.sync += Assert(a == b, Format(f"{name}: new {{}}, reference {{}}", b, a))
        return m


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
    monkeypatch.setattr(logger_tests, "UndoLogger", _Pair)
    test = getattr(logger_tests, name)
    if traffic is None:
        test(seed)
    else:
        test(traffic, seed)
