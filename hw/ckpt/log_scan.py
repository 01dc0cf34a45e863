"""The recovery's undo-log scanner: splits the lines of the log ring into slots and
checks the record in each.

See :class:`LogScan`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .formats import HEADER, LINE_BITS, LOG_MAGIC, line_sum, sum64_finish

__all__ = ["LogScan", "buffer_fill", "scanned_record"]


def scanned_record(addr_width: int) -> data.StructLayout:
    """Payload of :attr:`LogScan.o_rec`: one slot's record."""
    return data.StructLayout({
        "ok": 1,                # the record counts (header fields and check)
        "n": 8,                 # payload lines
        "seq": 32,
        "addr": addr_width,     # restore address (bits 5..0 cleared)
        "slot": 32,             # slot index and address, counted from ``clear``
        "slot_addr": addr_width,
    })


def buffer_fill(index_width: int) -> data.StructLayout:
    """Payload of :attr:`LogScan.o_fill`: payload line ``index`` of the current record."""
    return data.StructLayout({"index": index_width, "data": LINE_BITS})


class LogScan(wiring.Component):
    """Takes the lines of consecutive log slots, ``slot_lines`` per slot, and for each
    slot offers one record on ``o_rec``.

    **Checks.** ``ok`` is set when the header (the slot's first line) has ``magic``
    "ULOG", ``epoch`` equal to ``epoch``, ``1 <= n < slot_lines`` and ``batch_id``
    above ``committed``, and its ``check`` equals ``sum64`` of header words 0..6 and
    payload lines ``1..n`` (``docs/checkpoint.md``). ``slot`` and ``slot_addr`` count
    the slots from 0 at ``log_base`` since the last ``clear``; in the recovery's second
    pass, which reads the ring in another order, they mean nothing.

    **Payload.** With ``restore`` high every payload line ``1..n`` of a slot is sent on
    ``o_fill`` (always ready) as it is taken, with its index ``0..n-1``, for the
    restore buffer.

    **Flow, latency.** ``o_rec`` is valid from the cycle after the slot's last line is
    taken until it is taken; ``o_rec.valid`` does not wait for ``ready``. Lines are
    taken one per cycle except while a record waits on ``o_rec`` (``i_line.ready =
    ~o_rec.valid | o_rec.ready``), so a record is at most one slot ahead of its
    consumer. ``clear`` (one cycle, with no line offered) drops a waiting record and
    restarts at slot 0. ``slot_lines`` (at least 2), ``epoch``, ``committed``,
    ``log_base`` and ``restore`` must hold while lines flow.

    Parameters
    ----------
    addr_width : int
    index_width : int
        Width of ``o_fill``'s index (lines ``0..2**index_width - 1``).

    Members
    -------
    i_line : ``In(stream.Signature(LINE_BITS))``
    o_rec : ``Out(stream.Signature(scanned_record(addr_width)))``
    o_fill : ``Out(stream.Signature(buffer_fill(index_width), always_ready=True))``
    clear, restore : ``In(1)``
    slot_lines : ``In(8)``; epoch : ``In(16)``; committed : ``In(32)``
    log_base : ``In(addr_width)``
    """

    def __init__(self, *, addr_width: int, index_width: int):
        if not isinstance(index_width, int) or not 1 <= index_width <= 8:
            raise ValueError(f"index_width must be an integer from 1 to 8, not "
                             f"{index_width!r}")
        self._addr_width = addr_width
        self._index_width = index_width
        super().__init__({
            "i_line": In(stream.Signature(LINE_BITS)),
            "o_rec": Out(stream.Signature(scanned_record(addr_width))),
            "o_fill": Out(stream.Signature(buffer_fill(index_width), always_ready=True)),
            "clear": In(1),
            "restore": In(1),
            "slot_lines": In(8),
            "epoch": In(16),
            "committed": In(32),
            "log_base": In(addr_width),
        })

    index_width = property(lambda self: self._index_width)

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        line, rec, fill = self.i_line, self.o_rec, self.o_fill
        hdr = data.View(HEADER, line.payload)
        k = Signal(8)                           # line within the slot
        n = Signal(8)                           # the record, as the header says
        seq = Signal(32)
        addr = Signal(aw)
        slot = Signal(32)
        slot_addr = Signal(aw)
        sidx = Signal(32)                       # the next slot's index and address
        saddr = Signal(aw)
        counts = Signal()                       # the header's fields pass
        check = Signal(64)
        acc = Signal(64)
        dec_sum = Signal(64)
        in_payload = k.any() & (k <= n)
        # The header's check word is not part of the sum.
        total = line_sum(m, Mux(k.any(), line.payload, line.payload[:448]), name="total")
        take = line.valid & line.ready

        m.d.comb += [
            line.ready.eq(~rec.valid | rec.ready),
            rec.p.ok.eq(counts & (sum64_finish(dec_sum) == check)),
            rec.p.n.eq(n), rec.p.seq.eq(seq), rec.p.addr.eq(addr),
            rec.p.slot.eq(slot), rec.p.slot_addr.eq(slot_addr),
            fill.valid.eq(take & in_payload & self.restore),
            fill.p.index.eq(k - 1),
            fill.p.data.eq(line.payload),
        ]
        with m.If(rec.ready):
            m.d.sync += rec.valid.eq(0)
        with m.If(take):
            with m.If(~k.any()):
                m.d.sync += [
                    counts.eq((hdr.magic == LOG_MAGIC) & (hdr.epoch == self.epoch)
                              & hdr.n.any() & (hdr.n < self.slot_lines)
                              & (hdr.batch_id > self.committed)),
                    n.eq(hdr.n), seq.eq(hdr.seq), addr.eq(Cat(C(0, 6), hdr.addr[6:aw])),
                    check.eq(hdr.check), acc.eq(total), slot.eq(sidx), slot_addr.eq(saddr),
                    sidx.eq(sidx + 1), saddr.eq(saddr + Cat(C(0, 6), self.slot_lines)),
                ]
            with m.Elif(in_payload):
                m.d.sync += acc.eq(acc + total)
            with m.If((k + 1)[:8] == self.slot_lines):
                m.d.sync += [k.eq(0), rec.valid.eq(1),
                             dec_sum.eq(Mux(in_payload, acc + total, acc))]
            with m.Else():
                m.d.sync += k.eq(k + 1)
        with m.If(self.clear):
            m.d.sync += [k.eq(0), rec.valid.eq(0), sidx.eq(0), saddr.eq(self.log_base)]
        return m
