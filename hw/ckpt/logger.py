"""The undo logger: the engine's undo-capture stream written to the PMEM log ring as
records (``docs/checkpoint.md``, "Undo-log records" and "Logging (device)").

See :class:`UndoLogger`.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature
from hw.widths import check_int, check_pow2

from .dedup_filter import DedupFilter, filter_index
from .formats import HEADER, LINE_BITS, LOG_MAGIC, line_sum, sum64_finish
from .record_writer import MAX_WRITES, RecordWriter
from .space_tracker import LIVE_BATCHES, SpaceTracker

__all__ = ["LIVE_BATCHES", "MAX_WRITES", "UNDO_IN", "UndoLogger", "filter_index", "hold_lines"]

#: One captured line of a table row (the engine's undo stream, ``row_gather.UNDO``).
UNDO_IN = data.StructLayout({
    "batch_id": 32,
    "table_id": 16,
    "row": 32,
    "line": 8,              # 0 .. n_lines - 1, consecutive
    "data": LINE_BITS,      # the line's old content
    "row_addr": 48,         # device byte address of the row's first line
    "n_lines": 8,           # lines of the row
})


def hold_lines(fifo_lines: int) -> int:
    """The logger's high-water mark: below this many buffered lines a held logger
    starts no record (``UndoLogger``, "Hold"; three quarters of the FIFO)."""
    return (3 * fifo_lines + 3) // 4


class UndoLogger(wiring.Component):
    """Writes every captured table row as one undo-log record, skipping rows a bounded
    filter remembers and overflowing (never stalling for space) when the log is full.

    **Input.** ``i_undo`` items (:data:`UNDO_IN`) enter a FIFO of ``fifo_lines`` lines
    (plus one head register); ``i_undo.ready`` is low only while that FIFO is full, so
    the input takes one line per cycle in bursts and never waits for a COMMIT. The
    lines of a row arrive consecutively, ``line`` = 0 .. ``n_lines - 1``; an item with
    ``line`` = 0 starts a row. With ``enable`` low, items are taken and dropped (items
    already buffered are still logged; change the configuration only while
    ``drained``).

    **Hold.** While ``hold`` is high and the FIFO is less than three quarters full, no
    new record starts (a record already begun is finished, and rows the decision below
    skips or discards are still dropped): the engine raises it while its gather reads
    table rows, so that the record writes wait for the media until the gather is done
    (``docs/checkpoint.md``, "When records are written") instead of taking media time
    from it. Past three quarters the records are written regardless, so the FIFO never
    fills while a record could be written.

    **Decision** (at a row's line 0, in this order):

    1. the row's batch has overflowed (``overflow`` with ``overflow_batch`` equal to
       it): the row is discarded;
    2. the dedup filter holds ``(batch, table, row)``: the row is skipped (already
       logged);
    3. the row does not fit: ``overflow`` is set with ``overflow_batch`` = its batch,
       and the row is discarded (and, by 1, every later row of the batch). It does not
       fit when ``seq - oldest >= 2**log_slots_log2`` (``oldest``: the first ``seq`` of
       the oldest batch with records not committed; no such batch: it fits), when its
       batch is new and :data:`LIVE_BATCHES` batches are already live (a safe choice:
       the space tracker is full), or when ``n_lines`` is 0 or at least
       ``slot_lines`` (the record would not fit its slot; this never happens with a
       consistent configuration);
    4. otherwise record ``seq`` is written to slot ``seq mod 2**log_slots_log2`` at
       ``log_base + slot * slot_lines * 64``, the row is entered into the filter and
       ``seq`` advances.

    A skipped or discarded row's lines are taken and dropped, nothing is written.

    **Dedup filter.** ``filter_rows`` entries, direct mapped: the entry index is
    :func:`filter_index` (the XOR-fold of ``row`` into ``log2(filter_rows)`` bits,
    XOR-ed with the bit-reversed fold of ``table_id``); an entry holds a valid bit and
    the tag ``(batch_id, table_id, row)`` of the last row logged there (the batch in
    the tag makes rows of a new batch miss; ``restart`` clears the valid bits). A later
    row that maps to the same entry evicts it, so a row may be logged again (a
    duplicate record, harmless).

    **Record writes.** Payload line ``k`` of the row goes to slot line ``1 + k`` as it
    streams, then the header line (:data:`~.formats.HEADER`: magic, ``epoch``, ``n``,
    batch, ``seq``, table, row, ``addr`` = ``row_addr``, ``check`` = ``sum64`` of header
    words 0..6 and every payload word) to slot line 0, so a row of ``n`` lines costs
    ``n + 1`` single-beat full-line writes (``awlen`` 0, ``wstrb`` all ones, AXI ID 0,
    so B responses return in order). AW and W are registers loaded together; one write
    per cycle while the port accepts; up to :data:`MAX_WRITES` writes await their B.

    **Space.** Up to :data:`LIVE_BATCHES` ``(batch, first seq)`` pairs of batches with
    records are tracked; ``commit`` (pulse, ``commit_batch``) makes every batch up to
    ``commit_batch`` committed (its records free; its entry leaves the tracker, one per
    cycle, but counts as free at once) and clears ``overflow`` if ``overflow_batch <=
    commit_batch``. ``full`` is high while ``seq - oldest >= 2**log_slots_log2``.

    ``restart`` (pulse, only while ``drained``): ``seq``, the slot position, the
    tracker, the committed batch, ``overflow`` and the filter are cleared.

    **Status.** ``drained``: nothing buffered, no record partly written, every write's
    B received. ``records`` pulses when the B of a record's header is received (its
    payload's Bs came before it: same ID). ``resp_error`` pulses with a B other than
    OKAY.

    **Structure.** The input FIFO and head register feed an FSM (``IDLE``, ``SKIP``,
    ``PAY``, ``HDR``) that makes the decision and builds the record, using
    :class:`~.dedup_filter.DedupFilter`, :class:`~.space_tracker.SpaceTracker`
    (``seq``, slot position, space) and :class:`~.record_writer.RecordWriter` (the
    write channels and B accounting).

    Parameters
    ----------
    addr_width : int
        PMEM byte-address bits, 14 to 64.
    id_width : int
        AXI ID bits, 1 to 16 (only ID 0 is used).
    max_slot_lines : int
        2 to 255: the largest ``slot_lines`` the block is used with (rows of up to
        ``max_slot_lines - 1`` lines; recorded for the integration).
    filter_rows : int
        Dedup filter entries, a power of two from 2 to 4096 (default 256).
    fifo_lines : int
        Input FIFO lines, 2 to 4096 (default 64).

    Members
    -------
    enable, log_base, log_slots_log2, slot_lines, epoch : ``In``
        Configuration, stable while enabled (``log_base`` 64-byte aligned).
    hold : ``In(1)``
        Defer new records (above).
    i_undo : ``In(stream.Signature(UNDO_IN))``
        The undo-capture stream.
    commit, commit_batch : ``In(1)``, ``In(32)``
        Every batch ``<= commit_batch`` is committed (pulse).
    restart : ``In(1)``
        Back to ``seq`` 0, all accounting cleared (pulse).
    drained, overflow, overflow_batch, full, seq, records, resp_error : ``Out``
        Status (see above).
    pmem : ``Out(AXI4Signature(addr_width, 512, id_width))``
        Write-only PMEM port (``arvalid`` = 0, ``rready`` = 1).
    """

    def __init__(self, *, addr_width: int, id_width: int, max_slot_lines: int,
                 filter_rows: int = 256, fifo_lines: int = 64):
        self._addr_width = check_int("addr_width", addr_width, 14, 64)
        self._id_width = check_int("id_width", id_width, 1, 16)
        self._max_slot_lines = check_int("max_slot_lines", max_slot_lines, 2, 255)
        self._filter_rows = check_pow2("filter_rows", filter_rows, 2, 4096)
        self._fifo_lines = check_int("fifo_lines", fifo_lines, 2, 4096)
        super().__init__({
            "enable": In(1),
            "hold": In(1),
            "log_base": In(addr_width),
            "log_slots_log2": In(5),
            "slot_lines": In(8),
            "epoch": In(16),
            "i_undo": In(stream.Signature(UNDO_IN)),
            "commit": In(1),
            "commit_batch": In(32),
            "restart": In(1),
            "drained": Out(1),
            "overflow": Out(1),
            "overflow_batch": Out(32),
            "full": Out(1),
            "seq": Out(32),
            "records": Out(1),
            "resp_error": Out(1),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
        })

    addr_width = property(lambda self: self._addr_width)
    id_width = property(lambda self: self._id_width)
    max_slot_lines = property(lambda self: self._max_slot_lines)
    filter_rows = property(lambda self: self._filter_rows)
    fifo_lines = property(lambda self: self._fifo_lines)

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=UNDO_IN.size, depth=self._fifo_lines)
        m.submodules.filter = filt = DedupFilter(rows=self._filter_rows)
        m.submodules.space = space = SpaceTracker(addr_width=aw)
        m.submodules.writer = writer = RecordWriter(addr_width=aw, id_width=self._id_width)
        wiring.connect(m, writer.pmem, wiring.flipped(self.pmem))

        # --- input FIFO and the head register (the row's filter lookup as it enters)
        m.d.comb += [
            fifo.w_data.eq(self.i_undo.payload.as_value()),
            fifo.w_en.eq(self.i_undo.valid & self.enable),
            self.i_undo.ready.eq(fifo.w_rdy | ~self.enable),
        ]
        nxt = data.View(UNDO_IN, fifo.r_data)
        h = Signal(UNDO_IN)
        h_valid = Signal()
        h_sum = Signal(64)              # line_sum of h.data
        take = Signal()                 # h leaves the head register
        load_h = Signal()
        m.d.comb += [load_h.eq(fifo.r_rdy & (~h_valid | take)), fifo.r_en.eq(load_h)]
        with m.If(load_h):
            m.d.sync += [h.eq(nxt), h_valid.eq(1), h_sum.eq(line_sum(m, nxt.data))]
        with m.Elif(take):
            m.d.sync += h_valid.eq(0)
        m.d.comb += [
            filt.look.eq(load_h),
            filt.look_tag.eq(Cat(nxt.batch_id, nxt.table_id, nxt.row)),
            filt.tag.eq(Cat(h.batch_id, h.table_id, h.row)),
            filt.clear.eq(self.restart),
            space.batch.eq(h.batch_id),
            space.commit.eq(self.commit),
            space.commit_batch.eq(self.commit_batch),
            space.restart.eq(self.restart),
            space.log_slots_log2.eq(self.log_slots_log2),
            space.slot_lines.eq(self.slot_lines),
        ]

        # --- the record being written
        overflow = Signal()
        overflow_batch = Signal(32)
        rec = Signal(HEADER)
        rec_addr = Signal(aw)           # the header's line
        wr_addr = Signal(aw)            # the next payload line
        left = Signal(8)                # payload lines still to come, counting h
        acc = Signal(64)                # sum of the payload words so far
        base = Signal(aw)
        m.d.comb += base.eq(self.log_base + space.slot_off)
        # Hold: no new record below the high-water mark (three quarters of the FIFO).
        defer = Signal()
        m.d.comb += defer.eq(self.hold & (fifo.level < hold_lines(self._fifo_lines)))
        ovf_row = overflow & (overflow_batch == h.batch_id)
        bad_n = ~h.n_lines.any() | (h.n_lines >= self.slot_lines)
        set_ovf = Signal()
        check = Signal(64)
        m.d.comb += check.eq(sum64_finish(acc + line_sum(m, rec.as_value(), words=7,
                                                         name="hdr_sum")))
        wr = writer.i_write

        def write(addr, line, header=0):
            m.d.comb += [wr.valid.eq(1), wr.p.addr.eq(addr), wr.p.data.eq(line),
                         wr.p.header.eq(header)]

        def take_row():
            """IDLE and SKIP (a skipped row's lines follow): a row's first line starts
            its record or skips the row; any other line is a skipped row's, dropped."""
            with m.If(h_valid & (h.line == 0)):
                with m.If(ovf_row | filt.hit):
                    m.d.comb += take.eq(1)
                    m.next = "SKIP"
                with m.Elif(~space.fits | bad_n):
                    m.d.comb += [take.eq(1), set_ovf.eq(1)]
                    m.d.sync += [overflow.eq(1), overflow_batch.eq(h.batch_id)]
                    m.next = "SKIP"
                with m.Elif(~defer):
                    write(base + 64, h.data)        # payload line 0 to slot line 1
                    with m.If(wr.ready):
                        m.d.comb += [take.eq(1), filt.insert.eq(1), space.alloc.eq(1)]
                        m.d.sync += [
                            acc.eq(h_sum), rec_addr.eq(base), wr_addr.eq(base + 128),
                            left.eq(h.n_lines - 1),
                            rec.magic.eq(LOG_MAGIC), rec.epoch.eq(self.epoch),
                            rec.n.eq(h.n_lines), rec.batch_id.eq(h.batch_id),
                            rec.seq.eq(space.seq), rec.table_id.eq(h.table_id),
                            rec.row.eq(h.row), rec.addr.eq(h.row_addr),
                        ]
                        with m.If(h.n_lines == 1):
                            m.next = "HDR"
                        with m.Else():
                            m.next = "PAY"
            with m.Elif(h_valid):
                m.d.comb += take.eq(1)

        with m.FSM(init="IDLE") as fsm:
            with m.State("IDLE"):
                take_row()
            with m.State("SKIP"):
                take_row()
            with m.State("PAY"), m.If(h_valid):
                write(wr_addr, h.data)
                with m.If(wr.ready):
                    m.d.comb += take.eq(1)
                    m.d.sync += [acc.eq(acc + h_sum), wr_addr.eq(wr_addr + 64),
                                 left.eq(left - 1)]
                    with m.If(left == 1):
                        m.next = "HDR"
            with m.State("HDR"):
                write(rec_addr, Cat(rec.as_value()[:LINE_BITS - 64], check), header=1)
                with m.If(wr.ready):
                    m.next = "IDLE"

        # --- commit and restart
        with m.If(self.commit & ~(self.commit_batch
                                  < Mux(set_ovf, h.batch_id, overflow_batch))):
            m.d.sync += overflow.eq(0)
        with m.If(self.restart):
            m.d.sync += [overflow.eq(0), overflow_batch.eq(0)]

        m.d.comb += [
            self.drained.eq(~fifo.level.any() & ~h_valid & writer.idle
                            & (fsm.ongoing("IDLE") | fsm.ongoing("SKIP"))),
            self.overflow.eq(overflow),
            self.overflow_batch.eq(overflow_batch),
            self.full.eq(space.full),
            self.seq.eq(space.seq),
            self.records.eq(writer.records),
            self.resp_error.eq(writer.resp_error),
        ]
        return m
