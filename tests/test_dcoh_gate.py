# amaranth: UnusedElaboratable=no
"""DCOH gate adapter (hw/cxl/dcoh_gate.py), fast tier: Amaranth simulator.

A :class:`TB` connects a random AXI4 manager model to the gate's ``up`` port, the gate's
``down`` port to the PMEM model (:class:`tb.pmem.PmemModel` served by
:class:`tests.axi_pmem.AxiPmemPort`: random latency jitter, so responses of different IDs
come back out of order, and random backpressure / idle cycles), and the gate's
``o_acc`` / ``i_grant`` / ``o_done`` to a real :class:`hw.cxl.dcoh.Dcoh`, whose D2H
requests are answered by :class:`tb.dcoh_host.DcohHost` (MemRdFwd, or with ``answer``
GO-Err on H2D Rsp / Data). One simulator process drives everything each cycle and
samples every handshake.

Scoreboard: the manager checks every R beat against a reference memory (bursts that
overlap a write in flight wait, so the reference is exact) and the response order per
ID; every line of a burst reaching ``down`` must have been granted to a request of the
gate and not used by an earlier burst (so no burst goes down before all its lines are
granted); each non-error handle may be done only after R last / B of the downstream
burst holding it, exactly once; a burst with a denied line (GO-Err) answers SLVERR on
every R beat or on its B and changes no byte of PMEM; :class:`tb.dcoh_host.BiasChecker`
holds the DCOH's
grants to the bias rules; W beats reach ``down`` only for AWs already there; stream
rules on ``o_acc``, ``o_done`` and the downstream AR / AW / W; the gate's event pulses
match the grants.

Random tests print their seed; ``SEED=<n>`` replays one. (The linter option on the first
line lets tests build gates only to see them rejected.)
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from amaranth.hdl import ClockDomain, Module, Value
from amaranth.lib import wiring
from amaranth.sim import Simulator

from hw.bus.axi import AxiBurst, AxiResp
from hw.cxl.dcoh import ACC_REQ, Dcoh
from hw.cxl.dcoh_gate import DcohGate
from hw.cxl.messages import Codec, D2HReq, D2HReqOpcode, H2DData, H2DRsp, M2SReq
from tb.dcoh_host import BiasChecker, DcohHost, HostTiming
from tb.pmem import LINE_BYTES, PmemModel, PmemTiming, strb_mask

from . import axi_pmem
from .conftest import assert_lints_clean
from .stream_rule import StreamRule

PAGE_LINES = 4096 // LINE_BYTES      # AXI bursts never cross 4 KiB
FULL_STRB = (1 << LINE_BYTES) - 1
SIZE_LINE = 6
CODEC = {"acc": Codec(ACC_REQ), "d2h": Codec(D2HReq), "fwd": Codec(M2SReq)}
FLIP_STATUS = Codec(Dcoh.FLIP_STATUS)


# --- bench ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Traffic:
    """Per-cycle probabilities of manager idle / backpressure, the PMEM side's, and the
    host's."""
    idle: float = 0.0           # AR / AW / W valid withheld by the manager
    resp_bp: float = 0.0        # rready / bready low
    d2h_bp: float = 0.0         # o_d2h_req ready low
    fwd_idle: float = 0.0       # forward withheld
    pmem: axi_pmem.Traffic = axi_pmem.SMOOTH


SMOOTH = Traffic()
ROUGH = Traffic(idle=0.3, resp_bp=0.3, d2h_bp=0.3, fwd_idle=0.3, pmem=axi_pmem.ROUGH)


@dataclass
class Burst:
    write: bool
    id: int
    line: int                   # first device line
    beats: int
    data: list[tuple[int, int]] = field(default_factory=list)   # (wdata, wstrb)
    t_up: int = -1              # AR / AW handshake on up
    t_resp: int = -1            # R last / B handshake on up
    got: int = 0                # R beats received
    denied: bool = False        # a line was denied by the host (GO-Err)

    @property
    def lines(self) -> range:
        return range(self.line, self.line + self.beats)


class BurstPort(axi_pmem.AxiPmemPort):
    """:class:`tests.axi_pmem.AxiPmemPort` for bursts of several beats (its ``observe``
    takes single beats only), reporting each downstream handshake to the bench."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.events: list[tuple] = []   # this cycle's ("ar"/"aw", id, addr, len),
        self.aw_count = 0               # ("r_last", id), ("b", id), ("w_last",)
        self.wlast_count = 0
        self.w_after_aw = 1             # 0: W may come before its AW

    def observe(self, values: tuple) -> None:
        (arvalid, arready, awvalid, awready, wvalid, wready, wdata, wstrb, wlast, rready,
         bready, *addr) = values
        ar, aw = tuple(addr[:5]), tuple(addr[5:])
        cycle, model, ev = self.cycle, self.model, []
        self._rules["AR"].observe(cycle, arvalid, arready, ar)
        self._rules["AW"].observe(cycle, awvalid, awready, aw)
        self._rules["W"].observe(cycle, wvalid, wready, (wdata, wstrb, wlast))
        if arvalid and arready:
            model.accept_ar(ar[0], ar[1], ar[2], cycle, size=ar[3], burst=ar[4])
            ev.append(("ar", *ar[:3]))
        if wvalid and wready:
            # An AW taken in this very cycle does not count: the gate holds W for it
            # (a pass-through may send W first, as AXI allows).
            assert self.w_after_aw <= self.aw_count - self.wlast_count, \
                f"W beat at {cycle} before its AW"
            model.accept_w(wdata, wstrb, bool(wlast), cycle)
            self.wlast_count += bool(wlast)
        if awvalid and awready:
            model.accept_aw(aw[0], aw[1], aw[2], cycle, size=aw[3], burst=aw[4])
            self.aw_count += 1
            ev.append(("aw", *aw[:3]))
        if self._beat is not None and rready:
            if self._beat[3]:
                ev.append(("r_last", self._beat[0]))
            model.r_accept(cycle)
            self._beat = None
        if self._b is not None and bready:
            ev.append(("b", self._b[0]))
            model.b_accept(cycle)
            self._b = None
        self.events = ev
        self.cycle += 1


class TB:
    """Clock, gate, DCOH, host, PMEM, manager model and scoreboard (module docstring).

    Tests queue bursts (:meth:`read`, :meth:`write`, :meth:`random_bursts`) and flips
    (:meth:`flip`; the ones queued before the first burst run before any traffic), add
    per-cycle ``hooks`` and call :meth:`run`.
    """

    def __init__(self, *, seed: int, traffic: Traffic = SMOOTH, enable: bool = True,
                 pages: int = 8, page_bytes: int = 1024, handle_bits: int = 5,
                 entries: int = 8, max_burst_lines: int = 16, id_width: int = 3,
                 pmem_timing: PmemTiming | None = None, host_timing: HostTiming | None = None,
                 answer: Callable | None = None):
        self.rng = random.Random(seed)
        self.traffic = traffic
        self.enable = enable
        self.dcoh = Dcoh(pages=pages, page_bytes=page_bytes, cqids=1 << handle_bits)
        self.lpp = self.dcoh.lines_per_page
        self.total_lines = pages * self.lpp
        # PMEM reaches one 4 KiB page beyond device memory, for the out-of-range bursts.
        self.mem_lines = (self.total_lines + 2 * PAGE_LINES - 1) // PAGE_LINES * PAGE_LINES
        addr_width = (self.mem_lines * LINE_BYTES - 1).bit_length()
        self.gate = DcohGate(addr_width=addr_width, id_width=id_width, handle_bits=handle_bits,
                             entries=entries, max_burst_lines=max_burst_lines)
        self.pmem = PmemModel(size=self.mem_lines * LINE_BYTES, rng=random.Random(seed + 2),
                              timing=pmem_timing or PmemTiming(read_latency=20,
                                                               write_latency=12, jitter=10))
        self.port = BurstPort(self.gate.down, self.pmem, random.Random(seed + 3), traffic.pmem)
        self.port.w_after_aw = int(enable)
        self.host = DcohHost(timing=host_timing or HostTiming(latency=12, jitter=8,
                                                              reorder=True),
                             rng=random.Random(seed + 1), answer=answer)
        self.hdm_base = self.rng.getrandbits(36) << 4
        self.checker = BiasChecker(self.host, hdm_base=self.hdm_base, lines_per_page=self.lpp)
        self.grant_codec = Codec(self.gate.grant_layout)
        self.flip_codec = Codec(self.dcoh.flip_layout)
        self.ref: dict[int, int] = {}       # device line -> data, as of the last B
        self.queue = {False: deque(), True: deque()}        # bursts not yet presented
        self.cur = {False: None, True: None}                # presented on AR / AW
        self.open = {False: {}, True: {}}   # id -> deque of bursts taken, not answered
        self.bursts: list[Burst] = []       # every burst taken on up
        self.taken = {False: 0, True: 0}    # bursts taken on up, per direction
        self.holder: dict[tuple[bool, int], Burst] = {}     # (write, entry) -> burst
        self.w_q: deque[tuple[Burst, int]] = deque()        # W beats owed, in AW order
        self.flips: deque[tuple[int, int, bool]] = deque()
        self.flip_log: list[tuple[int, int, int, int, bool, bool]] = []
        self.hooks: list[Callable[[TB, int], None]] = []
        # Scoreboard of the gate.
        self.accs: dict[int, tuple[bool, int]] = {}         # tag -> (write, line) asked
        # (write, entry) -> [(k, line, handle or None)]: granted, not yet downstream.
        self.granted: dict[tuple[bool, int], list] = {}
        self.issued = {False: 0, True: 0}                   # bursts sent downstream
        self.down_open = {False: {}, True: {}}              # id -> deque of handle lists
        self.doneable: set[int] = set()
        self.grants = Counter()
        self.events = Counter()
        self.acc_count = 0
        self.done_count = 0
        self.t = 0
        self.traffic_start: int | None = None

    # Stimulus ---------------------------------------------------------------------------
    def read(self, line: int, beats: int, id_: int) -> Burst:
        b = Burst(False, id_, line, beats)
        self.queue[False].append(b)
        return b

    def write(self, line: int, beats: int, id_: int) -> Burst:
        rng = self.rng
        b = Burst(True, id_, line, beats, [
            (rng.getrandbits(512), FULL_STRB if rng.random() < 0.8 else rng.getrandbits(64))
            for _ in range(beats)])
        self.queue[True].append(b)
        return b

    def random_burst(self, *, write: bool, max_lines: int | None = None,
                     oor: bool = False) -> Burst:
        """A burst of 1 .. ``max_lines`` lines inside one 4 KiB page of device memory
        (of the page beyond it with ``oor``)."""
        rng = self.rng
        top = max_lines or self.gate.max_burst_lines
        if oor:
            line = self.total_lines + rng.randrange(PAGE_LINES)
        else:
            line = rng.randrange(self.total_lines)
        room = min(PAGE_LINES - line % PAGE_LINES, self.mem_lines - line)
        if not oor:
            room = min(room, self.total_lines - line)
        beats = rng.randint(1, min(top, room))
        id_ = rng.randrange(1 << self.gate.id_width)
        return (self.write if write else self.read)(line, beats, id_)

    def random_bursts(self, n: int, *, write_share: float = 0.4, oor_share: float = 0.0,
                      max_lines: int | None = None) -> None:
        for _ in range(n):
            self.random_burst(write=self.rng.random() < write_share, max_lines=max_lines,
                              oor=self.rng.random() < oor_share)

    def preload(self) -> None:
        """Random contents in every line of PMEM (and the reference)."""
        for line in range(self.mem_lines):
            value = self.rng.getrandbits(512)
            self.ref[line] = value
            self.pmem.write_line(line * LINE_BYTES, value)

    def flip(self, first: int, pages: int, to_host: bool = False) -> None:
        self.flips.append((first, pages, to_host))

    # Manager model ----------------------------------------------------------------------
    def _conflicts(self, b: Burst) -> bool:
        """``b`` overlaps a burst in flight it must not overlap (a write in flight for a
        read; anything in flight for a write), so the reference stays exact."""
        lines = set(b.lines)
        for write in (False, True):
            if not (write or b.write):
                continue
            others = [o for q in self.open[write].values() for o in q]
            if self.cur[write] is not None and self.cur[write] is not b:
                others.append(self.cur[write])
            if any(lines.intersection(o.lines) for o in others):
                return True
        return False

    def _drive_manager(self, ctx, may_start: bool) -> None:
        up, rng, tr = self.gate.up, self.rng, self.traffic
        for write, ch in ((False, "ar"), (True, "aw")):
            q = self.queue[write]
            if (self.cur[write] is None and q and may_start and not rng.random() < tr.idle
                    and not self._conflicts(q[0])):
                b = self.cur[write] = q.popleft()
                addr = b.line * LINE_BYTES
                for f, v in (("id", b.id), ("addr", addr), ("len", b.beats - 1),
                             ("size", SIZE_LINE), ("burst", AxiBurst.INCR)):
                    ctx.set(getattr(up, f"{ch}{f}"), v)
                if write:
                    self.w_q.extend((b, k) for k in range(b.beats))
            ctx.set(getattr(up, f"{ch}valid"), self.cur[write] is not None)
        if self._w is None and self.w_q and not rng.random() < tr.idle:
            self._w = self.w_q.popleft()
            b, k = self._w
            ctx.set(up.wdata, b.data[k][0])
            ctx.set(up.wstrb, b.data[k][1])
            ctx.set(up.wlast, k == b.beats - 1)
        ctx.set(up.wvalid, self._w is not None)
        self._rready = not rng.random() < tr.resp_bp
        self._bready = not rng.random() < tr.resp_bp
        ctx.set(up.rready, self._rready)
        ctx.set(up.bready, self._bready)

    def _observe_manager(self, t: int, v: dict) -> None:
        for write, ch in ((False, "ar"), (True, "aw")):
            b = self.cur[write]
            if b is not None and v[f"{ch}ready"]:
                b.t_up = t
                self.bursts.append(b)
                # The gate allocates a direction's entries in ring order.
                self.holder[(write, self.taken[write] % self.gate.entries)] = b
                self.taken[write] += 1
                self.open[write].setdefault(b.id, deque()).append(b)
                self.cur[write] = None
        if self._w is not None and v["wready"]:
            self._w = None
        if v["rvalid"] and self._rready:
            q = self.open[False].get(v["rid"])
            assert q, f"R at {t} with ID {v['rid']} and no read of that ID open"
            b = q[0]        # same-ID responses in order: the oldest read of the ID
            line = b.line + b.got
            want = AxiResp.SLVERR if b.denied else AxiResp.OKAY
            assert v["rresp"] == want, f"R at {t}: resp {v['rresp']} (burst {b})"
            assert v["rdata"] == self.ref.get(line, 0), \
                f"R at {t}, ID {b.id}: data of line {line:#x} wrong (burst {b})"
            b.got += 1
            assert bool(v["rlast"]) == (b.got == b.beats), f"R at {t}: rlast on beat {b.got}"
            if b.got == b.beats:
                b.t_resp = t
                q.popleft()
        if v["bvalid"] and self._bready:
            q = self.open[True].get(v["bid"])
            assert q, f"B at {t} with ID {v['bid']} and no write of that ID open"
            b = q.popleft()
            assert v["bresp"] == (AxiResp.SLVERR if b.denied else AxiResp.OKAY), \
                f"B at {t}: resp {v['bresp']} (burst {b})"
            b.t_resp = t
            for k, (data, strb) in enumerate(b.data if not b.denied else ()):
                mask = strb_mask(strb)
                old = self.ref.get(b.line + k, 0)
                self.ref[b.line + k] = (old & ~mask) | (data & mask)

    # Gate scoreboard ----------------------------------------------------------------------
    def _on_acc(self, t: int, payload: int) -> None:
        a = CODEC["acc"].unpack(payload)
        assert self.enable, f"o_acc at {t} with the gate off"
        assert a["tag"] not in self.accs, f"o_acc at {t}: tag {a['tag']:#x} still open"
        write, _, _ = self.gate.untag(a["tag"])
        assert write == bool(a["write"]), f"o_acc at {t}: write flag and tag disagree"
        self.accs[a["tag"]] = (bool(a["write"]), a["line"])
        self.acc_count += 1

    def _on_grant(self, t: int, payload: int) -> None:
        g = self.grant_codec.unpack(payload)
        write, line = self.accs.pop(g["tag"])
        oor = line >= self.total_lines
        denied = self.host.failed.pop(g["handle"], None) is not None
        assert bool(g["denied"]) == denied, f"grant at {t} of line {line:#x}: {g}"
        error = oor or denied
        assert bool(g["error"]) == error, f"grant at {t} of line {line:#x}: {g}"
        if not error:
            self.checker.grant(t, line=line, write=write, handle=g["handle"],
                               cqid=g["handle"], host_bias=bool(g["host_bias"]))
        self.grants["denied" if denied else "error" if oor else
                    "host" if g["host_bias"] else "device"] += 1
        _, entry, k = self.gate.untag(g["tag"])
        if denied:
            self.holder[(write, entry)].denied = True
        self.granted.setdefault((write, entry), []).append(
            (k, line, None if error else g["handle"]))

    def _on_down(self, t: int, ev: tuple) -> None:
        kind = ev[0]
        if kind in ("ar", "aw"):
            write, (id_, addr, length) = kind == "aw", ev[1:]
            handles = []
            if self.enable:
                # The gate issues a direction's bursts in the order it allocated their
                # entries, which is ring order: the j-th burst down held entry j % entries.
                entry = self.issued[write] % self.gate.entries
                self.issued[write] += 1
                got = sorted(self.granted.pop((write, entry), []))
                want = list(range(length + 1))
                assert [k for k, _, _ in got] == want, (
                    f"{kind.upper()} at {t} (ID {id_}, entry {entry}) with lines "
                    f"{[k for k, _, _ in got]} of {length + 1} granted")
                for k, line, h in got:
                    assert line == addr // LINE_BYTES + k, f"{kind.upper()} at {t}: line {k}"
                    if h is not None:
                        handles.append(h)
            self.down_open[write].setdefault(id_, deque()).append(handles)
        else:
            write = kind == "b"
            self.doneable.update(self.down_open[write][ev[1]].popleft())

    def _on_done(self, t: int, handle: int) -> None:
        assert handle in self.doneable, \
            f"done at {t} of handle {handle} before its burst's R last / B (or twice)"
        self.doneable.remove(handle)
        self.checker.done(t, handle)
        self.done_count += 1

    # Running -----------------------------------------------------------------------------
    def busy(self) -> bool:
        return bool(any(self.queue.values()) or any(c is not None for c in self.cur.values())
                    or any(q for d in self.open.values() for q in d.values()) or self.w_q
                    or self._w is not None or self.flips or self._flip is not None)

    def run(self, *, max_cycles: int = 40_000, drain: int = 8) -> TB:
        gate, dcoh, host, rng, tr = self.gate, self.dcoh, self.host, self.rng, self.traffic
        up = gate.up
        mgr_names = ("arready", "awready", "wready", "rvalid", "rid", "rdata", "rresp",
                     "rlast", "bvalid", "bid", "bresp")
        streams = {"acc": gate.o_acc, "grant": gate.i_grant, "done": gate.o_done,
                   "d2h": dcoh.o_d2h_req}
        rules = {name: StreamRule(name) for name in ("acc", "done")}
        sampled = [*(getattr(up, n) for n in mgr_names),
                   *(x for s in streams.values()
                     for x in (s.valid, s.ready, Value.cast(s.payload))),
                   gate.ev_grant_host, gate.ev_grant_device, gate.ev_range_error, gate.o_busy,
                   dcoh.o_flip.as_value(), dcoh.o_busy, gate.ev_denied]
        h2d_ports = {"rsp": dcoh.i_h2d_rsp, "data": dcoh.i_h2d_data}
        h2d_codec = {"rsp": Codec(H2DRsp), "data": Codec(H2DData)}
        self._w = None
        self._flip = None

        async def bench(ctx):
            t, quiet, offered, h2d = 0, 0, None, None
            ctx.set(dcoh.hdm_base, self.hdm_base)
            ctx.set(gate.enable, self.enable)
            while True:
                self.t = t
                for hook in self.hooks:
                    hook(self, t)
                # Flips: one at a time; the ones queued first hold the traffic back.
                start = None
                if self._flip is None and self.flips and not ctx.get(dcoh.o_flip.busy):
                    start = self._flip = (t, *self.flips.popleft())
                    ctx.set(dcoh.i_flip.as_value(), self.flip_codec.pack(
                        first_page=start[1], pages=start[2], to_host=start[3]))
                ctx.set(dcoh.i_flip_start, start is not None)
                may_start = self.traffic_start is not None or (
                    not self.flips and self._flip is None and not ctx.get(dcoh.o_flip.busy))
                if may_start and self.traffic_start is None:
                    self.traffic_start = t
                self._drive_manager(ctx, may_start)
                self.port.drive(ctx)
                d2h_ready = not rng.random() < tr.d2h_bp
                ctx.set(dcoh.o_d2h_req.ready, d2h_ready)
                if offered is None and not rng.random() < tr.fwd_idle:
                    offered = host.offer(t)
                    if offered is not None:
                        ctx.set(dcoh.i_fwd.payload.as_value(), CODEC["fwd"].pack(**offered))
                ctx.set(dcoh.i_fwd.valid, offered is not None)
                if h2d is None and not rng.random() < tr.fwd_idle:
                    h2d = host.offer_h2d(t)
                    if h2d is not None:
                        ctx.set(h2d_ports[h2d[0]].payload.as_value(),
                                h2d_codec[h2d[0]].pack(**h2d[1]))
                for name, port in h2d_ports.items():
                    ctx.set(port.valid, h2d is not None and h2d[0] == name)

                _, _, *vals = await ctx.tick().sample(*sampled, *self.port.signals())
                n = len(mgr_names)
                mgr = dict(zip(mgr_names, vals[:n], strict=True))
                hs = {}
                for i, name in enumerate(streams):
                    valid, ready, payload = vals[n + 3 * i: n + 3 * i + 3]
                    if name in rules:
                        rules[name].observe(t, valid, ready, payload)
                    hs[name] = payload if valid and ready else None
                ev_host, ev_dev, ev_err, busy, flip_st, dcoh_busy, ev_den = vals[n + 12: n + 19]
                self.port.observe(tuple(vals[n + 19:]))

                self._observe_manager(t, mgr)
                if hs["d2h"] is not None:
                    host.d2h(t, CODEC["d2h"].unpack(hs["d2h"]))
                if offered is not None:
                    host.take(t)
                    offered = None
                if h2d is not None:
                    host.take_h2d(t)
                    h2d = None
                if hs["acc"] is not None:
                    self._on_acc(t, hs["acc"])
                if hs["grant"] is not None:
                    self._on_grant(t, hs["grant"])
                for ev in self.port.events:
                    self._on_down(t, ev)
                if hs["done"] is not None:
                    self._on_done(t, hs["done"])
                self.events.update({"host": ev_host, "device": ev_dev, "error": ev_err,
                                    "denied": ev_den})
                fs = FLIP_STATUS.unpack(flip_st)
                if self._flip is not None and t > self._flip[0] and not fs["busy"]:
                    t0, first, pages, to_host = self._flip
                    assert fs["done"], f"flip started at {t0} ended without done"
                    self.checker.flip_done(t0, t, first, pages, to_host=to_host,
                                           error=bool(fs["error"]))
                    self.flip_log.append((t0, t, first, pages, to_host, bool(fs["error"])))
                    self._flip = None

                t += 1
                assert t < max_cycles, (
                    f"no progress after {t} cycles (hang?): queued "
                    f"{[len(q) for q in self.queue.values()]}, open "
                    f"{[sum(map(len, d.values())) for d in self.open.values()]}, W owed "
                    f"{len(self.w_q)}, gate busy {busy}, host: {host.outstanding()}")
                pending = (self.busy() or busy or dcoh_busy or offered or h2d
                           or not host.idle())
                quiet = 0 if pending else quiet + 1
                if quiet >= drain:
                    self.t = t
                    return

        top = Module()
        top.domains.sync = ClockDomain("sync")
        top.submodules.gate = gate
        top.submodules.dcoh = dcoh
        wiring.connect(top, gate.o_acc, dcoh.i_acc)
        wiring.connect(top, dcoh.o_grant, gate.i_grant)
        wiring.connect(top, gate.o_done, dcoh.i_done)
        sim = Simulator(top)
        sim.add_clock(1e-8)
        sim.add_testbench(bench)
        sim.run()
        errors = [e for r in rules.values() for e in r.errors] + self.port.errors
        assert not errors, "\n".join(errors[:10])
        return self

    def check_end(self) -> None:
        """Everything answered, every granted handle done once, pulses as grants."""
        assert not self.busy()
        assert all(b.t_resp >= 0 for b in self.bursts)
        assert not self.accs, "o_acc requests without a grant"
        assert not self.granted, "granted lines never issued downstream"
        assert not self.doneable and not self.checker.outstanding, "handles never done"
        assert not any(q for d in self.down_open.values() for q in d.values())
        assert self.pmem.outstanding == (0, 0)
        assert self.events == self.grants, f"events {self.events} vs grants {self.grants}"
        for line, value in self.ref.items():
            assert self.pmem.read_line(line * LINE_BYTES) == value, f"line {line:#x}"
        if self.enable:
            assert self.acc_count == sum(b.beats for b in self.bursts)


# --- parameters --------------------------------------------------------------------------

GOOD = dict(addr_width=30, id_width=8)


@pytest.mark.parametrize("kwargs, message", [
    ({"addr_width": 6}, "addr_width must be an integer from 7 to 52, not 6"),
    ({"addr_width": 53}, "addr_width must be an integer from 7 to 52, not 53"),
    ({"addr_width": 30.0}, "addr_width must be an integer from 7 to 52, not 30.0"),
    ({"id_width": 0}, "id_width must be an integer from 1 to 32, not 0"),
    ({"id_width": True}, "id_width must be an integer from 1 to 32, not True"),
    ({"handle_bits": 0}, "handle_bits must be an integer from 1 to 8, not 0"),
    ({"handle_bits": 9}, "handle_bits must be an integer from 1 to 8, not 9"),
    ({"entries": 1}, "entries must be a power of two from 2 to 64, not 1"),
    ({"entries": 12}, "entries must be a power of two from 2 to 64, not 12"),
    ({"entries": 128}, "entries must be a power of two from 2 to 64, not 128"),
    ({"max_burst_lines": 0}, "max_burst_lines must be a power of two from 1 to 256, not 0"),
    ({"max_burst_lines": 24}, "max_burst_lines must be a power of two from 1 to 256, not 24"),
    ({"max_burst_lines": 512},
     "max_burst_lines must be a power of two from 1 to 256, not 512"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        DcohGate(**{**GOOD, **kwargs})


def test_parameters_are_read_only_properties():
    gate = DcohGate(addr_width=40, id_width=5, handle_bits=7, entries=4, max_burst_lines=8)
    assert (gate.addr_width, gate.id_width, gate.handle_bits, gate.entries,
            gate.max_burst_lines) == (40, 5, 7, 4, 8)
    for name in ("addr_width", "id_width", "handle_bits", "entries", "max_burst_lines",
                 "grant_layout"):
        with pytest.raises(AttributeError):
            setattr(gate, name, 1)
    # The grant layout is the DCOH's for the same number of handles.
    assert gate.grant_layout == Dcoh(cqids=128).grant_layout
    assert gate.untag(gate.tag(write=True, entry=3, k=5)) == (True, 3, 5)


# --- traffic -------------------------------------------------------------------------------

def test_pass_through(seed):
    """With ``enable`` low the gate is wires: no ``o_acc``, every AR / AW reaches
    ``down`` in the cycle it is taken from ``up``, data and order as without the gate."""
    tb = TB(seed=seed, traffic=ROUGH, enable=False)
    tb.preload()
    tb.random_bursts(120)
    down_t = []
    tb.hooks.append(lambda tb, t: down_t.extend(t - 1 for e in tb.port.events
                                                if e[0] in ("ar", "aw")))
    tb.run()
    tb.check_end()
    assert tb.acc_count == 0 and not tb.grants
    assert sorted(b.t_up for b in tb.bursts) == sorted(down_t)


CONFIGS = {
    # The smallest gate: two entries a direction, single-line bursts, two handles.
    "smallest": dict(entries=2, max_burst_lines=1, handle_bits=1, id_width=1, pages=3,
                     page_bytes=256),
    "mid": dict(entries=8, max_burst_lines=16, handle_bits=5, pages=5, page_bytes=1024),
}


@pytest.mark.parametrize("traffic", ["smooth", "rough"])
@pytest.mark.parametrize("bias", ["device", "host", "mixed"])
def test_random_traffic(bias, traffic, seed):
    """Random read and write bursts (1 .. 16 lines, random IDs) over device memory in
    device bias, host bias or both: data, per-ID order, grants before issue and dones
    after responses all hold; with ``rough``, idle and backpressure everywhere."""
    tb = TB(seed=seed, traffic=ROUGH if traffic == "rough" else SMOOTH, **CONFIGS["mid"])
    tb.preload()
    pages = tb.dcoh.pages
    if bias == "device":
        tb.flip(0, pages)
    elif bias == "mixed":
        tb.flip(0, pages // 2 + 1)
    tb.random_bursts(50 if bias == "host" else 80)
    tb.run()
    tb.check_end()
    print(f"{bias}/{traffic}: {tb.t} cycles, {len(tb.bursts)} bursts, grants "
          f"{dict(tb.grants)}, dones {tb.done_count}")
    if bias != "host":
        assert tb.grants["device"] > 0
    if bias != "device":
        assert tb.grants["host"] > 0


def test_smallest_config(seed):
    """Two entries a direction, single-line bursts, two DCOH handles, one ID bit: every
    resource is contended, nothing is lost."""
    tb = TB(seed=seed, traffic=ROUGH, **CONFIGS["smallest"])
    tb.preload()
    tb.flip(0, 1)
    tb.random_bursts(150, oor_share=0.05)
    # About 1 seed in 2,000 draws no burst beyond device memory: draw on (same seed).
    while not any(b.line >= tb.total_lines for q in tb.queue.values() for b in q):
        tb.random_bursts(1, oor_share=0.05)
    tb.run()
    tb.check_end()
    assert tb.grants["device"] and tb.grants["host"] and tb.grants["error"]


def test_flip_to_host_under_traffic(seed):
    """A flip of every page back to host bias while bursts run in device bias completes
    (it waits only for dones, which wait for nothing but responses), and the bursts
    after it go through the host."""
    tb = TB(seed=seed, traffic=ROUGH, **CONFIGS["mid"])
    tb.preload()
    tb.flip(0, tb.dcoh.pages)
    tb.random_bursts(70)
    state = {}

    def hook(tb: TB, t: int) -> None:
        if "t" not in state and len(tb.bursts) >= 20:
            state["t"] = t
            state["device"] = tb.grants["device"]
            tb.flip(0, tb.dcoh.pages, to_host=True)
    tb.hooks.append(hook)
    tb.run()
    tb.check_end()
    assert len(tb.flip_log) == 2
    t0, t1, *_, to_host, error = tb.flip_log[1]
    assert to_host and not error
    assert state["device"] > 0 and tb.grants["host"] > 0
    print(f"flip to host under traffic: {t1 - t0} cycles, grants {dict(tb.grants)}")


def test_out_of_range(seed):
    """Bursts in the page beyond device memory get error grants (no dones), are still
    issued and answered by PMEM, and pulse ``ev_range_error`` per line; nothing hangs."""
    tb = TB(seed=seed, traffic=ROUGH, **CONFIGS["mid"])
    tb.preload()
    tb.flip(0, 2)
    tb.random_bursts(40, oor_share=0.3)
    # About 1 seed in 1.5 million draws no burst beyond device memory: draw on (same seed).
    while not any(b.line >= tb.total_lines for q in tb.queue.values() for b in q):
        tb.random_bursts(1, oor_share=0.3)
    tb.run()
    tb.check_end()
    oor = sum(max(0, min(b.lines.stop, tb.mem_lines) - max(b.line, tb.total_lines))
              for b in tb.bursts)
    assert oor > 0 and tb.grants["error"] == oor == tb.events["error"]


def test_denied_lines(seed):
    """The host answers a fifth of the DCOH's requests GO-Err (H2D Rsp, or H2D Data for a
    read): each such line gets a denied grant (no done); its burst is still issued, a
    denied write with no byte enabled (PMEM keeps its old contents, checked at the end)
    and every R beat or the B of a denied burst goes up as SLVERR; ``ev_denied`` pulses
    per denied line and ``ev_range_error`` does not."""
    rng = random.Random(seed + 9)

    def answer(req):
        if rng.random() < 0.2:
            read = req.opcode in (D2HReqOpcode.RdCurr.value, D2HReqOpcode.RdShared.value)
            return rng.choice(("go_err", "data_err")) if read else "go_err"
        return "fwd"
    tb = TB(seed=seed, traffic=ROUGH, answer=answer, **CONFIGS["mid"])
    tb.preload()
    tb.random_bursts(60, write_share=0.5)
    tb.run()
    tb.check_end()
    denied = [b for b in tb.bursts if b.denied]
    assert any(b.write for b in denied) and any(not b.write for b in denied), denied
    assert tb.grants["denied"] == tb.events["denied"] > 0 and not tb.events["error"]


def test_fill_to_full_with_responses_held(seed):
    """The manager holds ``rready`` / ``bready`` low for a while: every entry of both
    directions fills, the gate stops taking AR / AW, and nothing is lost on release."""
    tb = TB(seed=seed, traffic=Traffic(idle=0.1, d2h_bp=0.2), entries=4, max_burst_lines=4,
            handle_bits=5, pages=4, page_bytes=1024)
    tb.preload()
    tb.flip(0, 2)
    for i in range(20):     # reads and writes apart, so that none waits for another
        tb.read(i * 4 % 32, 4, i % 8)
        tb.write(32 + i * 4 % 32, 4, i % 8)
    held = {"until": None, "max": 0}
    drive = tb._drive_manager

    def holding(ctx, may_start: bool) -> None:
        drive(ctx, may_start)
        if held["until"] is None and tb.traffic_start is not None:
            held["until"] = tb.t + 300
        if held["until"] is not None and tb.t < held["until"]:
            tb._rready = tb._bready = False
            ctx.set(tb.gate.up.rready, 0)
            ctx.set(tb.gate.up.bready, 0)
            held["max"] = sum(b.t_resp < 0 for b in tb.bursts)
    tb._drive_manager = holding
    tb.run()
    tb.check_end()
    assert held["max"] == 2 * tb.gate.entries


# --- latency and throughput --------------------------------------------------------------

def test_idle_latency(seed):
    """The latencies the docstring states: an AR / AW of L lines reaches ``down`` L + 4
    cycles after ``up`` took it (device bias, idle gate, everything ready); the first
    done of a burst is taken 2 cycles after its R last / B."""
    tb = TB(seed=seed, pmem_timing=PmemTiming(read_latency=20, write_latency=10),
            **CONFIGS["mid"])
    tb.flip(0, tb.dcoh.pages)
    plan = [(False, 1), (False, 16), (True, 1), (True, 4)]
    bursts: list[Burst] = []
    got: dict[str, list] = {"down": [], "done": []}
    state = {"quiet": 0, "resp": None, "dones": 0}

    def hook(tb: TB, t: int) -> None:
        for e in tb.port.events:        # the handshakes of cycle t - 1
            if e[0] in ("ar", "aw"):
                got["down"].append((bursts[-1].beats, t - 1 - bursts[-1].t_up))
            else:
                state["resp"] = t - 1
        if tb.done_count > state["dones"] and state["resp"] is not None:
            got["done"].append(t - 1 - state["resp"])
            state["resp"] = None
        state["dones"] = tb.done_count
        # The next burst once everything has been quiet for a while.
        state["quiet"] = 0 if tb.traffic_start is None or tb.busy() else state["quiet"] + 1
        if state["quiet"] > 25 and plan:
            write, beats = plan.pop(0)
            bursts.append((tb.write if write else tb.read)(16 * len(bursts), beats, 0))
            state["quiet"] = 0
    tb.hooks.append(hook)
    tb.run(drain=40)
    tb.check_end()
    assert not plan
    assert got == {"down": [(1, 5), (16, 20), (1, 5), (4, 8)], "done": [2, 2, 2, 2]}, got


@pytest.mark.long
def test_throughput_device_bias(seed):
    """Read bursts of 16 lines, many in flight, pages in device bias, PMEM latency 100:
    the gate sustains close to one line per cycle. A line holds its DCOH handle for
    about 135 cycles (grant to done), so the DCOH has 128 handles here (0.95 lines per
    cycle at best; 256 handles reach 1.0 but simulate twice as slowly)."""
    tb = TB(seed=seed, pages=4, page_bytes=4096, handle_bits=7, entries=16, id_width=4,
            pmem_timing=PmemTiming(read_latency=100, write_latency=40,
                                   peak_lines_per_cycle=2, channels=4))
    tb.flip(0, tb.dcoh.pages)
    n, skip = 22, 5
    for _ in range(n):
        tb.read(16 * tb.rng.randrange(tb.total_lines // 16), 16, tb.rng.randrange(16))
    tb.run()
    tb.check_end()
    resp = sorted(b.t_resp for b in tb.bursts)
    first = min(b.t_up for b in tb.bursts)
    # Steady state: between the responses of the skip-th and the last burst.
    steady = 16 * (n - skip) / (resp[-1] - resp[skip - 1])
    print(f"throughput: {steady:.3f} lines/cycle steady; {16 * n} lines in "
          f"{resp[-1] - first} cycles from the first AR to the last R")
    assert steady >= 0.85, steady


# --- lint ------------------------------------------------------------------------------------

LINT = {
    "default": dict(addr_width=30, id_width=8),
    "smallest": dict(addr_width=7, id_width=1, handle_bits=1, entries=2, max_burst_lines=1),
    # The most entries and handles (max_burst_lines only deepens the handle memory).
    "largest": dict(addr_width=52, id_width=16, handle_bits=8, entries=64,
                    max_burst_lines=32),
}


@pytest.mark.parametrize("config", list(LINT))
def test_verilog_lints_clean(config, tmp_path):
    assert_lints_clean(DcohGate(**LINT[config]), f"dcoh_gate_{config}", tmp_path)
