# amaranth: UnusedElaboratable=no
"""DoneQueue (hw/engine/done_queue.py) in the Amaranth simulator against a Python model
of its docstring.

Entries with targets just ahead of, at and behind the counts (and past the counters'
wrap) are offered with random idle cycles while the B and host-answer counts advance
at random; every cycle ``i_entry.ready`` must be the queue's room, ``complete`` must
pulse exactly when the oldest entry's two targets are reached (never earlier than two
cycles after it was taken) and ``advance`` (driven at random) is high, with its
``status``, ``seq`` and ``kind``, ``reached`` whenever the targets are reached, and
``head`` must count. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

from hw.engine.done_queue import DONE_DEPTH, DoneQueue
from hw.engine.line_writer import COUNT_BITS

from .amaranth_sim import simulate

MOD = 1 << COUNT_BITS


def reached(count: int, target: int) -> bool:
    return (count - target) % MOD < MOD // 2


def test_in_order(seed):
    rng = random.Random(seed)
    dut = DoneQueue()
    done = []

    async def bench(ctx):
        queue: list[tuple[int, dict]] = []      # (cycle taken, entry)
        b = hb = rng.randrange(MOD)
        head = 0
        offered = None
        full_seen = 0
        for cycle in range(4000):
            if offered is None and rng.random() < 0.4:
                offered = {"target": (b + rng.randint(-2, 12)) % MOD,
                           "host_target": (hb + rng.randint(-2, 6)) % MOD,
                           "status": rng.getrandbits(8), "seq": rng.getrandbits(32),
                           "kind": rng.getrandbits(8)}
            ctx.set(dut.i_entry.valid, offered is not None)
            if offered is not None:
                ctx.set(dut.i_entry.payload, offered)
            ctx.set(dut.b_count, b)
            ctx.set(dut.hb_count, hb)
            advance = rng.random() < 0.7
            ctx.set(dut.advance, advance)
            (_, _, ready, complete, got_reached, status, seq, kind,
             head_out) = await ctx.tick().sample(
                dut.i_entry.ready, dut.complete, dut.reached, dut.status, dut.seq,
                dut.kind, dut.head)
            assert head_out == head
            room = len(queue) < DONE_DEPTH
            assert ready == room, f"cycle {cycle}: ready {ready}, {len(queue)} entries"
            full_seen += not room
            if queue and queue[0][0] <= cycle - 2:          # visible at the FIFO's head
                e = queue[0][1]
                want = reached(b, e["target"]) and reached(hb, e["host_target"])
            else:
                want = False
            assert got_reached == want, f"cycle {cycle}: reached"
            assert complete == (want and advance), f"cycle {cycle}"
            if complete:
                assert (status, seq, kind) == (e["status"], e["seq"], e["kind"])
                done.append(queue.pop(0))
                head += 1
            if offered is not None and ready:
                queue.append((cycle, offered))
                offered = None
            b = (b + (rng.random() < 0.3)) % MOD
            hb = (hb + (rng.random() < 0.2)) % MOD
        assert full_seen > 0, "the queue never filled"

    simulate(dut, bench)
    assert len(done) > 200
