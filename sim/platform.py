"""Named platforms: the machine a training run is simulated on.

A :class:`Platform` fixes everything outside the device's RTL that the cycle counts
depend on: the device clock, the CXL link between the GPU/host and the device (per
direction), the CXL.io round trip of a doorbell or CSR poll, the PMEM media behind the
device (channels, read and write bandwidth each separately, latencies as seen inside
the device, media access size) and the GPU (throughput and launch overhead). Every
constant of every named platform is cited in ``docs/platform.md``, with how it maps to
cycles; this module holds the numbers once and converts them.

Named platforms (:data:`PLATFORMS`):

* ``ideal-1ch``: the model the earlier figures were measured on (one PMEM channel at
  one line per cycle, writes as fast as reads, no link), kept so they can be
  reproduced;
* ``paper-like``: the reference paper's kind of device (four PMEM channels emulated
  from DRAM at 0.6x its read and 0.1x its write bandwidth, 3x its read and 7x its write
  latency) behind a CXL x16 link;
* ``optane-6ch``: six Optane DC persistent memory channels, as measured on a real
  server, behind the same link.

No simulator import: the golden models, the reports and the test benches share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

__all__ = ["DEFAULT_PLATFORM", "LINE_BYTES", "PLATFORMS", "Platform", "get_platform",
           "platform_arg"]

#: Bytes of one CXL line, the unit of every data path of the device.
LINE_BYTES = 64


@dataclass(frozen=True, kw_only=True)
class Platform:
    """Timing of everything around the device; every field is cited in
    ``docs/platform.md``.

    Parameters
    ----------
    name:
        Platform name (a key of :data:`PLATFORMS` for the named ones).
    device_clock_hz:
        Clock of the device's RTL; every cycle count refers to it.
    link_bytes_per_s:
        CXL link bandwidth per direction (``math.inf``: no link).
    link_one_way_ns:
        Flight time of a message across the link, one way (0: no link).
    cxl_io_round_trip_ns:
        A CSR read or doorbell write from the host and its completion over CXL.io.
    pmem_channels:
        Media channels of the device's PMEM, interleaved on ``pmem_media_bytes``.
    pmem_read_bytes_per_s, pmem_write_bytes_per_s:
        Media bandwidth *per channel*, reads and writes each.
    pmem_read_latency_ns, pmem_write_latency_ns:
        Media latency as seen by the device's PMEM port (read: request to data; write:
        last data beat to the durable response).
    pmem_media_bytes:
        Media access granularity (a smaller access costs a whole one).
    gpu_flops:
        Effective fp32 throughput of the GPU on the workload's MLPs.
    gpu_launch_ns:
        Fixed GPU cost per training step (launch and synchronisation).
    gpu_memory_latency_ns:
        The GPU's home agent answering a device's CXL.cache read of GPU memory: request
        received to data sent (the link's flight comes on top).

    Raises
    ------
    ValueError
        If a value is out of range, naming it.
    """

    name: str
    device_clock_hz: float
    link_bytes_per_s: float
    link_one_way_ns: float
    cxl_io_round_trip_ns: float
    pmem_channels: int
    pmem_read_bytes_per_s: float
    pmem_write_bytes_per_s: float
    pmem_read_latency_ns: float
    pmem_write_latency_ns: float
    pmem_media_bytes: int
    gpu_flops: float
    gpu_launch_ns: float
    gpu_memory_latency_ns: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, not {self.name!r}")
        for f in fields(self):
            if f.name == "name":
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{f.name} must be a number, not {value!r}")
            may_be_zero = f.name == "link_one_way_ns"      # 0: no link
            if math.isnan(value) or value < 0 or (value == 0 and not may_be_zero):
                need = "non-negative" if may_be_zero else "positive"
                raise ValueError(f"{f.name} must be {need}, not {value!r}")
            if math.isinf(value) and f.name != "link_bytes_per_s":   # inf: no link
                raise ValueError(f"{f.name} must be finite, not {value!r}")
        if not isinstance(self.pmem_channels, int):
            raise ValueError(f"pmem_channels must be an integer, not {self.pmem_channels!r}")
        mb = self.pmem_media_bytes
        if not isinstance(mb, int) or mb < LINE_BYTES or mb > 4096 or mb & (mb - 1):
            raise ValueError(f"pmem_media_bytes must be a power of two from 64 to 4096, "
                             f"not {mb!r}")
        if self.pmem_write_bytes_per_s > self.pmem_read_bytes_per_s:
            raise ValueError(f"pmem_write_bytes_per_s ({self.pmem_write_bytes_per_s:g}) "
                             f"above pmem_read_bytes_per_s ({self.pmem_read_bytes_per_s:g}) "
                             "is not a persistent medium")

    # --- conversions to device cycles ------------------------------------------------
    @property
    def ns_per_cycle(self) -> float:
        return 1e9 / self.device_clock_hz

    def cycles(self, ns: float) -> int:
        """``ns`` nanoseconds as whole device cycles, rounded up."""
        return math.ceil(ns * self.device_clock_hz / 1e9 - 1e-9)

    def lines_per_cycle(self, bytes_per_s: float) -> float:
        """A bandwidth as 64-byte lines per device cycle."""
        return bytes_per_s / (LINE_BYTES * self.device_clock_hz)

    @property
    def link_lines_per_cycle(self) -> float:
        """Link bandwidth per direction in lines per cycle (``inf``: no link)."""
        return self.lines_per_cycle(self.link_bytes_per_s)

    @property
    def link_cycles(self) -> int:
        """One-way link flight time in cycles."""
        return self.cycles(self.link_one_way_ns)

    @property
    def cxl_io_cycles(self) -> int:
        return self.cycles(self.cxl_io_round_trip_ns)

    @property
    def pmem_read_lines_per_cycle(self) -> float:
        """Aggregate media read bandwidth (every channel) in lines per cycle."""
        return self.lines_per_cycle(self.pmem_channels * self.pmem_read_bytes_per_s)

    @property
    def pmem_write_lines_per_cycle(self) -> float:
        return self.lines_per_cycle(self.pmem_channels * self.pmem_write_bytes_per_s)

    @property
    def pmem_read_cycles(self) -> int:
        return self.cycles(self.pmem_read_latency_ns)

    @property
    def pmem_write_cycles(self) -> int:
        return self.cycles(self.pmem_write_latency_ns)

    @property
    def gpu_flops_per_cycle(self) -> float:
        return self.gpu_flops / self.device_clock_hz

    @property
    def gpu_launch_cycles(self) -> int:
        return self.cycles(self.gpu_launch_ns)

    @property
    def gpu_memory_cycles(self) -> int:
        return self.cycles(self.gpu_memory_latency_ns)

    def summary(self) -> dict:
        """Every constant and its value in device cycles, for reports."""
        return {
            "name": self.name,
            "constants": {f.name: getattr(self, f.name) for f in fields(self)
                          if f.name != "name"},
            "cycles": {
                "ns_per_cycle": self.ns_per_cycle,
                "link_lines_per_cycle": self.link_lines_per_cycle,
                "link_one_way": self.link_cycles,
                "cxl_io_round_trip": self.cxl_io_cycles,
                "pmem_read_lines_per_cycle": self.pmem_read_lines_per_cycle,
                "pmem_write_lines_per_cycle": self.pmem_write_lines_per_cycle,
                "pmem_read_latency": self.pmem_read_cycles,
                "pmem_write_latency": self.pmem_write_cycles,
                "gpu_flops_per_cycle": self.gpu_flops_per_cycle,
                "gpu_launch": self.gpu_launch_cycles,
                "gpu_memory_latency": self.gpu_memory_cycles,
            },
        }


GB = 1e9
#: The device clock of every named platform (``docs/platform.md``).
_DEVICE_CLOCK_HZ = 250e6
#: GPU: effective fp32 throughput on small-batch DLRM MLPs and the fixed cost of one
#: training step (``docs/platform.md``, ``docs/training.md``).
_GPU_FLOPS = 1e12
_GPU_LAUNCH_NS = 10_000.0
#: GPU memory as a CXL.cache read of it sees it at the GPU (``docs/platform.md``).
_GPU_MEMORY_LATENCY_NS = 300.0
#: CXL x16 at 32 GT/s (PCIe 5.0 electricals): 16 lanes x 32 Gbit/s x 128/130 per
#: direction (``docs/platform.md``).
_X16_GEN5 = 16 * 32e9 / 8 * 128 / 130
#: DDR4-3200 channel peak (8 bytes x 3,200 MT/s) and a device-side DRAM access latency:
#: the reference the paper-like PMEM is emulated from (``docs/platform.md``).
_DRAM_CHANNEL = 25.6 * GB
_DRAM_LATENCY_NS = 80.0

PLATFORMS: dict[str, Platform] = {p.name: p for p in (
    Platform(
        name="ideal-1ch", device_clock_hz=_DEVICE_CLOCK_HZ,
        link_bytes_per_s=math.inf, link_one_way_ns=0.0, cxl_io_round_trip_ns=4.0,
        pmem_channels=1, pmem_read_bytes_per_s=16 * GB, pmem_write_bytes_per_s=16 * GB,
        pmem_read_latency_ns=480.0, pmem_write_latency_ns=160.0, pmem_media_bytes=256,
        gpu_flops=_GPU_FLOPS, gpu_launch_ns=_GPU_LAUNCH_NS,
        gpu_memory_latency_ns=_GPU_MEMORY_LATENCY_NS),
    Platform(
        name="paper-like", device_clock_hz=_DEVICE_CLOCK_HZ,
        link_bytes_per_s=_X16_GEN5, link_one_way_ns=100.0, cxl_io_round_trip_ns=800.0,
        pmem_channels=4, pmem_read_bytes_per_s=0.6 * _DRAM_CHANNEL,
        pmem_write_bytes_per_s=0.1 * _DRAM_CHANNEL,
        pmem_read_latency_ns=3 * _DRAM_LATENCY_NS, pmem_write_latency_ns=7 * _DRAM_LATENCY_NS,
        pmem_media_bytes=256, gpu_flops=_GPU_FLOPS, gpu_launch_ns=_GPU_LAUNCH_NS,
        gpu_memory_latency_ns=_GPU_MEMORY_LATENCY_NS),
    Platform(
        name="optane-6ch", device_clock_hz=_DEVICE_CLOCK_HZ,
        link_bytes_per_s=_X16_GEN5, link_one_way_ns=100.0, cxl_io_round_trip_ns=800.0,
        pmem_channels=6, pmem_read_bytes_per_s=39.4 * GB / 6,
        pmem_write_bytes_per_s=13.9 * GB / 6,
        pmem_read_latency_ns=305.0, pmem_write_latency_ns=90.0, pmem_media_bytes=256,
        gpu_flops=_GPU_FLOPS, gpu_launch_ns=_GPU_LAUNCH_NS,
        gpu_memory_latency_ns=_GPU_MEMORY_LATENCY_NS),
)}


#: The platform of the training flow and ``make sim`` (``--platform`` / ``PLATFORM=``
#: choose another; the system benchmark's is ``sim.bench.SYSTEM_PLATFORM``, the block
#: benchmarks keep ``ideal-1ch``). Every platform shares the device clock and the GPU
#: constants, so the GPU's modelled time does not depend on this choice.
DEFAULT_PLATFORM = "paper-like"


def get_platform(name: str) -> Platform:
    """The platform ``name``: a key of :data:`PLATFORMS`, or a named platform with
    fields changed, ``"<base>:<field>=<value>,<field>=<value>..."`` (for example
    ``"paper-like:pmem_channels=2,link_bytes_per_s=16e9"``: what ``make sweep`` varies).
    The derived platform is called ``name`` and validated like any other.

    Raises
    ------
    ValueError
        An unknown base (the message lists the names), a field that does not exist or
        is ``name``, a value that is not a number, or a value the platform rejects.
    """
    base_name, _, changes = name.partition(":")
    try:
        base = PLATFORMS[base_name]
    except KeyError:
        raise ValueError(f"platform {base_name!r} not found (platforms: "
                         f"{', '.join(sorted(PLATFORMS))})") from None
    if not changes:
        return base
    known = {f.name: f.type for f in fields(Platform) if f.name != "name"}
    values = {}
    for item in changes.split(","):
        key, eq, text = item.partition("=")
        if key not in known or not eq:
            raise ValueError(f"platform {name!r}: {item!r} is not <field>=<value> with a "
                             f"field of {', '.join(known)}")
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"platform {name!r}: {key} must be a number, not {text!r}") from None
        values[key] = int(value) if known[key] in (int, "int") and value.is_integer() else value
    return replace(base, name=name, **values)


def platform_arg(name: str) -> str:
    """An ``argparse`` type: ``name`` if :func:`get_platform` accepts it."""
    import argparse

    try:
        get_platform(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name
