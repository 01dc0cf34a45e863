"""UPDATE's cache write-back: a cached row written to PMEM line by line, the Bs counted.

See :class:`RowWriteback`.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst
from hw.widths import check_int

from .update_layouts import LINE_BITS, check_cache_rows

__all__ = ["RowWriteback", "writeback_request"]

_SIZE_LINE = 6      # AXI ``size`` of a 64-byte beat


def writeback_request(cache_rows: int) -> data.StructLayout:
    """Payload of :attr:`RowWriteback.i_row`: the slot to write back and the row it
    holds (which the :class:`~.row_cursor.RowCursor` is started on)."""
    return data.StructLayout({"slot": (cache_rows - 1).bit_length(), "row": 32})


class RowWriteback(wiring.Component):
    """Writes the row of a cache slot back to PMEM, one single-beat burst per line, and
    counts the B responses owed.

    **Flow, latency.** ``i_row.ready`` is high while idle (``busy`` low); a request
    taken, the block reads line ``line`` of the slot from the cache's read port once no
    update uses it (``read_busy`` low), loads it into W and AW (``wvalid`` and
    ``awvalid`` from registers, each dropping on its own handshake; ``awaddr`` is the
    cursor's ``addr``), and once both are taken steps the cursor: 3 cycles per line
    without backpressure. After the line where the cursor is ``at_last`` the block is
    idle again in the next cycle (``busy`` low). AXI ID 0, ``awlen`` 0, every byte
    strobed; the read channels are idle (``arvalid`` low).

    **Bs.** ``bready`` is always high. ``b_owed`` is high while an AW taken has no B
    yet; ``b_owed_full`` while a cache's worth of lines (``cache_rows *
    max_lines_per_row``) or more are owed. Response codes are not checked. Reset: idle,
    nothing owed.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address width, 12 to 64.
    id_width : int
        AXI ID width, 1 to 16.
    cache_rows : int
        Slots of the cache, a power of two from 2 to 256.
    max_lines_per_row : int
        Lines of a slot, 1 to 64.

    Members
    -------
    i_row : ``In(stream.Signature(writeback_request(cache_rows)))``
    busy : ``Out(1)``
    read_en : ``Out(1)``
        The block reads ``read_addr`` this cycle; the data on ``read_data`` (``In(512)``)
        in the next.
    read_busy : ``In(1)``
    line : ``In(7)``, at_last : ``In(1)``, addr : ``In(addr_width)``, step : ``Out(1)``
        The :class:`~.row_cursor.RowCursor`.
    b_owed, b_owed_full : ``Out(1)``
    pmem : ``Out(AXI4Signature(addr_width, 512, id_width))``

    Raises
    ------
    ValueError
        A parameter out of range, naming it and its value.
    """

    def __init__(self, *, addr_width: int, id_width: int, cache_rows: int,
                 max_lines_per_row: int):
        self._addr_width = check_int("addr_width", addr_width, 12, 64)
        self._id_width = check_int("id_width", id_width, 1, 16)
        self._cache_rows = check_cache_rows(cache_rows)
        self._max_lines_per_row = check_int("max_lines_per_row", max_lines_per_row, 1, 64)
        slot_bits = (cache_rows - 1).bit_length()
        self._line_bits = (max_lines_per_row - 1).bit_length()
        super().__init__({
            "i_row": In(stream.Signature(writeback_request(cache_rows))),
            "busy": Out(1),
            "read_en": Out(1),
            "read_addr": Out(slot_bits + self._line_bits),
            "read_data": In(LINE_BITS),
            "read_busy": In(1),
            "line": In(7),
            "at_last": In(1),
            "addr": In(addr_width),
            "step": Out(1),
            "b_owed": Out(1),
            "b_owed_full": Out(1),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
        })

    addr_width = property(lambda self: self._addr_width)
    id_width = property(lambda self: self._id_width)
    cache_rows = property(lambda self: self._cache_rows)
    max_lines_per_row = property(lambda self: self._max_lines_per_row)

    def elaborate(self, platform):
        m = Module()
        axi = self.pmem
        slot = Signal((self._cache_rows - 1).bit_length())
        line_data = Signal(LINE_BITS, reset_less=True)
        m.d.comb += [
            axi.awaddr.eq(self.addr),
            axi.awsize.eq(_SIZE_LINE),
            axi.awburst.eq(AxiBurst.INCR),
            axi.wstrb.eq((1 << (LINE_BITS // 8)) - 1),
            axi.wlast.eq(1),
            axi.bready.eq(1),
            axi.wdata.eq(line_data),
            self.read_addr.eq(Cat(self.line[:self._line_bits], slot)),
        ]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i_row.ready.eq(1)
                with m.If(self.i_row.valid):
                    m.d.sync += slot.eq(self.i_row.p.slot)
                    m.next = "READ"
            with m.State("READ"):
                m.d.comb += [self.busy.eq(1), self.read_en.eq(~self.read_busy)]
                with m.If(~self.read_busy):
                    m.next = "LOAD"
            with m.State("LOAD"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [line_data.eq(self.read_data), axi.awvalid.eq(1), axi.wvalid.eq(1)]
                m.next = "SEND"
            with m.State("SEND"):
                m.d.comb += self.busy.eq(1)
                with m.If(axi.awready):
                    m.d.sync += axi.awvalid.eq(0)
                with m.If(axi.wready):
                    m.d.sync += axi.wvalid.eq(0)
                with m.If((~axi.awvalid | axi.awready) & (~axi.wvalid | axi.wready)):
                    m.d.comb += self.step.eq(1)
                    with m.If(self.at_last):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "READ"

        # Write-backs go on while earlier Bs are owed, up to a cache's worth of lines.
        owed_max = self._cache_rows * self._max_lines_per_row
        owed = Signal((2 * owed_max).bit_length())
        aw_taken = axi.awvalid & axi.awready
        with m.If(aw_taken & ~axi.bvalid):
            m.d.sync += owed.eq(owed + 1)
        with m.Elif(~aw_taken & axi.bvalid):
            m.d.sync += owed.eq(owed - 1)
        m.d.comb += [self.b_owed.eq(owed.any()), self.b_owed_full.eq(owed >= owed_max)]
        return m
