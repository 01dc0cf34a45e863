"""The bag sequencer as it was before it was split into components: a test-only
reference that ``tests/test_bag_sequencer_equivalence.py`` runs side by side with
:class:`hw.engine.bag_sequencer.BagSequencer` (not shipped under ``hw/``)."""

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst
from hw.engine.bag_sequencer import STATUS
from hw.engine.descriptor import MAX_DIM, DescKind, Descriptor, PoolMode, Status
from hw.engine.row_gather import ROW
from hw.widths import is_int

__all__ = ["BagSequencerRef"]

#: 512-bit PMEM beats: one 64-byte line, 16 int32 / fp32 words.
_LINE_BITS = 512
_LINE_SHIFT = 6
_LINE_WORDS = 16
#: Longest read burst, in lines.
_BURST = 8
#: Lines of read data each buffer reader holds (bounds its reads in flight).
_BUF_LINES = 32
#: Lines a reader may have in flight in pass 1, whose checks take a line per cycle
#: (enough for line rate up to a PMEM latency of about 240 cycles).
_FLY_LINES = 256
_CREDIT_BITS = 10
#: One line as a reader's ``o_line`` delivers it.
_LINE = data.StructLayout({"data": _LINE_BITS, "mask": _LINE_WORDS, "last": 1})
#: Bags the count scan may run ahead of the row emission.
_BAG_FIFO = 16
#: fp32 1.0, the weight of every row when the descriptor is not weighted.
_ONE_FP32 = 0x3F800000
#: Width of every end-of-region sum (48-bit address + 47-bit size, with room).
_END_BITS = 50

#: Buffer readers, by AXI ID.
_RD_OFFSETS, _RD_INDICES, _RD_SCAN, _RD_WEIGHTS = range(4)

#: States of the descriptor FSM, the count scan and the emitter (explicit encodings).
(_ST_IDLE, _ST_CHECK_A, _ST_CHECK_B, _ST_VALIDATE, _ST_EMIT_START, _ST_EMIT, _ST_STATUS) = range(7)
(_SC_IDLE, _SC_SKIP0, _SC_END, _SC_SCAN) = range(4)
(_EM_IDLE, _EM_POP, _EM_EMPTY, _EM_ROWS) = range(4)


def _widen(m: Module, value, width: int, name: str) -> Signal:
    """``value`` zero-extended to a ``width``-bit signal (equal operand widths for lint)."""
    wide = Signal(width, name=name)
    m.d.comb += wide.eq(value)
    return wide


class _Reader(wiring.Component):
    """Reads ``count`` consecutive 32-bit words from a line-aligned PMEM buffer and
    delivers them in order, either one word per cycle (``o_word``) or one whole line per
    cycle (``o_line``: the 16 words, a ``mask`` of the words that belong to the buffer,
    contiguous from word 0, and ``last`` on its last line). A buffer is consumed through
    one of the two only.

    Requests bursts of up to ``_BURST`` lines (never across 4 KiB) whenever its line
    buffer has room for the whole burst (credit counted from the AR grant to the line's
    pop), so up to ``_BUF_LINES / _BURST`` bursts are in flight; all its bursts carry
    one AXI ID, so they return in order. With ``fast`` held high (allowed only while the
    consumer takes every line the cycle it is offered, as pass 1 does) the credit is
    ``_FLY_LINES`` instead: the buffer then holds at most the few lines of its own
    latency, and ``_FLY_LINES / _BURST`` bursts may be in flight. ``flush`` stops new
    requests and discards data; ``idle`` is high once nothing is requested, in flight
    or buffered.
    """

    def __init__(self, addr_width: int):
        self._line_bits = addr_width - _LINE_SHIFT
        super().__init__({
            "start": In(1),
            "base": In(self._line_bits),   # line address of word 0
            "count": In(33),
            "flush": In(1),
            "fast": In(1),
            "req": Out(1),
            "req_line": Out(self._line_bits),
            "req_len": Out(8),              # arlen: beats - 1
            "grant": In(1),
            "beat": In(1),
            "data": In(_LINE_BITS),
            "o_word": Out(stream.Signature(32)),
            "o_line": Out(stream.Signature(_LINE)),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        lb = self._line_bits
        m.submodules.buf = buf = SyncFIFOBuffered(width=_LINE_BITS, depth=_BUF_LINES)

        line = Signal(lb)
        lines_left = Signal(29)
        words_left = Signal(33)
        ptr = Signal(4)
        reserved = Signal(_CREDIT_BITS)

        # Burst length: min(lines left, _BURST, lines to the 4 KiB boundary).
        page_left = Signal(7)
        n0 = Signal(7)
        n = Signal(7)
        after = Signal(_CREDIT_BITS)
        room = Mux(self.fast, after <= _FLY_LINES, after <= _BUF_LINES)
        m.d.comb += [
            page_left.eq(~line[:_LINE_SHIFT] + 1),     # 64 - line offset in page
            n0.eq(Mux(lines_left < _BURST, lines_left[:7], _BURST)),
            n.eq(Mux(page_left < n0, page_left, n0)),
            after.eq(reserved + n),
            self.req.eq(lines_left.any() & ~self.flush & room),
            self.req_line.eq(line),
            self.req_len.eq(n - 1),
        ]
        with m.If(self.grant):
            m.d.sync += [line.eq(line + n), lines_left.eq(lines_left - n)]

        m.d.comb += [buf.w_en.eq(self.beat), buf.w_data.eq(self.data)]

        avail = Signal()
        last_line = Signal()
        take = Signal()
        take_line = Signal()
        pop = Signal()
        m.d.comb += [
            avail.eq(buf.r_rdy & words_left.any() & ~self.flush),
            last_line.eq(words_left <= _LINE_WORDS),
            self.o_word.valid.eq(avail),
            self.o_line.valid.eq(avail),
            self.o_line.payload.data.eq(buf.r_data),
            self.o_line.payload.last.eq(last_line),
            take.eq(self.o_word.valid & self.o_word.ready),
            take_line.eq(self.o_line.valid & self.o_line.ready),
            pop.eq((take & (ptr.all() | (words_left == 1))) | take_line
                   | (self.flush & buf.r_rdy)),
            buf.r_en.eq(pop),
        ]
        for k in range(_LINE_WORDS):    # word k belongs to the buffer: words_left > k
            m.d.comb += self.o_line.payload.mask[k].eq(words_left > k)
        with m.Switch(ptr):     # a case per word: word_select's shift fails lint
            for k in range(_LINE_WORDS):
                with m.Case(k):
                    m.d.comb += self.o_word.payload.eq(buf.r_data[32 * k:32 * (k + 1)])
        with m.If(take):
            m.d.sync += [words_left.eq(words_left - 1), ptr.eq(ptr + 1)]
        with m.If(take_line):
            m.d.sync += words_left.eq(Mux(last_line, 0, words_left - _LINE_WORDS))
        granted = Signal(7)
        grown = Signal(_CREDIT_BITS)
        m.d.comb += [granted.eq(Mux(self.grant, n, 0)),
                     grown.eq(reserved + granted)]
        m.d.sync += reserved.eq(grown - pop)

        with m.If(self.flush):
            m.d.sync += [lines_left.eq(0), words_left.eq(0)]
        with m.If(self.start):
            m.d.sync += [
                line.eq(self.base),
                lines_left.eq((self.count + (_LINE_WORDS - 1))[4:33]),
                words_left.eq(self.count),
                ptr.eq(0),
            ]
        m.d.comb += self.idle.eq(~lines_left.any() & ~words_left.any() & ~reserved.any())
        return m


class BagSequencerRef(wiring.Component):
    """Checks one LOOKUP / UPDATE descriptor in the order of ``docs/embedding.md``
    ("Status codes") and emits its bags as the per-row stream of
    :class:`~.row_gather.RowGather`.

    **Descriptor checks.** A descriptor taken on ``i_desc`` is checked field by field
    first, with no PMEM read: ``BAD_KIND`` for any ``kind`` other than LOOKUP and
    UPDATE (NOP, COMMIT, FENCE and MLP_CHECKPOINT are dispatched elsewhere and are
    answered ``BAD_KIND`` if they reach this block), then ``UNSUPPORTED`` (reserved
    bit, ``mode`` 3, ``dim`` 0 or > 4096, weights with mean/max, UPDATE with max), then
    ``MISALIGNED`` (table base, indices, offsets, data and, when ``weighted``, weights
    addresses), then ``ADDR_RANGE`` (each of those regions ``[addr, addr + size)`` ends
    at or below ``2**addr_width``, also when empty; sizes as in "Details of the
    checks"). These take two cycles.

    **Pass 1: validation.** The offsets (``num_bags + include_last_offset`` int32) and
    all ``num_indices`` indices are streamed from PMEM concurrently, a whole 64-byte
    line (16 words) of each per cycle, and each line is checked by 16 parallel lanes
    (words past the end of a buffer in its last line are ignored): ``BAD_OFFSETS``
    (first not 0, a decrease as int32, past ``num_indices``, or with
    ``include_last_offset`` a last offset other than ``num_indices``; lane 0 compares
    with the last offset of the line before, carried in a register) takes precedence
    over ``INDEX_RANGE`` (an index negative as int32 or ``>= rows`` that is not the
    padding index), as the contract orders them. The checks take every line the cycle
    it is offered, so in this pass each reader may have up to ``_FLY_LINES`` lines in
    flight. A failing check stops further reads of its buffer (and a bad offset also
    stops the index reads); the reads in flight are drained and discarded, so the block
    returns to idle. Nothing is emitted on ``o_rows`` in this pass, so an UPDATE
    touches no row of a bad descriptor, and LOOKUP shares the path.

    **Pass 2: emission.** Only a descriptor that passed reads its buffers again: the
    offsets (bag boundaries), the indices twice and, when ``weighted``, the weights.
    A count scan runs ahead over one copy of the indices and queues each bag's length
    and counted rows (indices other than the padding index) in a FIFO of
    ``_BAG_FIFO`` bags; the emitter walks the second copy in step with the weights and
    emits each counted index as an ``o_rows`` item (``row``, ``row_k``, ``last_row``,
    ``weight`` = the fp32 weight or 1.0 = ``0x3F800000``, ``count``), or one item with
    ``empty_bag = 1`` (``row = row_k = last_row = 0``, ``weight`` 1.0, ``count`` 0)
    for a bag with no counted index. So the count ``n`` of a bag is known before its
    first row. ``row_k`` and ``count`` are 16-bit fields of ``ROW``: a bag of more than
    65535 counted rows wraps them (``last_row`` stays exact).

    **Cost.** Each buffer is read twice (the indices three times); the extra reads
    stream at full line rate, so the cost is PMEM bandwidth, not a stall per index.
    Each reader keeps up to ``_BUF_LINES / _BURST`` = 4 bursts of 8 lines in flight in
    pass 2 (``_FLY_LINES / _BURST`` = 32 in pass 1; AXI ID per reader: 0 offsets, 1
    indices, 2 count scan, 3 weights; the bursts of one ID return in order), enough to
    stream one word per cycle in pass 2 for a PMEM latency up to about 380 cycles, and
    one line per cycle in pass 1 up to about 240. Throughput, for PMEM read latency
    ``L``: pass 1 takes about ``(num_indices + num_bags) / 16 + L`` cycles (the line
    reads of both buffers share the one R channel), pass 2 about ``num_indices + L``
    (one row per cycle: a bag's end costs no cycle, an empty bag one). Measured with
    ``L = 120``, no backpressure: pass 1 of a 128 x 20 LOOKUP (2560 indices, 169
    lines) about 300 cycles (was 2698 checking a word per cycle; the floor is 169 + L),
    its first row about 490 cycles after the descriptor (was 2891); 4000 weighted
    indices: 0.87 rows/cycle overall for bags of 50, 0.86 for bags of 4, 0.82 for bags
    of 1 (were 0.47, 0.39, 0.24; RowGather takes up to one row per cycle).

    **Streams and reset.** ``o_rows`` is a register loaded on ``~valid | ready``;
    ``o_status`` (exactly one per descriptor) is offered only once the last ``o_rows``
    item has been taken. ``i_desc.ready`` is high only when idle. ``arvalid`` and the AR
    payload are registers; ``rready`` and ``bready`` are always 1, AW and W are never
    used. ``rresp`` is ignored. Synchronous reset drops the descriptor in progress; the
    AXI subordinate must be reset with the block.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address bits, 12 to 48 (device memory is ``2**addr_width`` bytes).
    id_width : int
        AXI ID bits, 2 to 16 (four IDs are used).

    Members
    -------
    i_desc : ``In(stream.Signature(Descriptor))``
        One LOOKUP / UPDATE descriptor at a time.
    pmem : ``Out(AXI4Signature(addr_width=addr_width, data_width=512, id_width=id_width))``
        PMEM read port (AR and R).
    o_rows : ``Out(stream.Signature(ROW))``
        Counted rows of every bag in index order, and lone empty bags.
    o_status : ``Out(stream.Signature(STATUS))``
        The descriptor's :class:`~.descriptor.Status`, after its last ``o_rows`` item.

    Raises
    ------
    ValueError
        If a parameter is not an integer in its range.
    """

    def __init__(self, *, addr_width: int, id_width: int):
        if not is_int(addr_width) or not 12 <= addr_width <= 48:
            raise ValueError(f"addr_width must be an integer from 12 to 48, not {addr_width!r}")
        if not is_int(id_width) or not 2 <= id_width <= 16:
            raise ValueError(f"id_width must be an integer from 2 to 16, not {id_width!r}")
        self._addr_width = addr_width
        self._id_width = id_width
        super().__init__({
            "i_desc": In(stream.Signature(Descriptor)),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=_LINE_BITS,
                                      id_width=id_width)),
            "o_rows": Out(stream.Signature(ROW)),
            "o_status": Out(stream.Signature(STATUS)),
        })

    @property
    def addr_width(self) -> int:
        return self._addr_width

    @property
    def id_width(self) -> int:
        return self._id_width

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        pmem = self.pmem
        readers = [_Reader(aw) for _ in range(4)]
        for i, r in enumerate(readers):
            m.submodules[f"reader{i}"] = r
        rd_off, rd_idx, rd_scan, rd_w = (readers[i] for i in (
            _RD_OFFSETS, _RD_INDICES, _RD_SCAN, _RD_WEIGHTS))

        # --- AXI: AR register with fixed-priority arbitration, R routed by ID --------
        m.d.comb += [
            pmem.arsize.eq(_LINE_SHIFT),
            pmem.arburst.eq(AxiBurst.INCR),
            pmem.rready.eq(1),
            pmem.bready.eq(1),
        ]
        with m.If(~pmem.arvalid | pmem.arready):
            m.d.sync += pmem.arvalid.eq(0)
            for i, r in enumerate(readers):
                with (m.If if i == 0 else m.Elif)(r.req):
                    m.d.comb += r.grant.eq(1)
                    m.d.sync += [
                        pmem.arvalid.eq(1),
                        pmem.arid.eq(i),
                        pmem.araddr.eq(Cat(C(0, _LINE_SHIFT), r.req_line)),
                        pmem.arlen.eq(r.req_len),
                    ]
        for i, r in enumerate(readers):
            m.d.comb += [r.beat.eq(pmem.rvalid & (pmem.rid == i)),
                         r.data.eq(pmem.rdata)]

        # --- the descriptor and its field checks ---------------------------------------
        d = Signal(Descriptor)
        status = Signal(8)

        is_lookup = d.kind == DescKind.LOOKUP.value
        is_update = d.kind == DescKind.UPDATE.value
        mode_sum = d.mode == PoolMode.SUM.value
        unsupported = (d.rsvd_flag | (d.mode == 3) | ~d.dim.any()
                       | (d.dim > MAX_DIM) | (d.weighted & ~mode_sum)
                       | (is_update & (d.mode == PoolMode.MAX.value)))
        misaligned = (d.table_base[:_LINE_SHIFT].any() | d.indices_addr[:_LINE_SHIFT].any()
                      | d.offsets_addr[:_LINE_SHIFT].any() | d.data_addr[:_LINE_SHIFT].any()
                      | (d.weighted & d.weights_addr[:_LINE_SHIFT].any()))

        # Lines per vector: ceil(dim * 4 / 64) for fp32, ceil(dim * 2 / 64) for bf16.
        lpr_fp32 = Signal(9)
        lpr_bf16 = Signal(9)
        m.d.comb += [lpr_fp32.eq((d.dim + 15)[4:13]),
                     lpr_bf16.eq((d.dim + 31)[5:14])]
        lpr_table = Mux(d.bf16, lpr_bf16, lpr_fp32)
        lpr_data = Mux(d.bf16 & is_lookup, lpr_bf16, lpr_fp32)
        # Registered in CHECK_A: the table and data sizes in lines (32 x 9 bits).
        table_lines = Signal(41)
        data_lines = Signal(41)
        mul_a = [_widen(m, d.rows, 41, "rows41"), _widen(m, lpr_table, 41, "lpr_t41")]
        mul_b = [_widen(m, d.num_bags, 41, "bags41"), _widen(m, lpr_data, 41, "lpr_d41")]

        num_offsets = Signal(33)
        m.d.comb += num_offsets.eq(d.num_bags + d.include_last_offset)

        def fits(name, addr, size):
            """``addr + size <= 2**aw`` for a 48-bit address and a byte size."""
            end = Signal(_END_BITS, name=f"{name}_end")
            m.d.comb += end.eq(addr + size)
            high = end[aw:]
            return ~high.any() | ((high == 1) & ~end[:aw].any())

        in_range = (fits("table", d.table_base, Cat(C(0, _LINE_SHIFT), table_lines))
                    & fits("idx", d.indices_addr, Cat(C(0, 2), d.num_indices))
                    & fits("off", d.offsets_addr, Cat(C(0, 2), num_offsets))
                    & fits("data", d.data_addr, Cat(C(0, _LINE_SHIFT), data_lines))
                    & (~d.weighted | fits("w", d.weights_addr, Cat(C(0, 2), d.num_indices))))

        def line_of(addr):
            return addr[_LINE_SHIFT:aw]

        def is_pad(word):
            return d.has_padding_idx & (word == d.padding_idx)

        # --- pass 1 state ------------------------------------------------------------
        off_first = Signal()
        off_prev = Signal(32)
        bad_off = Signal()
        bad_idx = Signal()

        # The 16 lanes of pass 1: each checks one word of the line its reader offers.
        off_line, idx_line = rd_off.o_line.payload, rd_idx.o_line.payload
        off_words = [off_line.data[32 * k:32 * (k + 1)] for k in range(_LINE_WORDS)]
        off_bad = Signal(_LINE_WORDS)
        idx_bad = Signal(_LINE_WORDS)
        for k in range(_LINE_WORDS):
            w = off_words[k]
            prev = off_prev if k == 0 else off_words[k - 1]
            # The buffer's last offset: the highest word of the mask on the last line.
            last = off_line.mask[k] & (off_line.last if k == _LINE_WORDS - 1
                                       else ~off_line.mask[k + 1])
            bad = (w[31] | (w[:31] < prev[:31]) | (d.num_indices < w)
                   | (d.include_last_offset & last & (w != d.num_indices)))
            if k == 0:
                bad = bad | (off_first & w.any())
            m.d.comb += off_bad[k].eq(off_line.mask[k] & bad)
            iw = idx_line.data[32 * k:32 * (k + 1)]
            m.d.comb += idx_bad[k].eq(idx_line.mask[k] & (iw[31] | ~(iw < d.rows))
                                      & ~is_pad(iw))

        # --- pass 2 state: count scan and emitter --------------------------------------
        m.submodules.bagq = bagq = SyncFIFOBuffered(width=64, depth=_BAG_FIFO)
        sc_bags_left = Signal(32)
        sc_pos = Signal(32)
        sc_raw = Signal(32)
        sc_left = Signal(32)
        sc_cnt = Signal(32)
        sc_done = Signal()
        em_bags_left = Signal(32)
        em_left = Signal(32)
        em_cnt = Signal(32)
        em_k = Signal(32)
        em_done = Signal()

        rows = self.o_rows
        out_free = ~rows.valid | rows.ready
        with m.If(rows.ready):
            m.d.sync += rows.valid.eq(0)

        def emit(**fields):
            m.d.sync += rows.valid.eq(1)
            for name in ("row", "row_k", "last_row", "weight", "empty_bag", "count"):
                m.d.sync += rows.payload[name].eq(fields.get(name, 0))

        state = Signal(range(_ST_STATUS + 1))
        sc_state = Signal(range(_SC_SCAN + 1))
        em_state = Signal(range(_EM_ROWS + 1))

        def finish(code):
            m.d.sync += status.eq(code)
            m.d.sync += state.eq(_ST_STATUS)

        with m.Switch(state):
            with m.Case(_ST_IDLE):
                m.d.comb += self.i_desc.ready.eq(1)
                with m.If(self.i_desc.valid):
                    m.d.sync += d.eq(self.i_desc.payload)
                    m.d.sync += state.eq(_ST_CHECK_A)

            with m.Case(_ST_CHECK_A):
                m.d.sync += [table_lines.eq(mul_a[0] * mul_a[1]),
                             data_lines.eq(mul_b[0] * mul_b[1])]
                m.d.sync += state.eq(_ST_CHECK_B)

            with m.Case(_ST_CHECK_B):
                with m.If(~is_lookup & ~is_update):
                    finish(Status.BAD_KIND.value)
                with m.Elif(unsupported):
                    finish(Status.UNSUPPORTED.value)
                with m.Elif(misaligned):
                    finish(Status.MISALIGNED.value)
                with m.Elif(~in_range):
                    finish(Status.ADDR_RANGE.value)
                with m.Else():
                    m.d.comb += [
                        rd_off.start.eq(1), rd_off.base.eq(line_of(d.offsets_addr)),
                        rd_off.count.eq(num_offsets),
                        rd_idx.start.eq(1), rd_idx.base.eq(line_of(d.indices_addr)),
                        rd_idx.count.eq(d.num_indices),
                    ]
                    m.d.sync += [off_first.eq(1), off_prev.eq(0),
                                 bad_off.eq(0), bad_idx.eq(0)]
                    m.d.sync += state.eq(_ST_VALIDATE)

            with m.Case(_ST_VALIDATE):
                m.d.comb += [
                    rd_off.fast.eq(1), rd_idx.fast.eq(1),
                    rd_off.o_line.ready.eq(1), rd_idx.o_line.ready.eq(1),
                    rd_off.flush.eq(bad_off), rd_idx.flush.eq(bad_off | bad_idx),
                ]
                with m.If(rd_off.o_line.valid):
                    m.d.sync += [off_first.eq(0), off_prev.eq(off_words[-1])]
                    with m.If(off_bad.any()):
                        m.d.sync += bad_off.eq(1)
                with m.If(rd_idx.o_line.valid & idx_bad.any()):
                    m.d.sync += bad_idx.eq(1)
                with m.If(rd_off.idle & rd_idx.idle):
                    with m.If(bad_off):
                        finish(Status.BAD_OFFSETS.value)
                    with m.Elif(bad_idx):
                        finish(Status.INDEX_RANGE.value)
                    with m.Elif(~d.num_bags.any()):
                        finish(Status.OK.value)     # indices in no bag: nothing to emit
                    with m.Else():
                        m.d.sync += state.eq(_ST_EMIT_START)

            with m.Case(_ST_EMIT_START):
                m.d.comb += [
                    rd_off.start.eq(1), rd_off.base.eq(line_of(d.offsets_addr)),
                    rd_off.count.eq(d.num_bags),
                    rd_idx.start.eq(1), rd_idx.base.eq(line_of(d.indices_addr)),
                    rd_idx.count.eq(d.num_indices),
                    rd_scan.start.eq(1), rd_scan.base.eq(line_of(d.indices_addr)),
                    rd_scan.count.eq(d.num_indices),
                    rd_w.start.eq(1), rd_w.base.eq(line_of(d.weights_addr)),
                    rd_w.count.eq(Mux(d.weighted, d.num_indices, 0)),
                ]
                m.d.sync += [sc_bags_left.eq(d.num_bags), sc_pos.eq(0), sc_done.eq(0),
                             em_bags_left.eq(d.num_bags), em_done.eq(0)]
                m.d.sync += state.eq(_ST_EMIT)

            with m.Case(_ST_EMIT), m.If(sc_done & em_done & ~rows.valid):
                finish(Status.OK.value)

            with m.Case(_ST_STATUS):
                m.d.comb += [self.o_status.valid.eq(1),
                             self.o_status.payload.status.eq(status)]
                with m.If(self.o_status.ready):
                    m.d.sync += state.eq(_ST_IDLE)

        start_emit = Signal()
        m.d.comb += start_emit.eq(rd_scan.start)

        # Count scan: offs[0] (always 0) is skipped; each later offset ends a bag, and
        # num_indices ends the last.
        def next_bag(last_bag):
            """Start scanning the next bag once its end is known, else wait in END."""
            end = Mux(last_bag, d.num_indices, rd_off.o_word.payload)
            m.d.comb += rd_off.o_word.ready.eq(~last_bag)
            with m.If(last_bag | rd_off.o_word.valid):
                m.d.sync += [sc_raw.eq(end - sc_pos),
                             sc_left.eq(end - sc_pos),
                             sc_cnt.eq(0), sc_pos.eq(end)]
                m.d.sync += sc_state.eq(_SC_SCAN)
            with m.Else():
                m.d.sync += sc_state.eq(_SC_END)

        def scan_done():
            """The bag is queued: on to the next one in the same cycle."""
            m.d.sync += sc_bags_left.eq(sc_bags_left - 1)
            with m.If(sc_bags_left == 1):
                m.d.sync += sc_done.eq(1)
                m.d.sync += sc_state.eq(_SC_IDLE)
            with m.Else():
                next_bag(sc_bags_left == 2)

        with m.Switch(sc_state):
            with m.Case(_SC_IDLE), m.If(start_emit):
                m.d.sync += sc_state.eq(_SC_SKIP0)
            with m.Case(_SC_SKIP0):
                m.d.comb += rd_off.o_word.ready.eq(1)
                with m.If(rd_off.o_word.valid):
                    m.d.sync += sc_state.eq(_SC_END)
            with m.Case(_SC_END):
                next_bag(sc_bags_left == 1)
            with m.Case(_SC_SCAN):
                counted = ~is_pad(rd_scan.o_word.payload)
                cnt_next = (sc_cnt + counted)[:32]
                last_word = sc_left == 1
                with m.If(~sc_left.any()):      # an empty bag
                    m.d.comb += [bagq.w_en.eq(1), bagq.w_data.eq(Cat(sc_raw, sc_cnt))]
                    with m.If(bagq.w_rdy):
                        scan_done()
                with m.Else():
                    # The bag's last index is taken only with room to queue the bag.
                    take = rd_scan.o_word.valid & (~last_word | bagq.w_rdy)
                    m.d.comb += rd_scan.o_word.ready.eq(~last_word | bagq.w_rdy)
                    with m.If(take):
                        m.d.sync += [sc_left.eq(sc_left - 1), sc_cnt.eq(cnt_next)]
                        with m.If(last_word):
                            m.d.comb += [bagq.w_en.eq(1),
                                         bagq.w_data.eq(Cat(sc_raw, cnt_next))]
                            scan_done()

        # Emitter: one item per counted index, or one empty_bag item, bag by bag.
        def pop_bag():
            """Take the next bag from the count scan, else wait in POP."""
            m.d.comb += bagq.r_en.eq(1)
            with m.If(bagq.r_rdy):
                raw, cnt = bagq.r_data[:32], bagq.r_data[32:]
                m.d.sync += [em_left.eq(raw), em_cnt.eq(cnt), em_k.eq(0)]
                with m.If(cnt.any()):
                    m.d.sync += em_state.eq(_EM_ROWS)
                with m.Else():
                    m.d.sync += em_state.eq(_EM_EMPTY)
            with m.Else():
                m.d.sync += em_state.eq(_EM_POP)

        def bag_done():
            m.d.sync += em_bags_left.eq(em_bags_left - 1)
            with m.If(em_bags_left == 1):
                m.d.sync += em_done.eq(1)
                m.d.sync += em_state.eq(_EM_IDLE)
            with m.Else():
                pop_bag()

        weight = Mux(d.weighted, rd_w.o_word.payload, _ONE_FP32)
        with m.Switch(em_state):
            with m.Case(_EM_IDLE), m.If(start_emit):
                m.d.sync += em_state.eq(_EM_POP)
            with m.Case(_EM_POP):
                pop_bag()
            with m.Case(_EM_EMPTY), m.If(out_free):
                emit(empty_bag=1, weight=_ONE_FP32)
                with m.If(~em_left.any()):
                    bag_done()
                with m.Else():
                    m.d.sync += em_state.eq(_EM_ROWS)   # its padding indices
            with m.Case(_EM_ROWS):
                iw = rd_idx.o_word.payload
                pad = is_pad(iw)
                avail = rd_idx.o_word.valid & (~d.weighted | rd_w.o_word.valid)
                step = avail & (pad | out_free)
                m.d.comb += [rd_idx.o_word.ready.eq(step),
                             rd_w.o_word.ready.eq(step & d.weighted)]
                with m.If(step):
                    m.d.sync += em_left.eq(em_left - 1)
                    with m.If(~pad):
                        emit(row=iw, row_k=em_k[:16],
                             last_row=em_k == (em_cnt - 1)[:32],
                             weight=weight, count=em_cnt[:16])
                        m.d.sync += em_k.eq(em_k + 1)
                    with m.If(em_left == 1):
                        bag_done()      # and the next bag in the same cycle
        return m
