"""cocotb tests of the coherent device: the GPU caches device lines, the engine reads and
writes them through the DCOH, and reads and writes GPU memory through CXL.cache
(``docs/coherence.md``).

The bench (:class:`CohBench`) adds to :class:`~tb.device_tb.DeviceTB` the CXL.cache BFM,
the GPU home agent, the GPU's write-back cache of device lines and the coherence checker
of :mod:`tb.coherent_host`. The engine driver (:class:`CoherentDriver`) writes tables,
buffers and descriptors **into the GPU's cache** (dirty, not written back), so every
engine read of a host-bias line must fetch the GPU's data through RdCurr -> write-back
-> MemRdFwd; it reads results through the coherent view (the GPU's dirty copy, else
PMEM). Every data-moving test runs with random idle cycles on every source and random
backpressure on every sink of all ten CXL channels (and PMEM, CSR), on and off; the
seed is printed and ``SEED=<n>`` replays it.

Test parameters: ``n_desc`` (LOOKUPs per test), ``n_gpu`` (GPU cache operations of the
background traffic), ``gpu_latency`` (GPU home's answer latency, cycles),
``host_latency`` (the host's forward latency).
"""

from __future__ import annotations

import random

import cocotb
import numpy as np
from cocotb.triggers import Lock

from hw.cxl.cache_agent import CacheError
from hw.cxl.dcoh import DcohError
from hw.cxl.messages import Codec, D2HReqOpcode, H2DRspOpcode, M2SReqOpcode
from hw.engine.completion import RECORD
from hw.engine.descriptor import DescKind, PoolMode, Status
from hw.top import DCOH_CQID_BASE
from sim import ckpt
from sim import embedding as emb
from sim.embedding import BF16, FP32, LINE_BYTES
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
from tb.engine_driver import Batch, EngineDriver, random_table

NOISE = {"noise": [False, True]}
HDM_D, MLP_SRC_HOST, CQ_HOST = 1, 2, 4
FLIP_BUSY, FLIP_DONE, FLIP_ERROR = 1, 2, 4
_RECORD = Codec(RECORD)


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
    """

    def __init__(self, dut, name: str, *, noise: bool, capacity: int = 256,
                 gpu_latency: int | None = None):
        self.tb = tb = DeviceTB(dut, name, idle=noise, backpressure=noise)
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
                               latency=host_latency, jitter=6 if noise else 0, log=tb.log)
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
        await self.wait_flip(timeout=4 * self.cfg.dcoh_pages + 10_000)   # the reset sweep
        await tb.csr.write("COH_CTRL", ctrl)

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
            t0 = self.tb.loop.cycle
            await csr.write("COH_FLIP_FIRST", first)
            await csr.write("COH_FLIP_PAGES", pages)
            await csr.write("COH_FLIP", 1 | int(to_host) << 1)
            await self.tb.loop.wait_cycles(4)
            status = await self.wait_flip()
            assert status & FLIP_DONE, f"COH_FLIP_STATUS {status:#x}: not done"
            error = bool(status & FLIP_ERROR)
            self.checker.flip_done(first, pages, to_host=to_host, ok=not error, t_start=t0)
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

    async def finish(self) -> None:
        """Write back every cached line, wait for everything, check every model."""
        tb = self.tb
        await self.cache.flush()
        await self.cache.idle()
        await tb.loop.wait_until(self.gpu.home.idle, timeout=100_000, what="GPU home idle")
        lines = self.cache.check_final(tb.pmem_line)
        problems = self.cbfm.violations()
        assert not problems, "CXL.cache protocol violations:\n" + "\n".join(problems)
        counters = {n: await tb.csr.read64(n) for n in (
            "COH_GRANTS_DEVICE", "COH_GRANTS_HOST", "COH_HOST_FLIPS", "COH_RD_LINES",
            "COH_WR_LINES")}
        tb.log.info("coherence checks: %d (%d lines at the end); host cache %s; forwards "
                    "open %d; CXL.cache transfers %d; counters %s", self.checker.checks,
                    lines, self.cache.stats, self.cache.open_fwds, len(self.gpu.home.log),
                    counters)
        self.counters = counters
        await tb.finish()


class CoherentDriver(EngineDriver):
    """An :class:`EngineDriver` whose host writes go into the GPU's cache and whose
    reads see the coherent value; with ``cq_host`` the completion records are read from
    GPU memory at ``cq_host`` (a byte address)."""

    def __init__(self, bench: CohBench, *, cq_host: int | None = None,
                 write_back: bool = False, **kw):
        super().__init__(bench.tb, **kw)
        self.bench = bench
        self.cq_host = cq_host
        #: Write every put back before returning (the driver contract without HDM_D).
        self.write_back = write_back

    async def setup(self) -> None:
        await super().setup()
        if self.cq_host is not None:
            await self.tb.csr.write64("COH_CQ_HOST_BASE", self.cq_host)

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
        checker, golden = self.bench.checker, self.tb.agent.golden
        for i in range(len(data) // LINE_BYTES):
            dev = addr // LINE_BYTES + i
            chunk = data[i * LINE_BYTES:(i + 1) * LINE_BYTES]
            if self.cq_host is not None and self._in_cq(dev):
                continue
            if chunk != checker.coherent(dev):
                checker.device_wrote(dev, chunk, f"descriptor output at {addr:#x}")
                golden.set(dev, chunk)

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

    def record(self, seq: int) -> dict:
        if self.cq_host is None:
            return super().record(seq)
        slot = seq % (1 << self.order)
        raw = self.bench.gpu.read_bytes(self.cq_host + slot * LINE_BYTES, LINE_BYTES)
        return _RECORD.unpack(int.from_bytes(raw, "little"))

    def check(self, exp, *, table: bool = True) -> None:
        super().check(exp, table=table)
        if exp.out_image is not None:
            self.bench.checker.device_read_checked(len(exp.out_image) // LINE_BYTES)


def _align(drv: EngineDriver, page_bytes: int) -> int:
    """Move the driver's heap to the next page boundary; returns the page."""
    drv.heap.next = -(-drv.heap.next // page_bytes) * page_bytes
    return drv.heap.next // page_bytes


async def _layout(bench: CohBench, rng: np.random.Generator, *, cq_host: int | None = None,
                  tables: int = 2, write_back: bool = False):
    """Driver and tables: page 0 ring and CQ, table pages, buffer pages, and two scratch
    pages at the end of the HDM window for background GPU traffic."""
    cfg, pb = bench.cfg, bench.cfg.page_bytes
    window_pages = min(cfg.hdm_size, cfg.pmem_size) // pb
    scratch = window_pages - 2
    drv = CoherentDriver(bench, ring_order=3, heap_end=scratch * pb, cq_host=cq_host,
                         write_back=write_back)
    await drv.setup()
    first = _align(drv, pb)
    dims = [d for d in (16, 40, 64) if d <= cfg.engine_max_dim]
    made = []
    for i in range(tables):
        dtype = BF16 if i % 2 else FP32
        made.append(await drv.add_table(random_table(rng, 24, dims[i % len(dims)], dtype),
                                        rng=rng))
    table_pages = (first, _align(drv, pb) - first)
    _align(drv, pb)
    return drv, made, table_pages, (scratch, 2)


def _batch(rng: np.random.Generator, rows: int) -> Batch:
    idx, off = emb.random_bags(rng, int(rng.integers(1, 6)), rows, pooling=3)
    weights = rng.standard_normal(len(idx)).astype(np.float32) if rng.random() < 0.3 else None
    return Batch(idx, off, False, weights)


async def _lookups(bench: CohBench, drv: CoherentDriver, tables, rng, rounds: int, *,
                   after_round=None) -> None:
    """``rounds`` doorbells of 1 to 3 LOOKUPs each; then the GPU reads every output line
    through its cache (checked against the coherent value: the engine's write)."""
    mark = drv.heap.next
    agent = bench.agent
    for r in range(rounds):
        drv.heap.release(mark)
        exps = []
        for _ in range(int(rng.integers(1, 4))):
            t = tables[int(rng.integers(len(tables)))]
            mode = PoolMode(int(rng.integers(3)))
            b = _batch(rng, t.rows)
            if mode is not PoolMode.SUM:
                b.weights = None
            exps.append(await drv.lookup(t, b, mode=mode, batch_id=r))
        await drv.run()
        for exp in exps:
            assert exp.status is Status.OK, exp.status
            first = exp.out_addr // LINE_BYTES
            for i in range(len(exp.out_image) // LINE_BYTES):
                await bench.cache.load(agent.host_line(first + i))
        if after_round is not None:
            await after_round(r)


# --- tests -----------------------------------------------------------------------------------

@cocotb.test()
@cocotb.parametrize(**NOISE, bias=["host", "device"])
async def test_lookup_through_host_cache(dut, noise, bias):
    """The GPU writes tables, index / offset / weight buffers and descriptors into its
    cache (dirty); with ``bias=device`` the table pages are flipped to device bias
    first. Each doorbell's descriptors, buffers and (host bias) rows reach the engine
    through RdCurr -> write-back -> MemRdFwd, its outputs through RdOwn -> MemWrFwd;
    LOOKUP results and records are checked bit for bit, then read by the GPU through
    its cache. Meanwhile the GPU runs random loads and stores on two scratch pages. In
    device bias, after each doorbell the GPU reads a table line (the host check flips
    the page back) and the driver flips the table pages to device bias again."""
    bench = CohBench(dut, f"lookup_{bias}", noise=noise)
    await bench.start()
    tb = bench.tb
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    drv, tables, (tp, tn), (sp, sn) = await _layout(bench, rng)
    if bias == "device":
        await bench.flip(tp, tn)
    traffic = cocotb.start_soon(bench.gpu_traffic(bench.host_lines(sp, sn)[:48],
                                                  tb.params.get("n_gpu", 150)))
    flips_back = 0

    async def touch_tables(_round):
        nonlocal flips_back
        if bias != "device":
            return
        t = tables[int(rng.integers(len(tables)))]
        await bench.cache.load(bench.agent.host_line(t.base // LINE_BYTES
                                                     + int(rng.integers(t.rows))))
        flips_back += 1
        await bench.flip(tp, tn)

    await _lookups(bench, drv, tables, rng, tb.params.get("n_desc", 3),
                   after_round=touch_tables)
    await traffic
    await bench.finish()
    c = bench.counters
    assert c["COH_GRANTS_HOST"] > 0, c
    if bias == "device":
        assert c["COH_GRANTS_DEVICE"] > 0, c
        assert c["COH_HOST_FLIPS"] >= flips_back, c


@cocotb.test()
@cocotb.parametrize(**NOISE, bias=["host", "device"])
async def test_update_through_host_cache(dut, noise, bias):
    """UPDATEs whose index, offset and gradient buffers and descriptors the GPU has just
    written into its cache (dirty): the gradient feed and the bag sequencer must read
    the GPU's data (RdCurr -> write-back -> MemRdFwd); the table rows are read and
    written in host bias (RdCurr / RdOwn per line) or, after a flip, in device bias.
    Tables are checked bit for bit against the golden model after each doorbell, and
    read back by the GPU through its cache at the end (host checks flip device-bias
    pages back)."""
    bench = CohBench(dut, f"update_{bias}", noise=noise)
    await bench.start()
    tb = bench.tb
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    drv, tables, (tp, tn), _ = await _layout(bench, rng)
    if bias == "device":
        await bench.flip(tp, tn)
    mark = drv.heap.next
    for r in range(tb.params.get("n_desc", 3)):
        drv.heap.release(mark)
        t = tables[int(rng.integers(len(tables)))]
        b = _batch(rng, t.rows)
        b.weights = None
        grads = (rng.standard_normal((len(b.offsets), t.dim)) * 0.05).astype(np.float32)
        exp = await drv.update(t, b, grads, batch_id=r + 1)
        await drv.run()
        assert exp.status is Status.OK, exp.status
    agent = bench.agent
    for t in tables:
        first = t.base // LINE_BYTES
        for i in range(0, t.nbytes // LINE_BYTES, 3):
            await bench.cache.load(agent.host_line(first + i))
    await bench.finish()
    c = bench.counters
    assert c["COH_GRANTS_HOST"] > 0, c
    if bias == "device":
        assert c["COH_GRANTS_DEVICE"] > 0 and c["COH_HOST_FLIPS"] > 0, c


@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_flips_under_traffic(dut, noise):
    """Bias flips under traffic: the GPU loads and stores lines of two scratch pages
    while the driver flips them to device bias and back at random (a flip contended by
    a GPU access is retried; a GPU access to a device-bias page flips it back), and the
    GPU dirties lines of a third page in its cache before that page is flipped (its
    claims make the host write them back first). The checker holds every successful
    flip to "the host holds no line of the page", every GPU read to the last write."""
    bench = CohBench(dut, "flips_under_traffic", noise=noise)
    await bench.start()
    tb = bench.tb
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    cfg = bench.cfg
    pages = min(cfg.hdm_size, cfg.pmem_size) // cfg.page_bytes
    sp, dirty = pages - 2, pages - 3
    lines = bench.host_lines(sp, 2)
    hot = lines[:24] + lines[bench.lpp:bench.lpp + 24]
    done = [False]

    async def flipper():
        contended = n = 0
        while not done[0]:
            page = sp + int(rng.integers(2))
            contended += await bench.flip(page, 1, to_host=bool(rng.integers(2)), retries=2,
                                          must_succeed=False)
            n += 1
            await tb.loop.wait_cycles(int(rng.integers(20, 200)))
        return n, contended

    async def traffic():
        await bench.gpu_traffic(hot, tb.params.get("n_gpu", 150), parallel=3)
        done[0] = True

    flips = cocotb.start_soon(flipper())
    gpu = cocotb.start_soon(traffic())
    dirty_lines = bench.host_lines(dirty, 1)[:32]
    for _ in range(2):
        for line in dirty_lines:
            await bench.cache.store(line, tb.rng.randbytes(LINE_BYTES))
        contended = await bench.flip(dirty, 1)
        assert not bench.cache.lines.keys() & set(dirty_lines), "claimed lines still cached"
        # The GPU reads two of them back: the page flips back to host bias.
        for line in dirty_lines[:2]:
            await bench.cache.load(line)
        tb.log.info("dirty page flipped after %d contended attempts", contended)
    await gpu
    n, contended = await flips
    tb.log.info("%d scratch flips, %d contended attempts", n, contended)
    await bench.finish()
    assert bench.counters["COH_HOST_FLIPS"] >= 2, bench.counters

@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_mlp_snapshot_from_gpu(dut, noise):
    """MLP_CHECKPOINT with COH_CTRL.MLP_SRC_HOST copies GPU memory with RdCurr (the GPU
    home answers after 100 cycles): the slot, read from PMEM, equals the GPU's
    parameters at the snapshot point, for two copies into the two slots; the GPU
    rewrites its parameters between them. COH_RD_LINES counts the lines."""
    bench = CohBench(dut, "mlp_snapshot", noise=noise, gpu_latency=100)
    await bench.start(HDM_D | MLP_SRC_HOST)
    tb = bench.tb
    drv = CkptDriver(tb, log_slots=8, mlp_bytes=1024)
    await drv.setup()
    drv.format()
    res = await drv.recover()
    assert res.status == 0, res
    # GPU parameters: a GPU-memory address outside the HDM window and below pmem_size
    # when it fits (the descriptor's range rule is checked against device memory).
    gpu_base = gpu_addr(bench.cfg, 0x8000)
    lines_total = 0
    for batch, slot in ((1, 0), (2, 1)):
        params = tb.rng.randbytes(LINE_BYTES * tb.rng.randint(4, 16))
        bench.gpu.write_bytes(gpu_base, params)
        await drv.plain(DescKind.COMMIT, batch_id=batch)
        fields = dict(kind=DescKind.MLP_CHECKPOINT, batch_id=batch, data_addr=gpu_base,
                      num_indices=len(params), cookie=0x4D4C + batch)
        exp = drv.expect(fields)
        exp.status = Status.OK
        drv.mlp_req = batch
        drv.copies[batch] = (slot, params)
        drv.mlp_slot, drv.mlp_batch = slot, batch
        await drv.queue(fields, exp)
        await drv.run()
        await drv.wait_mlp(batch)
        bench.checker.device_read_checked(len(params) // LINE_BYTES)
        lines_total += len(params) // LINE_BYTES
        # The copy is done: the GPU may overwrite its parameters now.
        bench.gpu.write_bytes(gpu_base, tb.rng.randbytes(len(params)))
    payload, _ = ckpt.encode_mlp_slot(1, drv.copies[1][1])
    assert drv.image(drv.mlp[0], len(payload)) == payload, "slot 0 changed"
    await bench.finish()
    assert bench.counters["COH_RD_LINES"] == lines_total, bench.counters


@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_completions_in_gpu_memory(dut, noise):
    """COH_CTRL.CQ_HOST (HDM_D off: the driver writes its lines back before the doorbell):
    completion records go into GPU memory with ItoMWr (the GPU home mixes GO_WritePull
    with WritePull + GO); each record is checked field by field from GPU memory, LOOKUP
    outputs bit for bit and through the GPU's cache, the device-memory CQ stays
    untouched and COH_WR_LINES counts the records."""
    bench = CohBench(dut, "cq_host", noise=noise)
    await bench.start(CQ_HOST)
    bench.checker.hdm_d = False
    tb = bench.tb
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    drv, tables, _, _ = await _layout(bench, rng, cq_host=gpu_addr(bench.cfg, 0x1000),
                                      write_back=True)
    before = drv.image(drv.cq_addr, LINE_BYTES << drv.order)
    await _lookups(bench, drv, tables, rng, tb.params.get("n_desc", 3))
    await drv.plain(DescKind.NOP)
    await drv.run()
    assert drv.image(drv.cq_addr, LINE_BYTES << drv.order) == before, "device CQ written"
    await bench.finish()
    assert bench.counters["COH_WR_LINES"] == drv.tail, bench.counters


@cocotb.test()
async def test_bad_coherence_input(dut):
    """Bad input on both sides, each flagged by its own bit and harmless: an H2D GO and
    H2D Data for CQIDs with no request in flight, a reserved snoop opcode (still
    answered RspIHitI) among good snoops, an ExtCmp before a record write's
    GO_WritePull; MemRdFwd / MemWrFwd whose Tag names no DCOH request (inside and
    outside the pool), and, for the claims of a flip, forwards of the wrong kind and for
    the wrong line before the good ones. Exact COH_CACHE_ERR / COH_DCOH_ERR bits; the
    device neither hangs nor corrupts a line: descriptors complete with their records
    in GPU memory, the flip succeeds and the GPU reads its lines back."""
    bench = CohBench(dut, "bad_input", noise=True)
    cq_host = gpu_addr(bench.cfg, 0x4000)
    await bench.start(HDM_D | CQ_HOST)
    tb = bench.tb
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    drv, _, _, (sp, _) = await _layout(bench, rng, cq_host=cq_host, tables=0,
                                       write_back=True)
    home, t = bench.gpu.home, tb.loop.cycle
    # CXL.cache side, with nothing in flight.
    home.raw("rsp", t, {"opcode": H2DRspOpcode.GO.value, "cqid": bench.agent_cqids - 1,
                        "rsp_data": 3})
    home.raw("data", t, {"cqid": 0, "data": 0x1234})
    for op in (1, 2, 3, 0, 5):
        home.snoop(t, cq_host // LINE_BYTES, op)
    await tb.loop.wait_until(home.idle, timeout=10_000, what="snoops answered")
    await bench.check_errors(cache=(1 << int(CacheError.RSP_NOT_IN_FLIGHT))
                             | (1 << int(CacheError.DATA_NOT_IN_FLIGHT))
                             | (1 << int(CacheError.SNOOP_RESERVED)))
    # Forwards no request waits for.
    line = bench.agent.host_line(drv.ring_addr // LINE_BYTES)
    bench.agent.forward(M2SReqOpcode.MemRdFwd.value, line, DCOH_CQID_BASE + 1)
    bench.agent.forward(M2SReqOpcode.MemWrFwd.value, line, 17)
    await bench.check_errors(dcoh=1 << int(DcohError.FWD_NOT_IN_FLIGHT))
    for _ in range(2):
        await drv.plain(DescKind.NOP)
    await drv.run()
    # Bad forwards before the good ones of a flip's claims; an ExtCmp before a record's
    # pull.
    kinds = iter(["opcode", "address"] * 2)

    def bad_forwards(f: dict) -> list[tuple[int, int]]:
        kind = next(kinds, None)
        write = f["opcode"] == D2HReqOpcode.RdOwn.value
        good, other = M2SReqOpcode.MemWrFwd.value, M2SReqOpcode.MemRdFwd.value
        if not write:
            good, other = other, good
        if kind == "opcode":
            return [(other, f["address"])]
        if kind == "address":
            return [(good, f["address"] + 1)]
        return []

    lines = bench.host_lines(sp, 1)[:8]
    for x in lines:
        await bench.cache.store(x, tb.rng.randbytes(LINE_BYTES))
    await bench.cache.flush(lines)     # (a write-back during the claims would contend)
    bench.cache.faults = bad_forwards
    await bench.flip(sp, 1)
    bench.cache.faults = None
    first_write = len(home.writes)
    home.faults = (lambda txn: {"ext_cmp"} if txn.kind == "write" and txn.seq == first_write
                   else set())
    await drv.plain(DescKind.NOP)
    await drv.run()
    await bench.check_errors(dcoh=(1 << int(DcohError.FWD_OPCODE))
                             | (1 << int(DcohError.FWD_ADDRESS)),
                             cache=1 << int(CacheError.RSP_UNEXPECTED))
    for x in lines:
        await bench.cache.load(x)
    await bench.finish()
