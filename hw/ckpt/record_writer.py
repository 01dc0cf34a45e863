"""The undo logger's write path: single-line AXI writes of record lines, and the B
responses that make records durable.

See :class:`RecordWriter`.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst

from .formats import LINE_BITS
from .line_reader import SIZE_LINE

__all__ = ["MAX_WRITES", "RecordWriter", "record_write"]

#: Record writes (AW/W loaded) without their B at most.
MAX_WRITES = 128


def record_write(addr_width: int) -> data.StructLayout:
    """Payload of :attr:`RecordWriter.i_write`."""
    return data.StructLayout({"addr": addr_width, "data": LINE_BITS, "header": 1})


class RecordWriter(wiring.Component):
    """Writes each line of ``i_write`` with one single-beat full-line AXI write and
    reports when a record's header is durable.

    **Flow, latency.** AW and W are registers loaded together when a line is taken;
    ``i_write.ready`` is high when both are empty or being emptied in this cycle and
    fewer than :data:`MAX_WRITES` writes await their B, so one line per cycle while the
    port accepts. ``awlen`` 0, ``wstrb`` all ones, AXI ID 0 (Bs return in order);
    ``awvalid`` and ``wvalid`` do not wait for ``ready``, each drops on its own
    handshake; ``bready`` is always high.

    **Status.** ``records`` pulses with the B of a line taken with ``header`` set (the
    record's payload lines, written before it on the same ID, are durable too);
    ``resp_error`` with a B other than OKAY; ``idle``: no write loaded or awaiting its
    B.

    Parameters
    ----------
    addr_width, id_width : int

    Members
    -------
    i_write : ``In(stream.Signature(record_write(addr_width)))``
    records, resp_error, idle : ``Out(1)``
    pmem : ``Out(AXI4Signature(addr_width, 512, id_width))``
        Write-only (``arvalid`` = 0, ``rready`` = 1).
    """

    def __init__(self, *, addr_width: int, id_width: int):
        super().__init__({
            "i_write": In(stream.Signature(record_write(addr_width))),
            "records": Out(1),
            "resp_error": Out(1),
            "idle": Out(1),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
        })

    def elaborate(self, platform):
        m = Module()
        axi, w = self.pmem, self.i_write
        m.submodules.flags = flags = SyncFIFO(width=1, depth=MAX_WRITES)  # header or not
        load = w.valid & w.ready
        m.d.comb += [
            w.ready.eq((~axi.awvalid | axi.awready) & (~axi.wvalid | axi.wready)
                       & flags.w_rdy),
            axi.awsize.eq(SIZE_LINE),
            axi.awburst.eq(AxiBurst.INCR),
            axi.wstrb.eq((1 << (LINE_BITS // 8)) - 1),
            axi.wlast.eq(1),
            axi.bready.eq(1),
            axi.rready.eq(1),
            flags.w_en.eq(load),
            flags.w_data.eq(w.p.header),
            flags.r_en.eq(axi.bvalid),
            self.records.eq(axi.bvalid & flags.r_rdy & flags.r_data[0]),
            self.resp_error.eq(axi.bvalid & axi.bresp.any()),
            self.idle.eq(~axi.awvalid & ~axi.wvalid & ~flags.r_rdy),
        ]
        with m.If(axi.awready):
            m.d.sync += axi.awvalid.eq(0)
        with m.If(axi.wready):
            m.d.sync += axi.wvalid.eq(0)
        with m.If(load):
            m.d.sync += [axi.awvalid.eq(1), axi.wvalid.eq(1), axi.awaddr.eq(w.p.addr),
                         axi.wdata.eq(w.p.data)]
        return m
