"""Small building blocks several blocks share.

Blocks write plain operators (``make lint`` waives Verilator's WIDTH warnings for
Amaranth's output, ``sim/lint.py``). ``at_least`` is ``>=`` against a constant, folded
where the operand's width decides it (a plain comparison that can never be true is
Verilator's CMPCONST warning).

Also the small building blocks several blocks share: parameter checks (``is_int``,
``is_pow2``, ``check_int``, ``check_pow2``), and named combinational nodes (``named``,
``lowest_set``, ``onehot``, ``select_bit``), since Amaranth emits an expression once per
use.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal, Value

__all__ = ["at_least", "check_int", "check_pow2", "is_int", "is_pow2",
           "lowest_set", "named", "onehot", "select_bit"]


def at_least(value, const: int):
    """Unsigned ``value >= const`` for a constant ``const > 0``, folded to a constant
    where the width decides it: a plain ``>=`` against a constant that the operand's
    width cannot reach is what Verilator reports as CMPCONST."""
    value = Value.cast(value).as_unsigned()
    width = const.bit_length()
    if len(value) < width:
        return C(0, 1)
    if len(value) == width:
        return value >= const
    return value[width:].any() | (value[:width] >= const)




def is_int(value) -> bool:
    """``value`` is an ``int`` and not a ``bool`` (for parameter validation)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value, lo: int, hi: int) -> int:
    """``value`` if it is an ``int`` from ``lo`` to ``hi``; otherwise a ``ValueError``
    naming the parameter and the bad value (for constructors' parameter checks)."""
    if not is_int(value) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer from {lo} to {hi}, not {value!r}")
    return value


def check_pow2(name: str, value, lo: int, hi: int) -> int:
    """As :func:`check_int`, and ``value`` a power of two."""
    check_int(name, value, lo, hi)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two, not {value}")
    return value


def is_pow2(value) -> bool:
    """``value`` is an ``int`` power of two."""
    return is_int(value) and value > 0 and value & (value - 1) == 0


def select_bit(m, vector, index, name: str):
    """``vector[index]`` for a signal ``index``, with the shift at full width for lint."""
    shifted = Signal(len(vector), name=name)
    m.d.comb += shifted.eq(vector >> index)
    return shifted[0]


def named(m: Module, value, name: str) -> Signal:
    """``value`` as a named combinational signal. Amaranth emits an expression once per
    use (no common subexpressions), so a value used in several places gets a name."""
    sig = Signal(len(value), name=name)
    m.d.comb += sig.eq(value)
    return sig


def lowest_set(m: Module, vector, name: str) -> tuple[Signal, Signal]:
    """``(any, index)`` of the lowest set bit of ``vector`` (a power-of-two number of bits,
    at least 2): a tree of depth log2(len) with a named signal per node, because Amaranth
    emits an expression once per use and a shared subtree would grow exponentially."""
    width = len(vector).bit_length() - 1
    vector = named(m, vector, f"{name}_in")
    any_, idx = Signal(name=f"{name}_any"), Signal(width, name=f"{name}_idx")
    if len(vector) == 2:
        m.d.comb += [any_.eq(vector[0] | vector[1]), idx.eq(~vector[0])]
    else:
        half = len(vector) // 2
        lo_any, lo_idx = lowest_set(m, vector[:half], f"{name}_l")
        hi_any, hi_idx = lowest_set(m, vector[half:], f"{name}_h")
        m.d.comb += [any_.eq(lo_any | hi_any),
                     idx.eq(Cat(Mux(lo_any, lo_idx, hi_idx), ~lo_any))]
    return any_, idx


_ONEHOT_FLAT = 64


def onehot(m: Module, index, n: int, name: str) -> Signal:
    """``n``-bit one-hot decode of ``index`` (all zero for ``index >= n``).

    Up to 64 outputs, one comparison per output; above, two levels: the low six bits
    and the rest of ``index`` are decoded apart, and each 64-output group is the low
    decode where the high decode selects the group, so the decode grows as ``n`` and
    not as ``n * log2(n)``."""
    index = Value.cast(index).as_unsigned()
    out = Signal(n, name=name)
    low = _ONEHOT_FLAT.bit_length() - 1
    if n <= _ONEHOT_FLAT or len(index) <= low:
        m.d.comb += out.eq(Cat(*(index == i for i in range(n))))
        return out
    lo = onehot(m, index[:low], _ONEHOT_FLAT, f"{name}_lo")
    hi = onehot(m, index[low:], -(-n // _ONEHOT_FLAT), f"{name}_hi")
    m.d.comb += out.eq(Cat(*(Mux(hi[j], lo, 0) for j in range(len(hi))))[:n])
    return out
