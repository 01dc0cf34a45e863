"""Steers an AXI4 manager's reads to CXL.cache reads of host (GPU) memory.

See :class:`AxiToCache`.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..cxl.cache_agent import RD_REQ, RD_RSP, TAG_BITS
from ..cxl.messages import LINE_ADDR_BITS, LINE_BITS
from .axi import AXI4Signature, AxiResp

__all__ = ["AxiToCache"]

_LINE_SHIFT = 6


class AxiToCache(wiring.Component):
    """An AXI4 subordinate port whose reads go either on to an AXI4 manager port
    (``host`` low) or out as CXL.cache line reads (``host`` high); writes always go on.

    With ``host`` high, an INCR read burst of ``arlen + 1`` beats at byte address ``a``
    becomes ``arlen + 1`` read requests on ``o_rd``, of host lines ``base_line + a // 64``
    onwards, one per cycle; the request's ``tag`` carries the burst's ``arid`` (bits 1
    and up) and whether it is the burst's last line (bit 0). Each ``i_rd`` response
    becomes one R beat with that ``rid`` and ``rlast`` (SLVERR for a response with
    ``error``); AR and R of ``pmem`` are idle meanwhile. With ``host`` low every channel
    passes through.

    **Latency, throughput, backpressure.** A burst taken in cycle ``t`` puts its first
    line request on ``o_rd`` in cycle ``t + 1`` (a register), one line per cycle while
    ``o_rd`` is ready; the next burst is taken in the cycle the last line of the current
    one leaves, so back-to-back bursts stream at one line per cycle. R is combinational
    from ``i_rd`` (``ready`` is ``rready``). With ``host`` low every channel is a wire.

    **Limitations.** Host reads must be INCR bursts of whole 64-byte beats (``arsize``
    6); the responses come back in request order, so bursts of different IDs return in
    the order they were issued (allowed: AXI orders only bursts of one ID) and a
    manager must take its R beats in that order. ``host`` may change only while no read
    is outstanding. Writes are never steered.

    Parameters
    ----------
    addr_width : int
        Of both AXI4 ports (512-bit data), above 6.
    id_width : int
        Of both AXI4 ports, 1 to ``TAG_BITS - 3``: the tag's top two bits stay zero,
        room for the port number of a :class:`~hw.cxl.cache_read_mux.CacheReadMux` of up
        to 4 ports (the engine's has 4).

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
        if not 1 <= id_width <= TAG_BITS - 3:
            raise ValueError(f"id_width must be from 1 to {TAG_BITS - 3}, not {id_width}")
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
        idw = self._id_width
        wiring.connect(m, wiring.flipped(sub), wiring.flipped(self.pmem))
        # The burst being split: its next line, the lines left after it, its ID.
        line = Signal(LINE_ADDR_BITS)
        left = Signal(8)
        burst_id = Signal(idw)
        last = left == 0
        take = ~rd.valid | (rd.ready & last)
        with m.If(rd.valid & rd.ready):
            m.d.sync += [line.eq(line + 1), left.eq(left - 1)]
            with m.If(last):
                m.d.sync += rd.valid.eq(0)
        with m.If(self.host):
            m.d.comb += [
                self.pmem.arvalid.eq(0),
                self.pmem.rready.eq(0),
                sub.arready.eq(take),
                rd.p.address.eq(line),
                rd.p.tag.eq(Cat(last, burst_id)),
                sub.rvalid.eq(rsp.valid),
                sub.rdata.eq(rsp.p.data),
                sub.rid.eq(rsp.p.tag[1:1 + idw]),
                sub.rresp.eq(Mux(rsp.p.error, AxiResp.SLVERR, AxiResp.OKAY)),
                sub.rlast.eq(rsp.p.tag[0]),
                rsp.ready.eq(sub.rready),
            ]
            with m.If(sub.arvalid & take):
                m.d.sync += [rd.valid.eq(1),
                             line.eq(self.base_line + sub.araddr[_LINE_SHIFT:]),
                             left.eq(sub.arlen), burst_id.eq(sub.arid)]
        return m
