"""UPDATE's feeder: turns the counted rows of the bags into the gradient items
:class:`~.coalesced_update.CoalescedUpdate` applies, reading each bag's gradient once."""

from amaranth.hdl import C, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst
from hw.config import LINE_BITS

from .row_gather import ROW
from .update_layouts import ITEM

__all__ = ["GradFeed"]

_LINE_SHIFT = 6




class GradFeed(wiring.Component):
    """Feeds :class:`~.coalesced_update.CoalescedUpdate` the items of one UPDATE.

    The bags arrive as the ``ROW`` stream of :class:`~.bag_sequencer.BagSequencer`
    (counted rows in index order, a lone item per empty bag). Bag ``b``'s fp32
    gradient is ``glines`` lines at ``data_addr + b * glines * 64``
    (``docs/embedding.md``), so the bags' gradients are one sequential run of
    ``num_bags * glines`` lines. Once the sequencer has checked the descriptor
    (``checked``, or the first row at the latest) that run is read ahead into a ring
    of ``ring_lines`` lines
    (single-beat reads, AXI ID 0, in order, as many in flight as the ring has room).
    Every counted row of a bag then becomes ``items`` items ``line = 0 .. items - 1``
    carrying gradient line ``line`` (zero past ``glines``: the bf16 padding of
    :class:`~.coalesced_update.CoalescedUpdate`) and the row's weight; a bag's lines leave
    the ring after its last row, an empty bag's once they have arrived. After
    ``finish`` (the UPDATE's last row has been handed over) and the last row's items,
    no read is issued, and once every read has returned one ``nop`` + ``last`` item
    ends the descriptor, so the update applies its sums and reports. Once a gradient
    read has been answered with an error, a row has come ``bad`` or ``seq_error`` has
    pulsed (its sequencer's read failed), every item from then on is ``bad``, the last
    one included (it comes after every read, every row and ``finish``), so the update
    writes nothing.

    **Reading ahead into the next UPDATE.** While ``ahead`` is high it names the UPDATE
    that will ``start`` next (``ahead_addr``, ``ahead_bags``, ``ahead_glines``), which
    has passed its checks. Once every gradient read of the current UPDATE has been
    issued (or none is running), the feed goes on reading that UPDATE's gradients into
    the same ring, behind the current one's lines, as room allows. At its ``start`` the
    feed keeps those lines and reads on, instead of starting over at ``data_addr``; the
    current UPDATE's end item still waits only for the current UPDATE's reads. A read
    error on a line read ahead makes the next UPDATE's items ``bad``, not the current
    one's. The engine raises ``ahead`` only where the read cannot observe a write still
    to come (``docs/embedding.md``, "Gradients in GPU memory are read ahead").

    Rate: one item per cycle through the rows of a bag (the ring is read a cycle ahead
    of each item), and on into the next bag's first row when that bag's lines are in
    the ring; otherwise (and after an empty bag) a bag's first row adds two cycles
    (taking the row, then the ring read). The first bag waits one PMEM read latency;
    later bags find their lines read ahead as long as the ring covers the read latency
    (``ring_lines`` lines per latency).

    Members
    -------
    start : ``In(1)``
        Pulse when an UPDATE is dispatched: the read-ahead restarts at ``data_addr``
        (or goes on, if that UPDATE was read ahead).
    data_addr, num_bags, glines, items : ``In``
        The UPDATE's gradient buffer, its bags, gradient lines per bag
        (1..``max_glines``) and items per counted row (table lines, twice that for
        bf16).
    checked : ``In(1)``
        The UPDATE passed its checks: the read-ahead may start before its first row.
    ahead : ``In(1)``
        The next UPDATE (passed its checks, not yet started) may be read ahead; held
        until its ``start``, and its settings with it.
    ahead_addr, ahead_bags, ahead_glines : ``In``
        That UPDATE's ``data_addr``, ``num_bags`` and ``glines``.
    finish : ``In(1)``
        Pulse once the UPDATE's rows have all been taken from ``i_rows``.
    seq_error : ``In(1)``
        Pulse (before ``finish``): the UPDATE's bag sequencer reported a failed read.
    i_rows : ``In(stream.Signature(ROW))``
    pmem : ``Out(AXI4Signature(...))``
        Read port (AR, R).
    o_items : ``Out(stream.Signature(ITEM))``
    busy : ``Out(1)``
        An UPDATE is being fed, or the next one's gradients are being read ahead.
    """

    def __init__(self, *, addr_width: int, id_width: int, max_glines: int):
        self._addr_width = addr_width
        self._max_glines = max_glines
        #: Ring of read-ahead gradient lines: two of the largest bags, at least 16.
        self._ring_bits = max(4, (2 * max_glines - 1).bit_length())
        super().__init__({
            "start": In(1),
            "data_addr": In(addr_width),
            "num_bags": In(32),
            "glines": In(9),
            "items": In(9),
            "checked": In(1),
            "ahead": In(1),
            "ahead_addr": In(addr_width),
            "ahead_bags": In(32),
            "ahead_glines": In(9),
            "finish": In(1),
            "seq_error": In(1),
            "i_rows": In(stream.Signature(ROW)),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
            "o_items": Out(stream.Signature(ITEM)),
            "busy": Out(1),
        })

    @property
    def ring_lines(self) -> int:
        return 1 << self._ring_bits

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        rb = self._ring_bits
        axi, rows, out = self.pmem, self.i_rows, self.o_items
        m.submodules.ring = ring = Memory(shape=LINE_BITS, depth=1 << rb, init=[])
        rd = ring.read_port(transparent_for=())
        wr = ring.write_port()

        finishing = Signal()            # in FINISH: the UPDATE's end item
        # Ring pointers (one bit more than the ring's index): lines requested, received
        # and released; ``cons`` is the current bag's first line.
        req = Signal(rb + 1)
        rcv = Signal(rb + 1)
        cons = Signal(rb + 1)
        pf_on = Signal()                # reading ahead (once checked, or the first row)
        pf_addr = Signal(aw)
        pf_bag = Signal(32)             # bag of the next line to request
        pf_line = Signal(9)             # ... and its line
        j = Signal(9)                   # item of the current row
        row = Signal(ROW)
        fin = Signal()

        held = Signal(rb + 1)           # lines received and not released
        after = Signal(rb + 1)          # ... of them past the current bag's
        m.d.comb += [held.eq(rcv - cons), after.eq(held - self.glines[:rb + 1])]
        # Between ``start`` and the end item: an UPDATE is being fed.
        live = Signal()
        # Reading the next UPDATE ahead: its settings, the ring pointer of its first
        # line, whether every read of the current UPDATE has returned (the R channel
        # has reached ``nxt_first``) and whether a line read ahead failed.
        pf_next = Signal()
        nxt_bags = Signal(32)
        nxt_glines = Signal(9)
        nxt_first = Signal(rb + 1)
        cur_rcvd = Signal()
        bad_next = Signal()
        pf_bags = Mux(pf_next, nxt_bags, self.num_bags)
        pf_glines = Mux(pf_next, nxt_glines, self.glines)
        ar = Signal()
        ar_wait = Signal()              # AR was offered last cycle and not taken
        # The reads go on after ``finish`` (the last bag may still want its lines), but
        # no new one in FINISH: the UPDATE's rows have all been fed (or its sequencer
        # stopped), so no item wants another line. A read offered before FINISH stays
        # offered until it is taken (AXI: ARVALID is not withdrawn); FINISH waits for
        # it. The next UPDATE's go on regardless.
        m.d.comb += ar.eq(Mux(pf_next, 1, live & pf_on & (~finishing | ar_wait))
                          & (pf_bag != pf_bags)
                          & ~(req - cons)[rb])     # fewer than 2**rb taken
        m.d.sync += ar_wait.eq(ar & ~axi.arready)
        with m.If(self.finish):
            m.d.sync += fin.eq(1)
        with m.If(self.checked & ~fin):
            m.d.sync += pf_on.eq(1)
        # Read ahead once the current UPDATE's reads have all been issued (or none runs).
        # No AR goes out this cycle, so ``req`` is the next UPDATE's first line.
        with m.If(self.ahead & ~pf_next & ~self.start
                  & (~live | (pf_on & (pf_bag == self.num_bags)))):
            m.d.sync += [pf_next.eq(1), pf_addr.eq(self.ahead_addr), pf_bag.eq(0),
                         pf_line.eq(0), nxt_bags.eq(self.ahead_bags),
                         nxt_glines.eq(self.ahead_glines), nxt_first.eq(req),
                         cur_rcvd.eq((rcv + axi.rvalid)[:rb + 1] == req), bad_next.eq(0)]
        with m.If(pf_next & axi.rvalid & ((rcv + 1)[:rb + 1] == nxt_first)):
            m.d.sync += cur_rcvd.eq(1)

        m.d.comb += [
            axi.arvalid.eq(ar),
            axi.araddr.eq(pf_addr),
            axi.arid.eq(0),
            axi.arlen.eq(0),
            axi.arsize.eq(_LINE_SHIFT),
            axi.arburst.eq(AxiBurst.INCR),
            axi.rready.eq(1),
            axi.bready.eq(1),
            wr.addr.eq(rcv[:rb]),
            wr.data.eq(axi.rdata),
            wr.en.eq(axi.rvalid.replicate(LINE_BITS // 8)),
        ]
        with m.If(ar & axi.arready):
            m.d.sync += [req.eq(req + 1),
                         pf_addr.eq(pf_addr + (1 << _LINE_SHIFT))]
            with m.If((pf_line + 1)[:9] == pf_glines):
                m.d.sync += [pf_line.eq(0), pf_bag.eq(pf_bag + 1)]
            with m.Else():
                m.d.sync += pf_line.eq(pf_line + 1)
        with m.If(axi.rvalid):
            m.d.sync += rcv.eq(rcv + 1)
        # A gradient read answered with an error, or a ``bad`` row: every item from then
        # on is ``bad`` (the last one comes after every read and row). A line of the
        # next UPDATE marks that one.
        bad = Signal()
        r_err = axi.rvalid & axi.rresp.any()
        with m.If(r_err & pf_next & cur_rcvd):
            m.d.sync += bad_next.eq(1)
        row_bad = rows.valid & rows.ready & rows.p.bad
        with m.If((r_err & ~(pf_next & cur_rcvd)) | row_bad | self.seq_error):
            m.d.sync += bad.eq(1)
        with m.If(self.start):
            m.d.sync += live.eq(1)
            with m.If(pf_next):
                # Its lines from ``nxt_first`` on are in the ring or on their way.
                m.d.sync += [pf_next.eq(0), cons.eq(nxt_first), pf_on.eq(1),
                             bad.eq(bad_next | (r_err & cur_rcvd) | row_bad)]
            with m.Else():
                m.d.sync += [pf_addr.eq(self.data_addr), pf_bag.eq(0), pf_line.eq(0),
                             req.eq(0), rcv.eq(0), cons.eq(0), pf_on.eq(0),
                             bad.eq(row_bad)]

        m.d.comb += [
            out.p.row.eq(row.row),
            out.p.line.eq(j),
            out.p.weight.eq(row.weight),
            out.p.grad.eq(Mux(j < self.glines, rd.data, C(0, LINE_BITS))),
            out.p.last.eq(finishing),
            out.p.nop.eq(finishing),
            out.p.bad.eq(bad),
        ]

        def release_bag(m):
            m.d.sync += cons.eq(cons + self.glines)

        # The ring read is presented one cycle before its item leaves: ``rd.addr`` is the
        # line of the item the next cycle shows.
        read_at = Signal(rb + 1)
        m.d.comb += rd.addr.eq(read_at[:rb])

        with m.FSM(init="IDLE") as fsm:
            with m.State("IDLE"):
                m.d.comb += [rows.ready.eq(1), read_at.eq(cons)]
                with m.If(rows.valid):
                    m.d.sync += [row.eq(rows.p), j.eq(0), pf_on.eq(1)]
                    with m.If(rows.p.empty_bag | ~rows.p.row_k.any()):
                        m.next = "LOAD"
                    with m.Else():
                        # A later row of the bag whose lines are in the ring: line 0
                        # is being read.
                        m.next = "EMIT"
                with m.Elif(fin):
                    m.next = "FINISH"
            # Once the bag's lines are in the ring (glines <= max_glines < 2**rb: its
            # low rb + 1 bits are all of it); an empty bag only releases them.
            with m.State("LOAD"):
                m.d.comb += read_at.eq(cons)
                with m.If(held >= self.glines[:rb + 1]):
                    with m.If(row.empty_bag):
                        release_bag(m)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "EMIT"
            with m.State("EMIT"):
                # ``rd.data`` is line ``j``; one item per cycle while ``out.ready``.
                m.d.comb += [out.valid.eq(1), read_at.eq(cons + j)]
                with m.If(out.ready):
                    with m.If((j + 1)[:9] == self.items):
                        # A next row of the same bag (not its first) goes on at once, and
                        # so does the next bag's first row if its lines have arrived.
                        same_bag = rows.valid & ~rows.p.empty_bag & rows.p.row_k.any()
                        next_bag = (rows.valid & ~rows.p.empty_bag & ~rows.p.row_k.any()
                                    & row.last_row & (after >= self.glines[:rb + 1]))
                        with m.If(same_bag):
                            m.d.comb += [rows.ready.eq(1), read_at.eq(cons)]
                            m.d.sync += [row.eq(rows.p), j.eq(0)]
                        with m.Elif(next_bag):
                            release_bag(m)
                            m.d.comb += [rows.ready.eq(1), read_at.eq(cons + self.glines)]
                            m.d.sync += [row.eq(rows.p), j.eq(0)]
                        with m.Else():
                            with m.If(row.last_row):
                                release_bag(m)
                            m.next = "IDLE"
                    with m.Else():
                        m.d.comb += read_at.eq(cons + j + 1)
                        m.d.sync += j.eq(j + 1)
            with m.State("FINISH"):
                # Every read of this UPDATE has returned: nothing is left to land in
                # the ring of the next UPDATE (whose own reads may be in flight), and
                # no read is still being offered.
                m.d.comb += out.valid.eq(Mux(pf_next, cur_rcvd, (rcv == req) & ~ar))
                with m.If(out.valid & out.ready):
                    m.d.sync += [fin.eq(0), pf_on.eq(0), live.eq(0)]
                    m.next = "IDLE"

        m.d.comb += [finishing.eq(fsm.ongoing("FINISH")),
                     self.busy.eq(~fsm.ongoing("IDLE") | fin | pf_next)]
        return m
