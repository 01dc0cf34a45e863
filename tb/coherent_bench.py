"""The coherent device bench: :class:`~tb.device_tb.DeviceTB` with the GPU's side of
CXL.cache and HDM-D (``docs/coherence.md``).

:class:`CohBench` adds the CXL.cache BFM, the GPU home agent, the GPU's write-back cache
of device lines and the coherence checker of :mod:`tb.coherent_host`, and drives the
DCOH's CSRs (flips, errors, counters). One :class:`~tb.cxl_protocol.ProtocolChecker`
(the agent's) follows every transaction on the link: the host's CXL.mem requests, the
DCOH's and the cache agent's D2H requests, the snoops; the host models answer from its
table, and :meth:`CohBench.finish` fails on any transaction left incomplete.
:class:`CoherentDriver` is the engine driver whose buffers and descriptors go into the
GPU's cache (dirty), so every engine read of a host-bias line fetches the GPU's data
through RdCurr -> write-back -> MemRdFwd. Used by the tests (``tb/test_coherence.py``)
and the bench (``tb/bench_coherence.py``).
"""

from __future__ import annotations

import random

import cocotb
from cocotb.triggers import Lock

from hw.config import DeviceConfig
from hw.csr.registers import register_map
from hw.cxl.dcoh import DcohError
from hw.top import DCOH_CQID_BASE
from sim.embedding import LINE_BYTES
from tb.cache_home import HomeTiming
from tb.ckpt_driver import CkptDriver
from tb.coherent_host import (
    CoherenceChecker,
    CoherentHostAgent,
    CxlCacheBfm,
    GpuHome,
    HostCache,
)
from tb.device_tb import DeviceTB
from tb.engine_driver import EngineDriver
from tb.pmem import PmemTiming

#: COH_CTRL and COH_FLIP_STATUS bits, from the register map (the positions of these
#: fields do not depend on the config).
_MAP = register_map(DeviceConfig())
HDM_D, MLP_SRC_HOST, CQ_HOST = (_MAP["COH_CTRL"].pack(**{f: 1})
                                for f in ("hdm_d", "mlp_src_host", "cq_host"))
FLIP_BUSY, FLIP_DONE, FLIP_ERROR = (_MAP["COH_FLIP_STATUS"].pack(**{f: 1})
                                    for f in ("busy", "done", "error"))


def gpu_addr(cfg, offset: int) -> int:
    """A GPU-memory byte address ``offset`` into a region outside the HDM window: below
    it when there is room (``small``: HDM at 1 MiB), else right above it."""
    if cfg.hdm_base >= offset + (64 << 10):
        return offset
    return cfg.hdm_base + cfg.hdm_size + offset


class CohBench:
    """A :class:`DeviceTB` with the host side of coherence around it (module docstring).

    Members
    -------
    tb, agent, cbfm, gpu, checker, cache:
        The device bench, its :class:`CoherentHostAgent`, the :class:`CxlCacheBfm`, the
        :class:`GpuHome`, the :class:`CoherenceChecker` and the GPU's :class:`HostCache`.
    lpp:
        Lines per bias page.

    ``pmem_timing`` replaces the PMEM timing of the ``pmem_*`` test parameters (a test
    that needs slow PMEM reads, for example).
    """

    def __init__(self, dut, name: str, *, noise: bool, capacity: int = 256,
                 gpu_latency: int | None = None, pmem_timing: PmemTiming | None = None):
        self.tb = tb = DeviceTB(dut, name, idle=noise, backpressure=noise, timing=pmem_timing)
        cfg, rng, params = tb.config, tb.rng, tb.params
        self.cfg = cfg
        self.agent = tb.agent = CoherentHostAgent(cfg, tb.bfm, tb.loop, rng=rng,
                                                  pmem_line=tb.pmem_line, log=tb.log)
        self.cbfm = CxlCacheBfm(dut, tb.loop, rng=rng, idle=tb.idle,
                                backpressure=tb.backpressure, on_d2h=self._d2h)
        latency = gpu_latency or params.get("gpu_latency", rng.choice((20, 100)))
        timing = HomeTiming(read_latency=latency, write_latency=max(1, latency // 4),
                            jitter=8 if noise else 0, reorder=noise,
                            split_writes=0.3 if noise else 0.0)
        self.gpu = GpuHome(self.cbfm, tb.loop, rng=rng, timing=timing)
        self.lpp = cfg.page_bytes // LINE_BYTES
        self.checker = CoherenceChecker(lines_per_page=self.lpp,
                                        initial=self.agent.golden.read)
        host_latency = params.get("host_latency", rng.choice((4, 30)))
        self.cache = HostCache(self.agent, self.checker, tb.loop,
                               rng=random.Random(rng.getrandbits(64)), capacity=capacity,
                               latency=host_latency, jitter=6 if noise else 0,
                               claim_full=0.25, log=tb.log)
        # One protocol checker for the link; DCOH answers on H2D go through the GPU
        # home's queues (the same H2D channels), shown to the checker when taken.
        self.protocol = self.gpu.home.protocol = self.agent.protocol
        home = self.gpu.home

        def h2d(channel: str, f: dict, checked: bool = True):
            send = home.answer if checked else home.raw
            return send(channel.removeprefix("h2d_"), tb.loop.cycle, f)

        self.cache.h2d = h2d
        self.agent_cqids = cfg.cache_cqids + cfg.cache_write_cqids
        self._flip_lock = Lock()
        tb.log.info("GPU home latency %d, host forward latency %d, page %d bytes",
                    latency, host_latency, cfg.page_bytes)

    # --- routing ------------------------------------------------------------------------
    def _d2h(self, channel: str, f: dict, cycle: int) -> None:
        if channel != "req":
            self.gpu.d2h(channel, f, cycle)
            return
        device_line = self.agent.decode(f["address"]) is not None
        cqid = f["cqid"]
        if device_line:
            assert DCOH_CQID_BASE <= cqid < DCOH_CQID_BASE + self.cfg.dcoh_cqids, (
                f"cycle {cycle}: D2H Req for device line {f['address']:#x} with CQID {cqid}, "
                f"outside the DCOH's pool")
            self.cache.d2h_req(f, cycle)
        else:
            assert cqid < self.agent_cqids, (
                f"cycle {cycle}: D2H Req for GPU line {f['address']:#x} with CQID {cqid}, "
                f"outside the cache agent's CQIDs")
            self.gpu.d2h(channel, f, cycle)

    # --- life cycle ---------------------------------------------------------------------
    async def start(self, ctrl: int = HDM_D) -> None:
        tb = self.tb
        await tb.start()
        await self.start_coherence(ctrl)

    async def reset_device(self) -> list:
        """Reset the device in the middle of whatever runs (no power failure): the host
        cache drops the DCOH's requests it has not answered, the checker ends every
        device permission and device-bias page, the CXL.cache models drop what was in
        flight; then :meth:`DeviceTB.reset_device`. COH_CTRL is 0 afterwards: call
        :meth:`start_coherence` again. Returns the CXL.mem writes lost."""
        await self.tb.loop.wait_cycles(1)   # in the loop's drive phase, as the M2S BFM wants
        self.cache.device_reset()
        self.checker.device_reset()
        hooks = self.tb.reset_hooks
        hooks.append(self._models_reset)
        try:
            lost, _ = await self.tb.reset_device()
        finally:
            hooks.remove(self._models_reset)
        return lost

    def _models_reset(self) -> None:
        self.cbfm.device_reset()
        self.gpu.device_reset()

    async def start_coherence(self, ctrl: int = HDM_D) -> None:
        """Wait for the bias table's reset sweep, then write COH_CTRL."""
        await self.wait_flip(timeout=4 * self.cfg.dcoh_pages + 10_000)
        await self.tb.csr.write("COH_CTRL", ctrl)

    async def wait_flip(self, *, timeout: int = 400_000) -> int:
        loop, start = self.tb.loop, self.tb.loop.cycle
        while True:
            status = await self.tb.csr.read("COH_FLIP_STATUS")
            if not status & FLIP_BUSY:
                return status
            if loop.cycle - start > timeout:
                raise TimeoutError(f"COH_FLIP_STATUS {status:#x}: busy for {timeout} cycles")
            await loop.wait_cycles(16)

    async def flip(self, first: int, pages: int, *, to_host: bool = False,
                   retries: int = 4, must_succeed: bool = True) -> int:
        """Flip pages ``first ..`` to device (or host) bias; a contended flip to device is
        retried, as the driver must (``docs/dcoh.md``). Returns the contended attempts.
        Against a host that keeps touching the page every attempt may be contended (the
        DCOH does not retry, by design): that fails only with ``must_succeed``."""
        async with self._flip_lock:     # one flip command at a time
            return await self._flip(first, pages, to_host, retries, must_succeed)

    async def _flip(self, first: int, pages: int, to_host: bool, retries: int,
                    must_succeed: bool) -> int:
        csr = self.tb.csr
        for attempt in range(retries + 1):
            error = await self._flip_once(first, pages, to_host)
            if not error:
                return attempt
            assert not to_host, f"flip to host bias of pages {first}+{pages} failed"
            err = await csr.read("COH_DCOH_ERR")
            assert err == 1 << int(DcohError.FLIP_CONTENDED), (
                f"COH_DCOH_ERR {err:#x} after a failed flip: only FLIP_CONTENDED expected")
            await csr.write("COH_DCOH_ERR", err)
            self.tb.log.info("flip of pages %d+%d contended (attempt %d)", first, pages, attempt)
        if must_succeed:
            raise AssertionError(f"flip of pages {first}+{pages} contended {retries + 1} times")
        return retries + 1

    async def flip_once(self, first: int, pages: int, *, to_host: bool = False) -> bool:
        """One flip command, not retried, whatever its error; returns
        COH_FLIP_STATUS.ERROR (the caller reads COH_DCOH_ERR)."""
        async with self._flip_lock:
            return await self._flip_once(first, pages, to_host)

    async def _flip_once(self, first: int, pages: int, to_host: bool) -> bool:
        csr = self.tb.csr
        t0 = self.tb.loop.cycle
        await csr.write("COH_FLIP_FIRST", first)
        await csr.write("COH_FLIP_PAGES", pages)
        await csr.write_fields("COH_FLIP", start=1, to_host=int(to_host))
        await self.tb.loop.wait_cycles(4)
        status = await self.wait_flip()
        assert status & FLIP_DONE, f"COH_FLIP_STATUS {status:#x}: not done"
        error = bool(status & FLIP_ERROR)
        self.checker.flip_done(first, pages, to_host=to_host, ok=not error, t_start=t0)
        return error

    def host_lines(self, first_page: int, pages: int) -> list[int]:
        base = self.agent.host_line(first_page * self.lpp)
        return list(range(base, base + pages * self.lpp))

    async def gpu_traffic(self, lines: list[int], n: int, *, parallel: int = 4,
                          store: float = 0.5) -> int:
        """``n`` random GPU loads and stores (whole lines or byte-enabled) of ``lines``
        through the cache, ``parallel`` at a time."""
        rng = random.Random(self.tb.rng.getrandbits(64))
        cache = self.cache
        left = [n]

        async def worker():
            while left[0] > 0:
                left[0] -= 1
                line = rng.choice(lines)
                if rng.random() < store:
                    be = None if rng.random() < 0.5 else rng.getrandbits(LINE_BYTES) or 1
                    await cache.store(line, rng.randbytes(LINE_BYTES), be)
                else:
                    await cache.load(line)
                if rng.random() < 0.3:
                    await self.tb.loop.wait_cycles(rng.randint(1, 40))

        tasks = [cocotb.start_soon(worker()) for _ in range(parallel)]
        for t in tasks:
            await t
        return n

    async def check_errors(self, dcoh: int = 0, cache: int = 0) -> None:
        """COH_DCOH_ERR / COH_CACHE_ERR hold exactly the expected bits; clear them."""
        await self.tb.loop.wait_cycles(8)
        csr = self.tb.csr
        for name, want in (("COH_DCOH_ERR", dcoh), ("COH_CACHE_ERR", cache)):
            got = await csr.read(name)
            assert got == want, f"{name} {got:#x}, expected {want:#x}"
            if got:
                await csr.write(name, got)
                assert await csr.read(name) == 0, f"{name} not cleared"

    def link_bytes(self) -> tuple[int, int]:
        """Link bytes the bench saw the device send and take so far, as its LINK_TX_BYTES
        and LINK_RX_BYTES count them: the host agent's completed CXL.mem requests and the
        GPU home's CXL.cache messages (without the DCOH's: HDM-H only)."""
        stats = self.agent.stats
        return stats.s2m_bytes + self.gpu.d2h_bytes, stats.m2s_bytes + self.gpu.h2d_bytes

    async def finish(self) -> None:
        """Write back every cached line, wait for everything, check every model."""
        tb = self.tb
        await self.cache.flush()
        await self.cache.idle()
        await tb.loop.wait_until(self.gpu.home.idle, timeout=100_000, what="GPU home idle")
        await self.agent.wait_idle()
        self.protocol.finish()
        lines = self.cache.check_final(tb.pmem_line)
        problems = self.cbfm.violations()
        assert not problems, "CXL.cache protocol violations:\n" + "\n".join(problems)
        counters = {n: await tb.csr.read64(n) for n in (
            "COH_GRANTS_DEVICE", "COH_GRANTS_HOST", "COH_HOST_FLIPS", "COH_RD_LINES",
            "COH_WR_LINES", "LINK_TX_BYTES", "LINK_RX_BYTES")}
        tb.log.info("coherence checks: %d (%d lines at the end); host cache %s; forwards "
                    "open %d; CXL.cache transfers %d; counters %s; protocol flows %s",
                    self.checker.checks, lines, self.cache.stats, self.cache.open_fwds,
                    len(self.gpu.home.log), counters, self.protocol.completed)
        self.counters = counters
        await tb.finish()


async def snapshot_bench(dut, name: str, *, noise: bool, mlp_bytes: int,
                         gpu_latency: int) -> tuple[CohBench, CkptDriver]:
    """A started :class:`CohBench` with ``COH_CTRL`` = HDM_D | MLP_SRC_HOST and a
    formatted, recovered :class:`CkptDriver` (MLP slots of ``mlp_bytes``) whose
    MLP_CHECKPOINTs copy GPU memory; the GPU home answers after ``gpu_latency``."""
    bench = CohBench(dut, name, noise=noise, gpu_latency=gpu_latency)
    await bench.start(HDM_D | MLP_SRC_HOST)
    drv = CkptDriver(bench.tb, log_slots=8, mlp_bytes=mlp_bytes, mlp_src_host=True)
    await drv.setup()
    drv.format()
    res = await drv.recover()
    assert res.status == 0, res
    return bench, drv


class CoherentDriver(EngineDriver):
    """An :class:`EngineDriver` whose host writes go into the GPU's cache and whose
    reads see the coherent value; with ``cq_host`` the completion records are read from
    GPU memory at ``cq_host`` (a byte address)."""

    def __init__(self, bench: CohBench, *, cq_host: int | None = None,
                 write_back: bool = False, **kw):
        super().__init__(bench.tb, cq_host=cq_host,
                         cq_gpu=bench.gpu if cq_host is not None else None, **kw)
        self.bench = bench
        #: Write every put back before returning (the driver contract without HDM_D).
        self.write_back = write_back

    async def put(self, addr: int, data: bytes) -> None:
        assert addr % LINE_BYTES == 0, f"unaligned put at {addr:#x}"
        data = data + bytes(-len(data) % LINE_BYTES)
        agent, cache = self.tb.agent, self.bench.cache
        tasks = [cocotb.start_soon(cache.store(agent.host_line(addr // LINE_BYTES + i),
                                               data[i * LINE_BYTES:(i + 1) * LINE_BYTES]))
                 for i in range(len(data) // LINE_BYTES)]
        for t in tasks:
            await t
        if self.write_back:
            first = agent.host_line(addr // LINE_BYTES)
            await cache.flush(range(first, first + len(data) // LINE_BYTES))

    async def _table_written(self, table) -> None:
        """Nothing to do: the host cache's puts reach the device as CXL.mem requests
        (fills for ownership, write-backs), which empty the row store."""

    def coherent_line(self, dev: int) -> bytes:
        entry = self.bench.cache.lines.get(self.tb.agent.host_line(dev))
        if entry is not None and entry[0] == "M":
            return entry[1]
        return self.tb.pmem_line(dev)

    def image(self, addr: int, nbytes: int) -> bytes:
        first, last = addr // LINE_BYTES, (addr + nbytes - 1) // LINE_BYTES
        raw = b"".join(self.coherent_line(x) for x in range(first, last + 1))
        off = addr - first * LINE_BYTES
        return raw[off:off + nbytes]

    def _in_cq(self, dev: int) -> bool:
        first = self.cq_addr // LINE_BYTES
        return first <= dev < first + (1 << self.order)

    def expect_written(self, addr: int, data: bytes) -> None:
        checker, agent = self.bench.checker, self.tb.agent
        for i in range(len(data) // LINE_BYTES):
            dev = addr // LINE_BYTES + i
            chunk = data[i * LINE_BYTES:(i + 1) * LINE_BYTES]
            if self.cq_host is not None and self._in_cq(dev):
                continue
            if chunk != checker.coherent(dev):
                checker.device_wrote(dev, chunk, f"descriptor output at {addr:#x}")
                agent.device_wrote(dev, chunk)

    async def wait(self, **kw) -> None:
        try:
            await super().wait(**kw)
        except TimeoutError as exc:
            b = self.bench
            raise TimeoutError(
                f"{exc}; host: {b.cache.open_fwds} forwards open, {b.cache.locks.busy()} "
                f"lines locked, stats {b.cache.stats}; CXL.mem: "
                f"{b.agent._describe_pending()}; GPU home: {b.gpu.home.outstanding()}; "
                f"COH_FLIP_STATUS {await b.tb.csr.read('COH_FLIP_STATUS'):#x}, "
                f"COH_DCOH_ERR {await b.tb.csr.read('COH_DCOH_ERR'):#x}, ENG_STATUS "
                f"{await b.tb.csr.read('ENG_STATUS'):#x}, ENG_ERR "
                f"{await b.tb.csr.read('ENG_ERR'):#x}") from None

    def check(self, exp, *, table: bool = True) -> None:
        super().check(exp, table=table)
        if exp.out_image is not None:
            self.bench.checker.device_read_checked(len(exp.out_image) // LINE_BYTES)


def align_page(drv: EngineDriver, page_bytes: int) -> int:
    """Move the driver's heap to the next page boundary; returns the page."""
    drv.heap.next = -(-drv.heap.next // page_bytes) * page_bytes
    return drv.heap.next // page_bytes
