"""The TrainingCXL device top: CXL.mem endpoint, embedding engine, CSR block and the
PMEM port.

Host CXL.mem traffic reaches PMEM through :class:`~hw.cxl.mem_endpoint.MemEndpoint`;
the :class:`~hw.engine.engine.Engine` executes the descriptor ring; an
:class:`~hw.bus.axi_arbiter.AxiArbiter` shares the PMEM port between them (one
priority class, round-robin); everything is configured and observed through
:class:`~hw.csr.bank.CsrBank`. Later issues add the DCOH / CXL.cache agent and the
checkpoint logger behind the same ports.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .bus.axi import AXI4LiteSignature, AXI4Signature
from .bus.axi_arbiter import AxiArbiter
from .config import DeviceConfig
from .csr.bank import CsrBank
from .cxl.mem_endpoint import MemEndpoint
from .cxl.messages import S2MDRS, S2MNDR, M2SReq, M2SRwD
from .engine.engine import Engine
from .widths import zext

__all__ = ["Device"]


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
        m.submodules.endpoint = endpoint = MemEndpoint(config=self._config)
        m.submodules.csr_bank = regs = CsrBank(config=self._config)
        m.submodules.engine = engine = Engine(config=self._config)
        m.submodules.pmem_arbiter = arbiter = AxiArbiter(
            addr_width=self._config.pmem_addr_width, data_width=self._config.line_bits,
            id_width=self._config.axi_id_width, priorities=[0, 0])

        wiring.connect(m, wiring.flipped(self.i_m2s_req), endpoint.i_m2s_req)
        wiring.connect(m, wiring.flipped(self.i_m2s_rwd), endpoint.i_m2s_rwd)
        wiring.connect(m, endpoint.o_s2m_ndr, wiring.flipped(self.o_s2m_ndr))
        wiring.connect(m, endpoint.o_s2m_drs, wiring.flipped(self.o_s2m_drs))
        wiring.connect(m, endpoint.pmem, arbiter.m0)
        wiring.connect(m, engine.pmem, arbiter.m1)
        wiring.connect(m, arbiter.sub, wiring.flipped(self.pmem))
        wiring.connect(m, wiring.flipped(self.csr), regs.csr)

        # HDM decoder: byte registers -> line address / line count (Addr[51:6]).
        m.d.comb += [
            endpoint.hdm_base.eq(Cat(regs.hdm_base_lo[6:32], regs.hdm_base_hi[0:20])),
            endpoint.hdm_size.eq(zext(Cat(regs.hdm_size_lo[6:32], regs.hdm_size_hi[0:20]),
                                         len(endpoint.hdm_size))),
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
            regs.err_addr_hi_value.eq(info.address[32:46]),
            regs.err_info_capture.eq(error),
            regs.err_info_value.eq(Cat(info.channel, Const(0, 2), info.opcode)),
        ]

        m.d.comb += [
            regs.status.eq(Cat(zext(endpoint.o_occupancy, 16), endpoint.o_dev_load)),
            regs.perf_cycles_inc.eq(1),
            regs.perf_reads_inc.eq(endpoint.o_perf.read),
            regs.perf_writes_inc.eq(endpoint.o_perf.write),
            regs.perf_busy_inc.eq(endpoint.o_perf.busy),
        ]

        # Embedding engine: ring, doorbell, head, errors and counters.
        aw = self._config.pmem_addr_width
        m.d.comb += [
            engine.ring_base.eq(zext(Cat(regs.eng_ring_base_lo, regs.eng_ring_base_hi), aw)),
            engine.ring_order.eq(regs.eng_ring_order),
            engine.cq_base.eq(zext(Cat(regs.eng_cq_base_lo, regs.eng_cq_base_hi), aw)),
            engine.tail.eq(regs.eng_tail),
            regs.eng_head.eq(engine.head),
            regs.eng_status.eq(Cat(engine.busy, Const(0, 7), engine.in_flight,
                                   engine.undo_stall, engine.serial)),
            regs.eng_err_set.eq(Cat(engine.err_desc, engine.err_overrun, engine.err_pmem)),
            regs.eng_err_seq_capture.eq(engine.err_desc),
            regs.eng_err_seq_value.eq(engine.err_seq),
            regs.eng_err_info_capture.eq(engine.err_desc),
            regs.eng_err_info_value.eq(engine.err_info),
            regs.eng_desc_done_inc.eq(engine.ev_desc_done),
            regs.eng_lines_gathered_inc.eq(engine.ev_line_gathered),
            regs.eng_bags_pooled_inc.eq(engine.ev_bag_pooled),
            regs.eng_upd_lines_written_inc.eq(engine.ev_upd_line_written),
            regs.eng_upd_items_inc.eq(engine.ev_upd_item),
            regs.eng_busy_inc.eq(engine.ev_busy),
        ]

        # Checkpoint logger and recovery (docs/checkpoint.md).
        m.d.comb += [
            engine.ck_recover.eq(regs.ck_cmd[0]),
            regs.ck_status.eq(Cat(engine.ck_busy, engine.ck_done, engine.ck_on, Const(0, 1),
                                  engine.ck_result, Const(0, 2), engine.ck_log_full,
                                  engine.ck_overflow, engine.ck_rejected,
                                  engine.ck_log_busy, engine.ck_mlp_busy,
                                  engine.ck_mlp_error, engine.ck_mlp_lag)),
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
        return m

