"""AXI4 and AXI4-Lite signatures with AMBA signal names.

Inside the device every channel is an ``amaranth.lib.stream``; at its edges the PMEM
port and the CSR port use flat AMBA names (``awvalid``, ``awaddr``, ...), so the
generated Verilog has ports ``pmem__awaddr``, ``csr__rdata`` that FPGA flows and
cocotbext-axi (``bus_separator="__"``) recognise without a wrapper.

Both signatures are written from the manager's side (``Out`` = driven by the manager);
a subordinate uses ``In(sig)`` / ``sig.flip()``.
"""

from __future__ import annotations

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ADDR_FIELDS", "AXI4LiteSignature", "AXI4Signature", "AxiBurst", "AxiResp"]

#: The AR / AW payload members of :class:`AXI4Signature` besides ``id`` (after the
#: ``ar`` / ``aw`` prefix).
ADDR_FIELDS = ("addr", "len", "size", "burst", "lock", "cache", "prot")


class AxiResp:
    OKAY = 0b00
    EXOKAY = 0b01
    SLVERR = 0b10
    DECERR = 0b11


class AxiBurst:
    FIXED = 0b00
    INCR = 0b01
    WRAP = 0b10


class AXI4Signature(wiring.Signature):
    """Full AXI4 manager interface (no user signals, no QoS/region).

    Parameters
    ----------
    addr_width, data_width, id_width:
        Byte-address, data and ID widths. ``data_width`` is a multiple of 8.
    """

    def __init__(self, *, addr_width: int, data_width: int, id_width: int):
        if data_width % 8 or data_width <= 0:
            raise ValueError(f"data_width must be a positive multiple of 8, not {data_width}")
        if addr_width <= 0:
            raise ValueError(f"addr_width must be positive, not {addr_width}")
        if id_width <= 0:
            raise ValueError(f"id_width must be positive, not {id_width}")
        self._addr_width = addr_width
        self._data_width = data_width
        self._id_width = id_width
        addr_members = lambda p: {
            f"{p}valid": Out(1), f"{p}ready": In(1), f"{p}id": Out(id_width),
            f"{p}addr": Out(addr_width), f"{p}len": Out(8), f"{p}size": Out(3),
            f"{p}burst": Out(2), f"{p}lock": Out(1), f"{p}cache": Out(4), f"{p}prot": Out(3),
        }
        super().__init__({
            **addr_members("aw"),
            "wvalid": Out(1), "wready": In(1), "wdata": Out(data_width),
            "wstrb": Out(data_width // 8), "wlast": Out(1),
            "bvalid": In(1), "bready": Out(1), "bid": In(id_width), "bresp": In(2),
            **addr_members("ar"),
            "rvalid": In(1), "rready": Out(1), "rid": In(id_width), "rdata": In(data_width),
            "rresp": In(2), "rlast": In(1),
        })

    addr_width = property(lambda self: self._addr_width)
    data_width = property(lambda self: self._data_width)
    id_width = property(lambda self: self._id_width)

    def __eq__(self, other):
        return (isinstance(other, AXI4Signature) and
                (self.addr_width, self.data_width, self.id_width) ==
                (other.addr_width, other.data_width, other.id_width))

    def __repr__(self):
        return (f"AXI4Signature(addr_width={self.addr_width}, data_width={self.data_width}, "
                f"id_width={self.id_width})")


class AXI4LiteSignature(wiring.Signature):
    """AXI4-Lite manager interface, 32-bit data.

    Parameters
    ----------
    addr_width:
        Byte-address width.
    """

    def __init__(self, *, addr_width: int, data_width: int = 32):
        if data_width not in (32, 64):
            raise ValueError(f"data_width must be 32 or 64, not {data_width}")
        if addr_width <= 0:
            raise ValueError(f"addr_width must be positive, not {addr_width}")
        self._addr_width = addr_width
        self._data_width = data_width
        super().__init__({
            "awvalid": Out(1), "awready": In(1), "awaddr": Out(addr_width), "awprot": Out(3),
            "wvalid": Out(1), "wready": In(1), "wdata": Out(data_width),
            "wstrb": Out(data_width // 8),
            "bvalid": In(1), "bready": Out(1), "bresp": In(2),
            "arvalid": Out(1), "arready": In(1), "araddr": Out(addr_width), "arprot": Out(3),
            "rvalid": In(1), "rready": Out(1), "rdata": In(data_width), "rresp": In(2),
        })

    addr_width = property(lambda self: self._addr_width)
    data_width = property(lambda self: self._data_width)

    def __eq__(self, other):
        return (isinstance(other, AXI4LiteSignature) and
                (self.addr_width, self.data_width) == (other.addr_width, other.data_width))

    def __repr__(self):
        return f"AXI4LiteSignature(addr_width={self.addr_width}, data_width={self.data_width})"
