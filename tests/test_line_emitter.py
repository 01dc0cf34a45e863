# amaranth: UnusedElaboratable=no
"""LineEmitter (hw/engine/line_emitter.py) in the Amaranth simulator against a model of
its docstring.

Random rows' metadata (1 to 4 lines, some empty bags, some captured) is offered on
``i_meta`` with random idle cycles; the bench plays the reorder buffer: the rows'
lines arrive at its head at random (``head_present``), ``read`` loads ``data`` with the
line at the head, ``pop`` takes it. ``undo_room`` and ``o_lines.ready`` are random.
Checked: every line leaves ``o_lines`` once, in order, with its row's fields, its
number and its data (zero for an empty bag); ``o_capture`` offers exactly the captured
lines as they leave; a captured line is taken from the head only with ``undo_room``;
``pop`` only with ``head_present``; ``read`` is the output register's load;
``undo_stall`` and ``capture_pending`` say what the docstring says; a passive checker
holds ``o_lines`` to the stream rules. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.engine.gather_layouts import ROW_META, UNDO
from hw.engine.line_emitter import LineEmitter
from hw.engine.pool_reduce import CTRL, LINE

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule


def random_meta(rng: random.Random) -> dict:
    empty = int(rng.random() < 0.15)
    return {"row": rng.getrandbits(32), "row_k": rng.getrandbits(16),
            "last_row": rng.getrandbits(1), "weight": rng.getrandbits(32),
            "empty_bag": empty, "count": rng.getrandbits(16),
            "last_line": 0 if empty else rng.randrange(4),
            "batch_id": rng.getrandbits(32), "table_id": rng.getrandbits(16),
            "capture": int(rng.random() < 0.5), "pool": rng.getrandbits(CTRL.size),
            "update": rng.getrandbits(1), "row_addr": rng.getrandbits(48)}


def expected_line(meta: dict, j: int, data: int) -> dict:
    return {"data": 0 if meta["empty_bag"] else data, "line": j, "row_k": meta["row_k"],
            "last_row": meta["last_row"], "weight": meta["weight"],
            "empty_bag": meta["empty_bag"], "count": meta["count"], "ctrl": meta["pool"],
            "update": meta["update"]}


def expected_capture(meta: dict, j: int, data: int) -> dict:
    return {"batch_id": meta["batch_id"], "table_id": meta["table_id"], "row": meta["row"],
            "line": j, "data": data, "row_addr": meta["row_addr"],
            "n_lines": meta["last_line"] + 1}


@pytest.mark.parametrize("idle, bp, room_p", [(0.0, 0.0, 1.0), (0.3, 0.3, 0.6),
                                               (0.1, 0.5, 0.2)],
                         ids=["smooth", "rough", "undo_starved"])
def test_lines_in_order(idle, bp, room_p, seed):
    rng = random.Random(seed)
    dut = LineEmitter()
    metas = [random_meta(rng) for _ in range(150)]
    # The ROB's lines in allocation order: (row's metadata, line number, data).
    lines = [(meta, j, rng.getrandbits(512)) for meta in metas
             for j in range(meta["last_line"] + 1)]
    rule = StreamRule("o_lines")
    stats = {"out": 0, "captured": 0, "stalls": 0}

    async def bench(ctx):
        offered = 0             # metas offered so far (the one at index offered-1 held)
        holding = False
        head = 0                # lines popped
        arrived = 0             # lines present at the head side
        data = 0                # the ROB's read register
        out = 0                 # lines that left o_lines
        for cycle in range(6000):
            if not holding and offered < len(metas) and not rng.random() < idle:
                ctx.set(dut.i_meta.payload.as_value(), pack(ROW_META, metas[offered]))
                offered += 1
                holding = True
            ctx.set(dut.i_meta.valid, holding)
            if arrived < len(lines) and rng.random() < 0.6:
                arrived += 1
            ctx.set(dut.head_present, head < arrived)
            ctx.set(dut.data, data)
            room = rng.random() < room_p
            ctx.set(dut.undo_room, room)
            ctx.set(dut.o_lines.ready, not rng.random() < bp)
            meta = metas[offered - 1] if holding else None
            (_, _, read, pop, meta_ready, valid, ready, payload, cap_valid, cap_payload,
             pending, stall) = await ctx.tick().sample(
                dut.read, dut.pop, dut.i_meta.ready, dut.o_lines.valid, dut.o_lines.ready,
                dut.o_lines.payload.as_value(), dut.o_capture.valid,
                dut.o_capture.payload.as_value(), dut.capture_pending, dut.undo_stall)
            where = f"cycle {cycle}, seed {seed}"
            rule.observe(cycle, valid, ready, payload)
            assert read == (not valid or ready), f"read is not the load ({where})"
            captures_next = bool(meta and meta["capture"] and not meta["empty_bag"])
            assert stall == (captures_next and not room), f"undo_stall ({where})"
            in_reg = lines[out] if valid else None
            is_captured = bool(in_reg and in_reg[0]["capture"] and not in_reg[0]["empty_bag"])
            assert pending == is_captured, f"capture_pending ({where})"
            stats["stalls"] += stall
            if valid and ready:
                m, j, d = in_reg
                assert unpack(LINE, payload) == expected_line(m, j, d), f"o_lines ({where})"
                assert cap_valid == is_captured, f"o_capture.valid ({where})"
                if is_captured:
                    assert unpack(UNDO, cap_payload) == expected_capture(m, j, d), where
                    stats["captured"] += 1
                out += 1
            else:
                assert not cap_valid, f"o_capture without a line leaving ({where})"
            if pop:
                assert head < arrived, f"pop without head_present ({where})"
                m, j, _ = lines[head]
                assert meta is m, f"the head's line is not the held row's ({where})"
                if m["capture"] and not m["empty_bag"]:
                    assert room, f"a captured line loaded without undo_room ({where})"
                assert meta_ready == (j == m["last_line"]), f"i_meta.ready ({where})"
                head += 1
            else:
                assert not meta_ready, f"i_meta taken without a line ({where})"
            if read:
                data = lines[head - pop][2] if head - pop < len(lines) else rng.getrandbits(512)
            if holding and meta_ready:
                holding = False
            if out == len(lines):
                break
        stats["out"] = out

    simulate(dut, bench)
    assert not rule.errors, rule.errors[:5]
    assert stats["out"] == len(lines), stats
    assert stats["captured"] > 0
    if room_p < 1.0:
        assert stats["stalls"] > 0


def test_payload_layouts():
    """The metadata layout's fields are the ones the model fills."""
    assert {name for name, _ in ROW_META} == set(random_meta(random.Random(0)))
    assert pack(ROW_META, random_meta(random.Random(1)))


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(LineEmitter(), "line_emitter", tmp_path)
