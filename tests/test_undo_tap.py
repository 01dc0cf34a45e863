# amaranth: UnusedElaboratable=no
"""UndoTap (hw/engine/undo_tap.py) in the Amaranth simulator against a model of its
docstring.

The bench is a sender as the docstring asks: it holds a captured line (``pending``),
lets it leave on ``i_line`` at random, and loads a new one only with ``room``; the
undo consumer's ``ready`` is random. Checked every cycle: ``room`` is "the items
written and not yet taken, plus the pending one, are fewer than ``depth``"; every item
arrives on ``o_undo`` once, in order (none dropped); a passive checker holds ``o_undo``
to the stream rules. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.engine.gather_layouts import UNDO
from hw.engine.undo_tap import UndoTap

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .stream_rule import StreamRule


@pytest.mark.parametrize("depth", [3, 4, 7])
@pytest.mark.parametrize("ready_p", [0.2, 0.7, 1.0], ids=["slow", "medium", "always"])
def test_never_drops(depth, ready_p, seed):
    rng = random.Random(seed)
    dut = UndoTap(depth=depth)
    rule = StreamRule("o_undo")
    got: list[int] = []
    sent: list[int] = []
    stats = {"full": 0}

    async def bench(ctx):
        pending = None
        held = 0                        # written and not yet taken
        # With depth 7 and ready 0.7 the FIFO never fills in 3,000 cycles for about 1 seed
        # in 400, and with ready 0.2 about 1 in 40,000 moves too few lines: the run goes on
        # (same seed) until both happened.
        for cycle in range(30_000):
            if cycle >= 3000 and len(got) > 500 and (stats["full"] or ready_p == 1.0):
                break
            leave = pending is not None and rng.random() < 0.6
            ctx.set(dut.pending, pending is not None)
            ctx.set(dut.i_line.valid, leave)
            if leave:
                ctx.set(dut.i_line.payload.as_value(), pending)
            ctx.set(dut.o_undo.ready, rng.random() < ready_p)
            room = ctx.get(dut.room)
            want_room = held + (pending is not None) < depth
            assert room == want_room, f"cycle {cycle}: room {room}, {held} held"
            stats["full"] += not room
            if leave:
                assert ctx.get(dut.i_line.ready), f"cycle {cycle}: a line the FIFO cannot take"
                sent.append(pending)
                pending = None
            if pending is None and room and rng.random() < 0.8:
                pending = rng.getrandbits(UNDO.size)
            _, _, valid, ready, payload = await ctx.tick().sample(
                dut.o_undo.valid, dut.o_undo.ready, dut.o_undo.payload.as_value())
            rule.observe(cycle, valid, ready, payload)
            held += leave
            if valid and ready:
                got.append(payload)
                held -= 1

    simulate(dut, bench)
    assert not rule.errors, rule.errors[:5]
    assert got == sent[:len(got)] and len(sent) - len(got) <= depth
    assert len(got) > 500
    if ready_p < 1.0:
        assert stats["full"] > 0, "the FIFO never filled: the test proves nothing"


@pytest.mark.parametrize("depth", [2, 65, "4", True])
def test_rejects_bad_depth(depth):
    with pytest.raises(ValueError, match=f"^depth must be an integer from 3 to 64, not {depth!r}$"):
        UndoTap(depth=depth)


def test_depth_is_a_read_only_property():
    tap = UndoTap(depth=5)
    assert tap.depth == 5
    with pytest.raises(AttributeError):
        tap.depth = 6


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(UndoTap(depth=4), "undo_tap_d4", tmp_path)
