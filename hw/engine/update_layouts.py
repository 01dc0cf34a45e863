"""Layouts, constants and the parameter check shared by UPDATE's scatter blocks
(:class:`~.scatter_update.ScatterUpdate` and its parts)."""

from amaranth.lib import data

from ..config import LINE_BITS
from ..widths import check_pow2

__all__ = ["DIM_BITS", "DONE", "EVICTED_BITS", "GLINE", "ITEM", "LINE_BITS", "LINE_ELEMS",
           "TAG", "check_cache_rows", "ctrl_layout"]

#: fp32 elements of a line.
LINE_ELEMS = LINE_BITS // 32
#: Width of ``dim`` in ``i_ctrl`` (1..4096).
DIM_BITS = 13

#: One gradient line of one counted index (see :class:`~.scatter_update.ScatterUpdate`
#: for bf16 tables).
ITEM = data.StructLayout({
    "row": 32,          # table row (already validated: < rows)
    "line": 7,          # gradient line: table line for fp32, 2*table line + half for bf16
    "weight": 32,       # fp32 per-sample weight, used when ``weighted``
    "grad": LINE_BITS,  # 16 fp32 gradient elements
    "last": 1,          # final item of the descriptor: flush and complete
    "nop": 1,           # carries no update (with ``last``: only flush and complete)
})

#: Completion of one descriptor.
DONE = data.StructLayout({"rows_written": 32, "updates": 32})

#: One line of a row as read ahead by the gather (``i_lines``).
GLINE = data.StructLayout({"data": LINE_BITS})

#: Bits of the evicted-row marks, indexed by a row's low bits.
EVICTED_BITS = 256

#: A cache slot's tag: the row it holds, if ``valid``.
TAG = data.StructLayout({"row": 32, "valid": 1})


def ctrl_layout(addr_width: int) -> data.StructLayout:
    """Per-descriptor settings (``i_ctrl``)."""
    return data.StructLayout({
        "table_base": addr_width,   # byte address of row 0, 64-byte aligned
        "lines_per_row": 7,         # table lines per row, 1..max_lines_per_row
        "bf16": 1,                  # table elements are bf16 (else fp32)
        "weighted": 1,              # multiply the gradient by the item's weight
        "dim": DIM_BITS,            # elements per row: later (padding) elements are kept
    })


def check_cache_rows(cache_rows) -> int:
    """``cache_rows`` if it is a power of two from 2 to 256, else a ValueError."""
    return check_pow2("cache_rows", cache_rows, 2, 256)
