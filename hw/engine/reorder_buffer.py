"""The reorder buffer of LOOKUP's row gather: read beats in, in any order; lines out at
the head in allocation order.

See :class:`ReorderBuffer`.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..widths import is_pow2, select_bit
from .gather_layouts import alloc_layout, beat_layout
from .pool_reduce import LINE_BITS

__all__ = ["ReorderBuffer"]


class ReorderBuffer(wiring.Component):
    """A ring of ``lines`` 512-bit lines that read bursts fill in any order and that
    drains in the order its lines were allocated.

    An ``i_alloc`` item gives a burst's first line and its ID (the allocator keeps the
    ring's tail, and at most one burst outstanding per ID); an item with ``empty`` marks
    its line present at once (an empty bag's). A table of ``ids`` entries (a memory,
    transparent read) holds each outstanding burst's next line: every ``i_beat`` is
    written to its ID's next line and marks that line present; a beat with ``last``
    frees the ID on ``o_burst_done``. Beats of different IDs may interleave. ``resp``
    other than OKAY sets the sticky ``resp_error`` (the data is still written).

    **Head.** ``head_present`` says whether the line at ``head`` has arrived. ``read``
    loads ``data`` with the line at ``head`` at the clock edge (a synchronous read
    port); ``pop`` (only with ``head_present``) moves ``head`` on and clears the line's
    presence, so the line read in the same cycle is the one that left.

    **Latency, throughput.** One beat per cycle; a beat taken in cycle ``t`` is
    written in cycle ``t + 1``, is present (``head_present``) from cycle ``t + 2``, and
    its ID is on ``o_burst_done`` in cycle ``t + 1``. No stream here has backpressure:
    ``i_alloc`` and ``i_beat`` are always ready and ``o_burst_done`` does not wait for
    ``ready``. Reset clears every presence bit and sets ``head`` to 0.

    Parameters
    ----------
    lines : int
        Lines of the ring, a power of two from 16 to 4096.
    ids : int
        Burst IDs, a power of two from 2 to ``lines``.

    Members
    -------
    i_alloc : ``In(stream.Signature(alloc_layout(log2(lines), log2(ids))))``
    i_beat : ``In(stream.Signature(beat_layout(log2(ids))))``
        ``ready`` of both is always high.
    o_burst_done : ``Out(stream.Signature(log2(ids)))``
        Its ``ready`` is not looked at.
    head : ``Out(log2(lines) + 1)``
        Next line to leave (ring pointer with a wrap bit).
    head_present : ``Out(1)``
    read, pop : ``In(1)``
    data : ``Out(512)``
    resp_error : ``Out(1)``

    Raises
    ------
    ValueError
        If a parameter is not an integer in its range.
    """

    def __init__(self, *, lines: int, ids: int):
        if not is_pow2(lines) or not 16 <= lines <= 4096:
            raise ValueError(f"lines must be a power of two from 16 to 4096, not {lines!r}")
        if not is_pow2(ids) or not 2 <= ids <= lines:
            raise ValueError(f"ids must be a power of two from 2 to lines ({lines}), "
                             f"not {ids!r}")
        self._lines = lines
        self._ids = ids
        slot_bits = lines.bit_length() - 1
        id_bits = ids.bit_length() - 1
        super().__init__({
            "i_alloc": In(stream.Signature(alloc_layout(slot_bits, id_bits))),
            "i_beat": In(stream.Signature(beat_layout(id_bits))),
            "o_burst_done": Out(stream.Signature(id_bits)),
            "head": Out(slot_bits + 1),
            "head_present": Out(1),
            "read": In(1),
            "pop": In(1),
            "data": Out(LINE_BITS),
            "resp_error": Out(1),
        })

    lines = property(lambda self: self._lines)
    ids = property(lambda self: self._ids)

    def elaborate(self, platform):
        m = Module()
        slot_bits = self._lines.bit_length() - 1
        head_slot = self.head[:slot_bits]

        m.submodules.rob = rob = Memory(shape=LINE_BITS, depth=self._lines, init=[])
        rob_wr = rob.write_port()
        rob_rd = rob.read_port()
        # Next line of each outstanding burst: written when the burst is allocated and
        # after each beat; read (transparent for the beat update) as a beat arrives.
        m.submodules.slots = slots = Memory(shape=slot_bits, depth=self._ids, init=[])
        slot_issue = slots.write_port()
        slot_beat = slots.write_port()
        slot_rd = slots.read_port(transparent_for=(slot_beat,))
        present = Signal(self._lines)   # per line: data arrived, not yet left

        alloc = self.i_alloc
        m.d.comb += [
            alloc.ready.eq(1),
            self.i_beat.ready.eq(1),
            slot_issue.addr.eq(alloc.p.id),
            slot_issue.data.eq(alloc.p.line),
            slot_issue.en.eq(alloc.valid & ~alloc.p.empty),
        ]
        with m.If(alloc.valid & alloc.p.empty):
            m.d.sync += present.bit_select(alloc.p.line, 1).eq(1)

        # A beat is registered, then written where its burst's table entry says.
        beat = self.i_beat
        written = Signal()
        written_last = Signal()
        written_id = Signal(len(beat.p.id))
        written_data = Signal(LINE_BITS)
        m.d.comb += slot_rd.addr.eq(beat.p.id)
        m.d.sync += written.eq(beat.valid)
        with m.If(beat.valid):
            m.d.sync += [
                written_last.eq(beat.p.last),
                written_id.eq(beat.p.id),
                written_data.eq(beat.p.data),
            ]
            with m.If(beat.p.resp.any()):
                m.d.sync += self.resp_error.eq(1)
        slot = slot_rd.data
        m.d.comb += [
            rob_wr.addr.eq(slot),
            rob_wr.data.eq(written_data),
            rob_wr.en.eq(written),
            slot_beat.addr.eq(written_id),
            slot_beat.data.eq(slot + 1),
            slot_beat.en.eq(written),
            self.o_burst_done.valid.eq(written & written_last),
            self.o_burst_done.payload.eq(written_id),
        ]
        with m.If(written):
            m.d.sync += present.bit_select(slot, 1).eq(1)

        m.d.comb += [
            self.head_present.eq(select_bit(m, present, head_slot, "arrived_at_head")),
            rob_rd.addr.eq(head_slot),
            rob_rd.en.eq(self.read),
            self.data.eq(rob_rd.data),
        ]
        with m.If(self.pop):
            m.d.sync += [
                self.head.eq(self.head + 1),
                present.bit_select(head_slot, 1).eq(0),
            ]
        return m
