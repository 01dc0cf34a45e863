# amaranth: UnusedElaboratable=no
"""RowFill (hw/engine/row_fill.py) in the Amaranth simulator, with a
:class:`~hw.engine.row_cursor.RowCursor` as in ScatterUpdate, reading a
:class:`tb.pmem.PmemModel`.

A random script of drops (line counts on ``i_drop``), fills from the read-ahead lines
and fills from PMEM (random slots, rows, settings), issued while the block is idle,
with the read-ahead lines offered in script order with random idle cycles; the update
pipeline takes the write port at random (``write_busy``), AR is backpressured and R
delayed at random (stream rule checked on AR). The cache writes must be exactly the
fills' lines in order (each fill's lines to its slot, line by line, never while the
port is busy), the lines to drop must be taken and discarded, ``filled`` must pulse
with each fill's last write, and every read-ahead line must be used. Seeds are
printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Elaboratable, Module, Signal

from hw.engine.row_cursor import RowCursor
from hw.engine.row_fill import RowFill
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import ROUGH, SMOOTH, AxiPmemPort
from .conftest import assert_lints_clean

AW = 20


class Harness(Elaboratable):
    """The fill with its cursor, the settings set by the bench."""

    def __init__(self, **params):
        self.dut = RowFill(addr_width=AW, **params)
        self.table_base = Signal(AW)
        self.lines_per_row = Signal(7)

    def elaborate(self, platform):
        m = Module()
        dut = self.dut
        m.submodules.dut = dut
        m.submodules.cursor = cursor = RowCursor(addr_width=AW)
        m.d.comb += [
            cursor.start.eq(dut.i_row.valid & dut.i_row.ready),
            cursor.row.eq(dut.i_row.p.row),
            cursor.step.eq(dut.step),
            cursor.table_base.eq(self.table_base),
            cursor.lines_per_row.eq(self.lines_per_row),
            dut.at_end.eq(cursor.at_end),
            dut.addr.eq(cursor.addr),
        ]
        return m


@pytest.mark.parametrize(("cache_rows", "max_lines"), [(2, 1), (4, 3), (8, 16)])
@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
def test_fills_and_drops(cache_rows, max_lines, traffic, seed):
    rng = random.Random(seed)
    top = Harness(id_width=2, cache_rows=cache_rows, max_lines_per_row=max_lines)
    dut = top.dut
    model = PmemModel(size=1 << AW, rng=random.Random(seed),
                      timing=PmemTiming(read_latency=rng.randint(1, 30), jitter=8))
    model.write(0, rng.getrandbits(8 * (1 << AW)).to_bytes(1 << AW, "little"))
    line_bits = (max_lines - 1).bit_length()
    want: list[tuple[int, int]] = []            # (cache line, data) in write order
    got: list[tuple[int, int]] = []

    async def bench(ctx):
        queue: list[int] = []                   # read-ahead lines still to offer
        offered_line = None
        fills = filled = 0
        in_fill = False
        cycle = 0
        while fills < 30 or in_fill or queue or offered_line is not None:
            assert cycle < 30000, "timeout"
            ctx.set(dut.i_drop.valid, 0)
            ctx.set(dut.i_row.valid, 0)
            if not in_fill and fills < 30 and rng.random() < 0.3:
                lines = rng.randint(1, max_lines)
                kind = rng.choice(["drop", "lines", "pmem"])
                new = [rng.getrandbits(512) for _ in range(lines)]
                if kind == "drop":
                    ctx.set(dut.i_drop.valid, 1)
                    ctx.set(dut.i_drop.payload, lines)
                    queue += new
                else:
                    slot, row = rng.randrange(cache_rows), rng.getrandbits(8)
                    base = 64 * rng.getrandbits(10)
                    ctx.set(top.table_base, base)
                    ctx.set(top.lines_per_row, lines)
                    ctx.set(dut.i_row.valid, 1)
                    ctx.set(dut.i_row.payload, {"slot": slot, "row": row, "lines": lines,
                                                "from_lines": kind == "lines"})
                    if kind == "lines":
                        queue += new
                    else:
                        new = [int.from_bytes(model.read(base + (row * lines + k) * 64, 64),
                                              "little") for k in range(lines)]
                    want.extend(((slot << line_bits) + k, new[k]) for k in range(lines))
                    in_fill, fills = True, fills + 1
            if offered_line is None and queue and rng.random() < 0.7:
                offered_line = queue.pop(0)
                ctx.set(dut.i_lines.payload, {"data": offered_line})
            ctx.set(dut.i_lines.valid, offered_line is not None)
            ctx.set(dut.write_busy, rng.random() < 0.3)
            (drop_ready, row_ready, lines_ready, busy, write_en, addr, data,
             done) = await axi.tick(
                ctx, dut.i_drop.ready, dut.i_row.ready, dut.i_lines.ready, dut.write_busy,
                dut.write_en, dut.write_addr, dut.write_data, dut.filled)
            assert drop_ready
            if ctx.get(dut.i_row.valid):
                assert row_ready, "a request while a fill is in progress"
            if write_en:
                assert not busy, "cache written while the pipeline writes"
                got.append((addr, data))
            if done:
                filled += 1
                assert got == want, f"cycle {cycle}: fill {filled} wrote other lines"
                in_fill = False
            if offered_line is not None and lines_ready:
                offered_line = None
            cycle += 1
        assert filled == fills and not ctx.get(dut.drop_pending)
        assert not axi.errors, axi.errors[:5]

    axi = AxiPmemPort(dut.pmem, model, rng, traffic)
    simulate(top, bench)
    assert got == want


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"addr_width": 65}, "addr_width must be an integer from 12 to 64, not 65"),
    ({"id_width": 0}, "id_width must be an integer from 1 to 16, not 0"),
    ({"cache_rows": 512}, "cache_rows must be an integer from 2 to 256, not 512"),
    ({"max_lines_per_row": 65}, "max_lines_per_row must be an integer from 1 to 64, not 65"),
])
def test_rejects_bad_parameters(kwargs, message):
    args = {"addr_width": AW, "id_width": 2, "cache_rows": 4, "max_lines_per_row": 4} | kwargs
    with pytest.raises(ValueError, match=message):
        RowFill(**args)


def test_verilog_lints_clean(tmp_path):
    dut = RowFill(addr_width=48, id_width=4, cache_rows=8, max_lines_per_row=5)
    assert_lints_clean(dut, "row_fill_a48_c8_l5", tmp_path)
