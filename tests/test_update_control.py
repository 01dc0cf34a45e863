# amaranth: UnusedElaboratable=no
"""UpdateControl (hw/engine/update_control.py) in the Amaranth simulator, its neighbours
(update pipeline, write-back, fill) modelled by the bench, against a direct-mapped cache
model of its docstring.

Descriptors of random rows over a few slots (so rows hit, fill empty slots and evict
each other, and evicted rows come back), random settings, some ``nop`` items and
``nop`` + ``last`` descriptors, are offered with random idle cycles; the pipeline takes
ops at random (random ``op_slot_busy`` / ``pipeline_busy``), write-backs and fills take
random times, ``b_owed`` / ``b_owed_full`` / ``drop_pending`` are random. Per descriptor
the control must issue exactly the model's requests in order: per item, on a miss the
write-back of the slot's row (if any) then the fill (from the read-ahead lines for an
index's first item whose row was not written back in the descriptor) then the op; the
drops of every index's read-ahead lines not filled from; at the end the write-back of
every cached row, lowest slot first; then ``o_done`` (random backpressure, stream rule
checked) with the write-backs and counted indices. No request may be made while its
consumer is busy, no miss acted on while ``op_slot_busy`` (or a B, as the docstring
says) forbids it. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.engine.update_control import UpdateControl
from hw.engine.update_layouts import DONE, ITEM, ctrl_layout

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule

AW = 20


def descriptor(rng: random.Random, cache_rows: int, max_lines: int):
    """(settings, items) of one descriptor."""
    bf16 = rng.random() < 0.5
    lines = rng.randint(1, max_lines)
    ctrl = {"table_base": 64 * rng.getrandbits(10), "lines_per_row": lines, "bf16": bf16,
            "weighted": rng.random() < 0.5, "dim": rng.randint(1, 4096)}
    # 256 and 512 share a slot and their low byte: a false evicted-row mark.
    rows = [*rng.sample(range(4 * cache_rows), 3 * cache_rows // 2), 256, 512]
    items = []
    if rng.random() < 0.1:
        return ctrl, [{"nop": 1, "last": 1}]
    for _ in range(rng.randint(1, 12)):
        row = rng.choice(rows)
        for line in range(2 * lines if bf16 else lines):
            items.append({"row": row, "line": line, "weight": rng.getrandbits(32),
                          "grad": rng.getrandbits(512)})
        if rng.random() < 0.1:
            items.append({"row": rng.getrandbits(32), "nop": 1})
    if rng.random() < 0.3:
        items.append({"nop": 1, "last": 1})
    else:
        items[-1]["last"] = 1
    return ctrl, items


def expected(ctrl: dict, items: list[dict], cache_rows: int) -> tuple[list, dict]:
    """The requests of one descriptor in order, and its completion."""
    tags: dict[int, int] = {}
    evicted: set[int] = set()
    events, written, counted = [], 0, 0
    lines = ctrl["lines_per_row"]
    for it in items:
        if it.get("nop"):
            continue
        row, slot = it["row"], it["row"] % cache_rows
        first = it["line"] == 0
        counted += first
        if tags.get(slot) != row:
            from_lines = first and row & 0xFF not in evicted
            if slot in tags:
                events.append(("writeback", slot, tags[slot]))
                evicted.add(tags[slot] & 0xFF)
                written += 1
            if first and not from_lines:
                events.append(("drop", lines))
            events.append(("fill", slot, row, lines, from_lines))
            tags[slot] = row
        elif first:
            events.append(("drop", lines))
        events.append(("op", slot, it["line"], ctrl["bf16"], ctrl["weighted"], ctrl["dim"],
                       it["weight"], it["grad"]))
    for slot in sorted(tags):
        events.append(("writeback", slot, tags[slot]))
        written += 1
    return events, {"rows_written": written, "updates": counted}


@pytest.mark.parametrize(("cache_rows", "max_lines"), [(2, 1), (4, 3), (8, 4)])
def test_requests_in_order(cache_rows, max_lines, seed):
    rng = random.Random(seed)
    dut = UpdateControl(addr_width=AW, cache_rows=cache_rows, max_lines_per_row=max_lines)
    ctrl_l = ctrl_layout(AW)
    descs = [descriptor(rng, cache_rows, max_lines) for _ in range(10)]
    rule = StreamRule("o_done", strict=True)
    dones, got_events = [], []

    async def bench(ctx):
        queue = [(c, it) for c, items in descs for it in items]
        cur = None
        wb_left = fill_left = 0             # cycles until the write-back / fill is over
        after_writeback = False             # a fill now is the one after an eviction
        cycle = 0
        while len(dones) < len(descs):
            assert cycle < 40000, f"timeout: {len(dones)} done"
            if cur is None and queue and rng.random() < 0.7:
                cur = queue.pop(0)
                ctx.set(dut.i_ctrl.as_value(), pack(ctrl_l, cur[0]))
                ctx.set(dut.i_items.payload.as_value(), pack(ITEM, cur[1]))
            ctx.set(dut.i_items.valid, cur is not None)
            slot_busy, pipe_busy = rng.random() < 0.3, rng.random() < 0.3
            owed = rng.random() < 0.3
            for name, value in (("op_slot_busy", slot_busy), ("pipeline_busy", pipe_busy),
                                ("b_owed", owed), ("b_owed_full", owed and rng.random() < 0.3),
                                ("drop_pending", rng.random() < 0.3),
                                ("writeback_busy", wb_left > 0), ("filled", fill_left == 1),
                                ("o_op.ready", rng.random() < 0.7),
                                ("o_writeback.ready", wb_left == 0),
                                ("o_fill.ready", fill_left == 0),
                                ("o_drop.ready", 1), ("o_done.ready", rng.random() < 0.5)):
                obj = dut
                for part in name.split("."):
                    obj = getattr(obj, part)
                ctx.set(obj, value)
            sampled = await ctx.tick().sample(
                dut.i_items.ready, dut.o_op.valid, dut.o_op.ready, dut.o_op.payload.as_value(),
                dut.o_drop.valid, dut.o_drop.payload, dut.o_writeback.valid,
                dut.o_writeback.payload.as_value(), dut.o_fill.valid,
                dut.o_fill.payload.as_value(), dut.o_done.valid, dut.o_done.ready,
                dut.o_done.payload.as_value(), dut.b_owed, dut.b_owed_full,
                dut.op_slot_busy)
            (i_ready, op_valid, op_ready, op_p, drop_valid, drop_p, wb_valid, wb_p,
             fill_valid, fill_p, d_valid, d_ready, d_p, owed, owed_full,
             slot_busy_seen) = sampled[2:]
            wb_left = max(wb_left - 1, 0)
            fill_left = max(fill_left - 1, 0)
            if wb_valid:
                assert wb_left == 0, "write-back requested while busy"
                slot_bits = (cache_rows - 1).bit_length()
                got_events.append(("writeback", wb_p & (cache_rows - 1), wb_p >> slot_bits))
                wb_left = rng.randint(1, 8)
            decided = not after_writeback
            after_writeback = (after_writeback or wb_valid) and not fill_valid
            if drop_valid:
                got_events.append(("drop", drop_p))
            if fill_valid:
                assert fill_left == 0, "fill requested while busy"
                f = unpack(dut.o_fill.payload.shape(), fill_p)
                if decided:                 # the miss was decided in this cycle
                    assert not (owed_full if f["from_lines"] else owed), "B not awaited"
                    assert not slot_busy_seen, "miss while an op of its slot is in flight"
                got_events.append(("fill", f["slot"], f["row"], f["lines"],
                                   bool(f["from_lines"])))
                fill_left = rng.randint(2, 10)
            if op_valid and op_ready:
                o = unpack(dut.o_op.payload.shape(), op_p)
                got_events.append(("op", o["slot"], o["line"], o["bf16"], o["weighted"],
                                   o["dim"], o["weight"], o["grad"]))
                after_writeback = False     # the flush's write-backs have no fill
            rule.observe(cycle, d_valid, d_ready, d_p)
            if d_valid and d_ready:
                dones.append(unpack(DONE, d_p))
            if cur is not None and i_ready:
                cur = None
            cycle += 1

    simulate(dut, bench)
    pos = 0
    for n, ((ctrl, items), done) in enumerate(zip(descs, dones, strict=True)):
        want, want_done = expected(ctrl, items, cache_rows)
        got = got_events[pos:pos + len(want)]
        want = [(e[0], *(int(x) for x in e[1:])) for e in want]
        got = [(e[0], *(int(x) for x in e[1:])) for e in got]
        assert got == want, f"descriptor {n}"
        assert done == want_done, f"descriptor {n}"
        pos += len(want)
    assert pos == len(got_events)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"addr_width": 8}, "addr_width must be an integer from 12 to 64, not 8"),
    ({"cache_rows": 257}, "cache_rows must be an integer from 2 to 256, not 257"),
    ({"max_lines_per_row": "4"}, "max_lines_per_row must be an integer from 1 to 64, not '4'"),
])
def test_rejects_bad_parameters(kwargs, message):
    args = {"addr_width": AW, "cache_rows": 4, "max_lines_per_row": 4} | kwargs
    with pytest.raises(ValueError, match=message):
        UpdateControl(**args)


def test_verilog_lints_clean(tmp_path):
    dut = UpdateControl(addr_width=48, cache_rows=8, max_lines_per_row=5)
    assert_lints_clean(dut, "update_control_a48_c8_l5", tmp_path)
