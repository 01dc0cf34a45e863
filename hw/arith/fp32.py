"""Shared pieces of the IEEE-754 binary32 units: layouts, encodings and datapath helpers.

Every unit in :mod:`hw.arith` follows the numerics contract of ``docs/numerics.md``:
round-to-nearest-even only, subnormal inputs and outputs without flushing, NaN results
as the canonical quiet NaN :data:`QNAN` (``0x7FC00000``), and otherwise the bit pattern
numpy float32 produces on x86, including the sign of zero.

The helpers below build combinational logic inside a caller's :class:`Module`. They are
written as *steps* (``step(m, values) -> values``, dicts of named values) so that
:func:`pipeline` can place the register stages of a unit between any two of them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

from amaranth.hdl import C, Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream

__all__ = [
    "BF16_OPERAND",
    "BF16_QNAN",
    "BIAS",
    "EXP_BITS",
    "EXP_WIDTH",
    "FRAC_BITS",
    "INF",
    "OPERAND",
    "OPERANDS",
    "QNAN",
    "Step",
    "check_stages",
    "cut_points",
    "lzc",
    "negative",
    "normalize_operand",
    "pipeline",
    "round_pack",
    "shift_left",
    "shift_right_sticky",
    "signal",
    "unpack",
]

#: The one NaN every unit returns (quiet, positive, zero payload).
QNAN = 0x7FC0_0000
#: The bf16 counterpart of :data:`QNAN`.
BF16_QNAN = 0x7FC0
EXP_BITS = 8
FRAC_BITS = 23
BIAS = 127
#: Magnitude bits (30:0) of infinity.
INF = 0x7F80_0000

#: Payload of the two-operand units (``a`` in the low 32 bits).
OPERANDS = data.StructLayout({"a": 32, "b": 32})
#: Payload of fp32 -> bf16.
OPERAND = data.StructLayout({"a": 32})
#: Payload of bf16 -> fp32.
BF16_OPERAND = data.StructLayout({"a": 16})

#: One combinational slice of a datapath: takes the live values, returns the live values.
Step = Callable[[Module, Mapping[str, Value]], Mapping[str, Value]]


# --- pipelining -----------------------------------------------------------------------

def check_stages(stages: object, weights: Sequence[int]) -> int:
    """Validate a ``stages`` parameter against a datapath of ``len(weights)`` steps."""
    if not isinstance(stages, int) or isinstance(stages, bool) \
            or not 1 <= stages <= len(weights):
        raise ValueError(f"stages must be an integer from 1 to {len(weights)}, not {stages!r}")
    return stages


def cut_points(weights: Sequence[int], stages: int) -> tuple[int, ...]:
    """Indices of the steps after which a register goes, besides the output register.

    Chooses the ``stages - 1`` cuts that minimise the heaviest stage (summed step
    weights, a rough logic-depth estimate); ties go to the earliest cuts, so the
    placement is deterministic.
    """
    best: tuple[int, tuple[int, ...]] | None = None
    for cuts in itertools.combinations(range(len(weights) - 1), stages - 1):
        bounds = (-1, *cuts, len(weights) - 1)
        worst = max(sum(weights[lo + 1:hi + 1]) for lo, hi in itertools.pairwise(bounds))
        if best is None or worst < best[0]:
            best = (worst, cuts)
    assert best is not None
    return best[1]


def pipeline(m: Module, *, i: stream.Interface, o: stream.Interface,
             steps: Sequence[Step], weights: Sequence[int], stages: int) -> None:
    """Build a ``stages``-deep pipeline from ``i`` to ``o`` out of ``steps``.

    The first step receives the fields of ``i.payload`` (a struct); the last returns
    ``{"result": value}``, which loads ``o.payload``. Each stage has a valid bit and
    loads when it is empty or its successor loads (``~valid | next_load``), so a stage
    holds its payload while stalled, bubbles are squeezed out and a stream of operands
    moves at one per cycle with latency ``stages``. ``i.ready`` follows ``o.ready``
    combinationally through that chain; ``o.valid`` and ``o.payload`` are registers.
    """
    cuts = cut_points(weights, stages)
    valids = [Signal(name=f"stage{k}_valid") for k in range(stages - 1)] + [o.valid]
    load = [Signal(name=f"stage{k}_load") for k in range(stages)]
    m.d.comb += load[-1].eq(~o.valid | o.ready)
    for k in reversed(range(stages - 1)):
        m.d.comb += load[k].eq(~valids[k] | load[k + 1])
    m.d.comb += i.ready.eq(load[0])

    values: Mapping[str, Value] = {name: i.p[name] for name in i.p.shape().members}
    stage = 0
    for index, step in enumerate(steps):
        values = step(m, values)
        if index != len(steps) - 1 and index not in cuts:
            continue
        upstream_valid = i.valid if stage == 0 else valids[stage - 1]
        with m.If(load[stage]):
            m.d.sync += valids[stage].eq(upstream_valid)
        if stage == stages - 1:
            with m.If(load[stage]):
                m.d.sync += o.payload.eq(values["result"])
            break
        registered = {}
        for name, value in values.items():
            value = Value.cast(value)
            reg = Signal(value.shape(), name=f"stage{stage}_{name}", reset_less=True)
            with m.If(load[stage]):
                m.d.sync += reg.eq(value)
            registered[name] = reg
        values = registered
        stage += 1


# --- width-clean arithmetic -----------------------------------------------------------
#
# The generated Verilog must lint clean under ``verilator -Wall``, which flags any
# operand narrower than its operator (except a 1-bit carry and the natural carry-out
# bit). Amaranth's backend strips constant extension bits from operands (and constants
# to their minimal width), so padding does not help. The helpers below only ever emit
# operators on equal-width operands or with a 1-bit operand; wider results are built by
# splitting an addition into a low part and a carry/borrow into the high part.
# Exponents are ``EXP_WIDTH``-bit two's-complement values; these helpers compute modulo
# ``2**width`` and the callers keep the true values inside that range.

#: Width of the signed working exponents: every intermediate lies in [-300, 510].
EXP_WIDTH = 11


def _operand(x: Value | int) -> Value:
    if isinstance(x, int):
        return C(x, max(1, x.bit_length()))
    return Value.cast(x).as_unsigned()


def negative(x: Value) -> Value:
    """Sign of a two's-complement value."""
    return Value.cast(x)[-1]


def shift_left(m: Module, x: Value, amount: Value, name: str) -> Value:
    """``x << amount`` truncated to ``len(x)`` bits, as a logarithmic shifter."""
    x = Value.cast(x)
    width = len(x)
    for index, bit in enumerate(Value.cast(amount)):
        step = 1 << index
        shifted = Cat(C(0, step), x[:width - step]) if step < width else C(0, width)
        x = signal(m, Mux(bit, shifted, x), f"{name}_{index}")
    return x


def shift_right_sticky(x: Value, amount: Value) -> tuple[Value, Value]:
    """``x >> amount`` (any amount above ``len(x)`` acts as ``len(x)``) and the OR of the
    bits shifted out."""
    width = len(x)
    amount = _operand(amount)
    clamped = Mux(amount > width, width, amount)[:width.bit_length()]
    wide = Cat(C(0, width), x) >> clamped
    return wide[width:], wide[:width].any()


def lzc(m: Module, x: Value, name: str) -> Value:
    """Leading-zero count of ``x`` (``len(x)`` when ``x`` is zero), as a balanced tree."""
    width = len(x)
    size = max(2, 1 << (width - 1).bit_length())
    padded = Cat(C(0, size - width), x)

    def tree(v: Value, path: str) -> tuple[Value, Value]:
        # (count, all-zero); count is only meaningful when the slice is not all zero.
        if len(v) == 2:
            return ~v[1], ~v.any()
        half = len(v) // 2
        count_hi, zero_hi = tree(v[half:], path + "h")
        count_lo, zero_lo = tree(v[:half], path + "l")
        zero_hi = signal(m, zero_hi, f"{name}_z{path}h")
        return (signal(m, Cat(Mux(zero_hi, count_lo, count_hi), zero_hi), f"{name}_c{path}"),
                zero_hi & zero_lo)

    count, zero = tree(padded, "")
    return Mux(zero, width, count)


# --- binary32 helpers -------------------------------------------------------------------

def signal(m: Module, value: Value, name: str, shape=None) -> Signal:
    """A named combinational signal holding ``value`` (shared, and readable in waves)."""
    sig = Signal(shape if shape is not None else Value.cast(value).shape(), name=name)
    m.d.comb += sig.eq(value)
    return sig


def unpack(m: Module, x: Value, prefix: str) -> dict[str, Value]:
    """Fields and classes of one binary32 encoding."""
    exp = x[FRAC_BITS:31]
    frac = x[:FRAC_BITS]
    exp_zero = signal(m, ~exp.any(), f"{prefix}_exp_zero")
    exp_ones = exp.all()
    return {
        "sign": x[31],
        "exp": exp,
        "frac": frac,
        # The exponent a subnormal shares with the smallest normal.
        "exp_eff": signal(m, Mux(exp_zero, 1, exp), f"{prefix}_exp_eff"),
        "mant": signal(m, Cat(frac, ~exp_zero), f"{prefix}_mant"),
        "zero": signal(m, exp_zero & ~frac.any(), f"{prefix}_zero"),
        "inf": signal(m, exp_ones & ~frac.any(), f"{prefix}_inf"),
        "nan": signal(m, exp_ones & frac.any(), f"{prefix}_nan"),
    }


def normalize_operand(m: Module, x: Value, prefix: str) -> dict[str, Value]:
    """Unpack ``x`` and bring a subnormal significand up to ``1.f`` form.

    Returns the 24-bit significand ``mant`` with its leading one at bit 23 (zero for a
    zero input) and the signed biased exponent ``exp`` that goes with it (below 1 for
    subnormals), besides the sign and the special-value classes.
    """
    f = unpack(m, x, prefix)
    shift = signal(m, lzc(m, f["mant"], f"{prefix}_lz"), f"{prefix}_lz")
    return {
        "sign": f["sign"],
        "mant": shift_left(m, f["mant"], shift, f"{prefix}_norm"),
        "exp": signal(m, f["exp_eff"] - shift, f"{prefix}_exp", signed(EXP_WIDTH)),
        "zero": f["zero"], "inf": f["inf"], "nan": f["nan"],
    }


def round_pack(m: Module, *, sign: Value, exp: Value, mant: Value, sticky: Value) -> Value:
    """Round a normalized result to binary32, nearest-even, with gradual underflow.

    ``mant`` has its leading one at the top bit (width at least 25) and ``exp`` is the
    ``EXP_WIDTH``-bit signed biased exponent of that bit; ``sticky`` is the OR of every
    bit below ``mant``. Exponents below 1 shift the significand right into the subnormal
    range before rounding (collecting sticky bits); a rounding carry may promote a
    subnormal to the smallest normal or the largest normal to infinity, as IEEE-754
    requires.
    """
    width = len(mant)
    exp = Value.cast(exp).as_unsigned()
    tiny = signal(m, negative(exp) | ~exp.any(), "tiny")
    huge = signal(m, ~negative(exp) & (exp[:-1] >= 0xFF), "huge")
    # 1 - exp: the distance below the smallest normal exponent.
    below = signal(m, (1 - exp)[:EXP_WIDTH], "below")
    shifted, lost = shift_right_sticky(mant, Mux(tiny, below, 0))
    shifted = signal(m, shifted, "denormal")
    frac = shifted[width - 1 - FRAC_BITS:width - 1]
    guard = shifted[width - 2 - FRAC_BITS]
    rest = shifted[:width - 2 - FRAC_BITS].any() if width > 2 + FRAC_BITS else C(0, 1)
    increment = guard & (rest | lost | sticky | frac[0])
    # The exponent field and fraction form one integer: the rounding carry runs from
    # the fraction into the exponent, and from the largest normal into infinity.
    rounded = signal(m, (Cat(frac, Mux(tiny, 0, exp[:EXP_BITS])) + increment)[:31], "rounded")
    return Cat(Mux(huge, INF, rounded), sign)
