# amaranth: UnusedElaboratable=no
"""CacheFlush (hw/engine/cache_flush.py) in the Amaranth simulator against a Python model
of its docstring.

After reset every slot must be invalidated in order (``cleared`` with the last). Then,
descriptor after descriptor, random slots are marked (some twice, some whose tag the
bench invalidates meanwhile), indices and write-backs counted, and a walk started: it
must request exactly the write-backs of the marked slots with a valid tag, lowest slot
first, with the tag's row, invalidate each, wait for every request to be over and for
``b_owed`` to drop, and report the counts on ``o_done`` (random backpressure, stream
rule checked). The tag memory is modelled by the bench (a synchronous read of
``slot``). Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.engine.cache_flush import CacheFlush
from hw.engine.update_layouts import DONE, TAG

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule


@pytest.mark.parametrize("cache_rows", [2, 8])
def test_walks_marked_slots(cache_rows, seed):
    rng = random.Random(seed)
    dut = CacheFlush(cache_rows=cache_rows)
    rule = StreamRule("o_done", strict=True)
    done_records = []

    async def bench(ctx):
        tags = {s: (rng.getrandbits(32), rng.random() < 0.5) for s in range(cache_rows)}
        read = (0, False)
        busy_left = 0
        cycle = 0

        async def tick(walk=False, **inputs):
            nonlocal read, busy_left, cycle
            for name, value in inputs.items():
                ctx.set(getattr(dut, name), value)
            ctx.set(dut.tag.as_value(), pack(TAG, row=read[0], valid=read[1]))
            ctx.set(dut.writeback_busy, busy_left > 0)
            if walk:        # the walk's write-backs are counted as they are requested
                ctx.set(dut.written, ctx.get(dut.o_writeback.valid))
            (_, _, slot, invalidate, wb_valid, wb_p, walking, cleared, d_valid, d_ready,
             d_p) = await ctx.tick().sample(
                dut.slot, dut.invalidate, dut.o_writeback.valid, dut.o_writeback.payload.as_value(),
                dut.walking, dut.cleared, dut.o_done.valid, dut.o_done.ready,
                dut.o_done.payload.as_value())
            rule.observe(cycle, d_valid, d_ready, d_p)
            read = tags[slot]                   # read before this edge's write
            if invalidate:
                tags[slot] = (tags[slot][0], False)
            busy_left = max(busy_left - 1, 0)
            if wb_valid:
                assert busy_left == 0
                busy_left = rng.randint(1, 6)
            cycle += 1
            return slot, invalidate, wb_valid, wb_p, walking, cleared, d_valid and d_ready, d_p

        for k in range(cache_rows):             # the clear after reset
            slot, invalidate, _, _, walking, cleared, _, _ = await tick()
            assert (slot, invalidate, walking, cleared) == (k, 1, 1, k == cache_rows - 1)
        assert not any(valid for _, valid in tags.values())

        for _ in range(12):
            marked, counted, written = set(), 0, 0
            for _ in range(rng.randint(0, 3 * cache_rows)):
                s = rng.randrange(cache_rows)
                if rng.random() < 0.8:          # a fill: the tag written valid, marked
                    tags[s] = (rng.getrandbits(32), True)
                    marked.add(s)
                    m_in = {"mark": 1, "mark_slot": s}
                else:                           # an eviction's write-back
                    tags[s] = (tags[s][0], False)
                    m_in = {"mark": 0}
                c, w = rng.random() < 0.5, rng.random() < 0.3
                counted, written = counted + c, written + w
                *_, walking, _, _, _ = await tick(**m_in, counted=c, written=w, start=0,
                                                  b_owed=rng.random() < 0.5)
                assert not walking
            want = [(s, tags[s][0]) for s in sorted(marked) if tags[s][1]]
            got, owed, finished = [], False, False
            await tick(mark=0, counted=0, written=0, start=1, b_owed=0)
            for _ in range(40 * cache_rows + 40):
                owed = rng.random() < 0.3
                ctx.set(dut.o_done.ready, rng.random() < 0.5)
                slot, invalidate, wb_valid, wb_p, walking, _, taken, d_p = await tick(
                    walk=True, start=0, b_owed=owed)
                if wb_valid:
                    request = (wb_p & (cache_rows - 1), wb_p >> (cache_rows - 1).bit_length())
                    assert invalidate and request[0] == slot
                    got.append(request)
                if taken:
                    done_records.append(unpack(DONE, d_p))
                    assert done_records[-1] == {"rows_written": written + len(want),
                                                "updates": counted}
                    finished = True
                    break
                assert walking
            assert finished, "the walk did not end"
            assert got == want
            assert not any(valid for s, (_, valid) in tags.items() if s in marked)
            ctx.set(dut.o_done.ready, 0)

    simulate(dut, bench)
    assert len(done_records) == 12


@pytest.mark.parametrize(("cache_rows", "message"), [
    (1, "cache_rows must be an integer from 2 to 256, not 1"),
    (3, "cache_rows must be a power of two, not 3"),
    (True, "cache_rows must be an integer from 2 to 256, not True"),
])
def test_rejects_bad_parameters(cache_rows, message):
    with pytest.raises(ValueError, match=message):
        CacheFlush(cache_rows=cache_rows)


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(CacheFlush(cache_rows=16), "cache_flush_c16", tmp_path)
