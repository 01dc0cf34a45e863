"""Decoding of the CXL.mem endpoint's M2S requests. See :class:`M2SDecoder`."""

from __future__ import annotations

from functools import reduce

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import DeviceConfig
from .endpoint_layouts import (
    ECHOED,
    MemError,
    check_config,
    hdm_decode,
    request_layout,
    xor_fold,
)
from .messages import (
    LINE_ADDR_BITS,
    M2SReq,
    M2SReqOpcode,
    M2SRwD,
    M2SRwDOpcode,
    MetaField,
    MetaValue,
    NDROpcode,
)

__all__ = ["M2SDecoder"]


def _ndr_for_meta(meta_field, meta_value):
    # The NDR grants the cache state the host asked for with MetaValue. With MetaField
    # No-Op (or a reserved MetaField) MetaValue is reserved and ignored, so nothing is
    # granted: Cmp.
    grant = Mux(meta_value == MetaValue.Shared.value, NDROpcode.CmpS.value,
                Mux(meta_value == MetaValue.Any.value, NDROpcode.CmpE.value,
                    NDROpcode.Cmp.value))
    return Mux(meta_field == MetaField.Meta0State.value, grant, NDROpcode.Cmp.value)


class M2SDecoder(wiring.Component):
    """Decodes the M2S Req and RwD channels of the CXL.mem endpoint: HDM window, opcode
    class, error bits, NDR opcode, meta-state action, device line and ordering bucket.

    Each channel passes straight through (``o_*.valid = i_*.valid``, ``i_*.ready =
    o_*.ready``, no register): zero latency, one request per cycle per channel,
    backpressure passed back unchanged, no state (reset does nothing). The payload is
    the request decoded as ``docs/mem-endpoint.md`` tabulates
    (:func:`~hw.cxl.endpoint_layouts.request_layout`): ``to_pmem`` for an in-range
    MemRd / MemRdData and an in-range MemWr / MemWrPtl that is neither poisoned nor
    empty; ``immediate`` for every other Req that gets an answer (out-of-range reads,
    MemInv / MemInvNT, MemClnEvct, reserved opcodes) and every other RwD; neither for
    MemSpecRd and the forwards. ``ndr_opcode`` is the NDR the request gets (MemRdData
    Cmp-E; MemRd, MemInv and MemInvNT Cmp-S / Cmp-E / Cmp from MetaValue with MetaField
    Meta0-State, else Cmp; BIConflict BI-ConflictAck; everything else Cmp). ``nxm``
    marks an out-of-range read, answered by MemData-NXM alone. ``meta_store`` marks an
    in-range served request with MetaField Meta0-State (and every in-range MemRdData),
    ``meta_promote`` a MemRdData. ``dev_line`` is the line's offset in the HDM window
    and ``bucket`` its ordering bucket (XOR fold of ``dev_line``); ``wstrb`` is all ones
    for MemWr and the byte enables for MemWrPtl.

    Parameters
    ----------
    config:
        The :class:`~hw.config.DeviceConfig` (``pmem_size``, ``hazard_buckets``).

    Members
    -------
    i_req: ``In(stream.Signature(M2SReq))``
        M2S Req channel. The line address is ``address[1:]``.
    i_rwd: ``In(stream.Signature(M2SRwD))``
        M2S RwD channel.
    o_req, o_rwd: ``Out(stream.Signature(request_layout(config)))``
        The two channels, decoded.
    hdm_base: ``In(LINE_ADDR_BITS)``
        HDM base as a host line address.
    hdm_size: ``In(LINE_ADDR_BITS + 1)``
        HDM size in lines; lines beyond ``config.pmem_lines`` are outside the HDM.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`~hw.config.DeviceConfig`.
    """

    def __init__(self, *, config: DeviceConfig):
        self._config = check_config(config)
        layout = request_layout(config)
        super().__init__({
            "i_req": In(stream.Signature(M2SReq)),
            "i_rwd": In(stream.Signature(M2SRwD)),
            "o_req": Out(stream.Signature(layout)),
            "o_rwd": Out(stream.Signature(layout)),
            "hdm_base": In(LINE_ADDR_BITS),
            "hdm_size": In(LINE_ADDR_BITS + 1),
        })

    @property
    def config(self) -> DeviceConfig:
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        req, rwd = self.i_req.p, self.i_rwd.p
        out_req, out_rwd = self.o_req.p, self.o_rwd.p
        for src, dst in ((self.i_req, self.o_req), (self.i_rwd, self.o_rwd)):
            m.d.comb += [dst.valid.eq(src.valid), src.ready.eq(dst.ready),
                         *(dst.p[name].eq(src.p[name]) for name in ECHOED),
                         dst.p.opcode.eq(src.p.opcode)]

        def decode(line, dst, name):
            in_range, offset = hdm_decode(m, line, self.hdm_base, self.hdm_size,
                                          cfg.pmem_lines, name)
            dev_line = offset[:len(dst.dev_line)]
            m.d.comb += [dst.line.eq(line), dst.dev_line.eq(dev_line),
                         dst.bucket.eq(xor_fold(dev_line, len(dst.bucket)))]
            return in_range

        # Req.
        r_in = decode(req.address[1:], out_req, "req")
        r_is = {op: req.opcode == op.value for op in M2SReqOpcode}
        r_is_rd = r_is[M2SReqOpcode.MemRd] | r_is[M2SReqOpcode.MemRdData]
        r_is_inv = r_is[M2SReqOpcode.MemInv] | r_is[M2SReqOpcode.MemInvNT]
        r_is_evct = r_is[M2SReqOpcode.MemClnEvct]
        r_is_rsvd = ~reduce(lambda a, b: a | b, r_is.values())
        r_is_rdd = r_is[M2SReqOpcode.MemRdData]
        r_meta0 = req.meta_field == MetaField.Meta0State.value
        m.d.comb += [
            out_req.to_pmem.eq(r_is_rd & r_in),
            out_req.immediate.eq((r_is_rd & ~r_in) | r_is_inv | r_is_evct | r_is_rsvd),
            out_req.errors[MemError.HDM_RANGE].eq((r_is_rd | r_is_inv | r_is_evct) & ~r_in),
            out_req.errors[MemError.RSVD_OPCODE].eq(r_is_rsvd),
            out_req.errors[MemError.UNEXPECTED_FWD].eq(
                r_is[M2SReqOpcode.MemRdFwd] | r_is[M2SReqOpcode.MemWrFwd]),
            out_req.ndr_opcode.eq(
                Mux(r_is_rdd, NDROpcode.CmpE.value,
                    Mux(r_is[M2SReqOpcode.MemRd] | r_is_inv,
                        _ndr_for_meta(req.meta_field, req.meta_value), NDROpcode.Cmp.value))),
            out_req.nxm.eq(r_is_rd & ~r_in),
            out_req.meta_store.eq(r_in & (((r_is[M2SReqOpcode.MemRd] | r_is_inv | r_is_evct)
                                           & r_meta0) | r_is_rdd)),
            out_req.meta_promote.eq(r_is_rdd),
        ]

        # RwD.
        w_in = decode(rwd.address, out_rwd, "rwd")
        w_is = {op: rwd.opcode == op.value for op in M2SRwDOpcode}
        w_is_ptl = w_is[M2SRwDOpcode.MemWrPtl]
        w_is_wr = w_is[M2SRwDOpcode.MemWr] | w_is_ptl
        w_empty = w_is_ptl & ~rwd.byte_enable.any()
        w_to_pmem = Signal()
        m.d.comb += [
            w_to_pmem.eq(w_is_wr & w_in & ~rwd.poison & ~w_empty),
            out_rwd.to_pmem.eq(w_to_pmem),
            out_rwd.immediate.eq(~w_to_pmem),
            out_rwd.errors[MemError.HDM_RANGE].eq(w_is_wr & ~w_in),
            out_rwd.errors[MemError.RSVD_OPCODE].eq(
                ~reduce(lambda a, b: a | b, w_is.values())),
            out_rwd.errors[MemError.POISON].eq(w_is_wr & rwd.poison),
            out_rwd.errors[MemError.EMPTY_PTL].eq(w_empty),
            out_rwd.ndr_opcode.eq(Mux(w_is[M2SRwDOpcode.BIConflict],
                                      NDROpcode.BIConflictAck.value, NDROpcode.Cmp.value)),
            out_rwd.meta_store.eq(w_to_pmem & (rwd.meta_field == MetaField.Meta0State.value)),
            out_rwd.data.eq(rwd.data),
            out_rwd.wstrb.eq(Mux(w_is_ptl, rwd.byte_enable, (1 << len(rwd.byte_enable)) - 1)),
        ]
        return m
