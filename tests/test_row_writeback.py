# amaranth: UnusedElaboratable=no
"""RowWriteback (hw/engine/row_writeback.py) in the Amaranth simulator, with a
:class:`~hw.engine.row_cursor.RowCursor` and a line memory as in ScatterUpdate, writing
to a :class:`tb.pmem.PmemModel`.

Write-back requests of random slots and rows, under random settings, come with random
idle cycles while the update pipeline takes the read port at random (``read_busy``);
AW / W are backpressured and Bs delayed at random (stream rule checked on AW and W).
Every line of every request must land at ``table_base + (row * lines_per_row + line) *
64`` in request and line order, the port must be read only when free, ``busy`` must
cover each request, and ``b_owed`` / ``b_owed_full`` must follow the AWs taken and Bs
received. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib.memory import Memory

from hw.engine.row_cursor import RowCursor
from hw.engine.row_writeback import RowWriteback
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import ROUGH, SMOOTH, AxiPmemPort
from .conftest import assert_lints_clean

AW = 20


class Harness(Elaboratable):
    """The write-back with its cursor and a line memory of random content."""

    def __init__(self, rng: random.Random, **params):
        self.dut = RowWriteback(addr_width=AW, **params)
        self.line_bits = (params["max_lines_per_row"] - 1).bit_length()
        self.init = [rng.getrandbits(512) for _ in range(params["cache_rows"] << self.line_bits)]
        self.table_base = Signal(AW)
        self.lines_per_row = Signal(7)

    def elaborate(self, platform):
        m = Module()
        dut = self.dut
        m.submodules.dut = dut
        m.submodules.cursor = cursor = RowCursor(addr_width=AW)
        m.submodules.lines = lines = Memory(shape=512, depth=len(self.init), init=self.init)
        read = lines.read_port(transparent_for=())
        m.d.comb += [
            read.addr.eq(dut.read_addr),
            dut.read_data.eq(read.data),
            cursor.start.eq(dut.i_row.valid & dut.i_row.ready),
            cursor.row.eq(dut.i_row.p.row),
            cursor.step.eq(dut.step),
            cursor.table_base.eq(self.table_base),
            cursor.lines_per_row.eq(self.lines_per_row),
            dut.line.eq(cursor.line),
            dut.at_last.eq(cursor.at_last),
            dut.addr.eq(cursor.addr),
        ]
        return m


@pytest.mark.parametrize(("cache_rows", "max_lines"), [(2, 1), (4, 3), (8, 16)])
@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
def test_rows_written_back(cache_rows, max_lines, traffic, seed):
    rng = random.Random(seed)
    top = Harness(rng, id_width=2, cache_rows=cache_rows, max_lines_per_row=max_lines)
    dut = top.dut
    model = PmemModel(size=1 << AW, rng=random.Random(seed),
                      timing=PmemTiming(write_latency=rng.randint(1, 30), jitter=8))
    axi = AxiPmemPort(dut.pmem, model, rng, traffic)
    owed_max = cache_rows * max_lines
    want = []                                   # (address, line data) in write order

    async def bench(ctx):
        owed = 0
        offered = None
        requests = 0
        busy_from = None
        cycle = 0
        while requests < 25 or offered is not None or busy_from is not None or owed:
            assert cycle < 20000, "timeout"
            if offered is None and busy_from is None and requests < 25 and rng.random() < 0.3:
                offered = {"slot": rng.randrange(cache_rows), "row": rng.getrandbits(10)}
                base, lines = 64 * rng.getrandbits(12), rng.randint(1, max_lines)
                ctx.set(top.table_base, base)
                ctx.set(top.lines_per_row, lines)
                for k in range(lines):
                    want.append(((base + (offered["row"] * lines + k) * 64) % (1 << AW),
                                 top.init[(offered["slot"] << top.line_bits) + k]))
            ctx.set(dut.i_row.valid, offered is not None)
            if offered is not None:
                ctx.set(dut.i_row.payload, offered)
            ctx.set(dut.read_busy, rng.random() < 0.4)
            (ready, busy, read_en, read_busy, b_owed, b_owed_full, aw_taken,
             b_taken) = await axi.tick(
                ctx, dut.i_row.ready, dut.busy, dut.read_en, dut.read_busy, dut.b_owed,
                dut.b_owed_full, dut.pmem.awvalid & dut.pmem.awready,
                dut.pmem.bvalid & dut.pmem.bready)
            assert (b_owed, b_owed_full) == (owed > 0, owed >= owed_max), f"cycle {cycle}"
            owed += aw_taken - b_taken
            assert not (read_en and read_busy), "read port taken while busy"
            assert ready == (not busy)
            if offered is not None and ready:
                offered = None
                requests += 1
                busy_from = cycle
            elif busy_from is not None and not busy:
                busy_from = None
            cycle += 1
        assert not axi.errors, axi.errors[:5]
        assert axi.aws == [a for a, _ in want]
        final = {}
        for addr, line in want:
            final[addr] = line
        for addr, line in final.items():
            assert int.from_bytes(model.read(addr, 64), "little") == line, hex(addr)

    simulate(top, bench)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"addr_width": 11}, "addr_width must be an integer from 12 to 64, not 11"),
    ({"id_width": 17}, "id_width must be an integer from 1 to 16, not 17"),
    ({"cache_rows": 6}, "cache_rows must be a power of two, not 6"),
    ({"max_lines_per_row": 0}, "max_lines_per_row must be an integer from 1 to 64, not 0"),
])
def test_rejects_bad_parameters(kwargs, message):
    args = {"addr_width": AW, "id_width": 2, "cache_rows": 4, "max_lines_per_row": 4} | kwargs
    with pytest.raises(ValueError, match=message):
        RowWriteback(**args)


def test_verilog_lints_clean(tmp_path):
    dut = RowWriteback(addr_width=48, id_width=4, cache_rows=8, max_lines_per_row=5)
    assert_lints_clean(dut, "row_writeback_a48_c8_l5", tmp_path)
