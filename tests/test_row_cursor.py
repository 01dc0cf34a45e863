# amaranth: UnusedElaboratable=no
"""RowCursor (hw/engine/row_cursor.py) in the Amaranth simulator: random starts and
steps with random settings; every cycle ``addr``, ``line``, ``at_last`` and ``at_end``
must follow ``table_base + (row * lines_per_row + line) * 64`` (the settings used as they
are, the address wrapping at ``addr_width`` bits). Seeds are printed; ``SEED=<n>``
replays one."""

from __future__ import annotations

import random

import pytest

from hw.engine.row_cursor import RowCursor

from .amaranth_sim import simulate
from .conftest import assert_lints_clean


@pytest.mark.parametrize("addr_width", [12, 30, 64])
def test_walks_rows(addr_width, seed):
    rng = random.Random(seed)
    dut = RowCursor(addr_width=addr_width)

    async def bench(ctx):
        row = line = 0
        for _ in range(2000):
            base, lines = 64 * rng.getrandbits(addr_width - 6), rng.randint(1, 64)
            start, step = rng.random() < 0.1, rng.random() < 0.6
            new_row = rng.getrandbits(32)
            for name, value in (("table_base", base), ("lines_per_row", lines),
                                ("start", start), ("step", step), ("row", new_row)):
                ctx.set(getattr(dut, name), value)
            addr, got_line, at_last, at_end = (ctx.get(dut.addr), ctx.get(dut.line),
                                               ctx.get(dut.at_last), ctx.get(dut.at_end))
            want = (base + (row * lines + line) * 64) % (1 << addr_width)
            assert (addr, got_line, at_last, at_end) == (
                want, line, (line + 1) % 128 == lines, line == lines)
            await ctx.tick()
            if start:
                row, line = new_row, 0
            elif step:
                line = (line + 1) % 128

    simulate(dut, bench)


@pytest.mark.parametrize(("addr_width", "message"), [
    (11, "addr_width must be an integer from 12 to 64, not 11"),
    (65, "addr_width must be an integer from 12 to 64, not 65"),
])
def test_rejects_bad_parameters(addr_width, message):
    with pytest.raises(ValueError, match=message):
        RowCursor(addr_width=addr_width)


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(RowCursor(addr_width=48), "row_cursor_a48", tmp_path)
