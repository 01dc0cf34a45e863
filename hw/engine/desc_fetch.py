"""Descriptor fetch: reads the descriptors the doorbell announces from the ring (in
device memory, or in GPU memory through an :class:`~hw.bus.axi_to_cache.AxiToCache`),
in order, a few ahead of execution."""

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst
from hw.config import LINE_BITS

from .descriptor import Descriptor

__all__ = ["FETCHED", "RING_ORDER_MAX", "DescFetch"]

#: A descriptor, its number (``seq``, counted from 0 since reset) and whether its read
#: failed (``error``: ``desc`` is then all zeros, a NOP).
FETCHED = data.StructLayout({"desc": Descriptor, "seq": 32, "error": 1})

#: Largest ring order: 2**16 descriptors.
RING_ORDER_MAX = 16

_LINE_SHIFT = 6


def slot_mask(m: Module, order, name: str) -> Signal:
    """``2**min(order, RING_ORDER_MAX) - 1`` as a ``RING_ORDER_MAX``-bit signal."""
    mask = Signal(RING_ORDER_MAX, name=name)
    m.d.comb += mask.eq(Cat(*[order > i for i in range(RING_ORDER_MAX)]))
    return mask


class DescFetch(wiring.Component):
    """Fetches descriptor ``seq`` from slot ``seq mod 2**order`` of the ring for every
    ``seq`` below ``tail``, in order, and offers them on ``o_desc``.

    One single-beat read per descriptor, all on AXI ID 0, so they return in order.
    Up to ``depth`` descriptors are requested or buffered at a time (credit counted
    from the AR to the ``o_desc`` transfer), which hides the PMEM latency behind the
    execution of the descriptors before them. ``tail`` is the host's doorbell count;
    the fetch pointer starts at 0 after reset and follows it. An R response other than
    OKAY pulses ``resp_error`` and delivers the descriptor with ``error`` set and every
    field zero (a NOP, which the dispatcher completes with READ_ERROR), so nothing of
    what was read can act.

    Parameters
    ----------
    addr_width : int
        PMEM byte-address bits.
    id_width : int
        AXI ID bits (ID 0 is used).
    depth : int
        Descriptors fetched ahead.

    Members
    -------
    ring_base : ``In(addr_width)``
        Byte address of slot 0 (bits below 6 are ignored).
    ring_order : ``In(5)``
        The ring has ``2**min(ring_order, 16)`` slots.
    tail : ``In(32)``
        Descriptors written by the host (free-running count).
    pmem : ``Out(AXI4Signature(...))``
        Read port (AR, R); AW and W are never used.
    o_desc : ``Out(stream.Signature(FETCHED))``
    busy : ``Out(1)``
        A descriptor is requested, buffered or waiting to be requested.
    resp_error : ``Out(1)``
    """

    def __init__(self, *, addr_width: int, id_width: int, depth: int = 4):
        self._addr_width = addr_width
        self._depth = depth
        super().__init__({
            "ring_base": In(addr_width),
            "ring_order": In(5),
            "tail": In(32),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
            "o_desc": Out(stream.Signature(FETCHED)),
            "busy": Out(1),
            "resp_error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        aw, depth = self._addr_width, self._depth
        axi = self.pmem
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=FETCHED.size, depth=depth)

        fetch_ptr = Signal(32)              # next seq to request
        rseq = Signal(32)               # seq of the next R beat
        credit_bits = depth.bit_length()
        used = Signal(credit_bits)      # requested and not yet taken from o_desc
        ar_pend = Signal()
        araddr = Signal(aw)
        mask = slot_mask(m, self.ring_order, "ring_mask")
        slot = Signal(RING_ORDER_MAX)
        m.d.comb += slot.eq(fetch_ptr[:RING_ORDER_MAX] & mask)
        slot_addr = Signal(aw)
        m.d.comb += slot_addr.eq((self.ring_base & ~C(0x3F, aw)) + (slot << _LINE_SHIFT))

        m.d.comb += [
            axi.arvalid.eq(ar_pend),
            axi.araddr.eq(araddr),
            axi.arid.eq(0),
            axi.arlen.eq(0),
            axi.arsize.eq(_LINE_SHIFT),
            axi.arburst.eq(AxiBurst.INCR),
            axi.rready.eq(1),
            axi.bready.eq(1),
        ]
        issue = Signal()
        m.d.comb += issue.eq((~ar_pend | axi.arready) & (fetch_ptr != self.tail)
                             & (used != depth))
        take = self.o_desc.valid & self.o_desc.ready
        with m.If(axi.arready):
            m.d.sync += ar_pend.eq(0)
        with m.If(issue):
            m.d.sync += [ar_pend.eq(1), araddr.eq(slot_addr),
                         fetch_ptr.eq(fetch_ptr + 1)]
        with m.If(issue & ~take):
            m.d.sync += used.eq(used + 1)
        with m.Elif(~issue & take):
            m.d.sync += used.eq(used - 1)

        beat = FETCHED(fifo.w_data)
        bad = axi.rresp.any()                                   # not OKAY
        m.d.comb += [
            fifo.w_en.eq(axi.rvalid),
            beat.desc.eq(Mux(bad, 0, axi.rdata)),
            beat.seq.eq(rseq),
            beat.error.eq(bad),
            self.resp_error.eq(axi.rvalid & bad),
            self.o_desc.valid.eq(fifo.r_rdy),
            self.o_desc.payload.eq(fifo.r_data),
            fifo.r_en.eq(self.o_desc.ready),
            self.busy.eq(used.any() | (fetch_ptr != self.tail)),
        ]
        with m.If(axi.rvalid):
            m.d.sync += rseq.eq(rseq + 1)
        return m
