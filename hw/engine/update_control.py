"""UPDATE's cache control: the tags, the hit / miss decision, and the order of hits,
evictions, fills and the flush.

See :class:`UpdateControl`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.widths import check_int

from .cache_flush import CacheFlush
from .row_fill import fill_request
from .row_writeback import writeback_request
from .update_layouts import (
    DONE,
    EVICTED_BITS,
    ITEM,
    TAG,
    check_cache_rows,
    ctrl_layout,
)
from .update_pipeline import update_op

__all__ = ["UpdateControl"]

_EVICTED_ROW_BITS = (EVICTED_BITS - 1).bit_length()


class UpdateControl(wiring.Component):
    """Decides, item by item, whether UPDATE's direct-mapped cache holds the item's row,
    and orders the hits, the evictions and fills of misses and the final flush.

    **Items.** An item taken from ``i_items`` (with ``i_ctrl`` sampled alongside) is
    held in a check stage while its slot's tag (``row mod cache_rows``, a synchronous
    read) is compared. A hit is offered on ``o_op``; the check stage takes the next item
    in the cycle the op is taken, unless the item is ``last``. A miss waits until no op
    of its slot is in the update pipeline (``op_slot_busy``) and, for a fill from PMEM,
    until no B is owed (``b_owed``; from the read-ahead lines, until fewer than a
    cache's worth are owed: ``b_owed_full``), then requests the slot's write-back on
    ``o_writeback`` if the slot holds a row (marking its low 8 bits in the evicted-row
    mask) and, once that is over (``writeback_busy`` low), the fill on ``o_fill``; after
    ``filled`` the tag is written and re-read (one cycle) and the item hits. The first
    item of an index (``line`` 0) accounts for its row's read-ahead lines once: a hit
    drops them, a miss fills from them unless the row is marked evicted, then drops
    them (``o_drop``). Every request is offered for one cycle in a state where its
    consumer is idle and ready.

    **Flush.** After ``last`` (or a ``nop`` + ``last`` item) and once the pipeline is
    empty and no read-ahead line is left to drop, the slots that were filled are
    visited lowest first; each one whose tag is valid is invalidated and written back.
    Once no B is owed, ``o_done`` (a register, held until taken) reports the write-backs
    and the counted indices (items with ``line`` 0) of the descriptor, and the
    evicted-row mask is cleared.

    **Reset.** The tags are invalidated for ``cache_rows`` cycles (``i_items.ready``
    low); reset drops the descriptor in progress.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address width, 12 to 64.
    cache_rows : int
        Slots of the cache, a power of two from 2 to 256.
    max_lines_per_row : int
        Lines of a slot, 1 to 64.

    Members
    -------
    i_items : ``In(stream.Signature(ITEM))``, i_ctrl : ``In(ctrl_layout(addr_width))``
    o_done : ``Out(stream.Signature(DONE))``
    ctrl : ``Out(ctrl_layout(addr_width))``
        The settings taken with the latest item.
    o_op : ``Out(stream.Signature(update_op(cache_rows, max_lines_per_row)))``
    op_slot_busy, pipeline_busy : ``In(1)``
    o_writeback : ``Out(stream.Signature(writeback_request(cache_rows)))``
    writeback_busy, b_owed, b_owed_full : ``In(1)``
    o_fill : ``Out(stream.Signature(fill_request(cache_rows)))``
    o_drop : ``Out(stream.Signature(7))``
    filled, drop_pending : ``In(1)``

    Raises
    ------
    ValueError
        A parameter out of range, naming it and its value.
    """

    def __init__(self, *, addr_width: int, cache_rows: int, max_lines_per_row: int):
        self._addr_width = check_int("addr_width", addr_width, 12, 64)
        self._cache_rows = check_cache_rows(cache_rows)
        self._max_lines_per_row = check_int("max_lines_per_row", max_lines_per_row, 1, 64)
        super().__init__({
            "i_items": In(stream.Signature(ITEM)),
            "i_ctrl": In(ctrl_layout(addr_width)),
            "o_done": Out(stream.Signature(DONE)),
            "ctrl": Out(ctrl_layout(addr_width)),
            "o_op": Out(stream.Signature(update_op(cache_rows, max_lines_per_row))),
            "op_slot_busy": In(1),
            "pipeline_busy": In(1),
            "o_writeback": Out(stream.Signature(writeback_request(cache_rows))),
            "writeback_busy": In(1),
            "b_owed": In(1),
            "b_owed_full": In(1),
            "o_fill": Out(stream.Signature(fill_request(cache_rows))),
            "o_drop": Out(stream.Signature(7)),
            "filled": In(1),
            "drop_pending": In(1),
        })

    addr_width = property(lambda self: self._addr_width)
    cache_rows = property(lambda self: self._cache_rows)
    max_lines_per_row = property(lambda self: self._max_lines_per_row)

    def elaborate(self, platform):
        m = Module()
        items = self.i_items
        m.submodules.tags = tags = Memory(shape=TAG, depth=self._cache_rows, init=[])
        tag_rd = tags.read_port(transparent_for=())
        tag_wr = tags.write_port()
        tag = data.View(TAG, tag_rd.data)
        m.submodules.flush = flush = CacheFlush(cache_rows=self._cache_rows)
        wiring.connect(m, flush.o_done, wiring.flipped(self.o_done))

        item = Signal(ITEM, reset_less=True)    # the check stage's item
        ctrl = Signal(ctrl_layout(self._addr_width), reset_less=True)
        checking = Signal()                     # the check stage holds an item
        slot = Signal(range(self._cache_rows))  # the item's slot
        accounted = Signal()                # its index's read-ahead lines taken or dropped
        fill_from_lines = Signal()          # the fill after the write-back takes them
        evicted = Signal(EVICTED_BITS)      # rows written back by this descriptor (hashed)

        hit = tag.valid & (tag.row == item.row)
        first_line = ~item.line.any()
        from_lines = first_line & ~accounted & ~evicted.bit_select(
            item.row[:_EVICTED_ROW_BITS], 1)
        lines = ctrl.lines_per_row
        m.d.comb += [
            self.ctrl.eq(ctrl),
            self.o_op.p.slot.eq(slot),
            self.o_op.p.line.eq(item.line),
            self.o_op.p.bf16.eq(ctrl.bf16),
            self.o_op.p.weighted.eq(ctrl.weighted),
            self.o_op.p.dim.eq(ctrl.dim),
            self.o_op.p.weight.eq(item.weight),
            self.o_op.p.grad.eq(item.grad),
            self.o_drop.p.eq(lines),
            self.o_writeback.p.slot.eq(slot), self.o_writeback.p.row.eq(tag.row),
            self.o_fill.p.slot.eq(slot), self.o_fill.p.row.eq(item.row),
            self.o_fill.p.lines.eq(lines), self.o_fill.p.from_lines.eq(
                Mux(accounted, fill_from_lines, from_lines)),  # after an eviction: decided
            tag_rd.addr.eq(slot),
            tag_wr.addr.eq(slot),
            flush.mark_slot.eq(slot),
            flush.tag.eq(tag),
            flush.writeback_busy.eq(self.writeback_busy),
            flush.b_owed.eq(self.b_owed),
            flush.written.eq(self.o_writeback.valid & self.o_writeback.ready),
        ]

        # The tag walks (the clear after reset, the flush) have the tag ports.
        with m.If(flush.walking):
            m.d.comb += [tag_rd.addr.eq(flush.slot), tag_wr.addr.eq(flush.slot),
                         tag_wr.en.eq(flush.invalidate), tag_wr.data.eq(0)]

        with m.FSM(init="CLEAR"):
            with m.State("CLEAR"), m.If(flush.cleared):
                m.next = "RUN"

            with m.State("RUN"):
                issue = self.o_op.valid & self.o_op.ready
                m.d.comb += [
                    self.o_op.valid.eq(checking & hit),
                    items.ready.eq(~checking | (issue & ~item.last)),
                ]
                with m.If(issue & first_line & ~accounted):
                    m.d.comb += self.o_drop.valid.eq(1)
                with m.If(issue):
                    m.d.sync += checking.eq(0)
                    with m.If(item.last):
                        m.next = "DRAIN"
                # The first index of a row not written back fills from the read-ahead
                # lines; otherwise they are dropped and the row is read from PMEM,
                # after every B owed: it may read a row an eviction wrote.
                with m.If(checking & ~hit & ~self.op_slot_busy
                          & Mux(from_lines, ~self.b_owed_full, ~self.b_owed)):
                    m.d.sync += [fill_from_lines.eq(from_lines), accounted.eq(1)]
                    with m.If(first_line & ~accounted & ~from_lines):
                        m.d.comb += self.o_drop.valid.eq(1)
                    with m.If(tag.valid):
                        m.d.comb += self.o_writeback.valid.eq(1)
                        m.d.sync += evicted.bit_select(tag.row[:_EVICTED_ROW_BITS], 1).eq(1)
                        m.next = "EVICT"
                    with m.Else():
                        m.d.comb += self.o_fill.valid.eq(1)
                        m.next = "FILL"
                with m.If(items.valid & items.ready):
                    m.d.comb += tag_rd.addr.eq(items.p.row[:len(slot)])
                    with m.If(items.p.nop & items.p.last):
                        m.d.sync += ctrl.eq(self.i_ctrl)
                        m.next = "DRAIN"
                    with m.Elif(~items.p.nop):
                        m.d.sync += [item.eq(items.p), ctrl.eq(self.i_ctrl), checking.eq(1),
                                     slot.eq(items.p.row[:len(slot)]), accounted.eq(0)]
                        m.d.comb += flush.counted.eq(~items.p.line.any())

            with m.State("DRAIN"), m.If(~self.pipeline_busy & ~self.drop_pending):
                m.d.comb += flush.start.eq(1)
                m.next = "FLUSH"

            with m.State("EVICT"), m.If(~self.writeback_busy):
                # The fill reads another row than the one written back: no B to await.
                m.d.comb += self.o_fill.valid.eq(1)
                m.next = "FILL"

            with m.State("FILL"), m.If(self.filled):
                m.d.comb += [tag_wr.en.eq(1), tag_wr.data.eq(Cat(item.row, C(1, 1))),
                             flush.mark.eq(1)]
                m.next = "RETAG"

            with m.State("RETAG"):
                # The tag read of this cycle (``slot``) sees the fill's tag write.
                m.next = "RUN"

            with m.State("FLUSH"):
                m.d.comb += [
                    self.o_writeback.valid.eq(flush.o_writeback.valid),
                    self.o_writeback.p.eq(flush.o_writeback.p),
                    flush.o_writeback.ready.eq(self.o_writeback.ready),
                ]
                with m.If(self.o_done.valid & self.o_done.ready):
                    m.d.sync += evicted.eq(0)
                    m.next = "RUN"
        return m
