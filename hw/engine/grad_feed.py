"""UPDATE's feeder: turns the counted rows of the bags into the gradient items
:class:`~.scatter_update.ScatterUpdate` applies, reading each bag's gradient once."""

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.arith.fp32 import add
from hw.bus.axi import AXI4Signature, AxiBurst

from ..widths import eq_const
from .row_gather import ROW
from .scatter_update import ITEM

__all__ = ["GradFeed"]

_LINE_BITS = 512
_LINE_SHIFT = 6

(_IDLE, _LOAD, _EMIT_RD, _EMIT_OUT, _FINISH) = range(5)


class GradFeed(wiring.Component):
    """Feeds :class:`~.scatter_update.ScatterUpdate` the items of one UPDATE.

    The bags arrive as the ``ROW`` stream of :class:`~.bag_sequencer.BagSequencer`
    (counted rows in index order, a lone item per empty bag). Bag ``b``'s fp32
    gradient is ``glines`` lines at ``data_addr + b * glines * 64``
    (``docs/embedding.md``). At the first counted row of a bag the gradient is read into
    a line buffer (one single-beat read per line, AXI ID 0, in order); then every
    counted row of the bag becomes ``items`` items ``line = 0 .. items - 1`` carrying
    gradient line ``line`` (zero past ``glines``: the bf16 padding of
    :class:`~.scatter_update.ScatterUpdate`) and the row's weight. Empty bags only
    advance the gradient address. After ``finish`` (the UPDATE's last row has been
    handed over) and once every row is fed, one ``nop`` + ``last`` item ends the
    descriptor, so ScatterUpdate flushes its cache and reports.

    Rate: two cycles per item (the buffer read, then the item register), plus a PMEM
    read latency per non-empty bag; ScatterUpdate needs at least nine cycles per item,
    so this block never limits an UPDATE by more than that latency per bag.

    Members
    -------
    start : ``In(1)``
        Pulse when an UPDATE is dispatched: the gradient address restarts at
        ``data_addr``.
    data_addr, glines, items : ``In``
        The UPDATE's gradient buffer, gradient lines per bag (1..``max_glines``) and
        items per counted row (table lines, twice that for bf16).
    finish : ``In(1)``
        Pulse once the UPDATE's rows have all been taken from ``i_rows``.
    i_rows : ``In(stream.Signature(ROW))``
    pmem : ``Out(AXI4Signature(...))``
        Read port (AR, R).
    o_items : ``Out(stream.Signature(ITEM))``
    busy : ``Out(1)``
    """

    def __init__(self, *, addr_width: int, id_width: int, max_glines: int):
        self._addr_width = addr_width
        self._max_glines = max_glines
        super().__init__({
            "start": In(1),
            "data_addr": In(addr_width),
            "glines": In(9),
            "items": In(9),
            "finish": In(1),
            "i_rows": In(stream.Signature(ROW)),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=_LINE_BITS,
                                      id_width=id_width)),
            "o_items": Out(stream.Signature(ITEM)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        axi, rows, out = self.pmem, self.i_rows, self.o_items
        buf_bits = max(1, (self._max_glines - 1).bit_length())
        m.submodules.buf = buf = Memory(shape=_LINE_BITS, depth=1 << buf_bits, init=[])
        rd = buf.read_port(transparent_for=())
        wr = buf.write_port()

        state = Signal(range(_FINISH + 1))
        base = Signal(aw)               # this bag's gradient
        cnt = Signal(9)                 # gradient lines requested
        rcnt = Signal(9)                # gradient lines received
        j = Signal(9)                   # item of the current row
        row = Signal(ROW)
        fin = Signal()
        ar_pend = Signal()

        with m.If(self.finish):
            m.d.sync += fin.eq(1)
        with m.If(self.start):
            m.d.sync += base.eq(self.data_addr)

        m.d.comb += [
            axi.arvalid.eq(ar_pend),
            axi.araddr.eq(add(base, Cat(C(0, _LINE_SHIFT), cnt)[:aw], aw)),
            axi.arid.eq(0),
            axi.arlen.eq(0),
            axi.arsize.eq(_LINE_SHIFT),
            axi.arburst.eq(AxiBurst.INCR),
            axi.rready.eq(1),
            axi.bready.eq(1),
            wr.addr.eq(rcnt[:buf_bits]),
            wr.data.eq(axi.rdata),
            rd.addr.eq(j[:buf_bits]),
        ]
        m.d.comb += [
            out.p.row.eq(row.row),
            out.p.line.eq(j),
            out.p.weight.eq(row.weight),
            out.p.grad.eq(Mux(j < self.glines, rd.data, C(0, _LINE_BITS))),
            out.p.last.eq(eq_const(state, _FINISH)),
            out.p.nop.eq(eq_const(state, _FINISH)),
        ]

        def end_of_bag(m):
            m.d.sync += base.eq(add(base, Cat(C(0, _LINE_SHIFT), self.glines), aw))

        with m.Switch(state):
            with m.Case(_IDLE):
                m.d.comb += rows.ready.eq(1)
                with m.If(rows.valid):
                    m.d.sync += [row.eq(rows.p), j.eq(0)]
                    with m.If(rows.p.empty_bag):
                        end_of_bag(m)
                    with m.Elif(~rows.p.row_k.any()):
                        m.d.sync += [cnt.eq(0), rcnt.eq(0), ar_pend.eq(1)]
                        m.d.sync += state.eq(_LOAD)
                    with m.Else():
                        m.d.sync += state.eq(_EMIT_RD)
                with m.Elif(fin):
                    m.d.sync += state.eq(_FINISH)
            with m.Case(_LOAD):
                with m.If(ar_pend & axi.arready):
                    m.d.sync += cnt.eq(add(cnt, 1, 9))
                    with m.If(add(cnt, 1, 9) == self.glines):
                        m.d.sync += ar_pend.eq(0)
                with m.If(axi.rvalid):
                    m.d.comb += wr.en.eq(1)
                    m.d.sync += rcnt.eq(add(rcnt, 1, 9))
                    with m.If(add(rcnt, 1, 9) == self.glines):
                        m.d.sync += state.eq(_EMIT_RD)
            with m.Case(_EMIT_RD):
                m.d.sync += state.eq(_EMIT_OUT)
            with m.Case(_EMIT_OUT):
                m.d.comb += out.valid.eq(1)
                with m.If(out.ready):
                    with m.If(add(j, 1, 9) == self.items):
                        with m.If(row.last_row):
                            end_of_bag(m)
                        m.d.sync += state.eq(_IDLE)
                    with m.Else():
                        m.d.sync += [j.eq(add(j, 1, 9)), state.eq(_EMIT_RD)]
            with m.Case(_FINISH):
                m.d.comb += out.valid.eq(1)
                with m.If(out.ready):
                    m.d.sync += [fin.eq(0), state.eq(_IDLE)]

        m.d.comb += self.busy.eq(state.any() | fin)    # not _IDLE (0)
        return m
