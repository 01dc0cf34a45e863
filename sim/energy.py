"""Energy estimate of a training run from the event counts a simulation produces.

The estimate is a sum of per-event energies and static powers integrated over the run:

    E = sum_k  count_k * e_k                      (dynamic terms, picojoules per event)
      + (cycles / clock_hz) * sum_j P_j           (static terms, watts)

:class:`EnergyEvents` holds the counts (cycles, PMEM lines and 256-byte media accesses,
link bytes, GPU FLOPs and busy cycles, GPU HBM bytes, device fp32 operations and SRAM
line accesses); :class:`EnergyConstants` holds one value per event or static power, each
tagged with the keys of :data:`SOURCES` it comes from; :func:`estimate` returns an
:class:`EnergyReport` with one term per component; :func:`saving` compares two reports
(``docs/architecture.md``, "Training flow": TrainingCXL mode against the PMEM baseline on
the same workload).

Choices (derivations and citations in ``docs/energy.md``):

* PMEM dynamic energy is charged per 256-byte media access by default
  (``pmem_basis="media"``), as the PMEM model charges media time (docs/pmem-model.md):
  a random 64-byte read costs a whole access. ``pmem_basis="line"`` charges per 64-byte
  line delivered instead, a lower bound that assumes every access is fully used.
* Per-access PMEM energies come from a module's power budget above its static power
  divided by its measured saturated bandwidth, so they include the on-DIMM controller's
  dynamic share, not only the media.
* The GPU draws its static power for the whole run, busy or waiting; above that, each
  FLOP costs ``(TDP - static) / effective throughput``: at the repository's modelled
  1 TFLOP/s (sim/workloads.py) the GPU draws its full TDP while busy. ``gpu_busy_cycles``
  is checked and carried for reports; its energy is in the FLOP term.
* Static powers of the PMEM modules, the GPU and the device apply in both modes for the
  whole run (the baseline runs on the same device with the engines idle).

Every count must be a non-negative integer; :class:`EnergyEvents` and :func:`estimate`
raise :class:`ValueError` naming the bad field otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from .workloads import DEVICE_CLOCK_HZ

__all__ = [
    "DEFAULT",
    "PMEM_BASES",
    "SOURCES",
    "EnergyConstants",
    "EnergyEvents",
    "EnergyReport",
    "estimate",
    "saving",
]

#: Citation of every source key an :class:`EnergyConstants` field names. Keys starting
#: with ``assume-`` are this project's stated assumptions, not measurements.
SOURCES: dict[str, str] = {
    "optane-brief": (
        "Intel Corporation, 'Intel Optane DC Persistent Memory' product brief, 2019: "
        "modules of 128, 256 and 512 GB with a power budget of 12-18 W per module."),
    "izraelevitz2019": (
        "J. Izraelevitz, J. Yang, L. Zhang, J. Kim, X. Liu, A. Memaripour, Y. J. Soh, "
        "Z. Wang, Y. Xu, S. R. Dulloor, J. Zhao, S. Swanson, 'Basic Performance "
        "Measurements of the Intel Optane DC Persistent Memory Module', arXiv:1903.05714, "
        "2019, bandwidth section: six interleaved modules reach 39.4 GB/s read and "
        "13.9 GB/s write at most; accesses merge into 256-byte media accesses."),
    "yang2020": (
        "J. Yang, J. Kim, M. Hoseinzadeh, J. Izraelevitz, S. Swanson, 'An Empirical Guide "
        "to the Behavior and Use of Scalable Persistent Memory', USENIX FAST 2020, "
        "pp. 169-182, section 2 (device architecture): the media is accessed in 256-byte "
        "XPLines; smaller writes are combined in the on-DIMM XPBuffer or amplified."),
    "a100-datasheet": (
        "NVIDIA Corporation, 'NVIDIA A100 Tensor Core GPU' datasheet, 2020 (specifications "
        "table): 19.5 TFLOP/s peak FP32, maximum TDP 400 W (SXM4)."),
    "horowitz2014": (
        "M. Horowitz, 'Computing's energy problem (and what we can do about it)', "
        "ISSCC 2014 Digest of Technical Papers, pp. 10-14, energy table (45 nm, 0.9 V): "
        "fp32 add 0.9 pJ, fp32 multiply 3.7 pJ, 64-bit access to an 8 KB SRAM 10 pJ."),
    "oconnor2017": (
        "M. O'Connor, N. Chatterjee, D. Lee, J. Wilson, A. Agrawal, S. W. Keckler, "
        "W. J. Dally, 'Fine-Grained DRAM: Energy-Efficient DRAM for Extreme Bandwidth "
        "Systems', MICRO-50, 2017, doi:10.1145/3123939.3124545, section 2 (HBM2 energy "
        "per bit); the value used here is rounded to 4 pJ/bit, see docs/energy.md."),
    "repo-gpu-model": (
        "This repository, sim/workloads.py: GPU_FLOPS = 1 TFLOP/s effective fp32 on "
        "small-batch DLRM MLPs (about 5 % of the A100 peak), DEVICE_CLOCK_HZ = 250 MHz."),
    "repo-pmem-model": (
        "This repository, docs/pmem-model.md: PmemTiming defaults peak_lines_per_cycle = 1 "
        "(64 B per cycle, 16 GB/s at 250 MHz) and media_bytes = 256."),
    "assume-pmem-static": (
        "Project assumption: one third (5 W) of a module's 15 W budget is drawn whatever "
        "the traffic (controller, on-DIMM buffers, I/O); not a published measurement."),
    "assume-link": (
        "Project assumption: 5 pJ/bit for a PCIe 5.0 / CXL x16 link (both ends' PHY and "
        "controller), the order of magnitude quoted for 32 GT/s long-reach SerDes; no "
        "single publication is relied on."),
    "assume-gpu-static": (
        "Project assumption: 50 W drawn by an A100 with no kernel running (the datasheet "
        "gives no idle power)."),
    "assume-device-static": (
        "Project assumption: 5 W of static and clock power for the CXL controller, its "
        "PHY idle power and the engines, whether or not they work."),
}


def _const(value: float, unit: str, *sources: str) -> Any:
    return field(default=value, metadata={"unit": unit, "sources": sources})


@dataclass(frozen=True, kw_only=True)
class EnergyConstants:
    """Energy per event (picojoules) and static power (watts) of every modelled part.

    Each field's metadata holds its ``unit`` and the ``sources`` keys of :data:`SOURCES`
    it is derived from; ``docs/energy.md`` shows every derivation. All fields are
    keyword-only and validated on creation.

    Raises
    ------
    ValueError
        A field that is not finite and positive (``pmem_modules``: not an integer >= 1).
    """

    #: Media read of 64 B, a quarter of a 256-B access (izraelevitz2019, optane-brief).
    pmem_read_pj_per_line: float = _const(
        97_450.0, "pJ/line", "optane-brief", "izraelevitz2019", "assume-pmem-static")
    #: Media write of 64 B, a quarter of a 256-B access.
    pmem_write_pj_per_line: float = _const(
        276_250.0, "pJ/line", "optane-brief", "izraelevitz2019", "assume-pmem-static")
    #: One 256-B media read: 10 W / (6.57 GB/s / 256 B) (izraelevitz2019, yang2020).
    pmem_read_pj_per_access: float = _const(
        389_800.0, "pJ/access", "optane-brief", "izraelevitz2019", "yang2020",
        "assume-pmem-static")
    #: One 256-B media write: 10 W / (2.32 GB/s / 256 B).
    pmem_write_pj_per_access: float = _const(
        1_105_000.0, "pJ/access", "optane-brief", "izraelevitz2019", "yang2020",
        "assume-pmem-static")
    #: Static power of one PMEM module (assume-pmem-static, optane-brief).
    pmem_static_w_per_module: float = _const(
        5.0, "W/module", "optane-brief", "assume-pmem-static")
    #: Modules needed for the simulated PMEM's 16 GB/s: ceil(16 / 6.57) (repo-pmem-model).
    pmem_modules: int = _const(3, "modules", "repo-pmem-model", "izraelevitz2019")
    #: Either direction over the CXL link, both ends (assume-link).
    link_pj_per_byte: float = _const(40.0, "pJ/B", "assume-link")
    #: (400 W - 50 W) / 1 TFLOP/s effective (a100-datasheet, repo-gpu-model).
    gpu_pj_per_flop: float = _const(
        350.0, "pJ/FLOP", "a100-datasheet", "repo-gpu-model", "assume-gpu-static")
    #: GPU power with no kernel running, charged for the whole run (assume-gpu-static).
    gpu_static_w: float = _const(50.0, "W", "assume-gpu-static")
    #: HBM traffic of the baseline's GPU-side pooling and updates, 4 pJ/bit (oconnor2017).
    hbm_pj_per_byte: float = _const(32.0, "pJ/B", "oconnor2017")
    #: fp32 add in the device engines, 45 nm (horowitz2014).
    device_fp_add_pj: float = _const(0.9, "pJ/op", "horowitz2014")
    #: fp32 multiply in the device engines, 45 nm (horowitz2014).
    device_fp_mul_pj: float = _const(3.7, "pJ/op", "horowitz2014")
    #: 64-B line in on-chip SRAM: 8 x 64-bit accesses to an 8 KB array (horowitz2014).
    device_sram_pj_per_line: float = _const(80.0, "pJ/line", "horowitz2014")
    #: Device static power, charged for the whole run (assume-device-static).
    device_static_w: float = _const(5.0, "W", "assume-device-static")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "pmem_modules":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"pmem_modules must be an integer >= 1, not {value!r}")
            elif (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{f.name} must be finite and positive, not {value!r}")


#: The constants documented in docs/energy.md.
DEFAULT = EnergyConstants()

#: How PMEM dynamic energy is charged: per 256-byte media access or per 64-byte line.
PMEM_BASES = ("media", "line")


def _check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer count, not {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, not {value}")


@dataclass
class EnergyEvents:
    """Event counts of one simulated run (all non-negative integers, default 0).

    Members
    -------
    cycles:
        Device clock cycles of the run; static powers are charged over them.
    pmem_read_lines, pmem_write_lines:
        64-byte lines read from / made durable in PMEM.
    pmem_media_reads, pmem_media_writes:
        256-byte media accesses (PMEM model ``media_accesses`` split by direction;
        buffer hits excluded).
    link_bytes:
        Bytes crossing the CXL link, both directions summed, flit overhead included.
    gpu_flops:
        FLOPs the GPU executes (MLPs in both modes; pooling and updates in the baseline).
    gpu_busy_cycles:
        Device cycles the GPU is busy (at most ``cycles``); reported, not charged.
    hbm_bytes:
        GPU HBM bytes beyond the MLPs' own traffic (baseline pooling, updates, undo
        records); the MLPs' memory energy is inside ``gpu_pj_per_flop``.
    device_fp_adds, device_fp_muls:
        fp32 additions and multiplications in the device engines.
    device_sram_lines:
        64-byte line accesses to on-chip SRAM (reorder buffer, caches, queues).

    Raises
    ------
    ValueError
        A count that is negative or not an integer, or ``gpu_busy_cycles > cycles``.
    """

    cycles: int = 0
    pmem_read_lines: int = 0
    pmem_write_lines: int = 0
    pmem_media_reads: int = 0
    pmem_media_writes: int = 0
    link_bytes: int = 0
    gpu_flops: int = 0
    gpu_busy_cycles: int = 0
    hbm_bytes: int = 0
    device_fp_adds: int = 0
    device_fp_muls: int = 0
    device_sram_lines: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every count again (the dataclass is mutable)."""
        for f in fields(self):
            _check_count(f.name, getattr(self, f.name))
        if self.gpu_busy_cycles > self.cycles:
            raise ValueError(f"gpu_busy_cycles ({self.gpu_busy_cycles}) must not exceed "
                             f"cycles ({self.cycles})")

    def __add__(self, other: EnergyEvents) -> EnergyEvents:
        if not isinstance(other, EnergyEvents):
            return NotImplemented
        return EnergyEvents(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                               for f in fields(self)})

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, counts: dict[str, int]) -> EnergyEvents:
        """Counts by field name; missing ones are 0, unknown names raise ValueError."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(counts) - names)
        if unknown:
            raise ValueError(f"unknown event names {unknown}")
        return cls(**counts)


@dataclass(frozen=True)
class EnergyReport:
    """Energy of one run in joules, by component, and the run's length in seconds."""

    seconds: float
    pmem_dynamic_j: float
    pmem_static_j: float
    link_j: float
    gpu_dynamic_j: float
    gpu_static_j: float
    hbm_j: float
    device_dynamic_j: float
    device_static_j: float

    @property
    def total_j(self) -> float:
        return (self.pmem_dynamic_j + self.pmem_static_j + self.link_j + self.gpu_dynamic_j
                + self.gpu_static_j + self.hbm_j + self.device_dynamic_j
                + self.device_static_j)

    def as_dict(self) -> dict[str, float]:
        """Every field plus ``total_j``."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["total_j"] = self.total_j
        return d


_PJ = 1e-12


def estimate(events: EnergyEvents, constants: EnergyConstants = DEFAULT,
             clock_hz: float = DEVICE_CLOCK_HZ, *,
             pmem_basis: Literal["media", "line"] = "media") -> EnergyReport:
    """Energy of a run with ``events`` under ``constants`` (module docstring).

    Raises
    ------
    ValueError
        Invalid counts, ``clock_hz`` not finite and positive, or ``pmem_basis`` not one
        of :data:`PMEM_BASES`.
    """
    events.validate()
    if isinstance(clock_hz, bool) or not math.isfinite(clock_hz) or clock_hz <= 0:
        raise ValueError(f"clock_hz must be finite and positive, not {clock_hz!r}")
    if pmem_basis not in PMEM_BASES:
        raise ValueError(f"pmem_basis must be one of {PMEM_BASES}, not {pmem_basis!r}")
    c, e = constants, events
    seconds = e.cycles / clock_hz
    if pmem_basis == "media":
        pmem_pj = (e.pmem_media_reads * c.pmem_read_pj_per_access
                   + e.pmem_media_writes * c.pmem_write_pj_per_access)
    else:
        pmem_pj = (e.pmem_read_lines * c.pmem_read_pj_per_line
                   + e.pmem_write_lines * c.pmem_write_pj_per_line)
    device_pj = (e.device_fp_adds * c.device_fp_add_pj + e.device_fp_muls * c.device_fp_mul_pj
                 + e.device_sram_lines * c.device_sram_pj_per_line)
    return EnergyReport(
        seconds=seconds,
        pmem_dynamic_j=pmem_pj * _PJ,
        pmem_static_j=c.pmem_modules * c.pmem_static_w_per_module * seconds,
        link_j=e.link_bytes * c.link_pj_per_byte * _PJ,
        gpu_dynamic_j=e.gpu_flops * c.gpu_pj_per_flop * _PJ,
        gpu_static_j=c.gpu_static_w * seconds,
        hbm_j=e.hbm_bytes * c.hbm_pj_per_byte * _PJ,
        device_dynamic_j=device_pj * _PJ,
        device_static_j=c.device_static_w * seconds,
    )


def saving(baseline: EnergyReport, trainingcxl: EnergyReport) -> float:
    """Fraction of the baseline's energy that TrainingCXL saves: ``1 - E_tcxl / E_base``.

    Raises
    ------
    ValueError
        The baseline's total energy is not positive.
    """
    if baseline.total_j <= 0:
        raise ValueError(f"baseline total energy must be positive, not {baseline.total_j}")
    return 1.0 - trainingcxl.total_j / baseline.total_j
