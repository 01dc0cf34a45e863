"""The recovery's read path: single-line AXI reads in the address patterns of the
recovery's phases, and the lines read as a stream.

See :class:`LineReader`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst

from .formats import LINE_BITS

__all__ = ["COUNT_WIDTH", "LineReader", "ReadMode", "read_command"]

#: AXI ``size`` of a 64-byte beat.
SIZE_LINE = 6
#: Width of a command's ``count``: a whole ring of ``2**31`` slots of 255 lines.
COUNT_WIDTH = 40


class ReadMode(enum.Enum, shape=1):
    """Address pattern of a read command."""
    LINEAR = 0      # ``count`` consecutive lines from ``addr``
    SLOTS = 1       # ``count`` slots of ``slot_lines`` lines, from ``addr`` downwards


def read_command(addr_width: int) -> data.StructLayout:
    """Payload of :attr:`LineReader.i_cmd`; the ``last_*`` and ``slot*`` fields are used
    in ``SLOTS`` mode only."""
    return data.StructLayout({
        "mode": ReadMode,
        "addr": addr_width,         # first line (SLOTS: first line of slot ``slot``)
        "count": COUNT_WIDTH,       # lines (LINEAR) or slots (SLOTS)
        "slot": 32,                 # index of the first slot
        "last_slot": 32,            # index of the ring's last slot (the wrap target)
        "last_addr": addr_width,    # its address
        "slot_lines": 8,
    })


class LineReader(wiring.Component):
    """Reads the lines a command names, one single-beat AXI read per line, and passes
    them on in order on ``o_line``.

    **Patterns.** ``LINEAR`` reads ``count`` consecutive lines from ``addr``. ``SLOTS``
    reads all ``slot_lines`` lines of ``count`` slots, slot ``slot`` (at ``addr``) first
    and then the slot below it, wrapping from slot 0 to slot ``last_slot`` (at
    ``last_addr``). A command replaces the one in progress; the recovery sends one only
    when the reader is ``idle``.

    **Flow.** ``i_cmd`` is always ready: the command is taken in the cycle it is valid
    and its first AR is valid in the next cycle. ARs use ID 0 (so R returns in order),
    ``len`` 0, ``size`` 64 bytes; up to ``max_reads`` are issued whose R has not been
    taken (a counter, no buffer), one per cycle while ``arready`` is high. R is taken
    into a one-line register whenever that is empty or being emptied, so ``o_line``
    carries a beat from the cycle after its R, one per cycle while ``o_line.ready`` is
    high; ``o_line.valid`` does not wait for ``ready``. ``stop`` (a level) keeps further
    ARs from being issued; the reads issued still complete.

    **Errors.** ``r_error`` is high in the cycle an R with a response other than OKAY
    is taken (its data is passed on like any other).

    Parameters
    ----------
    addr_width : int
    id_width : int
    max_reads : int
        Reads in flight, 1 to 256.

    Members
    -------
    i_cmd : ``In(stream.Signature(read_command(addr_width), always_ready=True))``
    o_line : ``Out(stream.Signature(LINE_BITS))``
    stop : ``In(1)``
    idle : ``Out(1)``
        No line left to request (or ``stop``), no R outstanding, ``o_line`` empty.
    r_error : ``Out(1)``
    pmem : ``Out(AXI4Signature(addr_width, 512, id_width))``
        Only AR and R are used; the write channels stay idle.
    """

    def __init__(self, *, addr_width: int, id_width: int, max_reads: int):
        if not isinstance(max_reads, int) or not 1 <= max_reads <= 256:
            raise ValueError(f"max_reads must be an integer from 1 to 256, not {max_reads!r}")
        self._addr_width = addr_width
        self._max_reads = max_reads
        super().__init__({
            "i_cmd": In(stream.Signature(read_command(addr_width), always_ready=True)),
            "o_line": Out(stream.Signature(LINE_BITS)),
            "stop": In(1),
            "idle": Out(1),
            "r_error": Out(1),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
        })

    max_reads = property(lambda self: self._max_reads)

    def elaborate(self, platform):
        m = Module()
        axi, cmd, line = self.pmem, self.i_cmd, self.o_line
        aw = self._addr_width
        mode = Signal(ReadMode)
        pend = Signal()                 # an AR waits for arready
        nxt = Signal(aw)                # address of the next AR
        left = Signal(COUNT_WIDTH)      # lines (LINEAR) or slots (SLOTS) to request
        k = Signal(8)                   # SLOTS: line within the slot
        sidx = Signal(32)               # SLOTS: slot index and address
        slot = Signal(aw)
        last_slot = Signal(32)
        last_addr = Signal(aw)
        slot_lines = Signal(8)
        credits = Signal(self._max_reads.bit_length())    # ARs whose R is not taken
        r_take = Signal()

        m.d.comb += [
            axi.arvalid.eq(pend),
            axi.arsize.eq(SIZE_LINE),
            axi.arburst.eq(AxiBurst.INCR),
            axi.rready.eq(~line.valid | line.ready),
            r_take.eq(axi.rvalid & axi.rready),
            self.r_error.eq(r_take & axi.rresp.any()),
            self.idle.eq((~left.any() | self.stop) & ~credits.any() & ~line.valid),
        ]
        issue = Signal()
        m.d.comb += issue.eq((~pend | axi.arready) & left.any() & ~self.stop
                             & (credits < self._max_reads))
        with m.If(axi.arready):
            m.d.sync += pend.eq(0)
        with m.If(issue):
            m.d.sync += [pend.eq(1), axi.araddr.eq(nxt)]
            with m.If((mode == ReadMode.LINEAR) | ((k + 1)[:8] != slot_lines)):
                m.d.sync += nxt.eq(nxt + 64)
                with m.If(mode == ReadMode.LINEAR):
                    m.d.sync += left.eq(left - 1)
                with m.Else():
                    m.d.sync += k.eq(k + 1)
            with m.Else():                                  # the slot's last line
                m.d.sync += [k.eq(0), left.eq(left - 1)]
                with m.If(~sidx.any()):
                    m.d.sync += [sidx.eq(last_slot), slot.eq(last_addr), nxt.eq(last_addr)]
                with m.Else():
                    below = slot - Cat(C(0, 6), slot_lines)
                    m.d.sync += [sidx.eq(sidx - 1), slot.eq(below), nxt.eq(below)]
        with m.If(cmd.valid):
            p = cmd.p
            m.d.sync += [mode.eq(p.mode), nxt.eq(p.addr), left.eq(p.count), k.eq(0),
                         sidx.eq(p.slot), slot.eq(p.addr), last_slot.eq(p.last_slot),
                         last_addr.eq(p.last_addr), slot_lines.eq(p.slot_lines)]
        with m.If(issue & ~r_take):
            m.d.sync += credits.eq(credits + 1)
        with m.Elif(~issue & r_take):
            m.d.sync += credits.eq(credits - 1)

        with m.If(r_take):
            m.d.sync += [line.valid.eq(1), line.payload.eq(axi.rdata)]
        with m.Elif(line.ready):
            m.d.sync += line.valid.eq(0)
        return m
