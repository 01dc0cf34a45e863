"""Steers an AXI4 manager's reads to CXL.cache reads of host (GPU) memory.

See :class:`AxiToCache`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..cxl.cache_agent import RD_REQ, RD_RSP
from ..cxl.messages import LINE_ADDR_BITS, LINE_BITS
from .axi import AXI4Signature, AxiResp

__all__ = ["AxiToCache"]

_LINE_SHIFT = 6


class AxiToCache(wiring.Component):
    """An AXI4 subordinate port whose reads go either on to an AXI4 manager port
    (``host`` low) or out as CXL.cache line reads (``host`` high); writes always go on.

    With ``host`` high, a read of byte address ``a`` becomes a read request of host line
    ``base_line + a // 64`` on ``o_rd``, and each ``i_rd`` response becomes one R beat
    (``rlast`` high, ``rid`` zero, SLVERR for a response with ``error``); AR and R of
    ``pmem`` are idle meanwhile. With ``host`` low every channel passes through.

    **Latency, throughput, backpressure.** Purely combinational in both modes: a request
    or response passes in the cycle it is offered, ``ready`` of each side is the other
    side's ``ready``, one transfer per cycle.

    **Limitations.** For host reads the manager must issue single-beat reads of whole
    64-byte lines on one ID, so the responses, which come back in request order, need
    no ID. ``host`` may change only while no read is outstanding. Writes are never
    steered.

    Parameters
    ----------
    addr_width, id_width : int
        Of both AXI4 ports (512-bit data).

    Members
    -------
    sub : ``In(AXI4Signature(addr_width=addr_width, data_width=512, id_width=id_width))``
        The manager's port.
    pmem : ``Out(AXI4Signature(...))``
        The same port on towards PMEM.
    host : ``In(1)``
        Reads go to ``o_rd`` / ``i_rd``.
    base_line : ``In(LINE_ADDR_BITS)``
        Host line address that byte address 0 reads.
    o_rd, i_rd : ``Out(stream.Signature(RD_REQ))``, ``In(stream.Signature(RD_RSP))``
        The CXL.cache agent's read request and response streams.
    """

    def __init__(self, *, addr_width: int, id_width: int):
        if addr_width <= _LINE_SHIFT:
            raise ValueError(f"addr_width must be above {_LINE_SHIFT}, not {addr_width}")
        self._addr_width = addr_width
        self._id_width = id_width
        axi = AXI4Signature(addr_width=addr_width, data_width=LINE_BITS, id_width=id_width)
        super().__init__({
            "sub": In(axi),
            "pmem": Out(axi),
            "host": In(1),
            "base_line": In(LINE_ADDR_BITS),
            "o_rd": Out(stream.Signature(RD_REQ)),
            "i_rd": In(stream.Signature(RD_RSP)),
        })

    addr_width = property(lambda self: self._addr_width)
    id_width = property(lambda self: self._id_width)

    def elaborate(self, platform):
        m = Module()
        sub, rd, rsp = self.sub, self.o_rd, self.i_rd
        wiring.connect(m, wiring.flipped(sub), wiring.flipped(self.pmem))
        with m.If(self.host):
            m.d.comb += [
                self.pmem.arvalid.eq(0),
                self.pmem.rready.eq(0),
                rd.valid.eq(sub.arvalid),
                rd.p.address.eq(self.base_line + sub.araddr[_LINE_SHIFT:]),
                rd.p.tag.eq(0),
                sub.arready.eq(rd.ready),
                sub.rvalid.eq(rsp.valid),
                sub.rdata.eq(rsp.p.data),
                sub.rid.eq(0),
                sub.rresp.eq(Mux(rsp.p.error, AxiResp.SLVERR, AxiResp.OKAY)),
                sub.rlast.eq(1),
                rsp.ready.eq(sub.rready),
            ]
        return m
