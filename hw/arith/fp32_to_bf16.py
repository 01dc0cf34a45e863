"""binary32 -> bfloat16 narrowing with round-to-nearest-even."""

from amaranth.hdl import Cat, Module, Mux
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .fp32 import BF16_QNAN, OPERAND, pipeline, unpack

__all__ = ["Fp32ToBf16"]


class Fp32ToBf16(wiring.Component):
    """Round a binary32 value to bfloat16, nearest-even, one result per cycle.

    Latency is one cycle (a registered output); the block accepts one operand per cycle
    while the sink keeps up and holds its result under backpressure
    (``i_operands.ready = ~o_result.valid | o_result.ready``). Reset empties it.

    Numerics (``docs/numerics.md``): the low 16 bits are rounded away to nearest-even;
    bf16 has binary32's exponent range, so subnormals stay subnormal (no flush) and a
    value at or above the midpoint between the largest bf16 and 2^128 becomes a signed
    infinity. Any NaN gives the quiet NaN ``0x7FC0`` (ml_dtypes keeps the sign and the
    top of the payload). Otherwise bit-identical to ``ml_dtypes.bfloat16``.

    Members
    -------
    i_operands : ``In(stream.Signature(OPERAND))``
        ``.p.a``: a binary32 encoding.
    o_result : ``Out(stream.Signature(16))``
        The bfloat16 encoding.
    """

    i_operands: In(stream.Signature(OPERAND))
    o_result: Out(stream.Signature(16))

    #: Cycles from an accepted operand to its result, and between back-to-back results.
    latency = 1
    interval = 1

    def elaborate(self, platform):
        m = Module()
        pipeline(m, i=self.i_operands, o=self.o_result, weights=(1,), stages=1,
                 steps=[self._round])
        return m

    @staticmethod
    def _round(m, v):
        x = v["a"]
        # Nearest-even on the 16 dropped bits; the carry runs into the exponent and, from
        # the largest finite values, into infinity. It never reaches the sign bit because
        # the largest non-NaN magnitude is 0x7F800000.
        increment = x[15] & (x[:15].any() | x[16])
        rounded = (x[16:31] + increment)[:15]
        return {"result": Mux(unpack(m, x, "a")["nan"], BF16_QNAN, Cat(rounded, x[31]))}
