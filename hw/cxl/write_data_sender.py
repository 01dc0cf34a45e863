"""Write buffer of the CXL.cache agent: holds each write's line until the host pulls
it, then sends it on D2H Data.

See :class:`WriteDataSender`; it is built into :class:`hw.cxl.cache_write_path.CacheWritePath`.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..widths import is_pow2 as _is_pow2
from .cache_layouts import ID_BITS
from .messages import LINE_BITS, D2HData

__all__ = ["WriteDataSender", "line_layout", "pull_layout"]


def line_layout(lines: int) -> data.StructLayout:
    """A line to hold in write-buffer ``entry``."""
    return data.StructLayout({"entry": (lines - 1).bit_length(), "data": LINE_BITS})


def pull_layout(lines: int) -> data.StructLayout:
    """The host pulled the line of ``entry`` into its buffer ``uqid``."""
    return data.StructLayout({"entry": (lines - 1).bit_length(), "uqid": ID_BITS})


class WriteDataSender(wiring.Component):
    """A buffer of ``lines`` write lines and the queue of the host's pulls: each pulled
    line leaves on D2H Data with the pull's UQID, in pull order.

    ``i_line`` writes a line into its entry (any number of cycles before its pull).
    ``i_pull`` queues a pull in a FIFO of ``max(lines, 3)`` entries; ``o_data`` is a
    register loaded from the FIFO's head and the buffer's read port, and ``o_sent``
    reports each ``o_data`` handshake (``o_sent_entry`` names the line on ``o_data``).

    **Latency.** A pull taken in cycle ``t`` puts its line on ``o_data`` in cycle
    ``t + 3`` when the queue is empty and ``o_data`` free. **Throughput.** One pull and
    one line per cycle. **Backpressure.** ``i_line`` and ``i_pull`` are always ready:
    the user pulls each entry at most once while its line is held, so the queue cannot
    overflow. ``o_data`` obeys the stream rules. **Reset** drops every queued pull (the
    buffer's lines are not cleared; they are written again before their next pull).

    Parameters
    ----------
    lines : int
        Lines in the buffer, a power of two from 2 to 2048.

    Members
    -------
    i_line : ``In(stream.Signature(line_layout(lines)))``
        A line and its entry; always ready.
    i_pull : ``In(stream.Signature(pull_layout(lines)))``
        A pull: the entry to send and the host's UQID; always ready.
    o_data : ``Out(stream.Signature(D2HData))``
        The pulled line with the pull's UQID; ChunkValid, Bogus and Poison zero.
    o_sent : ``Out(1)``
        Pulses in the cycle of each ``o_data`` handshake.
    o_sent_entry : ``Out(range(lines))``
        The entry whose line is on ``o_data``.
    o_busy : ``Out(1)``
        A pull waits in the queue or in ``o_data``.

    Raises
    ------
    ValueError
        If ``lines`` is not a power of two from 2 to 2048.
    """

    def __init__(self, *, lines: int):
        if not _is_pow2(lines) or not 2 <= lines <= 2048:
            raise ValueError(f"lines must be a power of two from 2 to 2048, not {lines!r}")
        self._lines = lines
        super().__init__({
            "i_line": In(stream.Signature(line_layout(lines))),
            "i_pull": In(stream.Signature(pull_layout(lines))),
            "o_data": Out(stream.Signature(D2HData)),
            "o_sent": Out(1),
            "o_sent_entry": Out(range(lines)),
            "o_busy": Out(1),
        })

    @property
    def lines(self) -> int:
        return self._lines

    def elaborate(self, platform):
        m = Module()
        layout = pull_layout(self._lines)
        m.submodules.lines = lines = Memory(shape=LINE_BITS, depth=self._lines, init=[])
        # Not transparent: a line is written long before its pull, and a stalled o_data
        # keeps its read register.
        line_wr, line_rd = lines.write_port(), lines.read_port(transparent_for=())
        m.submodules.pulls = pulls = SyncFIFOBuffered(width=layout.size,
                                                      depth=max(self._lines, 3))
        m.d.comb += [
            self.i_line.ready.eq(1),
            self.i_pull.ready.eq(1),
            line_wr.en.eq(self.i_line.valid),
            line_wr.addr.eq(self.i_line.p.entry),
            line_wr.data.eq(self.i_line.p.data),
            pulls.w_en.eq(self.i_pull.valid),
            pulls.w_data.eq(self.i_pull.payload),
        ]

        out = self.o_data
        head = layout(pulls.r_data)
        advance = ~out.valid | out.ready
        m.d.comb += [
            pulls.r_en.eq(advance),
            line_rd.addr.eq(head.entry),
            line_rd.en.eq(advance),
            out.p.data.eq(line_rd.data),
            self.o_sent.eq(out.valid & out.ready),
            self.o_busy.eq(out.valid | (pulls.level != 0)),
        ]
        with m.If(advance):
            m.d.sync += out.valid.eq(pulls.r_rdy)
            with m.If(pulls.r_rdy):
                m.d.sync += [out.p.uqid.eq(head.uqid), self.o_sent_entry.eq(head.entry)]
        return m
