"""The undo-capture tap of LOOKUP's row gather: captured lines queued for the undo log.

See :class:`UndoTap`.
"""

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..widths import is_int
from .gather_layouts import UNDO

__all__ = ["UndoTap"]


class UndoTap(wiring.Component):
    """Queues captured lines for the undo log in a FIFO of ``depth`` items, and tells the
    sender whether one more will fit, so that none is ever dropped.

    The sender holds a captured line in its output register (``pending``) until it
    leaves and then offers it on ``i_line``, which is written the same cycle: the
    sender does not wait for ``ready``. ``room`` says that the FIFO will still have room
    for one item after the pending one (if any) has entered: a sender that loads a
    captured line only with ``room`` never overfills it.

    **Latency, throughput, backpressure.** An item written in cycle ``t`` is valid on
    ``o_undo`` from cycle ``t + 1`` (``SyncFIFOBuffered``); one item per cycle each
    way. ``room`` depends combinationally on ``pending``. Reset empties the FIFO.

    Parameters
    ----------
    depth : int
        FIFO items, 3 to 64 (with 2, a ``SyncFIFOBuffered`` refuses a write in the
        cycle after its first, although its ``level`` is 1, so ``room`` would lie).

    Members
    -------
    i_line : ``In(stream.Signature(UNDO))``
        ``ready`` is the FIFO's room; a sender that keeps to ``room`` finds it high.
    pending : ``In(1)``
    room : ``Out(1)``
    o_undo : ``Out(stream.Signature(UNDO))``

    Raises
    ------
    ValueError
        If ``depth`` is not an integer from 3 to 64.
    """

    def __init__(self, *, depth: int):
        if not is_int(depth) or not 3 <= depth <= 64:
            raise ValueError(f"depth must be an integer from 3 to 64, not {depth!r}")
        self._depth = depth
        super().__init__({
            "i_line": In(stream.Signature(UNDO)),
            "pending": In(1),
            "room": Out(1),
            "o_undo": Out(stream.Signature(UNDO)),
        })

    depth = property(lambda self: self._depth)

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=UNDO.size, depth=self._depth)
        wiring.connect(m, fifo.r_stream, wiring.flipped(self.o_undo))
        m.d.comb += [
            fifo.w_data.eq(self.i_line.payload),
            fifo.w_en.eq(self.i_line.valid),
            self.i_line.ready.eq(fifo.w_rdy),
            self.room.eq(fifo.level + self.pending < self._depth),
        ]
        return m
