"""One validated description of every generator parameter.

A :class:`DeviceConfig` is built once (from a preset in ``configs/*.toml`` or in code)
and handed to every block. Construction validates each value and raises
:class:`ValueError` naming the bad value, so a bad config never reaches elaboration.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from .widths import is_pow2

__all__ = ["CONFIG_DIR", "DeviceConfig", "load_config", "preset_names"]

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

#: CXL moves whole 64-byte lines; every data path of the device is one line wide.
LINE_BITS = 512
LINE_BYTES = LINE_BITS // 8
#: HDM base and size are programmed in 4 KiB granules (the low 12 bits read as zero).
HDM_GRANULE = 4096
#: Host physical addresses are 52 bits (CXL Addr[51:6] carries the line address).
HOST_ADDR_BITS = 52
#: Most lines whose Meta0-State the endpoint keeps on chip (``meta_state``): 2 Mbit.
META_STATE_MAX_LINES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class DeviceConfig:
    """Every generator parameter of the TrainingCXL device.

    The defaults are the ``default`` preset (``configs/default.toml``; a test holds
    the two equal), so ``DeviceConfig()`` and ``load_config("default")`` build the same
    device, named ``tcxl_device_default`` either way.

    Parameters
    ----------
    name:
        Configuration tag; becomes part of every generated module name
        (``tcxl_device_<name>``), so it must be a Verilog identifier fragment.
    line_bits:
        Data width of every channel and of the PMEM port. Fixed at 512 (one CXL line).
    pmem_size:
        Bytes of device memory behind the PMEM port (power of two, at least 64 KiB).
        The PMEM AXI address is ``log2(pmem_size)`` bits wide.
    hdm_base:
        Reset value of the HDM decoder base (host physical address, 4 KiB aligned).
    hdm_size:
        Reset value of the HDM decoder size in bytes (4 KiB multiple, at most
        ``pmem_size``). Zero disables the decoder until software programs it.
    max_tags:
        CXL.mem requests the endpoint keeps in flight towards PMEM (reads and writes
        together). Little's law: reaching the PMEM peak of one line per cycle needs
        at least the PMEM latency in flight, hence the default of 256.
    axi_id_width:
        PMEM AXI ID width; at least 6 (``docs/architecture.md``, "PMEM port") and enough to give
        every in-flight request its own ID (``2**axi_id_width >= max_tags``).
    hazard_buckets:
        Size of the endpoint's same-line ordering table (power of two). Lines are
        hashed into buckets; a false match only delays a request, never reorders it.
    csr_addr_width:
        Byte-address width of the AXI4-Lite CSR port (12 to 24).
    engine_lanes:
        fp32 lanes of the pooling datapath (4, 8 or 16; 16 pools one line per cycle).
    reduce_partials:
        Partial sums per bag ``P`` of the accumulation-order contract (1 to 8;
        ``docs/embedding.md``). ``P`` at least the adder latency keeps one row line per
        cycle flowing even for single-line rows.
    gather_rob_lines:
        Table lines the gather keeps in flight (its reorder buffer; power of two, 16 to
        4096). One line per cycle needs about the PMEM read latency plus a row.
    engine_max_dim:
        Largest embedding ``dim`` the engine takes (multiple of 16, 16 to 1024); sizes
        the pooling accumulators and the update's row cache lines.
    update_acc_rows, update_acc_lines:
        The UPDATE's on-chip gradient accumulator (``docs/embedding.md``, "Update"): its
        entries (distinct rows; power of two, 2 to 4096) and the fp32 sum lines they
        share, a row taking one per gradient line (power of two, ``engine_max_dim /
        16`` to 65536). An UPDATE with more indices than ``update_acc_rows``, or more
        indices times gradient lines per row than ``update_acc_lines``, runs in passes
        over the accumulator (``docs/embedding.md``, "Passes").
    update_max_passes:
        The passes an UPDATE may need by its size (power of two, 1 to 65536): one with
        more than ``update_max_passes`` times the indices, or indices times gradient
        lines, the accumulator holds completes UNSUPPORTED (1: no UPDATE beyond the
        accumulator).
    engine_sequencers:
        Bag sequencers of the engine (1 to 8): that many LOOKUP / UPDATE descriptors
        have their checks and index reads in flight at once (``docs/embedding.md``,
        "Execution order"). Each takes AXI ID bits: ``axi_id_width -
        Engine.MANAGER_ID_BITS - ceil(log2 engine_sequencers)`` must be at least 2 (the
        engine's eight PMEM managers take 3 bits).
    seq_replay_lines:
        Lines of each bag sequencer's replay store (0: none; else a power of two, 2 to
        4096): a descriptor whose offsets and indices fit in it has them read from memory
        once, in pass 1, and pass 2 takes them from the store (``docs/embedding.md``,
        "Execution order"). A descriptor that does not fit has them read again.
    row_store_lines:
        Table lines the engine's row store keeps (0: none; else a power of two, 2 to
        65536): the lines the LOOKUPs gathered, from which the UPDATE after them reads its
        rows instead of PMEM (``docs/embedding.md``, "Row store"). 64 bytes each, plus a
        tag and a valid bit.
    ckpt_filter_rows:
        Entries of the undo logger's duplicate-row filter (power of two, 2 to 4096).
    ckpt_fifo_lines:
        Undo lines the logger buffers before the gather waits for it (2 to 4096).
    mlp_relax_k:
        Reset value of ``CK_MLP_K``: how many batches the MLP checkpoint may lag the
        embeddings before a COMMIT waits for it (0 to 65535).
    page_bytes:
        Bias-table page of the DCOH (power of two, 64 B to 2 MiB, at most
        ``pmem_size``): the bias table holds ``pmem_size / page_bytes`` bits and its
        reset sweep takes that many cycles (``docs/dcoh.md``).
    dcoh_cqids:
        Entries of the DCOH: device accesses permitted and not yet finished, and its
        CQIDs 2048 and up (power of two, 2 to 256). Device-bias accesses hold one for
        the PMEM latency, so one line per cycle needs about that many.
    cache_cqids, cache_write_cqids:
        Read and write CQIDs of the CXL.cache agent (powers of two; reads 2 to 2048,
        writes 2 to ``cache_cqids``). Reads of GPU memory at one line per cycle need
        about the host's response latency in flight.
    meta_state:
        1: the memory endpoint stores each line's Meta0-State, 2 bits per line of device
        memory on chip (``pmem_size / 256`` bytes, so at most 2**20 lines), updated by
        the host's MetaValue and returned in the responses (``docs/mem-endpoint.md``,
        "Meta state"); 0: no metadata storage, responses echo the request's MetaValue.
    """

    name: str = "default"
    line_bits: int = LINE_BITS
    pmem_size: int = 1 << 30
    hdm_base: int = 0
    hdm_size: int = 1 << 30
    max_tags: int = 256
    axi_id_width: int = 8
    hazard_buckets: int = 256
    csr_addr_width: int = 16
    engine_lanes: int = 16
    reduce_partials: int = 4
    gather_rob_lines: int = 256
    engine_max_dim: int = 256
    update_acc_rows: int = 4096
    update_acc_lines: int = 16384
    ckpt_filter_rows: int = 256
    ckpt_fifo_lines: int = 1024
    mlp_relax_k: int = 4
    page_bytes: int = 65536
    dcoh_cqids: int = 256
    cache_cqids: int = 128
    cache_write_cqids: int = 64
    engine_sequencers: int = 8
    meta_state: int = 0
    seq_replay_lines: int = 256
    row_store_lines: int = 2048
    update_max_passes: int = 64

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"name must match [a-z][a-z0-9_]*, not {self.name!r}")
        for f in fields(self):
            if f.name != "name":
                value = getattr(self, f.name)
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError(f"{f.name} must be an integer, not {value!r}")
        if self.line_bits != LINE_BITS:
            raise ValueError(f"line_bits is fixed at {LINE_BITS}, not {self.line_bits}")
        if not is_pow2(self.pmem_size) or not (1 << 16) <= self.pmem_size <= (1 << 46):
            raise ValueError("pmem_size must be a power of two between 64 KiB and 64 TiB, "
                             f"not {self.pmem_size}")
        if self.hdm_base % HDM_GRANULE or not 0 <= self.hdm_base < (1 << HOST_ADDR_BITS):
            raise ValueError(
                f"hdm_base must be a 4 KiB aligned 52-bit address, not {self.hdm_base:#x}")
        if self.hdm_size % HDM_GRANULE or not 0 <= self.hdm_size <= self.pmem_size:
            raise ValueError(
                f"hdm_size must be a 4 KiB multiple no larger than pmem_size "
                f"({self.pmem_size}), not {self.hdm_size}")
        if self.hdm_base + self.hdm_size > (1 << HOST_ADDR_BITS):
            end = self.hdm_base + self.hdm_size
            raise ValueError(f"hdm_base + hdm_size must stay below 2**52, not {end:#x}")
        if not 1 <= self.max_tags <= 4096:
            raise ValueError(f"max_tags must be between 1 and 4096, not {self.max_tags}")
        if not 6 <= self.axi_id_width <= 16:
            raise ValueError(f"axi_id_width must be between 6 and 16, not {self.axi_id_width}")
        if (1 << self.axi_id_width) < self.max_tags:
            raise ValueError(
                f"axi_id_width {self.axi_id_width} gives {1 << self.axi_id_width} IDs, "
                f"fewer than max_tags {self.max_tags}")
        if not is_pow2(self.hazard_buckets) or not 2 <= self.hazard_buckets <= 4096:
            raise ValueError("hazard_buckets must be a power of two between 2 and 4096, "
                             f"not {self.hazard_buckets}")
        if not 12 <= self.csr_addr_width <= 24:
            raise ValueError(
                f"csr_addr_width must be between 12 and 24, not {self.csr_addr_width}")
        if self.engine_lanes not in (4, 8, 16):
            raise ValueError(f"engine_lanes must be 4, 8 or 16, not {self.engine_lanes}")
        if not 1 <= self.reduce_partials <= 8:
            raise ValueError(
                f"reduce_partials must be between 1 and 8, not {self.reduce_partials}")
        if not is_pow2(self.gather_rob_lines) or not 16 <= self.gather_rob_lines <= 4096:
            raise ValueError("gather_rob_lines must be a power of two between 16 and 4096, "
                             f"not {self.gather_rob_lines}")
        if self.engine_max_dim % 16 or not 16 <= self.engine_max_dim <= 1024:
            raise ValueError("engine_max_dim must be a multiple of 16 between 16 and 1024, "
                             f"not {self.engine_max_dim}")
        if not is_pow2(self.ckpt_filter_rows) or not 2 <= self.ckpt_filter_rows <= 4096:
            raise ValueError("ckpt_filter_rows must be a power of two between 2 and 4096, "
                             f"not {self.ckpt_filter_rows}")
        if not 2 <= self.ckpt_fifo_lines <= 4096:
            raise ValueError(
                f"ckpt_fifo_lines must be between 2 and 4096, not {self.ckpt_fifo_lines}")
        if not 0 <= self.mlp_relax_k <= 0xFFFF:
            raise ValueError(f"mlp_relax_k must be between 0 and 65535, not {self.mlp_relax_k}")
        if not is_pow2(self.update_acc_rows) or not 2 <= self.update_acc_rows <= 4096:
            raise ValueError("update_acc_rows must be a power of two between 2 and 4096, "
                             f"not {self.update_acc_rows}")
        if (not is_pow2(self.update_acc_lines)
                or not self.engine_max_dim // 16 <= self.update_acc_lines <= 65536):
            raise ValueError("update_acc_lines must be a power of two between engine_max_dim / 16 "
                             f"and 65536, not {self.update_acc_lines}")
        # The engine owns its manager list and a sequencer its ID needs (imported here:
        # the engine imports this module).
        from .engine.bag_sequencer import ID_BITS
        from .engine.engine import Engine
        seq_bits = (self.engine_sequencers - 1).bit_length()
        spare = self.axi_id_width - Engine.MANAGER_ID_BITS - seq_bits
        if not 1 <= self.engine_sequencers <= 8 or spare < ID_BITS:
            raise ValueError(f"engine_sequencers must be between 1 and 8, with axi_id_width - "
                             f"{Engine.MANAGER_ID_BITS} - ceil(log2 engine_sequencers) at least "
                             f"{ID_BITS}, not {self.engine_sequencers}")
        if self.seq_replay_lines and (not is_pow2(self.seq_replay_lines)
                                      or not 2 <= self.seq_replay_lines <= 4096):
            raise ValueError("seq_replay_lines must be 0 or a power of two between 2 and "
                             f"4096, not {self.seq_replay_lines}")
        if not is_pow2(self.update_max_passes) or not 1 <= self.update_max_passes <= 65536:
            raise ValueError("update_max_passes must be a power of two between 1 and 65536, "
                             f"not {self.update_max_passes}")
        if self.row_store_lines and (not is_pow2(self.row_store_lines)
                                     or not 2 <= self.row_store_lines <= 65536):
            raise ValueError("row_store_lines must be 0 or a power of two between 2 and "
                             f"65536, not {self.row_store_lines}")
        if (not is_pow2(self.page_bytes) or not 64 <= self.page_bytes <= (1 << 21)
                or self.page_bytes > self.pmem_size):
            raise ValueError("page_bytes must be a power of two between 64 and 2 MiB and at "
                             f"most pmem_size, not {self.page_bytes}")
        if self.pmem_size // self.page_bytes > (1 << 24):
            raise ValueError(f"pmem_size / page_bytes must be at most 2**24 pages, not "
                             f"{self.pmem_size // self.page_bytes}")
        if not is_pow2(self.dcoh_cqids) or not 2 <= self.dcoh_cqids <= 256:
            raise ValueError(
                f"dcoh_cqids must be a power of two between 2 and 256, not {self.dcoh_cqids}")
        if not is_pow2(self.cache_cqids) or not 2 <= self.cache_cqids <= 2048:
            raise ValueError("cache_cqids must be a power of two between 2 and 2048, not "
                             f"{self.cache_cqids}")
        if self.meta_state not in (0, 1):
            raise ValueError(f"meta_state must be 0 or 1, not {self.meta_state}")
        if self.meta_state and self.pmem_lines > META_STATE_MAX_LINES:
            raise ValueError(
                f"meta_state needs 2 bits per line on chip: at most {META_STATE_MAX_LINES} "
                f"lines ({META_STATE_MAX_LINES * LINE_BYTES >> 20} MiB of pmem_size), not "
                f"{self.pmem_lines}")
        if (not is_pow2(self.cache_write_cqids)
                or not 2 <= self.cache_write_cqids <= self.cache_cqids):
            raise ValueError("cache_write_cqids must be a power of two between 2 and "
                             f"cache_cqids, not {self.cache_write_cqids}")

    # Derived values: read-only, computed from the fields so they can never disagree.
    @property
    def line_bytes(self) -> int:
        return self.line_bits // 8

    @property
    def pmem_addr_width(self) -> int:
        """Byte-address width of the PMEM AXI port."""
        return self.pmem_size.bit_length() - 1

    @property
    def pmem_lines(self) -> int:
        return self.pmem_size // self.line_bytes

    @property
    def tag_index_width(self) -> int:
        """Bits to number an in-flight slot (at least 1)."""
        return max(1, (self.max_tags - 1).bit_length())

    @property
    def pmem_id_width(self) -> int:
        """AXI ID width of the device's PMEM port: ``axi_id_width`` plus one bit that
        tells the memory endpoint's requests from the engine's."""
        return self.axi_id_width + 1

    @property
    def engine_max_lines(self) -> int:
        """Lines of the longest row (an fp32 row of ``engine_max_dim``)."""
        return self.engine_max_dim * 4 // self.line_bytes

    @property
    def dcoh_pages(self) -> int:
        """Pages of the DCOH's bias table: all of device memory."""
        return self.pmem_size // self.page_bytes

    @property
    def log_slot_lines(self) -> int:
        """Lines of an undo-log slot: a header and the longest row."""
        return 1 + self.engine_max_lines

    @property
    def hazard_bucket_width(self) -> int:
        return self.hazard_buckets.bit_length() - 1

    @property
    def tag(self) -> str:
        """Suffix for generated module names."""
        return self.name

    def params(self) -> dict[str, int]:
        """Every integer generator parameter, in declaration order (for capability CSRs)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}

    def replace(self, **changes) -> DeviceConfig:
        return dataclasses.replace(self, **changes)


def preset_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def load_config(source: str | Path) -> DeviceConfig:
    """Load a preset by name (``"default"``) or from a TOML file path.

    Unknown keys are rejected with a message naming them.
    """
    path = Path(source)
    if not path.suffix:
        path = CONFIG_DIR / f"{source}.toml"
    if not path.is_file():
        raise ValueError(f"config {str(source)!r} not found (presets: {', '.join(preset_names())})")
    with path.open("rb") as f:
        data = tomllib.load(f)
    known = {f.name for f in fields(DeviceConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown config key(s) {', '.join(unknown)} in {path}")
    data.setdefault("name", path.stem.replace("-", "_"))
    return DeviceConfig(**data)
