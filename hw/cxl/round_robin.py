"""Round-robin selection shared by the DCOH's blocks: the first set bit of a vector at or
after a pointer, wrapping."""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Signal

from ..widths import lowest_set, named

__all__ = ["first_from"]


def first_from(m: Module, vector, ptr, name: str) -> tuple[Signal, Signal]:
    """``(any, index)`` of the first set bit of ``vector`` (a power-of-two number of bits,
    at least 2) at or after ``ptr`` (``log2(len(vector))`` bits), wrapping round."""
    n = len(vector)
    # The last bit is at or after any pointer; comparing it would be a constant.
    at_or_after = named(m, Cat(*(ptr <= i for i in range(n - 1)), C(1, 1)),
                        f"{name}_above")
    any_, wide = lowest_set(m, Cat(vector & at_or_after, vector), name)
    return any_, wide[:n.bit_length() - 1]
