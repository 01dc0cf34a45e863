"""The bag sequencer's PMEM read port, shared by its buffer readers.

See :class:`ReaderArbiter`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..bus.axi import AXI4Signature, AxiBurst
from ..cxl.messages import LINE_BITS
from ..widths import is_int
from .buffer_reader import LINE_SHIFT, read_channel

__all__ = ["ReaderArbiter"]


class ReaderArbiter(wiring.Component):
    """Grants the burst requests of ``readers`` buffer readers onto one AXI read port
    in round-robin order (the first requesting reader after the last one granted,
    cyclically; reader 0 first after reset) and routes each R beat back by its ID:
    reader ``k``'s bursts carry ``arid = k``, so the bursts of one reader return in
    order. Round robin lets readers that start together each get their first burst
    out before any of them takes a second (the bag sequencer's rows need the first
    lines of several buffers).

    **Latency, throughput, backpressure.** The AR channel is a register loaded on
    ``~arvalid | arready``: a request is granted in the cycle it is loaded, so a burst
    leaves one cycle after its grant, and one burst per cycle while ``arready`` is high.
    ``rready`` and ``bready`` are always 1 (a reader's ``r`` is always ready: each
    requests only what it has room for); ``rresp`` is ignored; AW and W are never used. Resets
    with no request pending.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address bits, 12 to 48.
    id_width : int
        AXI ID bits, 1 to 16.
    readers : int
        Readers served, 1 to ``2**id_width``.

    Members
    -------
    i_reader0, i_reader1, ... : ``In(read_channel(addr_width))``
        One per reader.
    pmem : ``Out(AXI4Signature(addr_width=addr_width, data_width=512, id_width=id_width))``

    Raises
    ------
    ValueError
        If a parameter is not an integer in its range.
    """

    def __init__(self, *, addr_width: int, id_width: int, readers: int):
        if not is_int(addr_width) or not 12 <= addr_width <= 48:
            raise ValueError(f"addr_width must be an integer from 12 to 48, not {addr_width!r}")
        if not is_int(id_width) or not 1 <= id_width <= 16:
            raise ValueError(f"id_width must be an integer from 1 to 16, not {id_width!r}")
        if not is_int(readers) or not 1 <= readers <= 1 << id_width:
            raise ValueError(f"readers must be an integer from 1 to {1 << id_width}, "
                             f"not {readers!r}")
        self._addr_width = addr_width
        self._id_width = id_width
        self._readers = readers
        super().__init__({
            **{f"i_reader{k}": In(read_channel(addr_width)) for k in range(readers)},
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
        })

    addr_width = property(lambda self: self._addr_width)
    id_width = property(lambda self: self._id_width)
    readers = property(lambda self: self._readers)

    def elaborate(self, platform):
        m = Module()
        pmem = self.pmem
        readers = [getattr(self, f"i_reader{k}") for k in range(self._readers)]
        m.d.comb += [
            pmem.arsize.eq(LINE_SHIFT),
            pmem.arburst.eq(AxiBurst.INCR),
            pmem.rready.eq(1),
            pmem.bready.eq(1),
        ]
        n = self._readers
        last = Signal(max(1, (n - 1).bit_length()), init=n - 1)   # the last granted
        with m.If(~pmem.arvalid | pmem.arready):
            m.d.sync += pmem.arvalid.eq(0)
            with m.Switch(last):
                for r in range(n):
                    with m.Case(r):
                        for i in range(n):
                            k = (r + 1 + i) % n
                            reader = readers[k]
                            with (m.If if i == 0 else m.Elif)(reader.req):
                                m.d.comb += reader.grant.eq(1)
                                m.d.sync += [
                                    last.eq(k),
                                    pmem.arvalid.eq(1),
                                    pmem.arid.eq(k),
                                    pmem.araddr.eq(Cat(C(0, LINE_SHIFT), reader.line)),
                                    pmem.arlen.eq(reader.len),
                                ]
        for k, reader in enumerate(readers):
            m.d.comb += [reader.r.valid.eq(pmem.rvalid & (pmem.rid == k)),
                         reader.r.payload.eq(pmem.rdata)]
        return m
