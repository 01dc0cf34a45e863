"""Two implementations of one block side by side in the Amaranth simulator: the bench
drives the reference's ports, the other block sees the same inputs, and at every clock
edge every output port of the two must be equal (a simulator assertion)."""

from __future__ import annotations

from amaranth.hdl import Assert, Elaboratable, Format, Module
from amaranth.lib import wiring

__all__ = ["Pair", "ports"]


def ports(dut: wiring.Component, flow) -> list[tuple[str, object]]:
    """``(path, signal)`` of every port of ``dut`` with ``flow`` (``In`` or ``Out``)."""
    return [(".".join(map(str, path)), value)
            for path, member, value in dut.signature.flatten(dut) if member.flow == flow]


class Pair(Elaboratable):
    """``ref`` and ``new`` (components with equal signatures); attributes other than
    these two are the reference's, so a bench written for the block drives the pair."""

    def __init__(self, ref: wiring.Component, new: wiring.Component):
        self.ref = ref
        self.new = new

    def __getattr__(self, name):
        return getattr(self.ref, name)

    def elaborate(self, platform):
        m = Module()
        m.submodules.ref = self.ref
        m.submodules.new = self.new
        for (name, a), (name_b, b) in zip(ports(self.ref, wiring.In),
                                          ports(self.new, wiring.In), strict=True):
            assert name == name_b
            m.d.comb += b.eq(a)
        for (name, a), (_, b) in zip(ports(self.ref, wiring.Out),
                                     ports(self.new, wiring.Out), strict=True):
            m.d.sync += Assert(a == b, Format(f"{name}: new {{}}, reference {{}}", b, a))
        return m


def cases(module, names: list[str]) -> list:
    """``pytest.param(name, kwargs)`` for every parametrization of the test functions
    ``names`` of ``module`` (the ``seed`` fixture and ``tmp_path`` left out)."""
    import pytest

    out = []
    for name in names:
        combos: list[dict] = [{}]
        for mark in getattr(getattr(module, name), "pytestmark", []):
            if mark.name != "parametrize":
                continue
            argnames, values = mark.args
            if isinstance(argnames, str):
                argnames = [a.strip() for a in argnames.split(",")]
            combos = [{**c, **dict(zip(argnames, v if len(argnames) > 1 else (v,),
                                       strict=True))}
                      for c in combos for v in values]
        out += [pytest.param(name, c, id="-".join([name, *map(str, c.values())]))
                for c in combos]
    return out
