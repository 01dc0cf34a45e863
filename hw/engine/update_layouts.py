"""Layouts and constants shared by UPDATE's blocks
(:class:`~.coalesced_update.CoalescedUpdate` and its feeder)."""

from amaranth.hdl import Mux
from amaranth.lib import data

from ..config import LINE_BITS

__all__ = ["DIM_BITS", "DONE", "ITEM", "LINE_BITS", "LINE_ELEMS", "ctrl_layout",
           "items_per_row"]

#: fp32 elements of a line.
LINE_ELEMS = LINE_BITS // 32
#: Width of ``dim`` in ``i_ctrl`` (1..4096).
DIM_BITS = 13

#: One gradient line of one counted index (see :class:`~.coalesced_update.CoalescedUpdate`
#: for bf16 tables).
ITEM = data.StructLayout({
    "row": 32,          # table row (already validated: < rows)
    "line": 7,          # gradient line: table line for fp32, 2*table line + half for bf16
    "weight": 32,       # fp32 per-sample weight, used when ``weighted``
    "grad": LINE_BITS,  # 16 fp32 gradient elements
    "last": 1,          # final item of the descriptor: apply the sums and complete
    "nop": 1,           # carries no update (with ``last``: only apply and complete)
    "bad": 1,           # a read of the descriptor's buffers has failed: write nothing
})

#: Completion of one descriptor: distinct rows written, counted indices, whether the
#: descriptor had more distinct rows than the accumulator holds, and whether an item
#: came ``bad`` (in both cases nothing was written); with ``overflow``, the counted
#: indices before the first one whose row did not fit (``overflow_at``, else 0).
DONE = data.StructLayout({"rows_written": 32, "updates": 32, "overflow": 1,
                          "read_error": 1, "overflow_at": 32})


def ctrl_layout(addr_width: int) -> data.StructLayout:
    """Per-descriptor settings (``i_ctrl``)."""
    return data.StructLayout({
        "table_base": addr_width,   # byte address of row 0, 64-byte aligned
        "lines_per_row": 7,         # table lines per row, 1..max_lines_per_row
        "bf16": 1,                  # table elements are bf16 (else fp32)
        "weighted": 1,              # multiply the gradient by the item's weight
        "dim": DIM_BITS,            # elements per row: later (padding) elements are kept
    })


def items_per_row(c):
    """Gradient items (units) per row of a descriptor of settings ``c`` (a
    :func:`ctrl_layout` view): one per table line, two per bf16 table line."""
    return Mux(c.bf16, c.lines_per_row << 1, c.lines_per_row)
