"""Running a block test in the Amaranth simulator: one definition of the set-up every
fast-tier bench shares."""

from __future__ import annotations

from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

__all__ = ["simulate"]


def simulate(dut, *testbenches) -> None:
    """Run ``testbenches`` (async functions of the simulator context) against ``dut``
    with one ``sync`` clock domain of 100 MHz, until the last of them returns."""
    top = Module()
    top.domains.sync = ClockDomain("sync")
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-8)
    for bench in testbenches:
        sim.add_testbench(bench)
    sim.run()
