"""The TrainingCXL device top: CXL.mem endpoint, DCOH, CXL.cache agent, embedding
engine (with the checkpoint logger, recovery and MLP copier), CSR block and the PMEM
port.

Host CXL.mem traffic passes the :class:`~hw.cxl.m2s_router.M2sRouter` (forwards to the
:class:`~hw.cxl.dcoh.Dcoh`, host checks of the bias table) and reaches PMEM through
:class:`~hw.cxl.mem_endpoint.MemEndpoint`; the :class:`~hw.engine.engine.Engine`
executes the descriptor ring, its PMEM accesses gated by the DCOH; an
:class:`~hw.bus.axi_arbiter.AxiArbiter` shares the PMEM port between the two (one
priority class, round-robin). The :class:`~hw.cxl.cache_agent.CacheAgent` reads and
writes GPU memory for the engine (MLP snapshots, completion records) and shares the D2H
Req channel with the DCOH. Everything is configured and observed through
:class:`~hw.csr.bank.CsrBank`.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .bus.axi import AXI4LiteSignature, AXI4Signature
from .bus.axi_arbiter import AxiArbiter
from .config import HDM_GRANULE, DeviceConfig
from .csr.bank import CsrBank
from .csr.registers import LINK_DATA_BYTES, LINK_HEADER_BYTES
from .cxl.cache_agent import CacheAgent
from .cxl.dcoh import Dcoh
from .cxl.dcoh_gate import DcohGate
from .cxl.m2s_router import M2sRouter
from .cxl.mem_endpoint import MemEndpoint
from .cxl.messages import (
    LINE_ADDR_BITS,
    S2MDRS,
    S2MNDR,
    D2HData,
    D2HReq,
    D2HRsp,
    H2DData,
    H2DReq,
    H2DRsp,
    M2SReq,
    M2SRwD,
)
from .engine.buffer_reader import BURST as BAG_BURST_LINES
from .engine.engine import PMEM_KIND_COUNTERS, Engine

__all__ = ["DCOH_CQID_BASE", "PMEM_REGISTER_RESPONSES", "Device"]

#: First CQID of the DCOH's pool: clear of the CXL.cache agent's CQIDs (0 ..
#: cache_cqids + cache_write_cqids - 1, at most 4,095 with 2,048 + 2,048), so the host
#: tells the two apart by CQID as well as by address.
DCOH_CQID_BASE = 2048

#: R and B of the PMEM arbiter pass without an output register, so the host's reads
#: and writes see the endpoint's own latency plus the AR / AW register only
#: (``docs/mem-endpoint.md``).
PMEM_REGISTER_RESPONSES = False


def _merge(m: Module, a, b, out, name: str) -> None:
    """Round-robin merge of two register-output streams ``a`` and ``b`` into ``out``;
    the choice holds while ``out`` waits, so valid and payload hold until the transfer
    (the stream rules)."""
    last = Signal(name=f"{name}_last")      # the stream taken last (1: b)
    hold = Signal(name=f"{name}_hold")      # ``out`` waited: keep ``held``
    held = Signal(name=f"{name}_held")
    pick = Signal(name=f"{name}_pick")
    with m.If(hold):
        m.d.comb += pick.eq(held)
    with m.Elif(a.valid & b.valid):
        m.d.comb += pick.eq(~last)
    with m.Else():
        m.d.comb += pick.eq(b.valid)
    m.d.comb += [
        out.valid.eq(a.valid | b.valid),
        out.p.eq(Mux(pick, b.p, a.p)),
        a.ready.eq(out.ready & ~pick),
        b.ready.eq(out.ready & pick),
    ]
    m.d.sync += [hold.eq(out.valid & ~out.ready), held.eq(pick)]
    with m.If(out.valid & out.ready):
        m.d.sync += last.eq(pick)


class Device(wiring.Component):
    """TrainingCXL device top level.

    Latency, throughput and ordering are those of :class:`MemEndpoint` (see
    ``docs/mem-endpoint.md``); the CSR block adds no latency to the data path. The
    HDM decoder takes the CSR values from the cycle after a CSR write. Synchronous
    active-high reset returns every register to the value the config gives it.

    Parameters
    ----------
    config:
        The :class:`DeviceConfig` every block is generated from.

    Members
    -------
    i_m2s_req, i_m2s_rwd:
        CXL.mem requests from the host (``M2SReq`` / ``M2SRwD`` streams).
    o_s2m_ndr, o_s2m_drs:
        CXL.mem responses to the host.
    o_d2h_req, o_d2h_rsp, o_d2h_data, i_h2d_req, i_h2d_rsp, i_h2d_data:
        CXL.cache channels (``D2HReq`` / ``D2HRsp`` / ``D2HData`` out, ``H2DReq`` /
        ``H2DRsp`` / ``H2DData`` in). D2H Req carries the agent's reads and writes of
        GPU memory (CQIDs below ``cache_cqids + cache_write_cqids``) and the DCOH's
        requests for device lines in host bias (CQIDs from :data:`DCOH_CQID_BASE`,
        addresses inside the HDM range). H2D Rsp and H2D Data go to the DCOH when their
        CQID is in its pool (``DCOH_CQID_BASE`` to ``+ dcoh_cqids - 1``), to the agent
        otherwise.
    pmem:
        AXI4 manager to persistent memory (512-bit data, ``config.pmem_id_width`` ID
        bits: the top bit is 0 for the memory endpoint's requests, 1 for the engine's).
    csr:
        AXI4-Lite subordinate for the register map of ``docs/registers.md``.
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
            "o_d2h_req": Out(stream.Signature(D2HReq)),
            "o_d2h_rsp": Out(stream.Signature(D2HRsp)),
            "o_d2h_data": Out(stream.Signature(D2HData)),
            "i_h2d_req": In(stream.Signature(H2DReq)),
            "i_h2d_rsp": In(stream.Signature(H2DRsp)),
            "i_h2d_data": In(stream.Signature(H2DData)),
            "pmem": Out(AXI4Signature(addr_width=config.pmem_addr_width,
                                      data_width=config.line_bits,
                                      id_width=config.pmem_id_width)),
            "csr": In(AXI4LiteSignature(addr_width=config.csr_addr_width)),
        })

    @property
    def config(self) -> DeviceConfig:
        return self._config

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        m.submodules.router = router = M2sRouter(pmem_lines=cfg.pmem_lines)
        m.submodules.dcoh = dcoh = Dcoh(pages=cfg.dcoh_pages, page_bytes=cfg.page_bytes,
                                        cqids=cfg.dcoh_cqids, cqid_base=DCOH_CQID_BASE)
        m.submodules.cache_agent = agent = CacheAgent(cqids=cfg.cache_cqids,
                                                      write_cqids=cfg.cache_write_cqids)
        m.submodules.endpoint = endpoint = MemEndpoint(config=self._config)
        m.submodules.csr_bank = regs = CsrBank(config=self._config)
        m.submodules.engine = engine = Engine(config=self._config)
        # Every engine access to device memory asks the DCOH first (pass-through while
        # COH_CTRL.HDM_D is 0): one request per line, bursts of up to a row (the bag
        # sequencer's buffer readers burst up to buffer_reader.BURST = 8 lines).
        burst = 1 << (max(BAG_BURST_LINES, cfg.engine_max_lines) - 1).bit_length()
        m.submodules.gate = gate = DcohGate(
            addr_width=cfg.pmem_addr_width, id_width=cfg.axi_id_width,
            handle_bits=(cfg.dcoh_cqids - 1).bit_length(),
            entries=min(64, cfg.dcoh_cqids), max_burst_lines=burst)
        m.submodules.pmem_arbiter = arbiter = AxiArbiter(
            addr_width=self._config.pmem_addr_width, data_width=self._config.line_bits,
            id_width=self._config.axi_id_width, priorities=[0, 0],
            register_responses=PMEM_REGISTER_RESPONSES)

        wiring.connect(m, wiring.flipped(self.i_m2s_req), router.i_req)
        wiring.connect(m, wiring.flipped(self.i_m2s_rwd), router.i_rwd)
        wiring.connect(m, router.o_req, endpoint.i_m2s_req)
        wiring.connect(m, router.o_rwd, endpoint.i_m2s_rwd)
        wiring.connect(m, router.o_fwd, dcoh.i_fwd)
        wiring.connect(m, router.o_chk, dcoh.i_host_chk)
        wiring.connect(m, dcoh.o_host_chk, router.i_chk)
        wiring.connect(m, endpoint.o_s2m_ndr, wiring.flipped(self.o_s2m_ndr))
        wiring.connect(m, endpoint.o_s2m_drs, wiring.flipped(self.o_s2m_drs))
        wiring.connect(m, endpoint.pmem, arbiter.m0)
        wiring.connect(m, engine.pmem, gate.up)
        wiring.connect(m, gate.down, arbiter.m1)
        wiring.connect(m, gate.o_acc, dcoh.i_acc)
        wiring.connect(m, dcoh.o_grant, gate.i_grant)
        wiring.connect(m, gate.o_done, dcoh.i_done)
        wiring.connect(m, arbiter.sub, wiring.flipped(self.pmem))
        wiring.connect(m, wiring.flipped(self.csr), regs.csr)
        self._row_store_guard(m, engine, endpoint)

        self._endpoint_registers(m, regs, endpoint, router, dcoh)
        self._engine_registers(m, regs, engine)

        self._coherence(m, regs, dcoh, agent, engine, router, gate)
        self._link_bytes(m, regs)
        return m

    def _row_store_guard(self, m: Module, engine, endpoint) -> None:
        """What the engine's row store must know of the host (``docs/embedding.md``,
        "Row store"): it is emptied by every request the host sends on CXL.mem (a
        write changes a line; a read may give the host a line it can change in its
        cache), and keeps no line while a write of the host's is in flight to PMEM
        (from the endpoint's AW to its B)."""
        ep = endpoint.pmem
        aw_go, b_go = Signal(), Signal()
        pending = Signal(16)                # the endpoint's writes (at most max_tags)
        m.d.comb += [aw_go.eq(ep.awvalid & ep.awready), b_go.eq(ep.bvalid & ep.bready)]
        m.d.sync += pending.eq(pending + aw_go - b_go)
        req, rwd = self.i_m2s_req, self.i_m2s_rwd
        m.d.comb += [
            engine.ext_write.eq(aw_go | (pending != 0)),
            engine.store_flush.eq((req.valid & req.ready) | (rwd.valid & rwd.ready)),
        ]

    def _endpoint_registers(self, m: Module, regs, endpoint, router, dcoh) -> None:
        """The HDM decoder, the endpoint's error capture, status and counters."""
        # HDM decoder: byte registers -> line address / line count (Addr[51:6]); the
        # registers hold bits [51:12] (4 KiB granules).
        granule_lines = Const(0, HDM_GRANULE.bit_length() - 1 - 6)
        hdm_base = Cat(granule_lines, regs.hdm_base_lo.addr, regs.hdm_base_hi.addr)
        hdm_size = Cat(granule_lines, regs.hdm_size_lo.addr, regs.hdm_size_hi.addr)
        m.d.comb += [
            endpoint.hdm_base.eq(hdm_base),
            endpoint.hdm_size.eq(hdm_size),
            router.hdm_base.eq(hdm_base),
            router.hdm_size.eq(hdm_size),
            dcoh.hdm_base.eq(hdm_base),
        ]

        # Errors: the endpoint pulses one status bit per error kind; the capture registers
        # are armed by ERR_STATUS, so they keep the address and opcode of the first error
        # since software last cleared it.
        error = endpoint.o_err_set != 0
        info = endpoint.o_err_info
        m.d.comb += [
            regs.err_status_set.eq(endpoint.o_err_set),
            regs.err_addr_lo_capture.eq(error),
            regs.err_addr_lo_value.eq(info.address[0:32]),
            regs.err_addr_hi_capture.eq(error),
            regs.err_addr_hi_value.eq(info.address[32:LINE_ADDR_BITS]),
            regs.err_info_capture.eq(error),
            regs.err_info_value.channel.eq(info.channel),
            regs.err_info_value.opcode.eq(info.opcode),
        ]

        m.d.comb += [
            regs.status.occupancy.eq(endpoint.o_occupancy),
            regs.status.dev_load.eq(endpoint.o_dev_load),
            regs.perf_cycles_inc.eq(1),
            regs.perf_reads_inc.eq(endpoint.o_perf.read),
            regs.perf_writes_inc.eq(endpoint.o_perf.write),
            regs.perf_busy_inc.eq(endpoint.o_perf.busy),
        ]

    def _engine_registers(self, m: Module, regs, engine) -> None:
        """The engine's ring, doorbell, head, errors and counters, and the checkpoint
        logger's and recovery's registers (docs/checkpoint.md)."""
        m.d.comb += [
            engine.ring_base.eq(Cat(regs.eng_ring_base_lo, regs.eng_ring_base_hi)),
            engine.ring_order.eq(regs.eng_ring_order),
            engine.cq_base.eq(Cat(regs.eng_cq_base_lo, regs.eng_cq_base_hi)),
            engine.tail.eq(regs.eng_tail),
            regs.eng_head.eq(engine.head),
            regs.eng_status.busy.eq(engine.busy),
            regs.eng_status.in_flight.eq(engine.in_flight),
            regs.eng_status.undo_stall.eq(engine.undo_stall),
            regs.eng_status.serial.eq(engine.serial),
            regs.eng_status.init.eq(engine.init),
            regs.eng_err_set.desc_error.eq(engine.err_desc),
            regs.eng_err_set.ring_overrun.eq(engine.err_overrun),
            regs.eng_err_set.pmem_resp.eq(engine.err_pmem),
            regs.eng_err_seq_capture.eq(engine.err_desc),
            regs.eng_err_seq_value.eq(engine.err_seq),
            regs.eng_err_info_capture.eq(engine.err_desc),
            regs.eng_err_info_value.eq(engine.err_info),
            regs.eng_desc_done_inc.eq(engine.ev_desc_done),
            regs.eng_lines_gathered_inc.eq(engine.ev_line_gathered),
            regs.eng_bags_pooled_inc.eq(engine.ev_bag_pooled),
            regs.eng_upd_lines_written_inc.eq(engine.ev_upd_line_written),
            regs.eng_upd_items_inc.eq(engine.ev_upd_item),
            regs.eng_upd_overlaps_inc.eq(engine.ev_upd_overlap),
            regs.eng_pmem_rd_lines_inc.eq(engine.ev_pmem_rd_line),
            regs.eng_pmem_wr_lines_inc.eq(engine.ev_pmem_wr_line),
            regs.eng_busy_inc.eq(engine.ev_busy),
            regs.eng_upd_distinct_rows_inc.eq(engine.ev_upd_rows),
            regs.eng_upd_store_lines_inc.eq(engine.ev_upd_store_line),
            regs.eng_upd_passes_inc.eq(engine.ev_upd_pass),
            *(getattr(regs, f"eng_pmem_{d}_{kind}_inc").eq(getattr(engine, f"ev_pmem_{d}_{kind}"))
              for d, kind in PMEM_KIND_COUNTERS),
        ]

        # Checkpoint logger and recovery (docs/checkpoint.md).
        m.d.comb += [
            engine.ck_recover.eq(regs.ck_cmd.recover),
            regs.ck_status.busy.eq(engine.ck_busy),
            regs.ck_status.done.eq(engine.ck_done),
            regs.ck_status.on.eq(engine.ck_on),
            regs.ck_status.result.eq(engine.ck_result),
            regs.ck_status.log_full.eq(engine.ck_log_full),
            regs.ck_status.overflow.eq(engine.ck_overflow),
            regs.ck_status.rejected.eq(engine.ck_rejected),
            regs.ck_status.log_busy.eq(engine.ck_log_busy),
            regs.ck_status.mlp_busy.eq(engine.ck_mlp_busy),
            regs.ck_status.mlp_error.eq(engine.ck_mlp_error),
            regs.ck_status.mlp_lag.eq(engine.ck_mlp_lag),
            regs.ck_committed.eq(engine.ck_committed),
            regs.ck_epoch.eq(engine.ck_epoch),
            regs.ck_rolled_back.eq(engine.ck_rolled_back),
            regs.ck_mlp_slot.eq(engine.ck_mlp_slot),
            regs.ck_mlp_batch.eq(engine.ck_mlp_batch),
            regs.ck_log_seq.eq(engine.ck_seq),
            regs.ck_overflow_batch.eq(engine.ck_overflow_batch),
            regs.ck_records_inc.eq(engine.ev_record),
            regs.ck_undo_stall_inc.eq(engine.undo_stall),
            regs.ck_mlp_lines_inc.eq(engine.ev_mlp_line),
            regs.ck_mlp_stall_inc.eq(engine.ev_mlp_stall),
            engine.ck_mlp_k.eq(regs.ck_mlp_k),
        ]

    def _coherence(self, m: Module, regs, dcoh, agent, engine, router, gate) -> None:
        """Coherence (docs/dcoh.md, docs/cxl-cache.md): the CXL.cache channels of the
        DCOH and the agent, the mode bits, flips, errors and counters."""
        ctrl = regs.coh_ctrl
        hdm_d, mlp_src_host, cq_host = ctrl.hdm_d, ctrl.mlp_src_host, ctrl.cq_host
        _merge(m, agent.o_d2h_req, dcoh.o_d2h_req, self.o_d2h_req, "d2h_req")
        wiring.connect(m, agent.o_d2h_rsp, wiring.flipped(self.o_d2h_rsp))
        wiring.connect(m, agent.o_d2h_data, wiring.flipped(self.o_d2h_data))
        wiring.connect(m, wiring.flipped(self.i_h2d_req), agent.i_h2d_req)
        # H2D Rsp and Data go by CQID: the DCOH's pool to the DCOH (GO-E of a claim,
        # GO-Err), every other CQID to the agent. Both sinks are always ready.
        dcoh_cqid_bits = dcoh.cqids.bit_length() - 1
        for src, name in ((self.i_h2d_rsp, "h2d_rsp"), (self.i_h2d_data, "h2d_data")):
            to_dcoh = Signal(name=f"{name}_to_dcoh")
            dcoh_in, agent_in = getattr(dcoh, f"i_{name}"), getattr(agent, f"i_{name}")
            m.d.comb += [
                to_dcoh.eq(src.p.cqid[dcoh_cqid_bits:] == DCOH_CQID_BASE >> dcoh_cqid_bits),
                dcoh_in.p.eq(src.p), agent_in.p.eq(src.p),
                dcoh_in.valid.eq(src.valid & to_dcoh),
                agent_in.valid.eq(src.valid & ~to_dcoh),
                src.ready.eq(Mux(to_dcoh, dcoh_in.ready, agent_in.ready)),
            ]
        wiring.connect(m, engine.o_cache_rd, agent.i_rd)
        wiring.connect(m, agent.o_rd, engine.i_cache_rd)
        wiring.connect(m, engine.o_cache_wr, agent.i_wr)
        wiring.connect(m, agent.o_wr, engine.i_cache_wr)
        flip = dcoh.i_flip
        m.d.comb += [
            router.enable.eq(hdm_d),
            gate.enable.eq(hdm_d),
            engine.mlp_src_host.eq(mlp_src_host),
            engine.cq_host.eq(cq_host),
            engine.cq_host_line.eq(Cat(regs.coh_cq_host_base_lo[6:32],
                                       regs.coh_cq_host_base_hi[0:20])),
            engine.scratch_host.eq(ctrl.scratch_host),
            engine.ring_host.eq(ctrl.ring_host),
            engine.scratch_host_line.eq(Cat(regs.coh_scratch_host_base_lo[6:32],
                                            regs.coh_scratch_host_base_hi[0:20])),
            dcoh.i_flip_start.eq(regs.coh_flip.start),
            flip.first_page.eq(regs.coh_flip_first),
            flip.pages.eq(regs.coh_flip_pages),
            flip.to_host.eq(regs.coh_flip.to_host),
            regs.coh_flip_status.busy.eq(dcoh.o_flip.busy),
            regs.coh_flip_status.done.eq(dcoh.o_flip.done),
            regs.coh_flip_status.error.eq(dcoh.o_flip.error),
        ]
        for block, name in ((dcoh, "coh_dcoh_err"), (agent, "coh_cache_err")):
            first = block.o_err_first
            m.d.comb += [
                getattr(regs, f"{name}_set").eq(block.o_err_set),
                # The block keeps its own first-error record: its status clears with
                # the register's bits, so "first since all clear" means the same. A
                # bit the block has just set reaches the register one cycle after
                # o_err_set: not cleared in that cycle (else the block's status fell
                # back to all zero after every error, and the record named the last).
                block.i_err_clear.eq(~(Value.cast(getattr(regs, name)) | block.o_err_set)),
                getattr(regs, f"{name}_info").code.eq(first.code),
                getattr(regs, f"{name}_info").opcode.eq(first.opcode),
                getattr(regs, f"{name}_info").id.eq(first.id),
            ]
        m.d.comb += [
            regs.coh_dcoh_err_addr_lo.eq(dcoh.o_err_first.address[0:32]),
            regs.coh_dcoh_err_addr_hi.eq(dcoh.o_err_first.address[32:LINE_ADDR_BITS]),
        ]
        chk = dcoh.o_host_chk
        m.d.comb += [
            regs.coh_grants_device_inc.eq(gate.ev_grant_device),
            regs.coh_grants_host_inc.eq(gate.ev_grant_host),
            regs.coh_host_flips_inc.eq(chk.valid & chk.ready & chk.p.flipped),
            regs.coh_rd_lines_inc.eq(agent.o_rd.valid & agent.o_rd.ready),
            regs.coh_wr_lines_inc.eq(agent.o_wr.valid & agent.o_wr.ready),
        ]

    def _link_bytes(self, m: Module, regs) -> None:
        """LINK_TX_BYTES / LINK_RX_BYTES: the CXL.mem and CXL.cache messages crossing
        the device's ports, each a 16-byte header slot and a data line 64 bytes more
        (the bench's link model, ``tb/coherent_host.py``)."""
        for name, ports in (
                ("tx", ((self.o_s2m_ndr, 0), (self.o_s2m_drs, 1), (self.o_d2h_req, 0),
                        (self.o_d2h_rsp, 0), (self.o_d2h_data, 1))),
                ("rx", ((self.i_m2s_req, 0), (self.i_m2s_rwd, 1), (self.i_h2d_req, 0),
                        (self.i_h2d_rsp, 0), (self.i_h2d_data, 1)))):
            inc = getattr(regs, f"link_{name}_bytes_inc")
            terms = [Mux(port.valid & port.ready, LINK_HEADER_BYTES + data * LINK_DATA_BYTES, 0)
                     for port, data in ports]
            total = Signal(len(inc), name=f"link_{name}_bytes")
            m.d.comb += [total.eq(sum(terms)), inc.eq(total)]
