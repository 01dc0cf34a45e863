"""cocotb benchmarks of coherence in the device (``make bench`` via ``sim/bench.py``):
what bias management buys the gather, and how fast a snapshot of GPU memory streams over
CXL.cache.

Both run the coherent bench of :mod:`tb.test_coherence` (GPU cache of device lines, GPU
home agent, coherence checker active) with no idle cycles or backpressure, PMEM timing
from the test parameters (``sim/bench.py`` gives the engine benchmark's: reads 120
cycles, writes 40, one line per cycle), and write their figures as JSON to the path in
the ``out`` parameter. Every LOOKUP is still checked bit for bit while it is measured.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import cocotb
import numpy as np

from hw.engine.descriptor import DescKind, Status
from sim import embedding as emb
from sim.embedding import FP32, LINE_BYTES
from tb import env
from tb.coherent_bench import (
    HDM_D,
    CohBench,
    CoherentDriver,
    align_page,
    gpu_addr,
    snapshot_bench,
)
from tb.engine_driver import Batch, EngineDriver, random_table


def _write(result: dict) -> None:
    out = Path(env.params()["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


class _TableBackdoor(CoherentDriver):
    """Descriptors and index buffers go through the GPU's cache (as in the tests);
    tables are written once through the PMEM backdoor (the host caches none of them)."""

    backdoor = False

    async def put(self, addr: int, data: bytes) -> None:
        if self.backdoor:
            await EngineDriver.put(self, addr, data)
        else:
            await super().put(addr, data)


@cocotb.test()
async def bench_gather_bias(dut):
    """The same LOOKUPs (``n_desc`` of ``batch`` bags of ``pooling`` uniform rows, dim
    ``dim`` fp32, ``rows`` rows) run twice in one doorbell each: once with the table's
    pages in host bias (every row line is a RdCurr to the host, answered by a MemRdFwd
    after ``host_latency`` cycles), once after flipping them to device bias. Descriptors
    and index buffers are written into the GPU's cache in both runs."""
    p = env.params()
    pooling, batch, n_desc = int(p["pooling"]), int(p["batch"]), int(p["n_desc"])
    dim, rows = int(p["dim"]), int(p["rows"])
    bench = CohBench(dut, "bench_gather_bias", noise=False)
    await bench.start(HDM_D)
    tb = bench.tb
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    pb = bench.cfg.page_bytes
    drv = _TableBackdoor(bench, ring_order=6, heap_end=bench.cfg.hdm_size)
    await drv.setup()
    first = align_page(drv, pb)
    drv.backdoor = True
    table = await drv.add_table(random_table(rng, rows, dim, FP32))
    drv.backdoor = False
    pages = align_page(drv, pb) - first
    mark = drv.heap.next
    lines = n_desc * batch * pooling * emb.lines_per_row(dim, FP32)
    runs = {}
    for bias in ("host", "device"):
        if bias == "device":
            flip_start = tb.loop.cycle
            await bench.flip(first, pages)
            flip_cycles = tb.loop.cycle - flip_start
        drv.heap.release(mark)
        before = {n: await tb.csr.read64(n) for n in ("COH_GRANTS_HOST", "COH_GRANTS_DEVICE")}
        for i in range(n_desc):
            idx = rng.integers(0, rows, batch * pooling).astype(np.int32)
            offsets = (np.arange(batch) * pooling).astype(np.int32)
            await drv.lookup(table, Batch(idx, offsets), batch_id=i)
        wall = time.monotonic()
        start = tb.loop.cycle
        await drv.ring()
        await drv.wait(timeout=5_000_000, poll=16)
        cycles = tb.loop.cycle - start
        wall = time.monotonic() - wall
        after = {n: await tb.csr.read64(n) for n in before}
        runs[bias] = {"cycles": cycles, "table_lines": lines,
                      "lines_per_cycle": round(lines / cycles, 4),
                      "grants_host": after["COH_GRANTS_HOST"] - before["COH_GRANTS_HOST"],
                      "grants_device": after["COH_GRANTS_DEVICE"] - before["COH_GRANTS_DEVICE"],
                      "sim_cycles_per_second": round(cycles / wall)}
        tb.log.info("%s bias: %s", bias, runs[bias])
    await bench.finish()
    _write({
        "pooling": pooling, "batch": batch, "descriptors": n_desc, "dim": dim,
        "table_rows": rows, "table_pages": pages, "page_bytes": pb,
        "host_latency": bench.cache.latency, "runs": runs,
        "flip_to_device_cycles": flip_cycles,
        "device_bias_gather_speedup": round(runs["host"]["cycles"] / runs["device"]["cycles"], 3),
        "coherence_checks": bench.checker.checks,
        "descriptors_checked": drv.checked,
    })


@cocotb.test()
async def bench_rdcurr(dut):
    """An MLP_CHECKPOINT of ``mlp_lines`` lines of GPU memory with COH_CTRL.MLP_SRC_HOST:
    the copier reads them with RdCurr (the GPU home answers after ``gpu_latency``
    cycles) and writes them into a PMEM slot. Utilization = lines / cycles from the
    first RdCurr to the last line's data, against the link's one line per cycle."""
    p = env.params()
    n_lines = int(p["mlp_lines"])
    bench, drv = await snapshot_bench(dut, "bench_rdcurr", noise=False,
                                      mlp_bytes=n_lines * LINE_BYTES,
                                      gpu_latency=int(p["gpu_latency"]))
    tb = bench.tb
    # The log and the MLP slots live in device bias (docs/dcoh.md): the copier's writes
    # then need no host round trip.
    pb = bench.cfg.page_bytes
    await bench.flip(0, -(-drv.heap.next // pb))
    gpu_base = gpu_addr(bench.cfg, 0x100000)
    params = tb.rng.randbytes(n_lines * LINE_BYTES)
    bench.gpu.write_bytes(gpu_base, params)
    await drv.plain(DescKind.COMMIT, batch_id=1)
    home = bench.gpu.home
    log_from = len(home.log)
    start = tb.loop.cycle
    wall = time.monotonic()
    exp = await drv.mlp_checkpoint_from_host(1, gpu_base, len(params), params)
    assert exp.status is Status.OK, exp
    await drv.run()
    await drv.wait_mlp(1, timeout=5_000_000)        # checks the slot against ``params``
    wall = time.monotonic() - wall
    total = tb.loop.cycle - start
    bench.checker.device_read_checked(n_lines)
    log = home.log[log_from:]
    first = min(t for t, ch, f in log if ch == "d2h_req")
    last = max(t for t, ch, f in log if ch == "h2d_data")
    await bench.finish()
    rd = bench.counters["COH_RD_LINES"]
    assert rd == n_lines, (rd, n_lines)
    _write({
        "lines": n_lines, "gpu_latency": int(p["gpu_latency"]),
        "cache_cqids": bench.cfg.cache_cqids,
        "stream_cycles": last - first + 1,
        "rdcurr_utilization": round(n_lines / (last - first + 1), 4),
        "copy_cycles_doorbell_to_valid_slot": total,
        "copy_lines_per_cycle": round(n_lines / total, 4),
        "coherence_checks": bench.checker.checks,
        "sim_cycles_per_second": round(total / wall),
    })
