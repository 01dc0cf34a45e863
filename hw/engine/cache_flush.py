"""The walks over UPDATE's cache tags: all invalidated after reset, the filled ones
written back at the end of a descriptor.

See :class:`CacheFlush`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.widths import lowest_set

from .row_writeback import writeback_request
from .update_layouts import DONE, TAG, check_cache_rows

__all__ = ["CacheFlush"]


class CacheFlush(wiring.Component):
    """Walks the slots of UPDATE's cache that were filled, lowest first, and requests
    the write-back of each one whose tag is valid, invalidating it; then waits for
    every B and reports the descriptor on ``o_done``.

    **Clear.** After reset the block invalidates every slot, one per cycle
    (``invalidate`` at ``slot``), ``cleared`` pulsing with the last one; then it is idle.

    **Marks.** ``mark`` records that ``mark_slot`` was filled; a visit clears the mark,
    so a slot filled twice is visited once.

    **Walk, latency.** ``start`` (while idle) begins a walk in the next cycle. Per
    marked slot: one cycle to choose it (``slot``, a register the cache's tag read
    port is addressed with), one for the tag read, one to check ``tag``; a valid one
    is invalidated (``invalidate``, a write of an invalid tag at ``slot``) and offered
    on ``o_writeback`` in that cycle (the write-back is idle and takes it), and the
    walk goes on once ``writeback_busy`` is low, without waiting for the Bs. With no
    mark left and no B owed (``b_owed`` low), ``o_done`` (a register, held until taken)
    reports ``rows_written`` and ``updates`` in the next cycle, and the counts restart;
    the block is idle once it is taken. ``walking`` is high while the block is not
    idle: it then has the tag ports. Reset: clearing, no mark, counts 0.

    Parameters
    ----------
    cache_rows : int
        Slots of the cache, a power of two from 2 to 256.

    Members
    -------
    start, mark, counted, written : ``In(1)``
    walking, cleared : ``Out(1)``
    mark_slot : ``In(slot_bits)``
    slot : ``Out(slot_bits)``
    tag : ``In(TAG)``
    invalidate : ``Out(1)``
    o_writeback : ``Out(stream.Signature(writeback_request(cache_rows)))``
    writeback_busy, b_owed : ``In(1)``
    o_done : ``Out(stream.Signature(DONE))``

    Raises
    ------
    ValueError
        ``cache_rows`` out of range, naming its value.
    """

    def __init__(self, *, cache_rows: int):
        self._cache_rows = check_cache_rows(cache_rows)
        slot_bits = (cache_rows - 1).bit_length()
        super().__init__({
            "start": In(1),
            "mark": In(1),
            "mark_slot": In(slot_bits),
            "slot": Out(slot_bits),
            "tag": In(TAG),
            "invalidate": Out(1),
            "walking": Out(1),
            "cleared": Out(1),
            "o_writeback": Out(stream.Signature(writeback_request(cache_rows))),
            "writeback_busy": In(1),
            "b_owed": In(1),
            "counted": In(1),
            "written": In(1),
            "o_done": Out(stream.Signature(DONE)),
        })

    cache_rows = property(lambda self: self._cache_rows)

    def elaborate(self, platform):
        m = Module()
        done = self.o_done
        rows_written = Signal(32)
        updates = Signal(32)
        with m.If(self.written):
            m.d.sync += rows_written.eq(rows_written + 1)
        with m.If(self.counted):
            m.d.sync += updates.eq(updates + 1)
        marked = Signal(self._cache_rows)
        any_marked, first_marked = lowest_set(m, marked, "first_marked")
        with m.If(self.mark):
            m.d.sync += marked.bit_select(self.mark_slot, 1).eq(1)
        m.d.comb += [self.o_writeback.p.slot.eq(self.slot),
                     self.o_writeback.p.row.eq(self.tag.row)]

        with m.FSM(init="CLEAR") as fsm:
            with m.State("CLEAR"):
                # Memories keep their content over a reset.
                m.d.comb += self.invalidate.eq(1)
                m.d.sync += self.slot.eq(self.slot + 1)
                with m.If(self.slot.all()):
                    m.d.comb += self.cleared.eq(1)
                    m.next = "IDLE"
            with m.State("IDLE"), m.If(self.start):
                m.next = "NEXT"
            with m.State("NEXT"):
                with m.If(any_marked):
                    m.d.sync += self.slot.eq(first_marked)
                    m.next = "READ"
                with m.Elif(~self.b_owed):
                    m.d.sync += [done.valid.eq(1), done.p.rows_written.eq(rows_written),
                                 done.p.updates.eq(updates)]
                    m.next = "DONE"
            with m.State("READ"):
                m.next = "CHECK"
            with m.State("CHECK"):
                m.d.sync += marked.bit_select(self.slot, 1).eq(0)
                with m.If(self.tag.valid):
                    m.d.comb += [self.invalidate.eq(1), self.o_writeback.valid.eq(1)]
                    m.next = "WRITE_BACK"
                with m.Else():
                    m.next = "NEXT"
            with m.State("WRITE_BACK"), m.If(~self.writeback_busy):
                m.next = "NEXT"
            with m.State("DONE"):
                m.d.sync += [rows_written.eq(0), updates.eq(0)]
                with m.If(done.ready):
                    m.d.sync += done.valid.eq(0)
                    m.next = "IDLE"
        m.d.comb += self.walking.eq(~fsm.ongoing("IDLE"))
        return m
