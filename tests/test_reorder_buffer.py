# amaranth: UnusedElaboratable=no
"""ReorderBuffer (hw/engine/reorder_buffer.py) in the Amaranth simulator against a model
of its docstring.

The bench plays the three neighbours: an allocator (bursts of 1 to 8 lines and empty
bags at the tail, within the ring's room, one burst per ID, IDs round-robin, random
idle), a PMEM answering the outstanding bursts' beats in random order (interleaved
between IDs, random gaps, sometimes an error response), and an emitter that reads and
pops the head at random. Checked every cycle against the model: ``head``,
``head_present`` (a beat taken in cycle ``t`` present from ``t + 2``, an empty bag's
line from the cycle after its allocation), ``data`` after a read is the head line's
data, ``o_burst_done`` names a burst's ID in the cycle after its last beat,
``resp_error`` is sticky from the cycle after the first bad beat. Seeds are printed;
``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.engine.reorder_buffer import ReorderBuffer

from .amaranth_sim import simulate
from .conftest import assert_lints_clean


@pytest.mark.parametrize("lines, ids", [(16, 2), (64, 8), (16, 16)])
@pytest.mark.parametrize("rough", [False, True], ids=["smooth", "rough"])
def test_lines_leave_in_allocation_order(lines, ids, rough, seed):
    rng = random.Random(seed)
    dut = ReorderBuffer(lines=lines, ids=ids)
    stats = {"popped": 0, "interleaved": 0}
    bad_p = 0.01 if rough else 0.0

    async def bench(ctx):
        tail = head = 0
        data = {}                   # absolute line -> data (None for an empty bag)
        present_at = {}             # absolute line -> first cycle it is present
        bursts = {}                 # ID -> lines still to come (absolute indices)
        allocated_at = {}           # ID -> cycle of its allocation
        busy = set()                # IDs not yet reported done
        next_id = 0
        done_due = {}               # cycle -> ID due on o_burst_done
        error_from = None
        last_beat_id = None
        popped_line = None          # the line whose data must be in `data` now
        for cycle in range(3000):
            # allocator
            alloc = None
            if not rng.random() < (0.4 if rough else 0.1):
                if rng.random() < 0.15:
                    alloc = (1, True)
                elif next_id not in busy:
                    alloc = (rng.randint(1, 8), False)
            if alloc and tail - head + alloc[0] > lines:
                alloc = None
            ctx.set(dut.i_alloc.valid, alloc is not None)
            if alloc:
                k, empty = alloc
                ctx.set(dut.i_alloc.payload, {"line": tail % lines, "id": next_id,
                                              "empty": empty})
                if empty:
                    data[tail] = None
                    present_at[tail] = cycle + 1
                else:
                    bursts[next_id] = list(range(tail, tail + k))
                    allocated_at[next_id] = cycle
                    busy.add(next_id)
                    for a in range(tail, tail + k):
                        data[a] = rng.getrandbits(512)
                    next_id = (next_id + 1) % ids
                tail += k
            # PMEM
            ready_ids = [i for i, left in bursts.items() if left and allocated_at[i] < cycle]
            beat = None
            if ready_ids and not rng.random() < (0.4 if rough else 0.1):
                beat = rng.choice(ready_ids)
                line = bursts[beat].pop(0)
                last = not bursts[beat]
                resp = rng.choice([2, 3]) if rng.random() < bad_p else 0
                ctx.set(dut.i_beat.payload, {"id": beat, "data": data[line], "resp": resp,
                                             "last": last})
                present_at[line] = cycle + 2
                if last:
                    del bursts[beat]
                    done_due[cycle + 1] = beat
                if resp and error_from is None:
                    error_from = cycle + 1
                stats["interleaved"] += last_beat_id is not None and beat != last_beat_id
                last_beat_id = beat
            ctx.set(dut.i_beat.valid, beat is not None)
            # emitter
            where = f"cycle {cycle}, seed {seed}"
            present = present_at.get(head, cycle + 1) <= cycle
            assert ctx.get(dut.head_present) == present, f"head_present ({where})"
            assert ctx.get(dut.head) == head % (2 * lines), f"head ({where})"
            read = rng.random() < 0.8
            pop = read and present and rng.random() < 0.7
            ctx.set(dut.read, read)
            ctx.set(dut.pop, pop)
            if popped_line is not None and data[popped_line] is not None:
                assert ctx.get(dut.data) == data[popped_line], f"data ({where})"
            assert ctx.get(dut.i_alloc.ready) and ctx.get(dut.i_beat.ready), where
            _, _, done_valid, done_id, error = await ctx.tick().sample(
                dut.o_burst_done.valid, dut.o_burst_done.payload, dut.resp_error)
            due = done_due.pop(cycle, None)
            assert done_valid == (due is not None), f"o_burst_done.valid ({where})"
            if due is not None:
                assert done_id == due, f"o_burst_done ({where})"
                busy.discard(due)
            assert error == (error_from is not None and cycle >= error_from), \
                f"resp_error ({where})"
            popped_line = head if pop else None
            if pop:
                del present_at[head]
                head += 1
                stats["popped"] += 1

    simulate(dut, bench)
    assert stats["popped"] > 500 and stats["interleaved"] > 50, stats


@pytest.mark.parametrize("kwargs, message", [
    ({"lines": 8, "ids": 2}, "lines must be a power of two from 16 to 4096, not 8"),
    ({"lines": 48, "ids": 2}, "lines must be a power of two from 16 to 4096, not 48"),
    ({"lines": 8192, "ids": 2}, "lines must be a power of two from 16 to 4096, not 8192"),
    ({"lines": 16, "ids": 1}, r"ids must be a power of two from 2 to lines \(16\), not 1"),
    ({"lines": 16, "ids": 32}, r"ids must be a power of two from 2 to lines \(16\), not 32"),
    ({"lines": 16, "ids": 6}, r"ids must be a power of two from 2 to lines \(16\), not 6"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        ReorderBuffer(**kwargs)


def test_parameters_are_read_only_properties():
    rob = ReorderBuffer(lines=64, ids=8)
    assert (rob.lines, rob.ids) == (64, 8)
    with pytest.raises(AttributeError):
        rob.lines = 32


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(ReorderBuffer(lines=64, ids=8), "reorder_buffer_l64_i8", tmp_path)
