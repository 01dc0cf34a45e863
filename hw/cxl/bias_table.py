"""The DCOH's bias table: one bit per page of device memory, host bias after every reset.

See :class:`BiasTable`; it is built into :class:`hw.cxl.dcoh.Dcoh` (``docs/dcoh.md``).
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..widths import is_int as _is_int

__all__ = ["BiasTable"]


class BiasTable(wiring.Component):
    """Bias of each page (0 host bias, 1 device bias), with three readers and two writers.

    **Reads.** Three synchronous read ports, for the access decision (``i_acc_page``,
    always enabled), the host check (``i_chk_page`` with ``i_chk_en``) and the flip
    (``i_flip_page``, always enabled): the bias of the page addressed in cycle *d* is on
    ``o_*_dev`` in cycle *d* + 1. Every port is transparent for the table's write, so a
    value read in cycle *d* includes a write in cycle *d* (the DCOH's race arguments in
    ``docs/dcoh.md`` rely on it).

    **Writes.** One per cycle, combinationally granted: the reset sweep first, then the
    host check (``i_chk_wr`` writes host bias to ``i_chk_wr_page``; ``o_chk_wr_go``),
    then the flip (``i_flip_wr`` writes ``i_flip_wr_dev`` to ``i_flip_page``;
    ``o_flip_wr_go``). A request waits, asserted, until its ``go``.

    **Reset.** A memory keeps its contents over a reset, so after a (synchronous) reset
    the table writes host bias into every page, one per cycle (``max(pages, 2)``
    cycles) while ``o_sweeping`` is high; neither write request is granted meanwhile.

    Parameters
    ----------
    pages : int
        Pages of the table, 1 to 2**24.
    page_bits : int
        Width of a page number, at least ``max(1, ceil(log2(pages)))``.

    Members
    -------
    i_acc_page : ``In(page_bits)``; o_acc_dev : ``Out(1)``
        The access decision's read port.
    i_chk_page : ``In(page_bits)``; i_chk_en : ``In(1)``; o_chk_dev : ``Out(1)``
        The host check's read port (``o_chk_dev`` holds while ``i_chk_en`` is low).
    i_flip_page : ``In(page_bits)``; o_flip_dev : ``Out(1)``
        The flip's read port and write address.
    i_chk_wr : ``In(1)``; i_chk_wr_page : ``In(page_bits)``; o_chk_wr_go : ``Out(1)``
        The host check's write of host bias.
    i_flip_wr, i_flip_wr_dev : ``In(1)``; o_flip_wr_go : ``Out(1)``
        The flip's write.
    o_sweeping : ``Out(1)``
        The reset sweep runs.

    Raises
    ------
    ValueError
        If ``pages`` is out of its range or ``page_bits`` too narrow for it.
    """

    def __init__(self, *, pages: int, page_bits: int):
        if not _is_int(pages) or not 1 <= pages <= 1 << 24:
            raise ValueError(f"pages must be an integer from 1 to {1 << 24}, not {pages!r}")
        least = max(1, (pages - 1).bit_length())
        if not _is_int(page_bits) or page_bits < least:
            raise ValueError(f"page_bits must be an integer of at least {least} for "
                             f"{pages} pages, not {page_bits!r}")
        self._pages = pages
        self._page_bits = page_bits
        super().__init__({
            "i_acc_page": In(page_bits),
            "o_acc_dev": Out(1),
            "i_chk_page": In(page_bits),
            "i_chk_en": In(1),
            "o_chk_dev": Out(1),
            "i_flip_page": In(page_bits),
            "o_flip_dev": Out(1),
            "i_chk_wr": In(1),
            "i_chk_wr_page": In(page_bits),
            "o_chk_wr_go": Out(1),
            "i_flip_wr": In(1),
            "i_flip_wr_dev": In(1),
            "o_flip_wr_go": Out(1),
            "o_sweeping": Out(1),
        })

    @property
    def pages(self) -> int:
        return self._pages

    @property
    def page_bits(self) -> int:
        return self._page_bits

    def elaborate(self, platform):
        m = Module()
        depth = max(self._pages, 2)     # a depth-1 memory would have a zero-width address
        m.submodules.bias = bias = Memory(shape=1, depth=depth, init=[])
        wr = bias.write_port()
        rd_acc = bias.read_port(transparent_for=(wr,))
        rd_chk = bias.read_port(transparent_for=(wr,))
        rd_flip = bias.read_port(transparent_for=(wr,))
        sweeping = Signal(init=1)
        sweep_page = Signal(range(depth))
        m.d.comb += [
            rd_acc.addr.eq(self.i_acc_page), self.o_acc_dev.eq(rd_acc.data),
            rd_chk.addr.eq(self.i_chk_page), rd_chk.en.eq(self.i_chk_en),
            self.o_chk_dev.eq(rd_chk.data),
            rd_flip.addr.eq(self.i_flip_page), self.o_flip_dev.eq(rd_flip.data),
            self.o_sweeping.eq(sweeping),
        ]
        with m.If(sweeping):
            m.d.comb += [wr.en.eq(1), wr.addr.eq(sweep_page), wr.data.eq(0)]
            m.d.sync += sweep_page.eq(sweep_page + 1)
            with m.If(sweep_page == depth - 1):
                m.d.sync += sweeping.eq(0)
        with m.Elif(self.i_chk_wr):
            m.d.comb += [wr.en.eq(1), wr.addr.eq(self.i_chk_wr_page), wr.data.eq(0),
                         self.o_chk_wr_go.eq(1)]
        with m.Elif(self.i_flip_wr):
            m.d.comb += [wr.en.eq(1), wr.addr.eq(self.i_flip_page),
                         wr.data.eq(self.i_flip_wr_dev), self.o_flip_wr_go.eq(1)]
        return m
