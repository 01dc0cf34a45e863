"""The bag sequencer's replay store: the lines of a descriptor's offsets and indices
that pass 1 read, served again to pass 2's readers so that the buffers are read from
memory once.

See :class:`LineReplay`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from ..cxl.messages import LINE_BITS
from ..widths import check_int, check_pow2
from .buffer_reader import LINE_SHIFT, read_channel

__all__ = ["REPLAY_PORTS", "LineReplay"]

#: Pass-2 readers served: the offsets, the indices (emitter copy), the indices (count
#: scan copy).
REPLAY_PORTS = 3


class LineReplay(wiring.Component):
    """Holds up to ``lines`` 64-byte lines of one descriptor's offsets and indices
    buffers, captured as pass 1 reads them, and answers pass 2's burst requests for
    them from on-chip memory instead of PMEM or GPU memory.

    **Capture.** ``i_begin`` (a pulse, with ``off_base`` / ``idx_base``, the buffers'
    first line numbers, and ``off_lines``, the lines pass 1 reads of the offsets) starts
    a descriptor. Then the ``k``-th line taken on ``i_off`` is stored in slot ``k`` and
    the ``k``-th on ``i_idx`` in slot ``off_lines + k`` (the buffers' lines in order, as
    a reader receives them; at most one of the two per cycle, both come from one R
    channel; a line past ``lines`` slots is dropped). The user captures only a
    descriptor whose two buffers fit and replays it only if pass 1 read every line
    without an error. ``off_base``, ``idx_base`` and ``off_lines`` are not latched:
    the user holds them from ``i_begin`` until the descriptor's last replay.

    **Replay.** Port ``p`` (0: offsets, 1 and 2: indices) is a subordinate
    :func:`~.buffer_reader.read_channel`: a requesting port is granted in round-robin
    order while no burst is being served, and its ``len + 1`` lines follow on its
    ``r``, one per cycle from the second cycle after the grant (the slot is registered
    at the grant, then read from block RAM; ``r`` is always ready by the channel's
    contract). Line ``l`` of port 0 is slot ``l - off_base``, of ports 1 and 2
    slot ``off_lines + l - idx_base``. A port's bursts are answered in request order.

    **Cost.** One memory of ``lines`` x 512 bits with one write and one read port (block
    RAM), a few counters. Resets idle; the stored lines are not cleared (each
    descriptor overwrites what it replays).

    Parameters
    ----------
    addr_width : int
        Byte-address bits of the buffers, 12 to 64.
    lines : int
        Capacity in lines, a power of two from 2 to 4096.

    Members
    -------
    i_begin : ``In(1)``
    off_base, idx_base : ``In(addr_width - 6)``
    off_lines : ``In(log2(lines) + 1)``
    i_off, i_idx : ``In(1)`` valid with ``i_off_data`` / ``i_idx_data`` : ``In(512)``
    i_port0, i_port1, i_port2 : ``In(read_channel(addr_width))``

    Raises
    ------
    ValueError
        If a parameter is not an integer in its range.
    """

    def __init__(self, *, addr_width: int, lines: int):
        self._addr_width = check_int("addr_width", addr_width, 12, 64)
        self._lines = check_pow2("lines", lines, 2, 4096)
        slot_bits = lines.bit_length()             # 0 .. lines
        line_bits = addr_width - LINE_SHIFT
        super().__init__({
            "i_begin": In(1),
            "off_base": In(line_bits),
            "idx_base": In(line_bits),
            "off_lines": In(slot_bits),
            "i_off": In(1),
            "i_off_data": In(LINE_BITS),
            "i_idx": In(1),
            "i_idx_data": In(LINE_BITS),
            **{f"i_port{p}": In(read_channel(addr_width)) for p in range(REPLAY_PORTS)},
        })

    def elaborate(self, platform):
        m = Module()
        n = self._lines
        slot_bits = n.bit_length()
        m.submodules.mem = mem = Memory(shape=LINE_BITS, depth=n, init=[])
        wr = mem.write_port()
        rd = mem.read_port()

        # --- capture: the buffers' lines in order
        off_k = Signal(slot_bits)
        idx_k = Signal(slot_bits)
        slot_w = Signal(slot_bits + 1)
        m.d.comb += slot_w.eq(Mux(self.i_off, off_k, self.off_lines + idx_k))
        m.d.comb += [
            wr.addr.eq(slot_w),
            wr.data.eq(Mux(self.i_off, self.i_off_data, self.i_idx_data)),
            wr.en.eq((self.i_off | self.i_idx) & (slot_w < n)),
        ]
        with m.If(self.i_begin):
            m.d.sync += [off_k.eq(0), idx_k.eq(0)]
        with m.Elif(self.i_off):
            m.d.sync += off_k.eq(off_k + (off_k != n))
        with m.Elif(self.i_idx):
            m.d.sync += idx_k.eq(idx_k + (idx_k != n))

        # --- replay: one burst at a time, a line per cycle
        ports = [getattr(self, f"i_port{p}") for p in range(REPLAY_PORTS)]
        busy = Signal()
        port = Signal(range(REPLAY_PORTS))          # the port being served
        slot = Signal(slot_bits)                    # its next line's slot
        left = Signal(8)                            # lines after this one
        last = Signal(range(REPLAY_PORTS), init=REPLAY_PORTS - 1)   # last granted
        out_valid = Signal()
        out_port = Signal(range(REPLAY_PORTS))
        m.d.comb += [rd.addr.eq(slot), rd.en.eq(1)]
        m.d.sync += [out_valid.eq(busy), out_port.eq(port)]
        with m.If(busy):
            m.d.sync += [slot.eq(slot + 1), left.eq(left - 1)]
            with m.If(left == 0):
                m.d.sync += busy.eq(0)
        with m.Else(), m.Switch(last):
            for r in range(REPLAY_PORTS):
                with m.Case(r):
                    for i in range(REPLAY_PORTS):
                        k = (r + 1 + i) % REPLAY_PORTS
                        p = ports[k]
                        first = (p.line - self.off_base if k == 0
                                 else self.off_lines + p.line - self.idx_base)
                        with (m.If if i == 0 else m.Elif)(p.req):
                            m.d.comb += p.grant.eq(1)
                            m.d.sync += [busy.eq(1), port.eq(k), last.eq(k),
                                         slot.eq(first[:slot_bits]), left.eq(p.len)]
        for k, p in enumerate(ports):
            m.d.comb += [p.r.valid.eq(out_valid & (out_port == k)), p.r.payload.eq(rd.data)]
        return m
