"""UPDATE's cache fill: a row written into a cache slot from the gather's read-ahead
lines or from PMEM; the read-ahead lines of other rows dropped.

See :class:`RowFill`.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst
from hw.widths import check_int

from .update_layouts import GLINE, LINE_BITS, check_cache_rows

__all__ = ["RowFill", "fill_request"]

_SIZE_LINE = 6      # AXI ``size`` of a 64-byte beat


def fill_request(cache_rows: int) -> data.StructLayout:
    """Payload of :attr:`RowFill.i_row`."""
    return data.StructLayout({
        "slot": (cache_rows - 1).bit_length(),
        "row": 32,          # the row (which the :class:`~.row_cursor.RowCursor` is started on)
        "lines": 7,         # lines of the row, 1..max_lines_per_row
        "from_lines": 1,    # take the row from ``i_lines`` (else read it from PMEM)
    })


class RowFill(wiring.Component):
    """Fills a cache slot with a row, from the read-ahead lines or from PMEM, and drops
    the read-ahead lines that no fill takes.

    **Read-ahead lines.** ``i_lines`` carries, in order, the lines of every row the
    cache's user may need. Each ``i_drop`` transfer (always ready; the payload is a
    line count) adds that many lines to drop: they are taken and discarded as they
    come (``drop_pending`` while some are still to come). A fill ``from_lines`` takes
    the next ``lines`` lines after those still to drop.

    **Fill.** ``i_row.ready`` is high while idle. A fill from PMEM reads one line per
    single-beat burst (ID 0, so the beats return in order; ``araddr`` is the cursor's
    ``addr``, stepped at every AR taken, ``arvalid`` until the cursor is ``at_end``).
    The lines are written into the slot in order, one per cycle at most, in the cycles
    when no update writes the cache (``write_busy`` low); ``i_lines.ready`` /
    ``rready`` are low in the other cycles. ``filled`` pulses with the write of the
    last line, and the block is idle in the next cycle. The write channels are idle.
    Reset: idle, no line to drop.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address width, 12 to 64.
    id_width : int
        AXI ID width, 1 to 16.
    cache_rows : int
        Slots of the cache, a power of two from 2 to 256.
    max_lines_per_row : int
        Lines of a slot, 1 to 64.

    Members
    -------
    i_row : ``In(stream.Signature(fill_request(cache_rows)))``
    i_lines : ``In(stream.Signature(GLINE))``
    i_drop : ``In(stream.Signature(7))``
    drop_pending, filled : ``Out(1)``
    write_busy : ``In(1)``
    write_en : ``Out(1)``, write_addr : ``Out(addr_bits)``, write_data : ``Out(512)``
        A whole line of the cache written.
    at_end : ``In(1)``, addr : ``In(addr_width)``, step : ``Out(1)``
        The :class:`~.row_cursor.RowCursor`.
    pmem : ``Out(AXI4Signature(addr_width, 512, id_width))``

    Raises
    ------
    ValueError
        A parameter out of range, naming it and its value.
    """

    def __init__(self, *, addr_width: int, id_width: int, cache_rows: int,
                 max_lines_per_row: int):
        self._addr_width = check_int("addr_width", addr_width, 12, 64)
        self._id_width = check_int("id_width", id_width, 1, 16)
        self._cache_rows = check_cache_rows(cache_rows)
        self._max_lines_per_row = check_int("max_lines_per_row", max_lines_per_row, 1, 64)
        slot_bits = (cache_rows - 1).bit_length()
        self._line_bits = (max_lines_per_row - 1).bit_length()
        super().__init__({
            "i_row": In(stream.Signature(fill_request(cache_rows))),
            "i_lines": In(stream.Signature(GLINE)),
            "i_drop": In(stream.Signature(7)),
            "drop_pending": Out(1),
            "filled": Out(1),
            "write_busy": In(1),
            "write_en": Out(1),
            "write_addr": Out(slot_bits + self._line_bits),
            "write_data": Out(LINE_BITS),
            "at_end": In(1),
            "addr": In(addr_width),
            "step": Out(1),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
        })

    addr_width = property(lambda self: self._addr_width)
    id_width = property(lambda self: self._id_width)
    cache_rows = property(lambda self: self._cache_rows)
    max_lines_per_row = property(lambda self: self._max_lines_per_row)

    def elaborate(self, platform):
        m = Module()
        axi, lines = self.pmem, self.i_lines
        m.d.comb += [
            axi.araddr.eq(self.addr),
            axi.arsize.eq(_SIZE_LINE),
            axi.arburst.eq(AxiBurst.INCR),
            self.i_drop.ready.eq(1),
        ]

        # Lines still to drop go first, whatever else happens.
        to_drop = Signal(16)
        dropped = Signal()
        m.d.comb += [
            self.drop_pending.eq(to_drop.any()),
            lines.ready.eq(to_drop.any()),
            dropped.eq(lines.valid & lines.ready & to_drop.any()),
        ]
        m.d.sync += to_drop.eq(to_drop + Mux(self.i_drop.valid, self.i_drop.p, 0) - dropped)

        request = Signal(fill_request(self._cache_rows))
        written = Signal(7)                 # lines written into the slot
        take = Signal()
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i_row.ready.eq(1)
                with m.If(self.i_row.valid):
                    m.d.sync += [request.eq(self.i_row.p), written.eq(0)]
                    m.next = "FILL"
            with m.State("FILL"):
                # The write port is the update pipeline's while it writes.
                port_free = ~self.write_busy
                with m.If(request.from_lines):
                    m.d.comb += [
                        lines.ready.eq(port_free),
                        take.eq(lines.valid & ~to_drop.any() & port_free),
                    ]
                with m.Else():
                    m.d.comb += [
                        axi.arvalid.eq(~self.at_end),
                        axi.rready.eq(port_free),
                        take.eq(axi.rvalid & port_free),
                    ]
                m.d.comb += [
                    self.step.eq(axi.arvalid & axi.arready),
                    self.write_en.eq(take),
                    self.write_addr.eq(Cat(written[:self._line_bits], request.slot)),
                    self.write_data.eq(Mux(request.from_lines, lines.p.data, axi.rdata)),
                ]
                with m.If(take):
                    m.d.sync += written.eq(written + 1)
                    with m.If((written + 1)[:7] == request.lines):
                        m.d.comb += self.filled.eq(1)
                        m.next = "IDLE"
        return m
