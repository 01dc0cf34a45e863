"""Write path of the CXL.cache agent: ItoMWr requests, the host's GO and pulls on H2D
Rsp, the lines on D2H Data, and the completions in request order.

See :class:`CacheWritePath`; it is built into :class:`hw.cxl.cache_agent.CacheAgent`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..widths import is_pow2 as _is_pow2
from ..widths import select_bit as _bit
from .cache_layouts import ERR_REPORT, TAG_BITS, WR_REQ, WR_RSP, CacheError
from .messages import D2HData, D2HReq, D2HReqOpcode, GoState, H2DRsp, H2DRspOpcode
from .write_data_sender import WriteDataSender

__all__ = ["CacheWritePath"]

#: What an H2D Rsp asks of a write: a GO, a pull of its line, GO_WritePull_Drop (a GO
#: with nothing to send), and whether the write then completes with ``error``.
RSP_ACTIONS = data.StructLayout({"go": 1, "pull": 1, "drop": 1, "error": 1})


def _rsp_actions(m: Module, rsp) -> data.View:
    """The :data:`RSP_ACTIONS` of H2D Rsp ``rsp`` (nothing for ExtCmp, the Fast_GO
    kinds and reserved opcodes, which no write can take)."""
    def opcode(*kinds: H2DRspOpcode):
        return [rsp.opcode == kind.value for kind in kinds]
    op = H2DRspOpcode
    # The agent keeps no line: a write's GO may grant a clean state, silently dropped.
    state = rsp.rsp_data
    clean = (state == GoState.I.value) | (state == GoState.S.value) | (state == GoState.E.value)
    go, pull_go, err_pull, drop, pull = opcode(op.GO, op.GO_WritePull, op.GO_ERR_WritePull,
                                               op.GO_WritePull_Drop, op.WritePull)
    actions = Signal(RSP_ACTIONS)
    m.d.comb += [
        actions.go.eq(go | pull_go | err_pull | drop),
        actions.pull.eq(pull | pull_go | err_pull),
        actions.drop.eq(drop),
        actions.error.eq(err_pull | drop | (go & ~clean)),
    ]
    return actions


class CacheWritePath(wiring.Component):
    """ItoMWr writes of whole host lines, with ``write_cqids`` in flight, completed in
    request order.

    A write on ``i_req`` is offered on ``o_req`` as a D2H Req ItoMWr with the CQID of
    its ring's tail, ``read_cqids + k`` for entry ``k`` of ``write_cqids`` in turn; the
    ``o_req`` handshake allocates the entry and puts line and tag in its buffers. Every
    H2D Rsp is registered and checked the next cycle against the write its CQID names
    (RdCurr gets no H2D Rsp, so one naming a read in flight, ``i_read_cqids_in_flight``,
    is unexpected). GO_WritePull, or WritePull and GO in either order, make the
    :class:`~hw.cxl.write_data_sender.WriteDataSender` send the line on ``o_data`` with
    UQID = the H2D Rsp's RspData; GO_ERR_WritePull is pulled alike and completes with
    ``error``; GO_WritePull_Drop sends nothing and completes with ``error``; a GO with
    state Error, M or reserved completes with ``error``. The write ring's head leaves on
    ``o_rsp`` once its GO has arrived and its line has been sent, and its CQID is free.

    **Latency.** ``o_req`` is ``i_req`` passed through (combinational). A pull taken in
    cycle ``t`` puts the line on ``o_data`` in cycle ``t + 4``; with that line's
    handshake in cycle ``d`` and the GO taken in cycle ``g``, the head's completion is
    on ``o_rsp`` in cycle ``max(d + 2, g + 3)``. **Throughput.** One request, one H2D
    Rsp, one line and one completion per cycle. **Backpressure.** ``o_req.valid`` is
    ``i_req.valid`` while a CQID is free; ``i_req.ready`` is the ``o_req`` handshake;
    ``i_rsp`` is always ready (CXL lets H2D Rsp wait only for link credits); ``o_data``
    and ``o_rsp`` are registers that obey the stream rules. **Reset** frees every CQID
    and drops every write in flight.

    **Errors** (``o_errors``, combinational, the cycle after the H2D Rsp handshake):
    RSP_NOT_IN_FLIGHT for an H2D Rsp naming no request in flight, RSP_UNEXPECTED for one
    the request cannot take (any for a read; a second GO or pull; ExtCmp, Fast_GO and
    reserved opcodes), both dropped; WRITE_ERROR as a completion leaves with ``error``.

    Parameters
    ----------
    read_cqids : int
        CQIDs below the write ring (the read ring's), a power of two from 2 to 2048.
    write_cqids : int
        Write CQIDs and buffer lines, a power of two from 2 to ``read_cqids``.

    Members
    -------
    i_req : ``In(stream.Signature(WR_REQ))``
        Writes: line address, line and tag.
    o_req : ``Out(stream.Signature(D2HReq))``
        ItoMWr with the write's CQID and address; NT and reserved fields zero.
    i_rsp : ``In(stream.Signature(H2DRsp))``
        Every H2D Rsp of the agent.
    i_read_cqids_in_flight : ``In(read_cqids)``
        Bit ``k``: read CQID ``k`` is in flight.
    o_data : ``Out(stream.Signature(D2HData))``
        Pulled lines.
    o_rsp : ``Out(stream.Signature(WR_RSP))``
        Completions, in ``i_req`` order.
    o_inflight : ``Out(range(write_cqids + 1))``
        Write CQIDs in use.
    o_errors : ``Out(ERR_REPORT)``
        This cycle's RSP_NOT_IN_FLIGHT, RSP_UNEXPECTED and WRITE_ERROR, with opcode and
        CQID.
    o_busy : ``Out(1)``
        A write, an H2D Rsp, a pull or a completion is anywhere in the path.

    Raises
    ------
    ValueError
        If a parameter is out of its range.
    """

    def __init__(self, *, read_cqids: int, write_cqids: int):
        if not _is_pow2(read_cqids) or not 2 <= read_cqids <= 2048:
            raise ValueError(f"read_cqids must be a power of two from 2 to 2048, "
                             f"not {read_cqids!r}")
        if not _is_pow2(write_cqids) or not 2 <= write_cqids <= read_cqids:
            raise ValueError(f"write_cqids must be a power of two from 2 to read_cqids "
                             f"({read_cqids}), not {write_cqids!r}")
        self._read_cqids = read_cqids
        self._write_cqids = write_cqids
        super().__init__({
            "i_req": In(stream.Signature(WR_REQ)),
            "o_req": Out(stream.Signature(D2HReq)),
            "i_rsp": In(stream.Signature(H2DRsp)),
            "i_read_cqids_in_flight": In(read_cqids),
            "o_data": Out(stream.Signature(D2HData)),
            "o_rsp": Out(stream.Signature(WR_RSP)),
            "o_inflight": Out(range(write_cqids + 1)),
            "o_errors": Out(ERR_REPORT),
            "o_busy": Out(1),
        })

    @property
    def read_cqids(self) -> int:
        return self._read_cqids

    @property
    def write_cqids(self) -> int:
        return self._write_cqids

    def elaborate(self, platform):
        m = Module()
        base, n = self._read_cqids, self._write_cqids
        read_bits, index_bits = base.bit_length() - 1, n.bit_length() - 1

        # Ring pointers carry one wrap bit above the entry index.
        tail, head = Signal(index_bits + 1), Signal(index_bits + 1)
        used = Signal(index_bits + 1)
        in_flight = Signal(n)
        has_go = Signal(n)              # GO part of a response arrived
        pulled = Signal(n)              # pull (or drop) arrived: no further pull accepted
        sent = Signal(n)                # D2H Data sent (or nothing to send)
        has_error = Signal(n)
        m.submodules.tags = tags = Memory(shape=TAG_BITS, depth=n, init=[])
        tag_wr, tag_rd = tags.write_port(), tags.read_port(transparent_for=())
        m.submodules.sender = sender = WriteDataSender(lines=n)
        wiring.connect(m, sender.o_data, wiring.flipped(self.o_data))
        m.d.comb += [used.eq(tail - head), self.o_inflight.eq(used)]
        errors = self.o_errors

        # --- H2D Rsp: registered, then checked against the request it names -------------
        rsp_valid = Signal()
        rsp = Signal(H2DRsp)
        m.d.comb += self.i_rsp.ready.eq(1)
        m.d.sync += rsp_valid.eq(self.i_rsp.valid)
        with m.If(self.i_rsp.valid):
            m.d.sync += rsp.eq(self.i_rsp.payload)
        actions = _rsp_actions(m, rsp)
        entry = rsp.cqid[:index_bits]
        read_hit = rsp_valid & ~rsp.cqid[read_bits:].any() & \
            _bit(m, self.i_read_cqids_in_flight, rsp.cqid[:read_bits], "rsp_read_in_flight")
        write_hit = rsp_valid & (rsp.cqid[index_bits:] == base >> index_bits) & \
            _bit(m, in_flight, entry, "rsp_in_flight")
        repeated = ((actions.go & _bit(m, has_go, entry, "rsp_has_go")) |
                    ((actions.pull | actions.drop) & _bit(m, pulled, entry, "rsp_pulled")))
        accepted = Signal()
        m.d.comb += [
            accepted.eq(write_hit & (actions.go | actions.pull) & ~repeated),
            sender.i_pull.valid.eq(accepted & actions.pull),
            sender.i_pull.p.entry.eq(entry),
            sender.i_pull.p.uqid.eq(rsp.rsp_data),  # RspData holds the UQID for the pulls
            errors.raised[CacheError.RSP_NOT_IN_FLIGHT].eq(rsp_valid & ~read_hit & ~write_hit),
            errors.raised[CacheError.RSP_UNEXPECTED].eq(read_hit | (write_hit & ~accepted)),
        ]
        for kind in (CacheError.RSP_NOT_IN_FLIGHT, CacheError.RSP_UNEXPECTED):
            m.d.comb += [errors.info[kind].opcode.eq(rsp.opcode),
                         errors.info[kind].id.eq(rsp.cqid)]
        with m.If(accepted):
            with m.If(actions.go):
                m.d.sync += has_go.bit_select(entry, 1).eq(1)
            with m.If(actions.pull | actions.drop):
                m.d.sync += pulled.bit_select(entry, 1).eq(1)
            with m.If(actions.drop):
                m.d.sync += sent.bit_select(entry, 1).eq(1)
            with m.If(actions.error):
                m.d.sync += has_error.bit_select(entry, 1).eq(1)
        with m.If(sender.o_sent):
            m.d.sync += sent.bit_select(sender.o_sent_entry, 1).eq(1)

        # --- write ring head -> o_rsp, in request order ---------------------------------
        done = self.o_rsp
        head_entry = head[:index_bits]
        head_ready = Signal()
        complete = Signal()
        done_error = Signal()           # error flag of the completion in the output register
        head_error = _bit(m, has_error, head_entry, "head_has_error")
        m.d.comb += head_ready.eq(_bit(m, in_flight, head_entry, "head_in_flight") &
                                  _bit(m, has_go, head_entry, "head_has_go") &
                                  _bit(m, sent, head_entry, "head_sent"))
        advance = ~done.valid | done.ready
        m.d.comb += [
            complete.eq(advance & head_ready),
            tag_rd.addr.eq(head_entry),
            tag_rd.en.eq(advance),
            done.p.tag.eq(tag_rd.data),
            done.p.error.eq(done_error),
            errors.raised[CacheError.WRITE_ERROR].eq(complete & head_error),
            errors.info[CacheError.WRITE_ERROR].id.eq(base + head_entry),
        ]
        with m.If(advance):
            m.d.sync += done.valid.eq(head_ready)
        with m.If(complete):
            m.d.sync += [
                done_error.eq(head_error),
                head.eq(head + 1),
                in_flight.bit_select(head_entry, 1).eq(0),
            ]

        # --- i_req -> o_req: the o_req handshake allocates the tail entry ---------------
        # After the updates above, so that a new write's clears win (an entry is only
        # reallocated once free, so nothing else touches it in that cycle anyway).
        req = self.o_req
        tail_entry = tail[:index_bits]
        m.d.comb += [
            req.valid.eq(self.i_req.valid & ~used[index_bits]),
            req.p.opcode.eq(D2HReqOpcode.ItoMWr.value),
            req.p.cqid.eq(base + tail_entry),
            req.p.address.eq(self.i_req.p.address),
            self.i_req.ready.eq(req.valid & req.ready),
            sender.i_line.valid.eq(self.i_req.ready),
            sender.i_line.p.entry.eq(tail_entry),
            sender.i_line.p.data.eq(self.i_req.p.data),
            tag_wr.en.eq(self.i_req.ready),
            tag_wr.addr.eq(tail_entry),
            tag_wr.data.eq(self.i_req.p.tag),
        ]
        with m.If(self.i_req.ready):
            m.d.sync += [tail.eq(tail + 1), in_flight.bit_select(tail_entry, 1).eq(1)]
            for state in (has_go, pulled, sent, has_error):
                m.d.sync += state.bit_select(tail_entry, 1).eq(0)

        m.d.comb += self.o_busy.eq(used.any() | rsp_valid | done.valid | sender.o_busy)
        return m
