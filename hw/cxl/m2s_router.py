"""The M2S router in front of the memory endpoint: forwards to the DCOH, host checks
for every host request that touches device memory (``docs/dcoh.md``, "Host check" and
"Integration")."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..widths import is_int
from .dcoh import CHK_RSP
from .mem_endpoint import hdm_decode
from .messages import (
    LINE_ADDR_BITS,
    M2SReq,
    M2SReqOpcode,
    M2SRwD,
    M2SRwDOpcode,
    MetaField,
    MetaValue,
)

__all__ = ["M2sRouter"]

#: Messages each channel holds while their checks are answered (the DCOH answers an
#: undrained check two or three cycles after its handshake, so four keep one message
#: per cycle flowing).
_DEPTH = 4
#: Checks in flight (both channels), in check order.
_ORDER_DEPTH = 2 * _DEPTH


class M2sRouter(wiring.Component):
    """Routes the host's M2S Req and RwD streams to the memory endpoint, the DCOH's
    forward input and its host-check port.

    **Disabled** (``enable`` low, the reset state of ``COH_CTRL.HDM_D``): a wire. Every
    message goes to the endpoint in the same cycle; MemRdFwd / MemWrFwd reach the
    endpoint too, which flags them UNEXPECTED_FWD.

    **Enabled.** Each M2S Req MemRdFwd / MemWrFwd goes to ``o_fwd`` (the DCOH's
    ``i_fwd``) and nowhere else. Every message that reads or writes device memory or
    gives the host a copy of a line (M2S Req MemRd and MemRdData; MemInv and MemInvNT
    with MetaField Meta0-State and MetaValue Any or Shared, which the endpoint answers
    Cmp-E / Cmp-S; M2S RwD MemWr and MemWrPtl) inside the HDM range is *checked*: its
    device line (``line - hdm_base``) goes to ``o_chk`` as the message enters the
    channel's queue, and the message leaves for the endpoint only once the check's
    answer (``i_chk``, in check order) has come back: the DCOH has then drained the
    device's accesses to the page and set it to host bias, so the host never holds a
    copy of a line of a device-bias page. Other messages (out of range, MemInv /
    MemInvNT with MetaValue Invalid or MetaField No-Op, MemClnEvct, MemSpecRd,
    BIConflict) are queued without a check and keep their place in their channel. The
    answer's ``flipped`` and ``error`` bits are counted by the DCOH; the router only
    waits for the answer. Each channel keeps its own order; the two channels are
    independent, as on the link.

    A message enters in the cycle of its handshake, one per channel per cycle; when
    both channels present a checked message in the same cycle, M2S Req goes first and
    RwD waits one cycle, unless a RwD check already waits for ``o_chk.ready`` (a
    waiting check keeps the port, so ``o_chk`` obeys the stream rules). Forwards
    therefore reach the DCOH in channel order with the checks, at least one cycle
    before the check of any later Req message (the DCOH's ordering rule).

    **Latency** (enabled, answers after two cycles): a checked message leaves three
    cycles after its handshake, an unchecked one one cycle after (the queue's output
    register). **Throughput**: one message per channel per cycle while answers keep
    coming (``_DEPTH`` messages per channel may wait for their answers).

    ``enable`` may change only while the router is empty (``o_busy`` low) and no host
    traffic arrives.

    Members
    -------
    i_req, i_rwd : ``In(stream.Signature(M2SReq / M2SRwD))``
        From the link.
    o_req, o_rwd : ``Out(stream.Signature(M2SReq / M2SRwD))``
        To the memory endpoint.
    o_fwd : ``Out(stream.Signature(M2SReq))``
        Forwards, to the DCOH.
    o_chk : ``Out(stream.Signature(LINE_ADDR_BITS))``
        Device line address of a checked message, to the DCOH.
    i_chk : ``In(stream.Signature(CHK_RSP))``
        The DCOH's answers, in check order.
    enable : ``In(1)``
    hdm_base : ``In(LINE_ADDR_BITS)``, hdm_size : ``In(LINE_ADDR_BITS + 1)``
        The endpoint's HDM decoder (host line address of device line 0; lines, where
        bit 46 set means the whole space); with the parameter ``pmem_lines`` (lines of
        device memory) the router decodes exactly as the endpoint does
        (:func:`~hw.cxl.mem_endpoint.hdm_decode`).
    o_busy : ``Out(1)``
        A message or a check is in the router (from the cycle after its handshake).
    """

    def __init__(self, *, pmem_lines: int):
        if not is_int(pmem_lines) or pmem_lines < 1:
            raise ValueError(f"pmem_lines must be a positive integer, not {pmem_lines!r}")
        self._pmem_lines = pmem_lines
        super().__init__({
            "i_req": In(stream.Signature(M2SReq)),
            "i_rwd": In(stream.Signature(M2SRwD)),
            "o_req": Out(stream.Signature(M2SReq)),
            "o_rwd": Out(stream.Signature(M2SRwD)),
            "o_fwd": Out(stream.Signature(M2SReq)),
            "o_chk": Out(stream.Signature(LINE_ADDR_BITS)),
            "i_chk": In(stream.Signature(CHK_RSP)),
            "enable": In(1),
            "hdm_base": In(LINE_ADDR_BITS),
            "hdm_size": In(LINE_ADDR_BITS + 1),
            "o_busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.order = order = SyncFIFOBuffered(width=1, depth=_ORDER_DEPTH)

        def decode(line, name):
            """(in HDM range, device line) of host line address ``line``: the
            endpoint's own decoder, so exactly the lines it serves are checked."""
            in_range, offset = hdm_decode(m, line, self.hdm_base, self.hdm_size,
                                          self._pmem_lines, name)
            return in_range, offset[:LINE_ADDR_BITS]

        req, rwd = self.i_req.p, self.i_rwd.p
        req_range, req_line = decode(req.address[1:], "req")
        rwd_range, rwd_line = decode(rwd.address, "rwd")
        def opcode_in(opcode, *values):
            return Cat(*(opcode == v.value for v in values)).any()

        req_fwd = opcode_in(req.opcode, M2SReqOpcode.MemRdFwd, M2SReqOpcode.MemWrFwd)
        # A MemInv / MemInvNT that asks for Meta0-State Any or Shared grants the host a
        # copy (Cmp-E / Cmp-S) exactly as a read does, so it takes the same check.
        inv_claim = (opcode_in(req.opcode, M2SReqOpcode.MemInv, M2SReqOpcode.MemInvNT) &
                     (req.meta_field == MetaField.Meta0State) &
                     ((req.meta_value == MetaValue.Any) | (req.meta_value == MetaValue.Shared)))
        req_chk = req_range & (opcode_in(req.opcode, M2SReqOpcode.MemRd, M2SReqOpcode.MemRdData)
                               | inv_claim)
        rwd_chk = rwd_range & opcode_in(rwd.opcode, M2SRwDOpcode.MemWr, M2SRwDOpcode.MemWrPtl)

        channels = []
        for name, src, dst, layout, chk, line in (
                ("req", self.i_req, self.o_req, M2SReq, req_chk, req_line),
                ("rwd", self.i_rwd, self.o_rwd, M2SRwD, rwd_chk, rwd_line)):
            fifo = SyncFIFOBuffered(width=layout.size + 1, depth=_DEPTH)
            m.submodules[f"{name}_queue"] = fifo
            answered = Signal(range(_DEPTH + 1), name=f"{name}_answered")
            head_chk = fifo.r_data[-1]
            go = fifo.r_rdy & (~head_chk | answered.any())
            channels.append((name, src, dst, fifo, chk, line, answered, head_chk, go))

        with m.If(~self.enable):
            m.d.comb += [
                self.o_req.valid.eq(self.i_req.valid),
                self.o_req.p.eq(self.i_req.p),
                self.i_req.ready.eq(self.o_req.ready),
                self.o_rwd.valid.eq(self.i_rwd.valid),
                self.o_rwd.p.eq(self.i_rwd.p),
                self.i_rwd.ready.eq(self.o_rwd.ready),
            ]
        with m.Else():
            # Check port: Req first, RwD when Req has nothing to check.
            (_, _, _, req_q, _, _, _, _, _), (_, _, _, rwd_q, _, _, _, _, _) = channels
            req_wants = self.i_req.valid & req_chk & req_q.w_rdy
            rwd_wants = self.i_rwd.valid & rwd_chk & rwd_q.w_rdy
            chk_room = self.o_chk.ready & order.w_rdy
            # A check that waits for ``o_chk.ready`` keeps the port (its message holds
            # on the link), so the check's payload holds until the transfer.
            chk_lock = Signal()
            chk_who = Signal()
            pick_rwd = Signal()
            m.d.comb += [
                pick_rwd.eq(Mux(chk_lock, chk_who, ~req_wants)),
                self.o_chk.valid.eq((req_wants | rwd_wants) & order.w_rdy),
                self.o_chk.p.eq(Mux(pick_rwd, rwd_line, req_line)),
                order.w_data.eq(pick_rwd),
                order.w_en.eq(self.o_chk.valid & self.o_chk.ready),
            ]
            m.d.sync += [chk_lock.eq(self.o_chk.valid & ~self.o_chk.ready),
                         chk_who.eq(pick_rwd)]

            # M2S Req: forwards to the DCOH, everything else into the queue.
            with m.If(req_fwd):
                m.d.comb += [
                    self.o_fwd.valid.eq(self.i_req.valid),
                    self.i_req.ready.eq(self.o_fwd.ready),
                ]
            with m.Else():
                m.d.comb += [
                    self.i_req.ready.eq(req_q.w_rdy & (~req_chk | (chk_room & ~pick_rwd))),
                    req_q.w_en.eq(self.i_req.valid & self.i_req.ready),
                ]
            m.d.comb += [
                self.o_fwd.p.eq(self.i_req.p),
                req_q.w_data.eq(self.i_req.p.as_value() | (req_chk << M2SReq.size)),
                self.i_rwd.ready.eq(rwd_q.w_rdy & (~rwd_chk | (chk_room & pick_rwd))),
                rwd_q.w_en.eq(self.i_rwd.valid & self.i_rwd.ready),
                rwd_q.w_data.eq(self.i_rwd.p.as_value() | (rwd_chk << M2SRwD.size)),
            ]

            # Queue heads leave once answered (answers come in check order).
            m.d.comb += [
                self.i_chk.ready.eq(order.r_rdy),
                order.r_en.eq(self.i_chk.valid & order.r_rdy),
            ]
            for index, (_, _, dst, fifo, _, _, answered, head_chk, go) in enumerate(channels):
                layout_size = len(fifo.r_data) - 1
                took = dst.valid & dst.ready & head_chk
                arrived = self.i_chk.valid & self.i_chk.ready & (order.r_data == index)
                with m.If(arrived & ~took):
                    m.d.sync += answered.eq(answered + 1)
                with m.Elif(took & ~arrived):
                    m.d.sync += answered.eq(answered - 1)
                m.d.comb += [
                    dst.valid.eq(go),
                    dst.p.eq(fifo.r_data[:layout_size]),
                    fifo.r_en.eq(go & dst.ready),
                ]

        # ``level``, not ``r_rdy``: a buffered FIFO holds a new item one cycle before its
        # output register shows it.
        busy = order.level.any()
        for _, _, _, fifo, _, _, answered, _, _ in channels:
            busy = busy | fifo.level.any() | answered.any()
        m.d.comb += self.o_busy.eq(busy)
        return m
