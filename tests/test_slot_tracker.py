# amaranth: UnusedElaboratable=no
"""SlotTracker (hw/cxl/slot_tracker.py) in the Amaranth simulator against a Python model
of its docstring.

A random consumer takes offered slots (random ``ready``) and later releases them in a
random order at random times, so the free list fills and drains; one, two, a
non-power-of-two and sixteen slots. Every cycle: an offered slot must be the model's
next (fresh slots in order, then released ones in release order), a slot released two
cycles ago or earlier must be on offer, ``o_occupancy`` must count taken minus released
slots from the next cycle and ``o_dev_load`` encode it. A passive checker holds
``o_slot`` to the stream rules. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.cxl.endpoint_layouts import dev_load_thresholds
from hw.cxl.slot_tracker import SlotTracker

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .flat_ports import FlatPorts
from .stream_rule import StreamRule


def dev_load(n: int, slots: int) -> int:
    return sum(n >= t for t in dev_load_thresholds(slots))


@pytest.mark.parametrize("slots", [1, 2, 5, 16])
def test_hands_out_and_takes_back(slots, seed):
    rng = random.Random(seed)
    dut = SlotTracker(slots=slots)
    counts = {"taken": 0, "full": 0}

    async def bench(ctx):
        rule = StreamRule("o_slot", strict=True)
        fresh = 0
        free: deque[tuple[int, int]] = deque()      # (slot, cycle released)
        held: list[int] = []
        occupancy = 0
        for cycle in range(3000):
            ready = rng.random() < 0.5
            release = bool(held) and rng.random() < 0.45
            slot = held.pop(rng.randrange(len(held))) if release else None
            ctx.set(dut.o_slot.ready, ready)
            ctx.set(dut.i_release.valid, release)
            ctx.set(dut.i_release.payload, slot or 0)
            valid, offered = ctx.get(dut.o_slot.valid), ctx.get(dut.o_slot.payload)
            assert ctx.get(dut.o_occupancy) == occupancy, f"cycle {cycle}"
            assert ctx.get(dut.o_dev_load) == dev_load(occupancy, slots)
            want = fresh if fresh < slots else free[0][0] if free else None
            if valid:
                assert offered == want, f"cycle {cycle}: offered {offered}, want {want}"
            elif fresh < slots or (free and free[0][1] <= cycle - 3):
                raise AssertionError(f"cycle {cycle}: slot {want} not offered")
            rule.observe(cycle, valid, ready, offered)
            if valid and ready:
                if fresh < slots:
                    fresh += 1
                else:
                    free.popleft()
                held.append(offered)
                counts["taken"] += 1
            if release:
                free.append((slot, cycle))
            occupancy += (valid and ready) - bool(release)
            counts["full"] += occupancy == slots
            await ctx.tick()

    simulate(dut, bench)
    assert counts["taken"] > 500 and counts["full"] > 0


@pytest.mark.parametrize("slots", [0, -1, 2.0, True])
def test_rejects_bad_slots(slots):
    with pytest.raises(ValueError, match=rf"slots must be a positive int, not {slots!r}"):
        SlotTracker(slots=slots)


def test_slots_is_read_only():
    tracker = SlotTracker(slots=5)
    assert tracker.slots == 5
    with pytest.raises(AttributeError):
        tracker.slots = 6


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(FlatPorts(SlotTracker(slots=5)), "tcxl_slot_tracker_5", tmp_path)
