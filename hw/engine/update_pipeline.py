"""UPDATE's arithmetic: one gradient line added to a cached table line per cycle.

See :class:`UpdatePipeline`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith import Fp32ToBf16, FpAdd, FpMul
from hw.widths import check_int

from .update_layouts import DIM_BITS, LINE_BITS, LINE_ELEMS, check_cache_rows

__all__ = ["UpdatePipeline", "update_op"]

#: Positions (cycles after issue) of the pipeline; see :class:`UpdatePipeline`.
_DEPTH = 8
_GRANULES = 2 * LINE_ELEMS
_ONE = 0x3F80_0000     # fp32 1.0: the weight of an unweighted update (exact)


def _geometry(cache_rows: int, max_lines_per_row: int) -> tuple[int, int]:
    """Bits of a slot and of a table line within a slot's rows."""
    return (cache_rows - 1).bit_length(), (max_lines_per_row - 1).bit_length()


def update_op(cache_rows: int, max_lines_per_row: int) -> data.StructLayout:
    """Payload of :attr:`UpdatePipeline.i_op`: an item that hits, with its settings."""
    slot_bits, _ = _geometry(cache_rows, max_lines_per_row)
    return data.StructLayout({
        "slot": slot_bits,
        "line": 7,              # the item's gradient line (``ITEM.line``)
        "bf16": 1,
        "weighted": 1,
        "dim": DIM_BITS,
        "weight": 32,
        "grad": LINE_BITS,
    })


def _written_granules(op) -> Cat:
    """The 16-bit granules of its table line an op writes: granule ``g`` is bits
    16g..16g+15; lane ``e`` is a table element iff ``16 * line + e < dim``; fp32 lane
    ``e`` is granules 2e, 2e+1, bf16 lane ``e`` of half ``h`` granule 16h + e."""
    remaining = (op.dim - (op.line << 4))[:DIM_BITS + 1]
    live = [~remaining[DIM_BITS] & (remaining[:DIM_BITS] > e) for e in range(LINE_ELEMS)]
    half = op.line[0]
    fp32_mask = Cat(*(live[g // 2] for g in range(_GRANULES)))
    bf16_mask = Cat(*(live[e] & ~half for e in range(LINE_ELEMS)),
                    *(live[e] & half for e in range(LINE_ELEMS)))
    return Mux(op.bf16, bf16_mask, fp32_mask)


class UpdatePipeline(wiring.Component):
    """Adds the (weighted) gradient line of every op to its cached table line, one op
    per cycle, in a fixed-latency pipeline over the cache's line memory.

    An op issued (taken from ``i_op``) at position 0 is at position ``k`` k cycles
    later: 0, ``weight * grad`` into the 16 :class:`~hw.arith.FpMul` (weight 1.0 when
    not ``weighted``, which is exact); 2, the line read (``read_addr``, a synchronous
    read port); 3, the line, with forwarding, plus the product into the 16
    :class:`~hw.arith.FpAdd`; 6, the sums, into the :class:`~hw.arith.Fp32ToBf16`
    rounding for bf16; 7, the line written (``write_*``), only the granules of the op,
    so padding elements and the other half of a bf16 line are never rewritten. The
    results of the ops at positions 6 (fp32 only), 7 and 8 to the same granules are
    forwarded into the add at position 3 (newest wins), so every add sees the previous
    update of its elements, in issue order: bit-identical to the sequential
    definition. NaN results are the canonical quiet NaN.

    **Flow.** ``i_op.ready`` is low while an op at position 1 or 2 (or 3 if bf16: its
    rounded value is not ready) still computes granules the offered op writes; it
    depends on ``i_op``'s payload and the pipeline's registers only. One op per cycle
    otherwise; no backpressure downstream. ``busy`` is high while an op is at
    positions 1 to 7 (not yet written), ``slot_busy`` while one of ``i_op.p.slot`` is.
    ``read_busy`` / ``write_busy`` say an op uses the read / write port (positions 2 /
    7): the cache's other users take the ports in the other cycles. Reset empties the
    pipeline.

    Parameters
    ----------
    cache_rows : int
        Slots of the cache, a power of two from 2 to 256.
    max_lines_per_row : int
        Lines of a slot, 1 to 64 (a slot spans the next power of two).

    Members
    -------
    i_op : ``In(stream.Signature(update_op(cache_rows, max_lines_per_row)))``
    busy, slot_busy, read_busy, write_busy : ``Out(1)``
    read_addr : ``Out(addr_bits)``
        ``{slot, table line}`` of the line read; its data, one cycle later, on
        ``read_data`` (``In(512)``).
    write_addr : ``Out(addr_bits)``, write_data : ``Out(512)``, write_en : ``Out(32)``
        One enable per 16-bit granule.

    Raises
    ------
    ValueError
        A parameter out of range, naming it and its value.
    """

    def __init__(self, *, cache_rows: int, max_lines_per_row: int):
        self._cache_rows = check_cache_rows(cache_rows)
        self._max_lines_per_row = check_int("max_lines_per_row", max_lines_per_row, 1, 64)
        slot_bits, line_bits = _geometry(cache_rows, max_lines_per_row)
        self._addr_bits = slot_bits + line_bits
        super().__init__({
            "i_op": In(stream.Signature(update_op(cache_rows, max_lines_per_row))),
            "busy": Out(1),
            "slot_busy": Out(1),
            "read_busy": Out(1),
            "write_busy": Out(1),
            "read_addr": Out(self._addr_bits),
            "read_data": In(LINE_BITS),
            "write_addr": Out(self._addr_bits),
            "write_data": Out(LINE_BITS),
            "write_en": Out(_GRANULES),
        })

    cache_rows = property(lambda self: self._cache_rows)
    max_lines_per_row = property(lambda self: self._max_lines_per_row)
    addr_bits = property(lambda self: self._addr_bits)

    def elaborate(self, platform):
        m = Module()
        _, line_bits = _geometry(self._cache_rows, self._max_lines_per_row)
        op = self.i_op.p
        muls = [FpMul() for _ in range(LINE_ELEMS)]
        adds = [FpAdd() for _ in range(LINE_ELEMS)]
        rnds = [Fp32ToBf16() for _ in range(LINE_ELEMS)]
        for e in range(LINE_ELEMS):
            m.submodules[f"mul{e}"] = muls[e]
            m.submodules[f"add{e}"] = adds[e]
            m.submodules[f"rnd{e}"] = rnds[e]

        # What travels down the pipeline with an op.
        meta_layout = data.StructLayout({
            "addr": self._addr_bits,    # {slot, table line}: the cache line
            "mask": _GRANULES,          # granules written
            "half": 1,
            "bf16": 1,
        })
        offered = Signal(meta_layout)
        table_line = Mux(op.bf16, op.line[1:], op.line[:6])
        m.d.comb += [
            offered.addr.eq(Cat(table_line[:line_bits], op.slot)),
            offered.mask.eq(_written_granules(op)),
            offered.half.eq(op.line[0]),
            offered.bf16.eq(op.bf16),
        ]
        valid = [None] + [Signal(name=f"p{k}_valid") for k in range(1, _DEPTH + 1)]
        meta = [offered] + [Signal(meta_layout, name=f"p{k}_meta", reset_less=True)
                            for k in range(1, _DEPTH + 1)]
        issue = Signal()
        m.d.comb += issue.eq(self.i_op.valid & self.i_op.ready)
        m.d.sync += [valid[1].eq(issue), meta[1].eq(offered)]
        for k in range(1, _DEPTH):
            m.d.sync += [valid[k + 1].eq(valid[k]), meta[k + 1].eq(meta[k])]

        def overlaps(k):
            return valid[k] & (meta[k].addr == offered.addr) & (meta[k].mask & offered.mask).any()

        # An op issued now reads its line at position 2 and needs it at position 3;
        # an earlier op to the same granules at position 1 or 2 (or 3 if bf16: its
        # rounded value is not ready) would not have its result by then.
        m.d.comb += [
            self.i_op.ready.eq(~(overlaps(1) | overlaps(2) | (overlaps(3) & meta[3].bf16))),
            self.busy.eq(Cat(*valid[1:_DEPTH]).any()),
            self.slot_busy.eq(Cat(*(valid[k] & (meta[k].addr[line_bits:] == op.slot)
                                    for k in range(1, _DEPTH))).any()),
            self.read_busy.eq(valid[2]),
            self.write_busy.eq(valid[7]),
        ]

        weight = Mux(op.weighted, op.weight, C(_ONE, 32))
        for e in range(LINE_ELEMS):
            m.d.comb += [
                muls[e].i_operands.valid.eq(issue),
                muls[e].i_operands.p.a.eq(weight),
                muls[e].i_operands.p.b.eq(op.grad[32 * e:32 * e + 32]),
                muls[e].o_result.ready.eq(1),
                adds[e].o_result.ready.eq(1),
                rnds[e].o_result.ready.eq(1),
            ]

        sums = Signal(LINE_BITS)                        # fp32 sums at position 6
        m.d.comb += sums.eq(Cat(*(u.o_result.payload for u in adds)))
        total = Signal(LINE_BITS, reset_less=True)      # fp32 sums at position 7
        m.d.sync += total.eq(sums)
        narrow = Signal(LINE_BITS // 2)                 # bf16 sums at position 7
        m.d.comb += narrow.eq(Cat(*(u.o_result.payload for u in rnds)))
        result = Signal(LINE_BITS)                      # the line written at position 7
        m.d.comb += result.eq(Mux(meta[7].bf16, Cat(narrow, narrow), total))
        written = Signal(LINE_BITS, reset_less=True)    # position 8
        m.d.sync += written.eq(result)

        # The line at position 3: the cache copy, overlaid with the granules of the
        # ops at positions 8, 7 and 6 (newest last) to the same line.
        line = self.read_data
        for k, source, ready in ((8, written, C(1, 1)), (7, result, C(1, 1)),
                                 (6, sums, ~meta[6].bf16)):
            sel = Signal(_GRANULES, name=f"fwd{k}")
            m.d.comb += sel.eq(meta[k].mask & (valid[k] & ready & (meta[k].addr == meta[3].addr))
                               .replicate(_GRANULES))
            merged = Signal(LINE_BITS, name=f"line_fwd{k}")
            m.d.comb += merged.eq(Cat(*(Mux(sel[g], source[16 * g:16 * g + 16],
                                            line[16 * g:16 * g + 16])
                                        for g in range(_GRANULES))))
            line = merged
        for e in range(LINE_ELEMS):
            lane = slice(32 * e, 32 * e + 32)
            old_bf16 = Mux(meta[3].half, line[256 + 16 * e:256 + 16 * e + 16],
                           line[16 * e:16 * e + 16])
            m.d.comb += [
                adds[e].i_operands.valid.eq(valid[3]),
                adds[e].i_operands.p.a.eq(Mux(meta[3].bf16, Cat(C(0, 16), old_bf16),
                                              line[lane])),
                adds[e].i_operands.p.b.eq(muls[e].o_result.payload),
                rnds[e].i_operands.valid.eq(valid[6]),
                rnds[e].i_operands.p.a.eq(sums[lane]),
            ]

        m.d.comb += [
            self.read_addr.eq(meta[2].addr),
            self.write_addr.eq(meta[7].addr),
            self.write_data.eq(result),
            self.write_en.eq(meta[7].mask & valid[7].replicate(_GRANULES)),
        ]
        return m
