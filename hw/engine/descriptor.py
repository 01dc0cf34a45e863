"""The 64-byte embedding-engine descriptor, its encodings and the completion status codes.

Layout, encodings and status codes are those of ``docs/embedding.md`` ("Descriptors"
and "Status codes"). As in :mod:`hw.cxl.messages`, the ``kind`` and ``mode`` fields are
plain unsigned integers rather than enum-typed, because the engine must receive (and
reject with ``BAD_KIND`` / ``UNSUPPORTED``) encodings that no enum member names; compare
them with the enums (``d.kind == DescKind.LOOKUP``).

:func:`pack_descriptor` and :func:`unpack_descriptor` convert between the 64 little-endian
bytes the host writes into the ring and a dict of field values, through
:class:`~hw.cxl.messages.Codec`, so the one layout below serves RTL, models and test
benches.
"""

from __future__ import annotations

from amaranth.lib import data, enum

from hw.cxl.messages import Codec

__all__ = [
    "ADDR_BITS", "CODEC", "DESC_BYTES", "MAX_DIM", "DescKind", "Descriptor", "PoolMode",
    "Status", "pack_descriptor", "unpack_descriptor",
]

#: Bytes per descriptor (one CXL line).
DESC_BYTES = 64
#: Largest ``dim`` the engine accepts (elements per row).
MAX_DIM = 4096
#: Width of every device byte address in a descriptor.
ADDR_BITS = 48


class DescKind(enum.Enum, shape=8):
    """Descriptor ``kind`` (bits 7:0). Every other value is answered with ``BAD_KIND``."""
    NOP = 0
    LOOKUP = 1
    UPDATE = 2
    COMMIT = 3
    MLP_CHECKPOINT = 4
    FENCE = 5


class PoolMode(enum.Enum, shape=2):
    """Pooling ``mode`` (bits 9:8). The value 3 is answered with ``UNSUPPORTED``."""
    SUM = 0
    MEAN = 1
    MAX = 2


class Status(enum.Enum, shape=8):
    """Completion status; when several checks fail, the lowest-numbered is reported
    (the checks are made in code order)."""
    OK = 0
    BAD_KIND = 1
    UNSUPPORTED = 2
    MISALIGNED = 3
    ADDR_RANGE = 4
    BAD_OFFSETS = 5
    INDEX_RANGE = 6
    LOG_FULL = 7        # UPDATE of a batch whose undo log overflowed (docs/checkpoint.md)
    BAD_BATCH = 8       # UPDATE / COMMIT out of batch order (docs/checkpoint.md)
    READ_ERROR = 9      # a read of the descriptor's buffers failed; no table changed


Descriptor = data.StructLayout({
    "kind": 8,                  # DescKind
    "mode": 2,                  # PoolMode
    "weighted": 1,
    "has_padding_idx": 1,
    "include_last_offset": 1,
    "capture_undo": 1,
    "bf16": 1,
    "rsvd_flag": 1,             # reserved, must be 0
    "table_id": 16,
    "batch_id": 32,
    "table_base": ADDR_BITS,
    "dim": 16,
    "rows": 32,
    "padding_idx": 32,          # compared with the int32 indices as a 32-bit pattern
    "num_bags": 32,
    "num_indices": 32,
    "indices_addr": ADDR_BITS,
    "offsets_addr": ADDR_BITS,
    "weights_addr": ADDR_BITS,
    "data_addr": ADDR_BITS,     # LOOKUP: pooled output; UPDATE: gradients
    "cookie": 64,
})
"""The 512-bit descriptor of ``docs/embedding.md``, fields LSB first."""

#: Packs :data:`Descriptor` to and from Python integers.
CODEC = Codec(Descriptor)


def pack_descriptor(**fields: int) -> bytes:
    """The 64 little-endian bytes of a descriptor; missing fields are zero.

    Values may be ints, bools or members of :class:`DescKind` / :class:`PoolMode`.

    Raises
    ------
    ValueError
        A name that is not a field, or a value that does not fit its field.
    """
    values = {name: value.value if isinstance(value, enum.Enum) else value
              for name, value in fields.items()}
    return CODEC.pack(**values).to_bytes(DESC_BYTES, "little")


def unpack_descriptor(raw: bytes) -> dict[str, int]:
    """Every field of a descriptor given as 64 little-endian bytes, as unsigned ints.

    Raises
    ------
    ValueError
        ``raw`` is not 64 bytes long.
    """
    if len(raw) != DESC_BYTES:
        raise ValueError(f"a descriptor is {DESC_BYTES} bytes, not {len(raw)}")
    return CODEC.unpack(int.from_bytes(raw, "little"))
