"""Gate adapter between an AXI4 manager of device memory and the PMEM port: every line of
every burst is permitted by the DCOH before the burst goes downstream.

See :class:`DcohGate` and ``docs/dcoh.md``, "Gate adapter".
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..bus.axi import ADDR_FIELDS, AXI4Signature, AxiResp
from ..config import LINE_BITS
from ..widths import is_int as _is_int
from ..widths import is_pow2 as _is_pow2
from ..widths import named, onehot
from ..widths import select_bit as _bit
from .dcoh import ACC_REQ, LINE_ADDR_BITS, grant_layout
from .done_walker import DoneWalker
from .round_robin import first_from
from .w_beat_buffer import WBeatBuffer

__all__ = ["DcohGate"]

#: log2 of the bytes of a line (and of an AXI beat: 512-bit data).
_LINE_SHIFT = 6
#: AR / AW payload members besides ``valid`` / ``ready``, kept per entry and re-issued.
_ADDR_FIELDS = ("id", *ADDR_FIELDS)


class _Path:
    """The state of one direction (reads: AR / R; writes: AW / B): a ring of entries,
    the ``i_acc`` generator of the burst being asked for, and the issue of granted bursts
    downstream. Built into ``m`` by :class:`DcohGate` for each direction."""

    def __init__(self, gate: DcohGate, m: Module, name: str, write: bool):
        n, eb = gate.entries, gate.entries.bit_length() - 1
        kb, cw = gate._kbits, gate.max_burst_lines.bit_length()
        up, down = gate.up, gate.down
        ch = "aw" if write else "ar"
        self.n, self.eb = n, eb
        self.up_valid, self.up_ready = getattr(up, f"{ch}valid"), getattr(up, f"{ch}ready")
        self.down_valid, self.down_ready = (getattr(down, f"{ch}valid"),
                                            getattr(down, f"{ch}ready"))
        en = gate.enable

        # Entry state. An entry lives from its AR / AW to its last done; ``issued`` once
        # its burst went downstream, ``resp`` once R last / B came back, ``queued`` from
        # then until the done walker picks it.
        self.alloc = Signal(n, name=f"{name}_alloc")
        self.issued = Signal(n, name=f"{name}_issued")
        self.resp = Signal(n, name=f"{name}_resp")
        self.queued = Signal(n, name=f"{name}_queued")
        self.ids = [Signal(gate.id_width, name=f"{name}_id{e}") for e in range(n)]
        # Lines still waiting for their grant, and non-error grants so far (their handles
        # are stored at slots 0 .. nok - 1 of the entry).
        self.rem = [Signal(cw, name=f"{name}_rem{e}") for e in range(n)]
        self.nok = [Signal(cw, name=f"{name}_nok{e}") for e in range(n)]
        a_ptr = Signal(eb, name=f"{name}_a_ptr")     # next entry to allocate
        i_ptr = Signal(eb, name=f"{name}_i_ptr")     # next entry to issue

        # The request's own fields, written at allocation and read when it is issued.
        fields = {f: len(getattr(up, f"{ch}{f}")) for f in _ADDR_FIELDS}
        m.submodules[f"{name}_req"] = mem = Memory(
            shape=data.StructLayout(fields), depth=n, init=[])
        mem_wr = mem.write_port()
        # Transparent: on an empty ring the entry being allocated is the one at i_ptr.
        mem_rd = mem.read_port(transparent_for=(mem_wr,))

        # --- i_acc generator: one request per line of the burst being asked for ----------
        self.g_valid = Signal(name=f"{name}_g_valid")
        self.g_entry = Signal(eb, name=f"{name}_g_entry")
        self.g_line = Signal(LINE_ADDR_BITS, name=f"{name}_g_line")
        self.g_k = Signal(kb, name=f"{name}_g_k")
        g_last = Signal(kb, name=f"{name}_g_last")
        self.g_take = Signal(name=f"{name}_g_take")    # driven by the o_acc arbiter
        g_at_last = named(m, self.g_k == g_last, f"{name}_g_at_last")

        a_free = named(m, ~_bit(m, self.alloc, a_ptr, f"{name}_a_busy"), f"{name}_a_free")
        g_free = ~self.g_valid | (self.g_take & g_at_last)
        self.gated_ready = named(m, a_free & g_free, f"{name}_gated_ready")
        hs = named(m, en & self.up_valid & self.gated_ready, f"{name}_hs")
        a_oh = onehot(m, a_ptr, n, f"{name}_a_oh")
        length = getattr(up, f"{ch}len")
        m.d.comb += [
            mem_wr.en.eq(hs),
            mem_wr.addr.eq(a_ptr),
            *[getattr(mem_wr.data, f).eq(getattr(up, f"{ch}{f}")) for f in _ADDR_FIELDS],
        ]
        with m.If(self.g_take):
            m.d.sync += [self.g_k.eq(self.g_k + 1),
                         self.g_line.eq(self.g_line + 1)]
            with m.If(g_at_last):
                m.d.sync += self.g_valid.eq(0)
        with m.If(hs):
            m.d.sync += [
                self.g_valid.eq(1),
                self.g_entry.eq(a_ptr),
                self.g_line.eq(getattr(up, f"{ch}addr")[_LINE_SHIFT:]),
                self.g_k.eq(0),
                g_last.eq(length[:kb]),
                a_ptr.eq(a_ptr + 1),
            ]
            for e in range(n):
                with m.If(a_oh[e]):
                    m.d.sync += [self.ids[e].eq(getattr(up, f"{ch}id")),
                                 self.rem[e].eq(length[:kb] + 1),
                                 self.nok[e].eq(0)]

        # --- grants (driven by the gate): count them, store the handles ------------------
        self.grant_oh = Signal(n, name=f"{name}_grant_oh")
        self.grant_ok = Signal(name=f"{name}_grant_ok")
        self.grant_denied = Signal(name=f"{name}_grant_denied")
        # A line of the burst was denied by the host: the burst must not touch memory.
        self.denied = Signal(n, name=f"{name}_denied")
        m.d.sync += self.denied.eq((self.denied & ~Mux(hs, a_oh, 0)) |
                                   Mux(self.grant_denied, self.grant_oh, 0))
        for e in range(n):
            with m.If(self.grant_oh[e]):
                m.d.sync += self.rem[e].eq(self.rem[e] - 1)
                with m.If(self.grant_ok):
                    m.d.sync += self.nok[e].eq(self.nok[e] + 1)

        # --- issue downstream, in allocation order ----------------------------------------
        granted = named(m, Cat(*(~r.any() for r in self.rem)), f"{name}_all_granted")
        issuable = named(m, self.alloc & ~self.issued & granted, f"{name}_issuable")
        self.gated_valid = named(m, _bit(m, issuable, i_ptr, f"{name}_i_sel"),
                                 f"{name}_gated_valid")
        self.issue_hs = named(m, en & self.gated_valid & self.down_ready,
                              f"{name}_issue_hs")
        i_oh = onehot(m, i_ptr, n, f"{name}_i_oh")
        m.d.comb += mem_rd.addr.eq(Mux(self.issue_hs, i_ptr + 1, i_ptr))
        self.gated = {f: getattr(mem_rd.data, f) for f in _ADDR_FIELDS}
        with m.If(self.issue_hs):
            m.d.sync += i_ptr.eq(i_ptr + 1)

        # --- responses (driven by the gate): the oldest issued entry of that ID ----------
        self.resp_hs = Signal(name=f"{name}_resp_hs")
        self.resp_id = Signal(gate.id_width, name=f"{name}_resp_id")
        cand = named(m, self.issued & ~self.resp & Cat(*(i == self.resp_id for i in self.ids)),
                     f"{name}_resp_cand")
        r_any, r_idx = first_from(m, cand, a_ptr, f"{name}_resp_pick")
        # The response belongs to a denied burst: it goes upstream as SLVERR.
        self.resp_denied = named(m, r_any & _bit(m, self.denied, r_idx, f"{name}_resp_den"),
                                 f"{name}_resp_denied")
        r_oh = named(m, Mux(self.resp_hs & r_any, onehot(m, r_idx, n, f"{name}_resp_oh"), 0),
                     f"{name}_resp_set")

        # --- state updates (``picked`` / ``freed`` driven by the done walker) -------------
        self.picked = Signal(n, name=f"{name}_picked")
        self.freed = Signal(n, name=f"{name}_freed")
        m.d.sync += [
            self.alloc.eq((self.alloc & ~self.freed) | Mux(hs, a_oh, 0)),
            self.issued.eq((self.issued & ~self.freed) | Mux(self.issue_hs, i_oh, 0)),
            self.resp.eq((self.resp & ~self.freed) | r_oh),
            self.queued.eq((self.queued & ~self.picked) | r_oh),
        ]


class DcohGate(wiring.Component):
    """Holds every AXI4 burst of a manager until the DCOH has permitted each of its lines
    (``docs/dcoh.md``, "Gate adapter"; the rules it follows are "Rules for users").

    **Function.** Each AR (and, separately, each AW) from ``up`` takes an entry of that
    direction's ring of ``entries``; the gate sends one ``o_acc`` request per line of the
    burst (device line ``addr >> 6`` plus *k*, ``write`` 0 for AR and 1 for AW, ``tag``
    naming the direction, the entry and *k*), counts the grants as they come back on
    ``i_grant`` (out of order, any entry) and stores their handles. A burst goes to
    ``down`` once all its lines are granted, bursts of one direction in arrival order, so
    bursts with the same ID keep their order (head-of-line blocking: a burst waiting for a
    host-bias grant holds back every later burst of its direction, whatever its ID). A
    grant with ``error`` (a line beyond device memory) needs no done; the burst is issued
    all the same, PMEM answers it, and ``ev_range_error`` pulses. A ``denied`` grant
    (the host answered GO-Err) needs no done either, and the burst must not touch
    memory: it is issued all the same (so the subordinate's ID order is kept), a denied
    write with every W strobe low, and its R beats or B go upstream as SLVERR;
    ``ev_denied`` pulses.

    R and B pass from ``down`` to ``up`` unchanged. R with ``last`` (or B) completes the
    oldest issued, not yet completed entry of its direction with that ID (the subordinate
    answers one ID in order); the gate then returns the handles of the entry's non-error
    lines on ``o_done``, one per cycle (entries in round-robin order over both
    directions), and frees the entry. A done waits for nothing but ``o_done.ready``, never
    for a grant. W beats go into a buffer of ``max(4, 2 * max_burst_lines)`` beats (``up.wready``
    is low only while it is full) and leave it only while an AW issued downstream is
    waiting for its data (the subordinate may wait for AW before W): a manager that
    presents AW and W together keeps one write per cycle flowing while AWs wait for
    their grants.

    **Latency** (idle gate, DCOH idle in device bias: grant valid 3 cycles after the
    ``i_acc`` handshake; everything ready): an AR / AW taken from ``up`` in cycle 0 asks
    for its first line in cycle 1 and for its last (*L*-th) in cycle *L*, and goes to
    ``down`` in cycle *L* + 4. R last / B taken in cycle *t* puts the first done valid in
    cycle *t* + 2.

    **Throughput.** One ``o_acc`` request per cycle, shared round-robin by the two
    directions (one line per cycle in all); an AR / AW is taken while the previous
    burst's last line is asked for, so consecutive bursts ask without a gap. One grant
    per cycle (``i_grant`` is always ready) and one done per cycle. One AR and one AW
    issued per cycle. An entry is held from its AR / AW to its last done, so with bursts
    of *L* lines and an entry lifetime of *T* cycles a direction sustains
    ``min(1, entries * L / T)`` lines per cycle; the DCOH's handles (``cqids``) bound
    it the same way. Entries are allocated in ring order: a slow burst (an ID answered
    late) stops allocation when the ring comes round to it.

    **Backpressure and pass-through.** ``up.arready`` / ``up.awready`` are high while the
    ring's next entry is free and the generator is free (or finishing);
    ``down.arvalid`` / ``down.awvalid`` come from registers (the entry state) and obey
    the stream rules, and so does ``o_acc`` (valid never waits for ready; the arbiter
    holds its choice while ``o_acc.ready`` is low). With ``enable`` low the gate is wires
    (``up`` to ``down`` on all five channels, no added latency, nothing on ``o_acc``).
    ``enable`` may change only while ``o_busy`` is low and no burst that went through in
    pass-through mode is still unanswered (the gate would not recognise its response).

    **Reset** (synchronous ``rst``) frees every entry and drops every request in flight.
    The manager, the subordinate and the DCOH must be reset with the gate.

    Parameters
    ----------
    addr_width : int
        AXI byte address width, 7 to 52 (device byte address = device line * 64).
    id_width : int
        AXI ID width, 1 to 32.
    handle_bits : int
        Width of a DCOH handle, ``log2(cqids)`` of the DCOH, 1 to 8 (default 6).
    entries : int
        Bursts in flight per direction, a power of two from 2 to 64 (default 16).
    max_burst_lines : int
        Longest burst the manager sends (beats, ``len + 1``), a power of two from 1 to
        256 (default 16). Longer bursts are not allowed (their lines would be miscounted).

    Members
    -------
    up : ``In(AXI4Signature(addr_width=, data_width=512, id_width=))``
        From the manager.
    down : ``Out(AXI4Signature(addr_width=, data_width=512, id_width=))``
        To the PMEM port.
    o_acc : ``Out(stream.Signature(ACC_REQ))``
        To the DCOH's ``i_acc``.
    i_grant : ``In(stream.Signature(grant_layout))``
        From the DCOH's ``o_grant`` (always ready).
    o_done : ``Out(stream.Signature(unsigned(handle_bits)))``
        To the DCOH's ``i_done``.
    enable : ``In(1)``
        Gate on; when low, a pass-through. Change only while idle (above).
    ev_grant_host, ev_grant_device : ``Out(1)``
        One-cycle pulse, a cycle after a grant without error is taken, by its
        ``host_bias``.
    ev_range_error : ``Out(1)``
        One-cycle pulse, a cycle after a grant with ``error`` but not ``denied`` is taken.
    ev_denied : ``Out(1)``
        One-cycle pulse, a cycle after a ``denied`` grant is taken.
    o_busy : ``Out(1)``
        A burst in the gate (taken from ``up`` and not yet done), a done pending, or W
        data owed to an issued AW.

    Raises
    ------
    ValueError
        If a parameter is out of its range or of the wrong type.
    """

    def __init__(self, *, addr_width: int, id_width: int, handle_bits: int = 6,
                 entries: int = 16, max_burst_lines: int = 16):
        if not _is_int(addr_width) or not 7 <= addr_width <= LINE_ADDR_BITS + _LINE_SHIFT:
            raise ValueError(f"addr_width must be an integer from 7 to "
                             f"{LINE_ADDR_BITS + _LINE_SHIFT}, not {addr_width!r}")
        if not _is_int(id_width) or not 1 <= id_width <= 32:
            raise ValueError(f"id_width must be an integer from 1 to 32, not {id_width!r}")
        if not _is_int(handle_bits) or not 1 <= handle_bits <= 8:
            raise ValueError(f"handle_bits must be an integer from 1 to 8, not "
                             f"{handle_bits!r}")
        if not _is_pow2(entries) or not 2 <= entries <= 64:
            raise ValueError(f"entries must be a power of two from 2 to 64, not {entries!r}")
        if not _is_pow2(max_burst_lines) or not max_burst_lines <= 256:
            raise ValueError(f"max_burst_lines must be a power of two from 1 to 256, not "
                             f"{max_burst_lines!r}")
        self._addr_width = addr_width
        self._id_width = id_width
        self._handle_bits = handle_bits
        self._entries = entries
        self._max_burst_lines = max_burst_lines
        self._w_buffer = max(4, 2 * max_burst_lines)
        # Bits of the line index k in a tag and of a handle slot (at least one, so that
        # no signal is zero bits wide).
        self._kbits = max(1, max_burst_lines.bit_length() - 1)
        self._grant_layout = grant_layout(handle_bits)
        axi = AXI4Signature(addr_width=addr_width, data_width=LINE_BITS, id_width=id_width)
        super().__init__({
            "up": In(axi),
            "down": Out(axi),
            "o_acc": Out(stream.Signature(ACC_REQ)),
            "i_grant": In(stream.Signature(self._grant_layout)),
            "o_done": Out(stream.Signature(unsigned(handle_bits))),
            "enable": In(1),
            "ev_grant_host": Out(1),
            "ev_grant_device": Out(1),
            "ev_range_error": Out(1),
            "ev_denied": Out(1),
            "o_busy": Out(1),
        })

    @property
    def addr_width(self) -> int:
        return self._addr_width

    @property
    def id_width(self) -> int:
        return self._id_width

    @property
    def handle_bits(self) -> int:
        return self._handle_bits

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def max_burst_lines(self) -> int:
        return self._max_burst_lines

    @property
    def grant_layout(self) -> data.StructLayout:
        """``i_grant`` payload, the DCOH's ``grant_layout`` for ``cqids = 2**handle_bits``:
        ``tag``, ``handle``, ``error``, ``host_bias``."""
        return self._grant_layout

    def tag(self, *, write: bool, entry: int, k: int) -> int:
        """The ``o_acc`` tag of line ``k`` of the burst in ``entry`` (for test benches)."""
        return (int(write) << (self._entries.bit_length() - 1) | entry) << self._kbits | k

    def untag(self, tag: int) -> tuple[bool, int, int]:
        """``(write, entry, k)`` of an ``o_acc`` tag."""
        eb = self._entries.bit_length() - 1
        return (bool(tag >> (self._kbits + eb) & 1), tag >> self._kbits & ((1 << eb) - 1),
                tag & ((1 << self._kbits) - 1))

    def elaborate(self, platform):
        m = Module()
        up, down, en = self.up, self.down, self.enable
        n, eb, kb = self._entries, self._entries.bit_length() - 1, self._kbits
        rd, wr = _Path(self, m, "rd", write=False), _Path(self, m, "wr", write=True)
        paths = (rd, wr)

        # --- address channels: gated, or wires when the gate is off -----------------------
        for p, ch in ((rd, "ar"), (wr, "aw")):
            m.d.comb += [
                p.down_valid.eq(Mux(en, p.gated_valid, p.up_valid)),
                p.up_ready.eq(Mux(en, p.gated_ready, p.down_ready)),
                *[getattr(down, f"{ch}{f}").eq(Mux(en, p.gated[f], getattr(up, f"{ch}{f}")))
                  for f in _ADDR_FIELDS],
            ]

        # --- W: buffered, and passed on only for AWs already downstream --------------
        # The buffer takes W beats while their AW waits for its grants, so a manager
        # that presents AW and W together (and waits for both) keeps streaming.
        m.submodules.w_buf = w_buf = WBeatBuffer(data_width=LINE_BITS,
                                                 depth=self._w_buffer, entries=n)
        w_in, w_out = w_buf.i_w, w_buf.o_w
        m.d.comb += [
            w_in.valid.eq(en & up.wvalid),
            w_in.p.data.eq(up.wdata), w_in.p.strb.eq(up.wstrb), w_in.p.last.eq(up.wlast),
            up.wready.eq(Mux(en, w_in.ready, down.wready)),
            down.wvalid.eq(Mux(en, w_out.valid, up.wvalid)),
            w_out.ready.eq(en & down.wready),
            down.wdata.eq(Mux(en, w_out.p.data, up.wdata)),
            down.wstrb.eq(Mux(en, w_out.p.strb, up.wstrb)),
            down.wlast.eq(Mux(en, w_out.p.last, up.wlast)),
            w_buf.i_aw_issued.eq(wr.issue_hs),
            w_buf.i_denied.eq(wr.denied),
        ]

        # --- R and B: unchanged; R last / B completes an entry ---------------------------
        m.d.comb += [
            up.rvalid.eq(down.rvalid), down.rready.eq(up.rready), up.rid.eq(down.rid),
            up.rdata.eq(down.rdata), up.rlast.eq(down.rlast),
            up.rresp.eq(Mux(en & rd.resp_denied, AxiResp.SLVERR, down.rresp)),
            up.bvalid.eq(down.bvalid), down.bready.eq(up.bready), up.bid.eq(down.bid),
            up.bresp.eq(Mux(en & wr.resp_denied, AxiResp.SLVERR, down.bresp)),
            rd.resp_hs.eq(en & down.rvalid & up.rready & down.rlast),
            rd.resp_id.eq(down.rid),
            wr.resp_hs.eq(en & down.bvalid & up.bready),
            wr.resp_id.eq(down.bid),
        ]

        # --- o_acc: round robin between the generators, held while not ready ------------
        acc = self.o_acc
        hold = Signal()
        hold_w = Signal()
        prefer_w = Signal()
        sel_w = named(m, Mux(hold, hold_w, wr.g_valid & (~rd.g_valid | prefer_w)), "acc_sel_w")
        take = named(m, acc.valid & acc.ready, "acc_take")
        m.d.comb += [
            acc.valid.eq(rd.g_valid | wr.g_valid),
            acc.p.line.eq(Mux(sel_w, wr.g_line, rd.g_line)),
            acc.p.write.eq(sel_w),
            acc.p.tag.eq(Cat(Mux(sel_w, wr.g_k, rd.g_k),
                             Mux(sel_w, wr.g_entry, rd.g_entry), sel_w)),
            rd.g_take.eq(take & ~sel_w),
            wr.g_take.eq(take & sel_w),
        ]
        m.d.sync += [hold.eq(acc.valid & ~acc.ready), hold_w.eq(sel_w)]
        with m.If(take):
            m.d.sync += prefer_w.eq(~sel_w)

        # --- grants: count per entry, store the handle of a non-error line --------------
        gr = self.i_grant
        g_entry = gr.p.tag[kb:kb + eb]
        g_write = gr.p.tag[kb + eb]
        g_oh = onehot(m, g_entry, n, "grant_entry_oh")
        g_nok = named(m, Array(rd.nok + wr.nok)[Cat(g_entry, g_write)], "grant_nok")
        m.submodules.walker = walker = DoneWalker(entries=2 * n, lines=self._max_burst_lines,
                                                  handle_bits=self._handle_bits)
        m.d.comb += [
            gr.ready.eq(1),
            rd.grant_oh.eq(Mux(gr.valid & ~g_write, g_oh, 0)),
            wr.grant_oh.eq(Mux(gr.valid & g_write, g_oh, 0)),
            rd.grant_ok.eq(~gr.p.error),
            wr.grant_ok.eq(~gr.p.error),
            rd.grant_denied.eq(gr.p.denied),
            wr.grant_denied.eq(gr.p.denied),
            walker.i_store.eq(gr.valid & ~gr.p.error),
            walker.i_store_addr.eq(Cat(g_nok[:kb], g_entry, g_write)),
            walker.i_store_handle.eq(gr.p.handle),
        ]
        m.d.sync += [
            self.ev_grant_host.eq(gr.valid & ~gr.p.error & gr.p.host_bias),
            self.ev_grant_device.eq(gr.valid & ~gr.p.error & ~gr.p.host_bias),
            self.ev_range_error.eq(gr.valid & gr.p.error & ~gr.p.denied),
            self.ev_denied.eq(gr.valid & gr.p.denied),
        ]

        # --- done walker: completed entries in round-robin order, one handle a cycle -----
        wiring.connect(m, walker.o_done, wiring.flipped(self.o_done))
        m.d.comb += [
            walker.i_queued.eq(Cat(rd.queued, wr.queued)),
            *[walker.i_counts[i].eq(c) for i, c in enumerate(rd.nok + wr.nok)],
            rd.picked.eq(walker.o_picked[:n]), wr.picked.eq(walker.o_picked[n:]),
            rd.freed.eq(walker.o_freed[:n]), wr.freed.eq(walker.o_freed[n:]),
        ]

        m.d.comb += self.o_busy.eq(Cat(*(p.alloc.any() | p.g_valid for p in paths)).any() |
                                   self.o_done.valid | walker.o_busy | w_buf.o_busy)
        return m
