"""Control and status registers: one description generates the RTL bank, docs, JSON and C.

* :mod:`hw.csr.registers` — the register table (:func:`register_map`) and its types.
* :mod:`hw.csr.bank` — :class:`~hw.csr.bank.CsrBank`, the AXI4-Lite register bank.
* :mod:`hw.csr.docgen` — ``docs/registers.md``, ``registers.json`` and ``tcxl_regs.h``.

Only :mod:`hw.csr.registers` is imported here, so that test benches and models can read
the register map without importing the RTL.
"""

from .registers import REGIONS, Field, Kind, Region, Register, RegisterMap, register_map

__all__ = ["REGIONS", "Field", "Kind", "Region", "Register", "RegisterMap", "register_map"]
