"""Shares the CXL.cache agent's read port between several users.

See :class:`CacheReadMux`.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .cache_layouts import RD_REQ, RD_RSP, TAG_BITS
from .round_robin import first_from

__all__ = ["CacheReadMux"]


class CacheReadMux(wiring.Component):
    """``ports`` read users merged onto one :class:`~hw.cxl.cache_agent.CacheAgent`
    read port, round robin, and the responses routed back by tag.

    A request taken from ``i_req{k}`` goes out on ``o_rd`` with the top
    ``port_bits = ceil(log2(ports))`` bits of its tag replaced by ``k``; a response on
    ``i_rd`` goes to ``o_rsp{k}`` for the ``k`` in those bits, with them cleared again.
    A user's tags must therefore leave their top ``port_bits`` bits zero. The agent
    answers reads in request order, so each user gets its responses in its own request
    order.

    **Arbitration.** Among the inputs that are valid, the first at or after the one
    after the last input taken (input 0 first after reset). **Latency.** A request
    taken in cycle ``t`` is valid on ``o_rd`` in cycle ``t + 1`` (a register); a
    response passes combinationally. **Throughput.** One request and one response per
    cycle. **Backpressure.** ``i_req{k}.ready`` is high when ``k`` is chosen and the
    register is empty or being taken; ``i_rd.ready`` is the addressed user's ``ready``,
    so a user that does not take its response holds every later one (users must only
    request what they can take); a response whose port bits name no user is dropped.
    ``o_rd`` obeys the stream rules. **Reset** empties the register and points the
    round robin at input 0.

    Parameters
    ----------
    ports : int
        Users, 2 to 8.

    Members
    -------
    i_req{k}, o_rsp{k} : ``In(stream.Signature(RD_REQ))``, ``Out(stream.Signature(RD_RSP))``
        User ``k``'s requests and responses.
    o_rd, i_rd : ``Out(stream.Signature(RD_REQ))``, ``In(stream.Signature(RD_RSP))``
        The agent's read port.
    """

    def __init__(self, *, ports: int):
        if not isinstance(ports, int) or not 2 <= ports <= 8:
            raise ValueError(f"ports must be an integer from 2 to 8, not {ports!r}")
        self._ports = ports
        members = {"o_rd": Out(stream.Signature(RD_REQ)), "i_rd": In(stream.Signature(RD_RSP))}
        for k in range(ports):
            members[f"i_req{k}"] = In(stream.Signature(RD_REQ))
            members[f"o_rsp{k}"] = Out(stream.Signature(RD_RSP))
        super().__init__(members)

    ports = property(lambda self: self._ports)
    #: Tag bits the mux takes from the top of each user's tag.
    port_bits = property(lambda self: (self._ports - 1).bit_length())

    def elaborate(self, platform):
        m = Module()
        n, bits = self._ports, self.port_bits
        low = TAG_BITS - bits
        reqs = [getattr(self, f"i_req{k}") for k in range(n)]
        rsps = [getattr(self, f"o_rsp{k}") for k in range(n)]
        out, rsp = self.o_rd, self.i_rd

        # --- requests: round robin into the output register
        size = 1 << bits
        valid = Signal(size)
        m.d.comb += valid.eq(Cat(*(r.valid for r in reqs)))
        nxt = Signal(bits)                      # first input to consider
        any_, pick = first_from(m, valid, nxt, "req_pick")
        free = ~out.valid | out.ready
        with m.If(out.ready):
            m.d.sync += out.valid.eq(0)
        for k, req in enumerate(reqs):
            chosen = any_ & (pick == k)
            m.d.comb += req.ready.eq(free & chosen)
            with m.If(free & chosen):
                m.d.sync += [out.valid.eq(1), out.p.address.eq(req.p.address),
                             out.p.tag.eq(Cat(req.p.tag[:low], pick)),
                             nxt.eq((k + 1) % n)]

        # --- responses: by the tag's top bits
        port = rsp.p.tag[low:]
        m.d.comb += rsp.ready.eq(1)             # a response for no user is dropped
        for k, r in enumerate(rsps):
            m.d.comb += [r.valid.eq(rsp.valid & (port == k)),
                         r.p.data.eq(rsp.p.data), r.p.error.eq(rsp.p.error),
                         r.p.tag.eq(rsp.p.tag[:low])]
            with m.If(port == k):
                m.d.comb += rsp.ready.eq(r.ready)
        return m
