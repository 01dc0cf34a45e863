"""The arithmetic and memory core of UPDATE: gradient lines applied to table rows in
PMEM, repeated rows coalesced in an on-chip row cache."""

from amaranth.hdl import Module, Mux
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature
from hw.widths import check_int

from .row_cursor import RowCursor
from .row_fill import RowFill
from .row_writeback import RowWriteback
from .update_control import UpdateControl
from .update_layouts import (
    DONE,
    EVICTED_BITS,
    GLINE,
    ITEM,
    LINE_BITS,
    check_cache_rows,
    ctrl_layout,
)
from .update_pipeline import UpdatePipeline

__all__ = ["DONE", "EVICTED_BITS", "GLINE", "ITEM", "ScatterUpdate", "ctrl_layout"]

#: AXI channels of :class:`RowWriteback` (the others are :class:`RowFill`'s).
_WRITE_CHANNELS = ("aw", "w", "b")


class ScatterUpdate(wiring.Component):
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

    **Structure.** :class:`~.update_control.UpdateControl` holds the tags, checks each
    item and orders hits, misses and the flush (its :class:`~.cache_flush.CacheFlush`
    clears the tags after reset, walks them at ``last`` and reports ``o_done``);
    :class:`~.update_pipeline.UpdatePipeline` does the arithmetic on the line memory,
    which :class:`~.row_writeback.RowWriteback` (write-backs, AW / W / B) reads and
    :class:`~.row_fill.RowFill` (fills, AR / R, the read-ahead lines) writes in the
    cycles the pipeline leaves free; a :class:`~.row_cursor.RowCursor` addresses the
    row moving between the cache and PMEM.

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
        self._addr_width = check_int("addr_width", addr_width, 12, 64)
        self._id_width = check_int("id_width", id_width, 1, 16)
        self._cache_rows = check_cache_rows(cache_rows)
        self._max_lines_per_row = check_int("max_lines_per_row", max_lines_per_row, 1, 64)
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
        geometry = {"cache_rows": self._cache_rows, "max_lines_per_row": self._max_lines_per_row}
        axi_params = {"addr_width": self._addr_width, "id_width": self._id_width}
        m.submodules.control = control = UpdateControl(addr_width=self._addr_width,
                                                       **geometry)
        m.submodules.pipeline = pipeline = UpdatePipeline(**geometry)
        m.submodules.writeback = writeback = RowWriteback(**axi_params, **geometry)
        m.submodules.fill = fill = RowFill(**axi_params, **geometry)
        m.submodules.cursor = cursor = RowCursor(addr_width=self._addr_width)
        # The cache's lines, written in 16-bit granules: an update writes only the
        # elements it changes, so the others never depend on a stale copy.
        line_bits = (self._max_lines_per_row - 1).bit_length()
        m.submodules.lines = lines = Memory(shape=LINE_BITS,
                                            depth=self._cache_rows << line_bits, init=[])
        read = lines.read_port(transparent_for=())
        write = lines.write_port(granularity=16)

        wiring.connect(m, wiring.flipped(self.i_items), control.i_items)
        wiring.connect(m, control.o_done, wiring.flipped(self.o_done))
        wiring.connect(m, control.o_op, pipeline.i_op)
        wiring.connect(m, control.o_writeback, writeback.i_row)
        wiring.connect(m, control.o_fill, fill.i_row)
        wiring.connect(m, control.o_drop, fill.i_drop)
        wiring.connect(m, wiring.flipped(self.i_lines), fill.i_lines)
        m.d.comb += [
            control.i_ctrl.eq(self.i_ctrl),
            control.op_slot_busy.eq(pipeline.slot_busy),
            control.pipeline_busy.eq(pipeline.busy),
            control.writeback_busy.eq(writeback.busy),
            control.b_owed.eq(writeback.b_owed),
            control.b_owed_full.eq(writeback.b_owed_full),
            control.filled.eq(fill.filled),
            control.drop_pending.eq(fill.drop_pending),
            writeback.read_busy.eq(pipeline.read_busy),
            fill.write_busy.eq(pipeline.write_busy),
        ]

        # One row at a time moves between the cache and PMEM: the write-back's and the
        # fill's requests start the cursor, and each steps it along its row.
        evict, refill = control.o_writeback, control.o_fill
        m.d.comb += [
            cursor.start.eq(evict.valid & evict.ready | refill.valid & refill.ready),
            cursor.row.eq(Mux(evict.valid, evict.p.row, refill.p.row)),
            cursor.step.eq(writeback.step | fill.step),
            cursor.table_base.eq(control.ctrl.table_base),
            cursor.lines_per_row.eq(control.ctrl.lines_per_row),
            writeback.line.eq(cursor.line),
            writeback.at_last.eq(cursor.at_last),
            writeback.addr.eq(cursor.addr),
            fill.at_end.eq(cursor.at_end),
            fill.addr.eq(cursor.addr),
        ]

        # The pipeline has the line memory's ports; the write-back reads and the fill
        # writes in the cycles it leaves them free.
        m.d.comb += [
            read.addr.eq(Mux(writeback.read_en, writeback.read_addr, pipeline.read_addr)),
            pipeline.read_data.eq(read.data),
            writeback.read_data.eq(read.data),
        ]
        with m.If(fill.write_en):
            m.d.comb += [write.addr.eq(fill.write_addr), write.data.eq(fill.write_data),
                         write.en.eq(fill.write_en.replicate(len(write.en)))]
        with m.Else():
            m.d.comb += [write.addr.eq(pipeline.write_addr), write.data.eq(pipeline.write_data),
                         write.en.eq(pipeline.write_en)]

        for path, member, port in self.pmem.signature.flatten(self.pmem):
            name = path[0]
            source = getattr(writeback.pmem if name.startswith(_WRITE_CHANNELS) else fill.pmem,
                             name)
            m.d.comb += port.eq(source) if member.flow == Out else source.eq(port)
        return m
