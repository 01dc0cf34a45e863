"""The ``host-software`` baseline: the kind of system the reference paper compares against.

PMEM is attached to the host; CPU threads gather and pool the embedding rows and apply
the updates in software; the pooled vectors go to the GPU and the gradients come back
over PCIe; every batch is made durable by a synchronous undo log (records written and
fenced before the rows change, then the rows, then the commit word) and every K
batches the MLP parameters are copied from the GPU and written to PMEM before training
goes on. It is a timing model, not RTL: it runs on the batches' real indices and the
platform's PMEM (``sim/platform.py``), with a parameterised CPU (:class:`HostCpu`)
whose constants are cited in ``docs/platform.md``. Its tables are the golden model's
(``sim.train.reference_train``), which the RTL runs are checked against bit for bit.

Per batch, in device cycles (``docs/platform.md``, "The host-software baseline"):

* **lookup**: one parallel phase (``phase_ns``) in which the cores read every distinct
  row once (repeats hit in the CPU's caches) and pool every index. Its time is the
  largest of: the PMEM read bandwidth for those lines, the memory-level parallelism
  bound ``lines x read latency / (cores x misses_per_core)``, and the CPU work
  ``indices x (index_ns + lines per row x line_ns) / cores``; plus one read latency.
  Then the pooled vectors are copied to the GPU (``copy_ns`` + bytes / PCIe bandwidth).
* **gpu**: the MLPs' step, as in the other modes (``DLRM.gpu_cycles``).
* **update**: the per-bag gradients copied back over PCIe; one parallel phase of CPU
  work ``indices x (index_ns + lines per row x line_ns) / cores``; the updated rows
  written to PMEM at its write bandwidth and fenced (one write latency).
* **checkpoint**: before the rows, the undo records (a header line and the old row per
  distinct row) written and fenced; after them, the commit word written and fenced;
  every K batches the MLP parameters copied from the GPU and written and fenced.

PMEM writes are charged at the media's write bandwidth for the bytes written (each
write is a whole 64-byte line; undo records and rows are contiguous, so 256-byte media
blocks fill), and each fence waits one write latency, which is when the last write of
the group is durable.

Energy (:func:`host_software_run`'s ``energy_j``): :func:`sim.energy.estimate` on the
run's events (PMEM media accesses, PCIe bytes at the link's energy per byte, the GPU's
FLOPs and static power, the pooled vectors and gradients staged once in GPU memory)
without the CXL device's static power (there is no device), plus the cores' active
power (``core_w``) while they work in the lookup and update phases. The host CPU's
idle power is left out here as in the other modes, where a host idles too.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields

import numpy as np

from . import embedding
from .dlrm import DLRM
from .platform import LINE_BYTES, Platform
from .workloads import SyntheticClicks, Workload

__all__ = ["DEFAULT_CPU", "HostCpu", "host_software_run"]


@dataclass(frozen=True, kw_only=True)
class HostCpu:
    """The host CPU's part of the model; every field is cited in ``docs/platform.md``.

    Parameters
    ----------
    cores:
        Cores running the embedding work in parallel.
    misses_per_core:
        Cache-line misses one core keeps in flight (line fill buffers).
    index_ns:
        Software cost per index of a bag (load the index, bounds check, address, loop).
    line_ns:
        Software cost per 64-byte line of a row pooled or updated (16 fp32 adds).
    phase_ns:
        Start and join of one parallel phase across the cores.
    pcie_bytes_per_s:
        Host <-> GPU copy bandwidth.
    copy_ns:
        Fixed cost of one host <-> GPU copy (DMA set-up and completion).
    core_w:
        Power of one busy core above the CPU's idle power.

    Raises
    ------
    ValueError
        A value that is not a finite positive number (``cores``, ``misses_per_core``:
        not a positive integer).
    """

    cores: int
    misses_per_core: int
    index_ns: float
    line_ns: float
    phase_ns: float
    pcie_bytes_per_s: float
    copy_ns: float
    core_w: float

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("cores", "misses_per_core"):
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(f"{f.name} must be a positive integer, not {v!r}")
            elif (isinstance(v, bool) or not isinstance(v, int | float)
                    or not math.isfinite(v) or v <= 0):
                raise ValueError(f"{f.name} must be a finite positive number, not {v!r}")


#: PCIe 4.0 x16 to the GPU: 16 lanes x 16 GT/s x 128/130 / 8 bytes, times the 0.8 that
#: DMA transfers reach after packet headers (``docs/platform.md``).
_PCIE4_X16 = 16 * 16e9 * 128 / 130 / 8 * 0.8

#: The host CPU of ``docs/platform.md``.
DEFAULT_CPU = HostCpu(cores=16, misses_per_core=12, index_ns=4.0, line_ns=0.4,
                      phase_ns=2000.0, pcie_bytes_per_s=_PCIE4_X16, copy_ns=1000.0,
                      core_w=(150.0 - 40.0) / 16)


def host_software_run(workload: Workload, seed: int, platform: Platform,
                      cpu: HostCpu = DEFAULT_CPU) -> dict:
    """Per-batch phase cycles and traffic of the ``host-software`` baseline training
    ``workload`` (its ``batches`` batches of :class:`SyntheticClicks` with ``seed``) on
    ``platform``; a dict shaped like the RTL modes' summaries (``sim.train.summarize``)
    plus ``batches`` (one record per batch) and ``energy_j``."""
    from .energy import EnergyEvents, estimate

    p, w = platform, workload
    clock = p.device_clock_hz

    def cyc(ns: float) -> float:
        return ns * clock / 1e9

    read_bw = p.pmem_channels * p.pmem_read_bytes_per_s          # bytes per second
    write_bw = p.pmem_channels * p.pmem_write_bytes_per_s
    lpr = embedding.lines_per_row(w.dim, w.dtype)
    vec_bytes = w.dim * 4             # a pooled vector or a bag's gradient, fp32
    model = DLRM(w, seed)
    gpu = model.gpu_cycles(w.batch)
    mlp_bytes = len(model.params_bytes())
    data = SyntheticClicks(w, seed)
    media_per_row = math.ceil(lpr * LINE_BYTES / p.pmem_media_bytes)

    def copy(nbytes: int) -> float:
        return cyc(cpu.copy_ns) + nbytes / cpu.pcie_bytes_per_s * clock

    def write(nbytes: int) -> float:
        """Write ``nbytes`` to PMEM and fence: bandwidth time plus one write latency."""
        return nbytes / write_bw * clock + p.pmem_write_cycles

    pooled = w.batch * w.num_tables * vec_bytes       # also the bytes of the gradients
    records = []
    for b in range(1, w.batches + 1):
        batch = data.batch(b - 1)
        n_idx = sum(len(idx) for idx, _ in batch.sparse)
        distinct = sum(len(np.unique(idx)) for idx, _ in batch.sparse)
        lines = distinct * lpr
        cpu_work = cyc(n_idx * (cpu.index_ns + lpr * cpu.line_ns)) / cpu.cores
        mem = max(lines * LINE_BYTES / read_bw * clock,
                  lines * p.pmem_read_cycles / (cpu.cores * cpu.misses_per_core))
        # The cores' two parallel phases (what the energy charges them for).
        gather = cyc(cpu.phase_ns) + max(mem, cpu_work) + p.pmem_read_cycles
        apply = cyc(cpu.phase_ns) + cpu_work
        lookup = gather + copy(pooled)
        undo = write(distinct * (1 + lpr) * LINE_BYTES)
        update = copy(pooled) + apply + write(lines * LINE_BYTES)
        commit = write(LINE_BYTES)
        mlp_copied = mlp_bytes if b % w.mlp_ckpt_every == 0 else 0
        mlp = copy(mlp_copied) + write(mlp_copied) if mlp_copied else 0.0
        phases = {"lookup": lookup, "gpu": float(gpu), "update": update,
                  "checkpoint": undo + commit + mlp}
        written = (distinct * (1 + lpr) + lines + 1) * LINE_BYTES + mlp_copied
        records.append({
            "batch": b, "phases": phases, "cycles": sum(phases.values()),
            "pmem_read_bytes": lines * LINE_BYTES,
            "pmem_write_bytes": written,
            "pmem_media_reads": distinct * media_per_row,
            "pmem_media_writes": math.ceil(written / p.pmem_media_bytes),
            "pcie_bytes": 2 * pooled + mlp_copied,     # pooled vectors, gradients, MLP
            "cpu_busy_core_cycles": cpu.cores * (gather + apply),
            "gpu_flops": model.flops_per_batch(w.batch),
        })
    n = len(records)
    total = sum(r["cycles"] for r in records)
    events = EnergyEvents(
        cycles=math.ceil(total),
        pmem_read_lines=sum(r["pmem_read_bytes"] for r in records) // LINE_BYTES,
        pmem_write_lines=sum(r["pmem_write_bytes"] for r in records) // LINE_BYTES,
        pmem_media_reads=sum(r["pmem_media_reads"] for r in records),
        pmem_media_writes=sum(r["pmem_media_writes"] for r in records),
        link_bytes=sum(r["pcie_bytes"] for r in records),
        gpu_flops=sum(r["gpu_flops"] for r in records), gpu_busy_cycles=gpu * n,
        hbm_bytes=sum(r["pcie_bytes"] for r in records))
    report = dataclasses.replace(estimate(events, clock_hz=clock), device_static_j=0.0)
    cpu_j = sum(r["cpu_busy_core_cycles"] for r in records) / clock * cpu.core_w
    return {
        "iterations": n,
        "cycles": sum(r["cycles"] for r in records),
        "cycles_per_iteration": sum(r["cycles"] for r in records) / n,
        "phase_cycles_per_iteration": {k: sum(r["phases"][k] for r in records) / n
                                       for k in records[0]["phases"]},
        "pmem_read_bytes": sum(r["pmem_read_bytes"] for r in records),
        "pmem_write_bytes": sum(r["pmem_write_bytes"] for r in records),
        "pmem_media_reads": events.pmem_media_reads,
        "pmem_media_writes": events.pmem_media_writes,
        "pcie_bytes": sum(r["pcie_bytes"] for r in records),
        "cpu": {f.name: getattr(cpu, f.name) for f in fields(cpu)},
        "energy_j": {**report.as_dict(), "cpu_active_j": cpu_j,
                     "total_j": report.total_j + cpu_j},
        "batches": records,
    }
