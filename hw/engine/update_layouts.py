"""Layouts, constants and the parameter check shared by UPDATE's scatter blocks
(:class:`~.scatter_update.ScatterUpdate` and its parts)."""

from amaranth.lib import data

__all__ = ["DIM_BITS", "DONE", "EVICTED_BITS", "GLINE", "ITEM", "LINE_BITS", "LINE_ELEMS",
           "TAG", "check_cache_rows", "check_int", "ctrl_layout"]

#: Bits of a table / gradient line.
LINE_BITS = 512
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


def check_int(name: str, value, lo: int, hi: int) -> int:
    """``value`` if it is an integer from ``lo`` to ``hi``, else a ValueError naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer from {lo} to {hi}, not {value!r}")
    return value


def check_cache_rows(cache_rows) -> int:
    """``cache_rows`` if it is a power of two from 2 to 256, else a ValueError."""
    check_int("cache_rows", cache_rows, 2, 256)
    if cache_rows & (cache_rows - 1):
        raise ValueError(f"cache_rows must be a power of two, not {cache_rows}")
    return cache_rows
