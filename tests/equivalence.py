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
