"""The undo logger's space accounting: record numbers, slot positions and the log
space held by uncommitted batches.

See :class:`SpaceTracker`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["LIVE_BATCHES", "SpaceTracker"]

#: Batches with records not yet committed that the space accounting tracks.
LIVE_BATCHES = 4


class SpaceTracker(wiring.Component):
    """Numbers the records (``seq``), places them in the ring (``slot_off``), and
    tracks which batches still hold log space.

    **Records.** ``alloc`` (a record of batch ``batch`` is started) advances ``seq``
    and moves ``slot_off`` (``(seq mod 2**log_slots_log2) * slot_lines * 64``) on by
    one slot, wrapping to 0. ``new_batch``: ``batch`` is not the batch of the last
    record.

    **Space.** Up to :data:`LIVE_BATCHES` ``(batch, first seq)`` pairs of batches with
    records are kept, in order; an ``alloc`` of a new batch adds one. ``commit``
    (``commit_batch``) makes every batch up to it committed: its records are free, and
    its entry leaves the tracker one per cycle but counts as free at once. ``full``:
    ``seq - oldest >= 2**log_slots_log2`` (``oldest``: the first ``seq`` of the oldest
    batch not committed; none: not full). ``fits``: a record of ``batch`` may be
    started (not ``full``, and the tracker has room when ``batch`` is new).

    ``restart`` (one cycle) clears ``seq``, ``slot_off``, the committed batch and the
    tracker; it wins over ``alloc`` and ``commit``. The outputs are combinational from
    registers and the inputs; every update takes effect at the next clock edge.

    Parameters
    ----------
    addr_width : int

    Members
    -------
    batch : ``In(32)``; alloc : ``In(1)``
    commit : ``In(1)``; commit_batch : ``In(32)``; restart : ``In(1)``
    log_slots_log2 : ``In(5)``; slot_lines : ``In(8)``
    seq : ``Out(32)``; slot_off : ``Out(addr_width)``
    new_batch, full, fits : ``Out(1)``
    """

    def __init__(self, *, addr_width: int):
        super().__init__({
            "batch": In(32),
            "alloc": In(1),
            "commit": In(1),
            "commit_batch": In(32),
            "restart": In(1),
            "log_slots_log2": In(5),
            "slot_lines": In(8),
            "seq": Out(32),
            "slot_off": Out(addr_width),
            "new_batch": Out(1),
            "full": Out(1),
            "fits": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        seq, committed = self.seq, Signal(32)
        last_batch = Signal(32)         # batch of the newest record
        last_valid = Signal()
        lb_batch = [Signal(32, name=f"lb_batch{i}") for i in range(LIVE_BATCHES)]
        lb_first = [Signal(32, name=f"lb_first{i}") for i in range(LIVE_BATCHES)]
        lb_count = Signal(range(LIVE_BATCHES + 1))
        live = [(lb_count > i) & (lb_batch[i] > committed) for i in range(LIVE_BATCHES)]
        oldest = lb_first[LIVE_BATCHES - 1]
        for i in reversed(range(LIVE_BATCHES - 1)):
            oldest = Mux(live[i], lb_first[i], oldest)
        mask = Signal(32)               # slots - 1
        # Bit 31 stays 0: log_slots_log2 is at most 31.
        m.d.comb += mask.eq(Cat(*[self.log_slots_log2 > i for i in range(31)]))
        used = Signal(32)
        pop = Signal()                  # the oldest tracked batch is committed
        can_push = Signal()
        m.d.comb += [
            used.eq(seq - oldest),
            self.full.eq(Cat(*live).any() & (used & ~mask).any()),
            pop.eq(lb_count.any() & ~(lb_batch[0] > committed)),
            self.new_batch.eq(~last_valid | (last_batch != self.batch)),
            can_push.eq((lb_count < LIVE_BATCHES) | pop),
            self.fits.eq(~self.full & (~self.new_batch | can_push)),
        ]

        push = self.alloc & self.new_batch
        pos = Signal(range(LIVE_BATCHES + 1))
        m.d.comb += pos.eq(lb_count - pop)
        for i in range(LIVE_BATCHES):
            with m.If(push & (pos == i)):
                m.d.sync += [lb_batch[i].eq(self.batch), lb_first[i].eq(seq)]
            if i + 1 < LIVE_BATCHES:
                with m.Elif(pop):
                    m.d.sync += [lb_batch[i].eq(lb_batch[i + 1]),
                                 lb_first[i].eq(lb_first[i + 1])]
        with m.If(push & ~pop):
            m.d.sync += lb_count.eq(lb_count + 1)
        with m.Elif(~push & pop):
            m.d.sync += lb_count.eq(lb_count - 1)

        seq_next = Signal(32)
        m.d.comb += seq_next.eq(seq + 1)
        stride = Cat(C(0, 6), self.slot_lines)
        with m.If(self.alloc):
            m.d.sync += [
                seq.eq(seq_next),
                self.slot_off.eq(Mux((seq_next & mask).any(), self.slot_off + stride, 0)),
                last_batch.eq(self.batch), last_valid.eq(1),
            ]
        with m.If(self.commit):
            m.d.sync += committed.eq(self.commit_batch)
        with m.If(self.restart):
            m.d.sync += [seq.eq(0), self.slot_off.eq(0), committed.eq(0),
                         last_valid.eq(0), lb_count.eq(0)]
        return m
