"""One of the bag sequencer's PMEM buffer readers: a buffer of 32-bit words read in
bursts and delivered in order, a word or a whole line per cycle.

See :class:`BufferReader`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..cxl.messages import LINE_BITS
from ..widths import is_int

__all__ = ["BUF_LINES", "BURST", "FLY_LINES", "LINE", "LINE_SHIFT", "LINE_WORDS",
           "BufferReader", "read_channel"]

#: A 512-bit PMEM beat is one 64-byte line of 16 int32 / fp32 words.
LINE_SHIFT = 6
LINE_WORDS = 16
#: Longest read burst, in lines.
BURST = 8
#: Lines of read data a reader holds (bounds its reads in flight in word mode).
BUF_LINES = 32
#: Lines a reader may have in flight in line mode, whose consumer takes a line per
#: cycle (enough for line rate up to a PMEM latency of about 240 cycles).
FLY_LINES = 256
#: Lines requested and not yet delivered: up to ``FLY_LINES`` plus a burst.
_CREDIT_BITS = 10
#: One line as ``o_line`` delivers it.
LINE = data.StructLayout({"data": LINE_BITS, "mask": LINE_WORDS, "last": 1})


def read_channel(addr_width: int) -> wiring.Signature:
    """A reader's side of the PMEM read port, as the reader sees it: a burst request
    (``req`` with its first ``line`` and ``len`` = beats - 1, taken when ``grant``
    pulses; ``req`` may drop without a grant when the reader is flushed) and the beats
    of its bursts, in order, on ``r`` (always ready: a reader requests only what it has
    room for)."""
    return wiring.Signature({
        "req": Out(1),
        "line": Out(addr_width - LINE_SHIFT),
        "len": Out(8),
        "grant": In(1),
        "r": In(stream.Signature(LINE_BITS)),
    })


class BufferReader(wiring.Component):
    """Reads ``i_count`` consecutive 32-bit words from a line-aligned PMEM buffer
    starting at line ``i_base`` and delivers them in order: one word per cycle on
    ``o_word``, or, with ``i_line_mode`` high, one whole line per cycle on ``o_line``
    (the 16 words, a ``mask`` of the words that belong to the buffer, contiguous from
    word 0, and ``last`` on its last line).

    **Requests.** Bursts of up to :data:`BURST` lines, never across 4 KiB, whenever its
    line buffer has room for the whole burst (credit counted from the grant to the
    line's delivery), so up to ``BUF_LINES / BURST`` bursts are in flight. In line mode,
    allowed only while the consumer takes every line the cycle it is offered, the credit
    is :data:`FLY_LINES` instead: the buffer then holds at most the few lines of its own
    latency. The caller gives all of a reader's bursts one AXI ID, so they return in
    order.

    **Flow, reset.** ``i_start`` (a one-cycle pulse, only while ``o_idle``) loads
    ``i_base`` and ``i_count``; ``i_flush`` stops new requests and discards the data
    buffered and still arriving; ``o_idle`` is high once nothing is requested, in
    flight or buffered. Only the output of the current mode is valid; its ``valid``
    never waits for ``ready`` and holds (with the payload) until taken unless flushed.
    Resets idle.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address bits, 12 to 48.

    Members
    -------
    pmem : ``Out(read_channel(addr_width))``
        Burst requests and their beats.
    i_start, i_flush, i_line_mode : ``In(1)``
    i_base : ``In(addr_width - 6)``
        Line address of word 0.
    i_count : ``In(33)``
        Words in the buffer.
    o_word : ``Out(stream.Signature(32))``
    o_line : ``Out(stream.Signature(LINE))``
    o_idle : ``Out(1)``

    Raises
    ------
    ValueError
        If ``addr_width`` is not an integer from 12 to 48.
    """

    def __init__(self, *, addr_width: int):
        if not is_int(addr_width) or not 12 <= addr_width <= 48:
            raise ValueError(f"addr_width must be an integer from 12 to 48, not {addr_width!r}")
        self._addr_width = addr_width
        super().__init__({
            "pmem": Out(read_channel(addr_width)),
            "i_start": In(1),
            "i_base": In(addr_width - LINE_SHIFT),
            "i_count": In(33),
            "i_flush": In(1),
            "i_line_mode": In(1),
            "o_word": Out(stream.Signature(32)),
            "o_line": Out(stream.Signature(LINE)),
            "o_idle": Out(1),
        })

    addr_width = property(lambda self: self._addr_width)

    def elaborate(self, platform):
        m = Module()
        m.submodules.buf = buf = SyncFIFOBuffered(width=LINE_BITS, depth=BUF_LINES)
        pmem, flush = self.pmem, self.i_flush

        line = Signal(self._addr_width - LINE_SHIFT)    # next line to request
        lines_left = Signal(29)                         # lines not yet requested
        words_left = Signal(33)                         # words not yet delivered
        word_index = Signal(4)                          # o_word's word of the line
        reserved = Signal(_CREDIT_BITS)                 # lines granted, not delivered

        # Burst length: min(lines left, BURST, lines to the 4 KiB boundary).
        page_left = Signal(7)
        capped = Signal(7)
        burst = Signal(7)
        m.d.comb += [
            page_left.eq(~line[:LINE_SHIFT] + 1),       # 64 - line offset in page
            capped.eq(Mux(lines_left < BURST, lines_left, BURST)),
            burst.eq(Mux(page_left < capped, page_left, capped)),
        ]
        credit = Mux(self.i_line_mode, FLY_LINES, BUF_LINES)
        m.d.comb += [
            pmem.req.eq(lines_left.any() & ~flush & (reserved + burst <= credit)),
            pmem.line.eq(line),
            pmem.len.eq(burst - 1),
            pmem.r.ready.eq(1),
            buf.w_en.eq(pmem.r.valid),
            buf.w_data.eq(pmem.r.payload),
        ]
        with m.If(pmem.grant):
            m.d.sync += [line.eq(line + burst), lines_left.eq(lines_left - burst)]

        available = buf.r_rdy & words_left.any() & ~flush
        last_line = words_left <= LINE_WORDS
        word_taken = self.o_word.valid & self.o_word.ready
        line_taken = self.o_line.valid & self.o_line.ready
        delivered = Signal()        # the buffer's head line is done with
        m.d.comb += [
            self.o_word.valid.eq(available & ~self.i_line_mode),
            self.o_line.valid.eq(available & self.i_line_mode),
            self.o_line.payload.data.eq(buf.r_data),
            self.o_line.payload.last.eq(last_line),
            delivered.eq((word_taken & (word_index.all() | (words_left == 1))) | line_taken
                         | (flush & buf.r_rdy)),
            buf.r_en.eq(delivered),
        ]
        for k in range(LINE_WORDS):
            m.d.comb += self.o_line.payload.mask[k].eq(words_left > k)
        with m.Switch(word_index):      # a case per word: word_select's shift fails lint
            for k in range(LINE_WORDS):
                with m.Case(k):
                    m.d.comb += self.o_word.payload.eq(buf.r_data[32 * k:32 * (k + 1)])
        with m.If(word_taken):
            m.d.sync += [words_left.eq(words_left - 1), word_index.eq(word_index + 1)]
        with m.If(line_taken):
            m.d.sync += words_left.eq(Mux(last_line, 0, words_left - LINE_WORDS))
        m.d.sync += reserved.eq(reserved + Mux(pmem.grant, burst, 0) - delivered)

        with m.If(flush):
            m.d.sync += [lines_left.eq(0), words_left.eq(0)]
        with m.If(self.i_start):
            m.d.sync += [
                line.eq(self.i_base),
                lines_left.eq((self.i_count + (LINE_WORDS - 1))[4:]),
                words_left.eq(self.i_count),
                word_index.eq(0),
            ]
        m.d.comb += self.o_idle.eq(~lines_left.any() & ~words_left.any() & ~reserved.any())
        return m
