"""Proof of the CXL.mem endpoint's tag table, the slot tracker
(:class:`~hw.cxl.slot_tracker.SlotTracker`): its slots are the endpoint's PMEM AXI IDs,
one per request in flight."""

from __future__ import annotations

from amaranth.hdl import Assume, Module, Signal

from hw.cxl.slot_tracker import SlotTracker

from .harness import Harness, decode
from .rules import past, stream_rule

__all__ = ["SlotTrackerProof"]


class SlotTrackerProof(Harness):
    """A slot tracker of 3 slots (its free list is then as deep as the smallest one
    built: 3 entries).

    Assumes (the endpoint's completion stage): ``i_release`` names only a slot in
    flight, taken on ``o_slot`` in an earlier cycle and not released since (no slot
    released twice or before it is taken).

    Asserts, by group: ``stream``: ``o_slot`` obeys the stream rule. ``slots``:
    ``o_slot`` offers only a slot number below ``slots`` that is not in flight (no
    slot handed out twice while in flight); ``o_occupancy`` is the number of slots in
    flight; and ``o_slot`` is valid whenever a slot is free other than one released in
    the previous cycle (no slot is lost).
    """

    GROUPS = ("stream", "slots")
    SLOTS = 3

    def __init__(self, *, depth: int, group: str | None = None, mutation: str | None = None):
        # ``depth`` sizes no counter here: the harness keeps a bit per slot.
        super().__init__(SlotTracker(slots=self.SLOTS), group=group, mutation=mutation)

    def check(self, m: Module) -> None:
        tracker, n = self.dut, self.SLOTS
        offer, release = tracker.o_slot, tracker.i_release
        in_flight = Signal(n, name="in_flight")
        offered, released = decode(offer.p, n), decode(release.p, n)
        m.d.sync += in_flight.eq((in_flight & ~(released & release.valid.replicate(n)))
                                 | (offered & (offer.valid & offer.ready).replicate(n)))
        m.d.comb += Assume(~release.valid | (in_flight & released).any(),
                           "i_release: a slot not in flight")

        stream_rule(m, self.asserts("stream"), "o_slot", offer.valid, offer.ready, [offer.p])
        slots = self.asserts("slots")
        m.d.comb += [
            slots(~offer.valid | (offered.any() & ~(in_flight & offered).any()),
                  "o_slot: a slot in flight or out of range"),
            slots(tracker.o_occupancy == sum(in_flight), "o_occupancy: not the slots in flight"),
        ]
        unseen = past(m, release.valid, "released_before")
        m.d.comb += slots(offer.valid | (sum(in_flight) + unseen >= n),
                          "o_slot: a free slot not offered")
