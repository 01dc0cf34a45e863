"""The engine's bag sequencers and the ordered merge of their rows and statuses
(``docs/embedding.md``).

See :class:`SequencerPool`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..bus.axi import AXI4Signature
from ..bus.axi_arbiter import AxiArbiter
from ..cxl.messages import LINE_BITS
from ..widths import check_int
from .bag_sequencer import STATUS, BagSequencer
from .descriptor import DescKind, Descriptor
from .row_gather import rows_layout

__all__ = ["SequencerPool", "rows_layout", "update_layout"]

#: fp32 and bf16 elements per 64-byte line, as shifts.
_FP32_SHIFT, _BF16_SHIFT = 4, 5
_LPR_BITS = 9
#: Bytes per line, as a shift.
_LINE_SHIFT = 6


def update_layout(addr_width: int) -> data.StructLayout:
    """The running UPDATE's settings for the gradient feed and the scatter:
    ``glines`` fp32 gradient lines per row, ``items`` gradient items per row (lines of
    16 elements, or half-lines of bf16), ``lines_per_row`` table lines per row."""
    return data.StructLayout({
        "table_base": addr_width, "data_addr": addr_width, "num_bags": 32, "dim": 16,
        "bf16": 1, "weighted": 1, "lines_per_row": _LPR_BITS, "glines": _LPR_BITS,
        "items": _LPR_BITS + 1,
    })


def _lines(m: Module, desc, name: str):
    """Lines per row of ``desc``'s table, and fp32 / bf16 lines per vector."""
    def ceil_lines(shift):
        return desc.dim[shift:] + desc.dim[:shift].any()
    fp32 = Signal(_LPR_BITS, name=f"{name}_lpr_fp32")
    bf16 = Signal(_LPR_BITS, name=f"{name}_lpr_bf16")
    table = Signal(_LPR_BITS, name=f"{name}_lpr")
    m.d.comb += [fp32.eq(ceil_lines(_FP32_SHIFT)), bf16.eq(ceil_lines(_BF16_SHIFT)),
                 table.eq(Mux(desc.bf16, bf16, fp32))]
    return table, fp32, bf16


class SequencerPool(wiring.Component):
    """``sequencers`` :class:`~.bag_sequencer.BagSequencer` s taking descriptors in
    turn, and a merge passing their rows and statuses on in the order the descriptors
    came in.

    **Order.** Descriptor ``k`` goes to sequencer ``k mod sequencers``, which checks it
    and reads its indices while the sequencers before it still stream; its rows and
    status go on only after the previous descriptor's status. The rows of whatever
    follows an UPDATE wait until the UPDATE's writes are durable (``i_update_done``),
    or until the UPDATE's status reports a failure (it then has no rows, and the scatter
    never reports): later descriptors read what it wrote. One exception lets UPDATEs of
    different tables overlap: an UPDATE that has passed its checks begins its turn as
    soon as the UPDATE before it has handed all its items to the scatter
    (``i_update_fed``) if fewer than ``updates`` UPDATEs have begun and are not yet
    durable, and its table, and its gradients unless they are in GPU memory
    (``scratch_host``), overlap none of their tables (byte ranges ``table_base`` +
    ``rows * lines_per_row * 64`` and ``data_addr`` + ``num_bags * glines * 64``).
    Its gradients are then read while the earlier UPDATEs' rows are read and written;
    the scatter takes its items once the UPDATE before has been summed, and reads its
    rows (in another table) while that one is applied and the earlier writes complete.
    With the gradients in GPU memory, the UPDATE that begins next may have them read
    even before its turn (``ahead``, once it has passed its checks): the turn's UPDATE
    before it begins, and once that has begun (and passed its checks), the next
    sequencer's, so one UPDATE's gradient reads overlap the UPDATE before it. As an
    UPDATE's turn begins, ``update`` takes its settings and ``update_start`` pulses.
    Each row says whether it is an UPDATE's (``update``), so the lines the gather reads
    for it go to the scatter.

    **Context.** Every row carries its descriptor's settings (:func:`rows_layout`),
    computed here once: table base, lines per row, batch and table, undo capture
    (LOOKUPs with ``capture_undo``, not for a row marked ``bad``) and the pooling
    settings.

    **Latency, throughput, backpressure.** Rows and statuses pass combinationally from
    the sequencer whose turn it is (one per cycle); a turn begins the cycle after its
    sequencer has taken its descriptor or the previous status has gone. ``i_desc.ready``
    is the next sequencer's (high while it is idle). The sequencers share ``pmem``
    through a round-robin :class:`~hw.bus.axi_arbiter.AxiArbiter` when there are
    several, each with ``id_width - ceil(log2(sequencers))`` ID bits.

    Parameters
    ----------
    addr_width, id_width : int
        Of ``pmem``.
    sequencers : int
        At least 1.
    replay_lines : int
        Lines of each sequencer's replay store (0: none; see
        :class:`~.bag_sequencer.BagSequencer`).
    updates : int
        UPDATEs whose turn may have begun while their writes are not durable, 1 to 16
        (the scatter's tails plus the one it applies and the one it sums; 1: no
        overlap).

    Members
    -------
    i_desc : ``In(stream.Signature(Descriptor))``
    o_rows : ``Out(stream.Signature(rows_layout(addr_width)))``
    o_status : ``Out(stream.Signature(STATUS))``
    update : ``Out(update_layout(addr_width))``
    update_start : ``Out(1)``
    update_checked : ``Out(1)``
        The running UPDATE has passed its checks (its sequencer emits its rows).
    ahead : ``Out(1)``
        The UPDATE that begins next (the turn's, or once the turn's UPDATE has begun
        and passed its checks, the next sequencer's) has passed its checks and its
        gradients are in GPU memory (``scratch_host``): they may be read before its
        turn.
    ahead_data_addr, ahead_num_bags, ahead_glines : ``Out``
        That UPDATE's gradient buffer, bags and fp32 gradient lines per bag.
    update_overlap : ``Out(1)``
        Pulses with ``update_start`` when the UPDATE before is still writing.
    update_finish, update_read_error : ``Out(1)``
        ``update_finish`` pulses as the status of an UPDATE that passed its checks goes
        on (its last row has gone before it), with ``update_read_error`` if a read of
        its pass 2 failed; the gradient feed learns from it that the rows are over
        without waiting for the completion of earlier descriptors.
    i_update_fed : ``In(1)``
        The running UPDATE's last item has been taken by the scatter (one cycle).
    i_update_done : ``In(1)``
        The oldest UPDATE's writes are durable (one cycle).
    scratch_host : ``In(1)``
        The descriptors' buffers are in GPU memory (no gradient read can alias a table).
    pmem : ``Out(AXI4Signature(addr_width=addr_width, data_width=512, id_width=id_width))``
    """

    def __init__(self, *, addr_width: int, id_width: int, sequencers: int,
                 replay_lines: int = 0, updates: int = 2):
        if sequencers < 1:
            raise ValueError(f"sequencers must be at least 1, not {sequencers}")
        seq_bits = (sequencers - 1).bit_length()
        if id_width <= seq_bits:
            raise ValueError(f"id_width must be above {seq_bits} for {sequencers} "
                             f"sequencers, not {id_width}")
        self._addr_width = addr_width
        self._id_width = id_width
        self._sequencers = sequencers
        self._replay_lines = replay_lines
        self._updates = check_int("updates", updates, 1, 16)
        super().__init__({
            "i_desc": In(stream.Signature(Descriptor)),
            "o_rows": Out(stream.Signature(rows_layout(addr_width))),
            "o_status": Out(stream.Signature(STATUS)),
            "update": Out(update_layout(addr_width)),
            "update_start": Out(1),
            "update_checked": Out(1),
            "ahead": Out(1),
            "ahead_data_addr": Out(addr_width),
            "ahead_num_bags": Out(32),
            "ahead_glines": Out(_LPR_BITS),
            "update_overlap": Out(1),
            "update_finish": Out(1),
            "update_read_error": Out(1),
            "i_update_fed": In(1),
            "i_update_done": In(1),
            "scratch_host": In(1),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
        })

    addr_width = property(lambda self: self._addr_width)
    id_width = property(lambda self: self._id_width)
    sequencers = property(lambda self: self._sequencers)

    def elaborate(self, platform):
        m = Module()
        aw, n = self._addr_width, self._sequencers
        seq_bits = (n - 1).bit_length()
        seqs = [BagSequencer(addr_width=aw, id_width=self._id_width - seq_bits,
                             replay_lines=self._replay_lines)
                for _ in range(n)]
        for k, s in enumerate(seqs):
            m.submodules[f"sequencer{k}"] = s
        if n > 1:
            m.submodules.arbiter = arb = AxiArbiter(
                addr_width=aw, data_width=LINE_BITS, id_width=self._id_width - seq_bits,
                priorities=[0] * n)
            for k, s in enumerate(seqs):
                wiring.connect(m, s.pmem, getattr(arb, f"m{k}"))
            wiring.connect(m, arb.sub, wiring.flipped(self.pmem))
        else:
            wiring.connect(m, seqs[0].pmem, wiring.flipped(self.pmem))

        def next_of(index):
            return Mux(index == n - 1, 0, index + 1)

        # The sequencer the next descriptor goes to, and the one whose rows and status
        # go on next (the same order). Each holds its descriptor from the hand-over until
        # its status has gone on, exactly while it is not idle (``i_desc.ready`` low).
        disp = Signal(max(1, seq_bits))
        turn = Signal(max(1, seq_bits))
        s_desc = [Signal(Descriptor, name=f"s{k}_desc") for k in range(n)]
        i = self.i_desc
        for k, s in enumerate(seqs):
            with m.If(disp == k):
                m.d.comb += [s.i_desc.valid.eq(i.valid), i.ready.eq(s.i_desc.ready)]
            m.d.comb += s.i_desc.payload.eq(i.payload)
            with m.If(i.valid & i.ready & (disp == k)):
                m.d.sync += s_desc[k].eq(i.payload)
        with m.If(i.valid & i.ready):
            m.d.sync += disp.eq(next_of(disp))

        cur = Signal(Descriptor)        # the descriptor of the turn's sequencer
        held = Signal()                 # the turn's sequencer holds it
        opened = Signal()               # the turn's rows and status may go on
        passed = Signal()               # the turn's sequencer passed its checks
        rows, status = self.o_rows, self.o_status
        for k, s in enumerate(seqs):
            with m.If(turn == k):
                m.d.comb += [
                    cur.eq(s_desc[k]), held.eq(~s.i_desc.ready), passed.eq(s.passed),
                    rows.valid.eq(s.o_rows.valid & opened),
                    rows.p.row.eq(s.o_rows.payload),
                    s.o_rows.ready.eq(rows.ready & opened),
                    status.valid.eq(s.o_status.valid & opened),
                    status.payload.eq(s.o_status.payload),
                    s.o_status.ready.eq(status.ready & opened),
                ]
        cur_update = cur.kind == DescKind.UPDATE.value
        m.d.comb += self.update_checked.eq(opened & cur_update & passed)
        upd = Signal(Descriptor)        # the UPDATE whose items the scatter takes
        lpr, cur_fp32, _ = _lines(m, cur, "cur")
        # The byte ranges the turn's UPDATE writes (its table) and reads its gradients
        # from, registered from ``cur``: valid while ``ranges_of`` is the turn and its
        # sequencer has passed its checks (cycles after it took the descriptor).
        t_end, g_end, t_end_now = Signal(80), Signal(80), Signal(80)
        ranges_of = Signal.like(turn)
        m.d.comb += t_end_now.eq(cur.table_base + ((cur.rows * lpr) << _LINE_SHIFT))
        m.d.sync += [t_end.eq(t_end_now),
                     g_end.eq(cur.data_addr + ((cur.num_bags * cur_fp32) << _LINE_SHIFT)),
                     ranges_of.eq(turn)]
        upd_lpr, upd_fp32, upd_bf16 = _lines(m, upd, "upd")

        def apart(lo, hi, lo2, hi2):
            return (hi <= lo2) | (hi2 <= lo)
        # UPDATEs whose turn began and whose writes are not durable (at most ``updates``:
        # the one the scatter applies, the tails waiting for their Bs and the one whose
        # items it takes next), oldest first, each with its table's byte range
        # (``tables``; slot ``k`` valid for ``k < pending``); ``feeding``: the last of
        # them has items the scatter has not taken.
        depth = self._updates
        pending = Signal(range(depth + 1))
        tables = [Signal(data.StructLayout({"lo": 80, "hi": 80}), name=f"pending{k}")
                  for k in range(depth)]
        feeding = Signal()
        clear = [(k >= pending) | apart(cur.table_base, t_end, t.lo, t.hi)
                 & (self.scratch_host | apart(cur.data_addr, g_end, t.lo, t.hi))
                 for k, t in enumerate(tables)]
        overlap = (cur_update & passed & (ranges_of == turn) & ~feeding
                   & (pending != 0) & (pending != depth))
        for c in clear:
            overlap = overlap & c
        m.d.sync += [self.update_start.eq(0), self.update_overlap.eq(0)]
        status_out = status.valid & status.ready
        failed = status_out & cur_update & status.p.status.any()
        opens = held & ~opened & ((pending == 0) | overlap)
        done = self.i_update_done
        with m.If(opens):
            m.d.sync += opened.eq(1)
            with m.If(cur_update):
                m.d.sync += [upd.eq(cur), self.update_start.eq(1), feeding.eq(1),
                             self.update_overlap.eq(pending != 0)]
        m.d.sync += pending.eq(pending + (opens & cur_update) - done - failed)
        # The ranges: a durable UPDATE (the oldest) leaves by a shift; a failed one (the
        # newest, whose turn it is) just leaves the count; an UPDATE whose turn begins
        # takes the slot after the others (never in the cycle of a failure).
        for k, t in enumerate(tables):
            with m.If(opens & cur_update & (pending - done == k)):
                m.d.sync += [t.lo.eq(cur.table_base), t.hi.eq(t_end_now)]
            with m.Elif(done):
                if k + 1 < depth:
                    m.d.sync += t.eq(tables[k + 1])
        # Every LOOKUP before an UPDATE completed before that UPDATE was taken from the
        # ring (the dispatcher's rule), and UPDATEs write only PMEM: once it has passed
        # its checks, its gradients in GPU memory may be read now. ``ahead`` names the
        # UPDATE that begins next: the turn's, before it begins, or once the turn's
        # UPDATE has begun (and passed its checks, so it cannot end without rows), the
        # next sequencer's.
        nxt = Signal(Descriptor)        # the descriptor of the sequencer after the turn
        nxt_ready = Signal()            # ... held, and its checks passed
        if n > 1:
            for k, s in enumerate(seqs):
                with m.If(next_of(turn) == k):
                    m.d.comb += [nxt.eq(s_desc[k]), nxt_ready.eq(~s.i_desc.ready & s.passed)]
        _, nxt_fp32, _ = _lines(m, nxt, "nxt")
        ahead_cur = cur_update & held & passed & ~opened
        ahead_nxt = (cur_update & opened & passed & nxt_ready
                     & (nxt.kind == DescKind.UPDATE.value))
        m.d.comb += [
            self.ahead.eq((ahead_cur | ahead_nxt) & self.scratch_host),
            self.ahead_data_addr.eq(Mux(ahead_cur, cur.data_addr, nxt.data_addr)[:aw]),
            self.ahead_num_bags.eq(Mux(ahead_cur, cur.num_bags, nxt.num_bags)),
            self.ahead_glines.eq(Mux(ahead_cur, cur_fp32, nxt_fp32)),
        ]
        m.d.comb += [self.update_finish.eq(status_out & cur_update & ~status.p.status.any()),
                     self.update_read_error.eq(status.p.read_error)]
        with m.If(self.i_update_fed | failed):
            m.d.sync += feeding.eq(0)
        with m.If(status_out):
            m.d.sync += [opened.eq(0), turn.eq(next_of(turn))]

        g = rows.p.gather
        m.d.comb += [
            rows.p.update.eq(cur_update),
            g.table_base.eq(cur.table_base[:aw]),
            g.lines_per_row.eq(lpr),
            g.batch_id.eq(cur.batch_id),
            g.table_id.eq(cur.table_id),
            # no undo record for a row a failed read may have made
            g.capture.eq(cur.capture_undo & ~cur_update & ~rows.p.row.bad),
            g.pool.mode.eq(cur.mode),
            g.pool.weighted.eq(cur.weighted),
            g.pool.bf16.eq(cur.bf16),
            g.pool.lines_per_row.eq(lpr),
        ]
        u = self.update
        m.d.comb += [
            u.table_base.eq(upd.table_base[:aw]),
            u.data_addr.eq(upd.data_addr[:aw]),
            u.num_bags.eq(upd.num_bags),
            u.dim.eq(upd.dim),
            u.bf16.eq(upd.bf16),
            u.weighted.eq(upd.weighted),
            u.lines_per_row.eq(upd_lpr),
            u.glines.eq(upd_fp32),
            u.items.eq(Mux(upd.bf16, Cat(C(0, 1), upd_bf16), upd_fp32)),
        ]
        return m
