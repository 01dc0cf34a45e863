"""An AXI4 manager driven straight from streams, for the test bench's own tests.

:class:`AxiLoop` exposes the PMEM port (``pmem__*``, as the device does) and moves
each AXI channel through a one-entry register slice to or from a stream port, so a
cocotb bench can push AW/W/AR traffic from :class:`~tb.stream.StreamSource` s, take
B/R from :class:`~tb.stream.StreamSink` s, and exercise the PMEM model, the stream
BFMs and the protocol checkers on real generated Verilog.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst
from hw.config import DeviceConfig

__all__ = ["AxiLoop"]

#: AXI size code of a 64-byte beat.
SIZE_64B = 6


class AxiLoop(wiring.Component):
    """AW/W/AR streams in, B/R streams out, one AXI4 manager port between them.

    Every channel passes a register slice (one cycle of latency, full throughput,
    ``ready`` combinational from the downstream side). ``awsize``/``arsize`` are
    64 bytes and bursts INCR.

    Parameters
    ----------
    config:
        Only ``pmem_addr_width`` and ``axi_id_width`` are used.
    """

    def __init__(self, *, config: DeviceConfig):
        self._config = config
        aid, aaddr = config.axi_id_width, config.pmem_addr_width
        addr = data.StructLayout({"id": aid, "addr": aaddr, "len": 8})
        self.w_layout = data.StructLayout({"data": 512, "strb": 64, "last": 1})
        self.b_layout = data.StructLayout({"id": aid, "resp": 2})
        self.r_layout = data.StructLayout({"id": aid, "data": 512, "resp": 2, "last": 1})
        self.addr_layout = addr
        super().__init__({
            "i_aw": In(stream.Signature(addr)),
            "i_w": In(stream.Signature(self.w_layout)),
            "i_ar": In(stream.Signature(addr)),
            "o_b": Out(stream.Signature(self.b_layout)),
            "o_r": Out(stream.Signature(self.r_layout)),
            "pmem": Out(AXI4Signature(addr_width=aaddr, data_width=512, id_width=aid)),
        })

    @staticmethod
    def _slice(m: Module, name: str, i_valid, i_ready, i_payload: dict, o_valid, o_ready,
               o_payload: dict):
        """A forward register slice between two flat valid/ready channels."""
        valid = Signal(name=f"{name}_valid_q")
        regs = {k: Signal(len(v), name=f"{name}_{k}_q") for k, v in o_payload.items()}
        m.d.comb += [o_valid.eq(valid), i_ready.eq(~valid | o_ready)]
        m.d.comb += [o_payload[k].eq(r) for k, r in regs.items()]
        with m.If(~valid | o_ready):
            m.d.sync += valid.eq(i_valid)
            m.d.sync += [r.eq(i_payload[k]) for k, r in regs.items()]

    def elaborate(self, platform):
        m = Module()
        p = self.pmem
        for ch, src in (("aw", self.i_aw), ("ar", self.i_ar)):
            self._slice(m, ch, src.valid, src.ready,
                        {"id": src.p.id, "addr": src.p.addr, "len": src.p.len},
                        getattr(p, f"{ch}valid"), getattr(p, f"{ch}ready"),
                        {k: getattr(p, f"{ch}{k}") for k in ("id", "addr", "len")})
            m.d.comb += [getattr(p, f"{ch}size").eq(SIZE_64B),
                         getattr(p, f"{ch}burst").eq(AxiBurst.INCR)]
        self._slice(m, "w", self.i_w.valid, self.i_w.ready,
                    {"data": self.i_w.p.data, "strb": self.i_w.p.strb, "last": self.i_w.p.last},
                    p.wvalid, p.wready, {"data": p.wdata, "strb": p.wstrb, "last": p.wlast})
        self._slice(m, "b", p.bvalid, p.bready, {"id": p.bid, "resp": p.bresp},
                    self.o_b.valid, self.o_b.ready, {"id": self.o_b.p.id, "resp": self.o_b.p.resp})
        self._slice(m, "r", p.rvalid, p.rready,
                    {"id": p.rid, "data": p.rdata, "resp": p.rresp, "last": p.rlast},
                    self.o_r.valid, self.o_r.ready,
                    {"id": self.o_r.p.id, "data": self.o_r.p.data, "resp": self.o_r.p.resp,
                     "last": self.o_r.p.last})
        return m
