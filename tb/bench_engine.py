"""cocotb benchmarks of the embedding engine (``make bench`` via ``sim/bench.py``).

Each test writes its figures as JSON to the path in the ``out`` test parameter; no
figure is asserted here (tests check, benchmarks measure), but every descriptor is still
checked bit for bit by :class:`~tb.engine_driver.EngineDriver` while it is measured.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import cocotb
import numpy as np

from hw.engine.engine import PMEM_KIND_CSRS
from sim import embedding as emb
from sim.embedding import FP32, LINE_BYTES
from tb import env
from tb.bench_mem import BENCH_PLATFORM, BENCH_TIMING
from tb.coherent_host import attach_gpu_memory
from tb.device_tb import DeviceTB
from tb.engine_driver import Batch, EngineDriver, HostScratch, random_table


def _write(result: dict) -> None:
    out = Path(env.params()["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def _fixed_bags(rng, num_bags: int, pooling: int, rows: int, zipf: float | None) -> Batch:
    """``num_bags`` bags of exactly ``pooling`` rows (uniform, or power-law indices)."""
    n = num_bags * pooling
    if zipf is None:
        idx = rng.integers(0, rows, n).astype(np.int32)
    else:
        idx = emb.power_law_rows(rng, n, rows, zipf).astype(np.int32)
    offsets = (np.arange(num_bags) * pooling).astype(np.int32)
    return Batch(idx, offsets)


async def _started(dut, name: str, rows: int, dim: int, scratch: str = "device"):
    """The device on the benchmarks' platform, one table. ``scratch``: where the
    descriptors' buffers and the ring live: ``"device"`` memory (PMEM, written by
    backdoor), or ``"gpu"`` memory (``COH_CTRL.SCRATCH_HOST`` and ``RING_HOST``, as the
    training flow runs: the GPU memory of ``ideal-1ch``, 75 cycles, no link)."""
    assert scratch in ("device", "gpu"), scratch
    tb = DeviceTB(dut, name, timing=BENCH_TIMING)
    host = None
    if scratch == "gpu":
        gpu = attach_gpu_memory(tb, BENCH_PLATFORM, noise=False)
        host = HostScratch(gpu, base=tb.config.hdm_base + tb.config.hdm_size,
                           size=tb.config.pmem_size)
    await tb.start()
    drv = EngineDriver(tb, ring_order=6, heap_end=tb.config.pmem_size, scratch=host,
                       ring_host=host is not None)
    await drv.setup()
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    table = await drv.add_table(random_table(rng, rows, dim, FP32))
    # Steady state: the engine's once-after-reset clearing of its UPDATE tables
    # (ENG_STATUS.INIT) is not part of any descriptor's time.
    while (await tb.csr.read_fields("ENG_STATUS")).init:
        await tb.loop.wait_cycles(64)
    return tb, drv, rng, table


async def pmem_report(tb: DeviceTB, media_start: tuple[int, int]) -> dict:
    """The engine's PMEM lines per kind since PERF_CTRL was cleared (``docs/embedding.md``,
    "PMEM lines per kind") and the media bytes the PMEM model moved since it had done
    ``media_start`` (media reads, media writes): media blocks are a backend property."""
    stats, block = tb.pmem.stats, tb.pmem.timing.media_bytes
    return {
        "pmem_lines": {key: await tb.csr.read64(name) for key, name in PMEM_KIND_CSRS.items()},
        "pmem_media_bytes": {"read": (stats.media_reads - media_start[0]) * block,
                             "write": (stats.media_writes - media_start[1]) * block},
    }


async def _run_timed(tb: DeviceTB, drv: EngineDriver) -> int:
    """Ring the doorbell and return the cycles until the head reaches the tail
    (polled every 16 cycles)."""
    start = tb.loop.cycle
    await drv.ring()
    await drv.wait(timeout=5_000_000, poll=16)
    return tb.loop.cycle - start


@cocotb.test()
async def bench_gather(dut):
    """LOOKUP utilization: ``n_desc`` LOOKUPs of ``batch`` bags of exactly ``pooling``
    uniformly random rows each (dim ``dim`` fp32) in one doorbell, PMEM read latency
    120 cycles at one line per cycle peak, buffers and ring where ``scratch`` says.
    Utilization = table lines delivered per cycle from the doorbell to the last
    completion, divided by the PMEM peak."""
    p = env.params()
    pooling, batch, n_desc = int(p["pooling"]), int(p.get("batch", 128)), int(p["n_desc"])
    dim, rows = int(p.get("dim", 64)), int(p.get("rows", 20000))
    scratch = p.get("scratch", "device")
    tb, drv, rng, table = await _started(dut, f"bench_gather_p{pooling}", rows, dim, scratch)
    await tb.csr.write("PERF_CTRL", 1)
    for i in range(n_desc):
        await drv.lookup(table, _fixed_bags(rng, batch, pooling, rows, None), batch_id=i)
    lines_before = tb.pmem.stats.lines_read
    media_start = (tb.pmem.stats.media_reads, tb.pmem.stats.media_writes)
    wall = time.monotonic()
    cycles = await _run_timed(tb, drv)
    wall = time.monotonic() - wall
    gathered = await tb.csr.read64("ENG_LINES_GATHERED")
    expected = n_desc * batch * pooling * emb.lines_per_row(dim, FP32)
    assert gathered == expected, (gathered, expected)
    peak = BENCH_TIMING.peak_lines_per_cycle
    all_lines = tb.pmem.stats.lines_read - lines_before
    _write({
        "pooling": pooling, "batch": batch, "descriptors": n_desc, "dim": dim,
        "dtype": "fp32", "table_rows": rows, "lanes": tb.config.engine_lanes,
        "scratch": scratch,
        "pmem_read_latency": BENCH_TIMING.read_latency,
        "pmem_peak_lines_per_cycle": peak,
        "cycles": cycles, "table_lines": gathered,
        "utilization": round(gathered / (cycles * peak), 4),
        "all_read_lines": all_lines,
        "all_read_utilization": round(all_lines / (cycles * peak), 4),
        "descriptors_checked": drv.checked,
        "sim_cycles_per_second": round(cycles / wall),
        **await pmem_report(tb, media_start),
    })


@cocotb.test()
async def bench_update(dut):
    """UPDATE coalescing: one UPDATE of ``batch`` bags of exactly ``pooling`` rows with
    Zipf(``zipf``) indices (uniform without ``zipf``) over ``rows`` rows (dim ``dim``
    fp32). Saving = 1 - row
    writes to PMEM / counted row updates, as the completion record reports them."""
    p = env.params()
    pooling, batch = int(p.get("pooling", 20)), int(p.get("batch", 128))
    dim, rows = int(p.get("dim", 64)), int(p.get("rows", 20000))
    alpha = None if p.get("zipf") is None else float(p["zipf"])     # None: uniform
    tb, drv, rng, table = await _started(dut, "bench_update", rows, dim)
    bags = _fixed_bags(rng, batch, pooling, rows, alpha)
    grads = (rng.standard_normal((batch, dim)) * 0.01).astype(np.float32)
    exp = await drv.update(table, bags, grads)
    await tb.csr.write("PERF_CTRL", 1)
    media_start = (tb.pmem.stats.media_reads, tb.pmem.stats.media_writes)
    cycles = await _run_timed(tb, drv)
    rec = drv.record(exp.seq)
    ideal = emb.coalesce_stats(bags.indices, bags.offsets)
    lpr = emb.lines_per_row(dim, FP32)
    _write({
        "pooling": pooling, "batch": batch, "dim": dim, "table_rows": rows, "zipf_alpha": alpha,
        "acc_rows": tb.config.update_acc_rows,
        "updates": rec["updates"], "rows_written": rec["rows_written"],
        "distinct_rows": ideal.distinct_rows,
        "write_saving": round(1 - rec["rows_written"] / rec["updates"], 4),
        "write_saving_ideal": round(ideal.write_saving, 4),
        "cycles": cycles,
        "cycles_per_gradient_line": round(cycles / (rec["updates"] * lpr), 3),
        "bytes_per_row": lpr * LINE_BYTES,
        "eng_upd_distinct_rows": await tb.csr.read64("ENG_UPD_DISTINCT_ROWS"),
        "eng_upd_passes": await tb.csr.read64("ENG_UPD_PASSES"),
        **await pmem_report(tb, media_start),
    })
