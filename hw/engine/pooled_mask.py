"""The completion's pooled-line mask: the padding bytes of a pooled vector zeroed.

See :class:`PooledMask`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.widths import at_least

from .pool_reduce import POOLED

__all__ = ["PooledMask"]

_LINE_BYTES = 64


class PooledMask(wiring.Component):
    """Passes pooled lines on with the bytes at or past ``dim`` elements zeroed: byte
    ``k`` of vector line ``j`` is kept iff ``64 * j + k < dim * element bytes`` (4, or
    2 with ``bf16``).

    **Flow.** ``o_line`` is ``i_line`` with the data masked, combinationally (valid,
    ready, ``line`` and ``last`` pass through). ``load`` (one cycle) takes ``dim`` and
    ``bf16`` for the lines that follow.

    Members
    -------
    i_line : ``In(stream.Signature(POOLED))``
    o_line : ``Out(stream.Signature(POOLED))``
    load : ``In(1)``; dim : ``In(13)``; bf16 : ``In(1)``
    """

    def __init__(self):
        super().__init__({
            "i_line": In(stream.Signature(POOLED)),
            "o_line": Out(stream.Signature(POOLED)),
            "load": In(1),
            "dim": In(13),
            "bf16": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i_line, self.o_line
        vec_bytes = Signal(15)          # dim * 2 or dim * 4
        m.d.comb += vec_bytes.eq(Mux(self.bf16, Cat(C(0, 1), self.dim, C(0, 1)),
                                     Cat(C(0, 2), self.dim)))
        full = Signal(8)                # whole lines of a vector
        part = Signal(6)                # bytes of its last, partial line
        with m.If(self.load):
            m.d.sync += [full.eq(vec_bytes[6:14]), part.eq(vec_bytes[:6])]
        line = i.p.line
        # at_least folds ``part > 63``, constant for 6 bits (Verilator's CMPCONST).
        keep = [(line < full) | ((line == full) & at_least(part, k + 1))
                for k in range(_LINE_BYTES)]
        m.d.comb += [
            o.valid.eq(i.valid),
            i.ready.eq(o.ready),
            o.p.line.eq(line),
            o.p.last.eq(i.p.last),
            o.p.data.eq(Cat(*[i.p.data[8 * k:8 * k + 8] & keep[k].replicate(8)
                              for k in range(_LINE_BYTES)])),
        ]
        return m
