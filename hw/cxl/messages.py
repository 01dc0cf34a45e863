"""CXL 2.0 transaction-layer message layouts and opcodes for all ten channels.

Field widths and encodings are those of the CXL 2.0 transaction layer in the 68B flit
(CXL 2.0 §3.2.3 CXL.cache, §3.3 CXL.mem); each layout's docstring names the
specification table it encodes. ``docs/cxl-encodings.md`` lists every field, width and
opcode with its CXL 1.1 / 2.0 / 3.1 section and table, and what the RTL does with it.

Conventions
-----------
* The specification's ``Valid`` bit is the stream's ``valid``: layouts hold every other
  field, so ``layout.size + 1`` is the specification's message size.
* Fields are packed LSB first in the specification's order, so a payload packed here is
  the flit field sequence with ``Valid`` removed.
* Opcode fields are plain unsigned integers, not enum-typed, because a device must be
  able to receive (and reject) reserved encodings; compare them with the enums below
  (``p.opcode == M2SReqOpcode.MemRd``).
* Data-carrying channels append the 64-byte line (``data``, 512 bits); M2S RwD also
  appends the 64 byte enables of MemWrPtl (``byte_enable``).

:class:`Codec` packs and unpacks these layouts to Python integers for test benches,
models and docs, so one definition serves RTL and verification.
"""

from __future__ import annotations

from amaranth.lib import data, enum

from ..config import LINE_BITS

__all__ = [
    "CHANNELS",
    "LINE_ADDR_BITS",
    "LINE_BITS",
    "REFERENCE_BITS",
    "S2MDRS",
    "S2MNDR",
    "Codec",
    "D2HData",
    "D2HReq",
    "D2HReqOpcode",
    "D2HRsp",
    "D2HRspOpcode",
    "DRSOpcode",
    "DevLoad",
    "GoState",
    "H2DData",
    "H2DReq",
    "H2DReqOpcode",
    "H2DRsp",
    "H2DRspOpcode",
    "M2SReq",
    "M2SReqOpcode",
    "M2SRwD",
    "M2SRwDOpcode",
    "MetaField",
    "MetaValue",
    "NDROpcode",
    "RspPre",
    "SnpType",
]

#: Width of a line address: Addr[51:6], the line address (host; also the widest device
#: line, an offset in the HDM). ``LINE_BITS``, the line's 512 data bits, is
#: ``hw.config``'s, re-exported here.
LINE_ADDR_BITS = 46


# --- CXL.mem encodings (CXL 2.0 §3.3; docs/cxl-encodings.md) --------------------------

class M2SReqOpcode(enum.Enum, shape=4):
    """M2S Req MemOpcode. Every other 4-bit value is reserved."""
    MemInv = 0b0000
    MemRd = 0b0001
    MemRdData = 0b0010
    MemRdFwd = 0b0011
    MemWrFwd = 0b0100
    MemSpecRd = 0b1000
    MemInvNT = 0b1001
    MemClnEvct = 0b1010


class M2SRwDOpcode(enum.Enum, shape=4):
    """M2S RwD opcode (BIConflict per Linux and most sources: 0100)."""
    MemWr = 0b0001
    MemWrPtl = 0b0010
    BIConflict = 0b0100


class SnpType(enum.Enum, shape=3):
    NoOp = 0b000
    SnpData = 0b001
    SnpCur = 0b010
    SnpInv = 0b011


class MetaField(enum.Enum, shape=2):
    Meta0State = 0b00
    NoOp = 0b11


class MetaValue(enum.Enum, shape=2):
    Invalid = 0b00
    Any = 0b10
    Shared = 0b11


class NDROpcode(enum.Enum, shape=3):
    Cmp = 0b000
    CmpS = 0b001
    CmpE = 0b010
    BIConflictAck = 0b100


class DRSOpcode(enum.Enum, shape=3):
    MemData = 0b000
    MemDataNXM = 0b001


class DevLoad(enum.Enum, shape=2):
    Light = 0b00
    Optimal = 0b01
    ModerateOverload = 0b10
    SevereOverload = 0b11


# --- CXL.cache encodings (CXL 2.0 §3.2; docs/cxl-encodings.md) ------------------------

class D2HReqOpcode(enum.Enum, shape=5):
    RdCurr = 0b00001
    RdOwn = 0b00010
    RdShared = 0b00011
    RdAny = 0b00100
    RdOwnNoData = 0b00101
    ItoMWr = 0b00110
    WrCur = 0b00111
    CLFlush = 0b01000
    CleanEvict = 0b01001
    DirtyEvict = 0b01010
    CleanEvictNoData = 0b01011
    WOWrInv = 0b01100
    WOWrInvF = 0b01101
    WrInv = 0b01110
    CacheFlushed = 0b10000


class D2HRspOpcode(enum.Enum, shape=5):
    RspSHitSE = 0b00001
    RspIHitI = 0b00100
    RspIHitSE = 0b00101
    RspVHitV = 0b00110
    RspSFwdM = 0b00111
    RspIFwdM = 0b01111
    RspVFwdV = 0b10110


class H2DReqOpcode(enum.Enum, shape=3):
    SnpData = 0b001
    SnpInv = 0b010
    SnpCur = 0b011


class H2DRspOpcode(enum.Enum, shape=4):
    WritePull = 0b0001
    GO = 0b0100
    GO_WritePull = 0b0101
    ExtCmp = 0b0110
    GO_WritePull_Drop = 0b1000
    Fast_GO = 0b1100
    Fast_GO_WritePull = 0b1101
    GO_ERR_WritePull = 0b1111


class GoState(enum.Enum, shape=12):
    """Cache state granted by GO, carried in H2D Rsp ``rsp_data``."""
    S = 0b0001
    E = 0b0010
    I = 0b0011  # noqa: E741 (the MESI state's name)
    Error = 0b0100
    M = 0b0110


class RspPre(enum.Enum, shape=2):
    LocalMiss = 0b00
    Hit = 0b01
    RemoteMiss = 0b10


# --- Layouts -------------------------------------------------------------------------

M2SReq = data.StructLayout({
    "opcode": 4,        # M2SReqOpcode
    "snp_type": 3,      # SnpType
    "meta_field": 2,    # MetaField
    "meta_value": 2,    # MetaValue
    "tag": 16,
    "address": 47,      # Addr[51:5]; the line address Addr[51:6] is address[1:]
    "tc": 2,
    "ld_id": 4,
    "rsvd": 6,
})
"""M2S Req, 87 bits in the 68B flit (CXL 1.1 Table 21, CXL 3.1 Table 3-34)."""

M2SRwD = data.StructLayout({
    "opcode": 4,        # M2SRwDOpcode
    "snp_type": 3,
    "meta_field": 2,
    "meta_value": 2,
    "tag": 16,
    "address": LINE_ADDR_BITS,  # Addr[51:6], the line address
    "poison": 1,
    "tc": 2,
    "ld_id": 4,
    "rsvd": 6,
    "data": LINE_BITS,
    "byte_enable": LINE_BITS // 8,  # MemWrPtl only; ignored (all ones) for MemWr
})
"""M2S RwD, 87-bit header + 64-byte data (CXL 1.1 Table 27, CXL 3.1 Table 3-40), plus
MemWrPtl's 64 byte enables."""

S2MNDR = data.StructLayout({
    "opcode": 3,        # NDROpcode
    "meta_field": 2,
    "meta_value": 2,
    "tag": 16,
    "ld_id": 4,
    "dev_load": 2,      # DevLoad
})
"""S2M NDR, 30 bits (CXL 1.1 Table 30, CXL 3.1 Table 3-49)."""

S2MDRS = data.StructLayout({
    "opcode": 3,        # DRSOpcode
    "meta_field": 2,
    "meta_value": 2,
    "tag": 16,
    "poison": 1,
    "ld_id": 4,
    "dev_load": 2,
    "rsvd": 9,
    "data": LINE_BITS,
})
"""S2M DRS, 40-bit header + 64-byte data (CXL 1.1 Table 32, CXL 3.1 Table 3-52)."""

D2HReq = data.StructLayout({
    "opcode": 5,        # D2HReqOpcode
    "cqid": 12,
    "nt": 1,
    "rsvd0": 7,
    "address": LINE_ADDR_BITS,  # Addr[51:6]
    "rsvd1": 7,
})
"""D2H Req, 79 bits (CXL 1.1 Table 6, CXL 3.1 Table 3-13)."""

D2HRsp = data.StructLayout({
    "opcode": 5,        # D2HRspOpcode
    "uqid": 12,
    "rsvd": 2,
})
"""D2H Rsp, 20 bits (CXL 1.1 Table 8, CXL 3.1 Table 3-15)."""

D2HData = data.StructLayout({
    "uqid": 12,
    "chunk_valid": 1,
    "bogus": 1,
    "poison": 1,
    "rsvd": 1,
    "data": LINE_BITS,
})
"""D2H Data, 17-bit header + 64-byte data (CXL 1.1 Table 9, CXL 3.1 Table 3-16)."""

H2DReq = data.StructLayout({
    "opcode": 3,        # H2DReqOpcode
    "address": LINE_ADDR_BITS,  # Addr[51:6]
    "uqid": 12,
    "rsvd": 2,
})
"""H2D Req, 64 bits (CXL 1.1 Table 10, CXL 3.1 Table 3-17)."""

H2DRsp = data.StructLayout({
    "opcode": 4,        # H2DRspOpcode
    "rsp_data": 12,     # GoState for GO messages
    "rsp_pre": 2,       # RspPre
    "cqid": 12,
    "rsvd": 1,
})
"""H2D Rsp, 32 bits (CXL 1.1 Table 11, CXL 3.1 Table 3-18)."""

H2DData = data.StructLayout({
    "cqid": 12,
    "chunk_valid": 1,
    "poison": 1,
    "go_err": 1,
    "rsvd": 8,
    "data": LINE_BITS,
})
"""H2D Data, 24-bit header + 64-byte data (CXL 1.1 Table 14, CXL 3.1 Table 3-21)."""

#: The ten channels (``docs/cxl-encodings.md``), by name.
CHANNELS: dict[str, data.StructLayout] = {
    "m2s_req": M2SReq, "m2s_rwd": M2SRwD, "s2m_ndr": S2MNDR, "s2m_drs": S2MDRS,
    "d2h_req": D2HReq, "d2h_rsp": D2HRsp, "d2h_data": D2HData,
    "h2d_req": H2DReq, "h2d_rsp": H2DRsp, "h2d_data": H2DData,
}

#: Header sizes in bits as the specification states them (68B flit), Valid included, data
#: excluded.
REFERENCE_BITS: dict[str, int] = {
    "m2s_req": 87, "m2s_rwd": 87, "s2m_ndr": 30, "s2m_drs": 40,
    "d2h_req": 79, "d2h_rsp": 20, "d2h_data": 17,
    "h2d_req": 64, "h2d_rsp": 32, "h2d_data": 24,
}


class Codec:
    """Packs a flat :class:`~amaranth.lib.data.StructLayout` to and from a Python int.

    Used by test benches in hot loops, so it precomputes offsets and masks instead of
    going through ``layout.const``. Fields missing from :meth:`pack`'s arguments are zero;
    a value too wide for its field raises :class:`ValueError` naming the field.
    """

    def __init__(self, layout: data.StructLayout):
        self.layout = layout
        self.fields: list[tuple[str, int, int]] = []
        for name, field in layout:
            width = field.width
            self.fields.append((name, field.offset, width))
        self._by_name = {name: (offset, (1 << width) - 1) for name, offset, width in self.fields}
        self.width = layout.size

    def pack(self, **values: int) -> int:
        word = 0
        for name, value in values.items():
            try:
                offset, mask = self._by_name[name]
            except KeyError:
                raise ValueError(f"{name!r} is not a field of this layout") from None
            value = int(value)
            if value & ~mask:
                raise ValueError(f"value {value:#x} does not fit field {name!r} "
                                 f"({mask.bit_length()} bits)")
            word |= value << offset
        return word

    def unpack(self, word: int) -> dict[str, int]:
        return {name: (word >> offset) & ((1 << width) - 1) for name, offset, width in self.fields}

    def get(self, word: int, name: str) -> int:
        offset, mask = self._by_name[name]
        return (word >> offset) & mask
