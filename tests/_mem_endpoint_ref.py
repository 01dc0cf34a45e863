"""Reference copy of hw/cxl/mem_endpoint.py as it was before the split into components
(test-only; :class:`MemEndpointRef`), for tests/test_mem_endpoint_equivalence.py.
"""

from __future__ import annotations

from functools import reduce

from amaranth.hdl import C, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst, AxiResp
from hw.config import LINE_BITS, DeviceConfig
from hw.cxl.messages import (
    S2MDRS,
    S2MNDR,
    DRSOpcode,
    M2SReq,
    M2SReqOpcode,
    M2SRwD,
    M2SRwDOpcode,
    MetaField,
    MetaValue,
    NDROpcode,
)
from hw.widths import eq_const, lt_const

__all__ = [
    "IMM_FIFO_DEPTH",
    "ErrorChannel",
    "ErrorInfo",
    "MemEndpointRef",
    "MemError",
    "PerfEvents",
    "dev_load_thresholds",
    "hdm_decode",
]


class MemError:
    """Bit positions of :attr:`MemEndpoint.o_err_set`, one per error kind."""
    HDM_RANGE = 0       # address outside the HDM window (or beyond PMEM)
    RSVD_OPCODE = 1     # reserved M2S Req or RwD opcode
    POISON = 2          # poisoned MemWr / MemWrPtl (dropped)
    EMPTY_PTL = 3       # MemWrPtl with no byte enabled
    UNEXPECTED_FWD = 4  # MemRdFwd / MemWrFwd with no CXL.cache request outstanding
    PMEM_RESP = 5       # RRESP / BRESP other than OKAY
    COUNT = 6


class ErrorChannel:
    """Values of ``ErrorInfo.channel``: where the reported error was seen."""
    M2S_REQ = 0
    M2S_RWD = 1
    PMEM_R = 2
    PMEM_B = 3


#: Details of the error(s) flagged in the same cycle on ``o_err_set``. ``address`` is the
#: host line address (Addr[51:6]) for the M2S channels, the device line address for PMEM.
ErrorInfo = data.StructLayout({"channel": 2, "opcode": 4, "address": 46})

#: One-cycle event strobes for the performance counters of the CSR block.
PerfEvents = data.StructLayout({"read": 1, "write": 1, "busy": 1})

#: Entries of the immediate-response FIFO (responses that need no PMEM access).
IMM_FIFO_DEPTH = 4

# Log2 of the line size in bytes: device byte address = device line address << 6.
_LINE_SHIFT = (LINE_BITS // 8).bit_length() - 1

#: Request fields that every response to it echoes (the Tag is returned unchanged in NDR
#: and DRS; ``docs/cxl-encodings.md``).
_ECHOED = ("tag", "ld_id", "meta_field", "meta_value")

_ImmEntry = data.StructLayout({
    "ndr_opcode": 3,    # NDROpcode
    "nxm": 1,           # DRS MemData-NXM instead of the NDR (out-of-range read)
    "tag": 16,
    "ld_id": 4,
    "meta_field": 2,
    "meta_value": 2,
})


def dev_load_thresholds(max_tags: int) -> tuple[int, int, int]:
    """Occupancy thresholds ``(t1, t2, t3)`` of the DevLoad encoding.

    DevLoad is Light below ``t1``, Optimal below ``t2``, ModerateOverload below ``t3``
    and SevereOverload from ``t3`` on, with ``tk = ceil(k * max_tags / 4)``: an integer
    occupancy ``n`` satisfies ``n < tk`` exactly when ``n < k * max_tags / 4`` in real
    numbers, so the quarters are exact for every ``max_tags`` (for ``max_tags = 1`` an
    idle device is Light and a busy one SevereOverload).
    """
    return tuple((k * max_tags + 3) // 4 for k in (1, 2, 3))


def hdm_decode(m: Module, line, hdm_base, hdm_size, pmem_lines: int, name: str):
    """The HDM decoder: ``(in range, offset)`` of host line address ``line`` (46 bits)
    for ``hdm_base`` (46 bits) and ``hdm_size`` (47 bits; bit 46 set: the whole space).
    In range means at or above the base, below base + size, and inside the
    ``pmem_lines`` lines of device memory; ``offset[:46]`` is then the device line."""
    offset = Signal(47, name=f"{name}_offset")   # bit 46: borrow
    in_range = Signal(name=f"{name}_in_range")
    m.d.comb += [
        offset.eq(line - hdm_base),
        # Compare 46 bits and treat size bit 46 separately: when a parent ties that bit
        # to 0, Yosys then keeps both comparison operands equally wide.
        in_range.eq(~offset[46] & (hdm_size[46] | (offset[:46] < hdm_size[:46])) &
                    lt_const(offset, pmem_lines)),
    ]
    return in_range, offset


def _xor_fold(value, width: int):
    """XOR of ``value``'s ``width``-bit chunks (the last one zero-extended)."""
    chunks = [value[i:i + width] for i in range(0, len(value), width)]
    return reduce(lambda a, b: a ^ b, chunks)[:width]


class MemEndpointRef(wiring.Component):
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
    hdm_base: ``In(46)``
        HDM base as a host line address (Addr[51:6]). May change only while idle.
    hdm_size: ``In(47)``
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
        if not isinstance(config, DeviceConfig):
            raise TypeError(f"config must be a DeviceConfig, not {config!r}")
        self._config = config
        super().__init__({
            "i_m2s_req": In(stream.Signature(M2SReq)),
            "i_m2s_rwd": In(stream.Signature(M2SRwD)),
            "o_s2m_ndr": Out(stream.Signature(S2MNDR)),
            "o_s2m_drs": Out(stream.Signature(S2MDRS)),
            "pmem": Out(AXI4Signature(addr_width=config.pmem_addr_width,
                                      data_width=config.line_bits,
                                      id_width=config.axi_id_width)),
            "hdm_base": In(46),
            "hdm_size": In(47),
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
        n_slots = cfg.max_tags
        slot_width = cfg.tag_index_width
        line_width = cfg.pmem_addr_width - _LINE_SHIFT   # device line address
        bucket_width = cfg.hazard_bucket_width
        n_buckets = cfg.hazard_buckets
        req, rwd = self.i_m2s_req, self.i_m2s_rwd
        ndr, drs, pmem = self.o_s2m_ndr, self.o_s2m_drs, self.pmem

        # --- HDM decode -------------------------------------------------------------
        def decode(line, name):
            in_range, offset = hdm_decode(m, line, self.hdm_base, self.hdm_size,
                                          cfg.pmem_lines, name)
            dev_line = offset[:line_width]
            bucket = Signal(bucket_width, name=f"{name}_bucket")
            m.d.comb += bucket.eq(_xor_fold(dev_line, bucket_width))
            return in_range, dev_line, bucket

        def ndr_for_meta(meta_field, meta_value):
            # The NDR grants the cache state the host asked for with MetaValue. With
            # MetaField No-Op (or a reserved MetaField) MetaValue is reserved and
            # ignored, so nothing is granted: Cmp.
            grant = Mux(eq_const(meta_value, MetaValue.Shared.value), NDROpcode.CmpS.value,
                        Mux(eq_const(meta_value, MetaValue.Any.value), NDROpcode.CmpE.value,
                            NDROpcode.Cmp.value))
            return Mux(eq_const(meta_field, MetaField.Meta0State.value), grant,
                       NDROpcode.Cmp.value)

        # M2S Req classification.
        r_op = req.p.opcode
        r_line = req.p.address[1:]
        r_in, r_dev_line, r_bucket = decode(r_line, "req")
        r_is = {op: eq_const(r_op, op.value) for op in M2SReqOpcode}
        r_is_rd = r_is[M2SReqOpcode.MemRd] | r_is[M2SReqOpcode.MemRdData]
        r_is_inv = r_is[M2SReqOpcode.MemInv] | r_is[M2SReqOpcode.MemInvNT]
        r_is_evct = r_is[M2SReqOpcode.MemClnEvct]
        r_is_fwd = r_is[M2SReqOpcode.MemRdFwd] | r_is[M2SReqOpcode.MemWrFwd]
        r_is_rsvd = ~reduce(lambda a, b: a | b, r_is.values())
        # MemSpecRd and the forwards are neither r_mem nor r_imm: accepted, not answered.
        r_mem = Signal()    # goes to PMEM
        r_imm = Signal()    # answered without PMEM
        r_err = Signal(MemError.COUNT)
        m.d.comb += [
            r_mem.eq(r_is_rd & r_in),
            r_imm.eq((r_is_rd & ~r_in) | r_is_inv | r_is_evct | r_is_rsvd),
            r_err[MemError.HDM_RANGE].eq((r_is_rd | r_is_inv | r_is_evct) & ~r_in),
            r_err[MemError.RSVD_OPCODE].eq(r_is_rsvd),
            r_err[MemError.UNEXPECTED_FWD].eq(r_is_fwd),
        ]
        r_is_rdd = r_is[M2SReqOpcode.MemRdData]
        r_mem_ndr = Mux(r_is_rdd, NDROpcode.CmpE.value,
                        ndr_for_meta(req.p.meta_field, req.p.meta_value))
        r_imm_ndr = Mux(r_is_inv, ndr_for_meta(req.p.meta_field, req.p.meta_value),
                        NDROpcode.Cmp.value)

        # M2S RwD classification.
        w_op = rwd.p.opcode
        w_in, w_dev_line, w_bucket = decode(rwd.p.address, "rwd")
        w_is = {op: eq_const(w_op, op.value) for op in M2SRwDOpcode}
        w_is_ptl = w_is[M2SRwDOpcode.MemWrPtl]
        w_is_wr = w_is[M2SRwDOpcode.MemWr] | w_is_ptl
        w_is_rsvd = ~reduce(lambda a, b: a | b, w_is.values())
        w_empty = w_is_ptl & ~rwd.p.byte_enable.any()
        w_mem = Signal()
        w_err = Signal(MemError.COUNT)
        m.d.comb += [
            w_mem.eq(w_is_wr & w_in & ~rwd.p.poison & ~w_empty),
            w_err[MemError.HDM_RANGE].eq(w_is_wr & ~w_in),
            w_err[MemError.RSVD_OPCODE].eq(w_is_rsvd),
            w_err[MemError.POISON].eq(w_is_wr & rwd.p.poison),
            w_err[MemError.EMPTY_PTL].eq(w_empty),
        ]
        w_imm_ndr = Mux(w_is[M2SRwDOpcode.BIConflict], NDROpcode.BIConflictAck.value,
                        NDROpcode.Cmp.value)

        # --- Shared state -----------------------------------------------------------
        # Slot table: what the completion needs, written at acceptance, read by ID.
        slot_layout = data.StructLayout({
            "tag": 16, "ld_id": 4, "meta_field": 2, "meta_value": 2,
            "ndr_opcode": 3, "opcode": 4, "bucket": bucket_width, "dev_line": line_width,
        })
        # Depths of at least 2 (slots) and 3 (free list, whose inner memory is one shorter)
        # keep every memory address at least one bit wide: a zero-width address is not
        # legal Verilog. Only max_tags = 1 or 2 pay for the unused entries.
        m.submodules.slots = slots = Memory(shape=slot_layout, depth=max(n_slots, 2), init=[])
        slot_wr = slots.write_port()
        # Not transparent: an ID is read (its R / B beat) at least two cycles after the
        # slot was written, and a slot is reallocated only after its read.
        slot_rd = slots.read_port(domain="sync", transparent_for=())

        # Slot allocation: fresh slots in order after reset, then recycled ones.
        fresh = Signal(range(n_slots + 1))
        m.submodules.free_list = free_list = SyncFIFOBuffered(width=slot_width,
                                                              depth=max(n_slots, 3))
        have_fresh = ~eq_const(fresh, n_slots)
        slot_avail = have_fresh | free_list.r_rdy
        alloc_slot = Mux(have_fresh, fresh[:slot_width], free_list.r_data)

        # Ordering table.
        rd_count = [Signal(range(n_slots + 1), name=f"hz_rd{i}") for i in range(n_buckets)]
        wr_count = [Signal(range(n_slots + 1), name=f"hz_wr{i}") for i in range(n_buckets)]
        rd_busy = Signal(n_buckets)
        wr_busy = Signal(n_buckets)
        m.d.comb += [
            rd_busy.eq(Cat(c.any() for c in rd_count)),
            wr_busy.eq(Cat(c.any() for c in wr_count)),
        ]
        # A write waiting at the head of RwD also blocks reads of its bucket: otherwise a
        # host that keeps reading a line would keep the write from ever being accepted
        # (writes need a bucket with nothing in flight), and every write behind it too.
        w_waiting = Signal()
        r_hazard_ok = ~(wr_busy >> r_bucket)[0] & ~(w_waiting & (r_bucket == w_bucket))
        w_hazard_ok = ~((rd_busy | wr_busy) >> w_bucket)[0]

        m.submodules.imm_fifo = imm_fifo = SyncFIFOBuffered(width=_ImmEntry.size,
                                                            depth=IMM_FIFO_DEPTH)

        # --- Acceptance: at most one M2S handshake per cycle ------------------------
        ar_free = ~pmem.arvalid | pmem.arready
        aw_free = ~pmem.awvalid | pmem.awready
        w_free = ~pmem.wvalid | pmem.wready
        r_can = Signal()
        w_can = Signal()
        m.d.comb += [
            w_waiting.eq(rwd.valid & w_mem),
            r_can.eq(req.valid & Mux(r_mem, slot_avail & r_hazard_ok & ar_free,
                                     ~r_imm | imm_fifo.w_rdy)),
            w_can.eq(rwd.valid & Mux(w_mem, slot_avail & w_hazard_ok & aw_free & w_free,
                                     imm_fifo.w_rdy)),
        ]
        prefer_rwd = Signal()   # round-robin pointer: who wins when both can go
        take_r = Signal()
        take_w = Signal()
        m.d.comb += [
            take_r.eq(r_can & (~w_can | ~prefer_rwd)),
            take_w.eq(w_can & (~r_can | prefer_rwd)),
            req.ready.eq(take_r),
            rwd.ready.eq(take_w),
        ]
        with m.If(take_r):
            m.d.sync += prefer_rwd.eq(1)
        with m.Elif(take_w):
            m.d.sync += prefer_rwd.eq(0)

        acc_rd = take_r & r_mem
        acc_wr = take_w & w_mem
        acc_mem = acc_rd | acc_wr
        # Fields every response echoes, from whichever request is accepted.
        echoed = {name: Mux(take_w, rwd.p[name], req.p[name]) for name in _ECHOED}

        # --- Meta state: 2 bits per line, read and written at acceptance ------------
        if cfg.meta_state:
            # Every in-range request the endpoint serves with MetaField Meta0-State
            # stores its MetaValue, except MemRdData, which ignores MetaField and
            # MetaValue and moves the line from I to A (S and A stay); the responses
            # carry the value before it. The read is asynchronous (the old value goes
            # into the slot table or the immediate FIFO with the request), so the
            # memory is distributed RAM on an FPGA.
            m.submodules.meta = meta = Memory(shape=2, depth=cfg.pmem_lines,
                                              init=[MetaValue.Any.value] * cfg.pmem_lines)
            meta_rd = meta.read_port(domain="comb")
            meta_wr = meta.write_port()
            meta0 = MetaField.Meta0State.value
            r_meta = r_in & (((r_is[M2SReqOpcode.MemRd] | r_is_inv | r_is_evct)
                              & eq_const(req.p.meta_field, meta0)) | r_is_rdd)
            w_meta = w_mem & eq_const(rwd.p.meta_field, meta0)
            meta_upd = (take_r & r_meta) | (take_w & w_meta)
            meta_line = Mux(take_w, w_dev_line, r_dev_line)
            m.d.comb += [
                meta_rd.addr.eq(meta_line),
                meta_wr.addr.eq(meta_line),
                meta_wr.en.eq(meta_upd),
                meta_wr.data.eq(Mux(take_r & r_is_rdd,
                                    Mux(eq_const(meta_rd.data, MetaValue.Invalid.value),
                                        MetaValue.Any.value, meta_rd.data),
                                    echoed["meta_value"])),
            ]
            echoed["meta_value"] = Mux(meta_upd, meta_rd.data, echoed["meta_value"])
        m.d.comb += [
            slot_wr.en.eq(acc_mem),
            slot_wr.addr.eq(alloc_slot),
            *(slot_wr.data[name].eq(value) for name, value in echoed.items()),
            slot_wr.data.ndr_opcode.eq(Mux(take_w, NDROpcode.Cmp.value, r_mem_ndr)),
            slot_wr.data.opcode.eq(Mux(take_w, w_op, r_op)),
            slot_wr.data.bucket.eq(Mux(take_w, w_bucket, r_bucket)),
            slot_wr.data.dev_line.eq(Mux(take_w, w_dev_line, r_dev_line)),
        ]
        with m.If(acc_mem):
            with m.If(have_fresh):
                m.d.sync += fresh.eq(fresh + 1)
            with m.Else():
                m.d.comb += free_list.r_en.eq(1)

        imm_w = Signal(_ImmEntry)
        m.d.comb += [
            imm_w.ndr_opcode.eq(Mux(take_w, w_imm_ndr, r_imm_ndr)),
            imm_w.nxm.eq(take_r & r_is_rd & ~r_in),
            *(imm_w[name].eq(value) for name, value in echoed.items()),
            imm_fifo.w_data.eq(imm_w),
            imm_fifo.w_en.eq((take_r & r_imm) | (take_w & ~w_mem)),
        ]

        # AR, AW and W: registers loaded at acceptance (acceptance implies they are free).
        m.d.comb += [
            pmem.arlen.eq(0), pmem.arsize.eq(_LINE_SHIFT), pmem.arburst.eq(AxiBurst.INCR),
            pmem.arlock.eq(0), pmem.arcache.eq(0), pmem.arprot.eq(0),
            pmem.awlen.eq(0), pmem.awsize.eq(_LINE_SHIFT), pmem.awburst.eq(AxiBurst.INCR),
            pmem.awlock.eq(0), pmem.awcache.eq(0), pmem.awprot.eq(0),
            pmem.wlast.eq(1),
        ]
        with m.If(acc_rd):
            m.d.sync += [
                pmem.arvalid.eq(1),
                pmem.arid.eq(alloc_slot),
                pmem.araddr.eq(Cat(C(0, _LINE_SHIFT), r_dev_line)),
            ]
        with m.Elif(pmem.arready):
            m.d.sync += pmem.arvalid.eq(0)
        with m.If(acc_wr):
            m.d.sync += [
                pmem.awvalid.eq(1),
                pmem.awid.eq(alloc_slot),
                pmem.awaddr.eq(Cat(C(0, _LINE_SHIFT), w_dev_line)),
                pmem.wvalid.eq(1),
                pmem.wdata.eq(rwd.p.data),
                pmem.wstrb.eq(Mux(w_is_ptl, rwd.p.byte_enable,
                                  Const(-1, len(pmem.wstrb)).as_unsigned())),
            ]
        with m.Else():
            with m.If(pmem.awready):
                m.d.sync += pmem.awvalid.eq(0)
            with m.If(pmem.wready):
                m.d.sync += pmem.wvalid.eq(0)

        # --- Completion stage -------------------------------------------------------
        # S0 picks one of {R beat, B, immediate FIFO} round-robin and reads the slot
        # table; S1 holds it until every output register it needs can load.
        s1_valid = Signal()
        s1_is_r = Signal()
        s1_is_b = Signal()
        s1_is_imm = Signal()
        s1_fresh = Signal()     # first cycle in S1 of an R / B entry (slot data valid)
        s1_resp = Signal(2)
        s1_data = Signal(LINE_BITS)
        s1_imm = Signal(_ImmEntry)
        ndr_free = ~ndr.valid | ndr.ready
        drs_free = ~drs.valid | drs.ready
        s1_nxm = s1_is_imm & s1_imm.nxm
        s1_needs_drs = s1_is_r | s1_nxm
        s1_needs_ndr = ~s1_nxm     # MemData-NXM is the only response of its read
        s1_advance = Signal()
        s0_take = Signal()
        m.d.comb += [
            s1_advance.eq(s1_valid & (~s1_needs_ndr | ndr_free) & (~s1_needs_drs | drs_free)),
            s0_take.eq(~s1_valid | s1_advance),
        ]

        last = Signal(2)        # source granted last: 0 R, 1 B, 2 immediate
        src_valid = [pmem.rvalid, pmem.bvalid, imm_fifo.r_rdy]
        grant = Signal(3)
        with m.Switch(last):
            for prev in range(3):
                with m.Case(prev):
                    order = [(prev + 1 + k) % 3 for k in range(3)]
                    with m.If(src_valid[order[0]]):
                        m.d.comb += grant[order[0]].eq(1)
                    with m.Elif(src_valid[order[1]]):
                        m.d.comb += grant[order[1]].eq(1)
                    with m.Elif(src_valid[order[2]]):
                        m.d.comb += grant[order[2]].eq(1)
        g_r, g_b, g_imm = grant[0], grant[1], grant[2]
        release = s0_take & (g_r | g_b)     # a PMEM response leaves; its slot is free
        released_slot = Mux(g_b, pmem.bid, pmem.rid)[:slot_width]
        m.d.comb += [
            pmem.rready.eq(s0_take & g_r),
            pmem.bready.eq(s0_take & g_b),
            imm_fifo.r_en.eq(s0_take & g_imm),
            slot_rd.en.eq(s0_take),
            slot_rd.addr.eq(released_slot),
            free_list.w_en.eq(release),
            free_list.w_data.eq(released_slot),
        ]
        m.d.sync += s1_fresh.eq(release)
        with m.If(s0_take):
            m.d.sync += [
                s1_valid.eq(grant.any()),
                s1_is_r.eq(g_r),
                s1_is_b.eq(g_b),
                s1_is_imm.eq(g_imm),
                s1_resp.eq(Mux(g_b, pmem.bresp, pmem.rresp)),
                s1_data.eq(pmem.rdata),
                s1_imm.eq(imm_fifo.r_data),
            ]
            with m.If(grant.any()):
                m.d.sync += last.eq(Mux(g_r, 0, Mux(g_b, 1, 2)))

        slot = slot_rd.data
        s1_bad_resp = ~eq_const(s1_resp, AxiResp.OKAY)
        dev_load = Signal(2)
        s1_echoed = {name: Mux(s1_is_imm, s1_imm[name], slot[name]) for name in _ECHOED}
        with m.If(s1_advance & s1_needs_ndr):
            m.d.sync += [
                ndr.valid.eq(1),
                ndr.p.opcode.eq(Mux(s1_is_imm, s1_imm.ndr_opcode, slot.ndr_opcode)),
                *(ndr.p[name].eq(value) for name, value in s1_echoed.items()),
                ndr.p.dev_load.eq(dev_load),
            ]
        with m.Elif(ndr.ready):
            m.d.sync += ndr.valid.eq(0)
        with m.If(s1_advance & s1_needs_drs):
            m.d.sync += [
                drs.valid.eq(1),
                drs.p.opcode.eq(Mux(s1_is_imm, DRSOpcode.MemDataNXM.value,
                                    DRSOpcode.MemData.value)),
                *(drs.p[name].eq(value) for name, value in s1_echoed.items()),
                # MemData-NXM: all-ones data, Poison set (this device always reports
                # poison; CXL 3.x Table 3-53).
                drs.p.poison.eq((s1_is_r & s1_bad_resp) | s1_is_imm),
                drs.p.dev_load.eq(dev_load),
                drs.p.rsvd.eq(0),
                drs.p.data.eq(Mux(s1_is_imm, Const(-1, LINE_BITS).as_unsigned(), s1_data)),
            ]
        with m.Elif(drs.ready):
            m.d.sync += drs.valid.eq(0)

        # --- Ordering table update --------------------------------------------------
        dec_rd = s1_fresh & s1_is_r
        dec_wr = s1_fresh & s1_is_b
        for i in range(n_buckets):
            for count, inc, inc_bucket, dec in ((rd_count[i], acc_rd, r_bucket, dec_rd),
                                                 (wr_count[i], acc_wr, w_bucket, dec_wr)):
                up = inc & eq_const(inc_bucket, i)
                down = dec & eq_const(slot.bucket, i)
                with m.If(up & ~down):
                    m.d.sync += count.eq(count + 1)
                with m.Elif(down & ~up):
                    m.d.sync += count.eq(count - 1)

        # --- Occupancy, DevLoad, performance events ---------------------------------
        occupancy = self.o_occupancy
        with m.If(acc_mem & ~release):
            m.d.sync += occupancy.eq(occupancy + 1)
        with m.Elif(release & ~acc_mem):
            m.d.sync += occupancy.eq(occupancy - 1)
        t1, t2, t3 = dev_load_thresholds(n_slots)
        m.d.comb += [
            dev_load.eq(Mux(lt_const(occupancy, t1), 0b00,
                            Mux(lt_const(occupancy, t2), 0b01,
                                Mux(lt_const(occupancy, t3), 0b10, 0b11)))),
            self.o_dev_load.eq(dev_load),
            self.o_perf.busy.eq(occupancy.any() | imm_fifo.level.any() | s1_valid |
                                ndr.valid | drs.valid),
        ]
        m.d.sync += [
            self.o_perf.read.eq(pmem.arvalid & pmem.arready),
            self.o_perf.write.eq(pmem.awvalid & pmem.awready),
        ]

        # --- Errors -----------------------------------------------------------------
        m2s_err = Mux(take_r, r_err, 0) | Mux(take_w, w_err, 0)
        pmem_err = s1_fresh & s1_bad_resp
        m.d.sync += self.o_err_set.eq(m2s_err | (pmem_err << MemError.PMEM_RESP))
        info = self.o_err_info
        with m.If(take_r & r_err.any()):
            m.d.sync += [info.channel.eq(ErrorChannel.M2S_REQ), info.opcode.eq(r_op),
                         info.address.eq(r_line)]
        with m.Elif(take_w & w_err.any()):
            m.d.sync += [info.channel.eq(ErrorChannel.M2S_RWD), info.opcode.eq(w_op),
                         info.address.eq(rwd.p.address)]
        with m.Elif(pmem_err):
            m.d.sync += [info.channel.eq(Mux(s1_is_r, ErrorChannel.PMEM_R,
                                             ErrorChannel.PMEM_B)),
                         info.opcode.eq(slot.opcode), info.address.eq(slot.dev_line)]

        return m
