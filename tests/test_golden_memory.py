"""Fast tier: the golden memory of the CXL.mem scoreboard (``sim/golden_memory.py``)."""

from __future__ import annotations

import random

import pytest

from sim.golden_memory import FULL_MASK, LINE_BYTES, GoldenMemory, mask_bytes, merge_line


def test_unwritten_lines_read_fill():
    mem = GoldenMemory(16)
    assert mem.read(3) == bytes(LINE_BYTES)
    assert GoldenMemory(fill=b"\xAA" * LINE_BYTES).read(10**9) == b"\xAA" * LINE_BYTES
    assert len(mem) == 0 and list(mem.touched()) == []


def test_full_and_partial_writes():
    mem = GoldenMemory(16)
    a = bytes(range(LINE_BYTES))
    assert mem.write(2, a) == a
    b = bytes(0xFF - i for i in range(LINE_BYTES))
    be = 1 | 1 << 7 | 1 << 63
    new = mem.write(2, b, be)
    want = bytearray(a)
    for i in (0, 7, 63):
        want[i] = b[i]
    assert new == bytes(want) == mem.read(2)
    assert mem.write(2, b, 0) == bytes(want), "byte enable 0 changes nothing"
    assert 2 in mem and list(mem.touched()) == [2] and mem.writes == 3


def test_merge_matches_bytewise_reference():
    rng = random.Random(1)
    for _ in range(200):
        old, new = rng.randbytes(LINE_BYTES), rng.randbytes(LINE_BYTES)
        be = rng.getrandbits(LINE_BYTES)
        ref = bytes(new[i] if be >> i & 1 else old[i] for i in range(LINE_BYTES))
        assert merge_line(old, new, be) == ref
    assert mask_bytes(FULL_MASK) == b"\xFF" * LINE_BYTES


def test_set_is_a_backdoor():
    mem = GoldenMemory(4)
    mem.set(1, b"\x01" * LINE_BYTES)
    assert mem.read(1) == b"\x01" * LINE_BYTES and mem.writes == 0
    mem.clear()
    assert len(mem) == 0


@pytest.mark.parametrize(("call", "message"), [
    (lambda: GoldenMemory(0), "lines must be positive, not 0"),
    (lambda: GoldenMemory(fill=b"x"), "fill must be 64 bytes, not 1"),
    (lambda: merge_line(b"x", bytes(64)), "lines are 64 bytes, not 1 and 64"),
    (lambda: merge_line(bytes(64), bytes(64), 1 << 64), "byte_enable must fit 64 bits"),
])
def test_validation_messages(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_out_of_range_line():
    with pytest.raises(IndexError, match=r"line 16 outside 0\.\.16"):
        GoldenMemory(16).read(16)
