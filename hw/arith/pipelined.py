"""Base of the arithmetic units that return one result per cycle."""

# (No ``from __future__ import annotations``: wiring.Component reads the port
# annotations below as objects.)

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .fp32 import OPERANDS, check_stages, pipeline

__all__ = ["PipelinedBinaryOp"]


class PipelinedBinaryOp(wiring.Component):
    """A binary32 operation built from datapath steps and ``stages`` register stages.

    Subclasses name their combinational steps in ``STEPS`` (methods taking ``(m,
    values)``) with a relative logic depth each in ``WEIGHTS``; :func:`~.fp32.pipeline`
    places the registers. Latency is ``stages`` cycles, throughput one operand pair
    per cycle; a stalled output holds one operation per stage.
    """

    WEIGHTS: tuple[int, ...] = ()
    STEPS: tuple[str, ...] = ()

    i_operands: In(stream.Signature(OPERANDS))
    o_result: Out(stream.Signature(32))

    #: Cycles between results of a back-to-back stream.
    interval = 1

    def __init__(self, *, stages: int):
        self._stages = check_stages(stages, self.WEIGHTS)
        super().__init__()

    @property
    def stages(self) -> int:
        return self._stages

    @property
    def latency(self) -> int:
        """Cycles from an accepted operand pair to its result."""
        return self._stages

    def elaborate(self, platform):
        m = Module()
        pipeline(m, i=self.i_operands, o=self.o_result, weights=self.WEIGHTS,
                 stages=self._stages, steps=[getattr(self, name) for name in self.STEPS])
        return m
