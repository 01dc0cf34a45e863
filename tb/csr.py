"""CSR access by register name over the device's AXI4-Lite port (cocotbext-axi)."""

from __future__ import annotations

import logging

from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from hw.config import DeviceConfig
from hw.csr.registers import register_map

__all__ = ["Csr"]


class Csr:
    """AXI4-Lite manager that addresses registers by the names in ``hw.csr.registers``.

    One :class:`cocotbext.axi.AxiLiteMaster` drives the ``csr__*`` ports; every access
    is a single 32-bit transfer and waits for its response, which must be OKAY.

    Parameters
    ----------
    dut:
        The device top (``csr__awaddr`` ... ``csr__rresp`` ports).
    config:
        The config the Verilog was generated from (selects the register map).
    prefix:
        Port prefix of the AXI4-Lite subordinate.

    Members
    -------
    offsets:
        Register name -> byte offset.
    """

    def __init__(self, dut, config: DeviceConfig, *, prefix: str = "csr"):
        self.config = config
        self.offsets: dict[str, int] = {reg.name: reg.offset for reg in register_map(config)}
        # cocotbext-axi logs its banner and every transfer at INFO; keep test logs readable.
        logging.getLogger(f"cocotb.{dut._name}.{prefix}").setLevel(logging.WARNING)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, prefix, bus_separator="__"),
                                  dut.clk, dut.rst)

    def offset(self, name: str) -> int:
        try:
            return self.offsets[name]
        except KeyError:
            raise KeyError(f"no CSR named {name!r} in the register map of "
                           f"config {self.config.name!r}") from None

    async def read_at(self, offset: int) -> int:
        resp = await self.axil.read(offset, 4)
        assert int(resp.resp) == 0, f"CSR read of {offset:#x} answered {resp.resp!r}"
        return int.from_bytes(resp.data, "little")

    async def write_at(self, offset: int, value: int) -> None:
        resp = await self.axil.write(offset, (value & 0xFFFF_FFFF).to_bytes(4, "little"))
        assert int(resp.resp) == 0, f"CSR write of {offset:#x} answered {resp.resp!r}"

    async def read(self, name: str) -> int:
        return await self.read_at(self.offset(name))

    async def write(self, name: str, value: int) -> None:
        await self.write_at(self.offset(name), value)

    async def read64(self, name: str) -> int:
        """Read a 64-bit pair ``<name>_LO`` / ``<name>_HI`` (or ``name`` at +0/+4).

        LO is read first: the counters snapshot HI when LO is read.
        """
        if f"{name}_LO" in self.offsets:
            lo_off = self.offset(f"{name}_LO")
            hi_off = self.offset(f"{name}_HI")
        else:
            lo_off = self.offset(name)
            hi_off = lo_off + 4
        lo = await self.read_at(lo_off)
        hi = await self.read_at(hi_off)
        return hi << 32 | lo

    async def write64(self, name: str, value: int) -> None:
        """Write a 64-bit pair ``<name>_LO`` / ``<name>_HI`` (LO first)."""
        await self.write(f"{name}_LO", value & 0xFFFF_FFFF)
        await self.write(f"{name}_HI", value >> 32)
