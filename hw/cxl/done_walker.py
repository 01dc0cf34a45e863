"""The dones of the DCOH gate: the handles of each completed burst's lines, one a cycle.

See :class:`DoneWalker`; it is built into :class:`hw.cxl.dcoh_gate.DcohGate`
(``docs/dcoh.md``, "Gate adapter").
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..widths import is_int as _is_int
from ..widths import is_pow2 as _is_pow2
from ..widths import named, onehot
from .round_robin import first_from

__all__ = ["DoneWalker"]


class DoneWalker(wiring.Component):
    """Stores the DCOH handles of each entry's lines and, once the entry's burst has
    completed, sends them on ``o_done`` and frees the entry.

    **Store.** ``i_store`` writes ``i_store_handle`` to slot ``i_store_addr`` (the
    slot within the entry in the low ``max(1, log2(lines))`` bits, the entry above);
    the entry's handles are its slots 0 .. *c* - 1, *c* being its ``i_counts`` entry.

    **Walk.** Among the ``i_queued`` entries (their burst has completed; all their
    handles are stored) the walker picks, when it is idle and ``o_done`` is free, the
    first at or after the one after its last pick (round robin), sends its handles in
    slot order, one a cycle, and frees it (``o_freed``) with its last handle's load,
    or at the pick if it has at most one handle. ``o_picked`` is the entry picked
    this cycle.

    **Latency, throughput, backpressure, reset.** An entry queued in cycle 0 is picked
    in cycle 0 at the earliest and its first handle is valid in cycle 1; one handle
    per cycle while ``o_done.ready`` is high. ``o_done`` is a register obeying the
    stream rules. Reset (synchronous) drops the walk.

    Parameters
    ----------
    entries : int
        Entries walked, a power of two from 2 to 128.
    lines : int
        Handles per entry at most, a power of two from 1 to 256.
    handle_bits : int
        Width of a handle, 1 to 8.

    Members
    -------
    o_done : ``Out(stream.Signature(unsigned(handle_bits)))``
        The handles.
    i_store : ``In(1)``; i_store_addr : ``In(range(entries * slots))``
        Store ``i_store_handle`` (``In(handle_bits)``).
    i_queued : ``In(entries)``
        Entries ready to be walked.
    i_counts : ``In(data.ArrayLayout(lines.bit_length(), entries))``
        The handles of each entry.
    o_picked, o_freed : ``Out(entries)``
        The entry picked this cycle; the entry freed this cycle.
    o_busy : ``Out(1)``
        An entry is being walked.

    Raises
    ------
    ValueError
        If a parameter is out of its range or of the wrong type.
    """

    def __init__(self, *, entries: int, lines: int, handle_bits: int):
        if not _is_pow2(entries) or not 2 <= entries <= 128:
            raise ValueError(f"entries must be a power of two from 2 to 128, not {entries!r}")
        if not _is_pow2(lines) or not lines <= 256:
            raise ValueError(f"lines must be a power of two from 1 to 256, not {lines!r}")
        if not _is_int(handle_bits) or not 1 <= handle_bits <= 8:
            raise ValueError(f"handle_bits must be an integer from 1 to 8, not "
                             f"{handle_bits!r}")
        self._entries = entries
        self._lines = lines
        self._handle_bits = handle_bits
        # Bits of a slot number (at least one, so that no signal is zero bits wide).
        self._slot_bits = max(1, lines.bit_length() - 1)
        super().__init__({
            "o_done": Out(stream.Signature(unsigned(handle_bits))),
            "i_store": In(1),
            "i_store_addr": In(range(entries << self._slot_bits)),
            "i_store_handle": In(handle_bits),
            "i_queued": In(entries),
            "i_counts": In(data.ArrayLayout(lines.bit_length(), entries)),
            "o_picked": Out(entries),
            "o_freed": Out(entries),
            "o_busy": Out(1),
        })

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def lines(self) -> int:
        return self._lines

    @property
    def handle_bits(self) -> int:
        return self._handle_bits

    def elaborate(self, platform):
        m = Module()
        n, sb, cw = self._entries, self._slot_bits, self._lines.bit_length()
        done = self.o_done
        m.submodules.handles = handles = Memory(shape=self._handle_bits, depth=n << sb,
                                                init=[])
        store = handles.write_port()
        # The walker reads an entry's handles only after all of them were written.
        read = handles.read_port(transparent_for=())
        m.d.comb += [store.en.eq(self.i_store), store.addr.eq(self.i_store_addr),
                     store.data.eq(self.i_store_handle)]

        walking = self.o_busy
        entry = Signal(range(n))        # the entry being walked
        slot = Signal(cw)               # its next slot
        count = Signal(cw)              # its handles
        next_pick = Signal(range(n))    # the entry after the last one picked
        pick_any, pick_idx = first_from(m, self.i_queued, next_pick, "pick")
        pick_count = named(m, self.i_counts[pick_idx], "pick_count")
        load = named(m, ~done.valid | done.ready, "load")
        pick = named(m, load & ~walking & pick_any, "picking")
        last = named(m, (slot + 1)[:cw] == count, "last")
        pick_oh = onehot(m, pick_idx, n, "pick_oh")
        m.d.comb += [
            read.en.eq(load),
            # The payload is the read port's data, which holds while ``en`` is low.
            done.payload.eq(read.data),
            read.addr.eq(Mux(walking, Cat(slot[:sb], entry), Cat(C(0, sb), pick_idx))),
            self.o_picked.eq(Mux(pick, pick_oh, 0)),
            self.o_freed.eq(Mux(load & walking & last, onehot(m, entry, n, "walk_oh"), 0) |
                            Mux(pick & (pick_count < 2), pick_oh, 0)),
        ]
        with m.If(load):
            m.d.sync += done.valid.eq(walking | (pick & pick_count.any()))
            with m.If(walking):
                m.d.sync += slot.eq(slot + 1)
                with m.If(last):
                    m.d.sync += walking.eq(0)
        with m.If(pick):
            m.d.sync += [next_pick.eq(pick_idx + 1), entry.eq(pick_idx), slot.eq(1),
                         count.eq(pick_count), walking.eq(pick_count >= 2)]
        return m
