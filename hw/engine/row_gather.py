"""The memory half of LOOKUP's gather: table rows read from PMEM with many reads in
flight, delivered in index order as the line stream :class:`~.pool_reduce.PoolReduce`
takes."""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst

from ..widths import is_int
from .gather_issue import GatherIssue
from .gather_layouts import LINE_SHIFT, ROW, UNDO, ctrl_layout, rows_layout
from .line_emitter import LineEmitter
from .pool_reduce import LINE, LINE_BITS
from .reorder_buffer import ReorderBuffer
from .undo_tap import UndoTap

__all__ = ["ROW", "UNDO", "RowGather", "ctrl_layout", "rows_layout"]

#: Undo items buffered between the gather and the consumer.
_UNDO_FIFO = 4


class RowGather(wiring.Component):
    """Reads the lines of counted rows from PMEM, many reads in flight, and emits them
    strictly in index order whatever order PMEM answers in.

    Every ``i_rows`` item (a counted row in index order, or a lone empty bag) becomes
    ``lines_per_row`` ``o_lines`` items (``line = 0 ..``, with the item's ``row_k``,
    ``last_row``, ``weight``, ``count``, ``empty_bag = 0``), or a single item with
    ``empty_bag = 1``, ``line = 0``, zero ``data`` and the item's other fields for an
    empty bag (no read). Row ``r`` is the ``lines_per_row`` lines at ``table_base + r *
    lines_per_row * 64`` (``docs/embedding.md``, "Tables and buffers").

    **Structure.** :class:`~.gather_issue.GatherIssue` takes the rows, queues their
    metadata, allocates reorder-buffer lines and AXI IDs and issues the reads;
    :class:`~.reorder_buffer.ReorderBuffer` writes each R beat where its burst's lines
    are; :class:`~.line_emitter.LineEmitter` takes the lines from the buffer's head in
    order with their row's metadata; :class:`~.undo_tap.UndoTap` queues the captured
    lines for ``o_undo``.

    **Reads.** A row is read with one INCR burst of 64-byte beats (``arsize`` 6), split
    at every 4 KiB boundary (an AXI4 rule) and into bursts of at most ``rob_lines``
    lines. Each burst takes the next AXI ID round-robin among ``T = min(2**id_width,
    rob_lines)`` IDs and holds it until its last beat, so an ID has at most one burst
    outstanding and bursts of different rows may return in any order (read data
    interleaving between IDs is handled too). Before a burst is issued it gets
    contiguous lines in the reorder buffer (ROB), a ring of ``rob_lines`` 512-bit lines
    (:class:`~amaranth.lib.memory.Memory`) allocated in index order; a table of ``T``
    entries (a memory, transparent read) holds each outstanding burst's next ROB line,
    and a valid bit per ROB line records arrival. ``rready`` is always high: every beat
    has its line reserved. The row's metadata waits in a FIFO in index order (depth
    ``rob_lines``) and is attached to its lines at the head of the ROB. ``rresp`` other
    than OKAY sets the sticky ``resp_error`` (the beat's data is still delivered).

    **Throughput and latency.** One row per cycle is accepted while ROB space, a free
    ID and the AR register allow; one AR per cycle; one R beat per cycle taken; one
    line per cycle leaves the head. A line holds its ROB slot from its burst's AR issue
    to its read at the head, about ``L + lines_per_row + 5`` cycles for a PMEM read
    latency ``L`` (AR accepted to first beat), so in steady state (Little's law)
    ``lines/cycle = min(1, rob_lines / (L + lines_per_row + 5), T * lines_per_row /
    (L + lines_per_row + 5))`` as far as PMEM bandwidth allows; with ``L = 120``
    ``rob_lines = 256`` and ``T >= 32`` sustain one line per cycle. Latency of an idle
    block: ``i_rows`` transfer in cycle 0, ``arvalid`` in cycle 2; the beat taken in
    cycle ``t`` is written in cycle ``t + 1`` and can be valid on ``o_lines`` in
    cycle ``t + 3``. Empty bags take one ROB line and leave in order with the rows.
    Results do not depend on idle input, output backpressure, AR backpressure or the
    order of R beats: stalls only delay.

    **Streams and reset.** ``o_lines.valid`` is a register and its payload is the ROB
    read register plus registered metadata; both hold until the transfer. ``arvalid``
    and the AR payload are registers. ``i_rows.ready`` depends combinationally on
    ``pmem.arready`` (through the issue of the item in ``i_rows``' holding register).
    Synchronous reset drops everything in flight; the AXI subordinate must be reset
    with the block. AW, W and B are unused (``awvalid = wvalid = 0``, ``bready = 1``).

    **Control.** Each row carries its descriptor's settings (``gather``):
    ``table_base`` and ``lines_per_row`` address the row, ``batch_id``, ``table_id`` and
    ``capture`` travel with it; ``pool`` and ``update`` leave on every line of the row
    (as ``ctrl`` and ``update``), so the settings follow their descriptor's lines.
    ``lines_per_row`` must be 1..``max_lines_per_row`` (0 is not checked and misbehaves).

    **Undo capture.** When ``capture`` was set for a row, each of its lines is offered
    on ``o_undo`` (``batch_id``, ``table_id``, ``row``, ``line``, ``data``, the row's
    first-line address ``row_addr`` and its line count ``n_lines``) as it leaves on
    ``o_lines``, in the same order, through a ``_UNDO_FIFO``-entry FIFO. No item is ever
    dropped: a capturing line enters the output register only when the FIFO will have
    room for it, so a slow consumer stalls the gather (``undo_stall`` is high while
    that is what holds the head). A consumer that is always ready never stalls it.
    Empty bags produce no undo item.

    **Lines for the row store** (``fill_*``, :class:`~.row_store.RowStore`). Each line
    of a LOOKUP's row (not an empty bag's) is offered (``fill_valid`` for one cycle,
    with ``fill_addr``, its byte address, and ``fill_data``)
    as it leaves on ``o_lines``, unless a write may have passed its read: in a cycle with
    ``unsafe`` (a write to PMEM is in flight or being issued; the sender raises it from
    a write's AW until its B) every row accepted and not yet fully emitted (counting the
    rows accepted in that cycle) is marked, and the lines of the marked rows that leave
    from then on, and any line in a cycle with ``unsafe``, are not offered. So a line is
    offered if and only if ``unsafe`` was low from its row's acceptance to the line's
    transfer. Rows leave in the order they came, so the marked ones are the next ones to
    finish: a count suffices.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address bits, 12 to 64.
    id_width : int
        AXI ID bits, 1 to 16.
    rob_lines : int
        Reorder-buffer lines, a power of two from 16 to 4096 (default 256): bounds the
        lines in flight (see the throughput formula above).
    max_lines_per_row : int
        1 to 256 (default 64): the largest ``lines_per_row`` the block is used with
        (recorded for the integration; no hardware depends on it, since rows of any
        length, even longer than the ROB, stream through in bursts of at most
        ``min(64, rob_lines)`` lines).

    Members
    -------
    i_rows : ``In(stream.Signature(rows_layout(addr_width)))``
        Counted rows of bags in index order, and lone empty bags (``row``), each with its
        descriptor's settings (``gather``) and whether it is an UPDATE's (``update``).
    pmem : ``Out(AXI4Signature(addr_width=addr_width, data_width=512, id_width=id_width))``
        PMEM read port (AR and R used).
    o_lines : ``Out(stream.Signature(LINE))``
        Every line of every row, in index order, for :class:`~.pool_reduce.PoolReduce`.
    o_undo : ``Out(stream.Signature(UNDO))``
        Lines of rows with ``capture`` (never dropped, see above).
    busy : ``Out(1)``
        Rows accepted whose lines have not all left on ``o_lines``.
    undo_stall : ``Out(1)``
        The next line waits for room in the undo FIFO.
    resp_error : ``Out(1)``
        Sticky: an R beat answered other than OKAY.
    unsafe : ``In(1)``
    fill_valid, fill_addr, fill_data : ``Out``
        Lines for the row store (see above).

    Raises
    ------
    ValueError
        If a parameter is not an integer in its range.
    """

    def __init__(self, *, addr_width: int, id_width: int, rob_lines: int = 256,
                 max_lines_per_row: int = 64):
        if not is_int(addr_width) or not 12 <= addr_width <= 64:
            raise ValueError(f"addr_width must be an integer from 12 to 64, not {addr_width!r}")
        if not is_int(id_width) or not 1 <= id_width <= 16:
            raise ValueError(f"id_width must be an integer from 1 to 16, not {id_width!r}")
        if (not is_int(rob_lines) or not 16 <= rob_lines <= 4096
                or rob_lines & (rob_lines - 1)):
            raise ValueError(f"rob_lines must be a power of two from 16 to 4096, "
                             f"not {rob_lines!r}")
        if not is_int(max_lines_per_row) or not 1 <= max_lines_per_row <= 256:
            raise ValueError(f"max_lines_per_row must be an integer from 1 to 256, "
                             f"not {max_lines_per_row!r}")
        self._addr_width = addr_width
        self._id_width = id_width
        self._rob_lines = rob_lines
        self._max_lines_per_row = max_lines_per_row
        super().__init__({
            "i_rows": In(stream.Signature(rows_layout(addr_width))),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
            "o_lines": Out(stream.Signature(LINE)),
            "o_undo": Out(stream.Signature(UNDO)),
            "busy": Out(1),
            "undo_stall": Out(1),
            "resp_error": Out(1),
            "unsafe": In(1),
            "fill_valid": Out(1),
            "fill_addr": Out(addr_width),
            "fill_data": Out(LINE_BITS),
        })

    @property
    def addr_width(self) -> int:
        return self._addr_width

    @property
    def id_width(self) -> int:
        return self._id_width

    @property
    def rob_lines(self) -> int:
        return self._rob_lines

    @property
    def max_lines_per_row(self) -> int:
        return self._max_lines_per_row

    @property
    def ids(self) -> int:
        """AXI IDs used, ``min(2**id_width, rob_lines)``: bursts outstanding at most."""
        return min(1 << self._id_width, self._rob_lines)

    def elaborate(self, platform):
        m = Module()
        pmem = self.pmem
        m.submodules.issue = issue = GatherIssue(
            addr_width=self._addr_width, ids=self.ids, rob_lines=self._rob_lines)
        m.submodules.reorder_buffer = rob = ReorderBuffer(lines=self._rob_lines, ids=self.ids)
        m.submodules.emitter = emitter = LineEmitter()
        m.submodules.undo_tap = undo_tap = UndoTap(depth=_UNDO_FIFO)

        # Rows in, bursts out; the ROB's lines are allocated as each burst issues.
        wiring.connect(m, wiring.flipped(self.i_rows), issue.i_rows)
        wiring.connect(m, issue.o_alloc, rob.i_alloc)
        wiring.connect(m, rob.o_burst_done, issue.i_burst_done)
        m.d.comb += issue.head.eq(rob.head)
        ar = issue.o_ar
        m.d.comb += [
            pmem.arvalid.eq(ar.valid),
            pmem.arid.eq(ar.p.id),
            pmem.araddr.eq(ar.p.addr),
            pmem.arlen.eq(ar.p.len),
            pmem.arsize.eq(LINE_SHIFT),
            pmem.arburst.eq(AxiBurst.INCR),
            ar.ready.eq(pmem.arready),
        ]

        # Every beat has its line reserved: rready stays high. AW, W and B are unused.
        beat = rob.i_beat
        m.d.comb += [
            pmem.rready.eq(beat.ready),
            pmem.bready.eq(1),
            beat.valid.eq(pmem.rvalid),
            beat.p.id.eq(pmem.rid),
            beat.p.data.eq(pmem.rdata),
            beat.p.resp.eq(pmem.rresp),
            beat.p.last.eq(pmem.rlast),
            self.resp_error.eq(rob.resp_error),
        ]

        # The head of the ROB, in order, with each row's metadata; captured lines tapped.
        wiring.connect(m, issue.o_meta, emitter.i_meta)
        m.d.comb += [
            emitter.head_present.eq(rob.head_present),
            emitter.data.eq(rob.data),
            rob.read.eq(emitter.read),
            rob.pop.eq(emitter.pop),
        ]
        wiring.connect(m, emitter.o_lines, wiring.flipped(self.o_lines))
        wiring.connect(m, emitter.o_capture, undo_tap.i_line)
        m.d.comb += [
            undo_tap.pending.eq(emitter.capture_pending),
            emitter.undo_room.eq(undo_tap.room),
            self.undo_stall.eq(emitter.undo_stall),
        ]
        wiring.connect(m, undo_tap.o_undo, wiring.flipped(self.o_undo))

        m.d.comb += self.busy.eq(issue.busy | (issue.tail != rob.head) | self.o_lines.valid)

        # Rows in flight (accepted, not all their lines emitted) and how many of the
        # oldest of them a write may have passed (their lines are not offered).
        rows = self.i_rows
        out = self.o_lines
        accepted = Signal()
        finished = Signal()
        m.d.comb += [accepted.eq(rows.valid & rows.ready),
                     finished.eq(out.valid & out.ready & emitter.row_end)]
        count_bits = (self._rob_lines * 2 + 8).bit_length() + 1
        in_flight = Signal(count_bits)
        marked = Signal(count_bits)
        m.d.sync += in_flight.eq(in_flight + accepted - finished)
        with m.If(self.unsafe):
            m.d.sync += marked.eq(in_flight + accepted - finished)
        with m.Elif(finished & (marked != 0)):
            m.d.sync += marked.eq(marked - 1)
        m.d.comb += [
            self.fill_valid.eq(out.valid & out.ready & ~out.p.empty_bag & ~out.p.update
                               & ~self.unsafe & (marked == 0)),
            self.fill_addr.eq(emitter.line_addr),
            self.fill_data.eq(out.p.data),
        ]
        return m
