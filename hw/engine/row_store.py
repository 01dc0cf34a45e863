"""The row store: table lines the LOOKUPs gathered, kept on chip so that the UPDATE of
the same batch reads its rows from there instead of PMEM (``docs/embedding.md``, "Row
store").

See :class:`RowStore` (the store) and :class:`StoreReader` (the scatter's PMEM read
port, answered from the store where it can).
"""

from __future__ import annotations

from amaranth.hdl import C, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..bus.axi import AXI4Signature, AxiBurst
from ..widths import check_int, check_pow2, onehot, select_bit
from .pool_reduce import LINE_BITS

__all__ = ["RowStore", "StoreReader", "store_index"]

_LINE_SHIFT = 6


def store_index(addr: int, index_bits: int) -> int:
    """The entry of the line at byte address ``addr`` in a store of ``2**index_bits``
    entries (the RTL's hash, for tests and docs): the line address ``addr >> 6`` folded
    by XOR into ``index_bits`` bits."""
    h, r = 0, addr >> _LINE_SHIFT
    while r:
        h ^= r & ((1 << index_bits) - 1)
        r >>= index_bits
    return h


def _index(line, index_bits: int):
    """:func:`store_index` in logic, of a line address."""
    parts = [line[k:k + index_bits] for k in range(0, len(line), index_bits)]
    h = parts[0]
    for part in parts[1:]:
        h = h ^ part
    return h[:index_bits]


class RowStore(wiring.Component):
    """A direct-mapped store of ``lines`` 64-byte table lines, each tagged with its line
    address, filled from LOOKUP's gather and probed by the scatter's row reads.

    **Entries.** The line at byte address ``a`` lives in entry :func:`store_index`
    ``(a, log2 lines)`` (an XOR fold of the line address, so that row ``r`` of different
    tables lands in different entries); an entry holds a line's data, its line address
    and a valid bit. A fill replaces whatever the entry held.

    **Fill** (``fill_valid``, with ``fill_addr``, the line's byte address, and
    ``fill_data``; nothing waits for it): the entry takes the line and becomes valid. A
    fill is dropped in a cycle in which a probe is presented or its result is due, in
    a cycle with ``flash``, and in a cycle with ``inv_valid`` (a line read back as a
    write to it is issued may hold the data from before the write). The sender only
    offers lines whose read no write could have passed
    (:class:`~.row_gather.RowGather`, ``unsafe``).

    **Invalidation** (``inv_*``, one AW of the PMEM port that carries every write of the
    device to the lines the store may hold): ``inv_valid`` is the AW's handshake, with
    ``inv_addr`` and ``inv_len`` (beats - 1). The sender lets an AW through only with
    ``inv_room``. Each line of the burst is looked up, one per cycle from the AW's
    cycle (the tag read that cycle, compared the next), and the entry cleared if it
    holds that line (from the cycle after the compare). ``inv_room`` is low while a
    burst of more than one line still has lines to look up (one line: high throughout,
    one AW per cycle). ``flash`` clears every entry at once (from the next cycle).

    **Probe** (``probe_valid`` with ``probe_addr``, a line's byte address; nothing waits
    for it): ``hit`` and ``data`` answer in the next cycle: ``hit`` if the entry holds
    that line and is valid then (an invalidation compared in the probe's cycle or before
    counts). The prober presents a
    probe only with ``probe_ok``, low while a burst's lines are being looked up, so a
    probe never passes an invalidation of a burst accepted before it.

    **Reset** clears every entry; the memories keep their contents (unseen).

    Parameters
    ----------
    addr_width : int
        PMEM byte-address bits, 12 to 64.
    lines : int
        Entries, a power of two from 2 to 65536.

    Members
    -------
    fill_valid, fill_addr, fill_data : ``In``
    inv_valid, inv_addr, inv_len : ``In``
    inv_room : ``Out(1)``
    flash : ``In(1)``
    probe_valid, probe_addr : ``In``
    hit : ``Out(1)``
    data : ``Out(512)``
    probe_ok : ``Out(1)``
    """

    def __init__(self, *, addr_width: int, lines: int):
        self._addr_width = check_int("addr_width", addr_width, 12, 64)
        self._lines = check_pow2("lines", lines, 2, 1 << 16)
        super().__init__({
            "fill_valid": In(1),
            "fill_addr": In(addr_width),
            "fill_data": In(LINE_BITS),
            "inv_valid": In(1),
            "inv_addr": In(addr_width),
            "inv_len": In(8),
            "inv_room": Out(1),
            "flash": In(1),
            "probe_valid": In(1),
            "probe_addr": In(addr_width),
            "hit": Out(1),
            "data": Out(LINE_BITS),
            "probe_ok": Out(1),
        })

    addr_width = property(lambda self: self._addr_width)
    lines = property(lambda self: self._lines)

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        k = (self._lines - 1).bit_length()
        tag_bits = aw - _LINE_SHIFT
        m.submodules.tags = tags = Memory(shape=tag_bits, depth=self._lines, init=[])
        tag_w = tags.write_port()
        tag_probe = tags.read_port()
        tag_inv = tags.read_port()
        m.submodules.lines = lines = Memory(shape=LINE_BITS, depth=self._lines, init=[])
        line_w = lines.write_port()
        line_r = lines.read_port()
        valid = Signal(self._lines)

        # --- probe: tag and data read in the probe's cycle, compared in the next
        probe_line = Signal(tag_bits)
        m.d.comb += probe_line.eq(self.probe_addr[_LINE_SHIFT:])
        p_due = Signal()                    # a probe's result is due this cycle
        p_line = Signal(tag_bits)
        p_idx = Signal(k)
        m.d.sync += [p_due.eq(self.probe_valid), p_line.eq(probe_line),
                     p_idx.eq(_index(probe_line, k))]
        m.d.comb += [
            tag_probe.addr.eq(_index(probe_line, k)),
            line_r.addr.eq(_index(probe_line, k)),
            self.hit.eq(p_due & select_bit(m, valid, p_idx, "probed_entry_valid")
                        & (tag_probe.data == p_line)),
            self.data.eq(line_r.data),
        ]

        # --- invalidation: one line looked up per cycle from the AW's cycle
        walking = Signal()                  # lines of a burst left after this cycle's
        w_line = Signal(tag_bits)           # the next line of the burst
        w_left = Signal(8)                  # lines left after w_line
        inv_line = Signal(tag_bits)         # the line looked up this cycle
        inv_now = Signal()
        m.d.comb += [
            self.inv_room.eq(~walking),
            self.probe_ok.eq(~walking),
            inv_now.eq(walking | self.inv_valid),
            inv_line.eq(Mux(walking, w_line, self.inv_addr[_LINE_SHIFT:])),
            tag_inv.addr.eq(_index(inv_line, k)),
        ]
        with m.If(walking):
            m.d.sync += [w_line.eq(w_line + 1), w_left.eq(w_left - 1)]
            with m.If(w_left == 0):
                m.d.sync += walking.eq(0)
        with m.Elif(self.inv_valid & (self.inv_len != 0)):
            m.d.sync += [walking.eq(1), w_line.eq(inv_line + 1),
                         w_left.eq(self.inv_len - 1)]
        c_due = Signal()                    # a looked-up line's compare is due
        c_line = Signal(tag_bits)
        c_idx = Signal(k)
        m.d.sync += [c_due.eq(inv_now), c_line.eq(inv_line), c_idx.eq(_index(inv_line, k))]
        clear = Signal()
        m.d.comb += clear.eq(c_due & (tag_inv.data == c_line))

        # --- fill (after the clear: a fill of the entry in the same cycle wins)
        fill_line = Signal(tag_bits)
        fill_idx = Signal(k)
        fill_go = Signal()
        m.d.comb += [
            fill_line.eq(self.fill_addr[_LINE_SHIFT:]),
            fill_idx.eq(_index(fill_line, k)),
            fill_go.eq(self.fill_valid & ~self.probe_valid & ~p_due & ~self.flash
                       & ~self.inv_valid),
            tag_w.addr.eq(fill_idx), tag_w.data.eq(fill_line), tag_w.en.eq(fill_go),
            line_w.addr.eq(fill_idx), line_w.data.eq(self.fill_data), line_w.en.eq(fill_go),
        ]
        # The valid bits as whole-vector logic from two one-hot decodes (a fill of an
        # entry wins over its clear, ``flash`` over both): a bit-select assignment per
        # source makes Yosys build a multiplexer of the whole vector per entry.
        set_oh = onehot(m, fill_idx, self._lines, "fill_oh")
        clear_oh = onehot(m, c_idx, self._lines, "clear_oh")
        m.d.sync += valid.eq(Mux(self.flash, 0,
                                 Mux(fill_go, set_oh, 0) | (valid & ~Mux(clear, clear_oh, 0))))
        return m


class StoreReader(wiring.Component):
    """The scatter's PMEM port (``up``), passed to ``down`` except that a read burst
    whose lines are all in the :class:`RowStore` is answered from the store.

    **Reads.** Each AR of ``up`` is probed in the store line by line (one line per
    cycle while ``probe_ok``); the lines that hit are copied, as they are read, into a
    ring of ``ring_lines`` lines. A burst every line of which hit is answered from the
    ring; any other is sent on ``down`` as it came. Bursts are answered on ``up`` in
    the order their ARs came, whichever way each is served, so ``up`` must be a
    manager whose read bursts return in order (one AXI ID, as
    :class:`~.coalesced_update.CoalescedUpdate` uses), and ``down`` returns them so.
    ``rresp`` of a burst from the ring is OKAY; ``rid`` is its AR's ID.

    **Writes** (AW, W, B) pass straight through.

    **Latency, throughput, backpressure.** An AR is taken from ``up`` in the cycle its
    last line is probed or when no AR is being probed, while the order queue (``queue``
    bursts) and the ring have room for it; one burst is probed per cycle of its lines.
    A missing burst's AR goes to ``down`` two cycles after its last probe at the
    earliest; a burst from the store is answered one line per cycle from two cycles
    after its last probe, once the bursts before it have been answered. ``up``'s R
    waits for ``rready``; ``down``'s ``rready`` is ``up``'s while ``down``'s burst is
    the one being answered. Reset drops everything in flight (reset ``down``'s
    subordinate with it).

    Parameters
    ----------
    addr_width : int
        PMEM byte-address bits, 12 to 64.
    id_width : int
        AXI ID bits, 1 to 16.
    max_burst : int
        Longest read burst of ``up``, 1 to 256 beats.
    queue : int
        Bursts of ``up`` the block may hold (probed and not yet answered), a power of
        two from 4 to 4096.

    Members
    -------
    up : ``In(AXI4Signature(addr_width=addr_width, data_width=512, id_width=id_width))``
    down : ``Out(AXI4Signature(addr_width=addr_width, data_width=512, id_width=id_width))``
    probe_valid, probe_addr : ``Out``
    probe_ok, hit : ``In(1)``
    data : ``In(512)``
        The store's probe port (:class:`RowStore`).
    store_beat : ``Out(1)``
        A beat answered from the store leaves on ``up`` (for a counter).
    """

    def __init__(self, *, addr_width: int, id_width: int, max_burst: int, queue: int = 16):
        self._addr_width = check_int("addr_width", addr_width, 12, 64)
        self._id_width = check_int("id_width", id_width, 1, 16)
        self._max_burst = check_int("max_burst", max_burst, 1, 256)
        self._queue = check_pow2("queue", queue, 4, 4096)
        sig = AXI4Signature(addr_width=addr_width, data_width=LINE_BITS, id_width=id_width)
        super().__init__({
            "up": In(sig),
            "down": Out(sig),
            "probe_valid": Out(1),
            "probe_addr": Out(addr_width),
            "probe_ok": In(1),
            "hit": In(1),
            "data": In(LINE_BITS),
            "store_beat": Out(1),
        })

    addr_width = property(lambda self: self._addr_width)
    id_width = property(lambda self: self._id_width)
    max_burst = property(lambda self: self._max_burst)
    queue = property(lambda self: self._queue)

    @property
    def ring_lines(self) -> int:
        """Lines of the ring: a power of two of at least 64 and four bursts."""
        return max(64, 1 << (4 * self._max_burst - 1).bit_length())

    def elaborate(self, platform):
        m = Module()
        aw, idw = self._addr_width, self._id_width
        up, down = self.up, self.down
        ring_n = self.ring_lines
        rb = (ring_n - 1).bit_length()

        # --- writes pass through
        for name in ("awvalid", "awid", "awaddr", "awlen", "awsize", "awburst", "awlock",
                     "awcache", "awprot", "wvalid", "wdata", "wstrb", "wlast", "bready"):
            m.d.comb += getattr(down, name).eq(getattr(up, name))
        for name in ("awready", "wready", "bvalid", "bid", "bresp"):
            m.d.comb += getattr(up, name).eq(getattr(down, name))

        ar_layout = data.StructLayout({"addr": aw, "len": 8, "id": idw})
        oq_layout = data.StructLayout({"store": 1, "len": 8, "id": idw})
        m.submodules.oq = oq = SyncFIFOBuffered(width=oq_layout.size, depth=self._queue)
        m.submodules.arq = arq = SyncFIFOBuffered(width=ar_layout.size, depth=4)
        m.submodules.ring = ring = Memory(shape=LINE_BITS, depth=ring_n, init=[])
        ring_w = ring.write_port()
        ring_r = ring.read_port()
        wr_ptr = Signal(rb + 1)             # ring lines committed (bursts all hit)
        rd_ptr = Signal(rb + 1)             # ring lines answered

        # --- probe stage: the AR being probed and its next line
        p_active = Signal()
        p_ar = Signal(ar_layout)
        p_k = Signal(8)
        probe_go = Signal()
        p_last = Signal()
        m.d.comb += [
            probe_go.eq(p_active & self.probe_ok),
            p_last.eq(p_k == p_ar.len),
            self.probe_valid.eq(probe_go),
            self.probe_addr.eq(p_ar.addr + (p_k << _LINE_SHIFT)),
        ]
        # Room for the AR taken now: the queue and the AR FIFO may still get one entry
        # for the AR being probed; the ring may hold the probed AR's lines uncommitted.
        used = Signal(rb + 1)
        m.d.comb += used.eq(wr_ptr - rd_ptr)
        room = Signal()
        m.d.comb += room.eq((oq.level < self._queue - 2) & (arq.level < 2)
                            & (used <= ring_n - 2 * self._max_burst))
        take = Signal()
        m.d.comb += [
            up.arready.eq(room & (~p_active | (probe_go & p_last))),
            take.eq(up.arvalid & up.arready),
        ]
        with m.If(take):
            m.d.sync += [p_active.eq(1), p_k.eq(0), p_ar.addr.eq(up.araddr),
                         p_ar.len.eq(up.arlen), p_ar.id.eq(up.arid)]
        with m.Elif(probe_go):
            m.d.sync += p_k.eq(p_k + 1)
            with m.If(p_last):
                m.d.sync += p_active.eq(0)

        # --- result stage: a probed line's answer; the burst's fate at its last line
        r_due = Signal()
        r_k = Signal(8)
        r_last = Signal()
        r_ar = Signal(ar_layout)
        all_hit = Signal()                  # every line of the burst so far hit
        m.d.sync += [r_due.eq(probe_go), r_k.eq(p_k), r_last.eq(p_last), r_ar.eq(p_ar)]
        now_hit = Signal()
        m.d.comb += now_hit.eq(self.hit & ((r_k == 0) | all_hit))
        with m.If(r_due):
            m.d.sync += all_hit.eq(now_hit)
        m.d.comb += [
            ring_w.addr.eq((wr_ptr + r_k)[:rb]),
            ring_w.data.eq(self.data),
            ring_w.en.eq(r_due & self.hit),
        ]
        decide = Signal()
        m.d.comb += decide.eq(r_due & r_last)
        oq_in = Signal(oq_layout)
        ar_in = Signal(ar_layout)
        m.d.comb += [
            oq_in.store.eq(now_hit), oq_in.len.eq(r_ar.len), oq_in.id.eq(r_ar.id),
            oq.w_data.eq(oq_in), oq.w_en.eq(decide),
            ar_in.eq(r_ar),
            arq.w_data.eq(ar_in), arq.w_en.eq(decide & ~now_hit),
        ]
        with m.If(decide & now_hit):
            m.d.sync += wr_ptr.eq(wr_ptr + r_ar.len + 1)

        # --- AR of the bursts the store could not answer
        ar_out = Signal(ar_layout)
        m.d.comb += [
            ar_out.eq(arq.r_data),
            down.arvalid.eq(arq.r_rdy),
            down.arid.eq(ar_out.id),
            down.araddr.eq(ar_out.addr),
            down.arlen.eq(ar_out.len),
            down.arsize.eq(_LINE_SHIFT),
            down.arburst.eq(AxiBurst.INCR),
            arq.r_en.eq(down.arready),
        ]

        # --- R: bursts answered in AR order, from the ring or from ``down``
        head = Signal(oq_layout)
        m.d.comb += head.eq(oq.r_data)
        o_valid = Signal()                  # a ring line in the output (ring_r.data)
        o_last = Signal()
        o_id = Signal(idw)
        h_k = Signal(8)                     # the head burst's next ring line
        load = Signal()
        m.d.comb += load.eq(~o_valid | up.rready)
        ring_read = Signal()
        m.d.comb += [
            ring_read.eq(oq.r_rdy & head.store & load),
            ring_r.addr.eq(rd_ptr[:rb]),
            ring_r.en.eq(load),
        ]
        with m.If(load):
            m.d.sync += o_valid.eq(ring_read)
        with m.If(ring_read):
            m.d.sync += [rd_ptr.eq(rd_ptr + 1), o_last.eq(h_k == head.len), o_id.eq(head.id)]
            with m.If(h_k == head.len):
                m.d.sync += h_k.eq(0)
            with m.Else():
                m.d.sync += h_k.eq(h_k + 1)
        passing = Signal()                  # the head burst comes from ``down``
        m.d.comb += passing.eq(oq.r_rdy & ~head.store & ~o_valid)
        m.d.comb += [
            up.rvalid.eq(o_valid | (passing & down.rvalid)),
            up.rdata.eq(Mux(o_valid, ring_r.data, down.rdata)),
            up.rid.eq(Mux(o_valid, o_id, down.rid)),
            up.rresp.eq(Mux(o_valid, C(0, 2), down.rresp)),
            up.rlast.eq(Mux(o_valid, o_last, down.rlast)),
            down.rready.eq(passing & up.rready),
            oq.r_en.eq((ring_read & (h_k == head.len))
                       | (passing & down.rvalid & up.rready & down.rlast)),
            self.store_beat.eq(o_valid & up.rready),
        ]
        return m
