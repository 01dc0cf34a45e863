"""Pipelined binary32 multiplier."""

from amaranth.hdl import C, Cat, Mux, signed

from .fp32 import (
    BIAS,
    EXP_WIDTH,
    INF,
    QNAN,
    normalize_operand,
    round_pack,
    signal,
)
from .pipelined import PipelinedBinaryOp

__all__ = ["FpMul"]


class FpMul(PipelinedBinaryOp):
    """``a * b`` in binary32, one result per cycle.

    Latency is ``stages`` cycles from an accepted operand pair to its result, and the
    pipeline accepts one pair per cycle while the sink keeps up. Each stage has a valid
    bit and loads when empty or when its successor loads, so backpressure stalls only
    the stages that are full; ``i_operands.ready`` depends combinationally on
    ``o_result.ready``. Reset empties the pipeline. Results are in operand order.

    Numerics (``docs/numerics.md``): round-to-nearest-even on the exact 48-bit product;
    subnormal operands are normalized first and subnormal results are produced by
    gradual underflow (rounded once, after denormalization); overflow gives a signed
    infinity; ``0 * inf`` and any NaN operand give :data:`~hw.arith.fp32.QNAN`; the sign
    of a zero or infinite result is the XOR of the operand signs. Bit-identical to
    numpy float32 ``a * b`` except for NaN payloads.

    Parameters
    ----------
    stages : int
        Register stages, 1 to 4 (default 3). The datapath is four steps (normalize
        operands, 24x24 multiply, align, round).

    Members
    -------
    i_operands : ``In(stream.Signature(OPERANDS))``
        ``.p.a``, ``.p.b``: binary32 encodings.
    o_result : ``Out(stream.Signature(32))``
        The rounded product.

    Raises
    ------
    ValueError
        If ``stages`` is not an integer from 1 to 4.
    """

    WEIGHTS = (3, 4, 1, 3)
    STEPS = ('_normalize', '_multiply', '_align', '_round',)

    def __init__(self, *, stages: int = 3):
        super().__init__(stages=stages)

    @staticmethod
    def _normalize(m, v):
        a = normalize_operand(m, v["a"], "a")
        b = normalize_operand(m, v["b"], "b")
        sign = a["sign"] ^ b["sign"]
        nan = a["nan"] | b["nan"] | (a["inf"] & b["zero"]) | (a["zero"] & b["inf"])
        inf = a["inf"] | b["inf"]
        return {
            "sign": sign, "ma": a["mant"], "mb": b["mant"],
            "exp": signal(m, a["exp"] + b["exp"] - BIAS, "exp", signed(EXP_WIDTH)),
            # Special results: NaN, a signed infinity, or a signed zero.
            "special": nan | inf | a["zero"] | b["zero"], "nan": nan, "inf": inf,
        }

    @staticmethod
    def _multiply(m, v):
        product = signal(m, v["ma"] * v["mb"], "product")
        return {k: v[k] for k in ("sign", "exp", "special", "nan", "inf")} | {"product": product}

    @staticmethod
    def _align(m, v):
        # 1.x * 1.y lies in [1, 4): bring the leading one to bit 47.
        product = v["product"]
        exp = signal(m, v["exp"] + product[47], "product_exp", signed(EXP_WIDTH))
        return {**v, "product": Mux(product[47], product, product << 1)[:48], "exp": exp}

    @staticmethod
    def _round(m, v):
        result = round_pack(m, sign=v["sign"], exp=v["exp"], mant=v["product"], sticky=C(0, 1))
        special = Mux(v["nan"], QNAN, Cat(Mux(v["inf"], INF, 0), v["sign"]))
        return {"result": Mux(v["special"], special, result)}
