"""The undo logger as it was before it was split into components: a test-only
reference that ``tests/test_logger_equivalence.py`` runs side by side with
:class:`hw.ckpt.logger.UndoLogger` (not shipped under ``hw/``)."""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst
from hw.ckpt.formats import HEADER, LINE_BITS, LOG_MAGIC, line_sum, sum64_finish

__all__ = ["UndoLoggerRef"]

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

#: Batches with records not yet committed that the space accounting tracks.
LIVE_BATCHES = 4
#: Record writes (AW/W loaded) without their B at most.
MAX_WRITES = 128

_LINE_SHIFT = 6
_TAG = data.StructLayout({"batch_id": 32, "table_id": 16, "row": 32})


def _check_int(name, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer from {lo} to {hi}, not {value!r}")
    return value


def _check_pow2(name, value, lo, hi):
    _check_int(name, value, lo, hi)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two, not {value}")
    return value


def filter_index(table_id: int, row: int, filter_rows: int) -> int:
    """The dedup filter entry of ``(table_id, row)`` (the model of the hardware hash):
    ``fold(row) ^ reverse(fold(table_id))``, where ``fold`` XORs the ``k``-bit chunks
    of a value (``k = log2(filter_rows)``) and ``reverse`` reverses the ``k`` bits, so
    low row numbers of different tables land apart."""
    k = filter_rows.bit_length() - 1

    def fold(value: int, width: int) -> int:
        out = 0
        for i in range(0, width, k):
            out ^= (value >> i) & ((1 << k) - 1)
        return out

    t = fold(table_id & 0xFFFF, 16)
    return fold(row & 0xFFFF_FFFF, 32) ^ int(f"{t:0{k}b}"[::-1], 2)


def _fold(value, k: int):
    """Hardware ``fold``: XOR of the ``k``-bit chunks of ``value`` (a partial top chunk
    goes into the low bits), all operands of equal width."""
    acc = value[:k]
    for i in range(k, len(value), k):
        chunk = value[i:i + k]
        if len(chunk) == k:
            acc = acc ^ chunk
        else:
            acc = Cat(acc[:len(chunk)] ^ chunk, acc[len(chunk):])
    return acc


def _index(row, table_id, k: int):
    """Hardware :func:`filter_index`."""
    t = _fold(table_id, k)
    return _fold(row, k) ^ Cat(*[t[k - 1 - i] for i in range(k)])


class UndoLoggerRef(wiring.Component):
    """Writes every captured table row as one undo-log record, skipping rows a bounded
    filter remembers and overflowing (never stalling for space) when the log is full.

    **Input.** ``i_undo`` items (:data:`UNDO_IN`) enter a FIFO of ``fifo_lines`` lines
    (plus one head register); ``i_undo.ready`` is low only while that FIFO is full, so
    the input takes one line per cycle in bursts and never waits for a COMMIT. The
    lines of a row arrive consecutively, ``line`` = 0 .. ``n_lines - 1``; an item with
    ``line`` = 0 starts a row. With ``enable`` low, items are taken and dropped (items
    already buffered are still logged; change the configuration only while
    ``drained``).

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
        self._addr_width = _check_int("addr_width", addr_width, 14, 64)
        self._id_width = _check_int("id_width", id_width, 1, 16)
        self._max_slot_lines = _check_int("max_slot_lines", max_slot_lines, 2, 255)
        self._filter_rows = _check_pow2("filter_rows", filter_rows, 2, 4096)
        self._fifo_lines = _check_int("fifo_lines", fifo_lines, 2, 4096)
        super().__init__({
            "enable": In(1),
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
        k = self._filter_rows.bit_length() - 1
        axi = self.pmem

        # --- input FIFO and the head register -----------------------------------------
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=UNDO_IN.size, depth=self._fifo_lines)
        m.d.comb += [
            fifo.w_data.eq(self.i_undo.payload.as_value()),
            fifo.w_en.eq(self.i_undo.valid & self.enable),
            self.i_undo.ready.eq(fifo.w_rdy | ~self.enable),
        ]
        nxt = data.View(UNDO_IN, fifo.r_data)
        nxt_sum = line_sum(m, nxt.data, name="nxt_sum")
        h = Signal(UNDO_IN)
        h_valid = Signal()
        h_sum = Signal(64)              # line_sum of h.data
        h_idx = Signal(k)               # filter entry of h
        take = Signal()                 # h leaves the head register
        load_h = Signal()
        m.d.comb += [load_h.eq(fifo.r_rdy & (~h_valid | take)), fifo.r_en.eq(load_h)]
        with m.If(load_h):
            m.d.sync += [h.eq(nxt), h_valid.eq(1), h_sum.eq(nxt_sum),
                         h_idx.eq(_index(nxt.row, nxt.table_id, k))]
        with m.Elif(take):
            m.d.sync += h_valid.eq(0)

        # --- dedup filter: tags in a memory read as an item enters the head register
        # (transparent to the insert of the row before it), valid bits in registers.
        m.submodules.tags = tags = Memory(shape=_TAG, depth=self._filter_rows, init=[])
        wp = tags.write_port()
        rp = tags.read_port(transparent_for=(wp,))
        m.d.comb += [rp.addr.eq(_index(nxt.row, nxt.table_id, k)), rp.en.eq(load_h)]
        valid = Signal(self._filter_rows)
        valid_bit = Signal(self._filter_rows, name="valid_bit")
        m.d.comb += valid_bit.eq(valid >> h_idx)
        hit = Signal()
        m.d.comb += hit.eq(valid_bit[0] & (rp.data.batch_id == h.batch_id)
                           & (rp.data.table_id == h.table_id) & (rp.data.row == h.row))
        insert = Signal()
        m.d.comb += [
            wp.addr.eq(h_idx),
            wp.en.eq(insert),
            wp.data.batch_id.eq(h.batch_id),
            wp.data.table_id.eq(h.table_id),
            wp.data.row.eq(h.row),
        ]

        # --- AW/W registers, B accounting ---------------------------------------------
        aw_pend, w_pend = Signal(), Signal()
        awaddr = Signal(aw)
        wdata = Signal(LINE_BITS)
        load = Signal()                 # a write goes into the AW/W registers
        is_hdr = Signal()               # ... and it is a header
        m.submodules.flags = flags = SyncFIFO(width=1, depth=MAX_WRITES)
        can_load = Signal()
        m.d.comb += [
            can_load.eq((~aw_pend | axi.awready) & (~w_pend | axi.wready) & flags.w_rdy),
            axi.awvalid.eq(aw_pend),
            axi.awaddr.eq(awaddr),
            axi.awid.eq(0),
            axi.awlen.eq(0),
            axi.awsize.eq(_LINE_SHIFT),
            axi.awburst.eq(AxiBurst.INCR),
            axi.wvalid.eq(w_pend),
            axi.wdata.eq(wdata),
            axi.wstrb.eq((1 << (LINE_BITS // 8)) - 1),
            axi.wlast.eq(1),
            axi.bready.eq(1),
            axi.rready.eq(1),
            flags.w_en.eq(load),
            flags.w_data.eq(is_hdr),
            flags.r_en.eq(axi.bvalid),
            self.records.eq(axi.bvalid & flags.r_rdy & flags.r_data[0]),
            self.resp_error.eq(axi.bvalid & axi.bresp.any()),
        ]
        with m.If(axi.awready):
            m.d.sync += aw_pend.eq(0)
        with m.If(axi.wready):
            m.d.sync += w_pend.eq(0)
        with m.If(load):
            m.d.sync += [aw_pend.eq(1), w_pend.eq(1)]

        # --- space accounting -----------------------------------------------------------
        seq = Signal(32)
        committed = Signal(32)
        overflow = Signal()
        overflow_batch = Signal(32)
        cur_batch = Signal(32)          # batch of the newest record
        cur_valid = Signal()
        lb_batch = [Signal(32, name=f"lb_batch{i}") for i in range(LIVE_BATCHES)]
        lb_first = [Signal(32, name=f"lb_first{i}") for i in range(LIVE_BATCHES)]
        lb_count = Signal(range(LIVE_BATCHES + 1))
        live = [(lb_count > i) & (lb_batch[i] > committed)
                for i in range(LIVE_BATCHES)]
        oldest = lb_first[LIVE_BATCHES - 1]
        for i in reversed(range(LIVE_BATCHES - 1)):
            oldest = Mux(live[i], lb_first[i], oldest)
        live_any = Signal()
        m.d.comb += live_any.eq(Cat(*live).any())
        mask = Signal(32)
        # Bit 31 stays 0: log_slots_log2 is at most 31.
        m.d.comb += mask.eq(Cat(*[self.log_slots_log2 > i for i in range(31)]))
        used = Signal(32)
        m.d.comb += used.eq(seq - oldest)
        full = Signal()
        m.d.comb += full.eq(live_any & (used & ~mask).any())
        pop = Signal()                  # the oldest tracked batch is committed
        m.d.comb += pop.eq(lb_count.any() & ~(lb_batch[0] > committed))
        push = Signal()
        new_batch = Signal()
        m.d.comb += new_batch.eq(~cur_valid | (cur_batch != h.batch_id))
        can_push = Signal()
        m.d.comb += can_push.eq((lb_count < LIVE_BATCHES) | pop)
        pos = Signal(range(LIVE_BATCHES + 1))
        m.d.comb += pos.eq(lb_count - pop)
        for i in range(LIVE_BATCHES):
            with m.If(push & (pos == i)):
                m.d.sync += [lb_batch[i].eq(h.batch_id), lb_first[i].eq(seq)]
            if i + 1 < LIVE_BATCHES:
                with m.Elif(pop):
                    m.d.sync += [lb_batch[i].eq(lb_batch[i + 1]),
                                 lb_first[i].eq(lb_first[i + 1])]
        with m.If(push & ~pop):
            m.d.sync += lb_count.eq(lb_count + 1)
        with m.Elif(~push & pop):
            m.d.sync += lb_count.eq(lb_count - 1)

        # --- the record being written ---------------------------------------------------
        slot_off = Signal(aw)           # (seq mod slots) * slot_lines * 64
        rec = Signal(HEADER)
        rec_addr = Signal(aw)           # the header's line
        wr_addr = Signal(aw)            # the next payload line
        left = Signal(8)                # payload lines still to come, counting h
        acc = Signal(64)                # sum of the payload words so far

        cur_base = Signal(aw)
        m.d.comb += cur_base.eq(self.log_base + slot_off)
        seq_next = Signal(32)
        m.d.comb += seq_next.eq(seq + 1)
        stride = Cat(C(0, _LINE_SHIFT), self.slot_lines)

        ovf_row = Signal()              # the row's batch has overflowed
        bad_n = Signal()
        no_space = Signal()
        m.d.comb += [
            ovf_row.eq(overflow & (overflow_batch == h.batch_id)),
            bad_n.eq(~h.n_lines.any() | (h.n_lines >= self.slot_lines)),
            no_space.eq(full | (new_batch & ~can_push) | bad_n),
        ]
        first_row = h_valid & (h.line == 0)
        set_ovf = Signal()

        hdr_sum = line_sum(m, rec.as_value(), words=7, name="hdr_sum")
        check = Signal(64)
        m.d.comb += check.eq(sum64_finish(acc + hdr_sum))

        def take_row():
            """IDLE and SKIP (a skipped row's lines follow): a row's first line starts
            its record or skips the row; any other line is a skipped row's, dropped."""
            with m.If(first_row):
                with m.If(ovf_row | hit):
                    m.d.comb += take.eq(1)
                    m.next = "SKIP"
                with m.Elif(no_space):
                    m.d.comb += [take.eq(1), set_ovf.eq(1)]
                    m.d.sync += [overflow.eq(1), overflow_batch.eq(h.batch_id)]
                    m.next = "SKIP"
                with m.Elif(can_load):
                    m.d.comb += [take.eq(1), load.eq(1), insert.eq(1),
                                 push.eq(new_batch)]
                    last = h.n_lines == 1
                    m.d.sync += [
                        awaddr.eq(cur_base + (1 << _LINE_SHIFT)),
                        wdata.eq(h.data),
                        acc.eq(h_sum),
                        rec_addr.eq(cur_base),
                        wr_addr.eq(cur_base + (2 << _LINE_SHIFT)),
                        left.eq(h.n_lines - 1),
                        rec.magic.eq(LOG_MAGIC),
                        rec.epoch.eq(self.epoch),
                        rec.n.eq(h.n_lines),
                        rec.batch_id.eq(h.batch_id),
                        rec.seq.eq(seq),
                        rec.table_id.eq(h.table_id),
                        rec.row.eq(h.row),
                        rec.addr.eq(h.row_addr),
                        seq.eq(seq_next),
                        slot_off.eq(Mux((seq_next & mask).any(), slot_off + stride, 0)),
                        cur_batch.eq(h.batch_id),
                        cur_valid.eq(1),
                        valid.bit_select(h_idx, 1).eq(1),
                    ]
                    with m.If(last):
                        m.next = "HDR"
                    with m.Else():
                        m.next = "PAY"
            with m.Elif(h_valid):       # a line of a skipped row
                m.d.comb += take.eq(1)

        with m.FSM(init="IDLE") as fsm:
            with m.State("IDLE"):
                take_row()
            with m.State("SKIP"):
                take_row()
            with m.State("PAY"), m.If(h_valid & can_load):
                m.d.comb += [take.eq(1), load.eq(1)]
                m.d.sync += [
                    awaddr.eq(wr_addr),
                    wdata.eq(h.data),
                    acc.eq(acc + h_sum),
                    wr_addr.eq(wr_addr + (1 << _LINE_SHIFT)),
                    left.eq(left - 1),
                ]
                with m.If(left == 1):
                    m.next = "HDR"
            with m.State("HDR"), m.If(can_load):
                m.d.comb += [load.eq(1), is_hdr.eq(1)]
                m.d.sync += [
                    awaddr.eq(rec_addr),
                    wdata.eq(Cat(rec.as_value()[:LINE_BITS - 64], check)),
                ]
                m.next = "IDLE"

        # --- commit and restart -----------------------------------------------------------
        ovf_b_next = Mux(set_ovf, h.batch_id, overflow_batch)
        with m.If(self.commit):
            m.d.sync += committed.eq(self.commit_batch)
            with m.If(~(self.commit_batch < ovf_b_next)):
                m.d.sync += overflow.eq(0)
        with m.If(self.restart):
            m.d.sync += [
                seq.eq(0), slot_off.eq(0), committed.eq(0), overflow.eq(0),
                overflow_batch.eq(0), cur_valid.eq(0), lb_count.eq(0), valid.eq(0),
            ]

        m.d.comb += [
            self.drained.eq(~fifo.level.any() & ~h_valid & ~aw_pend & ~w_pend
                            & ~flags.r_rdy & (fsm.ongoing("IDLE") | fsm.ongoing("SKIP"))),
            self.overflow.eq(overflow),
            self.overflow_batch.eq(overflow_batch),
            self.full.eq(full),
            self.seq.eq(seq),
        ]
        return m
