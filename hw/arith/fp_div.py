"""Iterative, correctly rounded binary32 divider."""

from amaranth.hdl import C, Cat, Module, Mux, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .fp32 import (
    BIAS,
    EXP_WIDTH,
    INF,
    OPERANDS,
    QNAN,
    normalize_operand,
    round_pack,
    signal,
)

__all__ = ["FpDiv"]

#: Quotient bits needed before rounding: the leading one, 23 fraction bits and a guard
#: bit. Everything below is summarised by the sticky bit (remainder non-zero), which is
#: enough for round-to-nearest-even even after denormalization.
QUOTIENT_BITS = 25


class FpDiv(wiring.Component):
    """``a / b`` in binary32, correctly rounded, by restoring digit recurrence.

    One division is in flight at a time: the significand quotient is developed
    ``bits_per_cycle`` bits per cycle, so an operation takes
    ``iterations = ceil(25 / bits_per_cycle)`` cycles of recurrence. A one-entry operand
    buffer in front lets the next pair be accepted while the current one iterates, so a
    stream of divisions sustains one result every ``iterations + 1`` cycles (26 cycles
    at 1 bit per cycle). Latency from an accepted pair to ``o_result.valid`` is
    ``iterations + 3`` cycles when the divider is idle (buffer, normalize, recurrence,
    round into the output register). The result register holds its value under
    backpressure and the recurrence waits for it; ``i_operands.ready`` may depend
    combinationally on ``o_result.ready``. Reset abandons the operation in flight.

    Numerics (``docs/numerics.md``): correctly rounded to nearest-even, including
    subnormal operands (normalized first) and subnormal results (rounded once, after
    denormalization); ``x / 0`` is a signed infinity for non-zero ``x``, ``x / inf`` a
    signed zero, overflow a signed infinity; ``0 / 0``, ``inf / inf`` and any NaN operand
    give :data:`~hw.arith.fp32.QNAN`. Bit-identical to numpy float32 ``a / b`` except for
    NaN payloads.

    Parameters
    ----------
    bits_per_cycle : int
        Quotient bits per recurrence cycle, 1 to 25 (default 1): each is one 25-bit
        compare-and-subtract in series.

    Members
    -------
    i_operands : ``In(stream.Signature(OPERANDS))``
        ``.p.a`` (dividend), ``.p.b`` (divisor): binary32 encodings.
    o_result : ``Out(stream.Signature(32))``
        The rounded quotient.

    Raises
    ------
    ValueError
        If ``bits_per_cycle`` is not an integer from 1 to 25.
    """

    i_operands: In(stream.Signature(OPERANDS))
    o_result: Out(stream.Signature(32))

    def __init__(self, *, bits_per_cycle: int = 1):
        if not isinstance(bits_per_cycle, int) or isinstance(bits_per_cycle, bool) \
                or not 1 <= bits_per_cycle <= QUOTIENT_BITS:
            raise ValueError(f"bits_per_cycle must be an integer from 1 to {QUOTIENT_BITS}, "
                             f"not {bits_per_cycle!r}")
        self._bits_per_cycle = bits_per_cycle
        super().__init__()

    @property
    def bits_per_cycle(self) -> int:
        return self._bits_per_cycle

    @property
    def iterations(self) -> int:
        return -(-QUOTIENT_BITS // self._bits_per_cycle)

    @property
    def latency(self) -> int:
        """Cycles from an accepted operand pair to its result when the divider is idle."""
        return self.iterations + 3

    @property
    def interval(self) -> int:
        """Cycles between results of a back-to-back stream of divisions."""
        return self.iterations + 1

    def elaborate(self, platform):
        m = Module()
        i, o = self.i_operands, self.o_result
        k, n = self._bits_per_cycle, self.iterations
        qbits = k * n

        # One-entry operand buffer: keeps the normalizer off the input's path and lets
        # the next pair in while the recurrence runs.
        held = Signal(name="held")
        held_a = Signal(32, reset_less=True)
        held_b = Signal(32, reset_less=True)

        busy = Signal()
        count = Signal(range(n + 1))
        sign = Signal(reset_less=True)
        exp = Signal(signed(EXP_WIDTH), reset_less=True)
        divisor = Signal(24, reset_less=True)
        remainder = Signal(25, reset_less=True)
        quotient = Signal(qbits, reset_less=True)
        # Special results: NaN, a signed infinity, or a signed zero.
        special = Signal(reset_less=True)
        special_nan = Signal(reset_less=True)
        special_inf = Signal(reset_less=True)

        finish = Signal()
        start = Signal()
        m.d.comb += [
            finish.eq(busy & ~count.any() & (~o.valid | o.ready)),
            start.eq(held & (~busy | finish)),
            i.ready.eq(~held | start),
        ]

        with m.If(i.valid & i.ready):
            m.d.sync += [held.eq(1), held_a.eq(i.p.a), held_b.eq(i.p.b)]
        with m.Elif(start):
            m.d.sync += held.eq(0)

        # Normalize: both significands to [1, 2); a dividend below the divisor is doubled
        # so that the quotient lies in [1, 2) and its first bit is a one.
        a = normalize_operand(m, held_a, "a")
        b = normalize_operand(m, held_b, "b")
        small = a["mant"] < b["mant"]
        nan = a["nan"] | b["nan"] | (a["zero"] & b["zero"]) | (a["inf"] & b["inf"])
        inf = a["inf"] | b["zero"]
        zero = a["zero"] | b["inf"]
        result_sign = a["sign"] ^ b["sign"]

        # Restoring recurrence, k bits per cycle: remainder < 2 * divisor throughout.
        r = remainder
        bits = []
        for index in range(k):
            diff = signal(m, r - divisor, f"diff{index}")
            bit = ~diff[25]
            bits.append(bit)
            r = signal(m, Cat(C(0, 1), Mux(bit, diff[:24], r[:24])), f"partial{index}")

        with m.If(start):
            m.d.sync += [
                busy.eq(1),
                count.eq(n),
                sign.eq(result_sign),
                exp.eq(a["exp"] - b["exp"] + BIAS - small),
                divisor.eq(b["mant"]),
                remainder.eq(Mux(small, a["mant"] << 1, a["mant"])),
                special.eq(nan | inf | zero),
                special_nan.eq(nan),
                special_inf.eq(inf),
            ]
        with m.Elif(busy & count.any()):
            m.d.sync += [
                count.eq(count - 1),
                remainder.eq(r),
                quotient.eq(Cat(*reversed(bits), quotient)[:qbits]),
            ]
        with m.Elif(finish):
            m.d.sync += busy.eq(0)

        # Extra quotient bits (when k does not divide 25) only feed the sticky bit.
        sticky = remainder.any()
        if qbits > QUOTIENT_BITS:
            sticky |= quotient[:qbits - QUOTIENT_BITS].any()
        rounded = round_pack(m, sign=sign, exp=exp, mant=quotient[qbits - QUOTIENT_BITS:],
                             sticky=sticky)
        special_value = Mux(special_nan, QNAN, Cat(Mux(special_inf, INF, 0), sign))
        with m.If(finish):
            m.d.sync += [o.valid.eq(1), o.payload.eq(Mux(special, special_value, rounded))]
        with m.Elif(o.ready):
            m.d.sync += o.valid.eq(0)
        return m
