"""The completion's write path: single-line AXI writes with byte strobes, counted.

See :class:`LineWriter`.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst
from hw.config import LINE_BITS

__all__ = ["COUNT_BITS", "LineWriter", "line_write"]

#: Width of the write / B counters (modular; far more than the writes in flight).
COUNT_BITS = 16


def line_write(addr_width: int) -> data.StructLayout:
    """Payload of :attr:`LineWriter.i_write`."""
    return data.StructLayout({"addr": addr_width, "data": LINE_BITS,
                              "strb": LINE_BITS // 8})


class LineWriter(wiring.Component):
    """Writes each item of ``i_write`` with one single-beat AXI write and counts the
    writes and their B responses.

    **Flow, latency.** AW and W are registers loaded together when an item is taken;
    ``i_write.ready`` is high when both are empty or being emptied in this cycle, so
    one write per cycle while the port accepts. AXI ID 0 (Bs return in write order),
    ``awlen`` 0; ``awvalid`` and ``wvalid`` do not wait for ``ready``, each drops on
    its own handshake; ``bready`` is always high.

    **Counts.** ``w_count`` counts the items taken and ``b_count`` the B responses,
    both modulo ``2**COUNT_BITS``; a write is durable once ``b_count`` has passed its
    ``w_count``. ``resp_error`` pulses with a B other than OKAY.

    Parameters
    ----------
    addr_width, id_width : int

    Members
    -------
    i_write : ``In(stream.Signature(line_write(addr_width)))``
    w_count, b_count : ``Out(COUNT_BITS)``
    resp_error : ``Out(1)``
    pmem : ``Out(AXI4Signature(addr_width, 512, id_width))``
        Write-only (``arvalid`` = 0, ``rready`` = 1).
    """

    def __init__(self, *, addr_width: int, id_width: int):
        super().__init__({
            "i_write": In(stream.Signature(line_write(addr_width))),
            "w_count": Out(COUNT_BITS),
            "b_count": Out(COUNT_BITS),
            "resp_error": Out(1),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
        })

    def elaborate(self, platform):
        m = Module()
        axi, w = self.pmem, self.i_write
        load = w.valid & w.ready
        m.d.comb += [
            w.ready.eq((~axi.awvalid | axi.awready) & (~axi.wvalid | axi.wready)),
            axi.awsize.eq(6),
            axi.awburst.eq(AxiBurst.INCR),
            axi.wlast.eq(1),
            axi.bready.eq(1),
            axi.rready.eq(1),
            self.resp_error.eq(axi.bvalid & axi.bresp.any()),
        ]
        with m.If(axi.awready):
            m.d.sync += axi.awvalid.eq(0)
        with m.If(axi.wready):
            m.d.sync += axi.wvalid.eq(0)
        with m.If(load):
            m.d.sync += [axi.awvalid.eq(1), axi.wvalid.eq(1), axi.awaddr.eq(w.p.addr),
                         axi.wdata.eq(w.p.data), axi.wstrb.eq(w.p.strb),
                         self.w_count.eq(self.w_count + 1)]
        with m.If(axi.bvalid):
            m.d.sync += self.b_count.eq(self.b_count + 1)
        return m
