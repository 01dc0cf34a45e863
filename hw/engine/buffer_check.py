"""Pass 1 of the bag sequencer: the offsets and indices buffers checked a line per cycle.

See :class:`BufferCheck`.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .buffer_reader import LINE, LINE_WORDS
from .descriptor import Descriptor

__all__ = ["BufferCheck"]


class BufferCheck(wiring.Component):
    """Checks the offsets and the indices of a descriptor as ``docs/embedding.md``
    ("Status codes") orders them, one line (16 words, by 16 parallel lanes) of each
    buffer per cycle; the words a line's ``mask`` leaves out are ignored.

    ``o_bad_offsets``: an offset was negative as int32, smaller than the one before, or
    past ``num_indices``; the first was not 0; or, with ``include_last_offset``, the
    buffer's last offset (the highest masked word of the ``last`` line) was not
    ``num_indices``. Lane 0 compares with the last offset of the line before, carried in
    a register. ``o_bad_index``: an index was negative as int32 or ``>= rows`` and not
    the padding index. The offsets' verdict takes precedence, which is the caller's.

    **Flow, latency, reset.** Both inputs are always ready: every line is taken the
    cycle it is offered, and a flag rises the cycle after its bad line. The flags are
    sticky until ``i_start``, which clears them (and the carried offset) for the next
    descriptor. Resets clear.

    Members
    -------
    i_desc : ``In(Descriptor)``
        The descriptor whose buffers are checked, held.
    i_start : ``In(1)``
    i_offsets, i_indices : ``In(stream.Signature(LINE))``
    o_bad_offsets, o_bad_index : ``Out(1)``
    """

    i_desc: In(Descriptor)
    i_start: In(1)
    i_offsets: In(stream.Signature(LINE))
    i_indices: In(stream.Signature(LINE))
    o_bad_offsets: Out(1)
    o_bad_index: Out(1)

    def elaborate(self, platform):
        m = Module()
        desc = self.i_desc
        offsets, indices = self.i_offsets, self.i_indices
        m.d.comb += [offsets.ready.eq(1), indices.ready.eq(1)]

        first_line = Signal()           # no offsets line checked yet
        carried = Signal(32)            # the last offset of the line before
        words = [offsets.p.data[32 * k:32 * (k + 1)] for k in range(LINE_WORDS)]
        bad_offset = Signal(LINE_WORDS)
        bad_index = Signal(LINE_WORDS)
        for k in range(LINE_WORDS):
            word = words[k]
            before = carried if k == 0 else words[k - 1]
            mask = offsets.p.mask
            is_last = mask[k] & (offsets.p.last if k == LINE_WORDS - 1 else ~mask[k + 1])
            bad = (word[31] | (word[:31] < before[:31]) | (desc.num_indices < word)
                   | (desc.include_last_offset & is_last & (word != desc.num_indices)))
            if k == 0:
                bad = bad | (first_line & (word != 0))
            m.d.comb += bad_offset[k].eq(mask[k] & bad)
            index = indices.p.data[32 * k:32 * (k + 1)]
            padding = desc.has_padding_idx & (index == desc.padding_idx)
            m.d.comb += bad_index[k].eq(indices.p.mask[k] & (index[31] | (index >= desc.rows))
                                        & ~padding)

        with m.If(offsets.valid):
            m.d.sync += [first_line.eq(0), carried.eq(words[-1])]
            with m.If(bad_offset.any()):
                m.d.sync += self.o_bad_offsets.eq(1)
        with m.If(indices.valid & bad_index.any()):
            m.d.sync += self.o_bad_index.eq(1)
        with m.If(self.i_start):
            m.d.sync += [first_line.eq(1), carried.eq(0),
                         self.o_bad_offsets.eq(0), self.o_bad_index.eq(0)]
        return m
