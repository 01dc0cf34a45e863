"""cocotb benchmarks of the CXL.mem path (``make bench`` via ``sim/bench.py``).

Each test writes its figures as JSON to the path in the ``out`` test parameter. No
figure is asserted here: benchmarks measure, tests check. The traffic still goes
through :class:`~tb.host_agent.HostAgent`, so every response is checked while measuring.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import cocotb

from tb import env
from tb.device_tb import DeviceTB
from tb.pmem import PmemTiming

#: The issue's measurement conditions: PMEM at one line per cycle peak, read latency
#: 120 cycles, write latency 40 cycles, responses in order of readiness (no jitter).
BENCH_TIMING = PmemTiming(read_latency=120, write_latency=40, peak_lines_per_cycle=1.0,
                          channels=1, jitter=0)


def _write(result: dict) -> None:
    out = Path(env.params()["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def _steady_rate(cycles: list[int]) -> float:
    """Lines per cycle between the 10th and 90th percentile completions (steady state:
    the pipeline fill at the start and the drain at the end are left out)."""
    cycles = sorted(cycles)
    lo, hi = len(cycles) // 10, (9 * len(cycles)) // 10
    return (hi - lo) / (cycles[hi] - cycles[lo])


@cocotb.test()
async def bench_endpoint(dut):
    """Isolated-request latency and streaming utilization of reads and writes."""
    p = env.params()
    n = int(p.get("lines", 4096))
    tb = DeviceTB(dut, "bench_endpoint", timing=BENCH_TIMING, max_outstanding=1 << 15)
    await tb.start()
    agent, stats = tb.agent, tb.pmem.stats
    peak = BENCH_TIMING.peak_lines_per_cycle

    # Isolated requests: the device is idle before each one.
    write = agent.write(agent.host_line(0), bytes(range(64)))
    await write
    added_write = (write.completed - write.accepted) - stats.write_latency[-1]
    read = agent.read(agent.host_line(0))
    await read
    added_read = (read.completed - read.accepted) - stats.read_latency[-1]
    pmem_read_latency, pmem_write_latency = stats.read_latency[-1], stats.write_latency[-1]

    # Streams of sequential lines, all queued at once so the host never limits them.
    writes = [agent.write(agent.host_line(i), i.to_bytes(4, "little") * 16) for i in range(n)]
    await agent.wait_all(writes, timeout=50 * n)
    reads = [agent.read(agent.host_line(i)) for i in range(n)]
    await agent.wait_all(reads, timeout=50 * n)

    write_util = _steady_rate([t.ndr_cycle for t in writes]) / peak
    read_util = _steady_rate([t.drs_cycle for t in reads]) / peak
    await tb.finish()
    _write({
        "config": tb.config.name,
        "pmem": {"read_latency": BENCH_TIMING.read_latency,
                 "write_latency": BENCH_TIMING.write_latency,
                 "peak_lines_per_cycle": peak, "channels": BENCH_TIMING.channels,
                 "own_read_latency_isolated": pmem_read_latency,
                 "own_write_latency_isolated": pmem_write_latency},
        "lines_per_stream": n,
        "read_utilization": round(read_util, 4),
        "write_utilization": round(write_util, 4),
        "added_read_latency_cycles": added_read,
        "added_write_latency_cycles": added_write,
        "responses_checked": agent.checked,
    })


@cocotb.test()
async def bench_sim_speed(dut):
    """Simulated cycles per wall-clock second under random mixed traffic with random
    idle cycles and backpressure on every channel (the regression's workload)."""
    p = env.params()
    n = int(p.get("n_txn", 3000))
    tb = DeviceTB(dut, "bench_sim_speed", idle=True, backpressure=True)
    await tb.start()
    start_cycle, start = tb.loop.cycle, time.perf_counter()
    await tb.agent.run_random(n, lines=4096)
    seconds = time.perf_counter() - start
    cycles = tb.loop.cycle - start_cycle
    await tb.finish()
    _write({"config": tb.config.name, "transactions": n, "cycles": cycles,
            "seconds": round(seconds, 2), "sim_cycles_per_second": round(cycles / seconds)})
