"""The read side of LOOKUP's row gather: rows in, reorder-buffer lines and AXI IDs
allocated, read bursts out.

See :class:`GatherIssue`.
"""

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..widths import is_int, is_pow2, select_bit
from .gather_layouts import LINE_SHIFT, ROW_META, alloc_layout, ar_layout, rows_layout

__all__ = ["GatherIssue"]

#: Lines of a 4 KiB page (no AXI4 burst crosses one).
_PAGE_LINES = 4096 >> LINE_SHIFT


class GatherIssue(wiring.Component):
    """Takes rows in index order, queues what the emitter needs of each, allocates
    their lines in the reorder buffer (ROB) and issues their read bursts.

    Row ``r`` of a row's settings is the ``lines_per_row`` lines at ``table_base + r *
    lines_per_row * 64``. An accepted row waits in a holding register until all its
    lines are allocated: one INCR burst of 64-byte beats, split at every 4 KiB boundary
    and into bursts of at most ``min(64, rob_lines)`` lines, each allocated as one
    ``o_alloc`` item (its first ROB line, at ``tail``, and its ID) in the cycle its AR
    is loaded. A burst takes the next of the ``ids`` IDs round-robin and waits while
    that ID still has a burst outstanding (until ``i_burst_done`` names it) or while the
    ROB lacks room (``tail - head`` lines in use). An empty bag takes one ROB line
    (``o_alloc`` with ``empty``) and no burst. The row's metadata (:data:`ROW_META`)
    enters a FIFO of ``rob_lines`` entries as the row is accepted and leaves on
    ``o_meta`` in index order.

    **Latency, throughput, backpressure.** One row per cycle is accepted while the
    holding register empties that cycle (or is empty) and the FIFO has room; one burst
    per cycle. ``i_rows`` transfers in cycle 0, ``o_ar.valid`` rises in cycle 2.
    ``o_ar.valid`` and its payload are registers; ``i_rows.ready`` depends
    combinationally on ``o_ar.ready`` and ``head``. ``o_alloc`` and ``i_burst_done``
    have no backpressure (their ``ready`` is high). Reset empties the holding register
    and the FIFO, frees every ID and sets ``tail`` to 0.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address bits, 12 to 64.
    ids : int
        AXI IDs used, a power of two from 2 to ``rob_lines``: bursts outstanding at most.
    rob_lines : int
        ROB lines, a power of two from 16 to 4096.

    Members
    -------
    i_rows : ``In(stream.Signature(rows_layout(addr_width)))``
    o_meta : ``Out(stream.Signature(ROW_META))``
    o_ar : ``Out(stream.Signature(ar_layout(addr_width, log2(ids))))``
    o_alloc : ``Out(stream.Signature(alloc_layout(log2(rob_lines), log2(ids))))``
        Its ``ready`` is not looked at: the ROB takes every allocation.
    i_burst_done : ``In(stream.Signature(log2(ids)))``
        The ID whose burst's last beat has been written (``ready`` is always high).
    head : ``In(log2(rob_lines) + 1)``
        The ROB's next line to leave (ring pointer with a wrap bit).
    tail : ``Out(log2(rob_lines) + 1)``
        The next ROB line to allocate.
    busy : ``Out(1)``
        A row waits in the holding register.

    Raises
    ------
    ValueError
        If a parameter is not an integer in its range.
    """

    def __init__(self, *, addr_width: int, ids: int, rob_lines: int):
        if not is_int(addr_width) or not 12 <= addr_width <= 64:
            raise ValueError(f"addr_width must be an integer from 12 to 64, not {addr_width!r}")
        if not is_pow2(rob_lines) or not 16 <= rob_lines <= 4096:
            raise ValueError(f"rob_lines must be a power of two from 16 to 4096, "
                             f"not {rob_lines!r}")
        if not is_pow2(ids) or not 2 <= ids <= rob_lines:
            raise ValueError(f"ids must be a power of two from 2 to rob_lines ({rob_lines}), "
                             f"not {ids!r}")
        self._addr_width = addr_width
        self._ids = ids
        self._rob_lines = rob_lines
        slot_bits = rob_lines.bit_length() - 1
        id_bits = ids.bit_length() - 1
        super().__init__({
            "i_rows": In(stream.Signature(rows_layout(addr_width))),
            "o_meta": Out(stream.Signature(ROW_META)),
            "o_ar": Out(stream.Signature(ar_layout(addr_width, id_bits))),
            "o_alloc": Out(stream.Signature(alloc_layout(slot_bits, id_bits))),
            "i_burst_done": In(stream.Signature(id_bits)),
            "head": In(slot_bits + 1),
            "tail": Out(slot_bits + 1),
            "busy": Out(1),
        })

    addr_width = property(lambda self: self._addr_width)
    ids = property(lambda self: self._ids)
    rob_lines = property(lambda self: self._rob_lines)

    def elaborate(self, platform):
        m = Module()
        rob_lines = self._rob_lines
        slot_bits = rob_lines.bit_length() - 1
        max_burst = min(_PAGE_LINES, rob_lines)
        burst_bits = max_burst.bit_length()
        tail, ar, alloc = self.tail, self.o_ar, self.o_alloc

        m.submodules.meta = meta_fifo = SyncFIFOBuffered(width=ROW_META.size, depth=rob_lines)
        wiring.connect(m, meta_fifo.r_stream, wiring.flipped(self.o_meta))
        id_busy = Signal(self._ids)         # per ID: a burst outstanding
        next_id = Signal(len(ar.p.id))

        held = self.busy                # a row in the holding register
        held_empty = Signal()
        held_addr = Signal(self._addr_width)
        lines_left = Signal(9)          # lines of the held row not yet allocated

        page_left = Signal(7)           # lines from held_addr to its 4 KiB page's end
        in_page = held_addr[LINE_SHIFT:12]
        # 64 - in_page, written without a constant (which Amaranth would shrink).
        m.d.comb += page_left.eq(Cat((-in_page)[:6], ~in_page.any()))
        if max_burst < _PAGE_LINES:
            # A burst also fits in the ROB: rows larger than the ROB stream through it.
            capped = Signal(burst_bits)
            m.d.comb += capped.eq(Mux(page_left > max_burst,
                                      C(max_burst, burst_bits), page_left[:burst_bits]))
            page_left = capped
        last_burst = Signal()           # the rest of the row fits in one burst
        m.d.comb += last_burst.eq(held_empty | (~lines_left[burst_bits:].any()
                                                & (lines_left[:burst_bits] <= page_left)))
        burst_lines = Signal(burst_bits)    # 1 for an empty bag
        m.d.comb += burst_lines.eq(Mux(held_empty, C(1, burst_bits),
                                       Mux(last_burst, lines_left[:burst_bits], page_left)))

        used = Signal(slot_bits + 1)
        m.d.comb += used.eq(tail - self.head)
        room = used + burst_lines <= rob_lines
        ar_free = ~ar.valid | ar.ready
        id_free = ~select_bit(m, id_busy, next_id, "id_busy_at_next")
        allocate = Signal()
        m.d.comb += allocate.eq(held & room & (held_empty | (ar_free & id_free)))

        with m.If(ar.ready):
            m.d.sync += ar.valid.eq(0)
        m.d.comb += [
            alloc.valid.eq(allocate),
            alloc.p.line.eq(tail[:slot_bits]),
            alloc.p.id.eq(next_id),
            alloc.p.empty.eq(held_empty),
        ]
        with m.If(allocate):
            m.d.sync += [
                tail.eq(tail + burst_lines),
                lines_left.eq(lines_left - burst_lines),
                held_addr.eq(held_addr + (burst_lines << LINE_SHIFT)),
            ]
            with m.If(last_burst):
                m.d.sync += held.eq(0)
            with m.If(~held_empty):
                m.d.sync += [
                    ar.valid.eq(1),
                    ar.p.id.eq(next_id),
                    ar.p.addr.eq(held_addr),
                    ar.p.len.eq(burst_lines - 1),
                    id_busy.bit_select(next_id, 1).eq(1),
                    next_id.eq(next_id + 1),
                ]
        m.d.comb += self.i_burst_done.ready.eq(1)
        with m.If(self.i_burst_done.valid):
            m.d.sync += id_busy.bit_select(self.i_burst_done.payload, 1).eq(0)

        rows = self.i_rows
        ctrl, row = rows.p.gather, rows.p.row
        m.d.comb += rows.ready.eq((~held | (allocate & last_burst)) & meta_fifo.w_rdy)
        row_addr = Signal(self._addr_width)
        m.d.comb += row_addr.eq(ctrl.table_base
                                + ((row.row * ctrl.lines_per_row) << LINE_SHIFT))
        meta = ROW_META(meta_fifo.w_data)
        m.d.comb += [
            meta_fifo.w_en.eq(rows.valid & rows.ready),
            meta.row.eq(row.row),
            meta.row_k.eq(row.row_k),
            meta.last_row.eq(row.last_row),
            meta.weight.eq(row.weight),
            meta.empty_bag.eq(row.empty_bag),
            meta.count.eq(row.count),
            meta.last_line.eq(Mux(row.empty_bag, 0, ctrl.lines_per_row - 1)),
            meta.batch_id.eq(ctrl.batch_id),
            meta.table_id.eq(ctrl.table_id),
            meta.capture.eq(ctrl.capture),
            meta.pool.eq(ctrl.pool),
            meta.update.eq(rows.p.update),
            meta.row_addr.eq(row_addr),
        ]
        with m.If(rows.valid & rows.ready):
            m.d.sync += [
                held.eq(1),
                held_empty.eq(row.empty_bag),
                held_addr.eq(row_addr),
                lines_left.eq(Mux(row.empty_bag, C(1, 9), ctrl.lines_per_row)),
            ]
        return m
