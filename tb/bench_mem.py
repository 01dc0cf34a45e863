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

from sim.platform import get_platform
from tb import env
from tb.device_tb import DeviceTB
from tb.endpoint_rate import measure_endpoint
from tb.pmem import PmemTiming

#: The benchmarks' PMEM: the ``ideal-1ch`` platform (``docs/platform.md``): one channel
#: at one line per cycle for reads and writes, read latency 120 cycles, write latency
#: 40 cycles, responses in order of readiness (no jitter).
BENCH_PLATFORM = get_platform("ideal-1ch")
BENCH_TIMING = PmemTiming.from_platform(BENCH_PLATFORM)


def _write(result: dict) -> None:
    out = Path(env.params()["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


@cocotb.test()
async def bench_endpoint(dut):
    """Isolated-request latency and streaming utilization of reads and writes."""
    n = int(env.params().get("lines", 4096))
    tb = DeviceTB(dut, "bench_endpoint", timing=BENCH_TIMING, max_outstanding=1 << 15)
    await tb.start()
    fig = await measure_endpoint(tb, n)
    peak = BENCH_TIMING.peak_lines_per_cycle
    await tb.finish()
    _write({
        "config": tb.config.name,
        "pmem": {"read_latency": BENCH_TIMING.read_latency,
                 "write_latency": BENCH_TIMING.write_latency,
                 "peak_lines_per_cycle": peak, "channels": BENCH_TIMING.channels,
                 "own_read_latency_isolated": fig.pmem_read_latency,
                 "own_write_latency_isolated": fig.pmem_write_latency},
        "lines_per_stream": n,
        "read_utilization": round(fig.read_rate / peak, 4),
        "write_utilization": round(fig.write_rate / peak, 4),
        "added_read_latency_cycles": fig.added_read_latency,
        "added_write_latency_cycles": fig.added_write_latency,
        "responses_checked": tb.agent.checked,
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
