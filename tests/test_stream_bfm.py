"""Fast tests of the stream BFMs' logic (tb/stream.py) on fake signal handles.

The same classes run on generated Verilog in ``tb/test_infra.py``; here a fake loop
calls ``drive()``/``sample()`` and fake handles record what was driven.
"""

from __future__ import annotations

import random

import pytest
from amaranth.lib import data

from tb.stream import StreamChecker, StreamSink, StreamSource


class FakeValue(int):
    def to_unsigned(self) -> int:
        return int(self)


class FakeSignal:
    def __init__(self, name: str, width: int = 1):
        self._name = name
        self._path = f"top.{name}"
        self.width = width
        self._v = 0

    def __len__(self) -> int:
        return self.width

    @property
    def value(self) -> FakeValue:
        return FakeValue(self._v)

    @value.setter
    def value(self, v: int) -> None:
        self._v = int(v)


class FakeDut:
    def __init__(self, name: str, width: int):
        for sig, w in (("valid", 1), ("ready", 1), ("payload", width)):
            setattr(self, f"{name}__{sig}", FakeSignal(f"{name}__{sig}", w))


class FakeLoop:
    def __init__(self):
        self.cycle = 0
        self.in_drive_phase = False
        self.agents = []

    def add(self, agent):
        self.agents.append(agent)
        return agent

    def step(self, between=None):
        self.cycle += 1
        self.in_drive_phase = True
        for a in self.agents:
            if hasattr(a, "drive"):
                a.drive()
        self.in_drive_phase = False
        if between:
            between()
        for a in self.agents:
            if hasattr(a, "sample"):
                a.sample()


LAYOUT = data.StructLayout({"a": 4, "b": 8})


def test_source_holds_until_ready_and_sink_collects():
    dut = FakeDut("s", 12)
    loop = FakeLoop()
    got = []
    src = StreamSource(dut, "s", LAYOUT, loop, rng=random.Random(1), idle=0.5,
                       on_transfer=lambda p, c: got.append((p, c)))
    checker = StreamChecker(dut, "s", loop)
    ready_pattern = iter([0, 0, 1, 0, 1, 1, 1, 0, 1] + [1] * 50)
    for i in range(5):
        src.send({"a": i, "b": 10 * i})
    assert src.pending == 5
    seen = []
    while src.pending:
        def dut_side():
            dut.s__ready.value = next(ready_pattern)
            if dut.s__valid.value and dut.s__ready.value:
                seen.append(dut.s__payload.value)
        loop.step(dut_side)
    assert [p for p, _ in got] == seen == [i | (10 * i) << 4 for i in range(5)]
    assert checker.transfers == 5 and checker.violations == []
    loop.step()
    assert dut.s__valid.value == 0


def test_source_clear_drops_valid_in_drive_phase():
    dut = FakeDut("s", 12)
    loop = FakeLoop()
    src = StreamSource(dut, "s", LAYOUT, loop, rng=random.Random(1))
    src.send(3)
    src.send(4)
    loop.step()
    assert dut.s__valid.value == 1
    loop.in_drive_phase = True
    src.clear()
    assert dut.s__valid.value == 0 and src.pending == 0


def test_sink_backpressure_pause_and_checker():
    dut = FakeDut("o", 12)
    loop = FakeLoop()
    got = []
    sink = StreamSink(dut, "o", LAYOUT, loop, rng=random.Random(2), backpressure=0.5,
                      callback=lambda f, c: got.append(f))
    readies = []
    for _ in range(200):
        loop.step(lambda: readies.append(dut.o__ready.value))
    assert 60 < sum(readies) < 140
    sink.paused = True
    dut.o__valid.value = 1
    dut.o__payload.value = 0x2A5
    for _ in range(5):
        loop.step()
    assert got == [] and sink.checker.violations == []
    dut.o__payload.value = 0x2A6          # changes while waiting: a violation
    loop.step()
    sink.paused = False
    while not got:
        loop.step()
    assert got == [{"a": 0x6, "b": 0x2A}]
    with pytest.raises(AssertionError, match=r"o: 1 protocol violation\(s\):\n  cycle 206: "
                       r"top.o__payload changed from 0x2a5 to 0x2a6"):
        sink.checker.check()


def test_checker_observe_rules_and_reset():
    in_reset = False
    chk = StreamChecker(FakeDut("x", 8), "x", None, reset=lambda: in_reset, max_violations=2)
    chk.observe(True, False, (5,), 1)
    chk.observe(True, True, (5,), 2)      # transfer: fine
    chk.observe(True, False, (6,), 3)
    chk.observe(False, False, (), 4)      # fell
    chk.observe(True, False, (7,), 5)
    in_reset = True
    chk.observe(False, False, (), 6)      # a reset may drop valid
    in_reset = False
    chk.observe(True, False, (8,), 7)
    chk.observe(True, False, (9,), 8)     # changed
    chk.observe(True, False, (10,), 9)    # changed, beyond max_violations
    assert chk.transfers == 1
    assert chk.violations == ["cycle 4: top.x__valid fell before the transfer",
                              "cycle 8: top.x__payload changed from 0x8 to 0x9 while valid "
                              "waited for ready"]
    assert chk.violation_count == 3
    with pytest.raises(AssertionError, match=r"and 1 more"):
        chk.check()


@pytest.mark.parametrize(("cls", "kwargs", "message"), [
    (StreamSource, {"idle": 1.0}, r"idle must be in \[0, 1\), not 1.0"),
    (StreamSink, {"backpressure": -0.1}, r"backpressure must be in \[0, 1\), not -0.1"),
])
def test_validation(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(FakeDut("s", 12), "s", LAYOUT, FakeLoop(), rng=random.Random(0), **kwargs)


def test_send_dict_needs_struct_layout():
    src = StreamSource(FakeDut("s", 12), "s", 12, FakeLoop(), rng=random.Random(0))
    with pytest.raises(TypeError, match="s: payload layout is not a StructLayout; send an int"):
        src.send({"a": 1})
