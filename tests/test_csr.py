# amaranth: UnusedElaboratable=no
"""CSR description, bank and doc generator (fast tier: Amaranth simulator).

Every bus access goes through :class:`AxiLiteManager`, which inserts seeded random
delays before AW, W and AR valid and random backpressure on B and R; a passive checker
watches that B and R hold their valid and payload until the handshake. The seed is
printed and can be replayed with ``SEED=<n>``.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from amaranth.hdl import Shape, Value
from amaranth.sim import Simulator

from hw.bus.axi import AxiResp
from hw.config import load_config
from hw.csr import Field, Kind, Register, RegisterMap, register_map
from hw.csr.bank import CsrBank
from hw.csr.docgen import REGENERATE, to_c_header, to_json, to_markdown
from hw.csr.docgen import main as docgen_main
from hw.csr.registers import ID_VALUE, WIDE_PARAMS

PRESETS = ["default", "small", "odd"]
REPO = Path(__file__).resolve().parent.parent
OKAY, SLVERR = AxiResp.OKAY, AxiResp.SLVERR


# --- test bench --------------------------------------------------------------------------

class ProtocolError(AssertionError):
    pass


class AxiLiteManager:
    """AXI4-Lite manager for Amaranth testbenches, one transaction per call.

    Valid is raised after a random delay (0..``max_delay`` cycles) and held with a
    stable payload until the handshake; while valid is low the address and data lines
    carry random values, so the bank must not look at them. ``bready``/``rready`` are
    high with probability ``ready_prob`` in each cycle. A transaction that takes more
    than ``timeout`` cycles fails the test instead of hanging it.
    """

    def __init__(self, bus, rng: random.Random, *, max_delay: int = 3,
                 ready_prob: float = 0.5, timeout: int = 100):
        self.bus, self.rng = bus, rng
        self.max_delay, self.ready_prob, self.timeout = max_delay, ready_prob, timeout
        self.addr_mask = (1 << len(bus.awaddr)) - 1
        #: Cycles ``bvalid`` was high in the last write, the handshake cycle included.
        self.b_cycles = 0

    def _delay(self, given: int | None) -> int:
        return self.rng.randint(0, self.max_delay) if given is None else given

    async def write(self, ctx, addr: int, data: int, strb: int = 0xF, *,
                    aw_delay: int | None = None, w_delay: int | None = None) -> int:
        bus, rng = self.bus, self.rng
        aw_delay, w_delay = self._delay(aw_delay), self._delay(w_delay)
        aw_done = w_done = False
        self.b_cycles = 0
        for cycle in range(self.timeout):
            awvalid = not aw_done and cycle >= aw_delay
            wvalid = not w_done and cycle >= w_delay
            bready = rng.random() < self.ready_prob
            ctx.set(bus.awvalid, awvalid)
            ctx.set(bus.awaddr, addr if awvalid else rng.getrandbits(32) & self.addr_mask)
            ctx.set(bus.wvalid, wvalid)
            ctx.set(bus.wdata, data if wvalid else rng.getrandbits(32))
            ctx.set(bus.wstrb, strb if wvalid else rng.getrandbits(4))
            ctx.set(bus.bready, bready)
            _, _, awready, wready, bvalid, bresp = await ctx.tick().sample(
                bus.awready, bus.wready, bus.bvalid, bus.bresp)
            if bvalid and not (aw_done and w_done):
                raise ProtocolError(f"write {addr:#x}: bvalid before AW and W were accepted")
            self.b_cycles += bvalid
            aw_done |= awvalid and awready
            w_done |= wvalid and wready
            if bvalid and bready:
                ctx.set(bus.awvalid, 0)
                ctx.set(bus.wvalid, 0)
                ctx.set(bus.bready, 0)
                return bresp
        raise AssertionError(f"write {addr:#x}: no B response in {self.timeout} cycles")

    async def read(self, ctx, addr: int, *, ar_delay: int | None = None) -> tuple[int, int]:
        bus, rng = self.bus, self.rng
        ar_delay = self._delay(ar_delay)
        ar_done = False
        for cycle in range(self.timeout):
            arvalid = not ar_done and cycle >= ar_delay
            rready = rng.random() < self.ready_prob
            ctx.set(bus.arvalid, arvalid)
            ctx.set(bus.araddr, addr if arvalid else rng.getrandbits(32) & self.addr_mask)
            ctx.set(bus.rready, rready)
            _, _, arready, rvalid, rdata, rresp = await ctx.tick().sample(
                bus.arready, bus.rvalid, bus.rdata, bus.rresp)
            if rvalid and not ar_done:
                raise ProtocolError(f"read {addr:#x}: rvalid before AR was accepted")
            ar_done |= arvalid and arready
            if rvalid and rready:
                ctx.set(bus.arvalid, 0)
                ctx.set(bus.rready, 0)
                return rdata, rresp
        raise AssertionError(f"read {addr:#x}: no R response in {self.timeout} cycles")

    async def pipelined_writes(self, ctx, writes: list[tuple[int, int, int]]) -> list[int]:
        """Offer every AW and W as early as the channel allows, independently.

        Checks that the bank keeps at most one write outstanding (AW accepted, B not yet
        taken) and returns the B responses in order.
        """
        bus, rng = self.bus, self.rng
        n_aw = n_w = 0
        resps: list[int] = []
        for _ in range(self.timeout * len(writes)):
            awvalid, wvalid = n_aw < len(writes), n_w < len(writes)
            bready = rng.random() < self.ready_prob
            if awvalid:
                ctx.set(bus.awaddr, writes[n_aw][0])
            if wvalid:
                ctx.set(bus.wdata, writes[n_w][1])
                ctx.set(bus.wstrb, writes[n_w][2])
            ctx.set(bus.awvalid, awvalid)
            ctx.set(bus.wvalid, wvalid)
            ctx.set(bus.bready, bready)
            _, _, awready, wready, bvalid, bresp = await ctx.tick().sample(
                bus.awready, bus.wready, bus.bvalid, bus.bresp)
            n_aw += awvalid and awready
            n_w += wvalid and wready
            if bvalid and bready:
                resps.append(bresp)
            if max(n_aw, n_w) - len(resps) > 1:
                raise ProtocolError("more than one write outstanding")
            if len(resps) == len(writes):
                ctx.set(bus.bready, 0)
                return resps
        raise AssertionError(f"only {len(resps)} of {len(writes)} B responses arrived")

    async def pipelined_reads(self, ctx, addrs: list[int]) -> list[tuple[int, int]]:
        """Offer every AR back to back; checks one read outstanding; returns R in order."""
        bus, rng = self.bus, self.rng
        n_ar = 0
        got: list[tuple[int, int]] = []
        for _ in range(self.timeout * len(addrs)):
            arvalid = n_ar < len(addrs)
            rready = rng.random() < self.ready_prob
            if arvalid:
                ctx.set(bus.araddr, addrs[n_ar])
            ctx.set(bus.arvalid, arvalid)
            ctx.set(bus.rready, rready)
            _, _, arready, rvalid, rdata, rresp = await ctx.tick().sample(
                bus.arready, bus.rvalid, bus.rdata, bus.rresp)
            n_ar += arvalid and arready
            if rvalid and rready:
                got.append((rdata, rresp))
            if n_ar - len(got) > 1:
                raise ProtocolError("more than one read outstanding")
            if len(got) == len(addrs):
                ctx.set(bus.rready, 0)
                return got
        raise AssertionError(f"only {len(got)} of {len(addrs)} R responses arrived")


async def response_checker(ctx, bus):
    """B and R: once valid is high, valid and payload hold until the handshake."""
    held_b = held_r = None
    async for _, _, bvalid, bready, bresp, rvalid, rready, rdata, rresp in ctx.tick().sample(
            bus.bvalid, bus.bready, bus.bresp, bus.rvalid, bus.rready, bus.rdata, bus.rresp):
        if held_b is not None and (not bvalid or bresp != held_b):
            raise ProtocolError("B changed before its handshake")
        if held_r is not None and (not rvalid or (rdata, rresp) != held_r):
            raise ProtocolError("R changed before its handshake")
        held_b = bresp if bvalid and not bready else None
        held_r = (rdata, rresp) if rvalid and not rready else None


class TB:
    """Owns the bank, its register map, the AXI4-Lite manager and the simulator."""

    def __init__(self, rng: random.Random, config_name: str = "default",
                 registers: RegisterMap | None = None, **manager_args):
        self.config = load_config(config_name)
        self.dut = CsrBank(config=self.config, registers=registers)
        self.map = self.dut.registers
        self.axi = AxiLiteManager(self.dut.csr, rng, **manager_args)
        self.rng = rng

    def run(self, *testbenches, processes=()):
        sim = Simulator(self.dut)
        sim.add_clock(1e-8)
        bus = self.dut.csr

        async def checker(ctx):
            await response_checker(ctx, bus)
        sim.add_testbench(checker, background=True)
        for process in processes:
            sim.add_testbench(process, background=True)
        for testbench in testbenches:
            sim.add_testbench(testbench)
        sim.run()

    async def read(self, ctx, name: str, expect_resp: int = OKAY) -> int:
        data, resp = await self.axi.read(ctx, self.map.offset(name))
        assert resp == expect_resp, f"read {name}: resp {resp}, expected {expect_resp}"
        return data

    async def write(self, ctx, name: str, data: int, strb: int = 0xF,
                    expect_resp: int = OKAY, **delays) -> None:
        resp = await self.axi.write(ctx, self.map.offset(name), data, strb, **delays)
        assert resp == expect_resp, f"write {name}: resp {resp}, expected {expect_resp}"

    async def read_counter(self, ctx, name: str) -> int:
        lo = await self.read(ctx, f"{name}_LO")
        hi = await self.read(ctx, f"{name}_HI")
        return hi << 32 | lo

    def port(self, name: str):
        """A bank port as plain bits (ports of registers with fields are views)."""
        return Value.cast(getattr(self.dut, name))


def byte_mask(strb: int) -> int:
    return sum(0xFF << (8 * i) for i in range(4) if strb >> i & 1)


# --- identification, capabilities, reset values --------------------------------------------

@pytest.mark.parametrize("preset", PRESETS)
def test_identification_and_capabilities(rng, preset):
    tb = TB(rng, preset)
    config = tb.config

    async def bench(ctx):
        assert await tb.read(ctx, "ID") == ID_VALUE == int.from_bytes(b"TCXL", "big")
        assert await tb.read(ctx, "VERSION") == 0x0001_0000
        for param, value in config.params().items():
            name = f"CAP_{param.upper()}"
            if param in WIDE_PARAMS:
                got = await tb.read(ctx, f"{name}_LO") | await tb.read(ctx, f"{name}_HI") << 32
            else:
                got = await tb.read(ctx, name)
            assert got == value, f"{name}: read {got:#x}, config has {value:#x}"
        # The HDM decoder resets to the configured window, on the bus and on the ports.
        for what in ("base", "size"):
            value = getattr(config, f"hdm_{what}")
            lo = await tb.read(ctx, f"HDM_{what.upper()}_LO")
            hi = await tb.read(ctx, f"HDM_{what.upper()}_HI")
            assert hi << 32 | lo == value
            assert ctx.get(tb.port(f"hdm_{what}_lo")) == lo
            assert ctx.get(tb.port(f"hdm_{what}_hi")) == hi

    tb.run(bench)


def test_capabilities_are_consecutive_and_cover_every_parameter():
    config = load_config("default")
    regmap = register_map(config)
    caps = [w for w in regmap.words if w.name.startswith("CAP_")]
    assert [w.offset for w in caps] == list(range(0x040, 0x040 + 4 * len(caps), 4))
    expected = []
    for param in config.params():
        name = f"CAP_{param.upper()}"
        expected += [f"{name}_LO", f"{name}_HI"] if param in WIDE_PARAMS else [name]
    assert [w.name for w in caps] == expected
    assert all(w.register.kind is Kind.CONST for w in caps)


def test_offsets_do_not_depend_on_the_config():
    layouts = {p: [(w.name, w.offset, w.register.kind) for w in register_map(load_config(p)).words]
               for p in PRESETS}
    assert layouts["small"] == layouts["default"] == layouts["odd"]


def test_contract_offsets_and_ports():
    regmap = register_map(load_config("default"))
    expected = {
        "ID": 0x000, "VERSION": 0x004, "HDM_BASE_LO": 0x100, "HDM_BASE_HI": 0x104,
        "HDM_SIZE_LO": 0x108, "HDM_SIZE_HI": 0x10C, "STATUS": 0x180, "ERR_STATUS": 0x200,
        "ERR_ADDR_LO": 0x204, "ERR_ADDR_HI": 0x208, "ERR_INFO": 0x20C, "PERF_CTRL": 0x300,
        "PERF_CYCLES_LO": 0x310, "PERF_CYCLES_HI": 0x314, "PERF_READS_LO": 0x318,
        "PERF_READS_HI": 0x31C, "PERF_WRITES_LO": 0x320, "PERF_WRITES_HI": 0x324,
        "PERF_BUSY_LO": 0x328, "PERF_BUSY_HI": 0x32C, "LINK_TX_BYTES_LO": 0x330,
        "LINK_RX_BYTES_LO": 0x338, "LINK_RX_BYTES_HI": 0x33C,
        "ENG_RING_BASE_LO": 0x400, "ENG_RING_BASE_HI": 0x404, "ENG_RING_ORDER": 0x408,
        "ENG_CQ_BASE_LO": 0x410, "ENG_CQ_BASE_HI": 0x414, "ENG_TAIL": 0x420,
        "ENG_HEAD": 0x424, "ENG_STATUS": 0x428, "ENG_ERR": 0x430, "ENG_ERR_SEQ": 0x434,
        "ENG_ERR_INFO": 0x438, "ENG_DESC_DONE_LO": 0x480, "ENG_LINES_GATHERED_LO": 0x488,
        "ENG_BAGS_POOLED_LO": 0x490, "ENG_UPD_LINES_WRITTEN_LO": 0x498,
        "ENG_UPD_ITEMS_LO": 0x4A0, "ENG_BUSY_LO": 0x4A8, "ENG_BUSY_HI": 0x4AC,
        "ENG_UPD_OVERLAPS_LO": 0x4B0, "ENG_PMEM_RD_LINES_LO": 0x4B8,
        "ENG_PMEM_WR_LINES_LO": 0x4C0, "ENG_PMEM_WR_LINES_HI": 0x4C4,
        "ENG_UPD_DISTINCT_ROWS_LO": 0x4C8, "ENG_UPD_STORE_LINES_LO": 0x4D0,
        "ENG_UPD_PASSES_LO": 0x4D8,
        "ENG_PMEM_RD_LOOKUP_LO": 0x440,
        "ENG_PMEM_RD_UPDATE_LO": 0x448, "ENG_PMEM_RD_CKPT_LO": 0x450,
        "ENG_PMEM_RD_OTHER_LO": 0x458, "ENG_PMEM_WR_UPDATE_LO": 0x460,
        "ENG_PMEM_WR_CKPT_LO": 0x468, "ENG_PMEM_WR_OTHER_LO": 0x470,
        "COH_CTRL": 0x600, "COH_FLIP": 0x604, "COH_FLIP_FIRST": 0x608,
        "COH_FLIP_PAGES": 0x60C, "COH_FLIP_STATUS": 0x610, "COH_DCOH_ERR": 0x620,
        "COH_DCOH_ERR_INFO": 0x624, "COH_DCOH_ERR_ADDR_LO": 0x628,
        "COH_DCOH_ERR_ADDR_HI": 0x62C, "COH_CACHE_ERR": 0x630, "COH_CACHE_ERR_INFO": 0x634,
        "COH_CQ_HOST_BASE_LO": 0x640, "COH_CQ_HOST_BASE_HI": 0x644,
        "COH_SCRATCH_HOST_BASE_LO": 0x648, "COH_SCRATCH_HOST_BASE_HI": 0x64C,
        "COH_GRANTS_DEVICE_LO": 0x680, "COH_GRANTS_HOST_LO": 0x688,
        "COH_HOST_FLIPS_LO": 0x690, "COH_RD_LINES_LO": 0x698, "COH_WR_LINES_LO": 0x6A0,
    }
    assert {n: regmap.offset(n) for n in expected} == expected
    bank = CsrBank(config=load_config("default"))
    members = {name: (m.flow.value.lower(), Shape.cast(m.shape).width)
               for name, m in bank.signature.members.items() if name != "csr"}
    assert members == {
        "hdm_base_lo": ("out", 32), "hdm_base_hi": ("out", 20),
        "hdm_size_lo": ("out", 32), "hdm_size_hi": ("out", 20),
        "status": ("in", 18),
        "err_status_set": ("in", 6), "err_status": ("out", 6),
        "err_addr_lo_value": ("in", 32), "err_addr_lo_capture": ("in", 1),
        "err_addr_hi_value": ("in", 14), "err_addr_hi_capture": ("in", 1),
        "err_info_value": ("in", 8), "err_info_capture": ("in", 1),
        "perf_ctrl": ("out", 1),
        "perf_cycles_inc": ("in", 1), "perf_reads_inc": ("in", 1),
        "perf_writes_inc": ("in", 1), "perf_busy_inc": ("in", 1),
        "link_tx_bytes_inc": ("in", 8), "link_rx_bytes_inc": ("in", 8),
        "eng_ring_base_lo": ("out", 32), "eng_ring_base_hi": ("out", 16),
        "eng_ring_order": ("out", 5), "eng_cq_base_lo": ("out", 32),
        "eng_cq_base_hi": ("out", 16), "eng_tail": ("out", 32), "eng_head": ("in", 32),
        "eng_status": ("in", 19), "eng_err_set": ("in", 3), "eng_err": ("out", 3),
        "eng_err_seq_value": ("in", 32), "eng_err_seq_capture": ("in", 1),
        "eng_err_info_value": ("in", 16), "eng_err_info_capture": ("in", 1),
        "eng_desc_done_inc": ("in", 1), "eng_lines_gathered_inc": ("in", 1),
        "eng_bags_pooled_inc": ("in", 1), "eng_upd_lines_written_inc": ("in", 1),
        "eng_upd_items_inc": ("in", 1), "eng_busy_inc": ("in", 1),
        "eng_upd_overlaps_inc": ("in", 1), "eng_pmem_rd_lines_inc": ("in", 1),
        "eng_pmem_wr_lines_inc": ("in", 1), "eng_upd_distinct_rows_inc": ("in", 32),
        "eng_upd_store_lines_inc": ("in", 1), "eng_upd_passes_inc": ("in", 1),
        **{f"eng_pmem_{k}_inc": ("in", 1) for k in (
            "rd_lookup", "rd_update", "rd_ckpt", "rd_other", "wr_update", "wr_ckpt",
            "wr_other")},
        "ck_cmd": ("out", 1), "ck_status": ("in", 15), "ck_committed": ("in", 32),
        "ck_epoch": ("in", 16), "ck_rolled_back": ("in", 32), "ck_mlp_slot": ("in", 2),
        "ck_mlp_batch": ("in", 32), "ck_mlp_k": ("out", 16), "ck_log_seq": ("in", 32),
        "ck_overflow_batch": ("in", 32), "ck_records_inc": ("in", 1),
        "ck_undo_stall_inc": ("in", 1), "ck_mlp_lines_inc": ("in", 1),
        "ck_mlp_stall_inc": ("in", 1),
        "coh_ctrl": ("out", 5), "coh_flip": ("out", 2), "coh_flip_first": ("out", 32),
        "coh_flip_pages": ("out", 32), "coh_flip_status": ("in", 3),
        "coh_dcoh_err_set": ("in", 11), "coh_dcoh_err": ("out", 11),
        "coh_dcoh_err_info": ("in", 32), "coh_dcoh_err_addr_lo": ("in", 32),
        "coh_dcoh_err_addr_hi": ("in", 14),
        "coh_cache_err_set": ("in", 7), "coh_cache_err": ("out", 7),
        "coh_cache_err_info": ("in", 32),
        "coh_cq_host_base_lo": ("out", 32), "coh_cq_host_base_hi": ("out", 20),
        "coh_scratch_host_base_lo": ("out", 32), "coh_scratch_host_base_hi": ("out", 20),
        "coh_grants_device_inc": ("in", 1), "coh_grants_host_inc": ("in", 1),
        "coh_host_flips_inc": ("in", 1), "coh_rd_lines_inc": ("in", 1),
        "coh_wr_lines_inc": ("in", 1),
    }
    status = regmap["STATUS"]
    assert (status.field("occupancy").bits, status.field("dev_load").bits) == ("[15:0]", "[17:16]")
    err = regmap["ERR_STATUS"]
    assert [(f.name, f.lsb) for f in err.fields] == [
        ("HDM_RANGE", 0), ("RSVD_OPCODE", 1), ("POISON", 2), ("EMPTY_PTL", 3),
        ("UNEXPECTED_FWD", 4), ("PMEM_RESP", 5)]
    info = regmap["ERR_INFO"]
    assert (info.field("channel").bits, info.field("opcode").bits) == ("[1:0]", "[7:4]")


# --- RW, WSTRB, AW/W ordering ----------------------------------------------------------------

def test_rw_masking(rng):
    tb = TB(rng, "small")

    async def bench(ctx):
        await tb.write(ctx, "HDM_BASE_LO", 0xFFFF_FFFF)
        assert await tb.read(ctx, "HDM_BASE_LO") == 0xFFFF_F000
        assert ctx.get(tb.port("hdm_base_lo")) == 0xFFFF_F000
        await tb.write(ctx, "HDM_BASE_LO", 0x1234_5678)
        assert await tb.read(ctx, "HDM_BASE_LO") == 0x1234_5000
        await tb.write(ctx, "HDM_BASE_HI", 0xFFFF_FFFF)
        assert await tb.read(ctx, "HDM_BASE_HI") == 0xF_FFFF
        assert ctx.get(tb.port("hdm_base_hi")) == 0xF_FFFF
        # The other registers kept their reset values.
        assert await tb.read(ctx, "HDM_SIZE_LO") == tb.config.hdm_size & 0xFFFF_FFFF
        assert await tb.read(ctx, "HDM_SIZE_HI") == tb.config.hdm_size >> 32

    tb.run(bench)


def test_rw_random_writes_with_wstrb(rng):
    tb = TB(rng, "odd")
    rw = [r for r in tb.map if r.kind is Kind.RW]

    async def bench(ctx):
        model = {r.name: r.reset for r in rw}
        for _ in range(40):
            reg = rng.choice(rw)
            data, strb = rng.getrandbits(32), rng.getrandbits(4)
            await tb.write(ctx, reg.name, data, strb)
            mask = byte_mask(strb) & reg.write_mask
            model[reg.name] = (model[reg.name] & ~mask) | (data & mask)
            check = rng.choice(rw)
            assert await tb.read(ctx, check.name) == model[check.name]
            assert ctx.get(tb.port(check.port_name)) == model[check.name]

    tb.run(bench)


@pytest.mark.parametrize(("aw_delay", "w_delay"), [(0, 4), (4, 0), (0, 0), (3, 3)],
                         ids=["aw_first", "w_first", "same_cycle", "same_cycle_late"])
def test_aw_w_order(rng, aw_delay, w_delay):
    tb = TB(rng)

    async def bench(ctx):
        for i in range(4):
            value = rng.getrandbits(32) & 0xFFFF_F000
            await tb.write(ctx, "HDM_SIZE_LO", value, aw_delay=aw_delay, w_delay=w_delay)
            assert await tb.read(ctx, "HDM_SIZE_LO") == value, f"write {i}"

    tb.run(bench)


def test_back_to_back_without_backpressure(rng):
    tb = TB(rng, max_delay=0, ready_prob=1.0)

    async def bench(ctx):
        for value in range(0x1000, 0x9000, 0x1000):
            await tb.write(ctx, "HDM_BASE_LO", value)
            assert await tb.read(ctx, "HDM_BASE_LO") == value

    tb.run(bench)


def test_pipelined_manager(rng):
    """A manager that offers the next AW/W/AR before taking the previous response."""
    tb = TB(rng)
    hi = tb.map.offset("HDM_BASE_HI")

    async def bench(ctx):
        values = [rng.getrandbits(20) for _ in range(12)]
        unmapped = 0x700
        writes = [(hi, v, 0xF) for v in values] + [(unmapped, 0, 0xF)]
        resps = await tb.axi.pipelined_writes(ctx, writes)
        assert resps == [OKAY] * len(values) + [SLVERR]
        assert await tb.read(ctx, "HDM_BASE_HI") == values[-1]
        reads = await tb.axi.pipelined_reads(ctx, [tb.map.offset("ID"), unmapped, hi] * 4)
        assert reads == [(ID_VALUE, OKAY), (0, SLVERR), (values[-1], OKAY)] * 4

    tb.run(bench)


def test_reads_and_writes_are_independent(rng):
    tb = TB(rng)
    # Two managers on the one port: one drives only AW/W/B, the other only AR/R.
    writer = AxiLiteManager(tb.dut.csr, random.Random(rng.getrandbits(32)))
    reader = AxiLiteManager(tb.dut.csr, random.Random(rng.getrandbits(32)))
    values = [rng.getrandbits(20) for _ in range(20)]
    written = []

    async def write_bench(ctx):
        for value in values:
            assert await writer.write(ctx, tb.map.offset("HDM_BASE_HI"), value) == OKAY
            written.append(value)

    async def read_bench(ctx):
        seen = []
        while len(written) < len(values):
            data, resp = await reader.read(ctx, tb.map.offset("HDM_BASE_HI"))
            assert resp == OKAY
            seen.append(data)
            data, resp = await reader.read(ctx, tb.map.offset("ID"))
            assert (data, resp) == (ID_VALUE, OKAY)
        # Every value read was written at some point (or is the reset value).
        assert set(seen) <= {tb.config.hdm_base >> 32, *values}
        assert len(seen) > 3

    tb.run(write_bench, read_bench)


# --- read-only registers, unmapped and misaligned addresses ------------------------------------

def test_writes_to_read_only_registers_are_ignored(rng):
    tb = TB(rng)

    async def bench(ctx):
        ctx.set(tb.port("status"), 0x2_0005)
        for name in ("ID", "VERSION", "CAP_MAX_TAGS", "CAP_PMEM_SIZE_LO", "STATUS",
                     "ERR_ADDR_LO", "ERR_INFO", "PERF_READS_LO", "PERF_READS_HI"):
            before = await tb.read(ctx, name)
            await tb.write(ctx, name, ~before & 0xFFFF_FFFF)
            assert await tb.read(ctx, name) == before, name
        assert await tb.read(ctx, "STATUS") == 0x2_0005
        ctx.set(tb.port("status"), 0x3_FFFF)
        assert await tb.read(ctx, "STATUS") == 0x3_FFFF

    tb.run(bench)


def test_fields_are_named_port_members(rng):
    """A register with fields has ports of its field layout: the device drives and reads
    them by field name, each landing in its field's bits (reserved bits read 0); a
    register without fields has a plain port."""
    tb = TB(rng)
    status, eng, ctrl = tb.dut.status, tb.dut.eng_status, tb.dut.coh_ctrl
    assert {name for name, _ in status.shape()} == {"occupancy", "dev_load"}
    assert isinstance(tb.dut.eng_tail, Value)      # no fields: plain bits

    async def bench(ctx):
        ctx.set(status.occupancy, 5)
        ctx.set(status.dev_load, 2)
        assert await tb.read(ctx, "STATUS") == 0x2_0005
        ctx.set(eng.in_flight, 0xA5)
        ctx.set(eng.serial, 1)
        assert await tb.read(ctx, "ENG_STATUS") == 0xA5 << 8 | 1 << 17
        await tb.write(ctx, "COH_CTRL", 0b1110)
        assert (ctx.get(ctrl.hdm_d), ctx.get(ctrl.mlp_src_host), ctx.get(ctrl.cq_host),
                ctx.get(ctrl.scratch_host)) == (0, 1, 1, 1)

    tb.run(bench)


def test_register_field_values_and_pack():
    reg = register_map(load_config("small"))["CK_STATUS"]
    word = reg.pack(done=1, result=2, mlp_lag=1)
    assert word == 1 << 1 | 2 << 4 | 1 << 14
    assert reg.field_values(word) == {**dict.fromkeys(
        ("busy", "on", "log_full", "overflow", "rejected", "log_busy", "mlp_busy",
         "mlp_error"), 0), "done": 1, "result": 2, "mlp_lag": 1}
    with pytest.raises(ValueError, match="register CK_STATUS: 4 does not fit field RESULT "
                                         r"\(2 bits\)"):
        reg.pack(result=4)
    with pytest.raises(KeyError, match="register CK_STATUS has no field 'nope'"):
        reg.pack(nope=1)


@pytest.mark.parametrize("preset", ["default", "small"])
def test_unmapped_and_misaligned_give_slverr(rng, preset):
    tb = TB(rng, preset)
    top = (1 << tb.config.csr_addr_width) - 4
    unmapped = [0x008, 0x03C, 0x0FC, 0x110, 0x184, 0x210, 0x304, 0x340, 0x40C, 0x4E0,
                0x528, 0x5A0, 0x614, 0x6A8, 0x700, top]
    misaligned = [tb.map.offset("HDM_BASE_LO") + 1, tb.map.offset("HDM_BASE_LO") + 2,
                  tb.map.offset("ID") + 3, tb.map.offset("HDM_SIZE_HI") + 2]

    async def bench(ctx):
        before = {n: await tb.read(ctx, n) for n in ("HDM_BASE_LO", "HDM_BASE_HI",
                                                     "HDM_SIZE_LO", "HDM_SIZE_HI")}
        for addr in unmapped + misaligned:
            assert await tb.axi.read(ctx, addr) == (0, SLVERR), hex(addr)
            assert await tb.axi.write(ctx, addr, 0xFFFF_FFFF) == SLVERR, hex(addr)
        # Nothing changed, and the bank still answers mapped addresses.
        assert {n: await tb.read(ctx, n) for n in before} == before
        assert await tb.read(ctx, "ID") == ID_VALUE

    tb.run(bench)


# --- W1C and CAPTURE ----------------------------------------------------------------------

async def pulse(ctx, *assignments):
    """Drive ``(signal, value)`` pairs for one cycle, then back to 0."""
    for signal, value in assignments:
        ctx.set(signal, value)
    await ctx.tick()
    for signal, _ in assignments:
        ctx.set(signal, 0)


def test_w1c_set_clear_and_set_wins(rng):
    tb = TB(rng)
    status_set, status = tb.port("err_status_set"), tb.port("err_status")
    pmem_resp = tb.map["ERR_STATUS"].field("PMEM_RESP").mask

    async def bench(ctx):
        assert await tb.read(ctx, "ERR_STATUS") == 0
        await pulse(ctx, (status_set, 0b000101))
        assert ctx.get(status) == 0b000101
        await pulse(ctx, (status_set, 0b010000))
        assert await tb.read(ctx, "ERR_STATUS") == 0b010101
        await tb.write(ctx, "ERR_STATUS", 0b000001)
        assert await tb.read(ctx, "ERR_STATUS") == 0b010100
        # Clears go by byte strobe: byte 0 disabled clears nothing.
        await tb.write(ctx, "ERR_STATUS", 0xFF, strb=0b1110)
        assert await tb.read(ctx, "ERR_STATUS") == 0b010100
        # A set in the clear cycle wins: PMEM_RESP's set is held from before the write
        # up to the clear cycle and dropped the cycle ``bvalid`` rises (release_set).
        ctx.set(status_set, pmem_resp)
        release_set[0] = True
        await tb.write(ctx, "ERR_STATUS", 0x3F)
        assert not release_set[0]
        assert await tb.read(ctx, "ERR_STATUS") == pmem_resp
        assert ctx.get(status) == pmem_resp
        await tb.write(ctx, "ERR_STATUS", 0xFFFF_FFFF)
        assert await tb.read(ctx, "ERR_STATUS") == 0
        assert ctx.get(status) == 0

    release_set = [False]

    async def release_on_bvalid(ctx):
        while True:
            await ctx.tick()
            if release_set[0] and ctx.get(tb.dut.csr.bvalid):
                ctx.set(status_set, 0)
                release_set[0] = False

    tb.run(bench, processes=[release_on_bvalid])


def test_capture_first_error_since_status_clear(rng):
    tb = TB(rng)
    p = tb.port

    async def report(ctx, bit: int, line_addr: int, info: int):
        """What the device does on an error: one cycle of set and capture together."""
        await pulse(ctx, (p("err_status_set"), 1 << bit),
                    (p("err_addr_lo_value"), line_addr & 0xFFFF_FFFF),
                    (p("err_addr_hi_value"), line_addr >> 32),
                    (p("err_info_value"), info),
                    (p("err_addr_lo_capture"), 1), (p("err_addr_hi_capture"), 1),
                    (p("err_info_capture"), 1))

    async def captured(ctx):
        lo = await tb.read(ctx, "ERR_ADDR_LO")
        return (await tb.read(ctx, "ERR_ADDR_HI")) << 32 | lo, await tb.read(ctx, "ERR_INFO")

    async def bench(ctx):
        assert await captured(ctx) == (0, 0)
        # Value inputs alone change nothing.
        ctx.set(p("err_addr_lo_value"), 0xDEAD)
        assert await captured(ctx) == (0, 0)
        first = (0x2ABC_1234_5678, 0x31)
        await report(ctx, 0, *first)
        assert await captured(ctx) == first
        await report(ctx, 2, 0x1111_2222_3333, 0x83)      # not the first: ignored
        assert await captured(ctx) == first
        await tb.write(ctx, "ERR_STATUS", 0b001)          # still not all-zero
        await report(ctx, 3, 0x0123_4567, 0x92)
        assert await captured(ctx) == first
        await tb.write(ctx, "ERR_STATUS", 0x3F)
        second = (0x3FFF_FFFF_FFFF, 0xF3)
        await report(ctx, 5, *second)
        assert await captured(ctx) == second
        assert await tb.read(ctx, "ERR_STATUS") == 1 << 5

    tb.run(bench)


# --- PULSE and COUNTER64 -------------------------------------------------------------------

def pulse_monitor(signal, log: list):
    async def process(ctx):
        cycle = 0
        async for _, _, value in ctx.tick().sample(signal):
            if value:
                log.append((cycle, value))
            cycle += 1
    return process


def test_pulse_is_one_cycle(rng):
    tb = TB(rng)
    log = []

    async def bench(ctx):
        await tb.write(ctx, "PERF_CTRL", 0)
        assert log == []
        for n in range(3):
            await tb.write(ctx, "PERF_CTRL", 0xFFFF_FFFF)
            assert len(log) == n + 1 and log[-1][1] == 1
        assert await tb.read(ctx, "PERF_CTRL") == 0
        await tb.write(ctx, "PERF_CTRL", 1, strb=0b1110)   # bit 0's byte not enabled
        await ctx.tick().repeat(3)
        assert len(log) == 3
        cycles = [c for c, _ in log]
        assert len(set(cycles)) == 3

    tb.run(bench, processes=[pulse_monitor(tb.port("perf_ctrl"), log)])


def test_counter_counts_and_clear_wins(rng):
    tb = TB(rng)
    p = tb.port

    async def bench(ctx):
        ctx.set(p("perf_cycles_inc"), 1)
        # Exactly as many reads as pulses, with random gaps.
        reads = rng.randint(20, 40)
        for _ in range(reads):
            await pulse(ctx, (p("perf_reads_inc"), 1))
            for _ in range(rng.randint(0, 2)):
                await ctx.tick()
        ctx.set(p("perf_busy_inc"), 1)
        assert await tb.read_counter(ctx, "PERF_READS") == reads
        assert await tb.read_counter(ctx, "PERF_WRITES") == 0
        cycles = await tb.read_counter(ctx, "PERF_CYCLES")
        assert cycles > reads
        assert await tb.read_counter(ctx, "PERF_CYCLES") > cycles
        # Clear with every counter incrementing: in the clear cycle the clear wins, so
        # afterwards each counter holds exactly the cycles inc stayed high after it.
        for name in ("perf_reads_inc", "perf_writes_inc"):
            ctx.set(p(name), 1)
        await tb.write(ctx, "PERF_CTRL", 1)
        for name in ("perf_cycles_inc", "perf_reads_inc", "perf_writes_inc", "perf_busy_inc"):
            ctx.set(p(name), 0)
        counted = tb.axi.b_cycles
        for name in ("PERF_CYCLES", "PERF_READS", "PERF_WRITES", "PERF_BUSY"):
            assert await tb.read_counter(ctx, name) == counted, name

    tb.run(bench)


def test_counter_snapshot_across_carry(rng):
    tb = TB(rng)

    async def bench(ctx):
        count = tb.dut._counts["PERF_BUSY"]
        ctx.set(tb.port("perf_busy_inc"), 1)
        straddled = 0
        for k in range(24):
            start = 0xFFFF_FFFF - k
            ctx.set(count, start)
            lo = await tb.read(ctx, "PERF_BUSY_LO")
            hi = await tb.read(ctx, "PERF_BUSY_HI")
            value = hi << 32 | lo
            # The pair is one sample of the count, taken after `start`.
            assert start <= value <= start + 20, f"k={k}: read {value:#x} after {start:#x}"
            if hi == 0 and ctx.get(count) >> 32:
                straddled += 1          # the carry came between the _LO and _HI reads
        assert straddled > 0
        # A clear also clears the snapshot.
        ctx.set(tb.port("perf_busy_inc"), 0)
        ctx.set(count, 0x5_0000_0000)
        assert await tb.read_counter(ctx, "PERF_BUSY") == 0x5_0000_0000
        await tb.write(ctx, "PERF_CTRL", 1)
        assert await tb.read(ctx, "PERF_BUSY_HI") == 0
        assert await tb.read_counter(ctx, "PERF_BUSY") == 0

    tb.run(bench)


# --- a custom map: the bank is generic ------------------------------------------------------

def test_custom_map(rng):
    regs = RegisterMap([
        Register("SCRATCH", 0x00, Kind.RW, reset=0xA5A5_5A5A),
        Register("STROBE", 0x04, Kind.PULSE, width=16),
        Register("SAMPLE", 0x08, Kind.CAPTURE, width=12, reset=0x123),
        Register("LEVEL", 0x0C, Kind.RO, width=3),
        Register("EVENTS", 0x10, Kind.COUNTER64, clear_by="STROBE"),
    ], addr_width=12)
    tb = TB(rng, "small", regs)
    log = []
    p = tb.port

    async def bench(ctx):
        assert await tb.read(ctx, "SCRATCH") == 0xA5A5_5A5A
        await tb.write(ctx, "SCRATCH", 0x1122_3344, strb=0b0101)
        assert await tb.read(ctx, "SCRATCH") == 0xA522_5A44
        assert await tb.read(ctx, "SAMPLE") == 0x123
        await pulse(ctx, (p("sample_value"), 0xABC), (p("sample_capture"), 1))
        await pulse(ctx, (p("sample_value"), 0xDEF), (p("sample_capture"), 1))
        assert await tb.read(ctx, "SAMPLE") == 0xDEF
        ctx.set(p("level"), 5)
        assert await tb.read(ctx, "LEVEL") == 5
        ctx.set(p("events_inc"), 1)
        await ctx.tick().repeat(10)
        ctx.set(p("events_inc"), 0)
        assert await tb.read_counter(ctx, "EVENTS") == 10
        await tb.write(ctx, "STROBE", 0xBEEE, strb=0b0010)  # bit 0 not written: no clear
        assert log[-1][1] == 0xBE00
        assert await tb.read_counter(ctx, "EVENTS") == 10
        await tb.write(ctx, "STROBE", 0x1234_5679)
        assert log[-1][1] == 0x5679
        assert await tb.read_counter(ctx, "EVENTS") == 0
        assert await tb.read(ctx, "STROBE") == 0

    tb.run(bench, processes=[pulse_monitor(p("strobe"), log)])


# --- validation -------------------------------------------------------------------------------

def R(name, offset, kind=Kind.RW, **kw):
    return Register(name, offset, kind, **kw)


@pytest.mark.parametrize(("registers", "message"), [
    ([R("A", 0x0), R("B", 0x0)], "register B at 0x0 overlaps register A at 0x0"),
    ([R("C", 0x10, Kind.COUNTER64, clear_by="P"), R("D", 0x14), R("P", 0x20, Kind.PULSE)],
     "register D at 0x14 overlaps register C at 0x10"),
    ([R("A", 0x0), R("MIS", 0x6)], "register MIS: offset 0x6 is not a multiple of 4"),
    ([R("FAR", 0x1000)], "register FAR: offset 0x1000 does not fit in the 12-bit CSR space"),
    ([R("C", 0xFFC, Kind.COUNTER64, clear_by="P"), R("P", 0x0, Kind.PULSE)],
     "register C: offset 0xffc does not fit in the 12-bit CSR space"),
    ([R("A", 0x0), R("A_LO", 0x4), R("A", 0x8, Kind.COUNTER64, clear_by="P"),
      R("P", 0x10, Kind.PULSE)],
     "register A: name A_LO is already used by register A_LO"),
    ([R("FOO", 0x0, Kind.CAPTURE), R("FOO_VALUE", 0x4)],
     "register FOO_VALUE: port name foo_value is already used by register FOO"),
    ([R("CSR", 0x0)], "register CSR: port name csr is already used by the AXI4-Lite port"),
    ([R("C", 0x0, Kind.COUNTER64, clear_by="X"), R("X", 0x8)],
     "register C: clear_by must name a PULSE register, not 'X'"),
    ([R("E", 0x0, Kind.CAPTURE, armed_by="Q")],
     "register E: armed_by must name a W1C register, not 'Q'"),
])
def test_map_validation_names_the_register(registers, message):
    with pytest.raises(ValueError) as info:
        RegisterMap(registers, addr_width=12)
    assert message in str(info.value)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "bad"}, "register name must match [A-Z][A-Z0-9_]*, not 'bad'"),
    ({"width": 33}, "register X: width must be between 1 and 32, not 33"),
    ({"width": 4, "reset": 0x10}, "register X: reset 16 does not fit in 4 bits"),
    ({"offset": -4}, "register X: offset must be a non-negative integer, not -4"),
    ({"kind": Kind.RO, "writable_mask": 1},
     "register X: writable_mask applies to RW registers only"),
    ({"width": 8, "writable_mask": 0x100},
     "register X: writable_mask 0x100 does not fit in 8 bits"),
    ({"kind": Kind.COUNTER64}, "register X: a COUNTER64 needs clear_by"),
    ({"kind": Kind.COUNTER64, "width": 32, "clear_by": "P"},
     "register X: a COUNTER64 is 64 bits wide, not 32"),
    ({"clear_by": "P"}, "register X: clear_by applies to COUNTER64 registers only"),
    ({"armed_by": "E"}, "register X: armed_by applies to CAPTURE registers only"),
    ({"width": 8, "fields": [Field("F", 4, 5)]},
     "register X: field F [8:4] does not fit in 8 bits"),
    ({"fields": [Field("F", 0, 4), Field("G", 3, 2)]},
     "register X: field G [4:3] overlaps another field"),
    ({"fields": [Field("F", 0, 1), Field("f", 1, 1)]}, "register X: field F is defined twice"),
    ({"reset": 0x5, "fields": [Field("F", 0, 2)]},
     "register X: reset 0x5 sets bits outside its fields"),
])
def test_register_validation_names_the_register(kwargs, message):
    args = {"name": "X", "offset": 0, "kind": Kind.RW, **kwargs}
    with pytest.raises(ValueError) as info:
        Register(**args)
    assert message in str(info.value)


def test_bank_validation():
    with pytest.raises(TypeError, match="config must be a DeviceConfig"):
        CsrBank(config="default")
    with pytest.raises(TypeError, match="registers must be a RegisterMap"):
        CsrBank(config=load_config("small"), registers=[])
    wide = RegisterMap([R("HIGH", 0x1000)], addr_width=16)
    with pytest.raises(ValueError, match="register HIGH at 0x1000 does not fit in the 12-bit "
                                         "CSR space of config small"):
        CsrBank(config=load_config("small"), registers=wide)
    clash = RegisterMap([R("CONFIG", 0x0)], addr_width=12)
    with pytest.raises(ValueError, match="register CONFIG: port name config clashes"):
        CsrBank(config=load_config("small"), registers=clash)


# --- generated documentation --------------------------------------------------------------------

def test_docs_registers_md_is_up_to_date():
    path = REPO / "docs" / "registers.md"
    expected = to_markdown(register_map(load_config("default")))
    actual = path.read_text() if path.exists() else ""
    assert actual == expected, (
        f"{path.relative_to(REPO)} is stale; regenerate it with `{REGENERATE}`")


def test_docgen_cli_writes_json_and_header(tmp_path, capsys):
    md = tmp_path / "regs.md"
    assert docgen_main(["--config", "odd", "--out", str(tmp_path / "regs"),
                        "--markdown", str(md)]) == 0
    out_dir = tmp_path / "regs" / "odd"
    regmap = register_map(load_config("odd"))
    doc = json.loads((out_dir / "registers.json").read_text())
    assert doc["config"] == "odd" and doc["addr_width"] == 12
    words = {w["name"]: w["offset"] for r in doc["registers"] for w in r["words"]}
    assert words == {w.name: w.offset for w in regmap.words}
    err = next(r for r in doc["registers"] if r["name"] == "ERR_STATUS")
    assert [p["name"] for p in err["ports"]] == ["err_status_set", "err_status"]
    assert (out_dir / "registers.json").read_text() == to_json(regmap)
    header = (out_dir / "tcxl_regs.h").read_text()
    assert header == to_c_header(regmap)
    assert md.read_text() == to_markdown(regmap)
    for line in ("#ifndef TCXL_REGS_H", "#define TCXL_REG_PERF_BUSY_HI 0x32Cu",
                 "#define TCXL_ERR_STATUS_PMEM_RESP_SHIFT 5",
                 "#define TCXL_ERR_INFO_OPCODE_MASK 0x000000F0u",
                 "#define TCXL_CAP_HDM_BASE_LO_RESET 0x40000000u"):
        assert line in header
    assert "Generated" in header
    assert docgen_main(["--config", "nonexistent"]) == 2
    capsys.readouterr()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_header_compiles(tmp_path):
    src = tmp_path / "use.c"
    (tmp_path / "tcxl_regs.h").write_text(to_c_header(register_map(load_config("default"))))
    src.write_text('#include "tcxl_regs.h"\n'
                   "unsigned f(unsigned v) { return (v & TCXL_STATUS_DEV_LOAD_MASK) >> "
                   "TCXL_STATUS_DEV_LOAD_SHIFT; }\n")
    subprocess.run(["cc", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", str(src)],
                   check=True, cwd=tmp_path)
