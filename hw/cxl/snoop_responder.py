"""Answers every H2D Req (snoop) of a CXL.cache agent that keeps no host line.

See :class:`SnoopResponder`; it is built into :class:`hw.cxl.cache_agent.CacheAgent`.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .messages import D2HRsp, D2HRspOpcode, H2DReq, H2DReqOpcode

__all__ = ["SnoopResponder"]


class SnoopResponder(wiring.Component):
    """Every H2D Req, whatever its opcode, is answered by a D2H Rsp RspIHitI with the
    snoop's UQID (the device holds no host line: CXL 2.0 §3.2.3.2).

    One snoop per cycle: ``i_snoop.ready`` is ``~o_rsp.valid | o_rsp.ready``, and a snoop
    taken in cycle *t* is answered in cycle *t* + 1 from the ``o_rsp`` register, which
    obeys the stream rules. ``o_reserved`` pulses (combinationally, in the handshake
    cycle) for a snoop with a reserved opcode (not SnpData, SnpInv or SnpCur); it is
    answered all the same.

    Members
    -------
    i_snoop : ``In(stream.Signature(H2DReq))``
    o_rsp : ``Out(stream.Signature(D2HRsp))``
        Opcode RspIHitI, the snoop's UQID, every other field zero.
    o_reserved : ``Out(1)``
    o_busy : ``Out(1)``
        An answer waits in ``o_rsp``.
    """

    def __init__(self):
        super().__init__({
            "i_snoop": In(stream.Signature(H2DReq)),
            "o_rsp": Out(stream.Signature(D2HRsp)),
            "o_reserved": Out(1),
            "o_busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        snp, rsp = self.i_snoop, self.o_rsp
        known = ((snp.p.opcode == H2DReqOpcode.SnpData.value) |
                 (snp.p.opcode == H2DReqOpcode.SnpInv.value) |
                 (snp.p.opcode == H2DReqOpcode.SnpCur.value))
        take = snp.valid & snp.ready
        m.d.comb += [
            snp.ready.eq(~rsp.valid | rsp.ready),
            self.o_reserved.eq(take & ~known),
            self.o_busy.eq(rsp.valid),
        ]
        with m.If(snp.ready):
            m.d.sync += rsp.valid.eq(snp.valid)
        with m.If(take):
            m.d.sync += [rsp.p.opcode.eq(D2HRspOpcode.RspIHitI.value),
                         rsp.p.uqid.eq(snp.p.uqid)]
        return m
