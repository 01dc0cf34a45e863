"""Round-robin merge of the CXL.cache agent's read and write requests onto D2H Req.

See :class:`D2HReqArbiter`; it is built into :class:`hw.cxl.cache_agent.CacheAgent`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .messages import D2HReq

__all__ = ["D2HReqArbiter"]


class D2HReqArbiter(wiring.Component):
    """Two D2H Req streams merged into one registered D2H Req stream, taking turns when
    both wait.

    When only one input is valid it is taken; when both are, the one not taken last
    time is (``i_rd`` first after reset). The message is copied whole into the
    ``o_req`` register.

    **Latency.** A request taken in cycle ``t`` is valid on ``o_req`` in cycle ``t + 1``.
    **Throughput.** One request per cycle. **Backpressure.** An input's ``ready`` is
    ``~o_req.valid | o_req.ready`` unless the other input is valid and has its turn (so
    it depends combinationally on ``o_req.ready`` and on the other input's ``valid``).
    ``o_req`` obeys the stream rules. **Reset** empties the register and gives ``i_rd``
    the turn.

    Members
    -------
    i_rd, i_wr : ``In(stream.Signature(D2HReq))``
        The requests to merge.
    o_req : ``Out(stream.Signature(D2HReq))``
        The merged requests.
    """

    def __init__(self):
        super().__init__({
            "i_rd": In(stream.Signature(D2HReq)),
            "i_wr": In(stream.Signature(D2HReq)),
            "o_req": Out(stream.Signature(D2HReq)),
        })

    def elaborate(self, platform):
        m = Module()
        rd, wr, req = self.i_rd, self.i_wr, self.o_req
        free = ~req.valid | req.ready
        wr_turn = Signal()              # the write input goes first when both wait
        m.d.comb += [
            rd.ready.eq(free & (~wr.valid | ~wr_turn)),
            wr.ready.eq(free & (~rd.valid | wr_turn)),
        ]
        with m.If(rd.valid & rd.ready):
            m.d.sync += [wr_turn.eq(1), req.valid.eq(1), req.p.eq(rd.p)]
        with m.Elif(wr.valid & wr.ready):
            m.d.sync += [wr_turn.eq(0), req.valid.eq(1), req.p.eq(wr.p)]
        with m.Elif(req.ready):
            m.d.sync += req.valid.eq(0)
        return m
