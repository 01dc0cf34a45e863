"""The bag sequencer's checks of a descriptor's fields, before any PMEM read.

See :class:`FieldCheck`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..widths import is_int
from .buffer_reader import LINE_SHIFT
from .descriptor import MAX_DIM, DescKind, Descriptor, PoolMode, Status

__all__ = ["FieldCheck"]

#: Width of every end-of-region sum (48-bit address + 47-bit size, with room).
_END_BITS = 50


class FieldCheck(wiring.Component):
    """The first failing field check of a LOOKUP / UPDATE descriptor, in the order of
    ``docs/embedding.md`` ("Status codes"), or OK: ``BAD_KIND`` for any ``kind`` other
    than LOOKUP and UPDATE, then ``UNSUPPORTED`` (reserved bit, ``mode`` 3, ``dim`` 0 or
    > 4096, weights with mean/max, UPDATE with max), then ``MISALIGNED`` (table base,
    indices, offsets, data and, when ``weighted``, weights addresses), then
    ``ADDR_RANGE`` (each of those regions ``[addr, addr + size)`` ends at or below
    ``2**addr_width``, also when empty; the table is ``rows`` vectors and the data
    ``num_bags`` vectors of whole lines, the indices and weights ``num_indices`` words,
    the offsets ``num_bags + include_last_offset`` words).

    **Latency.** The table and data sizes (a 32 x 9-bit product each) are registered,
    so ``o_status`` is that of ``i_desc`` from one cycle after ``i_desc`` settles; the
    rest is combinational. No state but those two products; no reset behaviour.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address bits, 12 to 48.

    Members
    -------
    i_desc : ``In(Descriptor)``
        The descriptor, held.
    o_status : ``Out(8)``
        A :class:`~.descriptor.Status` code: OK or the first check that fails.

    Raises
    ------
    ValueError
        If ``addr_width`` is not an integer from 12 to 48.
    """

    def __init__(self, *, addr_width: int):
        if not is_int(addr_width) or not 12 <= addr_width <= 48:
            raise ValueError(f"addr_width must be an integer from 12 to 48, not {addr_width!r}")
        self._addr_width = addr_width
        super().__init__({"i_desc": In(Descriptor), "o_status": Out(8)})

    addr_width = property(lambda self: self._addr_width)

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        desc = self.i_desc

        is_lookup = desc.kind == DescKind.LOOKUP.value
        is_update = desc.kind == DescKind.UPDATE.value
        unsupported = (desc.rsvd_flag | (desc.mode == 3) | (desc.dim == 0) | (desc.dim > MAX_DIM)
                       | (desc.weighted & (desc.mode != PoolMode.SUM.value))
                       | (is_update & (desc.mode == PoolMode.MAX.value)))
        misaligned = (desc.table_base[:LINE_SHIFT].any() | desc.indices_addr[:LINE_SHIFT].any()
                      | desc.offsets_addr[:LINE_SHIFT].any() | desc.data_addr[:LINE_SHIFT].any()
                      | (desc.weighted & desc.weights_addr[:LINE_SHIFT].any()))

        # Lines per vector: ceil(dim * 4 / 64) for fp32, ceil(dim * 2 / 64) for bf16.
        lpr_fp32 = (desc.dim + 15)[4:13]
        lpr_bf16 = (desc.dim + 31)[5:14]
        table_lines = Signal(41)
        data_lines = Signal(41)
        m.d.sync += [table_lines.eq(desc.rows * Mux(desc.bf16, lpr_bf16, lpr_fp32)),
                     data_lines.eq(desc.num_bags * Mux(desc.bf16 & is_lookup, lpr_bf16, lpr_fp32))]

        def fits(name, addr, size):
            """``addr + size <= 2**aw`` for a 48-bit address and a byte size."""
            end = Signal(_END_BITS, name=f"{name}_end")
            m.d.comb += end.eq(addr + size)
            high = end[aw:]
            return (high == 0) | ((high == 1) & (end[:aw] == 0))

        in_range = (fits("table", desc.table_base, Cat(C(0, LINE_SHIFT), table_lines))
                    & fits("idx", desc.indices_addr, Cat(C(0, 2), desc.num_indices))
                    & fits("off", desc.offsets_addr,
                           Cat(C(0, 2), desc.num_bags + desc.include_last_offset))
                    & fits("data", desc.data_addr, Cat(C(0, LINE_SHIFT), data_lines))
                    & (~desc.weighted
                       | fits("w", desc.weights_addr, Cat(C(0, 2), desc.num_indices))))

        with m.If(~is_lookup & ~is_update):
            m.d.comb += self.o_status.eq(Status.BAD_KIND.value)
        with m.Elif(unsupported):
            m.d.comb += self.o_status.eq(Status.UNSUPPORTED.value)
        with m.Elif(misaligned):
            m.d.comb += self.o_status.eq(Status.MISALIGNED.value)
        with m.Elif(~in_range):
            m.d.comb += self.o_status.eq(Status.ADDR_RANGE.value)
        with m.Else():
            m.d.comb += self.o_status.eq(Status.OK.value)
        return m
