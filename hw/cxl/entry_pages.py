"""The pages of the DCOH's entries: which accesses a host check and a flip must wait for.

See :class:`EntryPages`; it is built into :class:`hw.cxl.dcoh.Dcoh` (``docs/dcoh.md``,
"Host check").
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..widths import is_int as _is_int
from ..widths import is_pow2 as _is_pow2

__all__ = ["EntryPages"]


class EntryPages(wiring.Component):
    """Remembers each entry's page and line, and matches them against a check's and a
    flip's page.

    An allocation (``i_alloc``, one-hot) stores ``i_page`` and the line within its page
    (``i_line``) for the entry; ``i_by_forward`` marks entries permitted by a forward
    (host bias), until their next allocation. Combinationally:

    * ``o_chk_wait``: the ``i_tracked`` entries of the page of ``i_chk_line``, without
      this cycle's dones (``i_cleared``: an entry leaves ``i_tracked`` only at the next
      edge), where an entry permitted by its forward counts only for a check of its own
      line: the host ordered it with its forward, and waiting for it on other lines
      would deadlock a user that holds a granted line until another line of the same
      page is granted after a write-back the check is holding;
    * ``o_flip_wait``: the ``i_tracked`` entries of ``i_flip_page``, without
      ``i_cleared``.

    Parameters
    ----------
    pages : int
        Pages of device memory, 1 to 2**24.
    lines_per_page : int
        A power of two from 1 to 2**15.
    entries : int
        Entries of the pool, 1 to 256.
    line_bits : int
        Width of a line address.

    Members
    -------
    i_alloc, i_by_forward : ``In(entries)``
        The entry allocated this cycle; entries permitted by a forward this cycle.
    i_page : ``In(page bits)``; i_line : ``In(line_bits)``
        The allocated entry's page and line.
    i_tracked, i_cleared : ``In(entries)``
        Entries permitted and not done; those done this cycle.
    i_chk_line : ``In(line_bits)``; i_flip_page : ``In(page bits)``
        What to match.
    o_chk_wait, o_flip_wait : ``Out(entries)``
        The entries a check and a flip wait for.

    Raises
    ------
    ValueError
        If a parameter is out of its range or of the wrong type.
    """

    def __init__(self, *, pages: int, lines_per_page: int, entries: int, line_bits: int):
        if not _is_int(pages) or not 1 <= pages <= 1 << 24:
            raise ValueError(f"pages must be an integer from 1 to {1 << 24}, not {pages!r}")
        if not _is_pow2(lines_per_page) or not lines_per_page <= 1 << 15:
            raise ValueError(f"lines_per_page must be a power of two from 1 to {1 << 15}, "
                             f"not {lines_per_page!r}")
        if not _is_int(entries) or not 1 <= entries <= 256:
            raise ValueError(f"entries must be an integer from 1 to 256, not {entries!r}")
        pb = max(1, (pages - 1).bit_length())
        self._pages = pages
        self._lines_per_page = lines_per_page
        self._line_bits = line_bits
        self._shift = lines_per_page.bit_length() - 1
        if not _is_int(line_bits) or line_bits < pb + self._shift:
            raise ValueError(f"line_bits must be an integer of at least {pb + self._shift}, "
                             f"not {line_bits!r}")
        super().__init__({
            "i_alloc": In(entries),
            "i_by_forward": In(entries),
            "i_page": In(pb),
            "i_line": In(line_bits),
            "i_tracked": In(entries),
            "i_cleared": In(entries),
            "i_chk_line": In(line_bits),
            "i_flip_page": In(pb),
            "o_chk_wait": Out(entries),
            "o_flip_wait": Out(entries),
        })

    @property
    def pages(self) -> int:
        return self._pages

    @property
    def lines_per_page(self) -> int:
        return self._lines_per_page

    @property
    def entries(self) -> int:
        return len(self.i_alloc)

    @property
    def line_bits(self) -> int:
        return self._line_bits

    def elaborate(self, platform):
        m = Module()
        n, shift, pb = len(self.i_alloc), self._shift, len(self.i_page)
        page = [Signal(pb, name=f"page{i}") for i in range(n)]
        line = [Signal(shift, name=f"line{i}") for i in range(n)] if shift else []
        by_forward = Signal(n)
        for i in range(n):
            with m.If(self.i_alloc[i]):
                m.d.sync += page[i].eq(self.i_page)
                if shift:
                    m.d.sync += line[i].eq(self.i_line[:shift])
        m.d.sync += by_forward.eq((by_forward & ~self.i_alloc) | self.i_by_forward)

        def in_page(p, name: str) -> Signal:
            match = Signal(n, name=name)
            m.d.comb += match.eq(Cat(*(e == p for e in page)))
            return match

        chk_line = self.i_chk_line
        if shift:
            same_line = Cat(*(lo == chk_line[:shift] for lo in line))
        else:
            same_line = C((1 << n) - 1, n)
        live = self.i_tracked & ~self.i_cleared
        m.d.comb += [
            self.o_chk_wait.eq(in_page(chk_line[shift:shift + pb], "chk_match") & live
                               & (~by_forward | same_line)),
            self.o_flip_wait.eq(in_page(self.i_flip_page, "flip_match") & live),
        ]
        return m
