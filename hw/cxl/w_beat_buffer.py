"""The W beats of the DCOH gate: buffered while their AW waits for its grants, passed on
only for AWs already downstream.

See :class:`WBeatBuffer`; it is built into :class:`hw.cxl.dcoh_gate.DcohGate`
(``docs/dcoh.md``, "Gate adapter").
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..widths import is_int as _is_int
from ..widths import is_pow2 as _is_pow2
from ..widths import named
from ..widths import select_bit as _bit

__all__ = ["WBeatBuffer", "w_beat_layout"]


def w_beat_layout(data_width: int) -> data.StructLayout:
    """An AXI W beat: ``data``, ``strb`` (a bit per byte), ``last``."""
    return data.StructLayout({"data": data_width, "strb": data_width // 8, "last": 1})


class WBeatBuffer(wiring.Component):
    """Holds W beats in a FIFO and lets them go downstream only while an AW issued
    downstream is still owed its data (the subordinate may wait for AW before W).

    Each ``i_aw_issued`` pulse (an AW went downstream) opens one burst of beats, each
    beat with ``last`` closes one. Bursts leave in AW order, and AWs are issued in the
    order of the gate's ring of ``entries``, so the burst passing belongs to the next
    entry of the ring after the last closed one (entry 0 after reset); a burst whose
    entry is in ``i_denied`` goes down with every strobe low (no byte changes).

    **Latency, throughput, backpressure.** A FIFO of ``depth`` beats
    (:class:`~amaranth.lib.fifo.SyncFIFOBuffered`): a beat taken in cycle 0 can leave
    in cycle 2 if its AW is downstream; one beat per cycle in and out. ``i_w.ready`` is
    low only while the FIFO is full. ``o_w.valid`` does not wait for ``o_w.ready``.
    **Reset** (synchronous) drops the beats and the owed bursts.

    Parameters
    ----------
    data_width : int
        Bits of a beat's data, a power of two from 8 to 1024.
    depth : int
        Beats the FIFO holds, 1 to 4096.
    entries : int
        Entries of the gate's write ring, a power of two from 2 to 64.

    Members
    -------
    i_w : ``In(stream.Signature(w_beat_layout(data_width)))``
        From the manager.
    o_w : ``Out(stream.Signature(w_beat_layout(data_width)))``
        To the subordinate.
    i_aw_issued : ``In(1)``
        An AW went downstream.
    i_denied : ``In(entries)``
        Write entries with a line the host denied.
    o_busy : ``Out(1)``
        Beats owed to an issued AW, or a beat ready to leave (not yet in the cycle
        after a beat entered an empty FIFO).

    Raises
    ------
    ValueError
        If a parameter is out of its range or of the wrong type.
    """

    def __init__(self, *, data_width: int, depth: int, entries: int):
        if not _is_pow2(data_width) or not 8 <= data_width <= 1024:
            raise ValueError(f"data_width must be a power of two from 8 to 1024, not "
                             f"{data_width!r}")
        if not _is_int(depth) or not 1 <= depth <= 4096:
            raise ValueError(f"depth must be an integer from 1 to 4096, not {depth!r}")
        if not _is_pow2(entries) or not 2 <= entries <= 64:
            raise ValueError(f"entries must be a power of two from 2 to 64, not {entries!r}")
        self._data_width = data_width
        self._depth = depth
        self._entries = entries
        layout = w_beat_layout(data_width)
        super().__init__({
            "i_w": In(stream.Signature(layout)),
            "o_w": Out(stream.Signature(layout)),
            "i_aw_issued": In(1),
            "i_denied": In(entries),
            "o_busy": Out(1),
        })

    @property
    def data_width(self) -> int:
        return self._data_width

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def entries(self) -> int:
        return self._entries

    def elaborate(self, platform):
        m = Module()
        i_w, o_w = self.i_w, self.o_w
        owed = Signal(range(self._entries + 1))     # issued AWs whose last beat is owed
        entry = Signal(range(self._entries))        # the entry of the burst passing
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=len(i_w.payload.as_value()),
                                                    depth=self._depth)
        beat = data.View(i_w.payload.shape(), fifo.r_data)
        denied = _bit(m, self.i_denied, entry, "denied_sel")
        open_ = named(m, owed.any(), "open")
        last_passed = named(m, o_w.valid & o_w.ready & o_w.p.last, "last_passed")
        m.d.comb += [
            fifo.w_en.eq(i_w.valid),
            fifo.w_data.eq(i_w.payload),
            i_w.ready.eq(fifo.w_rdy),
            o_w.valid.eq(fifo.r_rdy & open_),
            fifo.r_en.eq(o_w.ready & open_),
            # One assignment of the whole payload: a field overridden on its own would
            # come out as an ``always @*`` Icarus leaves X until an input changes.
            o_w.payload.eq(Cat(beat.data, Mux(denied, 0, beat.strb), beat.last)),
            self.o_busy.eq(open_ | fifo.r_rdy),
        ]
        m.d.sync += owed.eq(owed + self.i_aw_issued - last_passed)
        with m.If(last_passed):
            m.d.sync += entry.eq(entry + 1)
        return m
