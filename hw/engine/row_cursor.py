"""The PMEM address of the line that UPDATE's cache moves next.

See :class:`RowCursor`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.widths import check_int

__all__ = ["RowCursor"]


class RowCursor(wiring.Component):
    """Walks the lines of one table row in PMEM: ``addr`` is ``table_base + (row *
    lines_per_row + line) * 64``.

    ``start`` loads ``row`` and sets ``line`` to 0, ``step`` advances ``line`` by one
    (both take effect in the next cycle; ``start`` wins). ``table_base`` and
    ``lines_per_row`` are used as they are in every cycle, so ``addr`` follows them
    combinationally. ``at_end`` says every line of the row has been stepped over
    (``line == lines_per_row``), ``at_last`` that ``line`` is the row's last one. The
    cache's write-back and its fill from PMEM each walk a row with it, one after the
    other, so both AXI address channels carry ``addr``. Reset: row 0, line 0.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address width, 12 to 64.

    Members
    -------
    start : ``In(1)``, row : ``In(32)``, step : ``In(1)``
    table_base : ``In(addr_width)``, lines_per_row : ``In(7)``
    addr : ``Out(addr_width)``
    line : ``Out(7)``
    at_last, at_end : ``Out(1)``

    Raises
    ------
    ValueError
        ``addr_width`` out of range, naming its value.
    """

    def __init__(self, *, addr_width: int):
        self._addr_width = check_int("addr_width", addr_width, 12, 64)
        super().__init__({
            "start": In(1),
            "row": In(32),
            "step": In(1),
            "table_base": In(addr_width),
            "lines_per_row": In(7),
            "addr": Out(addr_width),
            "line": Out(7),
            "at_last": Out(1),
            "at_end": Out(1),
        })

    addr_width = property(lambda self: self._addr_width)

    def elaborate(self, platform):
        m = Module()
        row = Signal(32, reset_less=True)
        with m.If(self.start):
            m.d.sync += [row.eq(self.row), self.line.eq(0)]
        with m.Elif(self.step):
            m.d.sync += self.line.eq(self.line + 1)
        lines = Signal(32)
        m.d.comb += lines.eq(self.lines_per_row)
        row_line = Signal(64)
        m.d.comb += row_line.eq(row * lines)
        row_addr = Signal(self._addr_width)
        m.d.comb += [
            row_addr.eq(self.table_base + (row_line << 6)),
            self.addr.eq(row_addr + (self.line << 6)),
            self.at_last.eq((self.line + 1)[:7] == self.lines_per_row),
            self.at_end.eq(self.line == self.lines_per_row),
        ]
        return m
