"""The completion's in-order completion queue: a descriptor completes once the writes
it waits for are durable.

See :class:`DoneQueue`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .line_writer import COUNT_BITS

__all__ = ["DONE_DEPTH", "DONE_ENTRY", "DoneQueue"]

#: Descriptors whose record is written but whose B has not arrived yet.
DONE_DEPTH = 8
#: A descriptor waiting: the counts that make it complete, and what it completes with.
DONE_ENTRY = data.StructLayout({"target": COUNT_BITS, "host_target": COUNT_BITS,
                                "status": 8, "seq": 32, "kind": 8})


class DoneQueue(wiring.Component):
    """Holds up to :data:`DONE_DEPTH` descriptors in order and completes the oldest once
    ``b_count`` has reached its ``target`` and ``hb_count`` its ``host_target`` (each
    difference, modulo ``2**COUNT_BITS``, not negative) and ``advance`` is high.

    **Flow, latency.** ``i_entry.ready`` is high while the queue has room. ``complete``
    pulses, with the oldest entry's ``status``, ``seq`` and ``kind``, in the cycle its
    counts are reached with ``advance`` high (at the earliest two cycles after it was
    taken: the queue is a buffered FIFO); ``head`` counts the completions. ``pending``:
    an entry waits. ``reached`` is high while the oldest entry's counts are reached,
    whatever ``advance`` is (a user holds ``advance`` low until it can take the entry).

    Members
    -------
    i_entry : ``In(stream.Signature(DONE_ENTRY))``
    b_count, hb_count : ``In(COUNT_BITS)``
    advance : ``In(1)``, high when not driven
    complete, pending, reached : ``Out(1)``
    status : ``Out(8)``; seq, head : ``Out(32)``; kind : ``Out(8)``
    """

    def __init__(self):
        super().__init__({
            "i_entry": In(stream.Signature(DONE_ENTRY)),
            "b_count": In(COUNT_BITS),
            "hb_count": In(COUNT_BITS),
            "advance": In(1, init=1),
            "complete": Out(1),
            "reached": Out(1),
            "pending": Out(1),
            "status": Out(8),
            "seq": Out(32),
            "kind": Out(8),
            "head": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.q = q = SyncFIFOBuffered(width=DONE_ENTRY.size, depth=DONE_DEPTH)
        entry = data.View(DONE_ENTRY, q.r_data)
        met = Signal()
        m.d.comb += [
            q.w_data.eq(self.i_entry.payload),
            q.w_en.eq(self.i_entry.valid),
            self.i_entry.ready.eq(q.w_rdy),
            met.eq(~(self.b_count - entry.target)[COUNT_BITS - 1]
                   & ~(self.hb_count - entry.host_target)[COUNT_BITS - 1]),
            q.r_en.eq(met & self.advance),
            self.reached.eq(q.r_rdy & met),
            self.complete.eq(q.r_rdy & met & self.advance),
            self.pending.eq(q.r_rdy),
            self.status.eq(entry.status),
            self.seq.eq(entry.seq),
            self.kind.eq(entry.kind),
        ]
        with m.If(self.complete):
            m.d.sync += self.head.eq(self.head + 1)
        return m
