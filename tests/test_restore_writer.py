# amaranth: UnusedElaboratable=no
"""RestoreWriter (hw/ckpt/restore_writer.py) in the Amaranth simulator.

The bench plays the log scan: it fills a record's lines into the buffer (``i_fill``,
random idle cycles), offers the restore job, and fills the next record while the
writer works; commit-word jobs are mixed in, and some jobs are offered with ``stop``
high. The AXI port is served by :class:`tb.pmem.PmemModel` (random latency, random
AW/W backpressure and B idle cycles; slow writes so the limit of outstanding writes is
reached). Checks: the writes are exactly those of the jobs not stopped, in job order,
with the right data and strobes, and the PMEM image ends as sequential application
says; never more than ``MAX_WRITES`` writes without their B; ``idle`` only with every
B in; ``b_error`` with each error response; a stream-rule checker on AW and W; with no
backpressure a record's lines go out one per two cycles. Seeds are printed;
``SEED=<n>`` replays one.
"""

from __future__ import annotations

import itertools
import random

import pytest

from hw.ckpt.restore_writer import MAX_WRITES, RestoreWriter
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import AxiPmemPort, Traffic

AW = 20
LINE = 64
INDEX_WIDTH = 3
REGION = 0x4000         # jobs write into this many bytes, so rows overlap


def _run(seed: int, *, traffic: Traffic, timing: PmemTiming, jobs: int = 40,
         idle: float = 0.3, p_stop: float = 0.1, size: int = 1 << AW) -> dict:
    rng = random.Random(seed)
    dut = RestoreWriter(addr_width=AW, id_width=2, index_width=INDEX_WIDTH)
    model = PmemModel(size=size, timing=timing, rng=random.Random(seed))
    axi = AxiPmemPort(dut.pmem, model, rng, traffic)
    want: dict[int, bytearray] = {}
    expect_aws: list[int] = []
    stats = {"b_errors": 0, "b_error_resps": 0, "max_out": 0, "gaps": []}

    async def step(ctx):
        bvalid, bready, bresp, b_error, idle_, busy = await axi.tick(
            ctx, dut.pmem.bvalid, dut.pmem.bready, dut.pmem.bresp, dut.b_error, dut.idle,
            dut.busy)
        stats["b_errors"] += b_error
        stats["b_error_resps"] += bool(bvalid and bready and bresp)
        out = len(axi.aws) - step.bs
        step.bs += bool(bvalid and bready)
        stats["max_out"] = max(stats["max_out"], out)
        if idle_:
            assert not busy and len(axi.aws) == step.bs, "idle with a B outstanding"
        return busy

    step.bs = 0

    async def bench(ctx):
        for _ in range(jobs):
            commit = rng.random() < 0.2
            n = rng.randint(1, 1 << INDEX_WIDTH)
            addr = LINE * rng.randrange((REGION - n * LINE) // LINE)
            lines = [rng.getrandbits(512) for _ in range(n)]
            word = rng.getrandbits(64)
            if not commit:
                order = list(range(n))
                rng.shuffle(order)          # any order: the index says where
                for k in order:
                    while rng.random() < idle:
                        await step(ctx)
                    ctx.set(dut.i_fill.valid, 1)
                    ctx.set(dut.i_fill.payload, {"index": k, "data": lines[k]})
                    await step(ctx)
                    ctx.set(dut.i_fill.valid, 0)
            stop = rng.random() < p_stop
            ctx.set(dut.stop, stop)
            ctx.set(dut.i_job.payload, {"commit": commit, "n": n, "addr": addr, "word": word})
            ctx.set(dut.i_job.valid, 1)
            while not ctx.get(dut.i_job.ready):
                await step(ctx)
            await step(ctx)
            ctx.set(dut.i_job.valid, 0)
            ctx.set(dut.stop, 0)
            if stop:
                continue
            if commit:
                expect_aws.append(addr)
                want.setdefault(addr, bytearray(LINE))[:8] = word.to_bytes(8, "little")
            for k in range(0 if commit else n):
                expect_aws.append(addr + LINE * k)
                want[addr + LINE * k] = bytearray(lines[k].to_bytes(LINE, "little"))
        for _ in range(100_000):
            if ctx.get(dut.idle) and not ctx.get(dut.busy):
                break
            await step(ctx)
        for _ in range(3):
            await step(ctx)
        assert ctx.get(dut.idle), "writer never idle"

    simulate(dut, bench)
    assert not axi.errors, axi.errors[:5]
    assert axi.aws == expect_aws, "writes not those of the jobs, in order"
    assert model.outstanding == (0, 0)
    if size == 1 << AW:
        for addr, data in want.items():
            assert model.read(addr, LINE) == bytes(data), f"line {addr:#x}"
    assert stats["max_out"] <= MAX_WRITES
    assert stats["b_errors"] == stats["b_error_resps"]
    return stats


TRAFFIC = {"smooth": Traffic(), "rough": Traffic(aw_bp=0.4, w_bp=0.4, b_idle=0.3),
           "aw_only": Traffic(aw_bp=0.7), "w_only": Traffic(w_bp=0.7)}


@pytest.mark.parametrize("traffic", list(TRAFFIC))
def test_jobs(traffic, seed):
    rng = random.Random(seed)
    timing = PmemTiming(read_latency=4, write_latency=rng.randint(1, 30), jitter=8)
    _run(seed, traffic=TRAFFIC[traffic], timing=timing)


def test_outstanding_limit(seed):
    """Writes slower than the writer: the outstanding writes reach MAX_WRITES."""
    got = _run(seed, traffic=Traffic(b_idle=0.5), idle=0.0, p_stop=0.0, jobs=30,
               timing=PmemTiming(write_latency=400, write_bandwidth_ratio=0.25))
    assert got["max_out"] == MAX_WRITES


def test_error_responses(seed):
    """Jobs past the end of PMEM: DECERR B responses, each with ``b_error``."""
    got = _run(seed, traffic=Traffic(b_idle=0.3), size=REGION // 2,
               timing=PmemTiming(write_latency=8))
    assert got["b_errors"] > 0


def test_one_line_per_two_cycles():
    """No backpressure, fast writes: a record's AWs are two cycles apart."""
    dut = RestoreWriter(addr_width=AW, id_width=1, index_width=INDEX_WIDTH)
    n = 1 << INDEX_WIDTH

    async def bench(ctx):
        ctx.set(dut.pmem.awready, 1)
        ctx.set(dut.pmem.wready, 1)
        for k in range(n):
            ctx.set(dut.i_fill.valid, 1)
            ctx.set(dut.i_fill.payload, {"index": k, "data": k + 1})
            await ctx.tick()
        ctx.set(dut.i_fill.valid, 0)
        ctx.set(dut.i_job.payload, {"n": n, "addr": 0x1000})
        ctx.set(dut.i_job.valid, 1)
        await ctx.tick()
        ctx.set(dut.i_job.valid, 0)
        cycles, data = [], []
        for cycle in range(4 * n):          # cycle 0: the one after the job's
            _, _, awvalid, wdata = await ctx.tick().sample(dut.pmem.awvalid, dut.pmem.wdata)
            if awvalid:
                cycles.append(cycle)
                data.append(wdata)
        assert data == [k + 1 for k in range(n)]
        assert [b - a for a, b in itertools.pairwise(cycles)] == [2] * (n - 1)
        assert cycles[0] == 2, "the first line is valid three cycles after its job"

    simulate(dut, bench)


@pytest.mark.parametrize("bad", [0, 9])
def test_rejects_bad_parameters(bad):
    with pytest.raises(ValueError,
                       match=f"^index_width must be an integer from 1 to 8, not {bad!r}$"):
        RestoreWriter(addr_width=AW, id_width=1, index_width=bad)
