"""The in-order output of LOOKUP's row gather: lines from the head of the reorder buffer
joined with their row's metadata.

See :class:`LineEmitter`.
"""

from amaranth.hdl import C, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .gather_layouts import ROW_META, UNDO
from .pool_reduce import LINE, LINE_BITS

__all__ = ["LineEmitter"]


class LineEmitter(wiring.Component):
    """Emits each row's lines in order, as the reorder buffer (ROB) presents them at its
    head, with the row's metadata from ``i_meta``.

    An ``i_meta`` item (a row, in index order) stands for ``last_line + 1`` lines at
    the ROB's head; the emitter numbers them ``line = 0 ..`` and takes the item with
    the last. An ``o_lines`` item carries the row's ``row_k``, ``last_row``,
    ``weight``, ``empty_bag``, ``count``, ``pool`` (as ``ctrl``) and ``update``; an
    empty bag's one line has zero ``data``. Each line of a row with ``capture`` (not an
    empty bag) is offered on ``o_capture`` as it leaves ``o_lines`` (as :data:`UNDO`,
    with the row's first-line address and line count), and enters the output register
    only with ``undo_room`` (the capture sink will have room for it): ``undo_stall``
    says that this is what holds the next line. ``capture_pending`` says that a
    captured line waits in the output register.

    **Latency, throughput, backpressure.** ``o_lines`` is a register loaded on
    ``~valid | ready``: a line at the head in cycle ``t`` (``head_present``, its row's
    metadata valid) is valid on ``o_lines`` from cycle ``t + 1``; one line per cycle.
    ``read`` is that load (the ROB's read enable), ``pop`` the line taken from the
    head; ``data`` is the ROB's read register. ``o_capture`` does not wait for ``ready``.
    Reset empties the output register and restarts the line count.

    Members
    -------
    i_meta : ``In(stream.Signature(ROW_META))``
    head_present : ``In(1)``
    data : ``In(512)``
    read, pop : ``Out(1)``
    undo_room : ``In(1)``
    o_lines : ``Out(stream.Signature(LINE))``
    o_capture : ``Out(stream.Signature(UNDO))``
        Its ``ready`` is not looked at (``undo_room`` has made sure of it).
    capture_pending, undo_stall : ``Out(1)``
    row_end : ``Out(1)``
        The line in ``o_lines`` is its row's last (or an empty bag's).
    line_addr : ``Out(48)``
        Byte address of the line in ``o_lines`` (its row's first line's plus 64 per
        line; meaningless for an empty bag).
    """

    i_meta: In(stream.Signature(ROW_META))
    head_present: In(1)
    data: In(LINE_BITS)
    read: Out(1)
    pop: Out(1)
    undo_room: In(1)
    o_lines: Out(stream.Signature(LINE))
    o_capture: Out(stream.Signature(UNDO))
    capture_pending: Out(1)
    row_end: Out(1)
    line_addr: Out(48)
    undo_stall: Out(1)

    def elaborate(self, platform):
        m = Module()
        o, meta = self.o_lines, self.i_meta.payload
        cur = Signal(ROW_META)          # metadata of the line in the output register
        cur_line = Signal(8)
        line = Signal(8)                # line of the head's row at the head

        captured = o.valid & cur.capture & ~cur.empty_bag
        undo_room = Signal()
        m.d.comb += undo_room.eq(~meta.capture | meta.empty_bag | self.undo_room)
        avail = self.head_present & self.i_meta.valid & undo_room
        load = ~o.valid | o.ready
        m.d.comb += self.read.eq(load)
        with m.If(load):
            m.d.sync += o.valid.eq(avail)
            with m.If(avail):
                m.d.comb += self.pop.eq(1)
                m.d.sync += [
                    cur.eq(meta),
                    cur_line.eq(line),
                ]
                with m.If(line == meta.last_line):
                    m.d.comb += self.i_meta.ready.eq(1)
                    m.d.sync += line.eq(0)
                with m.Else():
                    m.d.sync += line.eq(line + 1)
        m.d.comb += [
            o.p.data.eq(Mux(cur.empty_bag, C(0, LINE_BITS), self.data)),
            o.p.line.eq(cur_line),
            o.p.row_k.eq(cur.row_k),
            o.p.last_row.eq(cur.last_row),
            o.p.weight.eq(cur.weight),
            o.p.empty_bag.eq(cur.empty_bag),
            o.p.count.eq(cur.count),
            o.p.ctrl.eq(cur.pool),
            o.p.update.eq(cur.update),
        ]

        item = self.o_capture.p
        m.d.comb += [
            self.capture_pending.eq(captured),
            self.o_capture.valid.eq(captured & o.ready),
            item.batch_id.eq(cur.batch_id),
            item.table_id.eq(cur.table_id),
            item.row.eq(cur.row),
            item.line.eq(cur_line),
            item.data.eq(self.data),
            item.row_addr.eq(cur.row_addr),
            item.n_lines.eq(cur.last_line + 1),
            self.undo_stall.eq(self.i_meta.valid & ~undo_room),
            self.row_end.eq(cur_line == cur.last_line),
            self.line_addr.eq(cur.row_addr + (cur_line << 6)),
        ]
        return m
