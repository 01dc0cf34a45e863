"""CSR access by register name over the device's AXI4-Lite port (cocotbext-axi)."""

from __future__ import annotations

import logging
import random

from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from hw.config import DeviceConfig
from hw.csr.registers import register_map

__all__ = ["Csr", "Fields"]


class Fields(dict):
    """The fields of one register value by lower-case field name (also as attributes:
    ``status.dev_load``); ``raw`` is the whole word."""

    def __init__(self, register: str, raw: int, values: dict[str, int]):
        super().__init__(values)
        self.register = register
        self.raw = raw

    def __getattr__(self, name: str) -> int:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"register {self.register} has no field {name!r}") from None

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v:#x}" for k, v in self.items())
        return f"{self.register}({self.raw:#x}: {inner})"


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
    loop, rng, idle, backpressure:
        With a :class:`~tb.cycle.CycleLoop`, the CSR port gets random idle cycles on
        AW/W/AR (probability ``idle``) and random ``ready``-low cycles on B/R
        (``backpressure``) while an access is in progress.
    io_round_trip:
        Cycles of CXL.io flight around every access (a link, ``tb/link.py``): half
        before the access reaches the port, the rest after its response; needs
        ``loop``. 0: none.

    Members
    -------
    map:
        The :class:`~hw.csr.registers.RegisterMap` of ``config``.
    offsets:
        Word name (``"ID"``, ``"PERF_READS_LO"``, ...) -> byte offset.
    """

    def __init__(self, dut, config: DeviceConfig, *, prefix: str = "csr", loop=None,
                 rng: random.Random | None = None, idle: float = 0.0,
                 backpressure: float = 0.0, io_round_trip: int = 0):
        if io_round_trip and loop is None:
            raise ValueError("io_round_trip needs the cycle loop")
        self.config = config
        self.loop = loop
        self._to_device = io_round_trip // 2
        self._to_host = io_round_trip - self._to_device
        self.map = register_map(config)
        self.offsets: dict[str, int] = {word.name: word.offset for word in self.map.words}
        # cocotbext-axi logs its banner and every transfer at INFO; keep test logs readable.
        logging.getLogger(f"cocotb.{dut._name}.{prefix}").setLevel(logging.WARNING)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, prefix, bus_separator="__"),
                                  dut.clk, dut.rst)
        w, r = self.axil.write_if, self.axil.read_if
        self._sources = (w.aw_channel, w.w_channel, r.ar_channel)
        self._sinks = (w.b_channel, r.r_channel)
        self.rng = rng or random.Random(0)
        self.idle = idle
        self.backpressure = backpressure
        self._paused = False
        if loop is not None:
            loop.add(self)

    def drive(self) -> None:
        """Loop agent: random idle cycles on AW/W/AR and ready-low cycles on B/R while
        an access is in progress (the channels' ``pause``)."""
        noisy = (self.idle or self.backpressure) and not self.axil.idle()
        if not noisy and not self._paused:
            return
        rng = self.rng
        for ch in self._sources:
            ch.pause = bool(noisy and self.idle and rng.random() < self.idle)
        for ch in self._sinks:
            ch.pause = bool(noisy and self.backpressure and rng.random() < self.backpressure)
        self._paused = bool(noisy)

    def offset(self, name: str) -> int:
        try:
            return self.offsets[name]
        except KeyError:
            raise KeyError(f"no CSR named {name!r} in the register map of "
                           f"config {self.config.name!r}") from None

    async def read_raw(self, offset: int) -> tuple[int, int]:
        """One 32-bit read at ``offset``; returns (value, AXI response code)."""
        await self._flight(self._to_device)
        resp = await self.axil.read(offset, 4)
        await self._flight(self._to_host)
        return int.from_bytes(resp.data, "little"), int(resp.resp)

    async def write_raw(self, offset: int, value: int) -> int:
        """One 32-bit write at ``offset``; returns the AXI response code."""
        await self._flight(self._to_device)
        resp = await self.axil.write(offset, (value & 0xFFFF_FFFF).to_bytes(4, "little"))
        await self._flight(self._to_host)
        return int(resp.resp)

    async def _flight(self, cycles: int) -> None:
        if cycles:
            await self.loop.wait_cycles(cycles)

    async def read_at(self, offset: int) -> int:
        value, resp = await self.read_raw(offset)
        assert resp == 0, f"CSR read of {offset:#x} answered {resp} instead of OKAY"
        return value

    async def write_at(self, offset: int, value: int) -> None:
        resp = await self.write_raw(offset, value)
        assert resp == 0, f"CSR write of {offset:#x} answered {resp} instead of OKAY"

    async def read(self, name: str) -> int:
        return await self.read_at(self.offset(name))

    async def write(self, name: str, value: int) -> None:
        await self.write_at(self.offset(name), value)

    def fields(self, name: str, value: int) -> Fields:
        """``value`` of register ``name`` split into its fields (``hw.csr.registers``)."""
        return Fields(name, value, self.map[name].field_values(value))

    async def read_fields(self, name: str) -> Fields:
        """Read register ``name`` and split it into its fields."""
        return self.fields(name, await self.read(name))

    async def write_fields(self, name: str, **values: int) -> None:
        """Write register ``name`` with the named fields set and every other bit 0."""
        await self.write(name, self.map[name].pack(**values))

    async def read64(self, name: str) -> int:
        """Read a 64-bit pair ``<name>_LO`` / ``<name>_HI``.

        LO is read first: the counters snapshot HI when LO is read.
        """
        lo = await self.read_at(self.offset(f"{name}_LO"))
        hi = await self.read_at(self.offset(f"{name}_HI"))
        return hi << 32 | lo

    async def write64(self, name: str, value: int) -> None:
        """Write a 64-bit pair ``<name>_LO`` / ``<name>_HI`` (LO first)."""
        await self.write(f"{name}_LO", value & 0xFFFF_FFFF)
        await self.write(f"{name}_HI", value >> 32)
