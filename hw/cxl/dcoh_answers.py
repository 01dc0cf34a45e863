"""The host's answers to the DCOH's requests: M2S forwards and H2D Rsp / Data, each checked
against the entry it names.

See :class:`DcohAnswers`; it is built into :class:`hw.cxl.dcoh.Dcoh` (``docs/dcoh.md``,
"Forwards" and "H2D answers").
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..widths import named, onehot
from ..widths import select_bit as _bit
from .messages import LINE_ADDR_BITS, GoState, H2DData, H2DRsp, H2DRspOpcode, M2SReq, M2SReqOpcode

__all__ = ["ANSWER_INFO", "DcohAnswers"]

#: Width of a CQID (CXL 2.0 §3.2.3).
_CQID_BITS = 12

#: Details of an answer error: the message's opcode (M2S for a forward, H2D Rsp for an
#: H2D Rsp, 0 for H2D Data), its Tag or CQID, and a forward's line address (0 for H2D).
ANSWER_INFO = data.StructLayout({"opcode": 4, "id": 16, "address": LINE_ADDR_BITS})


class DcohAnswers(wiring.Component):
    """Checks the host's answers against the DCOH's entries, one of each kind a cycle.

    Every input is always ready and registered; a message is checked in the cycle after
    its handshake against the entry named by the low ``log2(cqids)`` bits of its Tag /
    CQID (the high bits must equal ``cqid_base``'s), using the entry states of that
    cycle (``i_wait``: an access waiting for its forward; ``i_claim``: a claim waiting;
    ``i_write``: the access is a write) and, for a forward, the entry's host line
    (``i_info_line``, read at ``o_info_addr`` in the handshake cycle: a synchronous read
    port that must be transparent for writes of that cycle).

    * **MemRdFwd** with the entry's line, for an access or a claim waiting: the access is
      permitted (``o_permitted``) or the claim done (``o_claims_done``). The answer to
      every DCOH request (CXL 1.1 Table 17, CXL 3.1 Table 3-24).
    * **H2D Rsp GO-E** for a claim waiting: the claim is done (CXL 3.1 §3.2.4.2.13).
    * **H2D Rsp GO-Err** for an access or a claim waiting, **H2D Data with GO-Err** for
      a read waiting: the access is denied (``o_denied``), the claim done with
      ``o_claim_denied``; ``o_err.host_error``.
    * Anything else is dropped with one error: a forward naming no entry waiting
      (``fwd_not_in_flight``), not a MemRdFwd (``fwd_opcode``), for another line
      (``fwd_address``); an H2D message of any other kind or naming an entry that does
      not wait for it (``rsp_unexpected``).

    In one cycle the forward goes first, then the H2D Rsp, then the H2D Data: an entry
    completed by one is not waiting for the next. ``o_claims_back`` counts the claims
    done this cycle (0 to 2: a forward and an H2D Rsp for different claims).

    Parameters
    ----------
    cqids : int
        Entries of the pool, a power of two.
    cqid_base : int
        First CQID of the pool, a multiple of ``cqids``.
    """

    #: ``o_err`` bits, in the DCOH's error order.
    ERRORS = data.StructLayout({"fwd_not_in_flight": 1, "fwd_opcode": 1, "fwd_address": 1,
                                "host_error": 1, "rsp_unexpected": 1})

    def __init__(self, *, cqids: int, cqid_base: int):
        self._n = cqids
        self._base = cqid_base
        super().__init__({
            "i_fwd": In(stream.Signature(M2SReq)),
            "i_h2d_rsp": In(stream.Signature(H2DRsp)),
            "i_h2d_data": In(stream.Signature(H2DData)),
            "i_wait": In(cqids),
            "i_claim": In(cqids),
            "i_write": In(cqids),
            "o_info_addr": Out(range(cqids)),
            "i_info_line": In(LINE_ADDR_BITS),
            "o_permitted": Out(cqids),
            "o_denied": Out(cqids),
            "o_claims_done": Out(cqids),
            "o_claims_back": Out(range(3)),
            "o_claim_denied": Out(1),
            "o_err": Out(self.ERRORS),
            "o_fwd_info": Out(ANSWER_INFO),
            "o_host_error_info": Out(ANSWER_INFO),
            "o_unexpected_info": Out(ANSWER_INFO),
            "o_busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n, k = self._n, self._n.bit_length() - 1
        top = self._base >> k
        fwd, h_rsp, h_data = self.i_fwd, self.i_h2d_rsp, self.i_h2d_data
        err = self.o_err

        # --- forwards -----------------------------------------------------------------
        f1_valid, f1_op, f1_tag, f1_line = Signal(), Signal(4), Signal(16), Signal(LINE_ADDR_BITS)
        m.d.comb += [fwd.ready.eq(1), self.o_info_addr.eq(fwd.p.tag[:k])]
        m.d.sync += f1_valid.eq(fwd.valid)
        with m.If(fwd.valid):
            m.d.sync += [f1_op.eq(fwd.p.opcode), f1_tag.eq(fwd.p.tag),
                         f1_line.eq(fwd.p.address[1:])]
        f_idx = f1_tag[:k]
        f_oh = onehot(m, f_idx, n, "fwd_oh")
        f_ours = f1_tag[k:] == top
        f_is_wait = _bit(m, self.i_wait, f_idx, "fwd_wait")
        f_is_claim = _bit(m, self.i_claim, f_idx, "fwd_claim")
        f_inflight = named(m, f1_valid & f_ours & (f_is_wait | f_is_claim), "f_inflight")
        f_op_ok = named(m, f1_op == M2SReqOpcode.MemRdFwd.value, "f_op_ok")
        f_line_ok = f1_line == self.i_info_line
        f_good = named(m, f_inflight & f_op_ok & f_line_ok, "f_good")
        fwd_wait = named(m, Mux(f_good & f_is_wait, f_oh, 0), "fwd_clr_wait")
        fwd_claim = named(m, Mux(f_good & f_is_claim, f_oh, 0), "fwd_clr_claim")
        m.d.comb += [
            err.fwd_not_in_flight.eq(f1_valid & ~f_inflight),
            err.fwd_opcode.eq(f_inflight & ~f_op_ok),
            err.fwd_address.eq(f_inflight & f_op_ok & ~f_line_ok),
            *_fields(self.o_fwd_info, f1_op, f1_tag, f1_line),
        ]

        # --- H2D Rsp / Data ------------------------------------------------------------
        r1_valid, r1_op, r1_state = Signal(), Signal(4), Signal(12)
        r1_cqid = Signal(_CQID_BITS)
        d1_valid, d1_go_err, d1_cqid = Signal(), Signal(), Signal(_CQID_BITS)
        m.d.comb += [h_rsp.ready.eq(1), h_data.ready.eq(1)]
        m.d.sync += [r1_valid.eq(h_rsp.valid), d1_valid.eq(h_data.valid)]
        with m.If(h_rsp.valid):
            m.d.sync += [r1_op.eq(h_rsp.p.opcode), r1_state.eq(h_rsp.p.rsp_data),
                         r1_cqid.eq(h_rsp.p.cqid)]
        with m.If(h_data.valid):
            m.d.sync += [d1_go_err.eq(h_data.p.go_err), d1_cqid.eq(h_data.p.cqid)]
        wait_left = named(m, self.i_wait & ~fwd_wait, "h2d_wait_left")
        claim_left = named(m, self.i_claim & ~fwd_claim, "h2d_claim_left")
        r_idx, d_idx = r1_cqid[:k], d1_cqid[:k]
        r_oh, d_oh = onehot(m, r_idx, n, "rsp_oh"), onehot(m, d_idx, n, "data_oh")
        r_wait = named(m, r1_valid & (r1_cqid[k:] == top) &
                       _bit(m, wait_left, r_idx, "rsp_wait"), "r_wait")
        r_claim = named(m, r1_valid & (r1_cqid[k:] == top) &
                        _bit(m, claim_left, r_idx, "rsp_claim"), "r_claim")
        r_go = r1_op == H2DRspOpcode.GO.value
        r_fail = named(m, r_go & (r1_state == GoState.Error.value) & (r_wait | r_claim),
                       "r_fail")                                        # GO-Err
        r_claimed = named(m, r_go & (r1_state == GoState.E.value) & r_claim, "r_claimed")
        r_stray = named(m, r1_valid & ~r_fail & ~r_claimed, "r_stray")
        # Only a read may be answered by H2D Data, and only with GO-Err.
        d_reads = named(m, wait_left & ~self.i_write & ~Mux(r_fail, r_oh, 0), "h2d_data_reads")
        d_read = named(m, d1_valid & (d1_cqid[k:] == top) &
                       _bit(m, d_reads, d_idx, "data_read"), "d_read")
        d_fail = named(m, d_read & d1_go_err, "d_fail")
        d_stray = named(m, d1_valid & ~d_fail, "d_stray")
        r_claim_back = named(m, r_claim & (r_fail | r_claimed), "r_claim_back")

        m.d.comb += [
            self.o_permitted.eq(fwd_wait),
            self.o_denied.eq(Mux(r_fail & r_wait, r_oh, 0) | Mux(d_fail, d_oh, 0)),
            self.o_claims_done.eq(fwd_claim | Mux(r_claim_back, r_oh, 0)),
            self.o_claims_back.eq((f_good & f_is_claim) + r_claim_back),
            self.o_claim_denied.eq(r_fail & r_claim),
            err.host_error.eq(r_fail | d_fail),
            err.rsp_unexpected.eq(r_stray | d_stray),
            *_fields(self.o_host_error_info, Mux(r_fail, r1_op, 0),
                     Mux(r_fail, r1_cqid, d1_cqid), 0),
            *_fields(self.o_unexpected_info, Mux(r_stray, r1_op, 0),
                     Mux(r_stray, r1_cqid, d1_cqid), 0),
            self.o_busy.eq(f1_valid | r1_valid | d1_valid),
        ]
        return m



def _fields(info, opcode, ident, address) -> list:
    """Assignments of an :data:`ANSWER_INFO` port's fields."""
    return [info.opcode.eq(opcode), info.id.eq(ident), info.address.eq(address)]
