"""The register description: one table that generates the bank, the docs, JSON and C.

Every CSR of the device is a :class:`Register` in the table built by
:func:`register_map`. :class:`~hw.csr.bank.CsrBank` builds its ports and decoder from
it, :mod:`hw.csr.docgen` writes ``docs/registers.md``, ``registers.json`` and
``tcxl_regs.h`` from it, and test benches find offsets, fields and reset values in it,
so no offset is typed twice.

Register kinds (:class:`Kind`, described in :data:`KIND_DOCS`): CONST, RW, RO, W1C,
CAPTURE, PULSE and COUNTER64. Each creates the bank ports listed by
:attr:`Register.ports`, named after the lower-case register name (``hdm_base_lo``,
``err_status_set``, ``perf_cycles_inc``, ...). A register's :class:`Field` s give its
value ports a layout (:attr:`Register.layout`), so hardware connects fields by name,
and test benches split a read value by name (:meth:`Register.field_values`,
``tb.csr.Csr.read_fields``) and build one (:meth:`Register.pack`).

Bits at or above a register's ``width`` are reserved: they read 0 and ignore writes.

Address regions (:data:`REGIONS`): 0x000-0x0FF identification and capabilities,
0x100-0x1FF memory endpoint, 0x200-0x2FF errors, 0x300-0x3FF performance, 0x400-0x4FF
embedding engine, 0x500-0x5FF checkpoint and recovery, 0x600 and up reserved.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from amaranth.hdl import unsigned
from amaranth.lib import data

from ..config import HDM_GRANULE, HOST_ADDR_BITS, DeviceConfig

__all__ = [
    "CAP_BASE",
    "DATA_WIDTH",
    "ID_VALUE",
    "KIND_DOCS",
    "REGIONS",
    "VERSION_MAJOR",
    "VERSION_MINOR",
    "WIDE_PARAMS",
    "Field",
    "Kind",
    "Port",
    "Region",
    "Register",
    "RegisterMap",
    "Word",
    "register_map",
]

#: Width of a CSR word (the AXI4-Lite data width).
DATA_WIDTH = 32
_WORD_BYTES = DATA_WIDTH // 8

#: ``ID`` register value: "TCXL" in ASCII, most significant byte first.
ID_VALUE = 0x5443584C
VERSION_MAJOR = 1
VERSION_MINOR = 0

#: First capability register; one register per ``DeviceConfig.params()`` entry follows.
CAP_BASE = 0x040
#: Parameters whose valid values can exceed 32 bits: they get ``_LO`` and ``_HI`` words.
WIDE_PARAMS = frozenset({"pmem_size", "hdm_base", "hdm_size"})

_NAME_RE = re.compile(r"[A-Z][A-Z0-9_]*")


class Kind(enum.Enum):
    """How software and hardware see a register (:data:`KIND_DOCS`)."""
    CONST = "CONST"
    RW = "RW"
    RO = "RO"
    W1C = "W1C"
    CAPTURE = "CAPTURE"
    PULSE = "PULSE"
    COUNTER64 = "COUNTER64"


#: kind -> (software view, hardware ports of the bank; ``In`` = driven into the bank).
KIND_DOCS: Mapping[Kind, tuple[str, str]] = {
    Kind.CONST: ("Read-only constant from the configuration.", "none"),
    Kind.RW: ("Read/write. Bits outside the writable mask read their reset value and "
              "ignore writes.",
              "`<name>`: Out(width), the current value"),
    Kind.RO: ("Read-only live value.", "`<name>`: In(width)"),
    Kind.W1C: ("Read; writing 1 clears a bit. A set and a clear of the same bit in one "
               "cycle leave it set.",
               "`<name>_set`: In(width), one-cycle set pulses; `<name>`: Out(width)"),
    Kind.CAPTURE: ("Read-only; loads `<name>_value` in a cycle where `<name>_capture` is "
                   "high (with `armed_by`, only while that W1C register is all-zero).",
                   "`<name>_value`: In(width); `<name>_capture`: In(1)"),
    Kind.PULSE: ("Write-only strobe; reads return 0.",
                 "`<name>`: Out(width), the written value for exactly one cycle, else 0"),
    Kind.COUNTER64: ("64-bit event counter at `<NAME>_LO`/`<NAME>_HI`. Reading `_LO` "
                     "snapshots the upper half for the next `_HI` read. Bit 0 of the "
                     "PULSE register `clear_by` written 1 clears it (clear wins over an "
                     "increment).",
                     "`<name>_inc`: In(step_width), added every cycle (step_width 1: count "
                     "one per cycle it is high)"),
}


@dataclass(frozen=True)
class Field:
    """A named bit range of a register, for documentation and software headers.

    Parameters
    ----------
    name:
        Upper-case identifier (a lower-case name is upper-cased).
    lsb, width:
        Position and width in bits.
    doc:
        One-line description.
    """

    name: str
    lsb: int
    width: int
    doc: str = ""

    def __post_init__(self):
        object.__setattr__(self, "name", str(self.name).upper())

    @property
    def msb(self) -> int:
        return self.lsb + self.width - 1

    @property
    def mask(self) -> int:
        """Mask of the field in register position."""
        return ((1 << self.width) - 1) << self.lsb

    @property
    def bits(self) -> str:
        """``"[msb:lsb]"``, or ``"[n]"`` for a single bit."""
        return f"[{self.lsb}]" if self.width == 1 else f"[{self.msb}:{self.lsb}]"


@dataclass(frozen=True)
class Port:
    """A hardware port of the bank that a register creates.

    ``direction`` is seen from the bank: ``"in"`` is driven by the device into the bank.
    """

    name: str
    direction: str
    width: int
    #: Reset value of an output port.
    init: int = 0
    #: The register's field layout (``Register.layout``) for a value port of a register
    #: with fields; ``None``: a plain ``width``-bit port.
    layout: data.FlexibleLayout | None = None

    @property
    def shape(self):
        """The port's shape: the field layout, or ``width`` bits."""
        return self.width if self.layout is None else self.layout

    @property
    def init_value(self):
        """``init`` as the port's member takes it (a constant of the layout, if any)."""
        return self.init if self.layout is None else data.Const(self.layout, self.init)


@dataclass(frozen=True)
class Word:
    """One 32-bit address slot of the map. A COUNTER64 register has two words."""

    name: str
    offset: int
    register: Register
    #: 0 for the (low) word of a register, 1 for the ``_HI`` word of a COUNTER64.
    index: int = 0


@dataclass(frozen=True)
class Register:
    """One register of the description.

    Parameters
    ----------
    name:
        Upper-case identifier; the bank's ports are named after its lower-case form.
    offset:
        Byte offset in the CSR space (a multiple of 4).
    kind:
        A :class:`Kind`.
    width:
        Implemented bits (1 to 32); default 32, and 64 (the only value allowed) for
        ``COUNTER64``. Bits at or above ``width`` read 0 and ignore writes.
    reset:
        Reset value; for ``CONST`` the constant itself. ``COUNTER64`` resets to 0.
    fields:
        :class:`Field` s (within ``width``, not overlapping).
    doc:
        Description (one paragraph; the docs table shows it as one line).
    writable_mask:
        ``RW`` only: bits software can write (default: all ``width`` bits).
    clear_by:
        ``COUNTER64`` only (required): name of the ``PULSE`` register whose bit 0,
        written 1, clears the counter.
    step_width:
        ``COUNTER64`` only: width of the ``_inc`` port, whose value is added every cycle
        (default 1: an event counter; wider for counts of bytes).
    armed_by:
        ``CAPTURE`` only (optional): name of a ``W1C`` register; the capture happens only
        while that register is all-zero (after this cycle's software clear, before this
        cycle's sets), so the capture holds the first event since software last cleared
        it.

    Raises
    ------
    ValueError
        Naming the register, for any inconsistent attribute.
    """

    name: str
    offset: int
    kind: Kind
    width: int | None = None
    reset: int = 0
    fields: Sequence[Field] = ()
    doc: str = ""
    writable_mask: int | None = None
    clear_by: str | None = None
    armed_by: str | None = None
    step_width: int = 1

    def __post_init__(self):
        object.__setattr__(self, "fields", tuple(self.fields))
        name = self.name
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise ValueError(f"register name must match [A-Z][A-Z0-9_]*, not {name!r}")
        if not isinstance(self.kind, Kind):
            raise ValueError(f"register {name}: kind must be a Kind, not {self.kind!r}")
        if not isinstance(self.offset, int) or self.offset < 0:
            raise ValueError(f"register {name}: offset must be a non-negative integer, "
                             f"not {self.offset!r}")
        if self.kind is Kind.COUNTER64:
            if self.width not in (None, 64):
                raise ValueError(f"register {name}: a COUNTER64 is 64 bits wide, not {self.width}")
            object.__setattr__(self, "width", 64)
            if self.reset != 0:
                raise ValueError(f"register {name}: a COUNTER64 resets to 0, not {self.reset:#x}")
            if self.clear_by is None:
                raise ValueError(f"register {name}: a COUNTER64 needs clear_by (a PULSE register)")
        else:
            if self.width is None:
                object.__setattr__(self, "width", DATA_WIDTH)
            if not isinstance(self.width, int) or not 1 <= self.width <= DATA_WIDTH:
                raise ValueError(f"register {name}: width must be between 1 and {DATA_WIDTH}, "
                                 f"not {self.width!r}")
            if self.clear_by is not None:
                raise ValueError(f"register {name}: clear_by applies to COUNTER64 registers only")
            if self.step_width != 1:
                raise ValueError(f"register {name}: step_width applies to COUNTER64 registers only")
        if not isinstance(self.step_width, int) or not 1 <= self.step_width <= DATA_WIDTH:
            raise ValueError(f"register {name}: step_width must be between 1 and {DATA_WIDTH}, "
                             f"not {self.step_width!r}")
        if not isinstance(self.reset, int) or not 0 <= self.reset < (1 << self.width):
            raise ValueError(f"register {name}: reset {self.reset!r} does not fit in "
                             f"{self.width} bits")
        if self.writable_mask is not None:
            if self.kind is not Kind.RW:
                raise ValueError(f"register {name}: writable_mask applies to RW registers only")
            if not 0 <= self.writable_mask < (1 << self.width):
                raise ValueError(f"register {name}: writable_mask {self.writable_mask:#x} does "
                                 f"not fit in {self.width} bits")
        if self.armed_by is not None and self.kind is not Kind.CAPTURE:
            raise ValueError(f"register {name}: armed_by applies to CAPTURE registers only")
        used = 0
        seen = set()
        for f in self.fields:
            if not _NAME_RE.fullmatch(f.name):
                raise ValueError(f"register {name}: field name must match [A-Z][A-Z0-9_]*, "
                                 f"not {f.name!r}")
            if f.name in seen:
                raise ValueError(f"register {name}: field {f.name} is defined twice")
            seen.add(f.name)
            if f.width < 1 or f.lsb < 0 or f.msb >= self.width:
                raise ValueError(f"register {name}: field {f.name} {f.bits} does not fit in "
                                 f"{self.width} bits")
            if used & f.mask:
                raise ValueError(f"register {name}: field {f.name} {f.bits} overlaps another field")
            used |= f.mask
        if self.fields and self.reset & ~used:
            raise ValueError(f"register {name}: reset {self.reset:#x} sets bits outside its "
                             "fields")

    # --- derived views ---------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes of address space the register occupies."""
        return 8 if self.kind is Kind.COUNTER64 else _WORD_BYTES

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def port_name(self) -> str:
        return self.name.lower()

    @property
    def write_mask(self) -> int:
        """Bits a software write affects (RW: writable bits; W1C/PULSE: all bits)."""
        if self.kind is Kind.RW:
            full = (1 << self.width) - 1
            return full if self.writable_mask is None else self.writable_mask
        if self.kind in (Kind.W1C, Kind.PULSE):
            return (1 << self.width) - 1
        return 0

    @property
    def words(self) -> tuple[Word, ...]:
        if self.kind is Kind.COUNTER64:
            return (Word(f"{self.name}_LO", self.offset, self, 0),
                    Word(f"{self.name}_HI", self.offset + _WORD_BYTES, self, 1))
        return (Word(self.name, self.offset, self, 0),)

    @property
    def layout(self) -> data.FlexibleLayout | None:
        """The register's bits as a layout of its fields (lower-case names, reserved
        bits unnamed), or ``None`` for a register without fields. The bank's value
        ports of a register with fields have this shape, so hardware reads and drives
        them by field name (``regs.eng_status.in_flight``)."""
        if not self.fields:
            return None
        return data.FlexibleLayout(self.width, {
            f.name.lower(): data.Field(unsigned(f.width), f.lsb) for f in self.fields})

    def field_values(self, value: int) -> dict[str, int]:
        """``value`` split into its fields, by lower-case field name."""
        return {f.name.lower(): value >> f.lsb & ((1 << f.width) - 1) for f in self.fields}

    def pack(self, **values: int) -> int:
        """The register value with the named fields (lower-case names) set, the rest 0;
        ``ValueError`` for an unknown field or a value that does not fit."""
        word = 0
        for name, value in values.items():
            f = self.field(name)
            if not isinstance(value, int) or not 0 <= value < (1 << f.width):
                raise ValueError(f"register {self.name}: {value!r} does not fit field "
                                 f"{f.name} ({f.width} bits)")
            word |= value << f.lsb
        return word

    @property
    def ports(self) -> tuple[Port, ...]:
        p, w, lay = self.port_name, self.width, self.layout
        return {
            Kind.CONST: (),
            Kind.RW: (Port(p, "out", w, self.reset, lay),),
            Kind.RO: (Port(p, "in", w, 0, lay),),
            Kind.W1C: (Port(f"{p}_set", "in", w, 0, lay), Port(p, "out", w, self.reset, lay)),
            Kind.CAPTURE: (Port(f"{p}_value", "in", w, 0, lay), Port(f"{p}_capture", "in", 1)),
            Kind.PULSE: (Port(p, "out", w, 0, lay),),
            Kind.COUNTER64: (Port(f"{p}_inc", "in", self.step_width),),
        }[self.kind]

    def field(self, name: str) -> Field:
        """The field called ``name`` (case-insensitive)."""
        for f in self.fields:
            if f.name == name.upper():
                return f
        raise KeyError(f"register {self.name} has no field {name!r}")


@dataclass(frozen=True)
class Region:
    """A block of the CSR space set aside for one part of the device."""

    name: str
    start: int
    #: One past the last byte, or ``None`` for "to the end of the CSR space".
    end: int | None
    doc: str = ""

    def contains(self, offset: int) -> bool:
        return offset >= self.start and (self.end is None or offset < self.end)


REGIONS: tuple[Region, ...] = (
    Region("Identification and capabilities", 0x000, 0x100,
           "What the device is and every generator parameter it was built with."),
    Region("Memory endpoint", 0x100, 0x200,
           "HDM decoder programming and live status of the CXL.mem endpoint."),
    Region("Errors", 0x200, 0x300,
           "Sticky error flags (write 1 to clear) and the first error's address and kind."),
    Region("Performance", 0x300, 0x400,
           "64-bit event counters, cleared together through PERF_CTRL."),
    Region("Embedding engine", 0x400, 0x500,
           "Descriptor ring, doorbell, completion head, engine errors and counters "
           "(docs/embedding.md, \"Descriptor ring, doorbell and completion\")."),
    Region("Checkpoint and recovery", 0x500, 0x600,
           "Recovery command and results, undo-log status and counters "
           "(docs/checkpoint.md)."),
    Region("Coherence", 0x600, 0x700,
           "DCOH mode and bias flips, CXL.cache use, coherence errors and counters "
           "(docs/dcoh.md, docs/cxl-cache.md)."),
    Region("Reserved", 0x700, None,
           "Reserved; accesses answer SLVERR."),
)


@dataclass(frozen=True)
class RegisterMap:
    """An ordered, validated set of registers in a CSR space of ``2**addr_width`` bytes.

    Registers are kept sorted by offset.

    Raises
    ------
    ValueError
        Naming the offending register: misaligned offset, overlapping registers, a
        register beyond ``2**addr_width``, duplicate register or port names, or a
        ``clear_by`` / ``armed_by`` that names no register of the right kind.
    """

    registers: Sequence[Register]
    addr_width: int
    #: Configuration tag (used in generated file headers and titles).
    name: str = "custom"
    regions: Sequence[Region] = REGIONS

    def __post_init__(self):
        regs = tuple(sorted(self.registers, key=lambda r: r.offset))
        object.__setattr__(self, "registers", regs)
        object.__setattr__(self, "regions", tuple(self.regions))
        if not isinstance(self.addr_width, int) or not 3 <= self.addr_width <= 32:
            raise ValueError(f"addr_width must be between 3 and 32, not {self.addr_width!r}")
        space = 1 << self.addr_width
        names: dict[str, str] = {}
        ports: dict[str, str] = {}
        prev = None
        for reg in regs:
            if reg.offset % _WORD_BYTES:
                raise ValueError(f"register {reg.name}: offset {reg.offset:#x} is not a "
                                 f"multiple of {_WORD_BYTES}")
            if reg.end > space:
                raise ValueError(f"register {reg.name}: offset {reg.offset:#x} does not fit in "
                                 f"the {self.addr_width}-bit CSR space (ends at {space:#x})")
            if prev is not None and reg.offset < prev.end:
                raise ValueError(f"register {reg.name} at {reg.offset:#x} overlaps register "
                                 f"{prev.name} at {prev.offset:#x}")
            prev = reg
            for word in reg.words:
                if word.name in names:
                    raise ValueError(f"register {reg.name}: name {word.name} is already used by "
                                     f"register {names[word.name]}")
                names[word.name] = reg.name
            for port in reg.ports:
                if port.name in ports or port.name == "csr":
                    other = ports.get(port.name, "the AXI4-Lite port")
                    raise ValueError(f"register {reg.name}: port name {port.name} is already "
                                     f"used by {other}")
                ports[port.name] = f"register {reg.name}"
        by_name = {r.name: r for r in regs}
        for reg in regs:
            for attr, kind in (("clear_by", Kind.PULSE), ("armed_by", Kind.W1C)):
                target = getattr(reg, attr)
                if target is not None and getattr(by_name.get(target), "kind", None) is not kind:
                    raise ValueError(f"register {reg.name}: {attr} must name a {kind.value} "
                                     f"register, not {target!r}")

    def __iter__(self) -> Iterator[Register]:
        return iter(self.registers)

    def __len__(self) -> int:
        return len(self.registers)

    def __contains__(self, name: str) -> bool:
        return any(r.name == name for r in self.registers)

    def __getitem__(self, name: str) -> Register:
        for reg in self.registers:
            if reg.name == name:
                return reg
        raise KeyError(f"no register named {name!r}")

    @property
    def words(self) -> tuple[Word, ...]:
        """Every 32-bit address slot, by offset."""
        return tuple(w for r in self.registers for w in r.words)

    def word(self, name: str) -> Word:
        """The address slot called ``name`` (``"ID"``, ``"PERF_CYCLES_LO"``, ...)."""
        for w in self.words:
            if w.name == name:
                return w
        raise KeyError(f"no register word named {name!r}")

    def offset(self, name: str) -> int:
        """Byte offset of the word called ``name``."""
        return self.word(name).offset

    @property
    def ports(self) -> tuple[Port, ...]:
        return tuple(p for r in self.registers for p in r.ports)

    def region_of(self, reg: Register | Word) -> Region | None:
        for region in self.regions:
            if region.contains(reg.offset):
                return region
        return None


# --- the device's registers ---------------------------------------------------------------

#: One-line descriptions of the generator parameters for the capability registers.
_PARAM_DOCS: Mapping[str, str] = {
    "line_bits": "Data width of every channel and of the PMEM port, in bits.",
    "pmem_size": "Bytes of device memory behind the PMEM port.",
    "hdm_base": "Reset value of the HDM decoder base (host physical address).",
    "hdm_size": "Reset value of the HDM decoder size in bytes.",
    "max_tags": "CXL.mem requests the endpoint keeps in flight towards PMEM.",
    "axi_id_width": "PMEM AXI ID width.",
    "hazard_buckets": "Entries of the endpoint's same-line ordering table.",
    "csr_addr_width": "Byte-address width of the CSR port.",
    "engine_lanes": "fp32 lanes of the engine's pooling datapath.",
    "reduce_partials": "Partial sums per bag (P of the accumulation-order contract).",
    "gather_rob_lines": "Table lines the gather keeps in flight.",
    "engine_max_dim": "Largest embedding dim the engine takes.",
    "update_acc_rows": "Indices (and distinct rows) one pass of an UPDATE holds.",
    "update_acc_lines": "fp32 sum lines of the UPDATE accumulator (indices x gradient lines).",
    "update_max_passes": "Passes over the accumulator one UPDATE may need by its size.",
    "ckpt_filter_rows": "Entries of the undo logger's duplicate-row filter.",
    "ckpt_fifo_lines": "Undo lines the logger buffers.",
    "mlp_relax_k": "Reset value of CK_MLP_K.",
    "page_bytes": "Bytes per page of the DCOH's bias table.",
    "dcoh_cqids": "DCOH entries (CQIDs 2048 and up).",
    "cache_cqids": "Read CQIDs of the CXL.cache agent.",
    "cache_write_cqids": "Write CQIDs of the CXL.cache agent.",
    "engine_sequencers": "Bag sequencers of the engine (descriptors checked at once).",
    "meta_state": "1: the endpoint stores each line's Meta0-State and returns it.",
    "seq_replay_lines": "Lines of each bag sequencer's replay store (0: none).",
    "row_store_lines": "Table lines the engine's row store keeps (0: none).",
}

_HDM_NOTE = ("The decoder uses the new value from the cycle after the write; software "
             "should quiesce CXL.mem traffic before reprogramming it.")

_HDM_LO_MASK = ((1 << DATA_WIDTH) - 1) & ~(HDM_GRANULE - 1)
_HDM_HI_WIDTH = HOST_ADDR_BITS - DATA_WIDTH


def _lo(value: int) -> int:
    return value & ((1 << DATA_WIDTH) - 1)


def _hi(value: int) -> int:
    return value >> DATA_WIDTH


def _capability_registers(config: DeviceConfig) -> Iterable[Register]:
    offset = CAP_BASE
    for param, value in config.params().items():
        doc = _PARAM_DOCS.get(param, f"Generator parameter {param}.")
        name = f"CAP_{param.upper()}"
        if param in WIDE_PARAMS:
            yield Register(f"{name}_LO", offset, Kind.CONST, reset=_lo(value),
                           doc=f"{doc} Bits [31:0] of {param}.")
            yield Register(f"{name}_HI", offset + 4, Kind.CONST, reset=_hi(value),
                           doc=f"{doc} Bits [63:32] of {param}.")
            offset += 8
        else:
            if value >> DATA_WIDTH:
                raise ValueError(f"parameter {param} = {value:#x} does not fit in a 32-bit "
                                 f"capability register; add it to WIDE_PARAMS")
            yield Register(name, offset, Kind.CONST, reset=value, doc=doc)
            offset += 4


def _hdm_registers(config: DeviceConfig) -> Iterable[Register]:
    for offset, what, value in ((0x100, "base", config.hdm_base),
                                (0x108, "size", config.hdm_size)):
        name = f"HDM_{what.upper()}"
        yield Register(
            f"{name}_LO", offset, Kind.RW, reset=_lo(value), writable_mask=_HDM_LO_MASK,
            fields=[Field("ADDR", 12, DATA_WIDTH - 12, f"HDM {what} bits [31:12]")],
            doc=f"HDM decoder {what}, bits [31:12] (4 KiB granules; bits [11:0] read 0). "
                f"{_HDM_NOTE}")
        yield Register(
            f"{name}_HI", offset + 4, Kind.RW, width=_HDM_HI_WIDTH, reset=_hi(value),
            fields=[Field("ADDR", 0, _HDM_HI_WIDTH, f"HDM {what} bits [51:32]")],
            doc=f"HDM decoder {what}, bits [51:32]. {_HDM_NOTE}")


def _error_registers() -> Iterable[Register]:
    yield Register(
        "ERR_STATUS", 0x200, Kind.W1C, width=6,
        doc="Sticky error flags: the device sets them, software writes 1 to clear. A set "
            "and a clear of the same bit in one cycle leave it set.",
        fields=[
            Field("HDM_RANGE", 0, 1, "Request address outside the HDM range."),
            Field("RSVD_OPCODE", 1, 1, "Request with a reserved opcode."),
            Field("POISON", 2, 1, "Poisoned write data dropped."),
            Field("EMPTY_PTL", 3, 1, "MemWrPtl with no byte enabled."),
            Field("UNEXPECTED_FWD", 4, 1, "MemRdFwd/MemWrFwd with nothing outstanding."),
            Field("PMEM_RESP", 5, 1, "PMEM answered SLVERR or DECERR."),
        ])
    first = ("of the first error since ERR_STATUS was last all-zero (captured only while "
             "ERR_STATUS reads 0).")
    yield Register(
        "ERR_ADDR_LO", 0x204, Kind.CAPTURE, armed_by="ERR_STATUS",
        fields=[Field("LINE_ADDR", 0, 32,
                      "Line address bits [31:0] (byte address bits [37:6]).")],
        doc=f"Line address bits [31:0] {first}")
    yield Register(
        "ERR_ADDR_HI", 0x208, Kind.CAPTURE, width=14, armed_by="ERR_STATUS",
        fields=[Field("LINE_ADDR", 0, 14,
                      "Line address bits [45:32] (byte address bits [51:38]).")],
        doc=f"Line address bits [45:32] {first}")
    yield Register(
        "ERR_INFO", 0x20C, Kind.CAPTURE, width=8, armed_by="ERR_STATUS",
        fields=[
            Field("CHANNEL", 0, 2, "0 M2S Req, 1 M2S RwD, 2 PMEM read, 3 PMEM write."),
            Field("OPCODE", 4, 4, "Opcode of the offending CXL request."),
        ],
        doc=f"Channel and opcode {first}")


def _perf_registers() -> Iterable[Register]:
    yield Register(
        "PERF_CTRL", 0x300, Kind.PULSE, width=1,
        fields=[Field("CLEAR", 0, 1, "Write 1 to clear every performance counter.")],
        doc="Performance counter control (write-only strobe; reads return 0).")
    counters = (
        ("PERF_CYCLES", 0x310, "Clock cycles since reset or the last clear."),
        ("PERF_READS", 0x318, "CXL.mem read requests accepted."),
        ("PERF_WRITES", 0x320, "CXL.mem write requests accepted."),
        ("PERF_BUSY", 0x328, "Cycles with at least one request in flight."),
    )
    for name, offset, doc in counters:
        yield Register(name, offset, Kind.COUNTER64, clear_by="PERF_CTRL",
                       doc=doc)
    # Link bytes as the bench's link model counts them: a 16-byte header slot per
    # message and 64 more for a line of data; CXL.io (CSR) accesses not counted.
    for name, offset, doc in (
            ("LINK_TX_BYTES", 0x330, "Link bytes the device sent: S2M NDR / DRS (CXL.mem) "
             "and D2H Req / Rsp / Data (CXL.cache), 16 per message and 64 more per data "
             "line."),
            ("LINK_RX_BYTES", 0x338, "Link bytes the device took: M2S Req / RwD (CXL.mem) "
             "and H2D Req / Rsp / Data (CXL.cache), 16 per message and 64 more per data "
             "line.")):
        yield Register(name, offset, Kind.COUNTER64, clear_by="PERF_CTRL", doc=doc,
                       step_width=LINK_STEP_BITS)


#: Link bytes of a message's header slot and of a data line (LINK_TX_BYTES /
#: LINK_RX_BYTES; ``tb/coherent_host.py``'s ``_message_bytes``).
LINK_HEADER_BYTES, LINK_DATA_BYTES = 16, 64
#: Width of the link byte counters' increment: five messages a cycle, two with data.
LINK_STEP_BITS = (5 * LINK_HEADER_BYTES + 2 * LINK_DATA_BYTES).bit_length()
#: Width of the device byte addresses the engine registers hold (descriptor addresses).
_ENG_ADDR_BITS = 48
#: Largest ring order (2**16 descriptors).
ENG_RING_ORDER_MAX = 16


def _engine_registers() -> Iterable[Register]:
    lo_mask = ((1 << DATA_WIDTH) - 1) & ~0x3F
    for offset, name, what in ((0x400, "ENG_RING_BASE", "descriptor ring"),
                               (0x410, "ENG_CQ_BASE", "completion-record array")):
        yield Register(
            f"{name}_LO", offset, Kind.RW, writable_mask=lo_mask,
            fields=[Field("ADDR", 6, DATA_WIDTH - 6, f"Byte address bits [31:6] of the {what}.")],
            doc=f"Device byte address of the {what}, bits [31:6] (64-byte aligned; bits [5:0] "
                "read 0). Program while the engine is idle (`ENG_HEAD == ENG_TAIL`).")
        yield Register(
            f"{name}_HI", offset + 4, Kind.RW, width=_ENG_ADDR_BITS - DATA_WIDTH,
            fields=[Field("ADDR", 0, _ENG_ADDR_BITS - DATA_WIDTH,
                          f"Byte address bits [47:32] of the {what}.")],
            doc=f"Device byte address of the {what}, bits [47:32].")
    yield Register(
        "ENG_RING_ORDER", 0x408, Kind.RW, width=5,
        fields=[Field("ORDER", 0, 5, "The ring holds 2**ORDER descriptors (values above "
                      f"{ENG_RING_ORDER_MAX} act as {ENG_RING_ORDER_MAX}).")],
        doc="Size of the descriptor ring and of the completion-record array.")
    yield Register(
        "ENG_TAIL", 0x420, Kind.RW,
        doc="Doorbell: descriptors written by the host, a free-running count (descriptor "
            "`seq` lives in slot `seq mod 2**ORDER`). The engine executes every "
            "descriptor from ENG_HEAD up to ENG_TAIL - 1.")
    yield Register(
        "ENG_HEAD", 0x424, Kind.RO,
        doc="Descriptors completed, a free-running count. Everything a descriptor wrote, "
            "and its completion record, is durable before ENG_HEAD passes it.")
    yield Register(
        "ENG_STATUS", 0x428, Kind.RO, width=19,
        fields=[Field("BUSY", 0, 1, "A descriptor is being fetched or executed."),
                Field("IN_FLIGHT", 8, 8, "Descriptors fetched and not yet completed."),
                Field("UNDO_STALL", 16, 1, "The gather waits for the undo-capture consumer "
                      "(the checkpoint logger)."),
                Field("SERIAL", 17, 1, "A serialising descriptor (COMMIT, FENCE) "
                      "is waiting for earlier ones or executing."),
                Field("INIT", 18, 1, "The engine is clearing its on-chip UPDATE tables "
                      "after reset (two cycles per accumulator entry: it has two "
                      "halves); an UPDATE rung meanwhile waits for it.")],
        doc="Live status of the embedding engine.")
    yield Register(
        "ENG_ERR", 0x430, Kind.W1C, width=3,
        doc="Sticky engine error flags: the engine sets them, software writes 1 to clear.",
        fields=[
            Field("DESC_ERROR", 0, 1, "A descriptor completed with a non-zero status."),
            Field("RING_OVERRUN", 1, 1, "A doorbell put more than 2**ORDER descriptors in "
                  "the ring (ENG_TAIL - ENG_HEAD > 2**ORDER)."),
            Field("PMEM_RESP", 2, 1, "PMEM answered an engine access with SLVERR or DECERR."),
        ])
    first = "of the first failed descriptor since ENG_ERR was last all-zero."
    yield Register(
        "ENG_ERR_SEQ", 0x434, Kind.CAPTURE, armed_by="ENG_ERR",
        doc=f"Descriptor number (`seq`) {first}")
    yield Register(
        "ENG_ERR_INFO", 0x438, Kind.CAPTURE, width=16, armed_by="ENG_ERR",
        fields=[Field("STATUS", 0, 8, "Completion status code (docs/embedding.md)."),
                Field("KIND", 8, 8, "The descriptor's kind byte.")],
        doc=f"Status and kind {first}")
    counters = (
        ("ENG_DESC_DONE", 0x480, "Descriptors completed."),
        ("ENG_LINES_GATHERED", 0x488, "Table lines read by LOOKUPs."),
        ("ENG_BAGS_POOLED", 0x490, "Pooled vectors written by LOOKUPs."),
        ("ENG_UPD_LINES_WRITTEN", 0x498, "Table lines written by UPDATEs (after coalescing)."),
        ("ENG_UPD_ITEMS", 0x4A0, "Gradient lines applied to rows by UPDATEs."),
        ("ENG_BUSY", 0x4A8, "Cycles with a descriptor fetched and not completed."),
        ("ENG_UPD_OVERLAPS", 0x4B0, "UPDATEs whose rows started while the UPDATE before "
         "them was still writing (tables apart: docs/embedding.md)."),
        ("ENG_PMEM_RD_LINES", 0x4B8, "64-byte lines the engine read from device memory "
         "(R beats on its PMEM port: descriptors and buffers there, table rows, undo "
         "log, recovery, MLP slots)."),
        ("ENG_PMEM_WR_LINES", 0x4C0, "64-byte lines the engine wrote to device memory "
         "(W beats on its PMEM port: table rows, undo records, MLP slots, pooled vectors "
         "and completion records there, recovery)."),
    )
    for name, offset, doc in counters:
        yield Register(name, offset, Kind.COUNTER64, clear_by="PERF_CTRL", doc=doc)
    yield Register(
        "ENG_UPD_DISTINCT_ROWS", 0x4C8, Kind.COUNTER64, clear_by="PERF_CTRL", step_width=32,
        doc="Distinct rows written by UPDATEs: the sum of their completion records' "
            "rows_written.")
    yield Register(
        "ENG_UPD_STORE_LINES", 0x4D0, Kind.COUNTER64, clear_by="PERF_CTRL",
        doc="Table lines UPDATEs read from the row store instead of device memory "
            "(docs/embedding.md, \"Row store\"); with ENG_PMEM_RD_UPDATE's row lines they "
            "make every distinct row's lines.")
    yield Register(
        "ENG_UPD_PASSES", 0x4D8, Kind.COUNTER64, clear_by="PERF_CTRL",
        doc="Passes UPDATEs took over the accumulator: one per UPDATE whose rows fit it, "
            "more for a larger one, overflowed passes included (docs/embedding.md, "
            "\"Passes\").")
    # ENG_PMEM_{RD,WR}_LINES split by the engine manager that moved the line
    # (docs/embedding.md, "Counters"): the kinds sum to the totals.
    for offset, name, doc in (
            (0x440, "ENG_PMEM_RD_LOOKUP", "Lines of ENG_PMEM_RD_LINES read by the gather: "
             "table rows of LOOKUPs."),
            (0x448, "ENG_PMEM_RD_UPDATE", "Lines of ENG_PMEM_RD_LINES read by the gradient "
             "feed and the scatter: an UPDATE's gradients (in device memory) and its "
             "distinct rows."),
            (0x450, "ENG_PMEM_RD_CKPT", "Lines of ENG_PMEM_RD_LINES read by the MLP copier "
             "(MLP_CHECKPOINT from device memory) and recovery (undo records are made from "
             "the LOOKUPs' row reads)."),
            (0x458, "ENG_PMEM_RD_OTHER", "Lines of ENG_PMEM_RD_LINES read by the descriptor "
             "fetch and the sequencers (LOOKUP / UPDATE indices, offsets, weights in device "
             "memory)."),
            (0x460, "ENG_PMEM_WR_UPDATE", "Lines of ENG_PMEM_WR_LINES written by the scatter: "
             "an UPDATE's distinct rows."),
            (0x468, "ENG_PMEM_WR_CKPT", "Lines of ENG_PMEM_WR_LINES written by the undo "
             "logger (records), the MLP copier and recovery."),
            (0x470, "ENG_PMEM_WR_OTHER", "Lines of ENG_PMEM_WR_LINES written by the completion: "
             "pooled vectors and completion records in device memory, COMMIT's commit "
             "word.")):
        yield Register(name, offset, Kind.COUNTER64, clear_by="PERF_CTRL", doc=doc)


def _ckpt_registers(config: DeviceConfig) -> Iterable[Register]:
    yield Register(
        "CK_CMD", 0x500, Kind.PULSE, width=1,
        fields=[Field("RECOVER", 0, 1, "Write 1 to run recovery (docs/checkpoint.md). "
                      "Refused (CK_STATUS.REJECTED) unless the engine is idle.")],
        doc="Checkpoint command strobe (reads return 0).")
    yield Register(
        "CK_STATUS", 0x504, Kind.RO, width=15,
        fields=[Field("BUSY", 0, 1, "Recovery is running."),
                Field("DONE", 1, 1, "A recovery has finished since reset."),
                Field("ON", 2, 1, "Checkpointing is on: the last recovery succeeded."),
                Field("RESULT", 4, 2, "Result of the last recovery: 0 OK, 1 NO_SUPERBLOCK, "
                      "2 PMEM_ERROR, 3 BAD_LAYOUT."),
                Field("LOG_FULL", 8, 1, "The undo log is full now."),
                Field("OVERFLOW", 9, 1, "A batch's undo log overflowed and is not committed."),
                Field("REJECTED", 10, 1, "The last RECOVER command came while the engine "
                      "was busy and was ignored."),
                Field("LOG_BUSY", 11, 1, "The logger holds records not yet durable."),
                Field("MLP_BUSY", 12, 1, "An MLP checkpoint copy is running."),
                Field("MLP_ERROR", 13, 1, "The last MLP checkpoint copy got an error "
                      "response; its slot is invalid."),
                Field("MLP_LAG", 14, 1, "The newest valid MLP checkpoint is older than "
                      "CK_COMMITTED - CK_MLP_K.")],
        doc="Checkpoint logger and recovery status.")
    for offset, name, width, doc in (
            (0x508, "CK_COMMITTED", 32, "Last committed batch (0: none)."),
            (0x50C, "CK_EPOCH", 16, "Log epoch (incremented by every recovery)."),
            (0x510, "CK_ROLLED_BACK", 32, "Undo records the last recovery restored."),
            (0x514, "CK_MLP_SLOT", 2, "Newest valid MLP checkpoint slot (3: none): "
             "from the last recovery, then from every copy whose header is durable."),
            (0x518, "CK_MLP_BATCH", 32, "Batch id of the newest valid MLP checkpoint "
             "(0: none)."),
            (0x520, "CK_LOG_SEQ", 32, "Next undo record number."),
            (0x524, "CK_OVERFLOW_BATCH", 32, "The batch whose undo log overflowed.")):
        yield Register(name, offset, Kind.RO, width=width, doc=doc)
    yield Register(
        "CK_MLP_K", 0x51C, Kind.RW, width=16, reset=config.mlp_relax_k,
        doc="MLP checkpoint relaxation K: a COMMIT of batch b waits while a copy runs and "
            "the newest valid MLP checkpoint is older than b - K.")
    yield Register("CK_RECORDS", 0x580, Kind.COUNTER64, clear_by="PERF_CTRL",
                   doc="Undo records made durable.")
    yield Register("CK_UNDO_STALL", 0x588, Kind.COUNTER64, clear_by="PERF_CTRL",
                   doc="Cycles the gather waited for the undo logger.")
    yield Register("CK_MLP_LINES", 0x590, Kind.COUNTER64, clear_by="PERF_CTRL",
                   doc="MLP checkpoint payload lines written.")
    yield Register("CK_MLP_STALL", 0x598, Kind.COUNTER64, clear_by="PERF_CTRL",
                   doc="Cycles a COMMIT waited for an MLP checkpoint copy (relaxation K).")


_DCOH_ERRORS = (
    ("FWD_NOT_IN_FLIGHT", "MemRdFwd / MemWrFwd whose Tag names no DCOH request waiting "
     "for a forward (dropped)."),
    ("FWD_OPCODE", "Forward other than MemRdFwd, the answer to every DCOH request "
     "(dropped)."),
    ("FWD_ADDRESS", "Forward whose address differs from its request's (dropped)."),
    ("ACC_RANGE", "Device access beyond device memory."),
    ("DONE_UNEXPECTED", "Internal: a done for a handle with no access in flight."),
    ("CHK_RANGE", "Host check beyond device memory."),
    ("FLIP_RANGE", "Flip command beyond the bias table."),
    ("FLIP_BUSY", "Flip command while one runs (ignored)."),
    ("FLIP_CONTENDED", "The host touched a page while the flip claimed it (page left in "
     "host bias)."),
    ("HOST_ERROR", "The host answered a DCOH request with GO-Err (H2D Rsp, or H2D Data of "
     "a read): the access completed with an error, without touching memory; a claim's "
     "page left in host bias."),
    ("RSP_UNEXPECTED", "H2D Rsp / H2D Data for a DCOH CQID that does not wait for it "
     "(dropped)."),
)
_CACHE_ERRORS = (
    ("RSP_NOT_IN_FLIGHT", "H2D Rsp naming a CQID with no request in flight (dropped)."),
    ("DATA_NOT_IN_FLIGHT", "H2D Data naming no read in flight (dropped)."),
    ("DATA_DUPLICATE", "Second H2D Data for one read (dropped)."),
    ("RSP_UNEXPECTED", "H2D Rsp the request cannot take (dropped)."),
    ("READ_ERROR", "A read of GPU memory completed with an error."),
    ("WRITE_ERROR", "A write into GPU memory completed with an error."),
    ("SNOOP_RESERVED", "H2D Req with a reserved opcode (answered RspIHitI)."),
)


def _coherence_registers() -> Iterable[Register]:
    yield Register(
        "COH_CTRL", 0x600, Kind.RW, width=5,
        fields=[Field("HDM_D", 0, 1, "Device memory is HDM-D: host requests are checked "
                      "against the bias table, MemRdFwd / MemWrFwd go to the DCOH and every "
                      "engine access is gated by bias. 0 (reset): the DCOH is bypassed, as "
                      "for HDM-H memory the host does not cache."),
                Field("MLP_SRC_HOST", 1, 1, "MLP_CHECKPOINT copies GPU memory (its data_addr "
                      "is a host byte address) with CXL.cache RdCurr."),
                Field("CQ_HOST", 2, 1, "Completion records go to GPU memory at COH_CQ_HOST_BASE "
                      "with CXL.cache ItoMWr instead of device memory at ENG_CQ_BASE, each "
                      "once its descriptor's writes are durable (a record there is a "
                      "completion)."),
                Field("SCRATCH_HOST", 3, 1, "LOOKUP / UPDATE buffer addresses (indices, "
                      "offsets, weights, gradients, pooled output) are offsets into the "
                      "GPU-memory scratch window at COH_SCRATCH_HOST_BASE: read with "
                      "CXL.cache RdCurr, pooled vectors written with ItoMWr."),
                Field("RING_HOST", 4, 1, "The descriptor ring is in GPU memory: "
                      "ENG_RING_BASE is an offset into the scratch window at "
                      "COH_SCRATCH_HOST_BASE and descriptors are read with CXL.cache "
                      "RdCurr (a failed read completes the descriptor with READ_ERROR).")],
        doc="Coherence mode. Change only while the engine and the host's traffic are idle.")
    yield Register(
        "COH_FLIP", 0x604, Kind.PULSE, width=2,
        fields=[Field("START", 0, 1, "Write 1 to flip COH_FLIP_PAGES pages from "
                      "COH_FLIP_FIRST."),
                Field("TO_HOST", 1, 1, "1: to host bias (drains the device's accesses); 0: to "
                      "device bias (claims every line with RdOwnNoData).")],
        doc="Bias flip command (docs/dcoh.md, \"Flip command\"); reads return 0.")
    yield Register("COH_FLIP_FIRST", 0x608, Kind.RW, doc="First page of the flip.")
    yield Register("COH_FLIP_PAGES", 0x60C, Kind.RW, doc="Pages to flip.")
    yield Register(
        "COH_FLIP_STATUS", 0x610, Kind.RO, width=3,
        fields=[Field("BUSY", 0, 1, "A flip (or the bias table's reset sweep) runs."),
                Field("DONE", 1, 1, "The last flip has ended."),
                Field("ERROR", 2, 1, "The last flip ended with an error (COH_DCOH_ERR).")],
        doc="Flip command status.")
    first = ("of the first error since the W1C register was last all-zero (the block "
             "keeps it; meaningful while that register is non-zero).")
    for base, name, kinds, what in ((0x620, "COH_DCOH_ERR", _DCOH_ERRORS, "DCOH"),
                                    (0x630, "COH_CACHE_ERR", _CACHE_ERRORS,
                                     "CXL.cache agent")):
        yield Register(
            name, base, Kind.W1C, width=len(kinds),
            fields=[Field(k, i, 1, d) for i, (k, d) in enumerate(kinds)],
            doc=f"Sticky {what} error flags (write 1 to clear).")
        yield Register(
            f"{name}_INFO", base + 4, Kind.RO,
            fields=[Field("CODE", 0, 4, "Error kind (bit number above)."),
                    Field("OPCODE", 4, 5, "Opcode of the message (M2S Req for the DCOH's "
                          "forward kinds, H2D Rsp for its H2D kinds and for the agent; 0 for "
                          "H2D Data)."),
                    Field("ID", 16, 16, "CQID / UQID / handle of the message.")],
            doc=f"Kind, opcode and ID {first}")
        if kinds is _DCOH_ERRORS:
            yield Register(f"{name}_ADDR_LO", base + 8, Kind.RO,
                           doc=f"Line address bits [31:0] {first}")
            yield Register(f"{name}_ADDR_HI", base + 12, Kind.RO, width=14,
                           doc=f"Line address bits [45:32] {first}")
    yield Register(
        "COH_CQ_HOST_BASE_LO", 0x640, Kind.RW, writable_mask=((1 << DATA_WIDTH) - 1) & ~0x3F,
        doc="GPU-memory byte address of the completion-record array with COH_CTRL.CQ_HOST, "
            "bits [31:6] (bits [5:0] read 0).")
    yield Register("COH_CQ_HOST_BASE_HI", 0x644, Kind.RW, width=HOST_ADDR_BITS - DATA_WIDTH,
                   doc="Bits [51:32] of the GPU-memory completion-record array.")
    yield Register(
        "COH_SCRATCH_HOST_BASE_LO", 0x648, Kind.RW,
        writable_mask=((1 << DATA_WIDTH) - 1) & ~0x3F,
        doc="GPU-memory byte address of the scratch window with COH_CTRL.SCRATCH_HOST, "
            "bits [31:6] (bits [5:0] read 0).")
    yield Register("COH_SCRATCH_HOST_BASE_HI", 0x64C, Kind.RW,
                   width=HOST_ADDR_BITS - DATA_WIDTH,
                   doc="Bits [51:32] of the GPU-memory scratch window.")
    counters = (
        ("COH_GRANTS_DEVICE", 0x680, "Engine line accesses granted in device bias."),
        ("COH_GRANTS_HOST", 0x688, "Engine line accesses granted in host bias (after the "
         "host's forward)."),
        ("COH_HOST_FLIPS", 0x690, "Host requests that set a device-bias page to host bias."),
        ("COH_RD_LINES", 0x698, "Lines read from GPU memory (RdCurr)."),
        ("COH_WR_LINES", 0x6A0, "Lines written into GPU memory (ItoMWr)."),
    )
    for name, offset, doc in counters:
        yield Register(name, offset, Kind.COUNTER64, clear_by="PERF_CTRL", doc=doc)


def register_map(config: DeviceConfig) -> RegisterMap:
    """The device's registers for ``config``.

    Offsets and kinds are the same for every configuration; only the reset values (the
    capability constants and the HDM decoder's reset window) depend on it.
    """
    if not isinstance(config, DeviceConfig):
        raise TypeError(f"config must be a DeviceConfig, not {config!r}")
    regs = [
        Register("ID", 0x000, Kind.CONST, reset=ID_VALUE,
                 doc='Device identification: "TCXL" in ASCII.'),
        Register("VERSION", 0x004, Kind.CONST,
                 reset=(VERSION_MAJOR << 16) | VERSION_MINOR,
                 fields=[Field("MINOR", 0, 16, "Minor version: compatible additions."),
                         Field("MAJOR", 16, 16, "Major version: incompatible changes.")],
                 doc="Register map version."),
        *_capability_registers(config),
        *_hdm_registers(config),
        Register("STATUS", 0x180, Kind.RO, width=18,
                 fields=[Field("OCCUPANCY", 0, 16, "CXL.mem requests in flight."),
                         Field("DEV_LOAD", 16, 2, "DevLoad reported in S2M messages "
                               "(0 light, 1 optimal, 2 moderate, 3 severe overload).")],
                 doc="Live status of the memory endpoint."),
        *_error_registers(),
        *_perf_registers(),
        *_engine_registers(),
        *_ckpt_registers(config),
        *_coherence_registers(),
    ]
    return RegisterMap(regs, addr_width=config.csr_addr_width, name=config.tag)
