# amaranth: UnusedElaboratable=no
"""``hw.widths.onehot``: the ``n``-bit one-hot decode of an index, all zero for an
index of ``n`` or more, checked for every index value of its width, on both sides of
the size where the decode switches to two levels (64 outputs)."""

from __future__ import annotations

import pytest
from amaranth.hdl import Module, Signal

from hw.widths import onehot

from .amaranth_sim import simulate


@pytest.mark.parametrize("n,width", [(5, 3), (64, 6), (64, 7), (65, 7), (200, 9),
                                     (2048, 11), (4096, 13), (200, 6)])
def test_onehot_decodes_every_index(n, width):
    m = Module()
    index = Signal(width)
    out = onehot(m, index, n, "oh")

    async def bench(ctx):
        for v in range(1 << width):
            ctx.set(index, v)
            got = ctx.get(out)
            assert got == (1 << v if v < n else 0), (n, width, v, hex(got))

    simulate(m, bench)
