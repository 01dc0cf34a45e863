"""cocotb tests of the coherent device: the GPU caches device lines, the engine reads and
writes them through the DCOH, and reads and writes GPU memory through CXL.cache
(``docs/coherence.md``).

The bench and the driver (:class:`~tb.coherent_bench.CohBench`,
:class:`~tb.coherent_bench.CoherentDriver`) put tables, buffers and descriptors **into
the GPU's cache** (dirty), so every engine read of a host-bias line fetches the GPU's
data through RdCurr -> write-back -> MemRdFwd; results are read through the coherent
view (the GPU's dirty copy, else PMEM). Every data-moving test runs with random idle
cycles on every source and random backpressure on every sink of all ten CXL channels
(and PMEM, CSR), on and off; the seed is printed and ``SEED=<n>`` replays it.

Test parameters: ``n_desc`` (LOOKUPs per test), ``n_gpu`` (GPU cache operations of the
background traffic), ``gpu_latency`` (GPU home's answer latency, cycles),
``host_latency`` (the host's forward latency), ``n_msgs`` (fuzzed H2D messages of the
CXL.cache fuzzer, ``test_cxl_cache_fuzz``) and ``out`` (a JSON file for its figures).
"""

from __future__ import annotations

import json
import random
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import cocotb
import numpy as np

from hw.csr.registers import register_map
from hw.cxl.cache_agent import CacheError
from hw.cxl.dcoh import DcohError
from hw.cxl.messages import D2HReqOpcode, GoState, H2DReqOpcode, H2DRspOpcode, M2SReqOpcode
from hw.engine.descriptor import DescKind, PoolMode, Status
from hw.top import DCOH_CQID_BASE
from sim import ckpt
from sim import embedding as emb
from sim.embedding import BF16, FP32, LINE_BYTES
from tb.coherent_bench import (
    CQ_HOST,
    FLIP_BUSY,
    FLIP_DONE,
    HDM_D,
    CohBench,
    CoherentDriver,
    align_page,
    gpu_addr,
    snapshot_bench,
)
from tb.coherent_host import LostToReset
from tb.cxl_mem import REQ
from tb.cxl_protocol import ALL_ONES
from tb.engine_driver import Batch, HostScratch, random_table
from tb.groups import group
from tb.pmem import PmemTiming
from tb.stream import reader

NOISE = {"noise": [False, True]}


async def _scratch_bench(dut, name: str, *, noise):
    """A started bench with the descriptors' buffers and the ring in GPU memory (a
    64 KiB scratch window at GPU offset 0x10000), device-bias checks off (HDM-H use),
    written back tables: ``(bench, rng, scratch, driver, tables)``."""
    bench = CohBench(dut, name, noise=noise)
    await bench.start(0)
    bench.checker.hdm_d = False
    rng = np.random.default_rng(bench.tb.rng.getrandbits(64))
    scratch = HostScratch(bench.gpu, base=gpu_addr(bench.cfg, 0x10000), size=1 << 16)
    drv, tables, _, _ = await _layout(bench, rng, write_back=True, scratch=scratch,
                                      ring_host=True)
    return bench, rng, scratch, drv, tables


async def _layout(bench: CohBench, rng: np.random.Generator, *, cq_host: int | None = None,
                  tables: int = 2, write_back: bool = False, **kw):
    """Driver and tables: page 0 ring and CQ, table pages, buffer pages, and two scratch
    pages at the end of the HDM window for background GPU traffic. ``kw`` goes to the
    driver."""
    cfg, pb = bench.cfg, bench.cfg.page_bytes
    window_pages = min(cfg.hdm_size, cfg.pmem_size) // pb
    scratch = window_pages - 2
    drv = CoherentDriver(bench, ring_order=3, heap_end=scratch * pb, cq_host=cq_host,
                         write_back=write_back, **kw)
    await drv.setup()
    first = align_page(drv, pb)
    dims = [d for d in (16, 40, 64) if d <= cfg.engine_max_dim]
    made = []
    for i in range(tables):
        dtype = BF16 if i % 2 else FP32
        made.append(await drv.add_table(random_table(rng, 24, dims[i % len(dims)], dtype),
                                        rng=rng))
    table_pages = (first, align_page(drv, pb) - first)
    align_page(drv, pb)
    return drv, made, table_pages, (scratch, 2)


def _batch(rng: np.random.Generator, rows: int) -> Batch:
    idx, off = emb.random_bags(rng, int(rng.integers(1, 6)), rows, pooling=3)
    weights = rng.standard_normal(len(idx)).astype(np.float32) if rng.random() < 0.3 else None
    return Batch(idx, off, False, weights)


async def _updates(drv: CoherentDriver, tables, rng, rounds: int) -> None:
    """``rounds`` doorbells of one UPDATE each (a random table, unweighted, small random
    gradients, batch ids 1 ..), each completing with status OK."""
    mark = drv.heap.next
    for r in range(rounds):
        drv.heap.release(mark)
        t = tables[int(rng.integers(len(tables)))]
        b = _batch(rng, t.rows)
        b.weights = None
        grads = (rng.standard_normal((len(b.offsets), t.dim)) * 0.05).astype(np.float32)
        exp = await drv.update(t, b, grads, batch_id=r + 1)
        await drv.run()
        assert exp.status is Status.OK, exp.status


async def _queue_lookups(drv: CoherentDriver, tables, rng, batch_id: int) -> list:
    """Queue 1 to 3 LOOKUPs of random tables, pooling modes and bags (weighted only
    with sum pooling); returns their expectations."""
    exps = []
    for _ in range(int(rng.integers(1, 4))):
        t = tables[int(rng.integers(len(tables)))]
        mode = PoolMode(int(rng.integers(3)))
        b = _batch(rng, t.rows)
        if mode is not PoolMode.SUM:
            b.weights = None
        exps.append(await drv.lookup(t, b, mode=mode, batch_id=batch_id))
    return exps


async def _lookups(bench: CohBench, drv: CoherentDriver, tables, rng, rounds: int, *,
                   after_round=None) -> None:
    """``rounds`` doorbells of 1 to 3 LOOKUPs each; then the GPU reads every output line
    through its cache (checked against the coherent value: the engine's write)."""
    mark = drv.heap.next
    agent = bench.agent
    for r in range(rounds):
        drv.heap.release(mark)
        exps = await _queue_lookups(drv, tables, rng, r)
        await drv.run()
        for exp in exps:
            assert exp.status is Status.OK, exp.status
            first = exp.out_addr // LINE_BYTES
            for i in range(len(exp.out_image) // LINE_BYTES):
                await bench.cache.load(agent.host_line(first + i))
        if after_round is not None:
            await after_round(r)


class RecordWatch:
    """A loop agent that finds, in the cycle it lands in GPU memory, each completion record
    of ``drv`` (records in GPU memory, ``COH_CTRL.CQ_HOST``) and checks that its
    descriptor's writes are durable by then: a LOOKUP's pooled vectors and an UPDATE's
    table (one UPDATE per doorbell, so the table is the model's after it) in the PMEM
    model's image, which holds exactly what has been answered with a B. ``landed``
    counts the records found."""

    def __init__(self, drv: CoherentDriver):
        self.drv = drv
        self.landed = 0
        self._seen: set[int] = set()

    def sample(self) -> None:
        drv = self.drv
        pmem = drv.tb.pmem
        for exp in drv.pending:
            if exp.seq in self._seen:
                continue
            if drv.record(exp.seq)["seq"] != exp.seq & 0xFFFF_FFFF:
                return                  # records land in ring order
            self._seen.add(exp.seq)
            self.landed += 1
            if exp.out_image is not None and drv.scratch is None:
                assert pmem.read(exp.out_addr, len(exp.out_image)) == exp.out_image, (
                    f"descriptor {exp.seq}: record in GPU memory before its pooled "
                    "vectors were durable")
            if exp.kind == DescKind.UPDATE.value and exp.table is not None:
                t = exp.table
                assert pmem.read(t.base, t.nbytes) == emb.pack_rows(
                    exp.table_after, base=t.image0), (
                    f"descriptor {exp.seq}: record in GPU memory before its rows were "
                    "durable")


# --- tests -----------------------------------------------------------------------------------

@group("lookup")
@cocotb.test()
@cocotb.parametrize(**NOISE, bias=["host", "device"])
async def test_lookup_through_host_cache(dut, noise, bias):
    """The GPU writes tables, index / offset / weight buffers and descriptors into its
    cache (dirty); with ``bias=device`` the table pages are flipped to device bias
    first. Each doorbell's descriptors, buffers and (host bias) rows reach the engine
    through RdCurr -> write-back -> MemRdFwd, its outputs through RdOwn -> MemRdFwd;
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


@group("update")
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
    await _updates(drv, tables, rng, tb.params.get("n_desc", 3))
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


@group("flips")
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

@group("flips")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_host_claim_flips_page_back(dut, noise):
    """A host MemInv / MemInvNT with Meta0-State Any (a claim of ownership without data)
    of a line of a device-bias page takes the same host check as a read: the page flips
    back to host bias (COH_HOST_FLIPS counts it) before the Cmp-E, so the host never
    owns a line of a device-bias page. GPU traffic (whole-line stores claim at random)
    follows; every line ends as the host wrote it."""
    bench = CohBench(dut, "host_claim", noise=noise)
    await bench.start()
    tb, csr = bench.tb, bench.tb.csr
    cfg = bench.cfg
    pages = min(cfg.hdm_size, cfg.pmem_size) // cfg.page_bytes
    for i, nt in enumerate((False, True)):
        page = pages - 2 - i
        await bench.flip(page, 1)
        before = await csr.read64("COH_HOST_FLIPS")
        line = bench.host_lines(page, 1)[tb.rng.randrange(bench.lpp)]
        await bench.cache.locks.acquire(line)
        try:
            await bench.cache.claim(line, nt=nt)
            data = tb.rng.randbytes(LINE_BYTES)
            bench.cache.lines[line] = ["M", data]
            bench.checker.host_store(bench.agent.decode(line), data, tb.loop.cycle)
        finally:
            bench.cache.locks.release(line)
        after = await csr.read64("COH_HOST_FLIPS")
        assert after == before + 1, (
            f"{'MemInvNT' if nt else 'MemInv'} Any of a device-bias line: COH_HOST_FLIPS "
            f"{before} -> {after}, the page was not flipped back to host bias")
    await bench.gpu_traffic(bench.host_lines(pages - 3, 2), tb.params.get("n_gpu", 150) // 2)
    await bench.finish()
    assert bench.cache.stats["claims"] >= 2, bench.cache.stats


@group("flips")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_reset_in_coherent_traffic(dut, noise):
    """A device reset in the middle of coherent traffic, twice: the GPU loads and stores
    lines of three pages through its cache (MemRd fills, write-backs, host checks in the
    router) while a flip of the three pages to device bias has claims and forwards in
    flight. The host drops the DCOH's requests it had not answered and the operations
    the reset lost (a lost write-back leaves its line dirty in the cache; the line's
    PMEM image must be the old or the new value). After the reset COH_CTRL is 0 and
    every page is in host bias; with HDM_D set again a flip to device bias succeeds
    (the host then holds no line of the pages), the GPU takes the pages back, and at
    the end every coherence rule, the memory image and the error registers hold."""
    bench = CohBench(dut, "reset_coherent", noise=noise)
    await bench.start()
    tb, cfg, csr = bench.tb, bench.cfg, bench.tb.csr
    rng = random.Random(tb.rng.getrandbits(64))
    pages = min(cfg.hdm_size, cfg.pmem_size) // cfg.page_bytes
    first = pages - 3
    lines = bench.host_lines(first, 3)
    hot = [x for p in range(3) for x in lines[p * bench.lpp:p * bench.lpp + 12]]
    for rnd in range(2):
        stop, lost, done = [False], [0], [0]

        async def worker(stop=stop, lost=lost, done=done):
            while not stop[0]:
                line = rng.choice(hot)
                try:
                    if rng.random() < 0.5:
                        await bench.cache.store(line, rng.randbytes(LINE_BYTES))
                    else:
                        await bench.cache.load(line)
                    done[0] += 1
                except LostToReset:
                    lost[0] += 1
                await tb.loop.wait_cycles(rng.randint(0, 8))

        workers = [cocotb.start_soon(worker()) for _ in range(3)]
        await tb.loop.wait_cycles(rng.randint(100, 400))
        async with bench._flip_lock:    # a flip in flight, not waited for
            await csr.write("COH_FLIP_FIRST", first)
            await csr.write("COH_FLIP_PAGES", 3)
            await csr.write_fields("COH_FLIP", start=1)
            await tb.loop.wait_cycles(rng.randint(4, 40))
            busy = await csr.read("COH_FLIP_STATUS") & FLIP_BUSY
            lost_writes = await bench.reset_device()
        stop[0] = True
        for w in workers:
            await w
        tb.log.info("reset %d: flip %s, %d GPU operations done, %d lost, %d writes lost",
                    rnd, "busy" if busy else "done", done[0], lost[0], len(lost_writes))
        assert await csr.read("COH_CTRL") == 0, "COH_CTRL not reset"
        await bench.start_coherence()
        await bench.check_errors()
        # Host bias everywhere after the reset: a GPU load of a line of each page of the
        # interrupted flip that no one touched needs no flip back.
        flips_before = await csr.read64("COH_HOST_FLIPS")
        for p in range(3):
            await bench.cache.load(lines[p * bench.lpp + 12 + rnd])
        assert await csr.read64("COH_HOST_FLIPS") == flips_before, "a page not in host bias"
        await bench.flip(first, 3)
        await bench.gpu_traffic(hot, 30, parallel=3)
    await bench.check_errors()
    await bench.finish()


@dataclass
class PmemRead:
    """One read burst on the device's PMEM port, as :class:`PortWatch` saw it."""
    t_ar: int                   # AR handshake
    engine: bool                # the engine's (ARID top bit 1), else the memory endpoint's
    line: int                   # first device line
    lines: int
    t_last: int | None = None   # handshake of its R beat with ``last``

    def touches(self, page: int, lpp: int) -> bool:
        return self.line // lpp <= page <= (self.line + self.lines - 1) // lpp


class PortWatch:
    """A passive loop agent on the device's ports: every M2S Req handshake (cycle, opcode,
    host line) and every PMEM read burst (:class:`PmemRead`: AR handshake, manager,
    lines, and the cycle its last R beat was taken, matched to its AR by ID in request
    order, as AXI orders the responses of one ID). The top bit of ARID names the manager:
    0 the memory endpoint (the host's requests), 1 the engine (``hw/top.py``, ``pmem``)."""

    def __init__(self, dut, loop, cfg, lpp: int):
        self.loop = loop
        self.lpp = lpp
        self.engine_id = 1 << (cfg.pmem_id_width - 1)
        self._sig = [reader(getattr(dut, n)) for n in (
            "i_m2s_req__valid", "i_m2s_req__ready", "i_m2s_req__payload",
            "pmem__arvalid", "pmem__arready", "pmem__arid", "pmem__araddr", "pmem__arlen",
            "pmem__rvalid", "pmem__rready", "pmem__rid", "pmem__rlast")]
        self.m2s: list[tuple[int, int, int]] = []
        self.reads: list[PmemRead] = []
        self._open: dict[int, deque[PmemRead]] = {}

    def sample(self) -> None:
        mv, mr, mp, av, ar, aid, aaddr, alen, rv, rr, rid, rlast = self._sig
        t = self.loop.cycle
        if mv() and mr():
            p = mp()
            self.m2s.append((t, REQ.get(p, "opcode"), REQ.get(p, "address") >> 1))
        if av() and ar():
            rd = PmemRead(t, bool(aid() & self.engine_id), aaddr() // LINE_BYTES, alen() + 1)
            self.reads.append(rd)
            self._open.setdefault(aid(), deque()).append(rd)
        if rv() and rr() and rlast():
            q = self._open.get(rid())
            assert q, f"cycle {t}: R last for ID {rid():#x}, whose AR the watch did not see"
            q.popleft().t_last = t

    def clear(self) -> None:
        """Forget everything seen (call with no PMEM read in flight)."""
        self.m2s.clear()
        self.reads.clear()
        self._open.clear()

    def running(self, pages) -> PmemRead | None:
        """An engine read of one of ``pages`` whose last R beat has not been taken."""
        return next((r for q in self._open.values() for r in q
                     if r.engine and any(r.touches(p, self.lpp) for p in pages)), None)

    def engine_reads(self, pages, before: int) -> list[PmemRead]:
        """The engine's reads of any of ``pages`` whose AR was taken before cycle
        ``before``."""
        return [r for r in self.reads if r.engine and r.t_ar < before
                and any(r.touches(p, self.lpp) for p in pages)]


#: PMEM read latency of :func:`test_drains_in_device_bias`: slow enough that a
#: device-bias read still runs long after the host request or the flip that must wait
#: for it.
DRAIN_READ_LATENCY = 100


@group("flips")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_drains_in_device_bias(dut, noise):
    """The drains of ``docs/dcoh.md`` at device level, with a table's pages in device bias
    and PMEM reads taking 100 cycles, watched on the device's ports (:class:`PortWatch`):

    1. "Host touching device memory": while a LOOKUP gathers rows, the GPU loads two
       lines of a table page at once, in the cycle after an engine read of that page
       reached PMEM. The first host check flips the page back to host bias
       (COH_HOST_FLIPS + 1, once) and answers only once the device's accesses of the
       page granted before it are done, the second is taken behind it: for each MemRd,
       every engine read of the page whose AR came before its M2S handshake has taken
       its last R beat before the device reads the GPU's line from PMEM (the memory
       endpoint's AR); one of them ran on for more than 8 cycles after the first
       handshake, so the check had to wait.
    2. "Flip command", to host bias: the table is flipped to device bias again, and in
       the cycle after the next LOOKUP's first engine read of a table page reached
       PMEM, the table's pages are flipped to host bias. COH_FLIP_STATUS reads DONE
       (polled back to back from 4 cycles after the start) only after the last R beat
       of every engine read of those pages whose AR came before the command, one of
       which ran on for more than 48 cycles after it (a flip that did not drain would
       have been seen done by then); the pages are then in host bias (a GPU load of a
       line flips nothing back).

    LOOKUP records and pooled vectors are checked bit for bit, the GPU's loads against
    the coherence checker; no DCOH error."""
    timing = PmemTiming(read_latency=DRAIN_READ_LATENCY, write_latency=40,
                        jitter=8 if noise else 0, channels=2)
    bench = CohBench(dut, "drains", noise=noise, pmem_timing=timing)
    await bench.start()
    tb, csr, loop, lpp = bench.tb, bench.tb.csr, bench.tb.loop, bench.lpp
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    prng = random.Random(tb.rng.getrandbits(64))
    # Written back: a dirty table line would contend the flips (docs/dcoh.md).
    drv, (table,), (tp, tn), _ = await _layout(bench, rng, tables=1, write_back=True)
    table_pages = range(tp, tp + tn)
    watch = PortWatch(dut, loop, bench.cfg, lpp)

    async def gathering(batch_id: int):
        """Flip the table to device bias, ring the doorbell of a LOOKUP and return it,
        in the cycle after the first engine read of a table page reached PMEM."""
        await bench.flip(tp, tn)
        exp = await drv.lookup(table, _batch(rng, table.rows), batch_id=batch_id)
        watch.clear()
        loop.add(watch)
        await drv.ring()
        await loop.wait_until(lambda: watch.running(table_pages) is not None,
                              timeout=20_000, what="an engine read of a table page")
        return exp

    async def lookup_done(exp) -> None:
        await drv.wait()
        loop.remove(watch)
        assert exp.status is Status.OK, exp.status

    # 1. A host check that waits for the device-bias reads of its page.
    flips = await csr.read64("COH_HOST_FLIPS")
    exp = await gathering(0)
    read = watch.running(table_pages)
    page = next(p for p in table_pages if read.touches(p, lpp))
    lines = prng.sample(bench.host_lines(page, 1), 2)
    assert not bench.cache.lines.keys() & set(lines), "the flip left a table line cached"
    t0 = loop.cycle
    loads = [cocotb.start_soon(bench.cache.load(x)) for x in lines]
    for load in loads:
        await load
    await lookup_done(exp)
    handshakes = []
    for line in lines:
        dev = bench.agent.decode(line)
        h = next(t for t, op, x in watch.m2s
                 if t >= t0 and op == M2SReqOpcode.MemRd.value and x == line)
        e = next(r.t_ar for r in watch.reads
                 if not r.engine and r.t_ar > h and r.line <= dev < r.line + r.lines)
        late = [r for r in watch.engine_reads([page], h) if r.t_last >= e]
        assert not late, (f"the host's MemRd of device line {dev:#x} (handshake at cycle "
                          f"{h}) read PMEM at cycle {e}, before engine reads of page {page} "
                          f"granted earlier had finished: {late}")
        handshakes.append(h)
    h = min(handshakes)
    before = watch.engine_reads([page], h)
    assert any(r.t_last > h + 8 for r in before), (
        f"no engine read of page {page} was running at the first MemRd's handshake (cycle "
        f"{h}): the host check had nothing to wait for ({before})")
    assert await csr.read64("COH_HOST_FLIPS") == flips + 1, (
        "the page was not flipped back exactly once")
    tb.log.info("host checks of page %d at cycles %s waited for %d engine reads, the last "
                "until cycle %d", page, handshakes, len(before), max(r.t_last for r in before))

    # 2. A flip to host bias that drains the device-bias reads of its pages.
    await csr.write("COH_FLIP_FIRST", tp)
    await csr.write("COH_FLIP_PAGES", tn)
    exp = await gathering(1)
    t_start = loop.cycle
    await csr.write_fields("COH_FLIP", start=1, to_host=1)
    await loop.wait_cycles(4)       # as CohBench.flip_once: the start has been taken
    while (status := await csr.read("COH_FLIP_STATUS")) & FLIP_BUSY:
        pass
    t_done = loop.cycle
    assert status == FLIP_DONE, f"COH_FLIP_STATUS {status:#x} after a flip to host bias"
    bench.checker.flip_done(tp, tn, to_host=True, ok=True, t_start=t_start)
    before = watch.engine_reads(table_pages, t_start)
    late = [r for r in before if r.t_last is None or r.t_last >= t_done]
    assert not late, (f"flip of pages {tp}+{tn} to host bias (started at cycle {t_start}) "
                      f"read done at cycle {t_done}, before engine reads of the pages "
                      f"granted earlier had finished: {late}")
    assert any(r.t_last > t_start + 48 for r in before), (
        f"no engine read of pages {tp}+{tn} ran on 48 cycles after the flip started "
        f"(cycle {t_start}): the flip had nothing to drain ({before})")
    tb.log.info("flip to host bias started at cycle %d drained %d engine reads, the last "
                "until cycle %d; done read at %d", t_start, len(before),
                max(r.t_last for r in before), t_done)
    await lookup_done(exp)
    flips = await csr.read64("COH_HOST_FLIPS")
    await bench.cache.load(prng.choice(bench.host_lines(tp, tn)))
    assert await csr.read64("COH_HOST_FLIPS") == flips, "a table page left in device bias"
    await bench.check_errors()
    await bench.finish()


@group("flips")
@cocotb.test()
async def test_flip_bad_commands(dut):
    """Flip commands that end at once (``docs/dcoh.md``, "Flip command"): ``pages = 0``
    ends with DONE and no error, no DCOH error; a range past the bias table's end (its
    last page and one more) ends with DONE and ERROR, COH_DCOH_ERR holds exactly
    FLIP_RANGE and COH_DCOH_ERR_INFO / _ADDR name it and the command's first page.
    Neither claims a line (the host sees no RdOwnNoData) and the last page stays in
    host bias (a GPU load of one of its lines flips nothing back); a good flip of that
    page then succeeds."""
    bench = CohBench(dut, "flip_bad", noise=True)
    await bench.start()
    tb, csr = bench.tb, bench.tb.csr
    last = bench.cfg.dcoh_pages - 1
    flip_range = 1 << int(DcohError.FLIP_RANGE)

    def claims() -> int:
        return sum(n for k, n in bench.cache.answers.items() if k.startswith("RdOwnNoData:"))

    assert not await bench.flip_once(last, 0), "a flip of zero pages ended with ERROR"
    await bench.check_errors()
    assert await bench.flip_once(last, 2), "a flip past the bias table ended without ERROR"
    info = _first_error(await csr.read("COH_DCOH_ERR_INFO"))
    addr = await csr.read64("COH_DCOH_ERR_ADDR")
    assert (info[0], addr) == (int(DcohError.FLIP_RANGE), last), (
        f"COH_DCOH_ERR_INFO code {info[0]}, ADDR {addr:#x}: expected FLIP_RANGE, page {last}")
    await bench.check_errors(dcoh=flip_range)
    assert claims() == 0, f"claims sent for rejected flips: {bench.cache.answers}"
    flips = await csr.read64("COH_HOST_FLIPS")
    await bench.cache.load(tb.rng.choice(bench.host_lines(last, 1)))
    assert await csr.read64("COH_HOST_FLIPS") == flips, f"page {last} left host bias"
    await bench.flip(last, 1)
    assert claims() == bench.lpp, bench.cache.answers
    await bench.check_errors()
    await bench.finish()


@group("gpu_memory")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_mlp_snapshot_from_gpu(dut, noise):
    """MLP_CHECKPOINT with COH_CTRL.MLP_SRC_HOST copies GPU memory with RdCurr (the GPU
    home answers after 100 cycles): the slot, read from PMEM, equals the GPU's
    parameters at the snapshot point, for two copies into the two slots; the GPU
    rewrites its parameters between them. COH_RD_LINES counts the lines."""
    bench, drv = await snapshot_bench(dut, "mlp_snapshot", noise=noise, mlp_bytes=1024,
                                      gpu_latency=100)
    tb = bench.tb
    # GPU parameters: a GPU-memory address outside the HDM window and below pmem_size
    # when it fits (the descriptor's range rule is checked against device memory).
    gpu_base = gpu_addr(bench.cfg, 0x8000)
    lines_total = 0
    for batch, slot in ((1, 0), (2, 1)):
        params = tb.rng.randbytes(LINE_BYTES * tb.rng.randint(4, 16))
        bench.gpu.write_bytes(gpu_base, params)
        await drv.plain(DescKind.COMMIT, batch_id=batch)
        exp = await drv.mlp_checkpoint_from_host(batch, gpu_base, len(params), params)
        assert exp.status is Status.OK and drv.copies[batch][0] == slot, (exp, drv.copies)
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


@group("gpu_memory")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_mlp_snapshot_while_gpu_writes(dut, noise):
    """The GPU keeps rewriting lines of its MLP parameters while an MLP_CHECKPOINT copies
    them with RdCurr (``docs/checkpoint.md``, "MLP snapshots from GPU memory"): the copy
    is not atomic, and each slot line must hold a value its GPU line held between the
    descriptor's doorbell and the copy's end (no older, no torn or made-up line); the
    header is the contract's for what was copied, so recovery takes the slot as valid.
    Lines rewritten at least once during the copy are counted (the test fails if none
    was, so it cannot pass without a race)."""
    bench, drv = await snapshot_bench(dut, "mlp_snapshot_race", noise=noise, mlp_bytes=2048,
                                      gpu_latency=100)
    tb = bench.tb
    gpu_base = gpu_addr(bench.cfg, 0x8000)
    n_lines = 24
    first = gpu_base // LINE_BYTES
    bench.gpu.write_bytes(gpu_base, tb.rng.randbytes(n_lines * LINE_BYTES))
    await drv.plain(DescKind.COMMIT, batch_id=1)
    copying = [True]

    async def gpu_writes():
        while copying[0]:
            bench.gpu.write(first + tb.rng.randrange(n_lines), tb.rng.randbytes(LINE_BYTES))
            await tb.loop.wait_cycles(tb.rng.randint(1, 12))

    start = tb.loop.cycle
    writer = cocotb.start_soon(gpu_writes())
    exp = await drv.mlp_checkpoint_from_host(1, gpu_base, n_lines * LINE_BYTES, None)
    assert exp.status is Status.OK and drv.copies[1][0] == 0, (exp, drv.copies)
    await drv.run()
    await drv.wait_mlp(1, check=False)
    copying[0] = False
    await writer
    end = tb.loop.cycle
    bench.checker.device_read_checked(n_lines)
    payload = drv.image(drv.mlp[0], n_lines * LINE_BYTES)
    raced = newer = 0
    for i in range(n_lines):
        history = bench.gpu.home.history[first + i]
        before = [v for t, v in history if t < start][-1:]
        during = [v for t, v in history if start <= t <= end]
        got = int.from_bytes(payload[i * LINE_BYTES:(i + 1) * LINE_BYTES], "little")
        assert got in before + during, (
            f"slot line {i}: a value GPU line {first + i:#x} did not hold between the "
            f"doorbell (cycle {start}) and the copy's end (cycle {end})")
        raced += bool(during)
        newer += got != before[-1]
    header = drv.image(drv.mlp[0] + drv.mlp_bytes, LINE_BYTES)
    assert header == ckpt.encode_mlp_slot(1, payload)[1], "header is not the contract's"
    assert ckpt.mlp_slot_valid(header, payload, drv.mlp_bytes)
    assert raced, "the GPU rewrote no line during the copy"
    tb.log.info("%d of %d lines rewritten by the GPU during the copy (cycles %d..%d); "
                "%d slot lines hold a value written after the doorbell",
                raced, n_lines, start, end, newer)
    await bench.finish()


@group("gpu_memory")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_completions_in_gpu_memory(dut, noise):
    """COH_CTRL.CQ_HOST (HDM_D off: the driver writes its lines back before the doorbell):
    completion records go into GPU memory with ItoMWr (the GPU home mixes GO_WritePull
    with WritePull + GO), and only once the descriptor's writes are durable: the driver
    learns of completions by reading the records, and :class:`RecordWatch` checks in
    the cycle each record lands that the LOOKUP's pooled vectors or the UPDATE's rows
    are durable already. Each record is checked field by field from GPU memory, LOOKUP
    outputs bit for bit and through the GPU's cache, the device-memory CQ stays
    untouched and COH_WR_LINES counts the records."""
    bench = CohBench(dut, "cq_host", noise=noise)
    await bench.start(CQ_HOST)
    bench.checker.hdm_d = False
    tb = bench.tb
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    drv, tables, _, _ = await _layout(bench, rng, cq_host=gpu_addr(bench.cfg, 0x1000),
                                      write_back=True)
    watch = tb.loop.add(RecordWatch(drv))
    before = drv.image(drv.cq_addr, LINE_BYTES << drv.order)
    await _lookups(bench, drv, tables, rng, tb.params.get("n_desc", 3))
    await _updates(drv, tables, rng, 2)
    await drv.plain(DescKind.NOP)
    await drv.run()
    tb.loop.remove(watch)
    assert watch.landed == drv.tail, (watch.landed, drv.tail)
    assert drv.image(drv.cq_addr, LINE_BYTES << drv.order) == before, "device CQ written"
    await bench.finish()
    assert bench.counters["COH_WR_LINES"] == drv.tail, bench.counters


@group("gpu_memory")
@cocotb.test()
@cocotb.parametrize(**NOISE, ctrl=["hdm_h", "hdm_d"])
async def test_scratch_buffers_in_gpu_memory(dut, noise, ctrl):
    """COH_CTRL.SCRATCH_HOST: every LOOKUP's and UPDATE's indices, offsets, weights and
    gradients are read from a window of GPU memory (RdCurr; the GPU home answers in
    random order with random latency) and the pooled vectors written there (ItoMWr),
    while tables and log stay in device memory (``hdm_d``: with the GPU caching the
    tables and the records in GPU memory too). ``hdm_h`` has the descriptor ring in the
    window too (COH_CTRL.RING_HOST; ``hdm_d`` keeps it in device memory). Rounds of 1 to
    3 LOOKUPs (every pooling mode, weighted or not) and an UPDATE: records, pooled
    vectors (read from GPU memory) and tables checked bit for bit against the golden
    model. The same offsets in device memory hold the driver's tables, CQ and (``hdm_d``)
    ring, so a read steered to the wrong memory would show. COH_RD_LINES counts at least
    every buffer line once (and every descriptor with RING_HOST) and COH_WR_LINES every
    pooled line (and record); ``hdm_h``: LINK_TX_BYTES / LINK_RX_BYTES grow by the bytes
    of the CXL.mem and CXL.cache messages the bench saw each way."""
    bench = CohBench(dut, f"scratch_{ctrl}", noise=noise)
    cfg = bench.cfg
    cq_host = gpu_addr(cfg, 0x1000) if ctrl == "hdm_d" else None
    await bench.start(HDM_D | CQ_HOST if ctrl == "hdm_d" else 0)
    bench.checker.hdm_d = ctrl == "hdm_d"
    tb = bench.tb
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    link_start = (await tb.csr.read64("LINK_TX_BYTES"), await tb.csr.read64("LINK_RX_BYTES"),
                  *bench.link_bytes())
    scratch = HostScratch(bench.gpu, base=gpu_addr(cfg, 0x10000), size=1 << 16)
    ring_host = ctrl == "hdm_h"
    drv, tables, _, _ = await _layout(bench, rng, cq_host=cq_host, write_back=True,
                                      scratch=scratch, ring_host=ring_host)
    mark = scratch.heap.next
    buffer_lines = pooled_lines = 0
    for r in range(tb.params.get("n_desc", 3)):
        scratch.heap.release(mark)
        exps = await _queue_lookups(drv, tables, rng, r)
        t = tables[int(rng.integers(len(tables)))]
        b = _batch(rng, t.rows)
        grads = (rng.standard_normal((len(b.offsets), t.dim)) * 0.05).astype(np.float32)
        exps.append(await drv.update(t, b, grads, batch_id=r))
        buffer_lines += scratch.heap.next - mark
        await drv.run()
        for exp in exps:
            assert exp.status is Status.OK, exp.status
            if exp.out_image is not None:
                pooled_lines += len(exp.out_image) // LINE_BYTES
    await bench.finish()
    c = bench.counters
    buffer_lines //= LINE_BYTES
    descs = drv.tail if ring_host else 0
    assert c["COH_RD_LINES"] >= buffer_lines - pooled_lines + descs, (c, buffer_lines, descs)
    assert c["COH_WR_LINES"] == pooled_lines + (drv.tail if cq_host is not None else 0), c
    if ctrl == "hdm_h":     # no DCOH messages: the bench sees every message
        tx, rx, bench_tx, bench_rx = link_start
        got = (c["LINK_TX_BYTES"] - tx, c["LINK_RX_BYTES"] - rx)
        want = tuple(b - s for b, s in zip(bench.link_bytes(), (bench_tx, bench_rx), strict=True))
        assert got == want and got[1] > 0, f"LINK_TX/RX_BYTES {got}, bench counted {want}"


@group("gpu_memory")
@cocotb.test()
async def test_row_store(dut):
    """The row store (docs/embedding.md, "Row store"), scratch buffers and ring in GPU
    memory: an UPDATE after a LOOKUP of the same rows reads every line of its distinct
    rows from the store (ENG_UPD_STORE_LINES grows by them, ENG_PMEM_RD_UPDATE by none);
    a host write of one of those rows between the LOOKUP and the UPDATE (a CXL.mem
    write-back from the host's cache) empties the store, so the UPDATE reads every row
    from PMEM and adds to the row as the host wrote it; a host read of another line
    empties it too; then the store serves again. Each UPDATE's table is checked bit for
    bit against the golden model (the host's row included). The rows are chosen in
    distinct entries of the store (its documented hash)."""
    from hw.engine.row_store import store_index

    bench, rng, scratch, drv, tables = await _scratch_bench(dut, "row_store", noise=False)
    cfg, tb = bench.cfg, bench.tb
    t = tables[0]
    lpr = emb.lines_per_row(t.dim, t.data.dtype)
    stride = lpr * LINE_BYTES
    bits = cfg.row_store_lines.bit_length() - 1
    rows, entries = [], set()
    for r in range(t.rows):
        mine = {store_index(t.base + r * stride + j * LINE_BYTES, bits) for j in range(lpr)}
        if len(mine) == lpr and not mine & entries and len(rows) < 3:
            rows.append(r)
            entries |= mine
    assert len(rows) == 3, f"no three rows of table {t.base:#x} in distinct entries"
    batch = Batch(np.array([rows[0], rows[1], rows[2], rows[0]], np.int32),
                  np.array([0, 2], np.int32))
    distinct_lines = len(rows) * lpr
    mark = scratch.heap.next

    async def counters():
        return (await tb.csr.read64("ENG_UPD_STORE_LINES"),
                await tb.csr.read64("ENG_PMEM_RD_UPDATE"))

    async def round_(between, batch_id):
        scratch.heap.release(mark)
        exp = await drv.lookup(t, batch, batch_id=batch_id)
        await drv.run()
        assert exp.status is Status.OK, exp.status
        await between()
        before = await counters()
        grads = (rng.standard_normal((batch.num_bags, t.dim)) * 0.05).astype(np.float32)
        exp = await drv.update(t, batch, grads, batch_id=batch_id)
        await drv.run()
        assert exp.status is Status.OK, exp.status
        after = await counters()
        return after[0] - before[0], after[1] - before[1]

    async def nothing():
        pass

    async def host_writes_a_row():
        new = (rng.standard_normal(t.dim) * 0.5).astype(t.data.dtype)
        off = rows[1] * stride
        image = emb.pack_rows(new[None, :], base=t.image0[off:off + stride])
        t.data[rows[1]] = new
        await drv.put(t.base + off, image)

    async def host_reads_a_line():
        other = tables[1].base // LINE_BYTES
        await tb.agent.read(tb.agent.host_line(other))

    assert await round_(nothing, 1) == (distinct_lines, 0), "a LOOKUP's rows not kept"
    assert await round_(host_writes_a_row, 2) == (0, distinct_lines), (
        "the store served an UPDATE after a host write")
    assert await round_(host_reads_a_line, 3) == (0, distinct_lines), (
        "the store served an UPDATE after a host read")
    assert await round_(nothing, 4) == (distinct_lines, 0), "the store did not serve again"
    await bench.finish()


#: Read-error cases of the scratch buffers and the ring: which buffer's line fails (the
#: ring: the UPDATE's descriptor), which of its reads (1: the first, pass 1 or the only
#: read; 2: every later one, pass 2) and what the GPU home answers.
_READ_FAULT_CASES = (
    ("offsets", 1, "go_err"), ("indices", 1, "poison"), ("indices", 2, "go_err"),
    ("weights", 1, "poison"), ("gradients", 1, "go_err"), ("ring", 1, "go_err"),
    ("ring", 1, "poison"),
)


@group("gpu_memory")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_scratch_read_errors(dut, noise):
    """COH_CTRL.SCRATCH_HOST and RING_HOST: the GPU answers one read of a descriptor's
    buffers or of the descriptor itself with an error (GO-Err, or poisoned data) -- an
    offsets or index line in pass 1, an index line in pass 2 (the pass-1 read good, the
    later ones bad; a descriptor too large for the replay store, so that pass 2 reads
    its indices again), a weights line (read in pass 2 only), a gradient line and the
    descriptor's ring line, each on an UPDATE of a random table (weights: a weighted
    UPDATE), among good LOOKUPs and UPDATEs (the gradient line's UPDATE follows a good
    UPDATE of the other table, so its gradients are read ahead). The faulted UPDATE
    completes with READ_ERROR and changes no table byte (every table checked bit for
    bit after each doorbell; a faulted ring line: its record is a NOP's, every field
    but status and seq zero), ENG_ERR latches its status and seq,
    COH_CACHE_ERR.READ_ERROR is set; the good descriptors around it complete as the
    golden model says, so the engine stays usable."""
    bench, rng, scratch, drv, tables = await _scratch_bench(dut, "scratch_errors",
                                                            noise=noise)
    cfg, tb = bench.cfg, bench.tb
    home = bench.gpu.home
    failing: dict = {}              # host line -> (first bad read, fault)
    seen: dict[int, int] = {}       # host line -> reads so far

    def faults(txn) -> set[str]:
        if txn.kind != "read" or txn.line not in failing:
            return set()
        seen[txn.line] = seen.get(txn.line, 0) + 1
        first, fault = failing[txn.line]
        return {fault} if seen[txn.line] >= first else set()

    home.faults = faults
    mark = scratch.heap.next
    for where, nth, fault in _READ_FAULT_CASES:
        scratch.heap.release(mark)
        failing.clear()
        seen.clear()
        k = int(rng.integers(len(tables)))
        t = tables[k]
        good = await drv.lookup(t, _batch(rng, t.rows), batch_id=0)
        # A gradient line: a good UPDATE of the other table goes first, so the faulted
        # UPDATE's gradients are read ahead, while that one runs.
        lead = None
        if where == "gradients":
            o = tables[(k + 1) % len(tables)]
            ob = _batch(rng, o.rows)
            ob.weights = None
            lead = await drv.update(o, ob, (rng.standard_normal((len(ob.offsets), o.dim))
                                            * 0.05).astype(np.float32), batch_id=0)
        b = _batch(rng, t.rows)
        if where == "indices" and nth > 1:
            # Pass 2 reads the indices again only when they and the offsets do not fit
            # in the bag sequencer's replay store: one-index bags filling L / 2 + 1
            # lines of each buffer.
            n = (cfg.seq_replay_lines // 2 + 1) * LINE_BYTES // 4
            assert n <= cfg.update_acc_rows, "the UPDATE must fit the accumulator"
            idx, off = emb.random_bags(rng, n, t.rows, pooling=1)
            b = Batch(idx, off, False, None)
        b.weights = (rng.standard_normal(len(b.indices)).astype(np.float32)
                     if where == "weights" else None)
        grads = (rng.standard_normal((len(b.offsets), t.dim)) * 0.05).astype(np.float32)
        before = t.data
        exp = await drv.update(t, b, grads, batch_id=0)
        assert exp.status is Status.OK, exp.status
        addr = (drv.ring_addr + exp.seq % (1 << drv.order) * LINE_BYTES if where == "ring"
                else exp.fields[{"offsets": "offsets_addr", "indices": "indices_addr",
                                 "weights": "weights_addr", "gradients": "data_addr"}[where]])
        line = (scratch.base + addr) // LINE_BYTES
        failing[line + int(rng.integers(-(-len(b.indices) * 4 // LINE_BYTES)))
                if where in ("indices", "weights") else line] = (nth, fault)
        # Expected: READ_ERROR, nothing written; pass 1 fails before any row, later
        # failures still count the UPDATE's indices.
        t.data = exp.table_after = before
        exp.status, exp.wrote_table, exp.rows_written = Status.READ_ERROR, False, 0
        if where == "offsets" or (where == "indices" and nth == 1):
            exp.updates = 0
        if where == "ring":         # read as a NOP with every field zero
            exp.fields, exp.kind, exp.bags, exp.updates = {}, DescKind.NOP.value, 0, 0
        await drv.run()
        assert good.status is Status.OK
        assert lead is None or lead.status is Status.OK, lead.status
        assert sum(seen.values()) >= nth, f"{where}: line {line:#x} read {seen} times"
        err = await tb.csr.read("ENG_ERR")
        assert err & 1, f"{where}: ENG_ERR {err:#x}: DESC_ERROR not set"
        info = await tb.csr.read("ENG_ERR_INFO")
        assert (info & 0xFF, await tb.csr.read("ENG_ERR_SEQ")) == (
            Status.READ_ERROR.value, exp.seq), f"{where}: ENG_ERR_INFO {info:#x}"
        await tb.csr.write("ENG_ERR", err)
        await bench.check_errors(cache=1 << int(CacheError.READ_ERROR))
        # The engine goes on: a good UPDATE of the same table.
        failing.clear()
        b = _batch(rng, t.rows)
        b.weights = None
        grads = (rng.standard_normal((len(b.offsets), t.dim)) * 0.05).astype(np.float32)
        ok = await drv.update(t, b, grads, batch_id=0)
        await drv.run()
        assert ok.status is Status.OK, ok.status
    home.faults = None
    await bench.finish()


@group("gpu_memory")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_scratch_write_errors(dut, noise):
    """COH_CTRL.SCRATCH_HOST: the GPU answers some of a LOOKUP's pooled-line writes
    (ItoMWr) with the error flows of ``docs/cxl-cache.md``, "Writes": ``W`` lines in a
    row (``W`` = the agent's write CQIDs, so that every write entry takes each kind)
    with GO_WritePull_Drop (nothing may be sent), the next ``W`` with GO_ERR_WritePull
    (the line is pulled, and dropped by the host), the lines around them answered
    normally; the home model holds the device to each flow. Each faulted write
    completes with ``error``: COH_CACHE_ERR holds exactly WRITE_ERROR and
    COH_CACHE_ERR_INFO names the first faulted write's CQID. The descriptor completes
    all the same (status OK, every bag counted; ``docs/embedding.md`` has no status for
    a failed write and ``hw/engine/completion.py`` completes it), ENG_ERR stays clear,
    and GPU memory holds the pooled vectors except the faulted lines, which keep what
    they held. A good LOOKUP follows."""
    bench, rng, scratch, drv, tables = await _scratch_bench(dut, "scratch_write_errors",
                                                            noise=noise)
    tb, home = bench.tb, bench.gpu.home
    w = bench.cfg.cache_write_cqids
    t = max(tables, key=lambda t: emb.lines_per_row(t.dim, t.data.dtype))
    bags = -(-(2 * w + 2) // emb.lines_per_row(t.dim, t.data.dtype))
    idx, off = emb.random_bags(rng, bags, t.rows, pooling=3)
    exp = await drv.lookup(t, Batch(idx, off, False, None), batch_id=1)
    first = (scratch.base + exp.out_addr) // LINE_BYTES
    plan = {first + 1 + k: "drop" if k < w else "go_err_writepull" for k in range(2 * w)}
    n = len(exp.out_image)
    assert n >= (2 * w + 2) * LINE_BYTES, (n, w)
    old = scratch.image(exp.out_addr, n)
    image = bytearray(exp.out_image)
    for line in plan:
        k = (line - first) * LINE_BYTES
        image[k:k + LINE_BYTES] = old[k:k + LINE_BYTES]
    exp.out_image = bytes(image)
    faulted: dict[int, object] = {}

    def faults(txn) -> set[str]:
        if txn.kind != "write" or txn.line not in plan:
            return set()
        assert txn.line not in faulted, f"pooled line {txn.line:#x} written twice"
        faulted[txn.line] = txn
        return {plan[txn.line]}

    home.faults = faults
    await drv.run()
    home.faults = None
    assert faulted.keys() == plan.keys(), f"faulted lines {sorted(faulted)}, planned {plan}"
    assert exp.status is Status.OK, exp.status
    first_err = min(faulted.values(), key=lambda txn: txn.seq)
    code, _, cqid = _first_error(await tb.csr.read("COH_CACHE_ERR_INFO"))
    assert (code, cqid) == (int(CacheError.WRITE_ERROR), first_err.cqid), (
        f"COH_CACHE_ERR_INFO code {code}, CQID {cqid}: expected WRITE_ERROR, CQID "
        f"{first_err.cqid} (the first faulted write)")
    await bench.check_errors(cache=1 << int(CacheError.WRITE_ERROR))
    await _eng_err(bench, 0)
    good = await drv.lookup(t, _batch(rng, t.rows), batch_id=2)
    await drv.run()
    assert good.status is Status.OK, good.status
    await bench.check_errors()
    await bench.finish()


@group("gpu_memory")
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
        # Every DCOH request is answered by MemRdFwd (CXL 1.1 Table 17, CXL 3.1 Table
        # 3-24); MemWrFwd answers none of them.
        good, other = M2SReqOpcode.MemRdFwd.value, M2SReqOpcode.MemWrFwd.value
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


def _first_error(info: int) -> tuple[int, int, int]:
    """(code, opcode, id) of a COH_CACHE_ERR_INFO / COH_DCOH_ERR_INFO value."""
    return info & 0xF, info >> 4 & 0x1F, info >> 16


@group("gpu_memory")
@cocotb.test()
async def test_error_first_records(dut):
    """COH_CACHE_ERR_INFO and COH_DCOH_ERR_INFO name the first error since their W1C
    register was last all-zero (``docs/registers.md``), not a later one: two bad H2D
    messages of different kinds, 32 cycles apart, for each block (for the agent, an H2D
    Rsp then an H2D Data for CQIDs beyond its rings; for the DCOH, an H2D Data then an
    H2D Rsp for free CQIDs of its pool); after the register is cleared, the next error
    is recorded. (The blocks' own status once cleared itself one cycle after each error,
    so the record named the last error; the CXL.cache fuzzer found it.)"""
    bench = CohBench(dut, "error_first", noise=False)
    await bench.start(0)
    tb, home, csr = bench.tb, bench.gpu.home, bench.tb.csr
    go = H2DRspOpcode.GO.value
    agent, dcoh = bench.agent_cqids + 5, DCOH_CQID_BASE + 1
    cases = (
        ("COH_CACHE_ERR", ("rsp", {"opcode": go, "cqid": agent, "rsp_data": 3}),
         ("data", {"cqid": agent + 1, "data": 1}),
         (int(CacheError.RSP_NOT_IN_FLIGHT), go, agent),
         (int(CacheError.DATA_NOT_IN_FLIGHT), 0, agent + 1)),
        ("COH_DCOH_ERR", ("data", {"cqid": dcoh, "data": 1}),
         ("rsp", {"opcode": go, "cqid": dcoh + 1, "rsp_data": GoState.E.value}),
         (int(DcohError.RSP_UNEXPECTED), 0, dcoh),
         (int(DcohError.RSP_UNEXPECTED), go, dcoh + 1)),
    )

    async def send(channel: str, fields: dict) -> None:
        msg = home.raw(channel, tb.loop.cycle, fields)
        await tb.loop.wait_until(lambda: msg.taken is not None, timeout=1000,
                                 what="bad H2D message taken")
        await tb.loop.wait_cycles(32)

    for reg, first, second, want_first, want_second in cases:
        await send(*first)
        await send(*second)
        got = _first_error(await csr.read(f"{reg}_INFO"))
        assert got == want_first, (
            f"{reg}_INFO (code, opcode, id) {got} after two errors: expected the first, "
            f"{want_first}")
        await csr.write(reg, await csr.read(reg))
        await send(*second)
        got = _first_error(await csr.read(f"{reg}_INFO"))
        assert got == want_second, (
            f"{reg}_INFO {got} after a clear and one error: expected {want_second}")
        await csr.write(reg, await csr.read(reg))
        assert await csr.read(reg) == 0, f"{reg} not cleared"
    await bench.finish()


# --- the protocol table's DCOH flows (tb/cxl_protocol.py) -------------------------------------

def _plan(rng: random.Random, plan: dict[D2HReqOpcode, list[str]], *, skip: int = 3):
    """An ``answer`` hook for :class:`~tb.coherent_host.HostCache`: for each request kind
    in ``plan``, after 0 .. ``skip`` requests of that kind answered normally, the next
    ones get the listed answers in turn. Returns the hook and the CQIDs answered so."""
    left = {op.value: [None] * rng.randint(0, skip) + list(names) for op, names in plan.items()}
    used: list[tuple[int, str]] = []

    def answer(f: dict) -> str | None:
        todo = left.get(f["opcode"])
        if not todo:
            return None
        name = todo.pop(0)
        if name is not None:
            used.append((f["cqid"], name))
        return name

    return answer, used, left


@group("protocol")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_host_bias_writes_mem_rd_fwd(dut, noise):
    """Device writes of host-bias lines (UPDATE rows, LOOKUP outputs, completion records)
    claim each line with RdOwn, which the host answers with MemRdFwd, as CXL 1.1 Table
    17 and CXL 3.1 Table 3-24 say (never MemWrFwd). Every write completes, tables and
    outputs are exact, no DCOH error is flagged, and every RdOwn was answered so."""
    bench = CohBench(dut, "host_bias_writes", noise=noise)
    await bench.start()
    tb = bench.tb
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    drv, tables, _, _ = await _layout(bench, rng)
    await _updates(drv, tables, rng, tb.params.get("n_desc", 3))
    await _lookups(bench, drv, tables, rng, 1)
    await bench.check_errors()
    await bench.finish()
    answers = bench.cache.answers
    assert answers.get("RdOwn:mem_rd_fwd", 0) == bench.cache.stats["fwd_write"] > 0, answers
    assert not [k for k in answers if k.startswith("RdOwn:") and k != "RdOwn:mem_rd_fwd"]


@group("protocol")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_flip_claims_mem_rd_fwd_or_go_e(dut, noise):
    """A flip of the table pages (lines dirty in the GPU's cache) whose RdOwnNoData
    claims the host answers with a random mix of MemRdFwd and H2D Rsp GO-E (both
    allowed, CXL 3.x §3.2.4.2.13; at least one of each): the flip succeeds, the host
    holds no line of the pages, LOOKUPs read the tables in device bias, and GPU reads
    of table lines flip the pages back."""
    bench = CohBench(dut, "flip_mixed", noise=noise)
    await bench.start()
    tb = bench.tb
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    drv, tables, (tp, tn), _ = await _layout(bench, rng)
    prng = random.Random(tb.rng.getrandbits(64))
    forced = ["go_e", "mem_rd_fwd"]
    prng.shuffle(forced)

    def answer(f: dict) -> str | None:
        if f["opcode"] != D2HReqOpcode.RdOwnNoData.value:
            return None
        return forced.pop() if forced else prng.choice(("go_e", "mem_rd_fwd"))

    bench.cache.answer = answer
    await bench.flip(tp, tn)
    bench.cache.answer = None
    answers = bench.cache.answers
    tb.log.info("claims answered: %s", answers)
    assert answers.get("RdOwnNoData:go_e", 0) > 0 and \
        answers.get("RdOwnNoData:mem_rd_fwd", 0) > 0, answers
    assert not bench.cache.lines.keys() & set(bench.host_lines(tp, tn)), "lines still cached"
    await _lookups(bench, drv, tables, rng, tb.params.get("n_desc", 3))
    flips = await tb.csr.read64("COH_HOST_FLIPS")
    for t in tables:
        await bench.cache.load(bench.agent.host_line(t.base // LINE_BYTES))
    await bench.check_errors()
    await bench.finish()
    c = bench.counters
    assert c["COH_GRANTS_DEVICE"] > 0 and c["COH_HOST_FLIPS"] > flips, c


async def _eng_err(bench: CohBench, want: int) -> None:
    """ENG_ERR holds exactly ``want``; clear it."""
    got = await bench.tb.csr.read("ENG_ERR")
    assert got == want, f"ENG_ERR {got:#x}, expected {want:#x}"
    if got:
        await bench.tb.csr.write("ENG_ERR", got)


@group("protocol")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_dcoh_host_errors(dut, noise):
    """The host answers DCOH requests with errors (after writing back and giving up its
    copy, so device memory holds the coherent value): GO-Err on H2D Rsp and H2D Data
    with GO-Err and all-ones data for reads (RdCurr), GO-Err for the write (RdOwn) of a
    LOOKUP's first output line, then GO-Err for one claim of a flip. Each access
    completes as a denied access: the engine gets an AXI SLVERR (ENG_ERR.PMEM_RESP, the
    engine's report of a failed memory access), the descriptors still complete, a
    denied read of a table row returns memory's (coherent) data, so LOOKUP results stay
    exact (the reads denied are the table rows'), and a denied write leaves its line
    unchanged; COH_DCOH_ERR holds exactly HOST_ERROR; the
    flip ends with error and its page stays in host bias (a GPU read of it flips
    nothing back). Afterwards legal traffic and a flip of the same page succeed."""
    bench = CohBench(dut, "dcoh_host_errors", noise=noise)
    await bench.start()
    tb, csr, agent = bench.tb, bench.tb.csr, bench.agent
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    prng = random.Random(tb.rng.getrandbits(64))
    drv, tables, (tp, tn), _ = await _layout(bench, rng)
    host_error = 1 << int(DcohError.HOST_ERROR)
    pmem_resp = register_map(bench.cfg)["ENG_ERR"].pack(pmem_resp=1)
    # Reads of table rows: GO-Err and H2D Data with GO-Err at random (error_rate), every
    # other request answered MemRdFwd, until both kinds have been seen. (A denied read
    # of a descriptor's buffers would complete it READ_ERROR: test_scratch_read_errors.)
    cache = bench.cache
    rows = range(agent.host_line(tp * bench.lpp), agent.host_line((tp + tn) * bench.lpp))
    cache.answer = (lambda f: None if (f["opcode"] == D2HReqOpcode.RdCurr.value
                                       and f["address"] in rows) else "mem_rd_fwd")
    cache.error_rate = 0.2
    rounds = 0
    while not (cache.answers.get("RdCurr:go_err")
               and cache.answers.get("RdCurr:data_go_err")):
        await _lookups(bench, drv, tables, rng, 1)
        rounds += 1
        assert rounds < 8, f"error answers not all used: {cache.answers}"
    cache.answer, cache.error_rate = None, 0.0
    tb.log.info("answers after %d rounds of reads with errors: %s", rounds, cache.answers)
    await bench.check_errors(dcoh=host_error)
    await _eng_err(bench, pmem_resp)
    # A write: the first output line of a LOOKUP is denied and keeps its old value.
    mark = drv.heap.next
    t = tables[0]
    exp = await drv.lookup(t, _batch(rng, t.rows), mode=PoolMode.SUM, batch_id=9)
    denied = exp.out_addr // LINE_BYTES
    old = drv.image(denied * LINE_BYTES, LINE_BYTES)
    new = exp.out_image[:LINE_BYTES]
    assert old != new, "the denied line's old and new values must differ for this test"
    exp.out_image = old + exp.out_image[LINE_BYTES:]
    denials = []

    def deny(f: dict) -> str | None:
        if (f["opcode"] == D2HReqOpcode.RdOwn.value and not denials
                and f["address"] == agent.host_line(denied)):
            denials.append(f["cqid"])
            return "go_err"
        return None

    bench.cache.answer = deny
    await drv.run()
    bench.cache.answer = None
    drv.heap.release(mark)
    assert denials and exp.status is Status.OK, (denials, exp.status)
    assert tb.pmem_line(denied) == old, "a denied write changed memory"
    await bench.check_errors(dcoh=host_error)
    await _eng_err(bench, pmem_resp)
    # A claim answered GO-Err: the flip fails and the page stays in host bias.
    answer, used, _ = _plan(prng, {D2HReqOpcode.RdOwnNoData: ["go_err"]}, skip=bench.lpp - 1)
    bench.cache.answer = answer
    error = await bench.flip_once(tp, 1)
    bench.cache.answer = None
    assert used and error, ("flip with a GO-Err claim did not end with error", used)
    await bench.check_errors(dcoh=host_error)
    flips = await csr.read64("COH_HOST_FLIPS")
    await bench.cache.load(bench.host_lines(tp, 1)[prng.randrange(bench.lpp)])
    assert await csr.read64("COH_HOST_FLIPS") == flips, "the page left host bias"
    # Legal traffic and flips afterwards.
    await bench.flip(tp, 1)
    await _lookups(bench, drv, tables, rng, 2)
    await bench.check_errors()
    await _eng_err(bench, 0)
    await bench.finish()
    done = bench.protocol.completed
    assert done.get("go_err", 0) >= 3 and done.get("data_go_err", 0) >= 1, done


@group("protocol")
@cocotb.test()
async def test_dcoh_unexpected_h2d(dut):
    """H2D Rsp / Data for DCOH CQIDs that no request waits for, or that the request
    waiting cannot take, are dropped and flagged RSP_UNEXPECTED in COH_DCOH_ERR (and
    nothing in COH_CACHE_ERR: the CXL.cache agent never sees them): GO-E and H2D Data
    for free CQIDs of the DCOH's pool; H2D Data (no GO-Err) before the answer of a RdOwn;
    GO-E before the answer of a RdCurr. The requests still complete with their real
    answers; the device then serves legal traffic."""
    bench = CohBench(dut, "dcoh_unexpected_h2d", noise=True)
    await bench.start()
    tb = bench.tb
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    drv, tables, _, _ = await _layout(bench, rng)
    home, unexpected = bench.gpu.home, 1 << int(DcohError.RSP_UNEXPECTED)
    go_e = {"opcode": H2DRspOpcode.GO.value, "rsp_data": GoState.E.value}
    for k in (1, bench.cfg.dcoh_cqids - 1):
        home.raw("rsp", tb.loop.cycle, go_e | {"cqid": DCOH_CQID_BASE + k})
        await bench.check_errors(dcoh=unexpected)
        home.raw("data", tb.loop.cycle, {"cqid": DCOH_CQID_BASE + k, "data": ALL_ONES,
                                         "go_err": 1})
        await bench.check_errors(dcoh=unexpected)
    todo = {D2HReqOpcode.RdOwn.value: ("data", {"data": 0x55, "go_err": 0}),
            D2HReqOpcode.RdCurr.value: ("rsp", go_e)}
    sent = []

    def h2d_faults(f: dict) -> list[tuple[str, dict]]:
        bad = todo.pop(f["opcode"], None)
        if bad is None:
            return []
        sent.append(f["opcode"])
        return [(bad[0], bad[1] | {"cqid": f["cqid"]})]

    bench.cache.h2d_faults = h2d_faults
    rounds = 0
    while todo:
        await _lookups(bench, drv, tables, rng, 1)
        rounds += 1
        assert rounds < 6, f"bad H2D messages not sent: {todo}"
    bench.cache.h2d_faults = None
    assert len(sent) == 2, sent
    await bench.check_errors(dcoh=unexpected)
    await _lookups(bench, drv, tables, rng, 1)
    await bench.check_errors()
    await bench.finish()


# --- the CXL.cache fuzzer ----------------------------------------------------------------------

#: Fuzzed H2D messages between two checks of the error CSRs.
CACHE_FUZZ_ROUND = 64
#: After the first check of the error CSRs and every fourth one after it, the fuzzer
#: asks for a quiet point (between two doorbells, nothing in flight) and sends a burst
#: for ring CQIDs, all free then.
CACHE_FUZZ_QUIET_EVERY = 4
#: Bounds the fuzzer holds the device to (cycles): a snoop's transfer to its answer's;
#: a write's pull taken to its D2H Data; a D2H Req to its last H2D message or D2H Data
#: (this includes the GPU home's latency, up to 100 + 8 cycles of jitter, and the wait
#: behind fuzzed messages on the same H2D channel).
SNOOP_BOUND = 64
PULL_BOUND = 128
REQUEST_BOUND = 500
#: H2D Rsp opcodes that a write in flight cannot take (``docs/cxl-cache.md``, "Writes":
#: ExtCmp, Fast_GO, Fast_GO_WritePull and the reserved ones).
_WRITE_UNEXPECTED = sorted({H2DRspOpcode.ExtCmp.value, H2DRspOpcode.Fast_GO.value,
                            H2DRspOpcode.Fast_GO_WritePull.value}
                           | (set(range(16)) - {op.value for op in H2DRspOpcode}))
_RESERVED_SNOOPS = sorted(set(range(8)) - {op.value for op in H2DReqOpcode})
_LINE_ONES = (1 << 512) - 1
_ADDR_ONES = (1 << 46) - 1


class CacheFuzzer:
    """The fuzzed H2D messages of :func:`test_cxl_cache_fuzz` and what the contract
    (``docs/cxl-cache.md``, ``docs/dcoh.md``) says each one does.

    Every message the fuzzer makes is given its expected error (CacheError code, or the
    DCOH's RSP_UNEXPECTED, or none for a legal snoop) when it is made or, for those
    whose CQID depends on the traffic, when the GPU home first offers it; the error's
    cycle follows from the cycle of its transfer (``o_err_set`` two cycles after an H2D
    Rsp / Data handshake, one after a snoop's). Every :data:`CACHE_FUZZ_ROUND` messages
    the fuzzer stops making them, waits until all are taken and answered, and checks
    COH_CACHE_ERR / COH_DCOH_ERR and their first-error records exactly, then clears them.

    Kinds (counted in :attr:`kinds` when transferred):

    * ``snoop``, ``snoop_reserved``: H2D Req of every opcode, at hot lines (requests in
      flight, recent ones), device lines, address extremes and random lines, UQID 0 /
      4095 / any, reserved bits 0 / 3: answered RspIHitI (the home checks the answer and
      :attr:`CacheHome.snoop_wait_max`), a reserved opcode flagged SNOOP_RESERVED;
    * ``rsp_beyond``: H2D Rsp of any opcode (reserved included) and field extremes for a
      CQID beyond both rings and the DCOH's pool: RSP_NOT_IN_FLIGHT;
    * ``data_beyond``, ``data_write_cqid``: H2D Data (poison, GO-Err, ChunkValid,
      reserved bits, data extremes) for such a CQID or any write CQID:
      DATA_NOT_IN_FLIGHT;
    * ``dcoh_rsp``, ``dcoh_data``: the same for a CQID of the DCOH's pool, which has
      nothing in flight (HDM-D off): COH_DCOH_ERR RSP_UNEXPECTED, nothing in
      COH_CACHE_ERR;
    * per request of the device, with probability ``fault_rate``, a structural fault of
      the GPU home (:mod:`tb.cache_home`): ``read_dup_go``, ``read_write_pull``,
      ``read_stray_rsp`` (any opcode, field extremes), ``write_dup_pull``,
      ``write_ext_cmp``, ``write_stray_rsp`` (an opcode a write cannot take):
      RSP_UNEXPECTED, the request completes as if it had not come; ``read_dup_data``:
      a second H2D Data (other data, poison, GO-Err at random) while an older read
      still waits for its data, so the read cannot have left: DATA_DUPLICATE and the
      first line kept (when no older read waits, the second Data is sent for a CQID
      beyond the rings instead: ``read_dup_data_moved``, DATA_NOT_IN_FLIGHT);
    * ``rsp_free_ring``, ``data_free_read`` at quiet points: every ring CQID free:
      RSP_NOT_IN_FLIGHT / DATA_NOT_IN_FLIGHT, in back-to-back bursts.
    """

    def __init__(self, bench: CohBench, rng: random.Random, n: int, *,
                 fault_rate: float = 0.3):
        self.bench, self.rng, self.n = bench, rng, n
        self.loop = bench.tb.loop
        self.home = home = bench.gpu.home
        cfg = bench.cfg
        self.read_cqids = cfg.cache_cqids
        self.write_cqids = range(cfg.cache_cqids, cfg.cache_cqids + cfg.cache_write_cqids)
        agent = bench.agent_cqids
        self.dcoh = range(DCOH_CQID_BASE, DCOH_CQID_BASE + cfg.dcoh_cqids)
        self.beyond_ranges = ((agent, DCOH_CQID_BASE), (self.dcoh.stop, 1 << 12))
        self.beyond_edges = [agent, DCOH_CQID_BASE - 1, self.dcoh.stop, (1 << 12) - 1]
        self.fault_rate = fault_rate
        self.kinds: dict[str, int] = {}
        self.legal_answers = 0
        self.made = 0               # fuzzed messages made
        self.outstanding = 0        # made by the fuzzer itself, not yet transferred
        self.fault_txns: list = []  # requests given a structural fault this round
        self.cache_events: list[tuple[int, int, int, int]] = []  # (cycle, code, opcode, id)
        self.dcoh_events: list[tuple[int, int, int, int]] = []
        self.checking = False
        self.done = False
        self.want_quiet = False
        self.checks = self.quiet_points = 0
        self._since_check = 0
        self._unchecked: list = []  # device requests whose bounds are not checked yet
        self._seen_reads = self._seen_writes = 0
        self.max_request = self.max_pull = 0
        home.on_take = self._taken
        home.faults = self._faults
        home.stray = self._stray
        home.dup_fill = self._dup_fill

    # --- field choices ------------------------------------------------------------------
    def _beyond(self) -> int:
        if self.rng.random() < 0.3:
            return self.rng.choice(self.beyond_edges)
        lo, hi = self.rng.choice(self.beyond_ranges)
        return self.rng.randrange(lo, hi)

    def _rsp_fields(self, opcodes) -> dict:
        r = self.rng
        return {"opcode": r.choice(opcodes),
                "rsp_data": r.choice((0, 0xFFF, r.randrange(1 << 12),
                                      r.choice(list(GoState)).value)),
                "rsp_pre": r.randrange(4), "rsvd": r.randrange(2)}

    def _data_fields(self) -> dict:
        r = self.rng
        return {"data": r.choice((0, _LINE_ONES, r.getrandbits(512))),
                "poison": r.randrange(2), "go_err": r.randrange(2),
                "chunk_valid": r.randrange(2), "rsvd": r.choice((0, 0xFF, r.randrange(256)))}

    def _count(self, kind: str) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    # --- the GPU home's hooks -------------------------------------------------------------
    def _faults(self, txn) -> set[str]:
        if self.checking or self.done or self.rng.random() >= self.fault_rate:
            return set()
        if txn.kind == "read":
            fault = self.rng.choice(("dup_go", "write_pull", "stray_rsp", "stray_rsp",
                                     "dup_data", "dup_data"))
        else:
            fault = self.rng.choice(("dup_pull", "ext_cmp", "stray_rsp", "stray_rsp"))
        self.fault_txns.append(txn)
        self.outstanding += fault == "dup_data"     # (a message of its own, below)
        self.made += 1
        self._since_check += 1
        return {fault}

    def _stray(self, txn) -> dict:
        """Any opcode for a read (any H2D Rsp for a read in flight is unexpected); for a
        write, one it cannot take before its first answer."""
        return self._rsp_fields(range(16) if txn.kind == "read" else _WRITE_UNEXPECTED)

    def _dup_fill(self, msg, t: int) -> dict:
        """The second H2D Data of a read, when first offered: while a read requested
        before it still waits for its data (which comes on this channel, after this
        message), the read cannot have left the reorder buffer (lines leave in request
        order), so this is a duplicate; otherwise the read may have left and its CQID
        been reused, so the message goes to a CQID beyond the rings instead."""
        txn = msg.tag
        older = any(o.kind == "read" and o.seq < txn.seq and o.t_data is None
                    for o in self.home.open_requests())
        if older:
            msg.tag = ("read_dup_data", "cache", int(CacheError.DATA_DUPLICATE))
            return {k: v for k, v in self._data_fields().items() if k != "chunk_valid"}
        msg.tag = ("read_dup_data_moved", "cache", int(CacheError.DATA_NOT_IN_FLIGHT))
        return {"cqid": self._beyond()}

    def _taken(self, channel: str, msg, t: int) -> None:
        f = msg.fields
        if msg.role == "snoop":
            if msg.tag is None:
                return
            self.outstanding -= 1
            self._count(msg.tag)
            if f["opcode"] in _RESERVED_SNOOPS:
                self.cache_events.append((t + 1, int(CacheError.SNOOP_RESERVED),
                                          f["opcode"], f["uqid"]))
            return
        opcode = f["opcode"] if channel == "rsp" else 0
        if msg.role == "raw" and msg.tag is not None:
            self.outstanding -= 1
            kind, where, code = msg.tag
            self._count(kind)
            if where == "dcoh":
                # In one cycle the DCOH takes an H2D Rsp before an H2D Data.
                self.dcoh_events.append((2 * t + (channel == "data"), code, opcode, f["cqid"]))
            else:
                self.cache_events.append((t + 2, code, opcode, f["cqid"]))
            return
        if msg.role == "extra":
            txn = msg.txn
            if channel == "data":       # the second H2D Data of a read
                self.outstanding -= 1
                kind, _, code = msg.tag
            else:
                (fault,) = txn.faults
                kind, code = f"{txn.kind}_{fault}", int(CacheError.RSP_UNEXPECTED)
            self._count(kind)
            self.cache_events.append((t + 2, code, opcode, f["cqid"]))
            return
        self.legal_answers += 1

    # --- making messages ------------------------------------------------------------------
    def _raw(self, channel: str, fields: dict, tag: tuple, due: int, fill=None) -> None:
        self.home.raw(channel, due, fields, tag=tag, fill=fill)
        self.outstanding += 1
        self.made += 1
        self._since_check += 1

    def _snoop_line(self) -> int:
        r, home = self.rng, self.home
        pick = r.random()
        hot = [x.line for x in home.open_requests()]
        hot += [x.line for x in home.reads[-4:] + home.writes[-4:]]
        if pick < 0.5 and hot:
            return r.choice(hot)
        if pick < 0.6:
            return r.choice((0, _ADDR_ONES))
        if pick < 0.75:     # a device line (HDM), which the device's DCOH serves
            return self.bench.agent.host_line(r.randrange(self.bench.agent.window_lines))
        return r.getrandbits(46)

    def snoop(self, due: int, *, reserved: bool | None = None) -> None:
        r = self.rng
        if reserved is None:
            reserved = r.random() < 0.4
        op = r.choice(_RESERVED_SNOOPS if reserved else [o.value for o in H2DReqOpcode])
        self.home.snoop(due, self._snoop_line(), op, uqid=r.choice((None, 0, 4095)),
                        rsvd=r.choice((0, 0, 3)),
                        tag="snoop_reserved" if op in _RESERVED_SNOOPS else "snoop")
        self.outstanding += 1
        self.made += 1
        self._since_check += 1

    def emit(self, what: str, due: int) -> None:
        r = self.rng
        if what == "snoop":
            self.snoop(due)
        elif what == "rsp_beyond":
            self._raw("rsp", {**self._rsp_fields(range(16)), "cqid": self._beyond()},
                      ("rsp_beyond", "cache", int(CacheError.RSP_NOT_IN_FLIGHT)), due)
        elif what == "data_beyond":
            write = r.random() < 0.4
            cqid = r.choice(self.write_cqids) if write else self._beyond()
            self._raw("data", {**self._data_fields(), "cqid": cqid},
                      ("data_write_cqid" if write else "data_beyond", "cache",
                       int(CacheError.DATA_NOT_IN_FLIGHT)), due)
        elif what == "dcoh":
            cqid = r.choice((self.dcoh.start, self.dcoh.stop - 1, r.choice(self.dcoh)))
            code = int(DcohError.RSP_UNEXPECTED)
            if r.random() < 0.5:
                self._raw("rsp", {**self._rsp_fields(range(16)), "cqid": cqid},
                          ("dcoh_rsp", "dcoh", code), due)
            else:
                self._raw("data", {**self._data_fields(), "cqid": cqid},
                          ("dcoh_data", "dcoh", code), due)
        else:
            raise ValueError(what)

    async def run(self) -> None:
        """Make fuzzed messages at random times until ``n`` are made (bursts of 2 to 16
        back to back now and then), checking the error CSRs every round."""
        r, loop = self.rng, self.loop
        kinds, weights = ("snoop", "rsp_beyond", "data_beyond", "dcoh"), (4, 3, 3, 1)
        while self.made < self.n:
            if self._since_check >= CACHE_FUZZ_ROUND:
                await self.check()
                if self.checks % CACHE_FUZZ_QUIET_EVERY == 1:
                    self.want_quiet = True
                if r.random() < 0.5:
                    # A round that opens with an H2D Rsp, an H2D Data and a reserved
                    # snoop due at once: their errors often come in one cycle, or the
                    # snoop's (one cycle after its transfer) in the cycle of another's
                    # (two after), so the first-error record's tie rule is exercised.
                    for what in ("rsp_beyond", "data_beyond"):
                        self.emit(what, loop.cycle)
                    self.snoop(loop.cycle, reserved=True)
            what = r.choices(kinds, weights)[0]
            burst = r.randint(2, 16) if r.random() < 0.15 else 1
            due = loop.cycle + (0 if burst > 1 else r.randint(0, 30))
            for _ in range(min(burst, self.n - self.made)):
                self.emit(what, due)
            await loop.wait_cycles(r.randint(2, 48))
        self.done = True
        await self.check()

    async def quiet(self) -> None:
        """At a quiet point (the caller's descriptors all complete): once the GPU home
        has nothing in flight and the agent has had time to free every CQID, a
        back-to-back burst of H2D Rsp for ring CQIDs and H2D Data for read CQIDs, every
        one not in flight. Each CQID is checked again when the message is first offered
        (a request of the device in flight would move it beyond the rings)."""
        self.want_quiet = False
        if self.done:
            return
        loop, r, home = self.loop, self.rng, self.home
        await loop.wait_until(lambda: not self.checking, timeout=10 * REQUEST_BOUND,
                              what="fuzzer's error check done")
        await loop.wait_until(lambda: not home.open_requests(), timeout=REQUEST_BOUND,
                              what="GPU home: no request in flight")
        await loop.wait_cycles(64)
        # (No await from here until the burst is made: a check of the error CSRs that
        # started meanwhile must see none of it, or all of it.)
        while self.checking:
            await loop.wait_until(lambda: not self.checking, timeout=10 * REQUEST_BOUND,
                                  what="fuzzer's error check done")
        if self.done:               # (the last check may have run meanwhile)
            return
        self.quiet_points += 1
        ring = self.read_cqids + len(self.write_cqids)

        def recheck(msg, t):
            if home.open_requests():
                kind, where, code = msg.tag
                msg.tag = (kind + "_moved", where, code)
                return {"cqid": self._beyond()}
            return {}

        bfm = self.bench.cbfm
        bfm.set_idle(0.0)
        due = loop.cycle
        for _ in range(min(r.randint(8, 24), max(1, self.n - self.made))):
            edge = r.choice((0, self.read_cqids - 1, self.read_cqids, ring - 1))
            cqid = edge if r.random() < 0.3 else r.randrange(ring)
            if r.random() < 0.5:
                self._raw("rsp", {**self._rsp_fields(range(16)), "cqid": cqid},
                          ("rsp_free_ring", "cache", int(CacheError.RSP_NOT_IN_FLIGHT)),
                          due, fill=recheck)
            else:
                self._raw("data", {**self._data_fields(), "cqid": r.randrange(self.read_cqids)},
                          ("data_free_read", "cache", int(CacheError.DATA_NOT_IN_FLIGHT)),
                          due, fill=recheck)
        await loop.wait_until(lambda: self.outstanding == 0, timeout=REQUEST_BOUND,
                              what="quiet burst taken")
        bfm.set_idle(self.bench.tb.idle)

    # --- checks ---------------------------------------------------------------------------
    def check_bounds(self) -> None:
        """Every request of the device seen so far: done within :data:`REQUEST_BOUND`
        of its D2H Req (or still young), a write's data within :data:`PULL_BOUND` of its
        pull; every snoop answered within :data:`SNOOP_BOUND`."""
        home, now = self.home, self.loop.cycle
        self._unchecked += home.reads[self._seen_reads:] + home.writes[self._seen_writes:]
        self._seen_reads, self._seen_writes = len(home.reads), len(home.writes)
        left = []
        for x in self._unchecked:
            if not x.done:
                assert now - x.t_req <= REQUEST_BOUND, (
                    f"{x.kind} CQID {x.cqid} (line {x.line:#x}, D2H Req at {x.t_req}) not "
                    f"done after {now - x.t_req} cycles: {home.outstanding()}")
                left.append(x)
                continue
            end = max(x.t_data or 0, x.t_go or 0)
            self.max_request = max(self.max_request, end - x.t_req)
            assert end - x.t_req <= REQUEST_BOUND, (
                f"{x.kind} CQID {x.cqid} took {end - x.t_req} cycles (bound {REQUEST_BOUND})")
            if x.kind == "write" and x.t_pull is not None and x.t_data is not None:
                self.max_pull = max(self.max_pull, x.t_data - x.t_pull)
                assert x.t_data - x.t_pull <= PULL_BOUND, (
                    f"write CQID {x.cqid}: D2H Data {x.t_data - x.t_pull} cycles after its "
                    f"pull (bound {PULL_BOUND})")
        self._unchecked = left
        assert home.snoop_wait_max <= SNOOP_BOUND, (
            f"a snoop waited {home.snoop_wait_max} cycles for its answer (bound {SNOOP_BOUND})")

    @staticmethod
    def _expected(events) -> tuple[int, tuple[int, int, int] | None]:
        bits = 0
        for _, code, _, _ in events:
            bits |= 1 << code
        if not events:
            return 0, None
        _, code, opcode, ident = min(events)
        return bits, (code, opcode, ident)

    async def check(self) -> None:
        """Stop making messages, wait until every one is taken and answered, check the
        error CSRs against the round's expectation, clear them."""
        self.checking = True
        home, loop, csr = self.home, self.loop, self.bench.tb.csr
        await loop.wait_until(
            lambda: (self.outstanding == 0 and all(x.done for x in self.fault_txns)
                     and home.snoops_answered == home.snoops_sent),
            timeout=2 * REQUEST_BOUND, what="fuzzed messages taken and answered")
        await loop.wait_cycles(8)
        self.check_bounds()
        for name, events in (("COH_CACHE_ERR", self.cache_events),
                             ("COH_DCOH_ERR", self.dcoh_events)):
            want_bits, want_first = self._expected(events)
            got = await csr.read(name)
            info = await csr.read(f"{name}_INFO")
            where = f"fuzzer check {self.checks} (cycle {loop.cycle}), {name}"
            assert got == want_bits, (
                f"{where} {got:#x}, expected {want_bits:#x} from {len(events)} messages")
            if want_first is not None:
                first = _first_error(info)
                assert first == want_first, (
                    f"{where}_INFO (code, opcode, id) {first}, expected {want_first} (the "
                    f"earliest of {sorted(events)[:40]})")
                await csr.write(name, got)
                assert await csr.read(name) == 0, f"{where}: not cleared"
        self.cache_events.clear()
        self.dcoh_events.clear()
        self.fault_txns.clear()
        self._since_check = 0
        self.checks += 1
        self.checking = False


@group("fuzz")
@cocotb.test()
async def test_cxl_cache_fuzz(dut):
    """CXL.cache fuzzer: ``n_msgs`` fuzzed H2D messages (:class:`CacheFuzzer`: snoops of
    every opcode, reserved ones included, at hot, device, extreme and random lines; H2D
    Rsp and H2D Data for CQIDs never in flight, beyond the rings, in the DCOH's pool and
    of the write ring; stray responses, duplicate pulls and duplicate (other, poisoned)
    data for requests in flight; free ring CQIDs in bursts at quiet points) among legal
    coherent traffic: LOOKUPs and UPDATEs whose descriptors, buffers and pooled vectors
    are in GPU memory (RING_HOST, SCRATCH_HOST) and whose records go there (CQ_HOST),
    random idle cycles and backpressure on every channel, the GPU home answering in
    random order. Checked: every snoop answered RspIHitI within its bound (the home),
    every request of the device done within its bounds, COH_CACHE_ERR / COH_DCOH_ERR
    and their first errors exactly each round, every descriptor, pooled vector and
    table against the golden model, every change of GPU memory one that the GPU or a
    legal write of the device made, and legal traffic served afterwards with no error.
    ``out``: a JSON file for the figures."""
    bench = CohBench(dut, "cxl_cache_fuzz", noise=True)
    cfg = bench.cfg
    await bench.start(CQ_HOST)
    bench.checker.hdm_d = False
    tb = bench.tb
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    prng = random.Random(tb.rng.getrandbits(64))
    gpu, home = bench.gpu, bench.gpu.home
    own: dict[int, set[int]] = {}       # GPU line -> values the GPU itself wrote
    gpu_write = gpu.write

    def write(line: int, data: bytes) -> None:
        own.setdefault(line, set()).add(int.from_bytes(data, "little"))
        gpu_write(line, data)

    gpu.write = write
    scratch = HostScratch(gpu, base=gpu_addr(cfg, 0x10000), size=1 << 16)
    drv, tables, _, _ = await _layout(bench, rng, cq_host=gpu_addr(cfg, 0x1000),
                                      write_back=True, scratch=scratch, ring_host=True)
    n = tb.params.get("n_msgs", 400)
    fz = CacheFuzzer(bench, prng, n)
    mark = scratch.heap.next
    rounds = 0

    async def traffic_round(r: int) -> None:
        scratch.heap.release(mark)
        exps = await _queue_lookups(drv, tables, rng, r)
        if rng.random() < 0.5:
            t = tables[int(rng.integers(len(tables)))]
            b = _batch(rng, t.rows)
            grads = (rng.standard_normal((len(b.offsets), t.dim)) * 0.05).astype(np.float32)
            exps.append(await drv.update(t, b, grads, batch_id=r))
        await drv.run()
        for exp in exps:
            assert exp.status is Status.OK, (r, exp.status)

    fuzzing = cocotb.start_soon(fz.run())
    while not fz.done:
        await traffic_round(rounds)
        rounds += 1
        if fz.want_quiet:
            await fz.quiet()
    await fuzzing
    tb.log.info("%d fuzzed H2D messages in %d checks, %d quiet points, among %d doorbells "
                "of legal traffic (%d legal H2D answers, %d reads, %d writes): %s",
                fz.made, fz.checks, fz.quiet_points, rounds, fz.legal_answers,
                len(home.reads), len(home.writes), dict(sorted(fz.kinds.items())))
    assert sum(fz.kinds.values()) == fz.made, (fz.made, fz.kinds)
    # Legal traffic afterwards: no error of any kind.
    home.faults = None
    for r in range(2):
        await traffic_round(rounds + r)
    await bench.check_errors()
    fz.check_bounds()
    # The golden tables, bit for bit; every change of GPU memory explained.
    for t in tables:
        assert drv.image(t.base, t.nbytes) == emb.pack_rows(t.data, base=t.image0), (
            f"table at {t.base:#x} differs from the golden model")
    device = {(w.line, w.value) for w in home.writes
              if w.value is not None and "go_err_writepull" not in w.faults}
    for line, history in home.history.items():
        assert home.mem[line] == history[-1][1], f"GPU line {line:#x}: history"
        for cycle, value in history[1:]:
            assert value in own.get(line, ()) or (line, value) in device, (
                f"GPU line {line:#x} written at cycle {cycle} with a value neither the GPU "
                "nor a write of the device made")
    if "out" in tb.params:
        Path(tb.params["out"]).write_text(json.dumps({
            "fuzzed_cxl_cache_messages": fz.made, "kinds": dict(sorted(fz.kinds.items())),
            "legal_h2d_answers": fz.legal_answers, "device_reads": len(home.reads),
            "device_writes": len(home.writes), "doorbells": rounds, "checks": fz.checks,
            "quiet_points": fz.quiet_points, "max_snoop_wait": home.snoop_wait_max,
            "max_request_cycles": fz.max_request, "max_pull_cycles": fz.max_pull,
            "seed": tb.seed}) + "\n")
    await bench.finish()
