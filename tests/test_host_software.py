"""The host-software baseline's timing model (``sim/host_software.py``) against the
per-batch formulas of its documentation (``docs/platform.md``, "The host-software
baseline"), worked on a platform and CPU chosen so that every term is a round number,
and its monotonic properties."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim import embedding
from sim.dlrm import DLRM
from sim.host_software import DEFAULT_CPU, HostCpu, host_software_run
from sim.platform import Platform, get_platform
from sim.workloads import SyntheticClicks, get_workload

#: 1 GHz (1 ns per cycle); one channel reading 64 B/ns (one line per cycle) and writing
#: 32 B/ns; reads 100 ns, writes 200 ns.
ROUND = Platform(name="round", device_clock_hz=1e9, link_bytes_per_s=float("inf"),
                 link_one_way_ns=0.0, cxl_io_round_trip_ns=1.0, pmem_channels=1,
                 pmem_read_bytes_per_s=64e9, pmem_write_bytes_per_s=32e9,
                 pmem_read_latency_ns=100.0, pmem_write_latency_ns=200.0,
                 pmem_media_bytes=256, gpu_flops=1e12, gpu_launch_ns=10_000.0,
                 gpu_memory_latency_ns=300.0)
#: One core with two misses in flight; 10 ns per index and 1 ns per line; 100 ns per
#: parallel phase; PCIe at 64 B/ns after 50 ns per copy; 1 W while busy.
CPU = HostCpu(cores=1, misses_per_core=2, index_ns=10.0, line_ns=1.0, phase_ns=100.0,
              pcie_bytes_per_s=64e9, copy_ns=50.0, core_w=1.0)


def test_worked_example(seed):
    w = get_workload("tiny")                       # dim 16 fp32: one line per row
    run = host_software_run(w, seed, ROUND, CPU)
    data = SyntheticClicks(w, seed)
    gpu = DLRM(w, seed).gpu_cycles(w.batch)
    mlp = len(DLRM(w, seed).params_bytes())
    pooled = w.batch * w.num_tables * 16 * 4
    assert embedding.lines_per_row(w.dim, w.dtype) == 1
    assert len(run["batches"]) == w.batches
    busy = 0.0
    for b, rec in enumerate(run["batches"], start=1):
        sparse = data.batch(b - 1).sparse
        n = sum(len(i) for i, _ in sparse)
        d = sum(len(np.unique(i)) for i, _ in sparse)
        work = n * (10 + 1)                        # one core
        mem = max(d * 1.0, d * 100 / 2)            # bandwidth vs two misses in flight
        copy = 50 + pooled / 64
        want = {
            "lookup": 100 + max(mem, work) + 100 + copy,
            "gpu": gpu,
            "update": copy + 100 + work + (d * 64 / 32 + 200),
            "checkpoint": (2 * d * 64 / 32 + 200) + (64 / 32 + 200)
                          + ((50 + mlp / 64) + (mlp / 32 + 200) if b % 2 == 0 else 0),
        }
        for k, v in want.items():
            assert rec["phases"][k] == pytest.approx(v), (b, k)
        assert rec["cycles"] == pytest.approx(sum(want.values()))
        assert rec["pmem_read_bytes"] == d * 64
        assert rec["pmem_write_bytes"] == (3 * d + 1) * 64 + (mlp if b % 2 == 0 else 0)
        busy += (100 + max(mem, work) + 100) + (100 + work)     # the cores' two phases
    assert run["cycles_per_iteration"] == pytest.approx(
        sum(r["cycles"] for r in run["batches"]) / w.batches)
    e = run["energy_j"]
    assert e["cpu_active_j"] == pytest.approx(busy * 1e-9)     # 1 W for busy ns
    assert e["device_static_j"] == 0.0 and e["device_dynamic_j"] == 0.0
    assert e["total_j"] == pytest.approx(sum(v for k, v in e.items()
                                             if k not in ("total_j", "seconds")))


def test_more_cores_never_slower(seed):
    w = get_workload("default").with_overrides(batch=32, batches=2)
    p = get_platform("paper-like")
    times = [host_software_run(w, seed, p, dataclasses.replace(DEFAULT_CPU, cores=c))
             ["cycles"] for c in (1, 2, 4, 16, 64)]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]


def test_slow_writes_cost_the_checkpoint(seed):
    w = get_workload("tiny")
    fast = get_platform("ideal-1ch")
    slow = dataclasses.replace(fast, pmem_write_bytes_per_s=fast.pmem_read_bytes_per_s / 8)
    a = host_software_run(w, seed, fast)["phase_cycles_per_iteration"]
    b = host_software_run(w, seed, slow)["phase_cycles_per_iteration"]
    assert b["checkpoint"] > a["checkpoint"] and b["update"] > a["update"]
    assert b["lookup"] == a["lookup"] and b["gpu"] == a["gpu"]


@pytest.mark.parametrize("field, value", [("cores", 0), ("misses_per_core", 1.5),
                                          ("index_ns", 0.0), ("line_ns", -1.0),
                                          ("phase_ns", float("nan")), ("copy_ns", True),
                                          ("pcie_bytes_per_s", float("inf")),
                                          ("core_w", 0)])
def test_bad_cpu(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(DEFAULT_CPU, **{field: value})
