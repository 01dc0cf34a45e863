"""The CXL.cache agent as one block, before it was split into components: a test-only
reference for the cycle-by-cycle equivalence test."""

from __future__ import annotations

from amaranth.hdl import C, Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.csr.error_log import ErrorLog
from hw.cxl.cache_layouts import (
    ERR_DETAILS as _ERR_DETAILS,
)
from hw.cxl.cache_layouts import (
    ERR_INFO,
    RD_REQ,
    RD_RSP,
    TAG_BITS,
    WR_REQ,
    WR_RSP,
    CacheError,
)
from hw.cxl.cache_layouts import (
    ID_BITS as _ID_BITS,
)
from hw.cxl.messages import (
    LINE_BITS,
    D2HData,
    D2HReq,
    D2HReqOpcode,
    D2HRsp,
    GoState,
    H2DData,
    H2DReq,
    H2DRsp,
    H2DRspOpcode,
)
from hw.cxl.snoop_responder import SnoopResponder
from hw.widths import is_pow2 as _is_pow2
from hw.widths import select_bit as _bit

__all__ = ["CacheAgentRef"]


class CacheAgentRef(wiring.Component):
    """The single-block :class:`hw.cxl.cache_agent.CacheAgent` before its split (a test-only
    reference for ``tests/test_cache_agent_equivalence.py``)."""

    def __init__(self, *, cqids: int = 128, write_cqids: int = 16):
        if not _is_pow2(cqids) or not 2 <= cqids <= 2048:
            raise ValueError(f"cqids must be a power of two from 2 to 2048, not {cqids!r}")
        if not _is_pow2(write_cqids) or not 2 <= write_cqids <= cqids:
            raise ValueError(f"write_cqids must be a power of two from 2 to cqids ({cqids}), "
                             f"not {write_cqids!r}")
        self._cqids = cqids
        self._write_cqids = write_cqids
        super().__init__({
            "i_rd": In(stream.Signature(RD_REQ)),
            "o_rd": Out(stream.Signature(RD_RSP)),
            "i_wr": In(stream.Signature(WR_REQ)),
            "o_wr": Out(stream.Signature(WR_RSP)),
            "o_d2h_req": Out(stream.Signature(D2HReq)),
            "o_d2h_rsp": Out(stream.Signature(D2HRsp)),
            "o_d2h_data": Out(stream.Signature(D2HData)),
            "i_h2d_req": In(stream.Signature(H2DReq)),
            "i_h2d_rsp": In(stream.Signature(H2DRsp)),
            "i_h2d_data": In(stream.Signature(H2DData)),
            "o_err_set": Out(CacheError.COUNT),
            "o_err_status": Out(CacheError.COUNT),
            "i_err_clear": In(CacheError.COUNT),
            "o_err_first": Out(ERR_INFO),
            "o_rd_inflight": Out(range(cqids + 1)),
            "o_wr_inflight": Out(range(write_cqids + 1)),
            "o_busy": Out(1),
        })

    @property
    def cqids(self) -> int:
        return self._cqids

    @property
    def write_cqids(self) -> int:
        return self._write_cqids

    @property
    def write_cqid_base(self) -> int:
        """The first write CQID (write ``k`` of the ring uses ``write_cqid_base + k``)."""
        return self._cqids

    def elaborate(self, platform):
        m = Module()
        n_rd, n_wr = self._cqids, self._write_cqids
        kr = n_rd.bit_length() - 1      # read ring index bits
        kw = n_wr.bit_length() - 1      # write ring index bits

        # --- state -----------------------------------------------------------------------
        # Read ring: entry k is CQID k. Pointers carry one wrap bit.
        r_tail, r_head = Signal(kr + 1), Signal(kr + 1)
        r_busy = Signal(n_rd)           # issued, line not yet delivered
        r_data = Signal(n_rd)           # H2D Data arrived
        r_err = Signal(n_rd)            # deliver with error
        m.submodules.rob = rob = Memory(shape=LINE_BITS, depth=n_rd, init=[])
        m.submodules.rd_tags = rd_tags = Memory(shape=TAG_BITS, depth=n_rd, init=[])
        # Read ports not transparent: the head reads an entry only after its line and tag
        # were written in earlier cycles, and a stalled output keeps its read register
        # even when the entry is reissued and rewritten meanwhile.
        rob_wr, rob_rd = rob.write_port(), rob.read_port(transparent_for=())
        rtag_wr, rtag_rd = rd_tags.write_port(), rd_tags.read_port(transparent_for=())

        # Write ring: entry k is CQID cqids + k.
        w_tail, w_head = Signal(kw + 1), Signal(kw + 1)
        w_busy = Signal(n_wr)
        w_go = Signal(n_wr)             # GO part of a response arrived
        w_pull = Signal(n_wr)           # pull (or drop) arrived: no further pull accepted
        w_sent = Signal(n_wr)           # D2H Data sent (or nothing to send)
        w_err = Signal(n_wr)
        m.submodules.wbuf = wbuf = Memory(shape=LINE_BITS, depth=n_wr, init=[])
        m.submodules.wr_tags = wr_tags = Memory(shape=TAG_BITS, depth=n_wr, init=[])
        wbuf_wr, wbuf_rd = wbuf.write_port(), wbuf.read_port(transparent_for=())
        wtag_wr, wtag_rd = wr_tags.write_port(), wr_tags.read_port(transparent_for=())
        # Pulled writes waiting to send their line: (ring index, UQID). Each entry of the
        # ring is pulled at most once while it is busy, so the FIFO cannot overflow.
        pull_layout = data.StructLayout({"idx": kw, "uqid": _ID_BITS})
        m.submodules.pulls = pulls = SyncFIFOBuffered(width=pull_layout.size,
                                                      depth=max(n_wr, 3))

        r_used = Signal(kr + 1)
        w_used = Signal(kw + 1)
        m.d.comb += [
            r_used.eq(r_tail - r_head),
            w_used.eq(w_tail - w_head),
            self.o_rd_inflight.eq(r_used),
            self.o_wr_inflight.eq(w_used),
        ]

        err = Signal(CacheError.COUNT)  # this cycle's errors (registered onto o_err_set)
        info = {}                       # kind -> (opcode, id) of this cycle's error

        # --- H2D Rsp: registered, then checked against the request it names ---------------
        hr = self.i_h2d_rsp
        s_rv = Signal()
        s_rsp = Signal(H2DRsp)
        m.d.comb += hr.ready.eq(1)
        m.d.sync += s_rv.eq(hr.valid)
        with m.If(hr.valid):
            m.d.sync += s_rsp.eq(hr.payload)
        cq = s_rsp.cqid
        op = s_rsp.opcode
        is_op = {o: (op == o.value) for o in H2DRspOpcode}
        state = s_rsp.rsp_data
        # The agent keeps no line: a write's GO may grant a clean state, silently dropped.
        state_ok = ((state == GoState.I.value) | (state == GoState.S.value) |
                    (state == GoState.E.value))
        rsp_rd_idx = cq[:kr]
        rsp_wr_idx = cq[:kw]
        rsp_is_rd = ~cq[kr:].any()
        rsp_is_wr = (cq[kw:] == n_rd >> kw)

        # RdCurr gets no H2D Rsp at all: every one naming a read in flight is unexpected.
        rd_hit = s_rv & rsp_is_rd & _bit(m, r_busy, rsp_rd_idx, "rsp_r_busy")
        wr_hit = s_rv & rsp_is_wr & _bit(m, w_busy, rsp_wr_idx, "rsp_w_busy")
        has_go = (is_op[H2DRspOpcode.GO] | is_op[H2DRspOpcode.GO_WritePull] |
                  is_op[H2DRspOpcode.GO_ERR_WritePull] | is_op[H2DRspOpcode.GO_WritePull_Drop])
        has_pull = (is_op[H2DRspOpcode.WritePull] | is_op[H2DRspOpcode.GO_WritePull] |
                    is_op[H2DRspOpcode.GO_ERR_WritePull])
        is_drop = is_op[H2DRspOpcode.GO_WritePull_Drop]
        wr_conflict = ((has_go & _bit(m, w_go, rsp_wr_idx, "rsp_w_go")) |
                       ((has_pull | is_drop) & _bit(m, w_pull, rsp_wr_idx, "rsp_w_pull")))
        wr_ok = Signal()
        m.d.comb += wr_ok.eq(wr_hit & (has_go | has_pull) & ~wr_conflict)
        wr_bad = (is_op[H2DRspOpcode.GO_ERR_WritePull] | is_drop |
                  (is_op[H2DRspOpcode.GO] & ~state_ok))

        pull_in = pull_layout(pulls.w_data)
        m.d.comb += [
            pulls.w_en.eq(wr_ok & has_pull),
            pull_in.idx.eq(rsp_wr_idx),
            pull_in.uqid.eq(state),     # RspData holds the UQID for the pull types
            err[CacheError.RSP_NOT_IN_FLIGHT].eq(s_rv & ~rd_hit & ~wr_hit),
            err[CacheError.RSP_UNEXPECTED].eq(rd_hit | (wr_hit & ~wr_ok)),
        ]
        info[CacheError.RSP_NOT_IN_FLIGHT] = info[CacheError.RSP_UNEXPECTED] = (op, cq)
        with m.If(wr_ok):
            with m.If(has_go):
                m.d.sync += w_go.bit_select(rsp_wr_idx, 1).eq(1)
            with m.If(has_pull | is_drop):
                m.d.sync += w_pull.bit_select(rsp_wr_idx, 1).eq(1)
            with m.If(is_drop):
                m.d.sync += w_sent.bit_select(rsp_wr_idx, 1).eq(1)
            with m.If(wr_bad):
                m.d.sync += w_err.bit_select(rsp_wr_idx, 1).eq(1)

        # --- H2D Data: registered, then written into the ROB entry of its CQID ------------
        hd = self.i_h2d_data
        s_dv = Signal()
        s_data = Signal(H2DData)
        m.d.comb += hd.ready.eq(1)
        m.d.sync += s_dv.eq(hd.valid)
        with m.If(hd.valid):
            m.d.sync += s_data.eq(hd.payload)
        dcq = s_data.cqid
        d_idx = dcq[:kr]
        d_hit = s_dv & ~dcq[kr:].any() & _bit(m, r_busy, d_idx, "data_r_busy")
        d_dup = _bit(m, r_data, d_idx, "data_r_data")
        d_first = Signal()
        m.d.comb += [
            d_first.eq(d_hit & ~d_dup),
            rob_wr.en.eq(d_first),
            rob_wr.addr.eq(d_idx),
            rob_wr.data.eq(s_data.data),
            err[CacheError.DATA_NOT_IN_FLIGHT].eq(s_dv & ~d_hit),
            err[CacheError.DATA_DUPLICATE].eq(d_hit & d_dup),
        ]
        info[CacheError.DATA_NOT_IN_FLIGHT] = info[CacheError.DATA_DUPLICATE] = (C(0, 5), dcq)
        with m.If(d_first):
            m.d.sync += r_data.bit_select(d_idx, 1).eq(1)
            with m.If(s_data.poison | s_data.go_err):
                m.d.sync += r_err.bit_select(d_idx, 1).eq(1)

        # --- ROB head -> o_rd, in request order -------------------------------------------
        o_rd = self.o_rd
        r_slot = r_head[:kr]
        r_ready = Signal()
        r_deliver = Signal()
        rd_error = Signal()             # error flag of the line in the output register
        head_err = _bit(m, r_err, r_slot, "head_r_err")
        m.d.comb += r_ready.eq(_bit(m, r_busy, r_slot, "head_r_busy") &
                               _bit(m, r_data, r_slot, "head_r_data"))
        r_advance = ~o_rd.valid | o_rd.ready
        m.d.comb += [
            r_deliver.eq(r_advance & r_ready),
            rob_rd.addr.eq(r_slot),
            rob_rd.en.eq(r_advance),
            rtag_rd.addr.eq(r_slot),
            rtag_rd.en.eq(r_advance),
            o_rd.p.data.eq(rob_rd.data),
            o_rd.p.tag.eq(rtag_rd.data),
            o_rd.p.error.eq(rd_error),
            err[CacheError.READ_ERROR].eq(r_deliver & head_err),
        ]
        info[CacheError.READ_ERROR] = (C(0, 5), r_slot)
        with m.If(r_advance):
            m.d.sync += o_rd.valid.eq(r_ready)
        with m.If(r_deliver):
            m.d.sync += [
                rd_error.eq(head_err),
                r_head.eq(r_head + 1),
                r_busy.bit_select(r_slot, 1).eq(0),
            ]

        # --- pulled lines -> D2H Data -----------------------------------------------------
        dd = self.o_d2h_data
        pull_out = pull_layout(pulls.r_data)
        d_advance = ~dd.valid | dd.ready
        d_uqid = Signal(_ID_BITS)
        d_idx_out = Signal(kw)          # ring index of the line in the output register
        m.d.comb += [
            pulls.r_en.eq(d_advance),
            wbuf_rd.addr.eq(pull_out.idx),
            wbuf_rd.en.eq(d_advance),
            dd.p.uqid.eq(d_uqid),
            dd.p.data.eq(wbuf_rd.data),
        ]
        with m.If(d_advance):
            m.d.sync += dd.valid.eq(pulls.r_rdy)
            with m.If(pulls.r_rdy):
                m.d.sync += [d_uqid.eq(pull_out.uqid), d_idx_out.eq(pull_out.idx)]
        with m.If(dd.valid & dd.ready):
            m.d.sync += w_sent.bit_select(d_idx_out, 1).eq(1)

        # --- write ring head -> o_wr, in request order ------------------------------------
        o_wr = self.o_wr
        w_slot = w_head[:kw]
        w_ready = Signal()
        w_done = Signal()
        wr_error = Signal()
        whead_err = _bit(m, w_err, w_slot, "head_w_err")
        m.d.comb += w_ready.eq(_bit(m, w_busy, w_slot, "head_w_busy") &
                               _bit(m, w_go, w_slot, "head_w_go") &
                               _bit(m, w_sent, w_slot, "head_w_sent"))
        w_advance = ~o_wr.valid | o_wr.ready
        m.d.comb += [
            w_done.eq(w_advance & w_ready),
            wtag_rd.addr.eq(w_slot),
            wtag_rd.en.eq(w_advance),
            o_wr.p.tag.eq(wtag_rd.data),
            o_wr.p.error.eq(wr_error),
            err[CacheError.WRITE_ERROR].eq(w_done & whead_err),
        ]
        info[CacheError.WRITE_ERROR] = (C(0, 5), Const(n_rd, _ID_BITS) | w_slot)
        with m.If(w_advance):
            m.d.sync += o_wr.valid.eq(w_ready)
        with m.If(w_done):
            m.d.sync += [
                wr_error.eq(whead_err),
                w_head.eq(w_head + 1),
                w_busy.bit_select(w_slot, 1).eq(0),
            ]

        # --- issue: i_rd / i_wr -> D2H Req (round-robin), allocating ring entries ---------
        # After the updates above, so that a new request's clears win (an entry is only
        # reissued once free, so nothing else touches it in that cycle anyway).
        req = self.o_d2h_req
        i_rd, i_wr = self.i_rd, self.i_wr
        req_free = ~req.valid | req.ready
        rd_can = i_rd.valid & ~r_used[kr] & req_free
        wr_can = i_wr.valid & ~w_used[kw] & req_free
        prefer_wr = Signal()
        take_rd = Signal()
        take_wr = Signal()
        m.d.comb += [
            take_rd.eq(rd_can & (~wr_can | ~prefer_wr)),
            take_wr.eq(wr_can & (~rd_can | prefer_wr)),
            i_rd.ready.eq(take_rd),
            i_wr.ready.eq(take_wr),
        ]
        r_new = r_tail[:kr]
        w_new = w_tail[:kw]
        m.d.comb += [
            rtag_wr.en.eq(take_rd),
            rtag_wr.addr.eq(r_new),
            rtag_wr.data.eq(i_rd.p.tag),
            wbuf_wr.en.eq(take_wr),
            wbuf_wr.addr.eq(w_new),
            wbuf_wr.data.eq(i_wr.p.data),
            wtag_wr.en.eq(take_wr),
            wtag_wr.addr.eq(w_new),
            wtag_wr.data.eq(i_wr.p.tag),
        ]
        with m.If(take_rd):
            m.d.sync += [
                prefer_wr.eq(1),
                req.valid.eq(1),
                req.p.opcode.eq(D2HReqOpcode.RdCurr.value),
                req.p.cqid.eq(r_new),
                req.p.address.eq(i_rd.p.address),
                r_tail.eq(r_tail + 1),
                r_busy.bit_select(r_new, 1).eq(1),
                r_data.bit_select(r_new, 1).eq(0),
                r_err.bit_select(r_new, 1).eq(0),
            ]
        with m.Elif(take_wr):
            m.d.sync += [
                prefer_wr.eq(0),
                req.valid.eq(1),
                req.p.opcode.eq(D2HReqOpcode.ItoMWr.value),
                req.p.cqid.eq(Const(n_rd, _ID_BITS) | w_new),
                req.p.address.eq(i_wr.p.address),
                w_tail.eq(w_tail + 1),
                w_busy.bit_select(w_new, 1).eq(1),
                w_go.bit_select(w_new, 1).eq(0),
                w_pull.bit_select(w_new, 1).eq(0),
                w_sent.bit_select(w_new, 1).eq(0),
                w_err.bit_select(w_new, 1).eq(0),
            ]
        with m.Elif(req.ready):
            m.d.sync += req.valid.eq(0)

        # --- snoops: every H2D Req answered RspIHitI ---------------------------------------
        m.submodules.snoops = snoops = SnoopResponder()
        wiring.connect(m, wiring.flipped(self.i_h2d_req), snoops.i_snoop)
        wiring.connect(m, snoops.o_rsp, wiring.flipped(self.o_d2h_rsp))
        m.d.comb += err[CacheError.SNOOP_RESERVED].eq(snoops.o_reserved)
        info[CacheError.SNOOP_RESERVED] = (self.i_h2d_req.p.opcode, self.i_h2d_req.p.uqid)

        # --- errors ------------------------------------------------------------------------
        m.submodules.errors = log = ErrorLog(kinds=CacheError.COUNT, info=_ERR_DETAILS)
        for kind in range(CacheError.COUNT):
            opcode, ident = info[kind]
            m.d.comb += [log.i_info[kind].opcode.eq(opcode), log.i_info[kind].id.eq(ident)]
        m.d.comb += [
            log.i_raise.eq(err), log.i_clear.eq(self.i_err_clear),
            self.o_err_set.eq(log.o_set), self.o_err_status.eq(log.o_status),
            self.o_err_first.eq(log.o_first),
        ]

        m.d.comb += self.o_busy.eq(r_used.any() | w_used.any() | s_rv | s_dv | o_rd.valid |
                                   o_wr.valid | req.valid | dd.valid | snoops.o_busy |
                                   pulls.r_rdy)
        return m
