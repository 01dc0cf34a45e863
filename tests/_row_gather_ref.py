"""Test-only reference: the single-block RowGather (hw/engine/row_gather.py) before its
split, the class renamed, for tests/test_row_gather_equivalence.py."""

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst
from hw.engine.pool_reduce import CTRL, LINE, LINE_BITS
from hw.widths import is_int

__all__ = ["RowGatherRef"]

#: One counted row of a bag in index order, or a lone empty bag.
ROW = data.StructLayout({
    "row": 32,              # table row (validated upstream)
    "row_k": 16,            # index of the row among the bag's counted rows
    "last_row": 1,          # row_k == count - 1
    "weight": 32,           # fp32 per-sample weight (carried, not used)
    "empty_bag": 1,         # a bag with no counted row: no read, one LINE item
    "count": 16,            # the bag's counted rows
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

#: Undo items buffered between the gather and the consumer.
_UNDO_FIFO = 4

#: Bytes of a line, log2.
_LINE_SHIFT = 6
#: Lines of a 4 KiB page (no AXI4 burst crosses one).
_PAGE_LINES = 4096 >> _LINE_SHIFT


def ctrl_layout(addr_width: int) -> data.StructLayout:
    """Per-descriptor settings of :class:`RowGather` for a PMEM of ``addr_width`` bits."""
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
    sequencers produce it; :class:`RowGather` takes it."""
    return data.StructLayout({"row": ROW, "gather": ctrl_layout(addr_width), "update": 1})


#: What the drain side needs of a row, queued in index order when the row is accepted.
_META = data.StructLayout({
    "row": 32, "row_k": 16, "last_row": 1, "weight": 32, "empty_bag": 1, "count": 16,
    "last_line": 8,         # lines of the row - 1 (0 for an empty bag)
    "batch_id": 32, "table_id": 16, "capture": 1, "pool": CTRL, "update": 1,
    "row_addr": 48,
})


def _bit(m: Module, value, index, name: str):
    """``value`` bit ``index`` (a signal), with the shift at full width for lint."""
    shifted = Signal(len(value), name=name)
    m.d.comb += shifted.eq(value >> index)
    return shifted[0]


class RowGatherRef(wiring.Component):
    """Reads the lines of counted rows from PMEM, many reads in flight, and emits them
    strictly in index order whatever order PMEM answers in.

    Every ``i_rows`` item (a counted row in index order, or a lone empty bag) becomes
    ``lines_per_row`` ``o_lines`` items (``line = 0 ..``, with the item's ``row_k``,
    ``last_row``, ``weight``, ``count``, ``empty_bag = 0``), or a single item with
    ``empty_bag = 1``, ``line = 0``, zero ``data`` and the item's other fields for an
    empty bag (no read). Row ``r`` is the ``lines_per_row`` lines at ``table_base + r *
    lines_per_row * 64`` (``docs/embedding.md``, "Tables and buffers").

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
        rob_lines = self._rob_lines
        slot_bits = rob_lines.bit_length() - 1      # ROB line index
        ptr_bits = slot_bits + 1                    # ring pointers, one wrap bit
        ids = self.ids
        tag_bits = ids.bit_length() - 1             # ID index (ids is a power of two)
        aw = self._addr_width
        pmem = self.pmem
        max_burst = min(_PAGE_LINES, rob_lines)
        burst_bits = max_burst.bit_length()

        m.submodules.rob = rob = Memory(shape=LINE_BITS, depth=rob_lines, init=[])
        rob_wr = rob.write_port()
        rob_rd = rob.read_port()
        # Next ROB line of each outstanding burst: written when the burst issues and
        # after each beat; read (transparent for the beat update) as a beat arrives.
        m.submodules.slots = slots = Memory(shape=slot_bits, depth=ids, init=[])
        slot_issue = slots.write_port()
        slot_beat = slots.write_port()
        slot_rd = slots.read_port(transparent_for=(slot_beat,))
        m.submodules.meta = meta_fifo = SyncFIFOBuffered(width=_META.size, depth=rob_lines)

        tail = Signal(ptr_bits)         # next ROB line to allocate
        head = Signal(ptr_bits)         # next ROB line to leave
        arrived = Signal(rob_lines)     # per ROB line: data present
        id_busy = Signal(ids)           # per ID: a burst outstanding
        next_id = Signal(tag_bits)

        # --- AW / W / B unused ------------------------------------------------------
        m.d.comb += pmem.bready.eq(1)

        # --- issue: i_rows -> holding register -> ROB allocation and AR -----------------
        s1_valid = Signal()
        s1_empty = Signal()
        s1_addr = Signal(aw)
        s1_left = Signal(9)             # lines of the row not yet allocated

        page_left = Signal(7)           # lines from s1_addr to its 4 KiB page's end
        in_page = s1_addr[_LINE_SHIFT:12]
        # 64 - in_page, written without a constant (which Amaranth would shrink).
        m.d.comb += page_left.eq(Cat((-in_page)[:6], ~in_page.any()))
        if max_burst < _PAGE_LINES:
            # A burst also fits in the ROB: rows larger than the ROB stream through it.
            capped = Signal(burst_bits)
            m.d.comb += capped.eq(Mux(page_left > max_burst,
                                      C(max_burst, burst_bits), page_left[:burst_bits]))
            page_left = capped
        whole = Signal()                # the rest of the row fits in one burst
        m.d.comb += whole.eq(s1_empty | (~s1_left[burst_bits:].any()
                                         & (s1_left[:burst_bits] <= page_left)))
        k = Signal(burst_bits)          # lines of this burst (1 for an empty bag)
        m.d.comb += k.eq(Mux(s1_empty, C(1, burst_bits),
                             Mux(whole, s1_left[:burst_bits], page_left)))

        used = Signal(ptr_bits)
        m.d.comb += used.eq(tail - head)
        room = used + k <= rob_lines
        ar_free = ~pmem.arvalid | pmem.arready
        id_free = ~_bit(m, id_busy, next_id, "id_busy_at_next")
        go = Signal()
        m.d.comb += go.eq(s1_valid & room & (s1_empty | (ar_free & id_free)))
        read = go & ~s1_empty

        with m.If(pmem.arready):
            m.d.sync += pmem.arvalid.eq(0)
        m.d.comb += [
            pmem.arsize.eq(_LINE_SHIFT),
            pmem.arburst.eq(AxiBurst.INCR),
            slot_issue.addr.eq(next_id),
            slot_issue.data.eq(tail[:slot_bits]),
            slot_issue.en.eq(read),
        ]
        with m.If(go):
            m.d.sync += [
                tail.eq(tail + k),
                s1_left.eq(s1_left - k),
                s1_addr.eq(s1_addr + (k << _LINE_SHIFT)),
            ]
            with m.If(whole):
                m.d.sync += s1_valid.eq(0)
            with m.If(s1_empty):
                m.d.sync += arrived.bit_select(tail[:slot_bits], 1).eq(1)
            with m.Else():
                m.d.sync += [
                    pmem.arvalid.eq(1),
                    pmem.arid.eq(next_id),
                    pmem.araddr.eq(s1_addr),
                    pmem.arlen.eq(k - 1),
                    id_busy.bit_select(next_id, 1).eq(1),
                    next_id.eq(next_id + 1),
                ]

        rows = self.i_rows
        ctrl, row = rows.p.gather, rows.p.row
        m.d.comb += rows.ready.eq((~s1_valid | (go & whole)) & meta_fifo.w_rdy)
        offset = row.row * ctrl.lines_per_row
        row_addr = Signal(aw)
        m.d.comb += row_addr.eq(ctrl.table_base + (offset << _LINE_SHIFT))
        meta_in = _META(meta_fifo.w_data)
        m.d.comb += [
            meta_fifo.w_en.eq(rows.valid & rows.ready),
            meta_in.row.eq(row.row),
            meta_in.row_k.eq(row.row_k),
            meta_in.last_row.eq(row.last_row),
            meta_in.weight.eq(row.weight),
            meta_in.empty_bag.eq(row.empty_bag),
            meta_in.count.eq(row.count),
            meta_in.last_line.eq(Mux(row.empty_bag, 0, ctrl.lines_per_row - 1)),
            meta_in.batch_id.eq(ctrl.batch_id),
            meta_in.table_id.eq(ctrl.table_id),
            meta_in.capture.eq(ctrl.capture),
            meta_in.pool.eq(ctrl.pool),
            meta_in.update.eq(rows.p.update),
            meta_in.row_addr.eq(row_addr),
        ]
        with m.If(rows.valid & rows.ready):
            m.d.sync += [
                s1_valid.eq(1),
                s1_empty.eq(row.empty_bag),
                s1_addr.eq(row_addr),
                s1_left.eq(Mux(row.empty_bag, C(1, 9), ctrl.lines_per_row)),
            ]

        # --- R beats -> ROB -----------------------------------------------------------
        r1_valid = Signal()
        r1_last = Signal()
        r1_id = Signal(tag_bits)
        r1_data = Signal(LINE_BITS)
        m.d.comb += [
            pmem.rready.eq(1),
            slot_rd.addr.eq(pmem.rid[:tag_bits]),
        ]
        m.d.sync += r1_valid.eq(pmem.rvalid)
        with m.If(pmem.rvalid):
            m.d.sync += [
                r1_last.eq(pmem.rlast),
                r1_id.eq(pmem.rid[:tag_bits]),
                r1_data.eq(pmem.rdata),
            ]
            with m.If(pmem.rresp.any()):
                m.d.sync += self.resp_error.eq(1)
        slot = slot_rd.data
        m.d.comb += [
            rob_wr.addr.eq(slot),
            rob_wr.data.eq(r1_data),
            rob_wr.en.eq(r1_valid),
            slot_beat.addr.eq(r1_id),
            slot_beat.data.eq(slot + 1),
            slot_beat.en.eq(r1_valid),
        ]
        with m.If(r1_valid):
            m.d.sync += arrived.bit_select(slot, 1).eq(1)
            with m.If(r1_last):
                m.d.sync += id_busy.bit_select(r1_id, 1).eq(0)

        # --- head: ROB -> o_lines, in order ----------------------------------------------
        o = self.o_lines
        meta = _META(meta_fifo.r_data)
        cur = Signal(_META)             # metadata of the line in the output register
        cur_line = Signal(8)
        line = Signal(8)                # line of the head's row at the head
        # A capturing line may enter the output register only if the undo FIFO will have
        # room for it when it leaves, counting the line leaving now.
        m.submodules.undo_fifo = undo_fifo = SyncFIFOBuffered(width=UNDO.size,
                                                             depth=_UNDO_FIFO)
        undo_room = Signal()
        leaving = o.valid & cur.capture & ~cur.empty_bag
        m.d.comb += undo_room.eq(~meta.capture | meta.empty_bag
                                 | ((undo_fifo.level + leaving)[:len(undo_fifo.level)]
                                    < _UNDO_FIFO))
        avail = (_bit(m, arrived, head[:slot_bits], "arrived_at_head") & meta_fifo.r_rdy
                 & undo_room)
        advance = ~o.valid | o.ready
        m.d.comb += [
            rob_rd.addr.eq(head[:slot_bits]),
            rob_rd.en.eq(advance),
        ]
        with m.If(advance):
            m.d.sync += o.valid.eq(avail)
            with m.If(avail):
                m.d.sync += [
                    cur.eq(meta),
                    cur_line.eq(line),
                    head.eq(head + 1),
                    arrived.bit_select(head[:slot_bits], 1).eq(0),
                ]
                with m.If(line == meta.last_line):
                    m.d.comb += meta_fifo.r_en.eq(1)
                    m.d.sync += line.eq(0)
                with m.Else():
                    m.d.sync += line.eq(line + 1)
        data_out = Signal(LINE_BITS)
        m.d.comb += [
            data_out.eq(Mux(cur.empty_bag, C(0, LINE_BITS), rob_rd.data)),
            o.p.data.eq(data_out),
            o.p.line.eq(cur_line),
            o.p.row_k.eq(cur.row_k),
            o.p.last_row.eq(cur.last_row),
            o.p.weight.eq(cur.weight),
            o.p.empty_bag.eq(cur.empty_bag),
            o.p.count.eq(cur.count),
            o.p.ctrl.eq(cur.pool),
            o.p.update.eq(cur.update),
        ]

        # --- undo capture: every line of a capturing row, in order, through a FIFO ------
        u = self.o_undo
        item = UNDO(undo_fifo.w_data)
        m.d.comb += [
            undo_fifo.w_en.eq(o.valid & o.ready & cur.capture & ~cur.empty_bag),
            item.batch_id.eq(cur.batch_id),
            item.table_id.eq(cur.table_id),
            item.row.eq(cur.row),
            item.line.eq(cur_line),
            item.data.eq(rob_rd.data),
            item.row_addr.eq(cur.row_addr),
            item.n_lines.eq(cur.last_line + 1),
            u.valid.eq(undo_fifo.r_rdy),
            u.payload.eq(undo_fifo.r_data),
            undo_fifo.r_en.eq(u.ready),
            self.undo_stall.eq(meta_fifo.r_rdy & ~undo_room),
        ]

        m.d.comb += self.busy.eq(s1_valid | (tail != head) | o.valid)
        return m
