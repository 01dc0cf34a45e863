"""Pipelined binary32 maximum (``numpy.maximum``)."""

from amaranth.hdl import Mux

from .fp32 import QNAN, unpack
from .pipelined import PipelinedBinaryOp

__all__ = ["FpMax"]


class FpMax(PipelinedBinaryOp):
    """``numpy.maximum(a, b)`` in binary32, one result per cycle.

    Latency is ``stages`` cycles from an accepted operand pair to its result, and the
    pipeline accepts one pair per cycle while the sink keeps up. Each stage has a valid
    bit and loads when empty or when its successor loads, so backpressure stalls only
    the stages that are full; ``i_operands.ready`` depends combinationally on
    ``o_result.ready``. Reset empties the pipeline. Results are in operand order.

    Numerics (``docs/numerics.md``): a NaN in either operand gives
    :data:`~hw.arith.fp32.QNAN` (numpy propagates the NaN operand's payload instead).
    Otherwise the result is ``a`` if ``a > b`` numerically, else ``b``: operands that
    compare equal return ``b``, so ``maximum(+0, -0) = -0`` and
    ``maximum(-0, +0) = +0``, which is what numpy 2.3 float32 does on x86 (SIMD and
    scalar loops alike; ``tests/test_arith.py`` pins it).

    Parameters
    ----------
    stages : int
        Register stages, 1 or 2 (default 1): compare, then select.

    Members
    -------
    i_operands : ``In(stream.Signature(OPERANDS))``
        ``.p.a``, ``.p.b``: binary32 encodings.
    o_result : ``Out(stream.Signature(32))``
        The larger operand, bit for bit.

    Raises
    ------
    ValueError
        If ``stages`` is not 1 or 2.
    """

    WEIGHTS = (2, 1)
    STEPS = ('_compare', '_select',)

    def __init__(self, *, stages: int = 1):
        super().__init__(stages=stages)

    @staticmethod
    def _key(x):
        # Sign-magnitude to an unsigned order: negatives reversed below positives.
        return Mux(x[31], ~x, x | 0x8000_0000)

    @classmethod
    def _compare(cls, m, v):
        a, b = unpack(m, v["a"], "a"), unpack(m, v["b"], "b")
        # -0 and +0 have different keys but compare equal.
        both_zero = a["zero"] & b["zero"]
        return {**v, "nan": a["nan"] | b["nan"],
                "a_greater": (cls._key(v["a"]) > cls._key(v["b"])) & ~both_zero}

    @staticmethod
    def _select(m, v):
        return {"result": Mux(v["nan"], QNAN, Mux(v["a_greater"], v["a"], v["b"]))}
