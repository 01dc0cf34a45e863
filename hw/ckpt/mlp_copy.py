"""The MLP checkpoint copier: copies the GPU's MLP parameters from a staging area in
device memory into an MLP checkpoint slot, payload first and the header last
(``docs/checkpoint.md``, "MLP checkpoint")."""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst

from .formats import LINE_BITS, MLP_HEADER, MLP_MAGIC, line_sum, sum64_finish

__all__ = ["LINES_WIDTH", "MlpCopier"]

#: Width of the line count: slots of up to ``2**32`` bytes (``mlp_slot_bytes`` is 32
#: bits in the device).
LINES_WIDTH = 26

_LINE_SHIFT = 6


class MlpCopier(wiring.Component):
    """Copies ``lines`` lines from ``src`` to ``dst``, then writes the slot header at
    ``header_addr`` once every payload write is durable (its B has arrived).

    **Flow.** Reads are single-beat on one AXI ID (so they return in order), at most
    ``buffer_lines`` requested and not yet written; every returned line goes into a
    FIFO of that depth and from there into a single-beat write of the same offset of
    ``dst`` (one ID as well). The checksum of ``docs/checkpoint.md`` (``sum64`` of the
    header's first three words and every payload word) accumulates as lines are
    written, one cycle behind. The header ``{magic "MLPC", batch_id, length = lines *
    64, check}`` is written after the last payload B, and ``done`` pulses when its B
    arrives: from then on the slot is valid in PMEM.

    **Errors.** A read or write with an error response does not stop the copy (a valid
    never drops before its handshake, nothing hangs), but the header is not written;
    ``done`` pulses with ``error`` high once every issued request has its response. The
    slot is then invalid (its old header no longer matches its payload), which is the
    state any interrupted copy leaves.

    Members
    -------
    start : ``In(1)``
        Starts a copy with the inputs below (sampled in that cycle); ignored while
        ``busy``. ``lines`` must be at least 1.
    src, dst, header_addr : ``In(addr_width)``
        64-byte aligned byte addresses: staging area, slot payload, slot header.
    lines : ``In(LINES_WIDTH)``
    batch_id : ``In(32)``
    busy : ``Out(1)``
        From the cycle after ``start`` until ``done``.
    done, error : ``Out(1)``
        One-cycle pulse at the end; ``error`` with ``done`` when a response failed.
    ev_line : ``Out(1)``
        A payload line was handed to the write channel.
    pmem : ``Out(AXI4Signature(addr_width, 512, id_width))``
    """

    def __init__(self, *, addr_width: int, id_width: int, buffer_lines: int = 16):
        if buffer_lines < 2 or buffer_lines & (buffer_lines - 1):
            raise ValueError(f"buffer_lines must be a power of two of at least 2, not "
                             f"{buffer_lines!r}")
        self._addr_width = addr_width
        self._buffer_lines = buffer_lines
        super().__init__({
            "start": In(1),
            "src": In(addr_width),
            "dst": In(addr_width),
            "header_addr": In(addr_width),
            "lines": In(LINES_WIDTH),
            "batch_id": In(32),
            "busy": Out(1),
            "done": Out(1),
            "error": Out(1),
            "ev_line": Out(1),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
        })

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        depth = self._buffer_lines
        cw = depth.bit_length()         # counts 0 .. depth
        axi = self.pmem

        busy = Signal()
        rd_addr = Signal(aw)
        wr_addr = Signal(aw)
        hdr_addr = Signal(aw)
        rd_left = Signal(LINES_WIDTH)   # lines not yet requested
        wr_left = Signal(LINES_WIDTH)   # lines not yet handed to the write channel
        held = Signal(cw)               # requested and not yet handed over
        b_wait = Signal(LINES_WIDTH + 1)  # writes awaiting their B
        err = Signal()
        hdr_sent = Signal()
        hdr = Signal(MLP_HEADER)        # check filled in when the header is sent

        m.submodules.buf = buf = SyncFIFOBuffered(width=LINE_BITS, depth=depth)

        # --- reads ------------------------------------------------------------------------
        ar_go = Signal()
        m.d.comb += [
            axi.arvalid.eq(busy & rd_left.any() & (held < depth)),
            axi.araddr.eq(rd_addr),
            axi.arid.eq(0),
            axi.arlen.eq(0),
            axi.arsize.eq(_LINE_SHIFT),
            axi.arburst.eq(AxiBurst.INCR),
            ar_go.eq(axi.arvalid & axi.arready),
            axi.rready.eq(1),           # room is reserved by ``held``
            buf.w_en.eq(axi.rvalid),
            buf.w_data.eq(axi.rdata),
        ]
        with m.If(ar_go):
            m.d.sync += [rd_addr.eq(rd_addr + (1 << _LINE_SHIFT)),
                         rd_left.eq(rd_left - 1)]

        # --- writes: payload lines, then the header ---------------------------------------
        aw_pend, w_pend = Signal(), Signal()
        awaddr = Signal(aw)
        wdata = Signal(LINE_BITS)
        can_load = Signal()
        m.d.comb += can_load.eq((~aw_pend | axi.awready) & (~w_pend | axi.wready))
        m.d.comb += [
            axi.awvalid.eq(aw_pend),
            axi.awaddr.eq(awaddr),
            axi.awid.eq(0),
            axi.awlen.eq(0),
            axi.awsize.eq(_LINE_SHIFT),
            axi.awburst.eq(AxiBurst.INCR),
            axi.wvalid.eq(w_pend),
            axi.wdata.eq(wdata),
            axi.wstrb.eq((1 << (LINE_BITS // 8)) - 1),
            axi.wlast.eq(1),
            axi.bready.eq(1),
        ]
        with m.If(axi.awready):
            m.d.sync += aw_pend.eq(0)
        with m.If(axi.wready):
            m.d.sync += w_pend.eq(0)

        # A payload line's AW is loaded as soon as its data is in the buffer, its W the
        # cycle after (or later): the address runs one write ahead of the data, as an
        # AXI arbiter that takes a W beat the cycle after its AW grant needs for one
        # write per cycle. ``aw_ahead`` counts AWs loaded whose W is not yet loaded.
        aw_ahead = Signal(cw)
        aw_left = Signal(LINES_WIDTH)   # payload lines whose AW is not yet loaded
        aw_free = ~aw_pend | axi.awready
        w_free = ~w_pend | axi.wready
        load_aw = Signal()
        load_pay = Signal()
        m.d.comb += [
            load_aw.eq(busy & aw_left.any() & aw_free & (buf.level > aw_ahead)),
            load_pay.eq(busy & wr_left.any() & buf.r_rdy & w_free & aw_ahead.any()),
            buf.r_en.eq(load_pay),
        ]
        with m.If(load_aw & ~load_pay):
            m.d.sync += aw_ahead.eq(aw_ahead + 1)
        with m.Elif(~load_aw & load_pay):
            m.d.sync += aw_ahead.eq(aw_ahead - 1)
        with m.If(load_aw):
            m.d.sync += [aw_pend.eq(1), awaddr.eq(wr_addr),
                         wr_addr.eq(wr_addr + (1 << _LINE_SHIFT)),
                         aw_left.eq(aw_left - 1)]
        summing = Signal()              # wdata holds a payload line not yet summed
        acc = Signal(64)
        pay_sum = line_sum(m, wdata, name="pay_sum")
        m.d.sync += summing.eq(load_pay)
        with m.If(summing):
            m.d.sync += acc.eq(acc + pay_sum)
        with m.If(load_pay):
            m.d.sync += [w_pend.eq(1), wdata.eq(buf.r_data),
                         wr_left.eq(wr_left - 1)]

        quiet = Signal()                # nothing requested or written is unanswered
        m.d.comb += quiet.eq(~rd_left.any() & ~wr_left.any() & ~b_wait.any() & ~aw_pend
                             & ~w_pend & ~summing)
        hdr_words = line_sum(m, hdr.as_value(), words=3, name="hdr_words")
        load_hdr = Signal()
        finish = Signal()
        m.d.comb += [load_hdr.eq(busy & quiet & ~hdr_sent & ~err & can_load),
                     finish.eq(busy & quiet & (hdr_sent | err))]
        with m.If(load_hdr):
            m.d.sync += [aw_pend.eq(1), w_pend.eq(1), awaddr.eq(hdr_addr), hdr_sent.eq(1),
                         wdata.eq(Cat(hdr.as_value()[:192],
                                      sum64_finish(acc + hdr_words),
                                      C(0, LINE_BITS - 256)))]

        # --- accounting -------------------------------------------------------------------
        handed = load_pay
        with m.If(ar_go & ~handed):
            m.d.sync += held.eq(held + 1)
        with m.Elif(~ar_go & handed):
            m.d.sync += held.eq(held - 1)
        loaded = load_aw | load_hdr     # a write is counted from its AW
        with m.If(loaded & ~axi.bvalid):
            m.d.sync += b_wait.eq(b_wait + 1)
        with m.Elif(~loaded & axi.bvalid):
            m.d.sync += b_wait.eq(b_wait - 1)
        with m.If((axi.rvalid & axi.rresp.any()) | (axi.bvalid & axi.bresp.any())):
            m.d.sync += err.eq(1)

        with m.If(self.start & ~busy):
            m.d.sync += [
                busy.eq(1), err.eq(0), hdr_sent.eq(0), acc.eq(0),
                rd_addr.eq(self.src), wr_addr.eq(self.dst), hdr_addr.eq(self.header_addr),
                rd_left.eq(self.lines), wr_left.eq(self.lines), aw_left.eq(self.lines),
                aw_ahead.eq(0),
                hdr.magic.eq(MLP_MAGIC), hdr.rsvd0.eq(0), hdr.batch_id.eq(self.batch_id),
                hdr.rsvd1.eq(0), hdr.length.eq(self.lines << _LINE_SHIFT),
                hdr.check.eq(0), hdr.rsvd2.eq(0),
            ]
        with m.If(finish):
            m.d.sync += busy.eq(0)
        m.d.comb += [
            self.busy.eq(busy),
            self.done.eq(finish),
            self.error.eq(finish & err),
            self.ev_line.eq(load_pay),
        ]
        return m

