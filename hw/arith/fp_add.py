"""Pipelined binary32 adder."""

from amaranth.hdl import C, Cat, Mux

from .fp32 import (
    FRAC_BITS,
    INF,
    QNAN,
    lzc,
    shift_left,
    shift_right_sticky,
    signal,
    unpack,
)
from .pipelined import PipelinedBinaryOp

__all__ = ["FpAdd"]


class FpAdd(PipelinedBinaryOp):
    """``a + b`` in binary32, one result per cycle.

    Latency is ``stages`` cycles from an accepted operand pair to its result, and the
    pipeline accepts one pair per cycle while the sink keeps up. Each stage has a valid
    bit and loads when empty or when its successor loads, so backpressure stalls only
    the stages that are full; ``i_operands.ready`` depends combinationally on
    ``o_result.ready``. Reset empties the pipeline. Results are in operand order.

    Numerics (``docs/numerics.md``): round-to-nearest-even; subnormal inputs and outputs
    are exact; an exact zero sum of operands with opposite signs is ``+0`` and
    ``-0 + -0 = -0``; overflow gives a signed infinity; ``inf - inf`` and any NaN operand
    give :data:`~hw.arith.fp32.QNAN`. Bit-identical to numpy float32 ``a + b`` except for
    NaN payloads.

    Parameters
    ----------
    stages : int
        Register stages, 1 to 5 (default 3). The datapath is five steps (classify and
        swap, align, add, normalize, round); the cuts balance their logic depth.

    Members
    -------
    i_operands : ``In(stream.Signature(OPERANDS))``
        ``.p.a``, ``.p.b``: binary32 encodings.
    o_result : ``Out(stream.Signature(32))``
        The rounded sum.

    Raises
    ------
    ValueError
        If ``stages`` is not an integer from 1 to 5.
    """

    #: Relative logic depth of each datapath step, for placing the register stages.
    WEIGHTS = (2, 2, 2, 3, 2)
    STEPS = ('_classify', '_align', '_add', '_normalize', '_round',)

    def __init__(self, *, stages: int = 3):
        super().__init__(stages=stages)

    @staticmethod
    def _classify(m, v):
        a, b = unpack(m, v["a"], "a"), unpack(m, v["b"], "b")
        # Order by magnitude so that the aligned operand is never the larger one and an
        # effective subtraction never goes negative.
        swap = signal(m, v["b"][:31] > v["a"][:31], "swap")
        x = {k: Mux(swap, b[k], a[k]) for k in ("sign", "exp_eff", "mant")}
        y = {k: Mux(swap, a[k], b[k]) for k in ("sign", "exp_eff", "mant")}
        x_exp = signal(m, x["exp_eff"], "x_exp")
        y_exp = signal(m, y["exp_eff"], "y_exp")
        nan = a["nan"] | b["nan"] | (a["inf"] & b["inf"] & (a["sign"] ^ b["sign"]))
        # With no NaN around, an infinite operand is the larger one, so x carries the
        # sign of an infinite result.
        return {
            "sign": x["sign"], "sub": x["sign"] ^ y["sign"],
            "exp": x_exp, "diff": (x_exp - y_exp)[:8],
            "mx": x["mant"], "my": y["mant"],
            "special": nan | a["inf"] | b["inf"], "nan": nan,
        }

    @staticmethod
    def _align(m, v):
        # Three bits below the significand: guard, round, and a sticky OR of the rest.
        shifted, sticky = shift_right_sticky(Cat(C(0, 3), v["my"]), v["diff"])
        shifted = signal(m, shifted, "aligned")
        return {**v, "my": Cat(shifted[0] | sticky, shifted[1:])}

    @staticmethod
    def _add(m, v):
        mx = Cat(C(0, 3), v["mx"])
        total = signal(m, Mux(v["sub"], (mx - v["my"])[:28], mx + v["my"]), "total")
        return {k: v[k] for k in ("sign", "sub", "exp", "special", "nan")} | {"total": total}

    @staticmethod
    def _normalize(m, v):
        total, exp = v["total"], v["exp"]
        lz = signal(m, lzc(m, total[:27], "lz"), "lz")
        # Left shift, but never below the subnormal exponent (gradual underflow). A shift
        # of two or more only follows a near-total cancellation, where the sticky bit is
        # known to be zero.
        room = exp[len(lz):].any() | (exp[:len(lz)] > lz)
        shift = signal(m, Mux(room, lz, (exp - 1)[:len(lz)]), "shift")
        carry = total[27]
        norm = signal(m, Mux(carry,
                             # Carry out: one right shift, folding the lost bit into sticky.
                             Cat(total[0] | total[1], total[2:]),
                             shift_left(m, total[:27], shift, "norm")), "norm")
        norm_exp = signal(m, Mux(carry, exp + 1, (exp - shift)[:9]), "norm_exp")
        return {
            # An exact zero from opposite signs is +0 under round-to-nearest.
            "sign": v["sign"] & ~(v["sub"] & ~total.any() & ~v["special"]),
            "norm": norm, "norm_exp": norm_exp,
            "special": v["special"], "nan": v["nan"],
        }

    @staticmethod
    def _round(m, v):
        norm = v["norm"]
        frac, guard = norm[3:26], norm[2]
        increment = guard & (norm[1] | norm[0] | frac[0])
        # A leading zero left after the clamped shift means a subnormal result.
        exp_field = Mux(norm[26], v["norm_exp"], 0)
        rounded = signal(m, (Cat(frac, exp_field) + increment)[:32], "rounded")
        overflow = rounded[FRAC_BITS:] >= 0xFF
        magnitude = Mux(v["special"] | overflow, INF, rounded[:31])
        return {"result": Mux(v["nan"], QNAN, Cat(magnitude, v["sign"]))}
