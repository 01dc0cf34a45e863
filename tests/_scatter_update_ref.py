"""Test-only copy of ScatterUpdate as it was before the split (hw/engine/scatter_update.py),
the reference of tests/test_scatter_update_equivalence.py."""

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.arith import Fp32ToBf16, FpAdd, FpMul
from hw.bus.axi import AXI4Signature, AxiBurst

__all__ = ["ScatterUpdateRef"]

#: Bits of a table / gradient line.
LINE_BITS = 512
#: fp32 elements of a line.
LINE_ELEMS = LINE_BITS // 32
#: AXI ``size`` of a 64-byte beat.
_SIZE_LINE = 6
#: Width of ``dim`` in ``i_ctrl`` (1..4096).
DIM_BITS = 13

#: One gradient line of one counted index (see :class:`ScatterUpdate` for bf16 tables).
ITEM = data.StructLayout({
    "row": 32,          # table row (already validated: < rows)
    "line": 7,          # gradient line: table line for fp32, 2*table line + half for bf16
    "weight": 32,       # fp32 per-sample weight, used when ``weighted``
    "grad": LINE_BITS,  # 16 fp32 gradient elements
    "last": 1,          # final item of the descriptor: flush and complete
    "nop": 1,           # carries no update (with ``last``: only flush and complete)
})

#: Completion of one descriptor.
DONE = data.StructLayout({"rows_written": 32, "updates": 32})

#: One line of a row as read ahead by the gather (``i_lines``).
GLINE = data.StructLayout({"data": LINE_BITS})

#: Bits of the evicted-row marks, indexed by a row's low bits.
EVICTED_BITS = 256


def ctrl_layout(addr_width: int) -> data.StructLayout:
    """Per-descriptor settings (``i_ctrl``)."""
    return data.StructLayout({
        "table_base": addr_width,   # byte address of row 0, 64-byte aligned
        "lines_per_row": 7,         # table lines per row, 1..max_lines_per_row
        "bf16": 1,                  # table elements are bf16 (else fp32)
        "weighted": 1,              # multiply the gradient by the item's weight
        "dim": DIM_BITS,            # elements per row: later (padding) elements are kept
    })


class _State(enum.Enum, shape=4):
    """Controller states (a Switch over this enum)."""
    CLEAR = 0
    RUN = 1         # accept items, issue hits into the update pipeline
    DRAIN = 2       # after ``last``: wait for the pipeline to empty, then flush
    WB_READ = 3
    WB_LOAD = 4
    WB_SEND = 5
    WB_WAIT = 6
    FILL = 7
    RETAG = 8       # re-read the tag of the filled slot
    F_READ = 9
    F_CHECK = 10
    F_NEXT = 11
    DONE = 12


def _check_int(name, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer from {lo} to {hi}, not {value!r}")
    return value


class ScatterUpdateRef(wiring.Component):
    """Applies UPDATE items to the table in PMEM, coalescing repeated rows on chip.

    For every item, in arrival order, the block computes for each of the 16 elements of
    the gradient line ``row = store(fl32(widen(row) + fl32(w * g)))`` (the multiply only
    when ``weighted``; ``store`` is the identity for fp32 and RNE rounding to bf16 for
    bf16 tables, applied after **every** update), which is the contract of
    ``docs/embedding.md`` ("Update (scatter)") when items arrive in contract order: per
    bag in order, per counted index in index order, the row's lines in order. Elements
    at or past ``dim`` (row padding) keep their old bits. NaN results are the canonical
    quiet NaN (``docs/numerics.md``); the units are :class:`~hw.arith.FpMul`,
    :class:`~hw.arith.FpAdd` and :class:`~hw.arith.Fp32ToBf16`, 16 lanes each.

    **Gradients of bf16 tables.** A bf16 table line holds 32 elements, two fp32 gradient
    lines' worth, so a bf16 row takes ``2 * lines_per_row`` items per counted index:
    item ``line = 2j + h`` carries gradient elements ``32j + 16h .. 32j + 16h + 15``
    (gradient line ``2j + h`` of the fp32 gradient vector, zero past its end) and
    updates half ``h`` of table line ``j``. For fp32 tables item ``line = j`` updates
    table line ``j``. In both cases item ``line`` carries gradient elements ``16*line ..
    16*line + 15``.

    **Coalescing.** A direct-mapped cache of ``cache_rows`` whole rows (data in one
    :class:`~amaranth.lib.memory.Memory` of ``cache_rows * 2**ceil(log2
    max_lines_per_row)`` lines, synchronous read; tags ``{row, valid}`` in a second
    memory). Row ``r`` lives in slot ``r mod cache_rows``. An item whose row is not
    cached evicts the slot's row, if any (written back line by line), then fills the
    slot from ``i_lines``. Later items of a cached row update the cached copy in order,
    which is the contract's sequential semantics. At ``last`` every cached row is
    written back (only the slots holding a row are visited, and the write-backs follow
    each other without waiting for their Bs), every B awaited, the cache invalidated,
    and ``o_done`` reports ``rows_written`` (write-backs: row misses) and ``updates``
    (items with ``line == 0``: counted indices). A row is therefore written once per
    descriptor unless another row of the same slot evicted it in between.
    **Read-ahead lines.** ``i_lines`` carries, for every counted index in item order,
    the ``lines_per_row`` lines of its row as the engine's
    :class:`~.row_gather.RowGather` read them ahead, many reads in flight. The first
    item of an index (``line`` 0) takes them: a miss fills the slot from them, a hit
    drops them (the cached copy is newer). Their copy is current unless this
    descriptor wrote the row back earlier (an eviction, whose write may land after the
    gather read the row): evictions mark the row's low 8 bits in a 256-bit mask,
    cleared when the descriptor completes, and a miss of a marked row drops its lines
    and reads the row from PMEM instead (one single-beat burst per line, so no burst
    crosses a 4 KiB boundary, same ID, so beats return in order). That read starts
    only once every B owed (of every earlier eviction) has arrived, so it sees the
    durable write-back (``docs/pmem-model.md``: durable at B); false marks only cost
    time. Fills from the gathered lines wait for no B (while fewer than a cache's
    worth of lines are owed), and the flush awaits every B at its end. The block
    completes a descriptor only after every line of its indices has been taken or
    dropped.

    **Pipeline.** Items that hit are issued one per cycle into a fixed-latency
    pipeline (``weight * grad`` in the multipliers, with weight 1.0 when not
    ``weighted``, which is exact; the line read; the add; the bf16 rounding; the write
    of only the 16-bit granules the item updates, so padding elements and the other
    half of a bf16 line are never rewritten). An item reads its line 2 cycles after
    issue and adds 3 cycles after issue; the results of the items issued 3 (fp32
    only), 4 and 5 cycles before it to the same granules are forwarded into that add
    (newest wins), and an item whose granules an item issued 1 or 2 cycles before it
    (or 3, bf16) still computes waits in front of the pipeline. Each add therefore
    sees the previous update of its elements, which keeps the results bit-identical to
    the sequential definition. Misses, write-backs and fills are sequential; a miss
    starts once no item of its slot is left in the pipeline (items of other slots drain
    meanwhile: a write-back's line read waits while an item is at the read position, a
    fill's line write while one is at the write position), and the flush once the
    pipeline has drained.

    **Latency, throughput, reset.** Measured in simulation (no backpressure, 8-slot
    cache, PMEM read and write latency 20): an item that hits holds the input for one
    cycle, fp32 and bf16, weighted or not (the sequential controller this replaced
    took 9 / 13 cycles fp32 unweighted / weighted, 11 / 15 bf16), as long as the
    previous update of its elements was issued at least 3 (fp32) or 4 (bf16) cycles
    earlier; so rows of 3+ fp32 lines or 2+ bf16 lines never wait, and a one-line
    fp32 row repeated index after index takes 3 cycles per item, a two-line fp32 row
    1.5, a one-line bf16 row (two items, one per half) 2. An item's line is written 8
    cycles after its transfer. A miss holds the input while the items of its slot
    drain (up to 7 cycles; none when the previous items were of other slots), then
    takes the row's read-ahead lines (one per cycle) and re-reads its tag (1 cycle):
    the missing item holds the input 11 cycles on average for 4-line fp32 rows in a
    Zipf workload (13 while a miss waited for the whole pipeline to drain; 33 when
    every fill was a read at latency 20, and the read latency grows with PMEM's);
    when the slot was occupied the eviction adds the write-back of ``lines_per_row``
    lines (3 cycles per line plus backpressure). A row that comes back after its own
    eviction is read from PMEM after the write-back's Bs: 45 cycles per index for two
    4-line rows alternating in one slot. After reset the tag memory is cleared
    for ``cache_rows`` cycles (``i_items.ready`` low); reset drops the descriptor in
    progress (its cached rows are not written). AXI error responses are not checked.

    **Streams.** ``i_items.ready`` is high while the block runs (not clearing, missing,
    flushing or completing) and its check stage is empty or issuing an item that is
    not ``last``; it depends on registers and memory outputs only, not on
    ``i_items.valid``. ``i_ctrl`` is sampled with every ``i_items`` transfer (the flush
    at ``last`` uses the copy taken with that item). ``o_done`` is a register that
    holds until the transfer. All AXI valids and payloads come from registers.

    **Requirements on the input.** ``1 <= lines_per_row <= max_lines_per_row``, ``dim``
    consistent with it, ``row`` in range, items of a counted index contiguous and in
    line order, and a ``last`` item ending every descriptor. An item with ``nop`` set
    updates nothing; with ``last`` it only flushes and completes, so a feeder that
    learns of a descriptor's end after its final update (or a descriptor with no
    counted index) ends it with a ``nop`` + ``last`` item; a ``nop`` item without
    ``last`` is ignored.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address width, 12 to 64.
    id_width : int
        AXI ID width, 1 to 16 (the block uses ID 0).
    cache_rows : int
        Rows held on chip, a power of two from 2 to 256 (default 32).
    max_lines_per_row : int
        Largest ``lines_per_row``, 1 to 64 (default 16).

    Members
    -------
    i_ctrl : ``In(ctrl_layout(addr_width))``
        ``table_base``, ``lines_per_row``, ``bf16``, ``weighted``, ``dim``.
    i_items : ``In(stream.Signature(ITEM))``
        ``row``, ``line``, ``weight``, ``grad``, ``last``.
    i_lines : ``In(stream.Signature(GLINE))``
        The rows of the counted indices, read ahead (above).
    pmem : ``Out(AXI4Signature(addr_width=addr_width, data_width=512, id_width=id_width))``
    o_done : ``Out(stream.Signature(DONE))``

    Raises
    ------
    ValueError
        A parameter out of range, naming it and its value.
    """

    def __init__(self, *, addr_width: int, id_width: int, cache_rows: int = 32,
                 max_lines_per_row: int = 16):
        self._addr_width = _check_int("addr_width", addr_width, 12, 64)
        self._id_width = _check_int("id_width", id_width, 1, 16)
        _check_int("cache_rows", cache_rows, 2, 256)
        if cache_rows & (cache_rows - 1):
            raise ValueError(f"cache_rows must be a power of two, not {cache_rows}")
        self._cache_rows = cache_rows
        self._max_lines_per_row = _check_int("max_lines_per_row", max_lines_per_row, 1, 64)
        super().__init__({
            "i_ctrl": In(ctrl_layout(addr_width)),
            "i_items": In(stream.Signature(ITEM)),
            "i_lines": In(stream.Signature(GLINE)),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
            "o_done": Out(stream.Signature(DONE)),
        })

    addr_width = property(lambda self: self._addr_width)
    id_width = property(lambda self: self._id_width)
    cache_rows = property(lambda self: self._cache_rows)
    max_lines_per_row = property(lambda self: self._max_lines_per_row)

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        slot_bits = (self._cache_rows - 1).bit_length()
        line_bits = (self._max_lines_per_row - 1).bit_length()
        i, axi, done = self.i_items, self.pmem, self.o_done

        # Data written in 16-bit granules: an item writes only the elements it updates,
        # so the other elements of the line never depend on a stale copy.
        m.submodules.data = data_mem = Memory(
            shape=LINE_BITS, depth=self._cache_rows << line_bits, init=[])
        rd = data_mem.read_port(transparent_for=())
        wr = data_mem.write_port(granularity=16)
        tag_layout = data.StructLayout({"row": 32, "valid": 1})
        m.submodules.tags = tag_mem = Memory(shape=tag_layout, depth=self._cache_rows,
                                             init=[])
        tag_rd = tag_mem.read_port(transparent_for=())
        tag_wr = tag_mem.write_port()

        muls = [FpMul() for _ in range(LINE_ELEMS)]
        adds = [FpAdd() for _ in range(LINE_ELEMS)]
        rnds = [Fp32ToBf16() for _ in range(LINE_ELEMS)]
        for k in range(LINE_ELEMS):
            m.submodules[f"mul{k}"] = muls[k]
            m.submodules[f"add{k}"] = adds[k]
            m.submodules[f"rnd{k}"] = rnds[k]

        # --- registered state
        cur = Signal(ITEM, reset_less=True)     # stage A: the item being checked
        a_valid = Signal()
        ctrl = Signal(ctrl_layout(aw), reset_less=True)
        slot = Signal(slot_bits)            # the item's slot; the scan pointer in flush
        addr_row = Signal(32, reset_less=True)   # row being written back or read
        flushing = Signal()
        cnt = Signal(7)                     # write-back line / AR count
        r_cnt = Signal(7)                   # R beats received
        # Write-backs go on while earlier Bs are owed, up to a cache's worth of lines.
        owed_max = self._cache_rows * self._max_lines_per_row
        owed_bits = (2 * owed_max).bit_length()
        b_owed = Signal(owed_bits)          # write-back lines sent, B not yet received
        owed_high = Signal()
        m.d.comb += owed_high.eq(b_owed >= owed_max)
        held = Signal(self._cache_rows)     # slots holding a row (tags valid)
        first_held = Signal(slot_bits)      # the lowest of them
        for k in reversed(range(self._cache_rows)):
            with m.If(held[k]):
                m.d.comb += first_held.eq(k)
        aw_pend = Signal()
        w_pend = Signal()
        w_data = Signal(LINE_BITS, reset_less=True)
        rows_written = Signal(32)
        updates = Signal(32)
        gl = self.i_lines
        drop_left = Signal(16)              # gathered lines still to drop
        evicted = Signal(EVICTED_BITS)      # rows written back by this descriptor (hashed)
        gfill = Signal()                    # the fill takes the gathered lines
        accounted = Signal()                # stage A's index has its lines taken or dropped

        lpr = ctrl.lines_per_row
        tline = Mux(ctrl.bf16, cur.line[1:], cur.line[:6])
        half = cur.line[0]

        # --- addresses: table_base + (addr_row * lines_per_row + line) * 64
        lpr32 = Signal(32)
        m.d.comb += lpr32.eq(lpr)
        row_line = Signal(64)
        m.d.comb += row_line.eq(addr_row * lpr32)
        row_addr = Signal(aw)
        m.d.comb += row_addr.eq(ctrl.table_base + (row_line << 6))
        m.d.comb += [
            axi.awaddr.eq(row_addr + (cnt << 6)),
            axi.araddr.eq(row_addr + (cnt << 6)),
        ]
        for p in ("aw", "ar"):
            m.d.comb += [
                getattr(axi, f"{p}size").eq(_SIZE_LINE),
                getattr(axi, f"{p}burst").eq(AxiBurst.INCR),
            ]
        m.d.comb += [
            axi.awvalid.eq(aw_pend),
            axi.wvalid.eq(w_pend),
            axi.wdata.eq(w_data),
            axi.wstrb.eq((1 << (LINE_BITS // 8)) - 1),
            axi.wlast.eq(1),
            axi.bready.eq(1),
        ]
        aw_done = axi.awvalid & axi.awready
        with m.If(aw_done & ~axi.bvalid):
            m.d.sync += b_owed.eq(b_owed + 1)
        with m.Elif(~aw_done & axi.bvalid):
            m.d.sync += b_owed.eq(b_owed - 1)

        # --- stage A: the cache line, the granules the item writes, the tag check
        # Granule ``g`` is bits 16g..16g+15 of the line. Lane ``e`` is a table element
        # iff 16 * line + e < dim; fp32 lane e is granules 2e, 2e+1; bf16 lane e of
        # half h is granule 16h + e.
        remaining = Signal(DIM_BITS + 1)
        m.d.comb += remaining.eq(ctrl.dim - (cur.line << 4))
        live = [~remaining[DIM_BITS] & (remaining[:DIM_BITS] > e)
                for e in range(LINE_ELEMS)]
        fp32_mask = Cat(*(live[g // 2] for g in range(2 * LINE_ELEMS)))
        bf16_mask = Cat(*(live[e] & ~half for e in range(LINE_ELEMS)),
                        *(live[e] & half for e in range(LINE_ELEMS)))
        meta_layout = data.StructLayout({
            "addr": line_bits + slot_bits,  # {slot, table line}: the cache line
            "mask": 2 * LINE_ELEMS,         # granules written
            "half": 1,
            "bf16": 1,
        })
        a_meta = Signal(meta_layout)
        m.d.comb += [
            a_meta.addr.eq(Cat(tline[:line_bits], slot)),
            a_meta.mask.eq(Mux(ctrl.bf16, bf16_mask, fp32_mask)),
            a_meta.half.eq(half),
            a_meta.bf16.eq(ctrl.bf16),
        ]
        tag = data.View(tag_layout, tag_rd.data)
        hit = Signal()
        m.d.comb += hit.eq(tag.valid & (tag.row == cur.row))

        # --- the update pipeline, one item per cycle, fixed latency. An item issued at
        # position 0 (from stage A) is at position ``k`` k cycles later:
        #   0: weight * grad into the multipliers (weight 1.0 unweighted: exact)
        #   2: cache line read
        #   3: line (with forwarding) + product into the adders
        #   6: sums; into the bf16 rounding; forwarded to position 3 (fp32 only)
        #   7: the line written (granules of the item); forwarded to position 3
        #   8: (the line written last cycle, forwarded to position 3)
        depth = 8
        valid = [None] + [Signal(name=f"p{k}_valid") for k in range(1, depth + 1)]
        meta = [a_meta] + [Signal(meta_layout, name=f"p{k}_meta", reset_less=True)
                           for k in range(1, depth + 1)]
        issue = Signal()
        m.d.sync += valid[1].eq(issue)
        m.d.sync += meta[1].eq(a_meta)
        for k in range(1, depth):
            m.d.sync += [valid[k + 1].eq(valid[k]), meta[k + 1].eq(meta[k])]
        busy = Signal()     # an item not yet written
        m.d.comb += busy.eq(Cat(*valid[1:depth]).any())
        slot_busy = Signal()    # an item of stage A's slot not yet written
        m.d.comb += slot_busy.eq(Cat(*(valid[k] & (meta[k].addr[line_bits:] == slot)
                                       for k in range(1, depth))).any())

        # --- gathered lines: every counted index's ``lines_per_row`` lines arrive on
        # ``i_lines`` in item order; a row held in the cache, or one this descriptor
        # wrote back (its gathered copy may predate the write), drops them.
        ev_sel = Signal(EVICTED_BITS, name="ev_sel")
        m.d.comb += ev_sel.eq(evicted >> cur.row[:(EVICTED_BITS - 1).bit_length()])
        line0 = ~cur.line.any()
        drop_inc = Signal(8)
        drop_take = Signal()
        m.d.comb += drop_take.eq(gl.valid & gl.ready & drop_left.any())
        m.d.sync += drop_left.eq(drop_left + drop_inc - drop_take)

        def overlaps(k):
            return (valid[k] & (meta[k].addr == a_meta.addr)
                    & (meta[k].mask & a_meta.mask).any())

        # An item issued now reads its line at position 2 and needs it at position 3;
        # an earlier item to the same granules at position 1 or 2 (or 3 if bf16: its
        # rounded value is not ready) would not have its result by then.
        hazard = Signal()
        m.d.comb += hazard.eq(overlaps(1) | overlaps(2) | (overlaps(3) & meta[3].bf16))

        weight = Signal(32)
        m.d.comb += weight.eq(Mux(ctrl.weighted, cur.weight, C(0x3F80_0000, 32)))
        for e in range(LINE_ELEMS):
            m.d.comb += [
                muls[e].i_operands.valid.eq(issue),
                muls[e].i_operands.p.a.eq(weight),
                muls[e].i_operands.p.b.eq(cur.grad[32 * e:32 * e + 32]),
                muls[e].o_result.ready.eq(1),
                adds[e].o_result.ready.eq(1),
                rnds[e].o_result.ready.eq(1),
            ]

        sums = Signal(LINE_BITS)
        m.d.comb += sums.eq(Cat(*(u.o_result.payload for u in adds)))
        total = Signal(LINE_BITS, reset_less=True)      # fp32 sums at position 7
        m.d.sync += total.eq(sums)
        narrow = Signal(LINE_BITS // 2)                 # bf16 sums at position 7
        m.d.comb += narrow.eq(Cat(*(u.o_result.payload for u in rnds)))
        wdata = Signal(LINE_BITS)
        m.d.comb += wdata.eq(Mux(meta[7].bf16, Cat(narrow, narrow), total))
        written = Signal(LINE_BITS, reset_less=True)    # position 8
        m.d.sync += written.eq(wdata)

        # The line at position 3: the cache copy, overlaid with the granules of the
        # items at positions 8, 7 and 6 (newest last) to the same line.
        line = rd.data
        for k, src, ok in ((8, written, C(1, 1)), (7, wdata, C(1, 1)),
                           (6, sums, ~meta[6].bf16)):
            sel = Signal(2 * LINE_ELEMS, name=f"fwd{k}")
            m.d.comb += sel.eq(meta[k].mask & (valid[k] & ok & (meta[k].addr == meta[3].addr))
                               .replicate(2 * LINE_ELEMS))
            merged = Signal(LINE_BITS, name=f"line_fwd{k}")
            m.d.comb += merged.eq(Cat(*(Mux(sel[g], src[16 * g:16 * g + 16],
                                            line[16 * g:16 * g + 16])
                                        for g in range(2 * LINE_ELEMS))))
            line = merged
        old = line
        for e in range(LINE_ELEMS):
            lane = slice(32 * e, 32 * e + 32)
            old_bf16 = Mux(meta[3].half, old[256 + 16 * e:256 + 16 * e + 16],
                           old[16 * e:16 * e + 16])
            m.d.comb += [
                adds[e].i_operands.valid.eq(valid[3]),
                adds[e].i_operands.p.a.eq(Mux(meta[3].bf16, Cat(C(0, 16), old_bf16),
                                              old[lane])),
                adds[e].i_operands.p.b.eq(muls[e].o_result.payload),
                rnds[e].i_operands.valid.eq(valid[6]),
                rnds[e].i_operands.p.a.eq(sums[lane]),
            ]

        m.d.comb += [
            rd.addr.eq(meta[2].addr),
            wr.addr.eq(meta[7].addr),
            wr.data.eq(wdata),
            wr.en.eq(meta[7].mask & valid[7].replicate(2 * LINE_ELEMS)),
            tag_rd.addr.eq(slot),
            tag_wr.addr.eq(slot),
        ]

        state = Signal(_State, init=_State.CLEAR)
        m.d.comb += gl.ready.eq(drop_left.any())   # FILL takes them too (below)

        def start_writeback(m, row):
            m.d.sync += [addr_row.eq(row), cnt.eq(0)]
            m.d.sync += state.eq(_State.WB_READ)

        def start_fill(m):
            m.d.sync += [addr_row.eq(cur.row), cnt.eq(0), r_cnt.eq(0)]
            m.d.sync += state.eq(_State.FILL)

        with m.Switch(state):
            with m.Case(_State.CLEAR):
                # Invalidate every tag after reset (memories keep their content).
                m.d.comb += [tag_wr.en.eq(1), tag_wr.data.eq(0)]
                m.d.sync += slot.eq(slot + 1)
                with m.If(slot.all()):
                    m.d.sync += state.eq(_State.RUN)

            with m.Case(_State.RUN):
                # Stage A issues a hit without hazard; takes an item when empty or
                # issuing (not past ``last``); a miss waits for the pipeline to drain.
                m.d.comb += [
                    issue.eq(a_valid & hit & ~hazard),
                    i.ready.eq(~a_valid | (issue & ~cur.last)),
                ]
                with m.If(issue & line0 & ~accounted):
                    m.d.comb += drop_inc.eq(lpr)
                with m.If(issue):
                    m.d.sync += a_valid.eq(0)
                    with m.If(cur.last):
                        m.d.sync += state.eq(_State.DRAIN)
                # A first index of a row not written back fills from the gathered
                # lines; otherwise they are dropped and the row is read from PMEM (a
                # miss of a later item of an index cannot happen; it would read PMEM
                # and consume nothing). A fill from PMEM waits for every B owed: it may
                # read a row an eviction wrote. A fill from the gathered lines does not.
                from_lines = Signal()
                m.d.comb += from_lines.eq(line0 & ~accounted & ~ev_sel[0])
                with m.If(a_valid & ~hit & ~slot_busy
                          & Mux(from_lines, ~owed_high, ~b_owed.any())):
                    m.d.sync += gfill.eq(from_lines)
                    with m.If(line0 & ~accounted & ev_sel[0]):
                        m.d.comb += drop_inc.eq(lpr)
                    m.d.sync += accounted.eq(1)
                    with m.If(tag.valid):
                        start_writeback(m, tag.row)
                        m.d.sync += evicted.bit_select(
                            tag.row[:(EVICTED_BITS - 1).bit_length()], 1).eq(1)
                    with m.Else():
                        start_fill(m)
                with m.If(i.valid & i.ready):
                    m.d.comb += tag_rd.addr.eq(i.p.row[:slot_bits])
                    with m.If(i.p.nop & i.p.last):
                        m.d.sync += ctrl.eq(self.i_ctrl)
                        m.d.sync += state.eq(_State.DRAIN)
                    with m.Elif(~i.p.nop):
                        m.d.sync += [cur.eq(i.p), ctrl.eq(self.i_ctrl), a_valid.eq(1),
                                     slot.eq(i.p.row[:slot_bits]), accounted.eq(0)]
                        with m.If(~i.p.line.any()):
                            m.d.sync += updates.eq(updates + 1)

            with m.Case(_State.DRAIN), m.If(~busy & ~drop_left.any()):
                m.d.sync += [flushing.eq(1), state.eq(_State.F_NEXT)]

            # --- write-back of the row in ``slot`` (``addr_row``), one line per burst
            with m.Case(_State.WB_READ), m.If(~valid[2]):   # the read port is free
                m.d.comb += rd.addr.eq(Cat(cnt[:line_bits], slot))
                m.d.sync += state.eq(_State.WB_LOAD)
            with m.Case(_State.WB_LOAD):
                m.d.sync += [w_data.eq(rd.data), aw_pend.eq(1), w_pend.eq(1)]
                m.d.sync += state.eq(_State.WB_SEND)
            with m.Case(_State.WB_SEND):
                with m.If(axi.awready):
                    m.d.sync += aw_pend.eq(0)
                with m.If(axi.wready):
                    m.d.sync += w_pend.eq(0)
                with m.If((~aw_pend | axi.awready) & (~w_pend | axi.wready)):
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If((cnt + 1)[:7] == lpr):
                        m.d.sync += state.eq(_State.WB_WAIT)
                    with m.Else():
                        m.d.sync += state.eq(_State.WB_READ)
            with m.Case(_State.WB_WAIT):
                # A miss's fill reads another row than the one written back, so it
                # starts at once; a later fill from PMEM waits for these Bs (above). The
                # flush goes on to the next slot and awaits every B at its end.
                m.d.sync += rows_written.eq(rows_written + 1)
                with m.If(~flushing):
                    start_fill(m)
                with m.Else():
                    m.d.sync += state.eq(_State.F_NEXT)

            # --- ``cur.row`` into ``slot``: the gathered lines (after the ones still to
            # drop), or a read, one line per burst, in order (ID 0)
            with m.Case(_State.FILL):
                # The write port is the pipeline's while an item is at position 7.
                port_free = ~valid[7]
                take = Signal()
                with m.If(gfill):
                    m.d.comb += [
                        gl.ready.eq(port_free),
                        take.eq(gl.valid & ~drop_left.any() & port_free),
                    ]
                with m.Else():
                    m.d.comb += [
                        axi.arvalid.eq(cnt != lpr),
                        axi.rready.eq(port_free),
                        take.eq(axi.rvalid & port_free),
                    ]
                with m.If(port_free):
                    m.d.comb += [wr.addr.eq(Cat(r_cnt[:line_bits], slot)),
                                 wr.data.eq(Mux(gfill, gl.p.data, axi.rdata)),
                                 wr.en.eq(take.replicate(2 * LINE_ELEMS))]
                with m.If(axi.arvalid & axi.arready):
                    m.d.sync += cnt.eq(cnt + 1)
                with m.If(take):
                    m.d.sync += r_cnt.eq(r_cnt + 1)
                    with m.If((r_cnt + 1)[:7] == lpr):
                        m.d.comb += [tag_wr.en.eq(1), tag_wr.data.eq(Cat(cur.row, C(1, 1)))]
                        m.d.sync += [state.eq(_State.RETAG), held.bit_select(slot, 1).eq(1)]
            with m.Case(_State.RETAG):
                # The tag read of this cycle (``slot``) sees the fill's tag write.
                m.d.sync += state.eq(_State.RUN)

            # --- flush: write back every cached row (the slots ``held`` marks, lowest
            # first), invalidate, complete
            with m.Case(_State.F_READ):
                m.d.sync += state.eq(_State.F_CHECK)
            with m.Case(_State.F_CHECK):
                m.d.sync += held.bit_select(slot, 1).eq(0)
                with m.If(tag.valid):
                    m.d.comb += [tag_wr.en.eq(1), tag_wr.data.eq(0)]
                    start_writeback(m, tag.row)
                with m.Else():
                    m.d.sync += state.eq(_State.F_NEXT)
            with m.Case(_State.F_NEXT):
                with m.If(held.any()):
                    m.d.sync += [slot.eq(first_held), state.eq(_State.F_READ)]
                with m.Elif(~b_owed.any()):
                    m.d.sync += [
                        slot.eq(0),
                        flushing.eq(0),
                        evicted.eq(0),
                        done.valid.eq(1),
                        done.p.rows_written.eq(rows_written),
                        done.p.updates.eq(updates),
                    ]
                    m.d.sync += state.eq(_State.DONE)
            with m.Case(_State.DONE):
                m.d.sync += [rows_written.eq(0), updates.eq(0)]
                with m.If(done.ready):
                    m.d.sync += done.valid.eq(0)
                    m.d.sync += state.eq(_State.RUN)
        return m
