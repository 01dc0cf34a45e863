"""Building blocks of the proof harnesses (:mod:`sim.formal`).

Every harness runs in the ``sync`` domain of the block it checks, so its own registers
(the counters below) are reset with the block: a reset of the block is also a reset of
what the harness remembers about it, as the blocks' reset rules require of their
environment (the subordinate, the manager and the DCOH are reset with the block).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, ResetSignal, Signal, Value

__all__ = ["past", "stream_rule", "tally", "width_for"]


def width_for(depth: int) -> int:
    """Bits of a counter that counts at most one event per step of a ``depth``-step proof
    without wrapping."""
    return depth.bit_length()


def past(m: Module, value, name: str) -> Signal:
    """``value`` in the previous cycle (zero in the first): a register that no reset
    clears."""
    value = Value.cast(value)
    reg = Signal(len(value), name=name, reset_less=True)
    m.d.sync += reg.eq(value)
    return reg


def stream_rule(m: Module, kind, name: str, valid, ready, payload=()) -> None:
    """The stream rule on one channel, as ``kind`` (:func:`~amaranth.hdl.Assert` for an
    output of the block, :func:`~amaranth.hdl.Assume` for an input): once ``valid`` is
    high while ``ready`` is low, ``valid`` is high in the next cycle and every value of
    ``payload`` is unchanged. A reset in between releases the channel."""
    stalled = past(m, valid & ~ready & ~ResetSignal(), f"{name}_stalled")
    now = Cat(*payload)
    before = past(m, now, f"{name}_held")
    m.d.comb += kind(~stalled | (valid & (now == before)),
                     f"{name}: valid and payload hold until ready")


def tally(m: Module, name: str, width: int, up, down) -> Signal:
    """A counter of ``width`` bits that rises in a cycle with ``up`` and falls in one with
    ``down`` (unchanged with both)."""
    count = Signal(width, name=name)
    with m.If(up & ~down):
        m.d.sync += count.eq(count + 1)
    with m.Elif(down & ~up):
        m.d.sync += count.eq(count - 1)
    return count
