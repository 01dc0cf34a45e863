"""Multi-pass UPDATE: an UPDATE whose indices exceed the scatter's accumulator runs as
passes over disjoint sets of its rows, chosen by a hash of the row, each pass re-reading
the indices and gradients and writing its own rows once (``docs/embedding.md``,
"Passes").

See :class:`UpdatePasses`, :func:`passes_needed`, :func:`pass_hash` and
:func:`in_pass`.
"""

from __future__ import annotations

from amaranth.hdl import C, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.widths import check_pow2

from .bag_sequencer import STATUS
from .descriptor import DescKind, Descriptor, Status
from .update_layouts import DONE

__all__ = ["LEVEL_BITS", "UpdatePasses", "in_pass", "pass_hash", "passes_needed"]

#: Width of a pass level (0 .. 32: hash bits a pass fixes).
LEVEL_BITS = 6


def pass_hash(row):
    """The pass hash of a 32-bit ``row`` in logic: xorshift32 (shifts 13, 17, 5), a
    bijection of the 32 bits (``sim.embedding.pass_hash`` is the contract)."""
    x = row[:32]
    x = x ^ (x << 13)[:32]
    x = x ^ (x >> 17)
    return (x ^ (x << 5)[:32])[:32]


def in_pass(row, level, value):
    """``row`` belongs to pass ``(level, value)``: the low ``level`` bits of its pass
    hash equal ``value``'s (level 0: every row)."""
    mask = ((C(1, 33) << level) - 1)[:32]
    return ((pass_hash(row) ^ value) & mask) == 0


def passes_needed(d, acc_rows: int, acc_lines: int):
    """The passes an UPDATE of descriptor ``d`` (a ``Descriptor`` view) needs by its
    index count: ``max(ceil(n / acc_rows), ceil(n * g / acc_lines))`` for ``n`` indices
    of ``g`` gradient lines per row (``dim / 16`` rounded up; bf16 twice ``dim / 32``
    rounded up); 0 for no index. Both sizes are powers of two."""
    glines = Mux(d.bf16, ((d.dim + 31) >> 5) << 1, (d.dim + 15) >> 4)
    by_rows = (d.num_indices + (acc_rows - 1)) >> (acc_rows - 1).bit_length()
    by_lines = (d.num_indices * glines + (acc_lines - 1)) >> (acc_lines - 1).bit_length()
    return Mux(by_rows > by_lines, by_rows, by_lines)


class UpdatePasses(wiring.Component):
    """Runs an UPDATE larger than the accumulator as passes, between the dispatcher
    (``i_exec``) and the bag sequencers (``o_exec``), and merges the passes' statuses
    and scatter reports into the one each the completion expects.

    **Which UPDATEs.** An UPDATE whose :func:`passes_needed` ``P`` is above 1 (the
    dispatcher has rejected those above ``max_passes``); every other descriptor, and
    every status and report, passes through unchanged (``pass_level`` 0: every row in
    the pass). Such an UPDATE is taken only when no descriptor is outstanding
    (``quiet``), so that until it completes every status and report is one of its
    passes'.

    **Passes.** Pass ``(L, v)`` holds the rows whose pass hash (:func:`pass_hash`) has
    ``v`` in its low ``L`` bits; it is the descriptor sent again on ``o_exec`` while
    ``pass_level`` = L and ``pass_value`` = v tell the scatter to skip the other rows'
    items. The first pass is ``(0, 0)``, every row: the index count overstates the
    distinct rows when rows repeat, and they may fit. If it overflows (its report has
    ``overflow``; it wrote nothing), its report tells after how many of its ``u``
    counted indices (``overflow_at`` = ``k``) the rows stopped fitting, and the passes
    ``(L0, 0) .. (L0, 2**L0 - 1)`` follow, ``L0`` the smallest level from 1 with
    ``k * 2**L0 >= u``. Passes run in depth-first order: a later pass whose rows
    overflowed is replaced by its two halves ``(L + 1, v)`` and ``(L + 1, v + 2**L)``,
    the first run next. The hash is a bijection, so a pass of level 32 holds at most
    one row and never overflows: every UPDATE ends. A pass is sent once the one before
    has been reported.

    **Merging.** The first pass's status goes to the completion as it comes: a failed
    check (not OK) completes the UPDATE, with no further pass. The later passes'
    statuses are kept back, and so are all the reports; once the last pass has been
    reported, one report goes out with ``rows_written`` and ``updates`` summed over the
    passes that wrote. A later pass whose status is not OK (the buffers changed, or a
    read failed), or a report with ``read_error``, ends the UPDATE at once with a report
    marked ``read_error``, whose ``rows_written`` counts the rows the earlier passes
    wrote.

    Parameters
    ----------
    acc_rows, acc_lines : int
        The scatter's accumulator (powers of two).
    max_passes : int
        Largest ``P`` the dispatcher lets through, a power of two from 1 to 65536.

    Members
    -------
    i_exec : ``In(stream.Signature(Descriptor))``; o_exec : ``Out(...)``
    quiet : ``In(1)``
        No descriptor is outstanding (dispatched and not completed).
    i_status : ``In(stream.Signature(STATUS))``; o_status : ``Out(...)``
    i_done : ``In(stream.Signature(DONE))``; o_done : ``Out(...)``
    pass_level : ``Out(LEVEL_BITS)``; pass_value : ``Out(32)``
        The pass running (0 and 0 outside a multi-pass UPDATE).
    defer : ``Out(1)``
        A multi-pass UPDATE runs: the scatter reads a pass's rows only once it has not
        overflowed (``CoalescedUpdate``, "Deferred reads"), so no row is read twice.
    ev_pass : ``Out(1)``
        An UPDATE, or a pass of one, goes out on ``o_exec``.
    """

    def __init__(self, *, acc_rows: int, acc_lines: int, max_passes: int):
        self._acc_rows = check_pow2("acc_rows", acc_rows, 1, 1 << 16)
        self._acc_lines = check_pow2("acc_lines", acc_lines, 1, 1 << 20)
        self._max_passes = check_pow2("max_passes", max_passes, 1, 1 << 16)
        super().__init__({
            "i_exec": In(stream.Signature(Descriptor)),
            "o_exec": Out(stream.Signature(Descriptor)),
            "quiet": In(1),
            "i_status": In(stream.Signature(STATUS)),
            "o_status": Out(stream.Signature(STATUS)),
            "i_done": In(stream.Signature(DONE)),
            "o_done": Out(stream.Signature(DONE)),
            "pass_level": Out(LEVEL_BITS),
            "pass_value": Out(32),
            "defer": Out(1),
            "ev_pass": Out(1),
        })

    max_passes = property(lambda self: self._max_passes)

    def elaborate(self, platform):
        m = Module()
        ix, ox = self.i_exec, self.o_exec
        level, value = self.pass_level, self.pass_value
        d = ix.p
        need = Signal(33)
        m.d.comb += need.eq(passes_needed(d, self._acc_rows, self._acc_lines))
        multi = (d.kind == DescKind.UPDATE.value) & (need > 1)
        held = Signal(Descriptor)
        level0 = Signal(LEVEL_BITS)
        first = Signal()                        # the first pass's status is still to come
        total = Signal(DONE)                    # sums over the passes reported
        m.d.comb += [ox.p.eq(held), self.ev_pass.eq(
            ox.valid & ox.ready & (ox.p.kind == DescKind.UPDATE.value))]
        top = Signal(32)                        # bit L - 1 of the value
        m.d.comb += top.eq((C(1, 33) << level)[1:33])

        with m.FSM(init="IDLE") as fsm:
            with m.State("IDLE"):
                # Everything passes through; a multi-pass UPDATE is taken once quiet.
                wiring.connect(m, wiring.flipped(self.i_status), wiring.flipped(self.o_status))
                wiring.connect(m, wiring.flipped(self.i_done), wiring.flipped(self.o_done))
                m.d.comb += [ox.valid.eq(ix.valid & ~multi), ox.p.eq(d),
                             ix.ready.eq(Mux(multi, self.quiet, ox.ready))]
                with m.If(ix.valid & multi & self.quiet):
                    m.d.sync += [held.eq(d), level.eq(0), level0.eq(0),
                                 value.eq(0), first.eq(1), total.eq(0)]
                    m.next = "ISSUE"
            with m.State("ISSUE"):
                m.d.comb += ox.valid.eq(1)
                with m.If(ox.ready):
                    m.next = "STATUS"
            with m.State("STATUS"):
                st = self.i_status
                ok = st.p.status == Status.OK.value
                with m.If(first):
                    wiring.connect(m, wiring.flipped(st), wiring.flipped(self.o_status))
                    with m.If(st.valid & self.o_status.ready):
                        m.d.sync += first.eq(0)
                        with m.If(ok):
                            m.next = "DONE"
                        with m.Else():
                            m.d.sync += [level.eq(0), value.eq(0)]
                            m.next = "IDLE"
                with m.Else():
                    m.d.comb += st.ready.eq(1)
                    with m.If(st.valid):
                        m.next = "DONE"
                        with m.If(~ok):
                            m.d.sync += total.read_error.eq(1)
                            m.next = "REPORT"
            with m.State("DONE"):
                dn = self.i_done
                k, u = dn.p.overflow_at, dn.p.updates
                # k * 2**s < u, for u >= 1: k <= (u - 1) >> s.
                first_level = 1 + sum((k <= ((u - 1)[:32] >> s)).as_unsigned()
                                      for s in range(1, 32))
                m.d.comb += dn.ready.eq(1)
                with m.If(dn.valid):
                    with m.If(dn.p.read_error):
                        m.d.sync += total.read_error.eq(1)
                        m.next = "REPORT"
                    with m.Elif(dn.p.overflow & (level == 0)):
                        # The first pass: the levels from 1 until k * 2**L >= u.
                        m.d.sync += [level.eq(first_level), level0.eq(first_level)]
                        m.next = "ISSUE"
                    with m.Elif(dn.p.overflow):
                        m.d.sync += level.eq(level + 1)     # its first half next
                        m.next = "ISSUE"
                    with m.Else():
                        m.d.sync += [total.rows_written.eq(total.rows_written
                                                           + dn.p.rows_written),
                                     total.updates.eq(total.updates + dn.p.updates)]
                        m.next = "NEXT"
            with m.State("NEXT"):
                # Depth first: climb while the pass was a second half, then take the
                # second half of the level reached, or the next value of level L0.
                with m.If((level != level0) & (value & top).any()):
                    m.d.sync += [value.eq(value & ~top), level.eq(level - 1)]
                with m.Elif(level != level0):
                    m.d.sync += value.eq(value | top)
                    m.next = "ISSUE"
                with m.Elif(value == (C(1, 33) << level0) - 1):
                    m.next = "REPORT"
                with m.Else():
                    m.d.sync += value.eq(value + 1)
                    m.next = "ISSUE"
            with m.State("REPORT"):
                m.d.comb += [self.o_done.valid.eq(1), self.o_done.p.eq(total)]
                with m.If(self.o_done.ready):
                    m.d.sync += [level.eq(0), value.eq(0)]
                    m.next = "IDLE"
        m.d.comb += self.defer.eq(~fsm.ongoing("IDLE"))
        return m
