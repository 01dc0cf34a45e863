"""The recovery's write path: the restore buffer and single-line AXI writes of the
buffered records and of the commit word.

See :class:`RestoreWriter`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst

from .formats import LINE_BITS
from .line_reader import SIZE_LINE
from .log_scan import buffer_fill

__all__ = ["RestoreWriter", "write_job"]

#: Writes whose B has not arrived before the restore writer waits.
MAX_WRITES = 64


def write_job(addr_width: int) -> data.StructLayout:
    """Payload of :attr:`RestoreWriter.i_job`."""
    return data.StructLayout({
        "commit": 1,            # write ``word`` (else the ``n`` buffered lines)
        "n": 8,
        "addr": addr_width,     # first line
        "word": 64,
    })


class RestoreWriter(wiring.Component):
    """Writes a record's payload lines, buffered on chip, back to where they were
    logged, or writes the commit word.

    **Buffer.** Two record buffers of ``2**index_width`` lines (ping-pong): ``i_fill``
    (always ready) writes line ``index`` of the buffer being filled; a restore job takes
    that buffer and the next record fills the other one. So one record can be read into
    the buffer while the previous one is written out.

    **Jobs.** A restore job (``commit`` low) writes buffered lines ``0..n-1`` (``n`` at
    least 1) to ``addr``, ``addr + 64``, ...; a commit job writes ``word`` into bytes
    0..7 of the line at ``addr`` (``wstrb`` 0xFF). Every write is one single-beat
    AW/W pair, ID 0. A job taken while ``stop`` is high is dropped (after a PMEM error
    nothing more is restored).

    **Flow, latency.** ``i_job.ready`` is ``~busy`` (for a commit job also fewer than
    ``MAX_WRITES`` writes outstanding). A restore line is valid on AW and W three
    cycles after its job was taken, or two after its previous line was accepted on
    both channels (the buffer's synchronous read), as long as fewer than
    ``MAX_WRITES`` B are outstanding, so a record goes out at one line per two cycles;
    a commit word is valid in the cycle after its job. ``awvalid`` and ``wvalid`` do
    not wait for ``ready``; each drops on its own handshake. ``bready`` is always high.

    **Status.** ``busy`` is high while a taken job still has a line not accepted on
    both AW and W; ``idle`` while ``busy`` is low and every B has arrived;
    ``b_error`` in a cycle with a B response other than OKAY.

    Parameters
    ----------
    addr_width, id_width : int
    index_width : int
        Buffer index width (each buffer holds ``2**index_width`` lines).

    Members
    -------
    i_fill : ``In(stream.Signature(buffer_fill(index_width), always_ready=True))``
    i_job : ``In(stream.Signature(write_job(addr_width)))``
    stop : ``In(1)``
    busy, idle, b_error : ``Out(1)``
    pmem : ``Out(AXI4Signature(addr_width, 512, id_width))``
        Only AW, W and B are used; the read channels stay idle.
    """

    def __init__(self, *, addr_width: int, id_width: int, index_width: int):
        if not isinstance(index_width, int) or not 1 <= index_width <= 8:
            raise ValueError(f"index_width must be an integer from 1 to 8, not "
                             f"{index_width!r}")
        self._index_width = index_width
        super().__init__({
            "i_fill": In(stream.Signature(buffer_fill(index_width), always_ready=True)),
            "i_job": In(stream.Signature(write_job(addr_width))),
            "stop": In(1),
            "busy": Out(1),
            "idle": Out(1),
            "b_error": Out(1),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
        })

    index_width = property(lambda self: self._index_width)

    def elaborate(self, platform):
        m = Module()
        axi, job, fill = self.pmem, self.i_job, self.i_fill
        iw = self._index_width
        m.submodules.buf = buf = Memory(shape=LINE_BITS, depth=2 << iw, init=[])
        rd = buf.read_port(transparent_for=())
        wr = buf.write_port()
        half = Signal()             # the buffer being filled
        rd_half = Signal()          # the buffer being written out
        k = Signal(8)
        n = Signal(8)
        addr = Signal(axi.awaddr.shape())
        w_out = Signal(8)           # AWs whose B has not arrived
        m.d.comb += [
            wr.en.eq(fill.valid),
            wr.addr.eq(Cat(fill.p.index, half)),
            wr.data.eq(fill.p.data),
            rd.addr.eq(Cat(k[:iw], rd_half)),
            axi.awsize.eq(SIZE_LINE),
            axi.awburst.eq(AxiBurst.INCR),
            axi.wlast.eq(1),
            axi.bready.eq(1),
            self.b_error.eq(axi.bvalid & axi.bresp.any()),
        ]
        aw_hs = axi.awvalid & axi.awready
        with m.If(aw_hs & ~axi.bvalid):
            m.d.sync += w_out.eq(w_out + 1)
        with m.Elif(~aw_hs & axi.bvalid):
            m.d.sync += w_out.eq(w_out - 1)
        with m.If(axi.awready):
            m.d.sync += axi.awvalid.eq(0)
        with m.If(axi.wready):
            m.d.sync += axi.wvalid.eq(0)
        pending = axi.awvalid | axi.wvalid
        room = w_out < MAX_WRITES

        def write(addr, data, strb):
            m.d.sync += [axi.awvalid.eq(1), axi.wvalid.eq(1), axi.awaddr.eq(addr),
                         axi.wdata.eq(data), axi.wstrb.eq(strb)]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += [self.busy.eq(pending), self.idle.eq(~pending & ~w_out.any()),
                             job.ready.eq(~pending & (~job.p.commit | room))]
                with m.If(job.valid & job.ready & ~self.stop):
                    with m.If(job.p.commit):
                        write(job.p.addr, Cat(job.p.word, C(0, LINE_BITS - 64)), 0xFF)
                    with m.Else():
                        m.d.sync += [rd_half.eq(half), half.eq(~half), k.eq(0),
                                     n.eq(job.p.n), addr.eq(job.p.addr)]
                        m.next = "READ"
            with m.State("READ"):               # rd.data is line k in the next cycle
                m.d.comb += self.busy.eq(1)
                m.next = "LOAD"
            with m.State("LOAD"):
                m.d.comb += self.busy.eq(1)
                with m.If(~pending & room):
                    write(addr, rd.data, (1 << (LINE_BITS // 8)) - 1)
                    m.d.sync += [k.eq(k + 1), addr.eq(addr + 64)]
                    with m.If((k + 1)[:8] == n):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "READ"
        return m
