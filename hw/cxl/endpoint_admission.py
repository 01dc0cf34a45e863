"""Acceptance of the CXL.mem endpoint's M2S requests. See :class:`EndpointAdmission`."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..config import DeviceConfig
from .endpoint_layouts import (
    ECHOED,
    IMM_FIFO_DEPTH,
    ErrorChannel,
    ImmEntry,
    M2SError,
    PmemWBeat,
    check_config,
    issue_layout,
    ordering_event_layout,
    pmem_request_layout,
    request_layout,
)
from .meta_state_store import MetaStateStore

__all__ = ["EndpointAdmission"]


class EndpointAdmission(wiring.Component):
    """Accepts at most one decoded M2S request per cycle and sends it on: to PMEM (AR,
    or AW and W) with a slot and its completion context, or to the immediate-response
    FIFO.

    A request is accepted in the cycle it is offered if what it needs is free: a PMEM
    read needs a slot on ``i_slot``, no write in flight in its bucket, no PMEM write
    waiting at the head of ``i_rwd`` in its bucket (so that a host reading a line
    cannot starve a write to it) and the AR register; a PMEM write a slot, nothing in
    flight in its bucket and the AW and W registers; an immediate response a FIFO
    entry; MemSpecRd and the forwards nothing. ``ready`` is computed in the cycle from
    the payload. When both channels can go they alternate, starting with Req after
    reset; when one can, it goes. An accepted PMEM request takes the offered slot,
    loads ``o_ar`` (``o_aw`` and ``o_w``) for the next cycle, and is reported in the
    same cycle on ``o_issue`` and ``o_order``; an immediate one enters the
    :data:`~hw.cxl.endpoint_layouts.IMM_FIFO_DEPTH`-entry FIFO, out on ``o_imm`` two
    cycles later at the earliest. ``o_error`` reports an accepted request's error bits
    in the cycle of its handshake. ``o_ar``, ``o_aw``, ``o_w`` and ``o_imm`` obey the
    stream rules. Reset (synchronous) empties the registers and the FIFO.

    With ``config.meta_state`` the line's Meta0-State is read and updated at
    acceptance (:class:`~hw.cxl.meta_state_store.MetaStateStore`) and a request that
    updates it carries the state before it as its MetaValue.

    Parameters
    ----------
    config:
        The :class:`~hw.config.DeviceConfig`.

    Members
    -------
    i_req, i_rwd: ``In(stream.Signature(request_layout(config)))``
        Decoded M2S Req and RwD (:class:`~hw.cxl.m2s_decoder.M2SDecoder`).
    i_slot: ``In(stream.Signature(config.tag_index_width))``
        A free slot (:class:`~hw.cxl.slot_tracker.SlotTracker`).
    i_read_busy, i_write_busy: ``In(config.hazard_buckets)``
        Buckets with a read / write in flight (:class:`~hw.cxl.ordering_table.OrderingTable`).
    o_ar, o_aw: ``Out(stream.Signature(pmem_request_layout(config)))``
        PMEM read / write address: the slot as ID and the device line.
    o_w: ``Out(stream.Signature(PmemWBeat))``
        PMEM write data (``strb`` all ones for MemWr).
    o_imm: ``Out(stream.Signature(ImmEntry))``
        Immediate responses.
    o_issue: ``Out(stream.Signature(issue_layout(config), always_ready=True))``
        A request sent to PMEM: its slot and its completion context.
    o_order: ``Out(stream.Signature(ordering_event_layout(config), always_ready=True))``
        A PMEM access entering the ordering table.
    o_error: ``Out(stream.Signature(M2SError, always_ready=True))``
        An accepted request with errors.
    o_busy: ``Out(1)``
        The immediate-response FIFO holds an entry.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`~hw.config.DeviceConfig`.
    """

    def __init__(self, *, config: DeviceConfig):
        self._config = check_config(config)
        request = request_layout(config)
        super().__init__({
            "i_req": In(stream.Signature(request)),
            "i_rwd": In(stream.Signature(request)),
            "i_slot": In(stream.Signature(config.tag_index_width)),
            "i_read_busy": In(config.hazard_buckets),
            "i_write_busy": In(config.hazard_buckets),
            "o_ar": Out(stream.Signature(pmem_request_layout(config))),
            "o_aw": Out(stream.Signature(pmem_request_layout(config))),
            "o_w": Out(stream.Signature(PmemWBeat)),
            "o_imm": Out(stream.Signature(ImmEntry)),
            "o_issue": Out(stream.Signature(issue_layout(config), always_ready=True)),
            "o_order": Out(stream.Signature(ordering_event_layout(config), always_ready=True)),
            "o_error": Out(stream.Signature(M2SError, always_ready=True)),
            "o_busy": Out(1),
        })

    @property
    def config(self) -> DeviceConfig:
        return self._config

    def elaborate(self, platform):
        m = Module()
        req, rwd, slot = self.i_req, self.i_rwd, self.i_slot
        ar, aw, w, imm = self.o_ar, self.o_aw, self.o_w, self.o_imm
        m.submodules.imm_fifo = imm_fifo = SyncFIFOBuffered(width=ImmEntry.size,
                                                            depth=IMM_FIFO_DEPTH)
        m.d.comb += [imm.valid.eq(imm_fifo.r_rdy), imm.p.eq(imm_fifo.r_data),
                     imm_fifo.r_en.eq(imm.ready), self.o_busy.eq(imm_fifo.level.any())]

        # --- What each channel's request needs ------------------------------------
        # A write waiting at the head of RwD also blocks reads of its bucket: otherwise a
        # host that keeps reading a line would keep the write from ever being accepted
        # (writes need a bucket with nothing in flight), and every write behind it too.
        write_waiting = rwd.valid & rwd.p.to_pmem
        read_order_ok = (~(self.i_write_busy >> req.p.bucket)[0] &
                         ~(write_waiting & (req.p.bucket == rwd.p.bucket)))
        write_order_ok = ~((self.i_read_busy | self.i_write_busy) >> rwd.p.bucket)[0]
        ar_free = ~ar.valid | ar.ready
        aw_w_free = (~aw.valid | aw.ready) & (~w.valid | w.ready)
        req_can = Signal()
        rwd_can = Signal()
        m.d.comb += [
            req_can.eq(req.valid & Mux(req.p.to_pmem, slot.valid & read_order_ok & ar_free,
                                       ~req.p.immediate | imm_fifo.w_rdy)),
            rwd_can.eq(rwd.valid & Mux(rwd.p.to_pmem,
                                       slot.valid & write_order_ok & aw_w_free,
                                       ~rwd.p.immediate | imm_fifo.w_rdy)),
        ]

        # --- Round robin: at most one handshake per cycle -------------------------
        prefer_rwd = Signal()
        take_req = req_can & (~rwd_can | ~prefer_rwd)
        take_rwd = rwd_can & (~req_can | prefer_rwd)
        m.d.comb += [req.ready.eq(take_req), rwd.ready.eq(take_rwd)]
        with m.If(take_req):
            m.d.sync += prefer_rwd.eq(1)
        with m.Elif(take_rwd):
            m.d.sync += prefer_rwd.eq(0)

        accepted = Signal(request_layout(self._config))
        taken = Signal()
        to_pmem = Signal()
        m.d.comb += [
            accepted.eq(Mux(take_rwd, rwd.p, req.p)),
            taken.eq(take_req | take_rwd),
            to_pmem.eq(taken & accepted.to_pmem),
            slot.ready.eq(to_pmem),
        ]
        echoed = {name: accepted[name] for name in ECHOED}
        if self._config.meta_state:
            m.submodules.meta_state = meta = MetaStateStore(lines=self._config.pmem_lines)
            store = taken & accepted.meta_store
            m.d.comb += [meta.i_line.eq(accepted.dev_line), meta.i_store.eq(store),
                         meta.i_promote.eq(accepted.meta_promote),
                         meta.i_value.eq(accepted.meta_value)]
            echoed["meta_value"] = Mux(store, meta.o_state, accepted.meta_value)

        # --- Where the request goes -----------------------------------------------
        issue, entry, order, error = self.o_issue, self.o_issue.p.entry, self.o_order, self.o_error
        imm_entry = Signal(ImmEntry)
        m.d.comb += [
            issue.valid.eq(to_pmem),
            issue.p.slot.eq(slot.p),
            *(entry[name].eq(value) for name, value in echoed.items()),
            *(entry[name].eq(accepted[name])
              for name in ("ndr_opcode", "opcode", "bucket", "dev_line")),
            order.valid.eq(to_pmem),
            order.p.bucket.eq(accepted.bucket),
            order.p.write.eq(take_rwd),
            imm_fifo.w_en.eq(taken & accepted.immediate),
            imm_entry.ndr_opcode.eq(accepted.ndr_opcode),
            imm_entry.nxm.eq(accepted.nxm),
            *(imm_entry[name].eq(value) for name, value in echoed.items()),
            imm_fifo.w_data.eq(imm_entry),
            error.valid.eq(taken & accepted.errors.any()),
            error.p.errors.eq(accepted.errors),
            error.p.info.channel.eq(Mux(take_rwd, ErrorChannel.M2S_RWD, ErrorChannel.M2S_REQ)),
            error.p.info.opcode.eq(accepted.opcode),
            error.p.info.address.eq(accepted.line),
        ]
        # AR, AW and W: registers loaded at acceptance (acceptance implies they are free).
        with m.If(to_pmem & ~take_rwd):
            m.d.sync += [ar.valid.eq(1), ar.p.id.eq(slot.p), ar.p.line.eq(accepted.dev_line)]
        with m.Elif(ar.ready):
            m.d.sync += ar.valid.eq(0)
        with m.If(to_pmem & take_rwd):
            m.d.sync += [aw.valid.eq(1), aw.p.id.eq(slot.p), aw.p.line.eq(accepted.dev_line),
                         w.valid.eq(1), w.p.data.eq(accepted.data),
                         w.p.strb.eq(accepted.wstrb)]
        with m.Else():
            with m.If(aw.ready):
                m.d.sync += aw.valid.eq(0)
            with m.If(w.ready):
                m.d.sync += w.valid.eq(0)
        return m
