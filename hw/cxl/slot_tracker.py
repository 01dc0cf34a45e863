"""The CXL.mem endpoint's in-flight slots. See :class:`SlotTracker`."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..widths import is_int
from .endpoint_layouts import dev_load_thresholds

__all__ = ["SlotTracker"]


class SlotTracker(wiring.Component):
    """Hands out the slots (AXI IDs) of the requests in flight on PMEM, takes them back,
    counts them and encodes the count as DevLoad.

    ``o_slot`` offers a free slot whenever there is one: after reset the fresh slots
    0, 1, ..., ``slots - 1`` in order, then the released ones in release order (a
    free-list FIFO). A slot taken in cycle *t* counts from *t* + 1; a slot released on
    ``i_release`` in cycle *t* is uncounted from *t* + 1 and offered again from *t* + 2
    at the earliest. ``o_slot`` obeys the stream rules (the offer holds until taken).
    ``i_release`` has no backpressure: only a slot that was taken may be released, once,
    so the free list never overflows. Reset (synchronous) frees every slot.

    DevLoad (``docs/mem-endpoint.md``, "DevLoad"): Light (00) while the count is below
    ``t1``, Optimal (01) below ``t2``, ModerateOverload (10) below ``t3`` and
    SevereOverload (11) from ``t3`` on, with the thresholds of
    :func:`~hw.cxl.endpoint_layouts.dev_load_thresholds`.

    Parameters
    ----------
    slots:
        Number of slots (a positive int; ``DeviceConfig.max_tags``).

    Members
    -------
    o_slot: ``Out(stream.Signature(range(slots) (at least 1 bit)))``
        A free slot.
    i_release: ``In(stream.Signature(..., always_ready=True))``
        A slot that is free again.
    o_occupancy: ``Out(range(slots + 1))``
        Slots taken and not released.
    o_dev_load: ``Out(2)``
        DevLoad of ``o_occupancy``.

    Raises
    ------
    ValueError
        If ``slots`` is not a positive int.
    """

    def __init__(self, *, slots: int):
        if not is_int(slots) or slots < 1:
            raise ValueError(f"slots must be a positive int, not {slots!r}")
        self._slots = slots
        width = max(1, (slots - 1).bit_length())
        super().__init__({
            "o_slot": Out(stream.Signature(width)),
            "i_release": In(stream.Signature(width, always_ready=True)),
            "o_occupancy": Out(range(slots + 1)),
            "o_dev_load": Out(2),
        })

    @property
    def slots(self) -> int:
        return self._slots

    def elaborate(self, platform):
        m = Module()
        slots = self._slots
        taken = self.o_slot.valid & self.o_slot.ready
        released = self.i_release.valid

        fresh = Signal(range(slots + 1))    # the next never-used slot
        # A depth of at least 3 keeps the address of the FIFO's inner memory (one
        # entry shorter) at least one bit wide: a zero-width address is not legal
        # Verilog. Only one or two slots pay for the unused entries.
        m.submodules.free_list = free_list = SyncFIFOBuffered(width=len(self.o_slot.p),
                                                              depth=max(slots, 3))
        have_fresh = fresh != slots
        m.d.comb += [
            self.o_slot.valid.eq(have_fresh | free_list.r_rdy),
            self.o_slot.p.eq(Mux(have_fresh, fresh, free_list.r_data)),
            free_list.r_en.eq(taken & ~have_fresh),
            free_list.w_en.eq(released),
            free_list.w_data.eq(self.i_release.p),
        ]
        with m.If(taken & have_fresh):
            m.d.sync += fresh.eq(fresh + 1)

        occupancy = self.o_occupancy
        with m.If(taken & ~released):
            m.d.sync += occupancy.eq(occupancy + 1)
        with m.Elif(released & ~taken):
            m.d.sync += occupancy.eq(occupancy - 1)
        t1, t2, t3 = dev_load_thresholds(slots)
        m.d.comb += self.o_dev_load.eq(Mux(occupancy < t1, 0b00,
                                           Mux(occupancy < t2, 0b01,
                                               Mux(occupancy < t3, 0b10, 0b11))))
        return m
