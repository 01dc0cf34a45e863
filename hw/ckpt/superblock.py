"""The recovery's superblock reader: the superblock and commit word as read, their
checks, and the layout derived from them.

See :class:`Superblock`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .formats import (
    COMMIT_MAGIC,
    COMMIT_WORD,
    LINE_BITS,
    SB_MAGIC,
    SB_VERSION,
    SUPERBLOCK,
    line_sum,
    sum64_finish,
)

__all__ = ["Superblock"]


class Superblock(wiring.Component):
    """Holds superblock line 0 and the commit word (the first 64 bits of line 1) as
    they arrive on ``i_line``, and decodes them (``docs/checkpoint.md``, "Recovery").

    **Checks.** ``present``: ``magic`` is "TCXLSB01", ``check`` is ``sum64`` of words
    0..6 and the commit word's magic is ``0xC0DE``. ``layout_ok``: ``version == 1``;
    ``log_slots`` a non-zero power of two; ``2 <= slot_lines <= max_slot_lines``;
    ``log_base``, ``mlp_slot0/1`` and ``mlp_slot_bytes`` multiples of 64;
    ``mlp_slot_bytes < 2**32``; the ring (``log_base + log_slots * slot_lines * 64``)
    and both MLP slots (``mlp_slot[i] + mlp_slot_bytes + 64``) end below
    ``2**addr_width``.

    **Derived.** ``ring_lines`` (``log_slots * slot_lines``), ``last_slot``
    (``log_slots - 1``) and ``last_addr`` (that slot's address); the other outputs are
    the fields truncated to their widths (lossless once ``layout_ok``).

    **Flow, latency.** ``i_line`` is always ready: the first line after ``clear`` is
    line 0, the next the commit word's line. The outputs are combinational from the
    two registers; ``clear`` (one cycle) zeroes both.

    Parameters
    ----------
    addr_width : int
    max_slot_lines : int

    Members
    -------
    i_line : ``In(stream.Signature(LINE_BITS, always_ready=True))``
    clear : ``In(1)``
    present, layout_ok : ``Out(1)``
    committed : ``Out(32)``; epoch : ``Out(16)``
        The commit word's fields (the epoch as read, not yet bumped).
    log_base, last_addr, mlp_slot0, mlp_slot1 : ``Out(addr_width)``
    log_slots, last_slot, mlp_slot_bytes : ``Out(32)``
    log_slots_log2 : ``Out(5)``; slot_lines : ``Out(8)``; ring_lines : ``Out(39)``
    """

    def __init__(self, *, addr_width: int, max_slot_lines: int):
        if not isinstance(max_slot_lines, int) or not 2 <= max_slot_lines <= 255:
            raise ValueError(f"max_slot_lines must be an integer from 2 to 255, not "
                             f"{max_slot_lines!r}")
        self._addr_width = addr_width
        self._max_slot_lines = max_slot_lines
        super().__init__({
            "i_line": In(stream.Signature(LINE_BITS, always_ready=True)),
            "clear": In(1),
            "present": Out(1),
            "layout_ok": Out(1),
            "committed": Out(32),
            "epoch": Out(16),
            "log_base": Out(addr_width),
            "log_slots": Out(32),
            "log_slots_log2": Out(5),
            "slot_lines": Out(8),
            "ring_lines": Out(39),
            "last_slot": Out(32),
            "last_addr": Out(addr_width),
            "mlp_slot0": Out(addr_width),
            "mlp_slot1": Out(addr_width),
            "mlp_slot_bytes": Out(32),
        })

    max_slot_lines = property(lambda self: self._max_slot_lines)

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        sb = Signal(SUPERBLOCK)
        cw = Signal(COMMIT_WORD)
        second = Signal()                   # the next line is the commit word's
        with m.If(self.i_line.valid):
            m.d.sync += second.eq(1)
            with m.If(~second):
                m.d.sync += sb.eq(self.i_line.payload)
            with m.Else():
                m.d.sync += cw.eq(self.i_line.payload[:64])
        with m.If(self.clear):
            m.d.sync += [sb.eq(0), cw.eq(0), second.eq(0)]

        log_slots = sb.log_slots
        sl8 = sb.slot_lines[:8]
        # log2(log_slots) for a power of two: bit j is set when a set bit's index has j.
        lg = [Signal(name=f"lg{j}") for j in range(5)]
        for j in range(5):
            m.d.comb += lg[j].eq(Cat(*[log_slots[i] for i in range(32) if i >> j & 1]).any())
        # ring_lines = slot_lines << log2: a barrel shifter of equal-width stages (lint
        # clean, unlike a variable ``<<``)
        shifted = sl8
        for j in range(5):
            stage = Signal(8 + (1 << (j + 1)) - 1, name=f"ring_shift{j}")
            m.d.comb += stage.eq(Mux(lg[j], Cat(C(0, 1 << j), shifted),
                                     Cat(shifted, C(0, 1 << j))))
            shifted = stage
        ring_end = sb.log_base + Cat(C(0, 6), shifted)

        def fits(value):
            return ~value[aw:].any() if len(value) > aw else C(1, 1)

        hdr_end = sb.mlp_slot_bytes[:32] + 64
        slot_ok = [~base[:6].any() & fits(base + hdr_end)
                   for base in (sb.mlp_slot0, sb.mlp_slot1)]
        m.d.comb += [
            self.present.eq((sb.magic == SB_MAGIC)
                            & (sum64_finish(line_sum(m, sb.as_value(), words=7)) == sb.check)
                            & (cw.magic == COMMIT_MAGIC)),
            self.layout_ok.eq(
                (sb.version == SB_VERSION)
                & log_slots.any() & ~(log_slots & self.last_slot).any()
                & (sb.slot_lines >= 2) & (sb.slot_lines <= self._max_slot_lines)
                & ~sb.log_base[:6].any() & fits(ring_end)
                & ~sb.mlp_slot_bytes[32:].any() & ~sb.mlp_slot_bytes[:6].any()
                & slot_ok[0] & slot_ok[1]),
            self.committed.eq(cw.committed),
            self.epoch.eq(cw.epoch),
            self.log_base.eq(sb.log_base),
            self.log_slots.eq(log_slots),
            self.log_slots_log2.eq(Cat(*lg)),
            self.slot_lines.eq(sl8),
            self.ring_lines.eq(shifted),
            self.last_slot.eq(log_slots - 1),
            self.last_addr.eq(ring_end - Cat(C(0, 6), sl8)),
            self.mlp_slot0.eq(sb.mlp_slot0),
            self.mlp_slot1.eq(sb.mlp_slot1),
            self.mlp_slot_bytes.eq(sb.mlp_slot_bytes),
        ]
        return m
