"""Width-matched comparisons and extensions for lint-clean generated Verilog.

Amaranth emits a constant (and a zero-extended operand) at its minimal width, which
Verilator ``-Wall`` reports as WIDTHEXPAND on every comparison or assignment that
mixes widths. These helpers build the same logic with operands of equal width: they
compare only the constant's own bits and test the bits above it for zero.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Const, Signal

__all__ = ["eq_const", "is_int", "is_pow2", "lt_const", "select_bit", "zext"]


def eq_const(value, const: int):
    """``value == const``."""
    width = const.bit_length()
    if width > len(value):
        return C(0, 1)
    if width == 0:
        return ~value.any()
    high_zero = ~value[width:].any() if width < len(value) else C(1, 1)
    return high_zero & (value[:width] == const)


def lt_const(value, const: int):
    """``value < const`` (unsigned)."""
    width = const.bit_length()
    if width > len(value):
        return C(1, 1)
    if width == 0:
        return C(0, 1)
    high_zero = ~value[width:].any() if width < len(value) else C(1, 1)
    return high_zero & (value[:width] < const)


def zext(value, width: int):
    """``value`` zero-extended (or truncated) to ``width`` bits."""
    value = value.as_value() if hasattr(value, "as_value") else value
    if len(value) >= width:
        return value[:width]
    return Cat(value, Const(0, width - len(value)))


def is_int(value) -> bool:
    """``value`` is an ``int`` and not a ``bool`` (for parameter validation)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_pow2(value) -> bool:
    """``value`` is an ``int`` power of two."""
    return is_int(value) and value > 0 and value & (value - 1) == 0


def select_bit(m, vector, index, name: str):
    """``vector[index]`` for a signal ``index``, with the shift at full width for lint."""
    shifted = Signal(len(vector), name=name)
    m.d.comb += shifted.eq(vector >> index)
    return shifted[0]
