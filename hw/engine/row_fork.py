"""The fork of the sequencers' rows to the gather and, for an UPDATE, the gradient feed.

See :class:`RowFork`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .row_gather import ROW, rows_layout

__all__ = ["RowFork"]


class RowFork(wiring.Component):
    """Passes every row of a LOOKUP to ``o_gather`` and every row of an UPDATE to
    ``o_grad`` (an UPDATE reads its rows itself, once per distinct row, after it has
    summed their gradients: :class:`~.coalesced_update.CoalescedUpdate`).

    **Flow.** ``o_grad`` is the output of a FIFO of ``grad_rows`` rows. The feed learns
    that an UPDATE's rows are over from ``finish``, a one-cycle pulse once, after
    ``i_finish`` (the UPDATE's status has passed, so its last row has too), the FIFO is
    empty.

    **Latency, throughput, backpressure.** ``o_gather`` is combinational from
    ``i_rows``; ``o_grad`` follows two cycles after a row enters the FIFO. One row per
    cycle while the chosen side is ready. ``o_gather.valid`` and the FIFO's write enable
    do not wait for ``ready``.

    Parameters
    ----------
    addr_width : int
        Of the rows' gather settings (:func:`~.row_gather.rows_layout`).
    grad_rows : int
        Depth of the gradient side's FIFO, at least 2.

    Members
    -------
    i_rows : ``In(stream.Signature(rows_layout(addr_width)))``
    o_gather : ``Out(stream.Signature(rows_layout(addr_width)))``
    o_grad : ``Out(stream.Signature(ROW))``
    i_finish : ``In(1)``
    finish : ``Out(1)``
    """

    def __init__(self, *, addr_width: int, grad_rows: int):
        if grad_rows < 2:
            raise ValueError(f"grad_rows must be at least 2, not {grad_rows}")
        self._addr_width = addr_width
        self._grad_rows = grad_rows
        super().__init__({
            "i_rows": In(stream.Signature(rows_layout(addr_width))),
            "o_gather": Out(stream.Signature(rows_layout(addr_width))),
            "o_grad": Out(stream.Signature(ROW)),
            "i_finish": In(1),
            "finish": Out(1),
        })

    addr_width = property(lambda self: self._addr_width)
    grad_rows = property(lambda self: self._grad_rows)

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=ROW.size, depth=self._grad_rows)
        wiring.connect(m, fifo.r_stream, wiring.flipped(self.o_grad))
        rows, gather = self.i_rows, self.o_gather
        update = rows.p.update
        m.d.comb += [
            gather.payload.eq(rows.payload),
            gather.valid.eq(rows.valid & ~update),
            fifo.w_data.eq(rows.p.row),
            fifo.w_en.eq(rows.valid & update),
            rows.ready.eq(Mux(update, fifo.w_rdy, gather.ready)),
        ]

        ending = Signal()               # the UPDATE's rows are over
        with m.If(self.i_finish):
            m.d.sync += ending.eq(1)
        with m.Elif(~fifo.level.any()):
            m.d.sync += ending.eq(0)
        m.d.comb += self.finish.eq(ending & ~fifo.level.any())
        return m
