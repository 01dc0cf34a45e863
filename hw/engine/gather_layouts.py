"""Payloads of LOOKUP's row gather (:class:`~.row_gather.RowGather`) and of the streams
between its parts."""

from amaranth.lib import data

from .pool_reduce import CTRL, LINE_BITS

__all__ = ["LINE_SHIFT", "ROW", "ROW_META", "UNDO", "alloc_layout", "ar_layout",
           "beat_layout", "ctrl_layout", "rows_layout"]

#: Bytes of a line, log2.
LINE_SHIFT = 6

#: One counted row of a bag in index order, or a lone empty bag.
ROW = data.StructLayout({
    "row": 32,              # table row (validated upstream)
    "row_k": 16,            # index of the row among the bag's counted rows
    "last_row": 1,          # row_k == count - 1
    "weight": 32,           # fp32 per-sample weight (carried, not used)
    "empty_bag": 1,         # a bag with no counted row: no read, one LINE item
    "count": 16,            # the bag's counted rows
    "bad": 1,               # a read of the descriptor's buffers has failed so far
})

#: One line read, as the undo log wants it.
UNDO = data.StructLayout({
    "batch_id": 32,
    "table_id": 16,
    "row": 32,
    "line": 8,
    "data": LINE_BITS,
    "row_addr": 48,         # device byte address of the row's first line
    "n_lines": 8,           # lines of the row (the row's items are consecutive)
})


def ctrl_layout(addr_width: int) -> data.StructLayout:
    """Per-descriptor settings of :class:`~.row_gather.RowGather` for a PMEM of
    ``addr_width`` bits."""
    return data.StructLayout({
        "table_base": addr_width,   # byte address of row 0, 64-byte aligned
        "lines_per_row": 9,         # 1..max_lines_per_row
        "batch_id": 32,
        "table_id": 16,
        "capture": 1,               # offer every line read on o_undo
        "pool": CTRL,               # carried to every o_lines item as ``ctrl``
    })


def rows_layout(addr_width: int) -> data.StructLayout:
    """A row with the settings its consumers need: the gather's (``gather``,
    :func:`ctrl_layout`) and whether the row is an UPDATE's (``update``). The bag
    sequencers produce it; :class:`~.row_gather.RowGather` takes it."""
    return data.StructLayout({"row": ROW, "gather": ctrl_layout(addr_width), "update": 1})


#: What the line emitter needs of a row, queued in index order when the row is accepted.
ROW_META = data.StructLayout({
    "row": 32, "row_k": 16, "last_row": 1, "weight": 32, "empty_bag": 1, "count": 16,
    "last_line": 8,         # lines of the row - 1 (0 for an empty bag)
    "batch_id": 32, "table_id": 16, "capture": 1, "pool": CTRL, "update": 1,
    "row_addr": 48,
})


def ar_layout(addr_width: int, id_bits: int) -> data.StructLayout:
    """An AXI read burst of 64-byte beats: ID, byte address and beats - 1."""
    return data.StructLayout({"id": id_bits, "addr": addr_width, "len": 8})


def alloc_layout(slot_bits: int, id_bits: int) -> data.StructLayout:
    """Reorder-buffer lines allocated to a burst: its first line and its ID, or one
    line of an empty bag (``empty``), which is present at once."""
    return data.StructLayout({"line": slot_bits, "id": id_bits, "empty": 1})


def beat_layout(id_bits: int) -> data.StructLayout:
    """An AXI read beat of one line."""
    return data.StructLayout({"id": id_bits, "data": LINE_BITS, "resp": 2, "last": 1})
