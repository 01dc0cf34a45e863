"""The recovery's MLP slot check: validates the two MLP checkpoint slots and names the
one to resume from.

See :class:`MlpCheck`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .formats import LINE_BITS, MLP_HEADER, MLP_MAGIC, line_sum, sum64_finish

__all__ = ["MLP_NONE", "MlpCheck"]

#: ``mlp_slot`` when neither MLP slot holds a valid checkpoint.
MLP_NONE = 3


class MlpCheck(wiring.Component):
    """Checks MLP slot 0, then slot 1, from the lines read for it, and reports the
    valid one with the larger ``batch_id`` not after ``committed`` (slot 0 on a tie;
    ``mlp_slot = MLP_NONE`` when none).

    **Per slot.** The recovery reads the header line at ``hdr_addr`` (the slot's base
    plus ``slot_bytes``), then, if ``pay_lines`` is non-zero, that many lines from
    ``pay_addr``, then pulses ``decide``. ``pay_lines`` is ``ceil(length / 64)`` when
    the header's ``magic`` is "MLPC" and ``length <= slot_bytes``, else 0. The slot is
    valid when besides ``check == sum64(header words 0..2, payload words)`` over the
    ``ceil(length / 8)`` payload words as stored (the words past them in the last line
    are ignored, as in ``sim/ckpt.py``) and ``batch_id <= committed``. ``second`` tells
    which slot is being checked.

    **Flow, latency.** ``i_line`` is always ready: the first line after ``clear`` or
    ``decide`` is a header, the others payload, summed as they arrive. The outputs
    other than the result follow the header register combinationally; the result is
    set by the ``decide`` of slot 1 (a PMEM error before it leaves ``MLP_NONE``).
    ``clear`` (one cycle) starts again at slot 0 with no result. ``slot0``, ``slot1``,
    ``slot_bytes`` and ``committed`` must hold during the checks.

    Parameters
    ----------
    addr_width : int

    Members
    -------
    i_line : ``In(stream.Signature(LINE_BITS, always_ready=True))``
    clear, decide : ``In(1)``
    slot0, slot1 : ``In(addr_width)``; slot_bytes, committed : ``In(32)``
    second : ``Out(1)``
    hdr_addr, pay_addr : ``Out(addr_width)``; pay_lines : ``Out(32)``
    mlp_slot : ``Out(2)``; mlp_batch : ``Out(32)``
    """

    def __init__(self, *, addr_width: int):
        super().__init__({
            "i_line": In(stream.Signature(LINE_BITS, always_ready=True)),
            "clear": In(1),
            "decide": In(1),
            "slot0": In(addr_width),
            "slot1": In(addr_width),
            "slot_bytes": In(32),
            "committed": In(32),
            "second": Out(1),
            "hdr_addr": Out(addr_width),
            "pay_addr": Out(addr_width),
            "pay_lines": Out(32),
            "mlp_slot": Out(2, init=MLP_NONE),
            "mlp_batch": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        line = self.i_line
        hdr = Signal(256)
        mh = data.View(MLP_HEADER, Cat(hdr, C(0, LINE_BITS - 256)))
        at_header = Signal(init=1)
        acc = Signal(64)
        count = Signal(32)                  # payload lines taken
        valid0 = Signal()
        batch0 = Signal(32)
        lines = (mh.length[:32] + 63)[6:]   # 27 bits: ``length < 2**32`` (layout check)
        ok = (mh.magic == MLP_MAGIC) & (mh.length <= self.slot_bytes)
        base = Mux(self.second, self.slot1, self.slot0)
        m.d.comb += [
            self.hdr_addr.eq(base + self.slot_bytes),
            self.pay_addr.eq(base),
            self.pay_lines.eq(Mux(ok, lines, 0)),
        ]

        # Only the ceil((length mod 64) / 8) first words of the last line count.
        rem = mh.length[:6]
        mask = Signal(8)
        with m.If(at_header):
            m.d.comb += mask.eq(0x07)
        with m.Elif(((count + 1)[:32] == lines) & rem.any()):
            m.d.comb += mask.eq(Cat(*[rem > 8 * i for i in range(8)]))
        with m.Else():
            m.d.comb += mask.eq(0xFF)
        total = line_sum(m, line.payload & Cat(*[mask[i].replicate(64) for i in range(8)]),
                         name="total")
        with m.If(line.valid):
            m.d.sync += [at_header.eq(0), acc.eq(Mux(at_header, 0, acc) + total),
                         count.eq(Mux(at_header, 0, count + 1))]
            with m.If(at_header):
                m.d.sync += hdr.eq(line.payload[:256])

        valid = ok & (sum64_finish(acc) == mh.check) & (mh.batch_id <= self.committed)
        with m.If(self.decide):
            m.d.sync += [at_header.eq(1), self.second.eq(1)]
            with m.If(~self.second):
                m.d.sync += [valid0.eq(valid), batch0.eq(mh.batch_id)]
            with m.Elif(valid & (~valid0 | (mh.batch_id > batch0))):
                m.d.sync += [self.mlp_slot.eq(1), self.mlp_batch.eq(mh.batch_id)]
            with m.Elif(valid0):
                m.d.sync += [self.mlp_slot.eq(0), self.mlp_batch.eq(batch0)]
        with m.If(self.clear):
            m.d.sync += [at_header.eq(1), self.second.eq(0), self.mlp_slot.eq(MLP_NONE),
                         self.mlp_batch.eq(0)]
        return m
