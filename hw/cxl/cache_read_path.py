"""Read path of the CXL.cache agent: RdCurr requests, and the reorder buffer that puts
their H2D Data back into request order.

See :class:`CacheReadPath`; it is built into :class:`hw.cxl.cache_agent.CacheAgent`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..widths import is_pow2 as _is_pow2
from ..widths import select_bit as _bit
from .cache_layouts import ERR_REPORT, RD_REQ, RD_RSP, TAG_BITS, CacheError
from .messages import LINE_BITS, D2HReq, D2HReqOpcode, H2DData

__all__ = ["CacheReadPath"]


class CacheReadPath(wiring.Component):
    """RdCurr reads of host lines through a reorder buffer (ROB) whose entries are the
    read CQIDs.

    A read on ``i_req`` is offered on ``o_req`` as a D2H Req RdCurr with the CQID of the
    ring's tail, the next of ``cqids`` entries in turn; the ``o_req`` handshake
    allocates the entry (CQID ``k`` is ROB entry ``k``) and stores the tag. H2D Data
    for a CQID in flight is registered, then written into its entry the next cycle and
    completes the read (RdCurr gets no GO: CXL 1.1 §3.2.4.1.6, CXL 3.x §3.2.4.2.6); the
    ROB head leaves on ``o_rsp`` strictly in request order, with ``error`` set when its
    data had Poison or GO-Err, and its CQID is free again.

    **Latency.** ``o_req`` is ``i_req`` passed through (combinational). H2D Data taken
    in cycle ``t`` puts its line, if it is the head's, on ``o_rsp`` in cycle ``t + 3``.
    **Throughput.** One request, one H2D Data and one ``o_rsp`` line per cycle.
    **Backpressure.** ``o_req.valid`` is ``i_req.valid`` while a CQID is free;
    ``i_req.ready`` is the ``o_req`` handshake. ``i_data`` is always ready (CXL lets
    H2D Data wait only for link credits). ``o_rsp`` is a register (its line and tag are
    the read registers of the memories) that obeys the stream rules. **Reset** frees
    every CQID and drops every line in flight.

    **Errors** (``o_errors``, combinational): DATA_NOT_IN_FLIGHT for H2D Data naming no
    read in flight (dropped), DATA_DUPLICATE for a second H2D Data of one read (dropped,
    the first kept), both in the cycle after the H2D Data handshake; READ_ERROR as a line
    leaves with ``error``.

    Parameters
    ----------
    cqids : int
        Read CQIDs and ROB lines, a power of two from 2 to 2048.

    Members
    -------
    i_req : ``In(stream.Signature(RD_REQ))``
        Reads: line address and tag.
    o_req : ``Out(stream.Signature(D2HReq))``
        RdCurr with the read's CQID and address; NT and reserved fields zero.
    i_data : ``In(stream.Signature(H2DData))``
        The host's read data, by CQID.
    o_rsp : ``Out(stream.Signature(RD_RSP))``
        Lines read, in ``i_req`` order.
    o_cqids_in_flight : ``Out(cqids)``
        Bit ``k``: CQID ``k`` is allocated and its line has not left.
    o_inflight : ``Out(range(cqids + 1))``
        CQIDs in use.
    o_errors : ``Out(ERR_REPORT)``
        This cycle's DATA_NOT_IN_FLIGHT, DATA_DUPLICATE and READ_ERROR, with their CQIDs.
    o_busy : ``Out(1)``
        A read, an H2D Data or a line is anywhere in the path.

    Raises
    ------
    ValueError
        If ``cqids`` is not a power of two from 2 to 2048.
    """

    def __init__(self, *, cqids: int):
        if not _is_pow2(cqids) or not 2 <= cqids <= 2048:
            raise ValueError(f"cqids must be a power of two from 2 to 2048, not {cqids!r}")
        self._cqids = cqids
        super().__init__({
            "i_req": In(stream.Signature(RD_REQ)),
            "o_req": Out(stream.Signature(D2HReq)),
            "i_data": In(stream.Signature(H2DData)),
            "o_rsp": Out(stream.Signature(RD_RSP)),
            "o_cqids_in_flight": Out(cqids),
            "o_inflight": Out(range(cqids + 1)),
            "o_errors": Out(ERR_REPORT),
            "o_busy": Out(1),
        })

    @property
    def cqids(self) -> int:
        return self._cqids

    def elaborate(self, platform):
        m = Module()
        index_bits = self._cqids.bit_length() - 1

        # Ring pointers carry one wrap bit above the entry index.
        tail, head = Signal(index_bits + 1), Signal(index_bits + 1)
        used = Signal(index_bits + 1)
        in_flight = Signal(self._cqids)     # allocated, line not yet delivered
        has_data = Signal(self._cqids)      # H2D Data arrived
        has_error = Signal(self._cqids)     # deliver with error
        m.submodules.rob = rob = Memory(shape=LINE_BITS, depth=self._cqids, init=[])
        m.submodules.tags = tags = Memory(shape=TAG_BITS, depth=self._cqids, init=[])
        # Read ports not transparent: the head reads an entry only after its line and tag
        # were written in earlier cycles, and a stalled output keeps its read register
        # even when the entry is reallocated and rewritten meanwhile.
        rob_wr, rob_rd = rob.write_port(), rob.read_port(transparent_for=())
        tag_wr, tag_rd = tags.write_port(), tags.read_port(transparent_for=())
        m.d.comb += [
            used.eq(tail - head),
            self.o_inflight.eq(used),
            self.o_cqids_in_flight.eq(in_flight),
        ]
        errors = self.o_errors

        # --- H2D Data: registered, then written into the ROB entry of its CQID ----------
        data_valid = Signal()
        data = Signal(H2DData)
        m.d.comb += self.i_data.ready.eq(1)
        m.d.sync += data_valid.eq(self.i_data.valid)
        with m.If(self.i_data.valid):
            m.d.sync += data.eq(self.i_data.payload)
        data_entry = data.cqid[:index_bits]
        data_hit = data_valid & ~data.cqid[index_bits:].any() & \
            _bit(m, in_flight, data_entry, "data_in_flight")
        data_dup = _bit(m, has_data, data_entry, "data_has_data")
        data_first = Signal()
        m.d.comb += [
            data_first.eq(data_hit & ~data_dup),
            rob_wr.en.eq(data_first),
            rob_wr.addr.eq(data_entry),
            rob_wr.data.eq(data.data),
            errors.raised[CacheError.DATA_NOT_IN_FLIGHT].eq(data_valid & ~data_hit),
            errors.raised[CacheError.DATA_DUPLICATE].eq(data_hit & data_dup),
            errors.info[CacheError.DATA_NOT_IN_FLIGHT].id.eq(data.cqid),
            errors.info[CacheError.DATA_DUPLICATE].id.eq(data.cqid),
        ]
        with m.If(data_first):
            m.d.sync += has_data.bit_select(data_entry, 1).eq(1)
            with m.If(data.poison | data.go_err):
                m.d.sync += has_error.bit_select(data_entry, 1).eq(1)

        # --- ROB head -> o_rsp, in request order ----------------------------------------
        rsp = self.o_rsp
        head_entry = head[:index_bits]
        head_ready = Signal()
        deliver = Signal()
        rsp_error = Signal()                # error flag of the line in the output register
        head_error = _bit(m, has_error, head_entry, "head_has_error")
        m.d.comb += head_ready.eq(_bit(m, in_flight, head_entry, "head_in_flight") &
                                  _bit(m, has_data, head_entry, "head_has_data"))
        advance = ~rsp.valid | rsp.ready
        m.d.comb += [
            deliver.eq(advance & head_ready),
            rob_rd.addr.eq(head_entry),
            rob_rd.en.eq(advance),
            tag_rd.addr.eq(head_entry),
            tag_rd.en.eq(advance),
            rsp.p.data.eq(rob_rd.data),
            rsp.p.tag.eq(tag_rd.data),
            rsp.p.error.eq(rsp_error),
            errors.raised[CacheError.READ_ERROR].eq(deliver & head_error),
            errors.info[CacheError.READ_ERROR].id.eq(head_entry),
        ]
        with m.If(advance):
            m.d.sync += rsp.valid.eq(head_ready)
        with m.If(deliver):
            m.d.sync += [
                rsp_error.eq(head_error),
                head.eq(head + 1),
                in_flight.bit_select(head_entry, 1).eq(0),
            ]

        # --- i_req -> o_req: the o_req handshake allocates the tail entry ---------------
        # After the updates above, so that a new read's clears win (an entry is only
        # reallocated once free, so nothing else touches it in that cycle anyway).
        req = self.o_req
        tail_entry = tail[:index_bits]
        m.d.comb += [
            req.valid.eq(self.i_req.valid & ~used[index_bits]),
            req.p.opcode.eq(D2HReqOpcode.RdCurr.value),
            req.p.cqid.eq(tail_entry),
            req.p.address.eq(self.i_req.p.address),
            self.i_req.ready.eq(req.valid & req.ready),
            tag_wr.en.eq(self.i_req.ready),
            tag_wr.addr.eq(tail_entry),
            tag_wr.data.eq(self.i_req.p.tag),
        ]
        with m.If(self.i_req.ready):
            m.d.sync += [
                tail.eq(tail + 1),
                in_flight.bit_select(tail_entry, 1).eq(1),
                has_data.bit_select(tail_entry, 1).eq(0),
                has_error.bit_select(tail_entry, 1).eq(0),
            ]

        m.d.comb += self.o_busy.eq(used.any() | data_valid | rsp.valid)
        return m
