"""The CXL.mem path's latency and streaming rate, measured through the host agent.

One routine for the benchmark (``tb/bench_mem.py``, which reports the figures) and
the device test that fails when they regress (``tb/test_device.py``). Every response
is still checked by the host agent while measuring.
"""

from __future__ import annotations

from dataclasses import dataclass

from tb.device_tb import DeviceTB

__all__ = ["EndpointFigures", "measure_endpoint", "steady_rate"]


def steady_rate(cycles: list[int]) -> float:
    """Lines per cycle between the 10th and 90th percentile completions (steady state:
    the pipeline fill at the start and the drain at the end are left out)."""
    cycles = sorted(cycles)
    lo, hi = len(cycles) // 10, (9 * len(cycles)) // 10
    return (hi - lo) / (cycles[hi] - cycles[lo])


@dataclass(frozen=True)
class EndpointFigures:
    """Added latencies (cycles beyond PMEM's own AR -> R and W -> B of the same
    request) and steady-state rates (lines per cycle) of the host's CXL.mem path."""

    added_read_latency: int
    added_write_latency: int
    pmem_read_latency: int
    pmem_write_latency: int
    read_rate: float
    write_rate: float


async def measure_endpoint(tb: DeviceTB, lines: int) -> EndpointFigures:
    """An isolated write and read of one line (the device idle before each), then
    streams of ``lines`` sequential writes and reads, all queued at once so the host
    never limits them."""
    agent, stats = tb.agent, tb.pmem.stats
    write = agent.write(agent.host_line(0), bytes(range(64)))
    await write
    added_write = (write.completed - write.accepted) - stats.write_latency[-1]
    read = agent.read(agent.host_line(0))
    await read
    added_read = (read.completed - read.accepted) - stats.read_latency[-1]
    pmem_read, pmem_write = stats.read_latency[-1], stats.write_latency[-1]

    writes = [agent.write(agent.host_line(i), i.to_bytes(4, "little") * 16)
              for i in range(lines)]
    await agent.wait_all(writes, timeout=50 * lines)
    reads = [agent.read(agent.host_line(i)) for i in range(lines)]
    await agent.wait_all(reads, timeout=50 * lines)
    return EndpointFigures(
        added_read_latency=added_read, added_write_latency=added_write,
        pmem_read_latency=pmem_read, pmem_write_latency=pmem_write,
        read_rate=steady_rate([t.drs_cycle for t in reads]),
        write_rate=steady_rate([t.ndr_cycle for t in writes]))
