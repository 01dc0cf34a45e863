"""bfloat16 -> binary32 widening."""

from amaranth.hdl import C, Cat, Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .fp32 import BF16_OPERAND, pipeline

__all__ = ["Bf16ToFp32"]


class Bf16ToFp32(wiring.Component):
    """Widen a bfloat16 value to binary32 exactly, one result per cycle.

    Latency is one cycle (a registered output); the block accepts one operand per cycle
    while the sink keeps up and holds its result under backpressure
    (``i_operands.ready = ~o_result.valid | o_result.ready``). Reset empties it.

    Numerics (``docs/numerics.md``): every bfloat16 value, subnormals included, is a
    binary32 value, so the result is the operand with 16 zero bits appended; NaNs keep
    their sign and payload (a signalling NaN stays signalling), exactly as
    ``ml_dtypes.bfloat16.astype(float32)`` does.

    Members
    -------
    i_operands : ``In(stream.Signature(BF16_OPERAND))``
        ``.p.a``: a bfloat16 encoding.
    o_result : ``Out(stream.Signature(32))``
        The binary32 encoding.
    """

    i_operands: In(stream.Signature(BF16_OPERAND))
    o_result: Out(stream.Signature(32))

    #: Cycles from an accepted operand to its result, and between back-to-back results.
    latency = 1
    interval = 1

    def elaborate(self, platform):
        m = Module()
        pipeline(m, i=self.i_operands, o=self.o_result, weights=(1,), stages=1,
                 steps=[lambda m, v: {"result": Cat(C(0, 16), v["a"])}])
        return m
