"""The DCOH's check of host accesses: before the endpoint serves a host request to device
memory, the page is set to host bias and the device's accesses the request must wait
for are drained.

See :class:`HostCheck`; it is built into :class:`hw.cxl.dcoh.Dcoh` (``docs/dcoh.md``,
"Host check").
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..widths import is_int as _is_int

__all__ = ["HostCheck"]


class HostCheck(wiring.Component):
    """One host check at a time, answered in order.

    A check (``i_chk``: the device line address of a host request) is taken while no
    check is held (or the held one is answered in that cycle) and the DCOH is not
    sweeping; the bias read port is addressed with its page in that cycle
    (``o_bias_addr``, ``o_bias_en``), and ``i_bias_dev`` has the page's bias a cycle
    later. Then:

    * a line beyond device memory (``total_lines``) is answered at once with
      ``error`` (``o_err_range`` pulses in the cycle the answer is loaded);
    * a page in device bias is first written to host bias (``o_wr_req`` until
      ``i_wr_go``; the answer has ``flipped``);
    * then the check snapshots ``i_snap`` (the entries it must wait for, given
      ``o_line``: the DCOH computes them) and answers once each of them is in
      ``i_cleared``; with nothing to wait for it answers in the cycle of the snapshot.

    ``o_chk`` is a register obeying the stream rules. ``o_active`` is high while a
    check of a line inside device memory is held (a flip claiming that page is spoiled).

    Parameters
    ----------
    total_lines : int
        Lines of device memory (``pages * lines_per_page``), at least 1.
    lines_per_page : int
        A power of two.
    page_bits : int
        Width of a page number.
    entries : int
        Width of ``i_snap`` / ``i_cleared``.
    chk_layout : data.StructLayout
        ``o_chk`` payload, with ``flipped`` and ``error``.
    line_bits : int
        Width of a line address.
    """

    def __init__(self, *, total_lines: int, lines_per_page: int, page_bits: int,
                 entries: int, chk_layout, line_bits: int):
        if not _is_int(total_lines) or total_lines < 1:
            raise ValueError(f"total_lines must be a positive integer, not {total_lines!r}")
        self._total = total_lines
        self._shift = lines_per_page.bit_length() - 1
        self._page_bits = page_bits
        super().__init__({
            "i_chk": In(stream.Signature(line_bits)),
            "o_chk": Out(stream.Signature(chk_layout)),
            "i_sweeping": In(1),
            "o_bias_addr": Out(page_bits),
            "o_bias_en": Out(1),
            "i_bias_dev": In(1),
            "o_wr_req": Out(1),
            "i_wr_go": In(1),
            "o_line": Out(line_bits),
            "o_page": Out(page_bits),
            "o_active": Out(1),
            "i_snap": In(entries),
            "i_cleared": In(entries),
            "o_err_range": Out(1),
            "o_busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        shift, pb = self._shift, self._page_bits
        chk, och = self.i_chk, self.o_chk
        line = self.o_line
        held = Signal()                 # a check is held
        flipped = Signal()
        pending = Signal(len(self.i_snap))
        answer = Signal()               # load the answer this cycle
        inside = Signal()
        m.d.comb += [
            self.o_page.eq(line[shift:shift + pb]),
            inside.eq(line < self._total),
            self.o_active.eq(held & inside),
            chk.ready.eq(~self.i_sweeping & (~held | answer)),
            self.o_bias_addr.eq(chk.payload[shift:shift + pb]),
            self.o_bias_en.eq(chk.ready),
            self.o_busy.eq(held | och.valid),
        ]
        out_free = ~och.valid | och.ready

        def snapshot_or_answer():
            with m.If(~self.i_snap.any() & out_free):
                m.d.comb += answer.eq(1)
            with m.Else():
                m.d.sync += pending.eq(self.i_snap)
                m.next = "WAIT"

        def take_next():
            """After the state's own transition: a new check starts in DECIDE; an
            answered one with none behind it leaves the FSM idle."""
            with m.If(chk.ready & chk.valid):
                m.d.sync += [line.eq(chk.payload), flipped.eq(0)]
                m.next = "DECIDE"
            with m.Elif(answer):
                m.next = "IDLE"

        with m.FSM(name="check") as fsm:
            with m.State("IDLE"):
                take_next()
            with m.State("DECIDE"):
                with m.If(~inside):
                    m.d.comb += answer.eq(out_free)
                with m.Elif(self.i_bias_dev):
                    m.d.comb += self.o_wr_req.eq(1)
                    m.d.sync += flipped.eq(self.i_wr_go)
                    with m.If(self.i_wr_go):
                        m.next = "SNAPSHOT"
                    with m.Else():
                        m.next = "WRITE"
                with m.Else():
                    snapshot_or_answer()
                take_next()
            with m.State("WRITE"):
                m.d.comb += self.o_wr_req.eq(1)
                with m.If(self.i_wr_go):
                    m.d.sync += flipped.eq(1)
                    m.next = "SNAPSHOT"
            with m.State("SNAPSHOT"):
                snapshot_or_answer()
                take_next()
            with m.State("WAIT"):
                m.d.sync += pending.eq(pending & ~self.i_cleared)
                m.d.comb += answer.eq(~pending.any() & out_free)
                take_next()
        m.d.comb += held.eq(~fsm.ongoing("IDLE"))
        with m.If(answer):
            m.d.sync += [och.valid.eq(1), och.p.flipped.eq(flipped), och.p.error.eq(~inside)]
        with m.Elif(och.ready):
            m.d.sync += och.valid.eq(0)
        m.d.comb += self.o_err_range.eq(answer & ~inside)
        return m
