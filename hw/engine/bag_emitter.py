"""Pass 2 of the bag sequencer: the bags walked into the per-row stream of the gather.

See :class:`BagEmitter`.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .bag_scan import BAG
from .descriptor import Descriptor
from .row_gather import ROW

__all__ = ["ONE_FP32", "BagEmitter"]

#: fp32 1.0, the weight of every row when the descriptor is not weighted.
ONE_FP32 = 0x3F800000


class BagEmitter(wiring.Component):
    """Walks the indices (and, when ``weighted``, the weights) of a descriptor's bags in
    step and emits each counted index (not the padding index) as an ``o_rows`` item
    (``row``, ``row_k``, ``last_row``, ``weight`` = the fp32 weight or 1.0, ``count``),
    or one item with ``empty_bag = 1`` (``row = row_k = last_row = 0``, ``weight`` 1.0,
    ``count`` 0) for a bag with no counted index. Each bag's ``length`` and ``counted``
    come first on ``i_bag`` (from :class:`~.bag_scan.BagScan`). ``row_k`` and ``count``
    are 16 bits: a bag of more than 65535 counted rows wraps them (``last_row`` stays
    exact).

    **Flow, latency, throughput.** ``i_start`` (a pulse, only while idle) starts a
    descriptor of ``num_bags`` > 0 bags; ``o_done`` rises once the last bag's items
    are all loaded into ``o_rows`` (the last may still wait there) and falls at the next
    ``i_start``. One index per cycle: a padding index costs a cycle and no item, a
    bag's end costs no cycle when the next bag is there, an empty bag one. ``o_rows`` is
    a register loaded on ``~valid | ready``; an index (and its weight) is taken only
    when its item can be loaded. Resets idle, with ``o_done`` low.

    Members
    -------
    i_desc : ``In(Descriptor)``
        The descriptor (``num_bags``, ``weighted``, padding), held.
    i_start : ``In(1)``
    i_counted_only : ``In(1)``
        While high, the first ``counted`` indices of a bag become its rows whatever
        their values and the rest are skipped as padding: the bag sequencer raises it
        once a pass-2 read has failed, so the rows keep to the scan's counts (each bag
        ends with its ``last_row``) even if the two reads of an index line disagree.
    i_bag : ``In(stream.Signature(BAG))``
    i_indices, i_weights : ``In(stream.Signature(32))``
        ``i_weights`` is used only when ``weighted``.
    o_rows : ``Out(stream.Signature(ROW))``
    o_done : ``Out(1)``
    """

    i_desc: In(Descriptor)
    i_start: In(1)
    i_counted_only: In(1)
    i_bag: In(stream.Signature(BAG))
    i_indices: In(stream.Signature(32))
    i_weights: In(stream.Signature(32))
    o_rows: Out(stream.Signature(ROW))
    o_done: Out(1)

    def elaborate(self, platform):
        m = Module()
        desc, bag, indices, weights, rows = (self.i_desc, self.i_bag, self.i_indices,
                                          self.i_weights, self.o_rows)
        bags_left = Signal(32)      # bags not yet done
        left = Signal(32)           # the bag's indices not yet taken
        count = Signal(32)          # the bag's counted rows
        row_k = Signal(32)          # rows of the bag emitted
        with m.If(self.i_start):
            m.d.sync += [bags_left.eq(desc.num_bags), self.o_done.eq(0)]

        loadable = ~rows.valid | rows.ready
        with m.If(rows.ready):
            m.d.sync += rows.valid.eq(0)

        def emit(**fields):
            m.d.sync += rows.valid.eq(1)
            for name in ("row", "row_k", "last_row", "weight", "empty_bag", "count"):
                m.d.sync += rows.payload[name].eq(fields.get(name, 0))

        def next_bag():
            """Take the next bag from the scan, else wait for it."""
            m.d.comb += bag.ready.eq(1)
            with m.If(bag.valid):
                m.d.sync += [left.eq(bag.p.length), count.eq(bag.p.counted), row_k.eq(0)]
                with m.If(bag.p.counted != 0):
                    m.next = "ROWS"
                with m.Else():
                    m.next = "EMPTY"
            with m.Else():
                m.next = "NEXT_BAG"

        def bag_done():
            """And the next bag in the same cycle."""
            m.d.sync += bags_left.eq(bags_left - 1)
            with m.If(bags_left == 1):
                m.d.sync += self.o_done.eq(1)
                m.next = "IDLE"
            with m.Else():
                next_bag()

        with m.FSM():
            with m.State("IDLE"), m.If(self.i_start):
                m.next = "NEXT_BAG"
            with m.State("NEXT_BAG"):
                next_bag()
            with m.State("EMPTY"), m.If(loadable):
                emit(empty_bag=1, weight=ONE_FP32)
                with m.If(left == 0):
                    bag_done()
                with m.Else():
                    m.next = "ROWS"         # its padding indices
            with m.State("ROWS"):
                index = indices.payload
                padding = Mux(self.i_counted_only, row_k >= count,
                              desc.has_padding_idx & (index == desc.padding_idx))
                step = (indices.valid & (~desc.weighted | weights.valid)
                        & (padding | loadable))
                m.d.comb += [indices.ready.eq(step), weights.ready.eq(step & desc.weighted)]
                with m.If(step):
                    m.d.sync += left.eq(left - 1)
                    with m.If(~padding):
                        emit(row=index, row_k=row_k, last_row=row_k == count - 1,
                             weight=Mux(desc.weighted, weights.payload, ONE_FP32),
                             count=count)
                        m.d.sync += row_k.eq(row_k + 1)
                    with m.If(left == 1):
                        bag_done()
        return m
