"""The DCOH's flip command: walks a range of pages and turns each to device bias (claiming
its lines from the host) or to host bias (draining the device's accesses).

See :class:`BiasFlip`; it is built into :class:`hw.cxl.dcoh.Dcoh` (``docs/dcoh.md``,
"Flip command").
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..widths import is_int as _is_int
from ..widths import is_pow2 as _is_pow2

__all__ = ["FLIP_STATUS", "BiasFlip", "flip_layout"]

#: ``o_status``: ``busy`` while the command runs (or the DCOH sweeps its table);
#: ``done`` and ``error`` are levels, cleared by an accepted start.
FLIP_STATUS = data.StructLayout({"busy": 1, "done": 1, "error": 1})


def flip_layout(pages: int) -> data.StructLayout:
    """The command for a table of ``pages`` pages: ``first_page``
    (``max(1, ceil(log2(pages)))`` bits), ``pages`` (wide enough for ``pages``),
    ``to_host``."""
    return data.StructLayout({"first_page": max(1, (pages - 1).bit_length()),
                              "pages": pages.bit_length(), "to_host": 1})


class BiasFlip(wiring.Component):
    """Flip command of the DCOH, one page at a time, in page order.

    **To device bias.** The page's bias is read (``o_page`` on the bias read port, its
    value on ``i_bias_dev`` a cycle later). A page already in device bias is skipped.
    Otherwise ``o_claim_want`` asks for one claim per line of the page
    (``o_claim_line``, the device line address); the DCOH sends each as a D2H
    RdOwnNoData when it can and pulses ``i_claim_go``. ``i_claims_back`` counts the
    claims the host answered this cycle (MemRdFwd or GO-E, 0 to 2 in one cycle), and
    ``i_claim_denied`` says one of them was GO-Err. Once every line is claimed and every
    claim answered, the page is written to device bias (``o_wr_req`` with ``o_wr_val =
    1`` until ``i_wr_go``), unless the host touched the page (``i_touch``, a host check
    of the page, at any time from its first claim to the write): then the page stays in
    host bias, the command goes on and ends with ``error`` and ``o_err_contended``
    pulses. A denied claim leaves the page in host bias too and ends the command with
    ``error``, without that pulse (the DCOH flags the GO-Err itself).

    **To host bias.** A page in device bias is written to host bias; then, in either
    bias, the command snapshots ``i_page_tracked`` (the entries of the page with an
    access permitted and not done, excluding this cycle's dones) and waits until each of
    them is in ``i_cleared`` (a done).

    **Start.** ``i_start`` with ``i_cmd`` starts a command while idle; ``pages = 0`` ends
    it at once; a range beyond the table ends it at once with ``error``
    (``o_err_range``); a start while a command runs or while ``i_sweeping`` is ignored
    (``o_err_busy``). Error pulses are combinational, in the cycle of the cause.

    **Latency.** 3 cycles for a skipped page; to device bias, the claims, the host's
    answer to the last one and 5 cycles; to host bias, 5 or 6 cycles plus the drain.

    Parameters
    ----------
    pages : int
        Pages of the bias table, 1 to 2**24.
    lines_per_page : int
        Lines per page, a power of two from 1 to 2**15.
    entries : int
        Entries of the DCOH's pool (the width of ``i_page_tracked`` / ``i_cleared``).

    Members
    -------
    i_start : ``In(1)``, i_cmd : ``In(flip_layout(pages))``
        The command.
    i_sweeping : ``In(1)``
        The DCOH's reset sweep runs (busy, starts ignored).
    o_status : ``Out(FLIP_STATUS)``
    o_busy : ``Out(1)``
        A command runs (the sweep not included).
    o_page : ``Out(page bits)``
        The page being worked on (also the bias read address).
    i_bias_dev : ``In(1)``
        The bias of ``o_page`` as read a cycle earlier.
    o_wr_req, o_wr_val : ``Out(1)``; i_wr_go : ``In(1)``
        Bias write of ``o_page``.
    o_claiming : ``Out(1)``
        Claiming the page's lines or about to write its bias (a host check of ``o_page``
        now spoils it).
    o_claim_want : ``Out(1)``; o_claim_line : ``Out(device line bits)``; i_claim_go : ``In(1)``
        The next claim.
    i_claims_back : ``In(range(3))``; i_claim_denied : ``In(1)``
        Claims answered this cycle; one of them with GO-Err.
    i_touch : ``In(1)``
        A host check of ``o_page`` while ``o_claiming``.
    i_page_tracked, i_cleared : ``In(entries)``
        For the drain.
    o_err_busy, o_err_range, o_err_contended : ``Out(1)``
    """

    def __init__(self, *, pages: int, lines_per_page: int, entries: int):
        if not _is_int(pages) or not 1 <= pages <= 1 << 24:
            raise ValueError(f"pages must be an integer from 1 to {1 << 24}, not {pages!r}")
        if not _is_pow2(lines_per_page) or not 1 <= lines_per_page <= 1 << 15:
            raise ValueError(f"lines_per_page must be a power of two from 1 to {1 << 15}, "
                             f"not {lines_per_page!r}")
        if not _is_int(entries) or not 1 <= entries <= 256:
            raise ValueError(f"entries must be an integer from 1 to 256, not {entries!r}")
        self._pages = pages
        self._shift = lines_per_page.bit_length() - 1
        self._layout = flip_layout(pages)
        pb = self._layout["first_page"].width
        super().__init__({
            "i_start": In(1),
            "i_cmd": In(self._layout),
            "i_sweeping": In(1),
            "o_status": Out(FLIP_STATUS),
            "o_busy": Out(1),
            "o_page": Out(pb),
            "i_bias_dev": In(1),
            "o_wr_req": Out(1),
            "o_wr_val": Out(1),
            "i_wr_go": In(1),
            "o_claiming": Out(1),
            "o_claim_want": Out(1),
            "o_claim_line": Out(pb + self._shift),
            "i_claim_go": In(1),
            "i_claims_back": In(range(3)),
            "i_claim_denied": In(1),
            "i_touch": In(1),
            "i_page_tracked": In(entries),
            "i_cleared": In(entries),
            "o_err_busy": Out(1),
            "o_err_range": Out(1),
            "o_err_contended": Out(1),
        })

    @property
    def cmd_layout(self) -> data.StructLayout:
        return self._layout

    def elaborate(self, platform):
        m = Module()
        shift = self._shift
        pb = self._layout["first_page"].width
        cmd, st = self.i_cmd, self.o_status
        cur = self.o_page
        end = Signal(pb + 2)
        to_host = Signal()
        line = Signal(shift + 1)        # lines of the page claimed so far
        out = Signal(range(len(self.i_page_tracked) + 1))   # claims not yet answered
        spoiled = Signal()              # the host touched the page during its claims
        denied = Signal()               # the host refused a claim of the page (GO-Err)
        failed = Signal()               # some page of the command was not flipped
        pending = Signal(len(self.i_page_tracked))          # accesses the drain waits for

        m.d.comb += [
            self.o_claim_line.eq(Cat(line[:shift], cur)),
            st.busy.eq(self.o_busy | self.i_sweeping),
        ]
        with m.If(self.i_claim_go):
            m.d.sync += line.eq(line + 1)
        m.d.sync += out.eq(out + self.i_claim_go - self.i_claims_back)
        with m.If(self.i_claim_denied):
            m.d.sync += denied.eq(1)
        with m.If(self.i_touch):
            m.d.sync += spoiled.eq(1)

        with m.FSM(name="flip"):
            with m.State("IDLE"), m.If(self.i_start & ~self.i_sweeping):
                m.d.sync += [st.done.eq(0), st.error.eq(0)]
                with m.If(~cmd.pages.any()):
                    m.d.sync += st.done.eq(1)
                with m.Elif(cmd.first_page + cmd.pages > self._pages):
                    m.d.sync += [st.done.eq(1), st.error.eq(1)]
                    m.d.comb += self.o_err_range.eq(1)
                with m.Else():
                    m.d.sync += [cur.eq(cmd.first_page), end.eq(cmd.first_page + cmd.pages),
                                 to_host.eq(cmd.to_host), failed.eq(0)]
                    m.next = "READ"
            with m.State("READ"):       # the page's bias is read in this cycle
                m.d.comb += self.o_busy.eq(1)
                m.next = "DECIDE"
            with m.State("DECIDE"):
                m.d.comb += self.o_busy.eq(1)
                m.d.sync += [line.eq(0), spoiled.eq(0), denied.eq(0)]
                with m.If(to_host):
                    # A page already in host bias is drained all the same: a host check
                    # may have flipped it back and still be waiting for its accesses.
                    with m.If(self.i_bias_dev):
                        m.next = "HOST_WRITE"
                    with m.Else():
                        m.next = "SNAPSHOT"
                with m.Elif(self.i_bias_dev):   # already in device bias: skipped
                    m.next = "NEXT"
                with m.Else():
                    m.next = "CLAIM"
            with m.State("CLAIM"):
                m.d.comb += [self.o_busy.eq(1), self.o_claiming.eq(1),
                             self.o_claim_want.eq(~line[shift])]
                with m.If(line[shift] & ~out.any()):
                    m.next = "COMMIT"
            with m.State("COMMIT"):
                m.d.comb += [self.o_busy.eq(1), self.o_claiming.eq(1)]
                with m.If(denied):      # the DCOH flagged the GO-Err when it came
                    m.d.sync += failed.eq(1)
                    m.next = "NEXT"
                with m.Elif(spoiled | self.i_touch):
                    m.d.sync += failed.eq(1)
                    m.d.comb += self.o_err_contended.eq(1)
                    m.next = "NEXT"
                with m.Else():
                    m.d.comb += [self.o_wr_req.eq(1), self.o_wr_val.eq(1)]
                    with m.If(self.i_wr_go):
                        m.next = "NEXT"
            with m.State("HOST_WRITE"):
                m.d.comb += [self.o_busy.eq(1), self.o_wr_req.eq(1)]
                with m.If(self.i_wr_go):
                    m.next = "SNAPSHOT"
            with m.State("SNAPSHOT"):   # accesses decided up to the write are tracked now
                m.d.comb += self.o_busy.eq(1)
                m.d.sync += pending.eq(self.i_page_tracked)
                m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += self.o_busy.eq(1)
                m.d.sync += pending.eq(pending & ~self.i_cleared)
                with m.If(~pending.any()):
                    m.next = "NEXT"
            with m.State("NEXT"):
                m.d.comb += self.o_busy.eq(1)
                nxt = Signal(pb + 2)
                m.d.comb += nxt.eq(cur + 1)
                with m.If(nxt == end):
                    m.d.sync += [st.done.eq(1), st.error.eq(failed)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += cur.eq(nxt[:pb])
                    m.next = "READ"
        m.d.comb += self.o_err_busy.eq(self.i_start & (self.o_busy | self.i_sweeping))
        return m
