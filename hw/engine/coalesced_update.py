"""UPDATE with every duplicate coalesced before a row is touched: gradient
contributions summed per distinct row on chip, then one read, one add, one rounding and
one write per distinct row (``docs/embedding.md``, "Coalesced update").

See :class:`CoalescedUpdate`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.arith import Fp32ToBf16, FpAdd, FpMul
from hw.bus.axi import AXI4Signature, AxiBurst
from hw.widths import check_int, check_pow2

from .update_layouts import DONE, ITEM, LINE_BITS, LINE_ELEMS, ctrl_layout, items_per_row
from .update_passes import LEVEL_BITS, in_pass

__all__ = ["DONE", "ITEM", "CoalescedUpdate", "bucket_hash", "ctrl_layout"]

_SIZE_LINE = 6              # AXI ``size`` of a 64-byte beat
_ONE = 0x3F80_0000          # fp32 1.0: the weight of an unweighted update (exact)
_NEG_ZERO = 0x8000_0000     # -0.0 + x == x for every x (NaN: a NaN), so a fresh sum
                            # starts as its first contribution
_MUL_STAGES = 3             # FpMul latency
_ADD_STAGES = 3             # FpAdd latency
#: Accumulation positions: issue 0, the product and the sum's read at 3, the sum
#: written at the end of 6.
_ACC_READ = _MUL_STAGES - 1                     # the read address is presented here
_ACC_WRITE = _MUL_STAGES + _ADD_STAGES          # the sum is written here
#: Apply positions: unit issued (acc read) 0, add 1, sum 4, bf16 rounding 5.
_APPLY_DEPTH = 1 + _ADD_STAGES + 1
#: Lines the write queue holds.
_WQ_DEPTH = 16


def bucket_hash(row: int, bucket_bits: int) -> int:
    """The home bucket of ``row`` in a table of ``2**bucket_bits`` buckets (the RTL's
    hash, for tests and docs): the row's 32 bits folded by XOR into ``bucket_bits``
    bits."""
    h, r = 0, row & 0xFFFF_FFFF
    while r:
        h ^= r & ((1 << bucket_bits) - 1)
        r >>= bucket_bits
    return h


def _hash(row, bucket_bits: int):
    """:func:`bucket_hash` in logic."""
    parts = [row[k:k + bucket_bits] for k in range(0, 32, bucket_bits)]
    h = parts[0]
    for part in parts[1:]:
        h = h ^ part
    return h[:bucket_bits]


class CoalescedUpdate(wiring.Component):
    """Applies an UPDATE's gradient items to its table in PMEM, one read, one add, one
    rounding and one write per distinct row.

    **Contract** (``docs/embedding.md``, "Coalesced update"; golden model
    ``sim.embedding.update`` with ``rounding="nearest"``): for each distinct
    row ``r`` of a descriptor, ``S_r`` is its first contribution, then the fp32 sum
    (``fl32`` after every add) of its further contributions in item order, where a
    contribution is ``fl32(weight * grad)`` when ``weighted`` and ``grad`` otherwise;
    then ``row_r = store(fl32(widen(row_r) + S_r))``, ``store`` the identity for fp32
    and round-to-nearest-even to bf16. Elements at or past ``dim`` keep their bits;
    NaN results are the canonical quiet NaN (``docs/numerics.md``).

    **Items** arrive as for the block this replaces: for every counted index in index
    order, items ``line = 0 .. n - 1`` (``n`` = ``lines_per_row``, twice that for bf16),
    item ``line`` carrying gradient elements ``16 * line .. 16 * line + 15``; for bf16
    item ``2j + h`` belongs to half ``h`` of table line ``j``. A ``last`` item ends the
    descriptor (with ``nop`` it updates nothing); a ``nop`` item without ``last`` is
    ignored.

    **Passes.** An item whose row is not in the pass ``(pass_level, pass_value)``
    (:func:`~.update_passes.in_pass`, sampled with the item; level 0 holds every row) is
    ignored like a ``nop``: a pass of a multi-pass UPDATE (:class:`~.update_passes.
    UpdatePasses`) sums, reads, writes and counts only its own rows.

    **Accumulation.** Items pass a staging register. A line-0 item's row is looked up
    in a hash table of ``acc_rows`` buckets of two slots each, both read at once (home
    bucket :func:`bucket_hash`, read as the item enters the stage, so the lookup
    overlaps the previous item's issue; linear probing, one more cycle per bucket past
    the home bucket, needed only when both of its slots hold other rows; a slot holds
    ``{valid, row, base}``, ``base`` the row's first sum line). A row not found takes
    the next free entry (entries are allocated in first-occurrence order) and the first
    free slot of the bucket, so the table is never more than half full and a probe
    always ends; a new row also takes the next ``n``
    lines of an ``acc_lines``-line fp32 memory, into which the items of the index then
    accumulate: the multiply (weight 1.0 when not ``weighted``, which is exact) over 3
    cycles, the sum read at 3, added over 3 (a fresh entry adds its first contribution
    to -0.0, which returns it unchanged), written at 6 (the read is transparent to that
    write). An item waits in the stage while an item 1 to 3 cycles ahead of it has the
    same sum line (it would read that line before the earlier sum is written). The
    apply phase below uses the same adders.

    **Two halves.** The hash table, the entries, the sums and the row buffer each hold
    two halves of the sizes above: one descriptor accumulates (and has its rows read)
    in one half while the descriptor before it is applied from the other. A descriptor
    whose accumulation has drained is handed to apply once apply has finished with the
    one before it (its lines all sent); the next descriptor's items are then taken
    into the other half at once.

    **Prefetch.** A new row is also queued for reading (a new row waits in the stage
    while the 4-row queue is full): its table lines are read with one burst (two when
    the row crosses a 4 KiB boundary; AXI ID 0, so beats return in order), as many
    bursts in flight as ``fetch_lines``, into the half's row buffer of ``acc_lines``
    lines at its sum lines (table line ``j`` at ``base + j``). The reads thus overlap the
    accumulation; a row is read once per
    descriptor whatever its number of occurrences, and before it is written (distinct
    rows of a table never share a line). The reads of a descriptor may pass the writes
    of the ones before it (below): the engine sends the items of an UPDATE whose table
    is not apart from that of every earlier UPDATE without its ``o_done`` only after
    their ``o_done``.

    **Deferred reads.** The rows of a descriptor whose items come with ``defer`` (a pass
    of a multi-pass UPDATE, which may overflow) are not read while it accumulates:
    once it has been handed to apply, if it did not overflow and no item came ``bad``,
    its entries are read in order (one every two cycles) and queued for reading as
    above, while the walk below waits for them; otherwise nothing is read. So a row is
    never read for a pass that writes nothing, at the cost of the reads no longer
    overlapping the accumulation. The next descriptor's new rows wait until those rows
    are all queued.

    **Overflow.** A new row beyond ``acc_rows`` entries or ``acc_lines`` lines sets
    ``overflow``; its items and those of later new rows are dropped, and at ``last`` no
    row is written (``o_done.overflow`` set, ``rows_written`` 0, ``overflow_at`` the
    counted indices before that row's index). In the engine an UPDATE whose indices
    fit ``acc_rows`` and whose lines (``n`` each) fit ``acc_lines`` never overflows; a
    larger one runs as passes (:class:`~.update_passes.UpdatePasses`), and a pass that
    overflows is run again as smaller passes (``docs/embedding.md``, "Passes").

    **Read errors.** An item with ``bad`` set (a read of the descriptor's buffers
    failed upstream) marks the descriptor: apply then writes no row, as on overflow
    (``o_done.read_error`` set, ``rows_written`` 0).

    **Apply** (once handed over): the entries are walked in order, each once its
    row's lines are all in the buffer (rows are read in entry order, across
    descriptors; one cycle per row; each entry's bucket is cleared on the way, except
    in a cycle in which the accumulation writes a bucket, so the half is empty when a
    descriptor after next uses it); each buffered line is added to its sums (16 lanes;
    a bf16 line as two halves in two cycles), rounded (bf16) and written back with a
    single-beat burst, every byte strobed (padding elements keep the bits read). Apply
    and the accumulation share the sums' read port and the adders: a unit of apply
    issues when the accumulation leaves that slot free and holds the accumulation's
    issue while it waits, so apply goes first and waits at most two cycles. Once every
    line has been sent (AW and W), and fewer than ``tails`` descriptors wait for their
    Bs, the descriptor joins them (a FIFO of *tails*, each holding its ``o_done`` and
    the count of AWs sent up to its last) and apply may take the next one. The oldest
    tail's ``o_done`` follows once the Bs counted have reached its last AW (Bs come in
    AW order: one AXI ID), while the later descriptors accumulate, read and write, so
    the write latencies of up to ``tails`` descriptors and the row reads of the next
    one overlap. AXI error responses are not checked.

    **Throughput.** Accumulation takes one item per cycle, plus one cycle per probe past
    a row's home bucket and the waits above, while the prefetch reads keep pace; apply
    writes one line per cycle (fp32; a bf16 line in two, one per half) while writes and
    the write queue keep up. An UPDATE thus takes about its gradient lines plus its
    distinct rows' lines in cycles, plus one PMEM read latency and one write latency,
    both hidden behind the neighbouring descriptors' work when they may overlap.

    **Reset.** The hash table's two halves are cleared for ``2 * acc_rows`` cycles (``init`` high,
    ``i_items.ready`` low); a descriptor in progress is dropped.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address width, 12 to 64.
    id_width : int
        AXI ID width, 1 to 16 (the block uses ID 0).
    acc_rows : int
        Distinct rows per descriptor (entries of a half), a power of two from 2 to 4096.
    max_items : int
        Largest items per counted index (gradient lines per row), 1 to 64.
    acc_lines : int or None
        fp32 sum lines the entries of a half share, a power of two from ``max_items`` to
        65536;
        None: ``acc_rows * 2**ceil(log2 max_items)``.
    fetch_lines : int
        Prefetch bursts in flight, a power of two from 4 to 1024.
    tails : int
        Descriptors whose lines have all been sent that may wait for their Bs at once,
        1 to 16.

    Members
    -------
    i_ctrl : ``In(ctrl_layout(addr_width))``
        Sampled with every ``i_items`` transfer (apply uses the copy taken with ``last``).
    pass_level : ``In(LEVEL_BITS)``; pass_value : ``In(32)``
        The pass whose rows the items update, sampled with every ``i_items`` transfer.
    defer : ``In(1)``
        The items' rows are read only once their accumulation has ended without
        overflow (above), sampled with every ``i_items`` transfer.
    i_items : ``In(stream.Signature(ITEM))``
    pmem : ``Out(AXI4Signature(addr_width=addr_width, data_width=512, id_width=id_width))``
    o_done : ``Out(stream.Signature(DONE))``
        ``rows_written`` (distinct rows), ``updates`` (counted indices), ``overflow``,
        ``read_error``.
    init : ``Out(1)``
        The hash table is being cleared after reset.

    Raises
    ------
    ValueError
        A parameter out of range, naming it and its value.
    """

    def __init__(self, *, addr_width: int, id_width: int, acc_rows: int, max_items: int,
                 acc_lines: int | None = None, fetch_lines: int = 32, tails: int = 1):
        self._addr_width = check_int("addr_width", addr_width, 12, 64)
        self._id_width = check_int("id_width", id_width, 1, 16)
        self._acc_rows = check_pow2("acc_rows", acc_rows, 2, 4096)
        self._max_items = check_int("max_items", max_items, 1, 64)
        if acc_lines is None:
            acc_lines = acc_rows << (max_items - 1).bit_length()
        self._acc_lines = check_pow2("acc_lines", acc_lines, max(2, self._max_items), 1 << 16)
        self._fetch_lines = check_pow2("fetch_lines", fetch_lines, 4, 1024)
        self._tails = check_int("tails", tails, 1, 16)
        super().__init__({
            "i_ctrl": In(ctrl_layout(addr_width)),
            "pass_level": In(LEVEL_BITS),
            "pass_value": In(32),
            "defer": In(1),
            "i_items": In(stream.Signature(ITEM)),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
            "o_done": Out(stream.Signature(DONE)),
            "init": Out(1),
        })

    addr_width = property(lambda self: self._addr_width)
    id_width = property(lambda self: self._id_width)
    acc_rows = property(lambda self: self._acc_rows)
    max_items = property(lambda self: self._max_items)
    acc_lines = property(lambda self: self._acc_lines)
    fetch_lines = property(lambda self: self._fetch_lines)
    tails = property(lambda self: self._tails)

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        entry_bits = (self._acc_rows - 1).bit_length()
        acc_bits = (self._acc_lines - 1).bit_length()
        # A slot: its row and the row's first sum line (its entry's lines follow); a
        # bucket: two slots.
        # Every memory has two halves (the top address bit): the descriptor accumulating
        # uses one, the descriptor applying the other. A line address (``line_bits``)
        # is a line of a half and the half.
        line_bits = acc_bits + 1
        slot_layout = data.StructLayout({"valid": 1, "row": 32, "base": acc_bits})
        bucket_layout = data.ArrayLayout(slot_layout, 2)
        entry_layout = data.StructLayout({"row": 32, "bucket": entry_bits,
                                          "base": line_bits})

        m.submodules.buckets = buckets = Memory(shape=bucket_layout,
                                                depth=2 * self._acc_rows, init=[])
        slot_w = buckets.write_port()
        slot_r = buckets.read_port(transparent_for=(slot_w,))
        m.submodules.entries = entries = Memory(shape=entry_layout,
                                                depth=2 * self._acc_rows, init=[])
        entry_w = entries.write_port()
        entry_r = entries.read_port(transparent_for=(entry_w,))
        fetch_r = entries.read_port(transparent_for=(entry_w,))    # deferred reads
        m.submodules.sums = sums = Memory(shape=LINE_BITS, depth=2 * self._acc_lines,
                                          init=[])
        sum_w = sums.write_port()
        sum_r = sums.read_port(transparent_for=(sum_w,))
        # The distinct rows' lines, read from PMEM while the accumulation runs: table
        # line ``j`` of the row whose sums start at ``base`` at ``base + j``.
        m.submodules.row_buf = row_buf = Memory(shape=LINE_BITS, depth=2 * self._acc_lines,
                                                init=[])
        buf_w = row_buf.write_port()
        buf_r = row_buf.read_port()

        items, axi = self.i_items, self.pmem
        # The staged item (``item``): taken from ``i_items`` into a register while the
        # home bucket of its row is read, so the lookup of a line-0 item overlaps the
        # previous item's issue.
        item = Signal(ITEM)
        staged = Signal()
        take = Signal()                             # ``i_items`` transfers now
        m.d.comb += take.eq(items.valid & items.ready)
        ctrl = Signal(ctrl_layout(aw))              # the copy taken with the staged item
        half = Signal()                             # the accumulation's half
        count = Signal(entry_bits + 1)              # entries allocated (distinct rows)
        updates = Signal(32)                        # counted indices
        overflow = Signal()
        overflow_at = Signal(32)                    # counted indices before the first drop
        lines_used = Signal(acc_bits + 1)           # sum lines allocated
        row_items = Signal(8)                       # of the staged item's descriptor
        m.d.comb += row_items.eq(items_per_row(ctrl))
        base = Signal(acc_bits)                     # the first sum line of the index passing
        fresh = Signal()                            # ... its first occurrence
        drop = Signal()                             # ... dropped (overflow)
        probe = Signal(entry_bits)                  # the bucket being read
        bad = Signal()                              # an item came ``bad``: write nothing
        skip = Signal()                             # the staged item's row is not in the pass
        defer = Signal()                            # ... its descriptor's reads wait
        with m.If(take):
            m.d.sync += [ctrl.eq(self.i_ctrl), item.eq(items.p), defer.eq(self.defer),
                         skip.eq(~in_pass(items.p.row, self.pass_level, self.pass_value))]
            with m.If(items.p.bad):
                m.d.sync += bad.eq(1)

        # --- accumulation pipeline: positions 1 .. _ACC_WRITE after issue
        acc_meta = data.StructLayout({"addr": line_bits})
        valid = [None] + [Signal(name=f"a{k}_valid") for k in range(1, _ACC_WRITE + 1)]
        meta = [None] + [Signal(acc_meta, name=f"a{k}_meta") for k in range(1, _ACC_WRITE + 1)]
        fresh_at = [None] + [Signal(name=f"a{k}_fresh") for k in range(1, _ACC_WRITE + 1)]
        issue = Signal()
        issue_base = Signal(acc_bits)               # the index's first sum line
        issue_fresh = Signal()
        issue_addr = Signal(line_bits)
        m.d.comb += issue_addr.eq(Cat((issue_base + item.line)[:acc_bits], half))
        m.d.sync += [valid[1].eq(issue), meta[1].addr.eq(issue_addr), fresh_at[1].eq(issue_fresh)]
        for k in range(1, _ACC_WRITE):
            m.d.sync += [valid[k + 1].eq(valid[k]), meta[k + 1].eq(meta[k]),
                         fresh_at[k + 1].eq(fresh_at[k])]
        hazard = Signal()
        m.d.comb += hazard.eq(Cat(*(valid[k] & (meta[k].addr == issue_addr)
                                    for k in range(1, _ACC_WRITE - _ACC_READ))).any())
        acc_busy = Signal()
        m.d.comb += acc_busy.eq(Cat(*valid[1:]).any())

        # --- prefetch: each new row's lines read into the row buffer during accumulation
        # A row to read or apply: its first byte, its first line in the buffer and sums
        # (with the half) and its table lines.
        row_q_layout = data.StructLayout({"addr": aw, "base": line_bits, "lines": 7})
        m.submodules.fetch_q = fetch_q = SyncFIFOBuffered(width=row_q_layout.size, depth=4)
        # Per burst in flight (beats return in order: AXI ID 0), its first row-buffer
        # line, its beats less one, and whether it ends its row.
        lq_layout = data.StructLayout({"base": line_bits, "len": 6, "row_end": 1})
        m.submodules.line_q = line_q = SyncFIFOBuffered(width=lq_layout.size,
                                                        depth=self._fetch_lines)
        # Rows whose lines are all buffered, and rows walked, since reset (modulo
        # ``2**(entry_bits + 2)``; rows are read and walked in allocation order, and
        # the walk never passes the reads, so it may take a row while they differ).
        fetched = Signal(entry_bits + 2)
        walked = Signal(entry_bits + 2)

        # One bank of adders serves both phases: the accumulation of one descriptor
        # uses them at its position _MUL_STAGES, the apply of the one before at its
        # position 1; apply issues a unit only when that slot is free, and holds the
        # accumulation's issue while it has a unit to issue.
        muls = [FpMul(stages=_MUL_STAGES) for _ in range(LINE_ELEMS)]
        adds = [FpAdd(stages=_ADD_STAGES) for _ in range(LINE_ELEMS)]
        for e in range(LINE_ELEMS):
            m.submodules[f"mul{e}"] = muls[e]
            m.submodules[f"add{e}"] = adds[e]
            lane = slice(32 * e, 32 * e + 32)
            m.d.comb += [
                muls[e].i_operands.valid.eq(issue),
                muls[e].i_operands.p.a.eq(Mux(ctrl.weighted, item.weight, C(_ONE, 32))),
                muls[e].i_operands.p.b.eq(item.grad[lane]),
                muls[e].o_result.ready.eq(1),
                adds[e].o_result.ready.eq(1),
            ]
        m.d.comb += [
            sum_w.addr.eq(meta[_ACC_WRITE].addr),
            sum_w.data.eq(Cat(*(u.o_result.payload for u in adds))),
            sum_w.en.eq(valid[_ACC_WRITE]),
        ]

        # --- apply: entries walked into a row queue, each unit summed and written
        m.submodules.row_q = row_q = SyncFIFOBuffered(width=row_q_layout.size, depth=4)
        wq_layout = data.StructLayout({"addr": aw, "data": LINE_BITS})
        m.submodules.w_q = w_q = SyncFIFOBuffered(width=wq_layout.size, depth=_WQ_DEPTH)
        # The descriptor applying: its half, settings and totals, taken from the
        # accumulation when it hands over.
        ap_active = Signal()
        ap_half = Signal()
        ap_defer = Signal()                         # its rows are read only now
        fw = Signal(entry_bits + 1)                 # deferred reads: the entry to queue
        fw_on = Signal()                            # ... entries left to queue
        ap_ctrl = Signal(ctrl_layout(aw))
        ap_done = Signal(DONE)                      # rows_written: its distinct rows
        ap_no_write = Signal()
        m.d.comb += ap_no_write.eq(ap_done.overflow | ap_done.read_error)
        ap_items = Signal(8)                        # items (units) per row
        m.d.comb += ap_items.eq(items_per_row(ap_ctrl))
        handover = Signal()                         # the accumulation hands over now
        acc_slot_w = Signal()                       # ... writes a bucket now

        walk = Signal(entry_bits + 1)               # the entry the walk reads
        walking = Signal()
        advance = Signal()                          # the walk moves to the next entry
        def row_addr(c, row):
            """The first byte of ``row`` of the table of settings ``c``."""
            return (c.table_base + ((row * c.lines_per_row)[:aw] << 6)[:aw])[:aw]

        row_base = Signal(aw)                       # the staged item's row's first byte
        m.d.comb += row_base.eq(row_addr(ctrl, item.row))

        # --- the control
        ar_line = Signal(7)
        # AWs and Bs counted since reset, modulo ``2**cnt_bits``: AWs without a B are at
        # most every line of the tails and of the descriptor applying (each at most
        # ``acc_lines``), below half the counters' range, so "the Bs have reached a
        # mark" is the sign of their difference.
        cnt_bits = ((self._tails + 1) * self._acc_lines).bit_length() + 1
        aw_count, b_count = Signal(cnt_bits), Signal(cnt_bits)
        aw_taken = axi.awvalid & axi.awready
        b_taken = axi.bvalid & axi.bready
        m.d.sync += [aw_count.eq(aw_count + aw_taken), b_count.eq(b_count + b_taken)]
        apply_busy = Signal()                       # units queued, in the pipeline or unsent
        ap_want = Signal()          # apply has a unit to issue: the accumulation may not
        # The tails: descriptors waiting for their Bs / report, oldest first, each its
        # ``o_done`` and the AW count after its last AW.
        # (registers: slot 0 the oldest, ``n_tails`` of them valid).
        tail_layout = data.StructLayout({"mark": cnt_bits, "done": DONE})
        tail_q = [Signal(tail_layout, name=f"tail{k}") for k in range(self._tails)]
        n_tails = Signal(range(self._tails + 1))
        tail_in = Signal(tail_layout)
        tail_push, tail_pop = Signal(), Signal()
        tail_head = tail_q[0]

        def bucket_addr(b):
            """Bucket ``b`` of the accumulation's half."""
            return Cat(b[:entry_bits], half)

        with m.FSM(init="CLEAR"):
            with m.State("CLEAR"):
                # After reset: every slot of every bucket of both halves invalid.
                m.d.comb += [self.init.eq(1),
                             slot_w.addr.eq(bucket_addr(probe)), slot_w.data.eq(0),
                             slot_w.en.eq(1)]
                m.d.sync += probe.eq(probe + 1)
                with m.If(probe == self._acc_rows - 1):
                    m.d.sync += half.eq(~half)
                    with m.If(half):
                        m.next = "RUN"

            with m.State("RUN"):
                # The staged item retires (issued, dropped or ignored) unless it must
                # wait; a new item is taken when the stage is free or retiring (not
                # after a ``last``), and a line-0 item's home bucket is read as it is
                # taken.
                retire = Signal()
                m.d.comb += [
                    items.ready.eq(~staged | (retire & ~item.last)),
                    slot_r.addr.eq(bucket_addr(_hash(items.p.row, entry_bits))),
                ]
                with m.If(take):
                    m.d.sync += [staged.eq(1), probe.eq(_hash(items.p.row, entry_bits))]
                with m.Elif(retire):
                    m.d.sync += staged.eq(0)
                with m.If(retire & item.last):
                    m.next = "DRAIN"

                counted = ~item.nop & (item.line == 0)
                with m.If(staged & (item.nop | skip)):
                    m.d.comb += retire.eq(1)
                with m.Elif(staged & ~counted):
                    m.d.comb += [issue_base.eq(base), issue_fresh.eq(fresh),
                                 retire.eq(~hazard & ~ap_want),
                                 issue.eq(~hazard & ~ap_want & ~drop)]
                with m.Elif(staged):
                    # ``slot_r.data`` is bucket ``probe``: a hit in either slot, both
                    # slots other rows' (read the next bucket) or a free slot (the row
                    # takes entry ``count`` and the first free slot, or is dropped if no
                    # entry is left).
                    bucket = slot_r.data
                    hits = [bucket[k].valid & (bucket[k].row == item.row) for k in range(2)]
                    hit = hits[0] | hits[1]
                    free = ~bucket[0].valid | ~bucket[1].valid
                    alloc = (free & ~hit & ~overflow & (count != self._acc_rows)
                             & (lines_used + row_items <= self._acc_lines))
                    # The bucket with the row put into its first free slot.
                    filled = Signal(bucket_layout)
                    new_slot = Cat(C(1, 1), item.row, lines_used[:acc_bits])
                    m.d.comb += filled.eq(Mux(~bucket[0].valid,
                                              Cat(new_slot, bucket[1].as_value()),
                                              Cat(bucket[0].as_value(), new_slot)))
                    with m.If(~free & ~hit):
                        m.d.comb += slot_r.addr.eq(bucket_addr(probe + 1))
                        m.d.sync += probe.eq(probe + 1)
                    with m.Else():
                        new_base = Mux(hits[0], bucket[0].base,
                                       Mux(hits[1], bucket[1].base, lines_used[:acc_bits]))
                        wait = hazard | ap_want | (alloc & ~defer & (~fetch_q.w_rdy | fw_on))
                        m.d.comb += [issue_base.eq(new_base), issue_fresh.eq(alloc),
                                     retire.eq(~wait), issue.eq(~wait & (hit | alloc))]
                        with m.If(wait):
                            m.d.comb += slot_r.addr.eq(bucket_addr(probe))  # read it again
                        with m.Else():
                            m.d.sync += [base.eq(new_base), fresh.eq(alloc),
                                         drop.eq(~hit & ~alloc), updates.eq(updates + 1)]
                            with m.If(~hit & ~alloc & ~overflow):
                                m.d.sync += [overflow.eq(1), overflow_at.eq(updates)]
                            with m.If(alloc):
                                m.d.comb += [
                                    acc_slot_w.eq(1),
                                    slot_w.addr.eq(bucket_addr(probe)), slot_w.en.eq(1),
                                    slot_w.data.eq(filled),
                                    entry_w.addr.eq(bucket_addr(count)), entry_w.en.eq(1),
                                    entry_w.data.row.eq(item.row), entry_w.data.bucket.eq(probe),
                                    entry_w.data.base.eq(Cat(lines_used[:acc_bits], half)),
                                    fetch_q.w_en.eq(~defer),
                                ]
                                m.d.sync += [count.eq(count + 1),
                                             lines_used.eq(lines_used + row_items)]

            # Once the last sums are written and the descriptor before has been applied,
            # hand the descriptor to apply and take the next one's items into the other
            # half.
            with m.State("DRAIN"), m.If(~acc_busy & ~ap_active):
                m.d.comb += handover.eq(1)
                m.d.sync += [ap_active.eq(1), ap_half.eq(half), ap_ctrl.eq(ctrl),
                             ap_done.rows_written.eq(count), ap_done.updates.eq(updates),
                             ap_done.overflow.eq(overflow), ap_done.read_error.eq(bad),
                             ap_done.overflow_at.eq(overflow_at), overflow_at.eq(0),
                             ap_defer.eq(defer), fw.eq(0),
                             fw_on.eq(defer & ~overflow & ~bad & (count != 0)),
                             walk.eq(0),
                             half.eq(~half), count.eq(0), lines_used.eq(0),
                             updates.eq(0), overflow.eq(0), bad.eq(0), drop.eq(0)]
                m.next = "RUN"

        # Apply. The walk reads the entries in order and clears each one's bucket
        # (every valid slot belongs to an entry, so clearing both is right; not in a
        # cycle in which the accumulation writes a bucket) and queues its row (none on
        # overflow or a read error) once its lines are all in the buffer. Once every
        # line has been sent (and a tail is free), the descriptor becomes a tail, which
        # reports once its Bs are back, and apply may take the next one.
        # ``entry_r`` is presented the entry after ``walk`` as the walk advances (entry
        # 0 of the half handed over as it is), so it holds ``walk``'s entry in every
        # cycle (one row per cycle).
        # A deferred descriptor that writes nothing had nothing read: its walk does not
        # wait for reads, nor count them.
        ap_unread = Signal()
        m.d.comb += [walking.eq(ap_active & (walk != ap_done.rows_written)),
                     ap_unread.eq(ap_defer & ap_no_write)]
        with m.If(walking & ((walked != fetched) | ap_unread) & row_q.w_rdy & ~acc_slot_w):
            m.d.comb += [
                advance.eq(1),
                slot_w.addr.eq(Cat(entry_r.data.bucket, ap_half)), slot_w.data.eq(0),
                slot_w.en.eq(1),
                row_q.w_en.eq(~ap_no_write),
            ]
            m.d.sync += [walk.eq(walk + 1), walked.eq(walked + ~ap_unread)]
        with m.If(ap_active & ~walking & ~apply_busy & (n_tails != self._tails)):
            m.d.comb += [tail_push.eq(1),
                         tail_in.mark.eq(aw_count + aw_taken),
                         tail_in.done.eq(ap_done),
                         tail_in.done.rows_written.eq(Mux(ap_no_write, 0,
                                                          ap_done.rows_written))]
            m.d.sync += ap_active.eq(0)

        # The oldest tail reports once the Bs counted have reached its mark (its own Bs
        # come before any later descriptor's: one AXI ID, in order).
        behind = Signal(cnt_bits)
        m.d.comb += [behind.eq(b_count - tail_head.mark),
                     self.o_done.valid.eq((n_tails != 0) & ~behind[-1]),
                     self.o_done.payload.eq(tail_head.done),
                     tail_pop.eq(self.o_done.ready & self.o_done.valid)]
        m.d.sync += n_tails.eq(n_tails + tail_push - tail_pop)
        for k, t in enumerate(tail_q):
            with m.If(tail_push & (n_tails - tail_pop == k)):
                m.d.sync += t.eq(tail_in)
            with m.Elif(tail_pop & (k + 1 < self._tails)):
                m.d.sync += t.eq(tail_q[min(k + 1, self._tails - 1)])

        # Prefetch AR: the head row's lines in one burst, or two where the row crosses a
        # 4 KiB boundary, while the line queue has room (it bounds the bursts in
        # flight); R beats go to the row buffer.
        fq = data.View(row_q_layout, fetch_q.r_data)
        ar_addr = Signal(aw)
        to_page = Signal(7)                         # lines from ``ar_addr`` to 4 KiB
        left = Signal(7)                            # lines of the row not yet asked for
        beats = Signal(7)
        m.d.comb += [
            ar_addr.eq(fq.addr + (ar_line << 6)),
            to_page.eq(64 - ar_addr[6:12]),
            left.eq(fq.lines - ar_line),
            beats.eq(Mux(left < to_page, left, to_page)),
            fetch_q.w_data.eq(Mux(fw_on,
                                  Cat(row_addr(ap_ctrl, fetch_r.data.row), fetch_r.data.base,
                                      ap_ctrl.lines_per_row),
                                  Cat(row_base, lines_used[:acc_bits], half,
                                      ctrl.lines_per_row))),
            axi.arvalid.eq(fetch_q.r_rdy & line_q.w_rdy),
            axi.araddr.eq(ar_addr),
            axi.arid.eq(0),
            axi.arlen.eq(beats - 1),
            axi.arsize.eq(_SIZE_LINE),
            axi.arburst.eq(AxiBurst.INCR),
            line_q.w_data.eq(Cat((fq.base + ar_line)[:line_bits], (beats - 1)[:6],
                                 beats == left)),
            line_q.w_en.eq(axi.arvalid & axi.arready),
        ]
        with m.If(axi.arvalid & axi.arready):
            with m.If(beats == left):
                m.d.comb += fetch_q.r_en.eq(1)
                m.d.sync += ar_line.eq(0)
            with m.Else():
                m.d.sync += ar_line.eq(ar_line + beats)
        lq = data.View(lq_layout, line_q.r_data)
        r_beat = Signal(6)                          # the beat of the head burst
        r_taken = axi.rvalid & axi.rready
        m.d.comb += [
            axi.rready.eq(line_q.r_rdy),
            buf_w.addr.eq((lq.base + r_beat)[:line_bits]),
            buf_w.data.eq(axi.rdata),
            buf_w.en.eq(r_taken),
        ]
        with m.If(r_taken):
            with m.If(r_beat == lq.len):
                m.d.comb += line_q.r_en.eq(1)
                m.d.sync += r_beat.eq(0)
                with m.If(lq.row_end):
                    m.d.sync += fetched.eq(fetched + 1)
            with m.Else():
                m.d.sync += r_beat.eq(r_beat + 1)

        # Deferred reads: entry ``fw`` of the half applying is presented to ``fetch_r``;
        # once its data is there (a cycle after the address settled) it is queued.
        fr_ok = Signal()
        fw_push = Signal()
        m.d.comb += [fetch_r.addr.eq(Cat(fw[:entry_bits], ap_half)),
                     fw_push.eq(fw_on & fr_ok & fetch_q.w_rdy)]
        m.d.sync += fr_ok.eq(fw_on & ~fw_push)
        with m.If(fw_push):
            m.d.comb += fetch_q.w_en.eq(1)
            m.d.sync += fw.eq(fw + 1)
            with m.If(fw + 1 == ap_done.rows_written):
                m.d.sync += fw_on.eq(0)

        # The walk: ``entry_r`` presented the entry after ``walk`` as the walk advances.
        rq = data.View(row_q_layout, row_q.r_data)
        walk_addr = Signal(aw)                      # the first byte of ``walk``'s row
        m.d.comb += walk_addr.eq(row_addr(ap_ctrl, entry_r.data.row))
        m.d.comb += [entry_r.addr.eq(Mux(handover, Cat(C(0, entry_bits), half),
                                         Cat((walk + advance)[:entry_bits], ap_half))),
                     row_q.w_data.eq(Cat(walk_addr, entry_r.data.base, ap_ctrl.lines_per_row))]

        # Units: one per fp32 line, two (halves) per bf16 line; unit u of a row has
        # elements 16u .. 16u + 15 in both cases and sums line ``base + u``; its table
        # line (``u``, or ``u // 2`` for bf16) is at ``base`` + that line in the buffer.
        unit = Signal(8)
        unit_line = Signal(7)
        m.d.comb += unit_line.eq(Mux(ap_ctrl.bf16, unit[1:], unit))
        p_valid = [Signal(name=f"p{k}_valid") for k in range(_APPLY_DEPTH + 1)]
        p_layout = data.StructLayout({"addr": aw, "unit": 8, "last": 1})
        p = [Signal(p_layout, name=f"p{k}") for k in range(_APPLY_DEPTH + 1)]
        # The row line read for a unit: from the buffer at position 1, then carried.
        olds = [None, buf_r.data] + [Signal(LINE_BITS, name=f"p{k}_old")
                                     for k in range(2, _APPLY_DEPTH + 1)]
        # Units in the pipeline, each counted as a line the write queue must take.
        in_pipe = Signal(range(_APPLY_DEPTH + 2))
        m.d.comb += in_pipe.eq(sum(p_valid[1:]))
        # Apply wants to issue a unit when one is queued and the write queue has room for
        # it; it issues when the accumulation does not use the sums' read port now (and
        # the adders next cycle), and holds the accumulation's issue meanwhile, so it
        # waits at most two cycles.
        go = Signal()
        m.d.comb += [ap_want.eq(row_q.r_rdy & (w_q.level + in_pipe < _WQ_DEPTH - 1)),
                     go.eq(ap_want & ~valid[_ACC_READ])]
        m.d.comb += [
            p_valid[0].eq(go),
            p[0].addr.eq(rq.addr + (unit_line << 6)),
            p[0].unit.eq(unit),
            p[0].last.eq(~ap_ctrl.bf16 | unit[0]),
            sum_r.addr.eq(Mux(go, (rq.base + unit)[:line_bits], meta[_ACC_READ].addr)),
            buf_r.addr.eq((rq.base + unit_line)[:line_bits]),
        ]
        with m.If(go):
            with m.If(unit == ap_items - 1):
                m.d.comb += row_q.r_en.eq(1)
                m.d.sync += unit.eq(0)
            with m.Else():
                m.d.sync += unit.eq(unit + 1)
        for k in range(_APPLY_DEPTH):
            m.d.sync += [p_valid[k + 1].eq(p_valid[k]), p[k + 1].eq(p[k])]
        for k in range(1, _APPLY_DEPTH):
            m.d.sync += olds[k + 1].eq(olds[k])
        m.d.comb += apply_busy.eq(walking | row_q.level.any() | Cat(*p_valid[1:]).any()
                                  | w_q.level.any())

        # The adders: accumulation at its position _MUL_STAGES (fresh + product, or sum
        # + product), apply at its position 1 (widen(old) + sum, the sums read at 0).
        rnds = [Fp32ToBf16() for _ in range(LINE_ELEMS)]
        one = p[1]
        one_old = olds[1]
        one_half = one.unit[0]
        for e in range(LINE_ELEMS):
            m.submodules[f"round{e}"] = rnds[e]
            lane = slice(32 * e, 32 * e + 32)
            old16 = Mux(one_half, one_old[256 + 16 * e:256 + 16 * e + 16],
                        one_old[16 * e:16 * e + 16])
            acc_a = Mux(fresh_at[_MUL_STAGES], C(_NEG_ZERO, 32), sum_r.data[lane])
            apply_a = Mux(ap_ctrl.bf16, Cat(C(0, 16), old16), one_old[lane])
            m.d.comb += [
                adds[e].i_operands.valid.eq(p_valid[1] | valid[_MUL_STAGES]),
                adds[e].i_operands.p.a.eq(Mux(p_valid[1], apply_a, acc_a)),
                adds[e].i_operands.p.b.eq(Mux(p_valid[1], sum_r.data[lane],
                                              muls[e].o_result.payload)),
                rnds[e].i_operands.valid.eq(p_valid[1 + _ADD_STAGES]),
                rnds[e].i_operands.p.a.eq(adds[e].o_result.payload),
                rnds[e].o_result.ready.eq(1),
            ]
        total = Signal(LINE_BITS)                   # fp32 sums at position 1 + add stages
        m.d.comb += total.eq(Cat(*(u.o_result.payload for u in adds)))
        total_late = Signal(LINE_BITS)              # ... one cycle later, with the rounding
        m.d.sync += total_late.eq(total)
        narrow = Cat(*(u.o_result.payload for u in rnds))
        fin = p[_APPLY_DEPTH]
        fin_old = olds[_APPLY_DEPTH]
        fin_half = fin.unit[0]
        # Lane ``e`` of unit ``u`` is element ``16u + e``: past ``dim`` it keeps its bits.
        keep = Signal(LINE_ELEMS)
        m.d.comb += keep.eq(Cat(*((Cat(C(e, 4), fin.unit) >= ap_ctrl.dim)
                                  for e in range(LINE_ELEMS))))
        out_line = Signal(LINE_BITS)                # the line being assembled
        line_now = Signal(LINE_BITS)
        fp32_line = Cat(*(Mux(keep[e], fin_old[32 * e:32 * e + 32], total_late[32 * e:32 * e + 32])
                          for e in range(LINE_ELEMS)))
        bf16_half = Cat(*(Mux(keep[e], Mux(fin_half, fin_old[256 + 16 * e:256 + 16 * e + 16],
                                          fin_old[16 * e:16 * e + 16]),
                              narrow[16 * e:16 * e + 16]) for e in range(LINE_ELEMS)))
        m.d.comb += line_now.eq(Mux(ap_ctrl.bf16,
                                    Mux(fin_half, Cat(out_line[:256], bf16_half),
                                        Cat(bf16_half, fin_old[256:])),
                                    fp32_line))
        with m.If(p_valid[_APPLY_DEPTH]):
            m.d.sync += out_line.eq(line_now)
        wq_in = Signal(wq_layout)
        m.d.comb += [wq_in.addr.eq(fin.addr), wq_in.data.eq(line_now),
                     w_q.w_data.eq(wq_in), w_q.w_en.eq(p_valid[_APPLY_DEPTH] & fin.last)]

        # AW and W from the write queue's head, each dropping on its own handshake.
        wh = data.View(wq_layout, w_q.r_data)
        took_aw = Signal()
        took_w = Signal()
        aw_ok = took_aw | axi.awready
        w_ok = took_w | axi.wready
        m.d.comb += [
            axi.awvalid.eq(w_q.r_rdy & ~took_aw),
            axi.awaddr.eq(wh.addr),
            axi.awid.eq(0),
            axi.awlen.eq(0),
            axi.awsize.eq(_SIZE_LINE),
            axi.awburst.eq(AxiBurst.INCR),
            axi.wvalid.eq(w_q.r_rdy & ~took_w),
            axi.wdata.eq(wh.data),
            axi.wstrb.eq((1 << (LINE_BITS // 8)) - 1),
            axi.wlast.eq(1),
            axi.bready.eq(1),
        ]
        with m.If(w_q.r_rdy):
            with m.If(aw_ok & w_ok):
                m.d.comb += w_q.r_en.eq(1)
                m.d.sync += [took_aw.eq(0), took_w.eq(0)]
            with m.Else():
                m.d.sync += [took_aw.eq(aw_ok), took_w.eq(w_ok)]
        return m
