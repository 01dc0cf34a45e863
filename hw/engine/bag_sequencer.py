"""The front of LOOKUP and UPDATE: every check of ``docs/embedding.md`` in its order,
then the bags turned into the per-row stream :class:`~.row_gather.RowGather` takes."""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..bus.axi import AXI4Signature
from ..cxl.messages import LINE_BITS
from ..widths import check_int, check_pow2
from .bag_emitter import BagEmitter
from .bag_scan import BAG, BagScan
from .buffer_check import BufferCheck
from .buffer_reader import LINE_SHIFT, BufferReader
from .descriptor import Descriptor, Status
from .field_check import FieldCheck
from .line_replay import REPLAY_PORTS, LineReplay
from .reader_arbiter import ReaderArbiter
from .row_gather import ROW

__all__ = ["ID_BITS", "STATUS", "BagSequencer"]

#: The completion status of one descriptor (a :class:`~.descriptor.Status` code).
STATUS = data.StructLayout({"status": 8, "read_error": 1})

#: Bags the count scan may run ahead of the row emission.
_BAG_FIFO = 16
#: The buffer readers in AXI ID order (the arbiter serves them round robin).
_READERS = ("offsets", "indices", "scan", "weights")
#: AXI ID bits a bag sequencer needs at least: one ID per buffer reader.
ID_BITS = (len(_READERS) - 1).bit_length()


class BagSequencer(wiring.Component):
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
    it is offered, so in this pass each reader may have up to ``FLY_LINES`` lines in
    flight. A failing check stops further reads of its buffer (and a bad offset also
    stops the index reads); the reads in flight are drained and discarded, so the block
    returns to idle. Nothing is emitted on ``o_rows`` in this pass, so an UPDATE
    touches no row of a bad descriptor, and LOOKUP shares the path.

    **Pass 2: emission.** Only a descriptor that passed reads its buffers again: the
    offsets (bag boundaries), the indices twice and, when ``weighted``, the weights.
    With ``replay_lines`` > 0, a descriptor whose offsets (as pass 1 reads them) and
    indices fit in that many lines has them kept on chip as pass 1 reads them
    (:class:`~.line_replay.LineReplay`), and pass 2 takes its offsets and both copies of
    its indices from there: each is read from memory once, and pass 2's first row no
    longer waits a memory latency for them (a GPU-memory round trip with the buffers
    in GPU memory). Only the weights are read again.
    A count scan runs ahead over one copy of the indices and queues each bag's length
    and counted rows (indices other than the padding index) in a FIFO of
    ``_BAG_FIFO`` bags; the emitter walks the second copy in step with the weights and
    emits each counted index as an ``o_rows`` item (``row``, ``row_k``, ``last_row``,
    ``weight`` = the fp32 weight or 1.0 = ``0x3F800000``, ``count``), or one item with
    ``empty_bag = 1`` (``row = row_k = last_row = 0``, ``weight`` 1.0, ``count`` 0)
    for a bag with no counted index. So the count ``n`` of a bag is known before its
    first row. ``row_k`` and ``count`` are 16-bit fields of ``ROW``: a bag of more than
    65535 counted rows wraps them (``last_row`` stays exact).

    **Cost.** Without replay each buffer is read twice (the indices three times); the extra reads
    stream at full line rate, so the cost is PMEM bandwidth, not a stall per index.
    Each reader keeps up to ``BUF_LINES / BURST`` = 4 bursts of 8 lines in flight in
    pass 2 (``FLY_LINES / BURST`` = 32 in pass 1; AXI ID per reader: 0 offsets, 1
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

    **Structure.** An FSM (IDLE, SIZE_REGIONS, CHECK_FIELDS, CHECK_BUFFERS, START_EMIT,
    EMIT, STATUS) holds the descriptor and steers the parts: :class:`~.field_check.
    FieldCheck` (the field checks), four :class:`~.buffer_reader.BufferReader` s
    (offsets, indices, count scan, weights) on one :class:`~.reader_arbiter.
    ReaderArbiter`, :class:`~.buffer_check.BufferCheck` (pass 1's lanes, fed by the
    offsets and indices readers in line mode), and :class:`~.bag_scan.BagScan`, the bag
    FIFO and :class:`~.bag_emitter.BagEmitter` (pass 2).

    **Streams and reset.** ``o_rows`` is a register loaded on ``~valid | ready``;
    ``o_status`` (exactly one per descriptor) is offered only once the last ``o_rows``
    item has been taken. ``i_desc.ready`` is high only when idle. ``arvalid`` and the AR
    payload are registers; ``rready`` and ``bready`` are always 1, AW and W are never
    used. Synchronous reset drops the descriptor in progress; the AXI subordinate must be
    reset with the block.

    **Read errors.** An R beat with ``rresp`` other than OKAY (a PMEM error, or a
    CXL.cache read of the GPU-memory scratch window answered with an error) during a
    descriptor: in pass 1 the descriptor ends with ``READ_ERROR`` once its readers are
    idle (before BAD_OFFSETS and INDEX_RANGE, which its data cannot be trusted for) and
    emits no row; in pass 2 (rows already going out) every row from then on has
    ``bad`` set and the status carries ``read_error`` (with status OK: the rows
    emitted still flow). The failed data cannot break the stream: the count scan clamps
    the offsets it reads into the checked range, and the emitter, from the error on,
    takes the first ``counted`` indices of each bag as its rows (``i_counted_only``),
    so every bag still ends with its last row. The rows a failed read made come after
    the flag is set; a read that fails after the last row (padding indices, weights)
    shows only in the status. A row already waiting on ``o_rows`` when the error comes
    (made from earlier data) keeps its ``bad`` of 0 until it is taken. The engine writes
    no table row for the descriptor and completes it with ``READ_ERROR``.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address bits, 12 to 48 (device memory is ``2**addr_width`` bytes).
    id_width : int
        AXI ID bits, 2 to 16 (four IDs are used).
    replay_lines : int
        Lines of the replay store (0: none), a power of two up to 4096 otherwise.

    Members
    -------
    i_desc : ``In(stream.Signature(Descriptor))``
        One LOOKUP / UPDATE descriptor at a time.
    pmem : ``Out(AXI4Signature(addr_width=addr_width, data_width=512, id_width=id_width))``
        PMEM read port (AR and R).
    o_rows : ``Out(stream.Signature(ROW))``
        Counted rows of every bag in index order, and lone empty bags.
    o_status : ``Out(stream.Signature(STATUS))``
        The descriptor's :class:`~.descriptor.Status`, after its last ``o_rows`` item,
        and ``read_error`` (a read failed in pass 2, see above).
    passed : ``Out(1)``
        The descriptor passed every check and its rows are being emitted (pass 2).

    Raises
    ------
    ValueError
        If a parameter is not an integer in its range.
    """

    def __init__(self, *, addr_width: int, id_width: int, replay_lines: int = 0):
        check_int("addr_width", addr_width, 12, 48)
        check_int("id_width", id_width, ID_BITS, 16)
        if check_int("replay_lines", replay_lines, 0, 4096):
            check_pow2("replay_lines", replay_lines, 2, 4096)
        self._addr_width = addr_width
        self._id_width = id_width
        self._replay_lines = replay_lines
        super().__init__({
            "i_desc": In(stream.Signature(Descriptor)),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
            "o_rows": Out(stream.Signature(ROW)),
            "o_status": Out(stream.Signature(STATUS)),
            "passed": Out(1),
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
        m.submodules.arbiter = arbiter = ReaderArbiter(
            addr_width=aw, id_width=self._id_width, readers=len(_READERS))
        wiring.connect(m, arbiter.pmem, wiring.flipped(self.pmem))
        readers = {}
        for name in _READERS:
            readers[name] = m.submodules[f"{name}_reader"] = BufferReader(addr_width=aw)
        offsets, indices, scan_indices, weights = readers.values()
        desc = Signal(Descriptor)
        # Replay (pass 2 of a descriptor whose offsets and indices fit): the first
        # REPLAY_PORTS readers take their bursts from the replay store, else from PMEM.
        replay = Signal()
        replaying = Signal()
        n_replay = self._replay_lines
        if n_replay:
            m.submodules.replay = store = LineReplay(addr_width=aw, lines=n_replay)
            # The lines of each buffer in pass 1 (its words rounded up to whole lines).
            off_lines = Signal(34)
            idx_lines = Signal(33)
            m.d.comb += [
                off_lines.eq((desc.num_bags + desc.include_last_offset + 15) >> 4),
                idx_lines.eq((desc.num_indices + 15) >> 4),
            ]
        for k, reader in enumerate(readers.values()):
            port = getattr(arbiter, f"i_reader{k}")
            if not n_replay or k >= REPLAY_PORTS:
                wiring.connect(m, reader.pmem, port)
                continue
            src = reader.pmem
            dst = getattr(store, f"i_port{k}")
            for side, on in ((port, ~replaying), (dst, replaying)):
                m.d.comb += [side.req.eq(src.req & on), side.line.eq(src.line),
                             side.len.eq(src.len)]
            m.d.comb += [
                src.grant.eq(Mux(replaying, dst.grant, port.grant)),
                src.r.valid.eq(Mux(replaying, dst.r.valid, port.r.valid)),
                src.r.payload.eq(Mux(replaying, dst.r.payload, port.r.payload)),
            ]
        if n_replay:
            m.d.comb += [
                replaying.eq(replay & self.passed),
                store.off_lines.eq(off_lines),     # fits when the descriptor replays
                store.off_base.eq(desc.offsets_addr[LINE_SHIFT:aw]),
                store.idx_base.eq(desc.indices_addr[LINE_SHIFT:aw]),
                store.i_off_data.eq(arbiter.i_reader0.r.payload),
                store.i_idx_data.eq(arbiter.i_reader1.r.payload),
            ]

        m.submodules.field_check = field_check = FieldCheck(addr_width=aw)
        m.submodules.buffer_check = buffer_check = BufferCheck()
        m.submodules.scan = scan = BagScan()
        m.submodules.bags = bags = SyncFIFOBuffered(width=BAG.size, depth=_BAG_FIFO)
        m.submodules.emitter = emitter = BagEmitter()
        for block in (field_check, buffer_check, scan, emitter):
            m.d.comb += block.i_desc.eq(desc)
        # Pass 1 takes the readers' lines (line mode), pass 2 their words.
        wiring.connect(m, offsets.o_line, buffer_check.i_offsets)
        wiring.connect(m, indices.o_line, buffer_check.i_indices)
        wiring.connect(m, offsets.o_word, scan.i_offsets)
        wiring.connect(m, scan_indices.o_word, scan.i_indices)
        wiring.connect(m, scan.o_bag, bags.w_stream)
        wiring.connect(m, bags.r_stream, emitter.i_bag)
        wiring.connect(m, indices.o_word, emitter.i_indices)
        wiring.connect(m, weights.o_word, emitter.i_weights)
        wiring.connect(m, emitter.o_rows, wiring.flipped(self.o_rows))
        # A read of the descriptor's buffers answered with an error (SLVERR / DECERR):
        # READ_ERROR in pass 1; in pass 2 every row from then on is ``bad``.
        rd_err = Signal()
        r_err = self.pmem.rvalid & self.pmem.rready & self.pmem.rresp.any()
        with m.If(r_err):
            m.d.sync += rd_err.eq(1)
        # A row waiting on ``o_rows`` keeps the ``bad`` it was offered with (the
        # payload holds until the transfer); the rows after it see the error.
        waiting, waiting_bad = Signal(), Signal()
        bad = Mux(waiting, waiting_bad, rd_err)
        m.d.sync += [waiting.eq(self.o_rows.valid & ~self.o_rows.ready),
                     waiting_bad.eq(bad)]
        m.d.comb += [self.o_rows.p.bad.eq(bad), emitter.i_counted_only.eq(rd_err)]

        def start(reader, addr, count):
            m.d.comb += [reader.i_start.eq(1), reader.i_base.eq(addr[LINE_SHIFT:aw]),
                         reader.i_count.eq(count)]

        status = Signal(8)

        def finish(code):
            m.d.sync += status.eq(code)
            m.next = "STATUS"

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i_desc.ready.eq(1)
                with m.If(self.i_desc.valid):
                    m.d.sync += [desc.eq(self.i_desc.payload), rd_err.eq(0)]
                    m.next = "SIZE_REGIONS"

            with m.State("SIZE_REGIONS"):      # the field check's products settle
                m.next = "CHECK_FIELDS"

            with m.State("CHECK_FIELDS"):
                with m.If(field_check.o_status != Status.OK.value):
                    finish(field_check.o_status)
                with m.Else():
                    start(offsets, desc.offsets_addr, desc.num_bags + desc.include_last_offset)
                    start(indices, desc.indices_addr, desc.num_indices)
                    m.d.comb += buffer_check.i_start.eq(1)
                    if n_replay:
                        fits = off_lines + idx_lines <= n_replay
                        m.d.sync += replay.eq(fits)
                        m.d.comb += store.i_begin.eq(1)
                    m.next = "CHECK_BUFFERS"

            with m.State("CHECK_BUFFERS"):
                if n_replay:
                    m.d.comb += [
                        store.i_off.eq(replay & arbiter.i_reader0.r.valid),
                        store.i_idx.eq(replay & arbiter.i_reader1.r.valid),
                    ]
                bad_offsets, bad_index = buffer_check.o_bad_offsets, buffer_check.o_bad_index
                m.d.comb += [offsets.i_line_mode.eq(1), indices.i_line_mode.eq(1),
                             offsets.i_flush.eq(bad_offsets),
                             indices.i_flush.eq(bad_offsets | bad_index)]
                with m.If(offsets.o_idle & indices.o_idle):
                    with m.If(rd_err | r_err):
                        finish(Status.READ_ERROR.value)
                    with m.Elif(bad_offsets):
                        finish(Status.BAD_OFFSETS.value)
                    with m.Elif(bad_index):
                        finish(Status.INDEX_RANGE.value)
                    with m.Elif(desc.num_bags == 0):
                        finish(Status.OK.value)     # indices in no bag: nothing to emit
                    with m.Else():
                        m.next = "START_EMIT"

            with m.State("START_EMIT"):
                m.d.comb += self.passed.eq(1)
                start(offsets, desc.offsets_addr, desc.num_bags)
                start(indices, desc.indices_addr, desc.num_indices)
                start(scan_indices, desc.indices_addr, desc.num_indices)
                start(weights, desc.weights_addr, Mux(desc.weighted, desc.num_indices, 0))
                m.d.comb += [scan.i_start.eq(1), emitter.i_start.eq(1)]
                m.next = "EMIT"

            # The emitter is done only after the scan has sent it the last bag.
            with m.State("EMIT"):
                m.d.comb += self.passed.eq(1)
                with m.If(emitter.o_done & ~self.o_rows.valid):
                    finish(Status.OK.value)

            with m.State("STATUS"):
                m.d.comb += [self.o_status.valid.eq(1), self.o_status.p.status.eq(status),
                             self.o_status.p.read_error.eq(rd_err)]
                with m.If(self.o_status.ready):
                    m.next = "IDLE"
        return m
