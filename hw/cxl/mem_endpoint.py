"""CXL.mem endpoint: M2S requests in, S2M completions out, device memory over AXI4.

See :class:`MemEndpoint` and ``docs/mem-endpoint.md``.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..bus.axi import AXI4Signature, AxiBurst
from ..config import DeviceConfig
from .endpoint_admission import EndpointAdmission
from .endpoint_completion import EndpointCompletion
from .endpoint_layouts import (
    IMM_FIFO_DEPTH,
    LINE_SHIFT,
    ErrorChannel,
    ErrorInfo,
    MemError,
    PerfEvents,
    check_config,
    dev_load_thresholds,
    hdm_decode,
)
from .m2s_decoder import M2SDecoder
from .messages import LINE_ADDR_BITS, S2MDRS, S2MNDR, M2SReq, M2SRwD
from .ordering_table import OrderingTable
from .slot_tracker import SlotTracker

__all__ = [
    "IMM_FIFO_DEPTH",
    "ErrorChannel",
    "ErrorInfo",
    "MemEndpoint",
    "MemError",
    "PerfEvents",
    "dev_load_thresholds",
    "hdm_decode",
]


class MemEndpoint(wiring.Component):
    """CXL.mem endpoint of the Type-2 device: decodes HDM requests, keeps up to
    ``config.max_tags`` of them in flight on the PMEM AXI4 port and completes them.

    Every M2S request is accepted exactly once and answered as
    ``docs/mem-endpoint.md`` tabulates: in-range MemRd / MemRdData read one line and
    return S2M DRS MemData *and* an S2M NDR (``docs/cxl-encodings.md``, "Flows": reads
    of HDM-D memory return an NDR granting the cache state as well as
    the DRS data); with MetaField Meta0-State MemRd's NDR is Cmp-S / Cmp-E / Cmp for a
    requested MetaValue of Shared / Any / Invalid (reserved ``01`` is treated as
    Invalid); with MetaField No-Op (or reserved) MetaValue is reserved and ignored and
    the NDR is Cmp; MemRdData's is always Cmp-E. MemWr / MemWrPtl write one line (``wstrb``
    all ones, or the 64 byte enables) and complete with NDR Cmp only after the AXI B
    response, because a write is durable only then (``docs/architecture.md``, "PMEM port"). MemInv /
    MemInvNT answer NDR with the same MetaField / MetaValue rule and MemClnEvct NDR Cmp,
    without touching
    memory (the device keeps no copy of host-owned lines). BIConflict answers NDR
    BI-ConflictAck. MemSpecRd is accepted and dropped: the specification says it "gets no
    completion, may be dropped" and this device has nothing to prefetch into. The
    echoed fields are Tag, LD-ID, MetaField and MetaValue; DevLoad is the device's view
    of its queue occupancy (``docs/cxl-encodings.md``, "DevLoad"). With ``config.meta_state``
    the endpoint stores each line's Meta0-State (2 bits, Any at power-on, kept over a
    reset): an in-range request it serves with MetaField Meta0-State stores its
    MetaValue, MemRdData (whatever its MetaField) moves the line from I to A, and the
    responses carry the state before it instead of the echo
    (``docs/mem-endpoint.md``, "Meta state").

    Bad input gets a defined response, sets one bit of ``o_err_set`` per error kind and
    never touches memory: an out-of-HDM read answers a single DRS MemData-NXM in
    place of DRS and NDR, with all-ones data and Poison set (CXL 3.x Table 3-53; the
    device always reports poison); out-of-HDM writes, reserved opcodes, poisoned writes and
    MemWrPtl without byte enables answer NDR Cmp; MemRdFwd / MemWrFwd get no answer
    (no CXL.cache request of this device can be outstanding; ``docs/dcoh.md``,
    ``docs/cxl-encodings.md``, "Flows"). One request may set several bits (a poisoned out-of-range
    write sets HDM_RANGE and POISON). An RRESP / BRESP other than OKAY still completes
    the request (DRS with Poison set, or NDR Cmp) and sets PMEM_RESP.

    Latency: a request whose M2S handshake happens in cycle 0 has its AR (or AW and W)
    valid in cycle 1; an R (B) beat taken in cycle *t* puts DRS and NDR (NDR) valid in
    cycle *t* + 2. Added latency is therefore 3 cycles on an otherwise idle endpoint.
    Immediate responses appear 4 cycles after their handshake (through a
    :data:`IMM_FIFO_DEPTH`-entry FIFO). Throughput: one M2S request accepted per cycle
    and one completion per cycle; with ``max_tags`` >= PMEM latency + 5, reads stream at
    one line per cycle. Backpressure: ``i_m2s_*.ready`` is computed in the cycle from
    the request's payload and is low while a request cannot be taken (no free slot,
    hazard on its line, AR/AW/W register still full, immediate FIFO full); the
    completion stage stalls as a whole while an output register it needs is full, and
    then deasserts ``rready`` / ``bready``. All S2M and AXI outputs are registers that
    obey the stream rules (valid never waits for ready; valid and payload hold until the
    transfer). Reset (synchronous ``rst``) empties every queue, frees every slot and
    clears the ordering table; responses to requests in flight at reset are lost, and
    the AXI subordinate must be reset with the endpoint.

    Ordering: the M2S handshake order (Req and RwD merged, at most one handshake per
    cycle, round-robin between the channels and work-conserving) is the memory order.
    A read accepted after a write of the same line returns the written data, a write
    accepted after a read of the same line does not change what that read returns, and
    writes of one line reach PMEM in acceptance order. An ordering table of
    ``config.hazard_buckets`` buckets (index: XOR-fold of the device line address)
    counts in-flight reads and writes; a read issues only when its bucket has no write
    in flight, a write only when its bucket has nothing in flight. A request leaves the
    table one cycle after its R / B beat is taken. Bucket collisions only delay.
    Completions of different requests return in PMEM response order, so out of order.

    Composed of :class:`~hw.cxl.m2s_decoder.M2SDecoder`,
    :class:`~hw.cxl.endpoint_admission.EndpointAdmission`,
    :class:`~hw.cxl.slot_tracker.SlotTracker`,
    :class:`~hw.cxl.ordering_table.OrderingTable` and
    :class:`~hw.cxl.endpoint_completion.EndpointCompletion`
    (``docs/mem-endpoint.md``, "Micro-architecture").

    Parameters
    ----------
    config:
        The :class:`~hw.config.DeviceConfig`. Uses ``max_tags``, ``axi_id_width``,
        ``pmem_size`` (``pmem_lines``, ``pmem_addr_width``) and ``hazard_buckets``.

    Members
    -------
    i_m2s_req: ``In(stream.Signature(M2SReq))``
        M2S Req channel. Address is Addr[51:5]; the line address is ``address[1:]``.
    i_m2s_rwd: ``In(stream.Signature(M2SRwD))``
        M2S RwD channel (line address, data, byte enables, Poison).
    o_s2m_ndr: ``Out(stream.Signature(S2MNDR))``
        S2M NDR completions.
    o_s2m_drs: ``Out(stream.Signature(S2MDRS))``
        S2M DRS data responses.
    pmem: ``Out(AXI4Signature(...))``
        PMEM manager port (``addr_width=config.pmem_addr_width``, ``data_width=512``,
        ``id_width=config.axi_id_width``): single-beat 64-byte bursts, ARID / AWID = the
        request's in-flight slot. Responses may come back in any order across IDs.
    hdm_base: ``In(LINE_ADDR_BITS)``
        HDM base as a host line address (Addr[51:6]). May change only while idle.
    hdm_size: ``In(LINE_ADDR_BITS + 1)``
        HDM size in lines. Lines beyond ``config.pmem_lines`` are outside the HDM.
    o_err_set: ``Out(MemError.COUNT)``
        One-cycle pulse per error, bit positions in :class:`MemError`; registered, so it
        rises the cycle after the offending handshake or PMEM response.
    o_err_info: ``Out(ErrorInfo)``
        Valid in a cycle where ``o_err_set`` is non-zero; reports the M2S error when an
        M2S and a PMEM error coincide.
    o_perf: ``Out(PerfEvents)``
        ``read`` / ``write`` pulse (registered) once per AR / AW handshake; ``busy`` is
        high while a request is in flight or a response waits anywhere in the endpoint.
    o_occupancy: ``Out(range(config.max_tags + 1))``
        Slots in flight (allocated at acceptance, freed when the R / B beat is taken).
    o_dev_load: ``Out(2)``
        DevLoad from ``o_occupancy``; thresholds from :func:`dev_load_thresholds`.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`~hw.config.DeviceConfig`.
    """

    def __init__(self, *, config: DeviceConfig):
        self._config = check_config(config)
        super().__init__({
            "i_m2s_req": In(stream.Signature(M2SReq)),
            "i_m2s_rwd": In(stream.Signature(M2SRwD)),
            "o_s2m_ndr": Out(stream.Signature(S2MNDR)),
            "o_s2m_drs": Out(stream.Signature(S2MDRS)),
            "pmem": Out(AXI4Signature(addr_width=config.pmem_addr_width,
                                      data_width=config.line_bits,
                                      id_width=config.axi_id_width)),
            "hdm_base": In(LINE_ADDR_BITS),
            "hdm_size": In(LINE_ADDR_BITS + 1),
            "o_err_set": Out(MemError.COUNT),
            "o_err_info": Out(ErrorInfo),
            "o_perf": Out(PerfEvents),
            "o_occupancy": Out(range(config.max_tags + 1)),
            "o_dev_load": Out(2),
        })

    @property
    def config(self) -> DeviceConfig:
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        pmem = self.pmem
        m.submodules.decoder = decoder = M2SDecoder(config=cfg)
        m.submodules.admission = admission = EndpointAdmission(config=cfg)
        m.submodules.slot_tracker = tracker = SlotTracker(slots=cfg.max_tags)
        m.submodules.ordering_table = ordering = OrderingTable(buckets=cfg.hazard_buckets,
                                                               depth=cfg.max_tags)
        m.submodules.completion = completion = EndpointCompletion(config=cfg)

        wiring.connect(m, wiring.flipped(self.i_m2s_req), decoder.i_req)
        wiring.connect(m, wiring.flipped(self.i_m2s_rwd), decoder.i_rwd)
        wiring.connect(m, decoder.o_req, admission.i_req)
        wiring.connect(m, decoder.o_rwd, admission.i_rwd)
        wiring.connect(m, tracker.o_slot, admission.i_slot)
        wiring.connect(m, admission.o_order, ordering.i_issue)
        wiring.connect(m, admission.o_issue, completion.i_issue)
        wiring.connect(m, admission.o_imm, completion.i_imm)
        wiring.connect(m, completion.o_release, tracker.i_release)
        wiring.connect(m, completion.o_retire, ordering.i_retire)
        wiring.connect(m, completion.o_ndr, wiring.flipped(self.o_s2m_ndr))
        wiring.connect(m, completion.o_drs, wiring.flipped(self.o_s2m_drs))
        m.d.comb += [
            decoder.hdm_base.eq(self.hdm_base),
            decoder.hdm_size.eq(self.hdm_size),
            admission.i_read_busy.eq(ordering.o_read_busy),
            admission.i_write_busy.eq(ordering.o_write_busy),
            completion.i_dev_load.eq(tracker.o_dev_load),
            self.o_occupancy.eq(tracker.o_occupancy),
            self.o_dev_load.eq(tracker.o_dev_load),
        ]

        # PMEM: every access is one 64-byte beat.
        for prefix, request in (("ar", admission.o_ar), ("aw", admission.o_aw)):
            def port(name, prefix=prefix):
                return getattr(pmem, f"{prefix}{name}")
            m.d.comb += [
                port("valid").eq(request.valid), request.ready.eq(port("ready")),
                port("id").eq(request.p.id),
                port("addr").eq(Cat(C(0, LINE_SHIFT), request.p.line)),
                port("len").eq(0), port("size").eq(LINE_SHIFT), port("burst").eq(AxiBurst.INCR),
                port("lock").eq(0), port("cache").eq(0), port("prot").eq(0),
            ]
        r, b, w = completion.i_r, completion.i_b, admission.o_w
        m.d.comb += [
            pmem.wvalid.eq(w.valid), w.ready.eq(pmem.wready), pmem.wdata.eq(w.p.data),
            pmem.wstrb.eq(w.p.strb), pmem.wlast.eq(1),
            r.valid.eq(pmem.rvalid), pmem.rready.eq(r.ready), r.p.id.eq(pmem.rid),
            r.p.data.eq(pmem.rdata), r.p.resp.eq(pmem.rresp),
            b.valid.eq(pmem.bvalid), pmem.bready.eq(b.ready), b.p.id.eq(pmem.bid),
            b.p.resp.eq(pmem.bresp),
        ]

        # Errors: an M2S error's details win over a PMEM error's in the same cycle.
        m2s_error, pmem_error = admission.o_error, completion.o_pmem_error
        m.d.sync += self.o_err_set.eq(Mux(m2s_error.valid, m2s_error.p.errors, 0) |
                                      (pmem_error.valid << MemError.PMEM_RESP))
        with m.If(m2s_error.valid):
            m.d.sync += self.o_err_info.eq(m2s_error.p.info)
        with m.Elif(pmem_error.valid):
            m.d.sync += self.o_err_info.eq(pmem_error.p)

        m.d.comb += self.o_perf.busy.eq(tracker.o_occupancy.any() | admission.o_busy |
                                        completion.o_busy)
        m.d.sync += [
            self.o_perf.read.eq(pmem.arvalid & pmem.arready),
            self.o_perf.write.eq(pmem.awvalid & pmem.awready),
        ]
        return m
