"""A component's ports as plain top-level signals, for converting one whose signature
has constant members (an ``always_ready`` stream's ``ready``) to Verilog: a constant
cannot be a port of the top module."""

from __future__ import annotations

from amaranth.hdl import Const, Module, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["FlatPorts"]


class FlatPorts(wiring.Component):
    """``dut`` with every non-constant port as a port named by its path (``i_x__valid``)."""

    def __init__(self, dut: wiring.Component):
        self._dut = dut
        self._members = [("__".join(map(str, path)), member, value)
                         for path, member, value in dut.signature.flatten(dut)
                         if not isinstance(value, Const)]
        super().__init__({name: (In if member.flow == In else Out)(len(Value.cast(value)))
                          for name, member, value in self._members})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self._dut
        for name, member, value in self._members:
            port = getattr(self, name)
            m.d.comb += value.eq(port) if member.flow == In else port.eq(value)
        return m
