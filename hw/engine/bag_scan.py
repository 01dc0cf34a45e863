"""Pass 2 of the bag sequencer, ahead of the rows: each bag's length and counted rows.

See :class:`BagScan`.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .descriptor import Descriptor

__all__ = ["BAG", "BagScan"]

#: One bag: its indices, and those of them that are not the padding index.
BAG = data.StructLayout({"length": 32, "counted": 32})


class BagScan(wiring.Component):
    """Walks a descriptor's offsets and indices and sends each bag's ``length`` and
    ``counted`` rows (indices other than the padding index) on ``o_bag``, so that the
    row emitter knows a bag's count before its first row.

    ``offsets[0]`` (0, checked in pass 1) is skipped; each later offset ends a bag and
    ``num_indices`` ends the last. An offset below the bag's start or above
    ``num_indices`` (compared unsigned; possible only when a pass-2 read failed and
    garbled it) is clamped to that bound, so the scan always ends after ``num_bags``
    bags and ``num_indices`` indices. ``i_offsets`` must carry ``num_bags`` words and
    ``i_indices`` ``num_indices`` words (those of the bags); the scan takes exactly
    those.

    **Flow, latency, throughput.** ``i_start`` (a pulse, only while idle) starts a
    descriptor of ``num_bags`` > 0 bags. One index per cycle; a bag's end costs no
    cycle when its offset is already there (the next bag starts in the cycle the last
    one is sent), an empty bag one. A bag's last index is taken only in the cycle
    ``o_bag`` takes the bag (whose ``valid`` then follows the index's); an empty bag is
    offered on its own and held until taken. Idle again once the last bag is taken;
    resets idle.

    Members
    -------
    i_desc : ``In(Descriptor)``
        The descriptor (``num_bags``, ``num_indices``, padding), held.
    i_start : ``In(1)``
    i_offsets, i_indices : ``In(stream.Signature(32))``
    o_bag : ``Out(stream.Signature(BAG))``
    """

    i_desc: In(Descriptor)
    i_start: In(1)
    i_offsets: In(stream.Signature(32))
    i_indices: In(stream.Signature(32))
    o_bag: Out(stream.Signature(BAG))

    def elaborate(self, platform):
        m = Module()
        desc, offsets, indices, bag = self.i_desc, self.i_offsets, self.i_indices, self.o_bag
        bags_left = Signal(32)      # bags not yet sent
        position = Signal(32)       # the index the next bag starts at
        length = Signal(32)
        left = Signal(32)           # the bag's indices not yet taken
        counted = Signal(32)        # of the bag's indices taken, those counted
        with m.If(self.i_start):
            m.d.sync += [bags_left.eq(desc.num_bags), position.eq(0)]

        def next_bag(last_bag):
            """Start scanning the next bag once its end is known, else wait for it."""
            # Pass 1 has checked the offsets; each is clamped (as unsigned) into
            # [position, num_indices] all the same, so that offsets a failed pass-2 read
            # garbled still end the scan after exactly ``num_indices`` indices.
            off = offsets.payload
            end = Mux(last_bag, desc.num_indices,
                      Mux(off < position, position,
                          Mux(off > desc.num_indices, desc.num_indices, off)))
            m.d.comb += offsets.ready.eq(~last_bag)
            with m.If(last_bag | offsets.valid):
                m.d.sync += [length.eq(end - position), left.eq(end - position),
                             counted.eq(0), position.eq(end)]
                m.next = "SCAN"
            with m.Else():
                m.next = "WAIT_END"

        def bag_sent():
            """On to the next bag in the same cycle."""
            m.d.sync += bags_left.eq(bags_left - 1)
            with m.If(bags_left == 1):
                m.next = "IDLE"
            with m.Else():
                next_bag(bags_left == 2)

        with m.FSM():
            with m.State("IDLE"), m.If(self.i_start):
                m.next = "SKIP_FIRST_OFFSET"
            with m.State("SKIP_FIRST_OFFSET"):
                m.d.comb += offsets.ready.eq(1)
                with m.If(offsets.valid):
                    m.next = "WAIT_END"
            with m.State("WAIT_END"):
                next_bag(bags_left == 1)
            with m.State("SCAN"):
                padding = desc.has_padding_idx & (indices.payload == desc.padding_idx)
                counted_next = Signal(32)
                m.d.comb += counted_next.eq(counted + ~padding)
                with m.If(left == 0):               # an empty bag
                    m.d.comb += [bag.valid.eq(1), bag.p.length.eq(length),
                                 bag.p.counted.eq(counted)]
                    with m.If(bag.ready):
                        bag_sent()
                with m.Else():
                    last_index = left == 1
                    m.d.comb += [indices.ready.eq(~last_index | bag.ready),
                                 bag.p.length.eq(length), bag.p.counted.eq(counted_next)]
                    with m.If(indices.valid & indices.ready):
                        m.d.sync += [left.eq(left - 1), counted.eq(counted_next)]
                    with m.If(last_index):
                        m.d.comb += bag.valid.eq(indices.valid)
                        with m.If(indices.valid & bag.ready):
                            bag_sent()
        return m
