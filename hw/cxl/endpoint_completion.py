"""Completion of the CXL.mem endpoint's requests. See :class:`EndpointCompletion`."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..bus.axi import AxiResp
from ..config import LINE_BITS, DeviceConfig
from .endpoint_layouts import (
    ECHOED,
    ErrorChannel,
    ErrorInfo,
    ImmEntry,
    check_config,
    issue_layout,
    ordering_event_layout,
    pmem_b_layout,
    pmem_r_layout,
)
from .messages import S2MDRS, S2MNDR, DRSOpcode

__all__ = ["EndpointCompletion"]

_SOURCES = ("R", "B", "IMM")


class EndpointCompletion(wiring.Component):
    """Turns PMEM read data, PMEM write responses and immediate responses into S2M DRS
    and NDR messages, with each request's context kept by slot since it was issued.

    ``i_issue`` writes a request's context (echoed fields, NDR opcode, opcode, bucket,
    device line) into the slot table at its slot; its R / B beat (ID = slot) reads it
    back. Stage S0 takes one of {R beat, B beat, immediate entry} per cycle,
    round-robin (after reset B has priority, then the immediate FIFO, then R), and
    reads the slot table; stage S1 holds it until every output register it needs can
    load: an R beat loads DRS MemData (Poison set for an RRESP other than OKAY) and the
    NDR, a B beat the NDR, an immediate entry the NDR, or DRS MemData-NXM alone (all-ones
    data, Poison set; CXL 3.x Table 3-53) for an out-of-range read. An R / B beat taken
    in cycle *t* has its responses valid in *t* + 2. S0 takes nothing while S1 waits,
    so backpressure on ``o_ndr`` / ``o_drs`` reaches ``i_r``, ``i_b`` and ``i_imm``.
    DevLoad is ``i_dev_load`` when a register loads. The slot of a taken R / B beat is
    released on ``o_release`` in that cycle, and its access leaves the ordering table
    on ``o_retire`` the cycle after, when ``o_pmem_error`` also reports a response
    other than OKAY. ``o_ndr`` and ``o_drs`` are registers that obey the stream rules.
    Reset (synchronous) empties S1 and the registers; the slot table keeps its data.

    Parameters
    ----------
    config:
        The :class:`~hw.config.DeviceConfig` (``max_tags``, ``pmem_size``,
        ``hazard_buckets``).

    Members
    -------
    i_issue: ``In(stream.Signature(issue_layout(config), always_ready=True))``
        A request sent to PMEM: its slot and completion context.
    i_r: ``In(stream.Signature(pmem_r_layout(config)))``
        PMEM read data (ID = slot).
    i_b: ``In(stream.Signature(pmem_b_layout(config)))``
        PMEM write responses (ID = slot).
    i_imm: ``In(stream.Signature(ImmEntry))``
        Immediate responses.
    i_dev_load: ``In(2)``
        DevLoad to send.
    o_ndr: ``Out(stream.Signature(S2MNDR))``
    o_drs: ``Out(stream.Signature(S2MDRS))``
        S2M responses.
    o_release: ``Out(stream.Signature(config.tag_index_width, always_ready=True))``
        A slot whose R / B beat was taken.
    o_retire: ``Out(stream.Signature(ordering_event_layout(config), always_ready=True))``
        A PMEM access leaving the ordering table.
    o_pmem_error: ``Out(stream.Signature(ErrorInfo, always_ready=True))``
        A PMEM response other than OKAY: channel, the request's opcode, device line.
    o_busy: ``Out(1)``
        A response is in S1 or in an output register.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`~hw.config.DeviceConfig`.
    """

    def __init__(self, *, config: DeviceConfig):
        self._config = check_config(config)
        super().__init__({
            "i_issue": In(stream.Signature(issue_layout(config), always_ready=True)),
            "i_r": In(stream.Signature(pmem_r_layout(config))),
            "i_b": In(stream.Signature(pmem_b_layout(config))),
            "i_imm": In(stream.Signature(ImmEntry)),
            "i_dev_load": In(2),
            "o_ndr": Out(stream.Signature(S2MNDR)),
            "o_drs": Out(stream.Signature(S2MDRS)),
            "o_release": Out(stream.Signature(config.tag_index_width, always_ready=True)),
            "o_retire": Out(stream.Signature(ordering_event_layout(config), always_ready=True)),
            "o_pmem_error": Out(stream.Signature(ErrorInfo, always_ready=True)),
            "o_busy": Out(1),
        })

    @property
    def config(self) -> DeviceConfig:
        return self._config

    def elaborate(self, platform):
        m = Module()
        r, b, imm, ndr, drs = self.i_r, self.i_b, self.i_imm, self.o_ndr, self.o_drs
        issue = self.i_issue
        # A depth of at least 2 keeps the address at least one bit wide (a zero-width
        # address is not legal Verilog); only max_tags = 1 pays for the unused entry.
        m.submodules.slots = slots = Memory(shape=issue.p.entry.shape(),
                                            depth=max(self._config.max_tags, 2), init=[])
        slot_write = slots.write_port()
        # Not transparent: an ID is read (its R / B beat) at least two cycles after the
        # slot was written, and a slot is reissued only after its read.
        slot_read = slots.read_port(domain="sync", transparent_for=())
        m.d.comb += [slot_write.en.eq(issue.valid), slot_write.addr.eq(issue.p.slot),
                     slot_write.data.eq(issue.p.entry)]

        # --- S1: one response, loaded into the registers when all it needs are free --
        s1_valid = Signal()
        s1_source = {name: Signal(name=f"s1_is_{name.lower()}") for name in _SOURCES}
        s1_released = Signal()  # first cycle in S1 of an R / B beat: slot data valid
        s1_resp = Signal(2)
        s1_data = Signal(LINE_BITS)
        s1_imm = Signal(ImmEntry)
        s1_is_r, s1_is_b, s1_is_imm = (s1_source[name] for name in _SOURCES)
        s1_nxm = s1_is_imm & s1_imm.nxm
        s1_needs_drs = s1_is_r | s1_nxm
        s1_needs_ndr = ~s1_nxm      # MemData-NXM is the only response of its read
        s1_advance = Signal()
        s0_take = Signal()
        m.d.comb += [
            s1_advance.eq(s1_valid & (~s1_needs_ndr | ~ndr.valid | ndr.ready) &
                          (~s1_needs_drs | ~drs.valid | drs.ready)),
            s0_take.eq(~s1_valid | s1_advance),
            self.o_busy.eq(s1_valid | ndr.valid | drs.valid),
        ]

        # --- S0: round robin over R, B and the immediate FIFO ----------------------
        offered = {"R": r.valid, "B": b.valid, "IMM": imm.valid}
        grant = {name: Signal(name=f"grant_{name.lower()}") for name in _SOURCES}
        with m.FSM(name="last_granted"):
            for k, last in enumerate(_SOURCES):
                with m.State(last):
                    order = [_SOURCES[(k + 1 + j) % 3] for j in range(3)]
                    with m.If(offered[order[0]]):
                        m.d.comb += grant[order[0]].eq(1)
                    with m.Elif(offered[order[1]]):
                        m.d.comb += grant[order[1]].eq(1)
                    with m.Elif(offered[order[2]]):
                        m.d.comb += grant[order[2]].eq(1)
                    for name in _SOURCES:
                        with m.If(s0_take & grant[name]):
                            m.next = name
        released = s0_take & (grant["R"] | grant["B"])
        released_slot = Mux(grant["B"], b.p.id, r.p.id)
        m.d.comb += [
            r.ready.eq(s0_take & grant["R"]),
            b.ready.eq(s0_take & grant["B"]),
            imm.ready.eq(s0_take & grant["IMM"]),
            slot_read.en.eq(s0_take),
            slot_read.addr.eq(released_slot),
            self.o_release.valid.eq(released),
            self.o_release.p.eq(released_slot),
        ]
        m.d.sync += s1_released.eq(released)
        with m.If(s0_take):
            m.d.sync += [
                s1_valid.eq(grant["R"] | grant["B"] | grant["IMM"]),
                *(s1_source[name].eq(grant[name]) for name in _SOURCES),
                s1_resp.eq(Mux(grant["B"], b.p.resp, r.p.resp)),
                s1_data.eq(r.p.data),
                s1_imm.eq(imm.p),
            ]

        # --- Responses -------------------------------------------------------------
        slot = slot_read.data
        s1_bad_resp = s1_resp != AxiResp.OKAY
        echoed = {name: Mux(s1_is_imm, s1_imm[name], slot[name]) for name in ECHOED}
        with m.If(s1_advance & s1_needs_ndr):
            m.d.sync += [
                ndr.valid.eq(1),
                ndr.p.opcode.eq(Mux(s1_is_imm, s1_imm.ndr_opcode, slot.ndr_opcode)),
                *(ndr.p[name].eq(value) for name, value in echoed.items()),
                ndr.p.dev_load.eq(self.i_dev_load),
            ]
        with m.Elif(ndr.ready):
            m.d.sync += ndr.valid.eq(0)
        with m.If(s1_advance & s1_needs_drs):
            m.d.sync += [
                drs.valid.eq(1),
                drs.p.opcode.eq(Mux(s1_is_imm, DRSOpcode.MemDataNXM.value,
                                    DRSOpcode.MemData.value)),
                *(drs.p[name].eq(value) for name, value in echoed.items()),
                # MemData-NXM: all-ones data, Poison set (this device always reports
                # poison; CXL 3.x Table 3-53).
                drs.p.poison.eq((s1_is_r & s1_bad_resp) | s1_is_imm),
                drs.p.dev_load.eq(self.i_dev_load),
                drs.p.rsvd.eq(0),
                drs.p.data.eq(Mux(s1_is_imm, (1 << LINE_BITS) - 1, s1_data)),
            ]
        with m.Elif(drs.ready):
            m.d.sync += drs.valid.eq(0)

        retire, error = self.o_retire, self.o_pmem_error
        m.d.comb += [
            retire.valid.eq(s1_released),
            retire.p.bucket.eq(slot.bucket),
            retire.p.write.eq(s1_is_b),
            error.valid.eq(s1_released & s1_bad_resp),
            error.p.channel.eq(Mux(s1_is_r, ErrorChannel.PMEM_R, ErrorChannel.PMEM_B)),
            error.p.opcode.eq(slot.opcode),
            error.p.address.eq(slot.dev_line),
        ]
        return m
