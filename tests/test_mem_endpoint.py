# amaranth: UnusedElaboratable=no
"""CXL.mem endpoint (hw/cxl/mem_endpoint.py), fast tier: Amaranth simulator.

A :class:`TB` owns the clock, reset, the M2S drivers, the S2M sinks (each with a
stream-rule checker), a small AXI4 subordinate memory (latency, random backpressure,
out-of-order responses) and a scoreboard that replays the accepted requests in
handshake order through :func:`expected`, a plain-Python statement of the contract in
``docs/mem-endpoint.md``. Every test ends with :meth:`TB.check`, so even the directed
cases compare every response, every error and the final memory image.

Random tests print their seed; ``SEED=<n>`` replays one. The first line silences
Amaranth's unused-elaboratable warning: the constructor tests build endpoints on purpose
without simulating them.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from hw.bus.axi import AxiBurst, AxiResp
from hw.config import DeviceConfig, load_config
from hw.cxl.mem_endpoint import (
    IMM_FIFO_DEPTH,
    ErrorChannel,
    ErrorInfo,
    MemEndpoint,
    MemError,
    dev_load_thresholds,
)
from hw.cxl.messages import (
    S2MDRS,
    S2MNDR,
    Codec,
    DRSOpcode,
    M2SReq,
    M2SReqOpcode,
    M2SRwD,
    M2SRwDOpcode,
    MetaField,
    MetaValue,
    NDROpcode,
)
from sim.golden_memory import FULL_MASK, GoldenMemory, merge_line

from .noise import STALL_BURSTS, Stalls

REQ, RWD, NDR, DRS = Codec(M2SReq), Codec(M2SRwD), Codec(S2MNDR), Codec(S2MDRS)
ERR_INFO = Codec(ErrorInfo)
Rq, Wr = M2SReqOpcode, M2SRwDOpcode
LINE_BYTES = 64
ECHO = ("tag", "ld_id", "meta_field", "meta_value")


def small() -> DeviceConfig:
    return load_config("small")


def odd() -> DeviceConfig:
    return load_config("odd")


def _line_bytes(value: int) -> bytes:
    return value.to_bytes(LINE_BYTES, "little")


def _line_int(value: bytes) -> int:
    return int.from_bytes(value, "little")


# --- The contract in Python -----------------------------------------------------------

def ndr_for_meta(meta_field: int, meta_value: int) -> int:
    """The NDR a MemRd / MemInv / MemInvNT gets: the state MetaValue asks for with
    MetaField Meta0-State; with No-Op (or a reserved MetaField) MetaValue is reserved and
    ignored, so Cmp."""
    if meta_field != MetaField.Meta0State.value:
        return NDROpcode.Cmp.value
    return {MetaValue.Shared.value: NDROpcode.CmpS.value,
            MetaValue.Any.value: NDROpcode.CmpE.value}.get(meta_value, NDROpcode.Cmp.value)


@dataclass
class Expect:
    ndr: dict | None = None
    drs: dict | None = None
    errors: int = 0         # MemError bits
    pmem: str | None = None  # "r" / "w" if the request reaches PMEM


def meta_returned(ch: str, f: dict, *, cfg: DeviceConfig, base: int, size: int,
                  meta: dict[int, int]) -> int:
    """The MetaValue the responses to one request carry, applying its effect on the
    per-line meta state ``meta`` (``docs/mem-endpoint.md``, "Meta state"): with
    ``meta_state``, an in-range request the endpoint serves (MemRd, MemRdData, MemInv,
    MemInvNT, MemClnEvct; MemWr / MemWrPtl that write) with MetaField Meta0-State
    returns the line's state before it (Any after power-on) and stores its MetaValue;
    an in-range MemRdData, whatever its MetaField, returns the state before it and moves
    I to A (S and A stay); everything else echoes its MetaValue."""
    line = f["address"] >> 1 if ch == "req" else f["address"]
    dev = line - base
    in_range = line >= base and dev < size and dev < cfg.pmem_lines
    op = f["opcode"]
    if ch == "req":
        served = op in (Rq.MemRd.value, Rq.MemRdData.value, Rq.MemInv.value,
                        Rq.MemInvNT.value, Rq.MemClnEvct.value)
    else:
        served = (op in (Wr.MemWr.value, Wr.MemWrPtl.value) and not f["poison"]
                  and not (op == Wr.MemWrPtl.value and f["byte_enable"] == 0))
    rdd = ch == "req" and op == Rq.MemRdData.value
    if not (cfg.meta_state and in_range and served
            and (rdd or f["meta_field"] == MetaField.Meta0State.value)):
        return f["meta_value"]
    old = meta.get(dev, MetaValue.Any.value)
    if rdd:     # MemRdData ignores MetaField / MetaValue: I -> A, S and A stay
        meta[dev] = MetaValue.Any.value if old == MetaValue.Invalid.value else old
    else:
        meta[dev] = f["meta_value"]
    return old


def expected(ch: str, f: dict, *, cfg: DeviceConfig, base: int, size: int,
             mem: GoldenMemory, bad_resp, meta: dict[int, int]) -> Expect:
    """What the endpoint must answer to one request, applying its effect on ``mem`` and
    on the meta state ``meta``."""
    echo = {k: f[k] for k in ECHO}
    echo["meta_value"] = meta_returned(ch, f, cfg=cfg, base=base, size=size, meta=meta)
    line = f["address"] >> 1 if ch == "req" else f["address"]
    dev = line - base
    in_range = line >= base and dev < size and dev < cfg.pmem_lines
    e = Expect()
    op = f["opcode"]
    if ch == "req":
        if op in (Rq.MemRd.value, Rq.MemRdData.value):
            ndr_op = NDROpcode.CmpE.value if op == Rq.MemRdData.value else ndr_for_meta(
                f["meta_field"], f["meta_value"])
            if in_range:
                bad = bad_resp("r", dev)
                e.pmem = "r"
                e.drs = dict(echo, opcode=DRSOpcode.MemData.value, poison=int(bad),
                             data=_line_int(mem.read(dev)))
                e.ndr = dict(echo, opcode=ndr_op)
                e.errors = bad << MemError.PMEM_RESP
            else:
                # MemData-NXM alone, in place of DRS + NDR (CXL 3.x Table 3-53).
                e.drs = dict(echo, opcode=DRSOpcode.MemDataNXM.value, poison=1,
                             data=(1 << 512) - 1)
                e.errors = 1 << MemError.HDM_RANGE
        elif op in (Rq.MemInv.value, Rq.MemInvNT.value, Rq.MemClnEvct.value):
            ndr_op = NDROpcode.Cmp.value if op == Rq.MemClnEvct.value else ndr_for_meta(
                f["meta_field"], f["meta_value"])
            e.ndr = dict(echo, opcode=ndr_op)
            e.errors = (not in_range) << MemError.HDM_RANGE
        elif op == Rq.MemSpecRd.value:
            pass
        elif op in (Rq.MemRdFwd.value, Rq.MemWrFwd.value):
            e.errors = 1 << MemError.UNEXPECTED_FWD
        else:
            e.ndr = dict(echo, opcode=NDROpcode.Cmp.value)
            e.errors = 1 << MemError.RSVD_OPCODE
    else:
        e.ndr = dict(echo, opcode=NDROpcode.Cmp.value)
        if op in (Wr.MemWr.value, Wr.MemWrPtl.value):
            ptl = op == Wr.MemWrPtl.value
            empty = ptl and f["byte_enable"] == 0
            e.errors = (((not in_range) << MemError.HDM_RANGE) |
                        (f["poison"] << MemError.POISON) | (empty << MemError.EMPTY_PTL))
            if not e.errors:
                e.pmem = "w"
                if bad_resp("w", dev):
                    e.errors = 1 << MemError.PMEM_RESP
                mem.write(dev, _line_bytes(f["data"]), f["byte_enable"] if ptl else FULL_MASK)
        elif op == Wr.BIConflict.value:
            e.ndr = dict(echo, opcode=NDROpcode.BIConflictAck.value)
        else:
            e.errors = 1 << MemError.RSVD_OPCODE
    return e


# --- Test bench -----------------------------------------------------------------------

@dataclass
class Item:
    ch: str
    fields: dict
    delay: int = 0          # idle cycles before presenting
    t_valid: int = -1       # edge at which valid was first sampled
    t_accept: int = -1      # edge of the handshake


@dataclass
class Log:
    accepted: list[Item] = field(default_factory=list)
    ndr: list[tuple[int, dict]] = field(default_factory=list)
    drs: list[tuple[int, dict]] = field(default_factory=list)
    errors: list[tuple[int, int, dict]] = field(default_factory=list)
    ar: list[tuple[int, int, int]] = field(default_factory=list)       # (t, id, line)
    aw: list[tuple[int, int, int]] = field(default_factory=list)
    r: list[tuple[int, int, int]] = field(default_factory=list)  # (t taken, id, t first valid)
    b: list[tuple[int, int, int]] = field(default_factory=list)
    perf: Counter = field(default_factory=Counter)
    max_occupancy: int = 0


class TB:
    """Clock, reset, drivers, sinks, AXI subordinate memory and scoreboard."""

    def __init__(self, cfg: DeviceConfig, *, seed: int = 0, rd_latency=(1, 1), wr_latency=(1, 1),
                 reorder: bool = False, axi_ready: float = 1.0, m2s_idle: float = 0.0,
                 s2m_ready: float = 1.0, hdm_base: int | None = None,
                 hdm_size: int | None = None, bad_resp=lambda kind, line: False,
                 bursts: dict | None = None):
        self.cfg = cfg
        self.dut = MemEndpoint(config=cfg)
        top = Module()
        top.domains.sync = self.cd = ClockDomain("sync")
        top.submodules.dut = self.dut
        self.sim = Simulator(top)
        self.sim.add_clock(1e-8)
        self.rng = random.Random(seed)
        self.rd_latency, self.wr_latency, self.reorder = rd_latency, wr_latency, reorder
        self.axi_ready, self.m2s_idle, self.s2m_ready = axi_ready, m2s_idle, s2m_ready
        # Long stall bursts on every channel (``tests.noise.STALL_BURSTS``), besides the
        # per-cycle noise; ``self.stalls`` keeps each channel's for the coverage check.
        self.bursts = bursts or {}
        self.stalls: dict[str, Stalls] = {}
        self.base = cfg.hdm_base // LINE_BYTES if hdm_base is None else hdm_base
        self.size = cfg.hdm_size // LINE_BYTES if hdm_size is None else hdm_size
        self.bad_resp = bad_resp
        self.pmem: dict[int, int] = {}          # device line -> 512-bit value
        self.queues = {"req": deque(), "rwd": deque()}
        self.log = Log()
        self.next_tag = 0
        self.reset_at: int | None = None        # edge at which to pulse rst (2 cycles)
        self.pmem_at_reset: dict[int, int] = {}

    # Stimulus ------------------------------------------------------------------------
    def _item(self, ch: str, fields: dict, delay: int) -> dict:
        if "tag" not in fields:
            fields["tag"] = self.next_tag
            self.next_tag = (self.next_tag + 1) % (1 << 16)
        for k in ("ld_id", "meta_field", "meta_value"):
            fields.setdefault(k, 0)
        self.queues[ch].append(Item(ch, fields, delay))
        return fields

    def req(self, op, line: int, *, delay: int = 0, **kw) -> dict:
        """Queue an M2S Req for host line address ``line``."""
        return self._item("req", dict(opcode=int(getattr(op, "value", op)), address=line << 1,
                                      **kw), delay)

    def rwd(self, op, line: int, data: int = 0, *, delay: int = 0, **kw) -> dict:
        kw.setdefault("byte_enable", FULL_MASK if op == Wr.MemWrPtl else 0)
        kw.setdefault("poison", 0)
        return self._item("rwd", dict(opcode=int(getattr(op, "value", op)), address=line,
                                      data=data, **kw), delay)

    def host(self, dev_line: int) -> int:
        """Host line address of device line ``dev_line``."""
        return self.base + dev_line

    # Processes -----------------------------------------------------------------------
    async def _driver(self, ctx, ch: str):
        port = self.dut.i_m2s_req if ch == "req" else self.dut.i_m2s_rwd
        codec = REQ if ch == "req" else RWD
        queue, cur, idle, t = self.queues[ch], None, 0, 0
        stall = self.stalls[f"m2s_{ch}"] = Stalls(self.rng, self.m2s_idle, **self.bursts)
        while True:
            if cur is None and queue:
                stall.p = self.m2s_idle
                if idle < queue[0].delay or stall():
                    idle += 1
                else:
                    cur, idle = queue.popleft(), 0
                    ctx.set(port.payload.as_value(), codec.pack(**cur.fields))
                    ctx.set(port.valid, 1)
                    cur.t_valid = t + 1
            _, rst, ready = await ctx.tick().sample(port.ready)
            t += 1
            if rst:
                queue.clear()
                cur = None
                ctx.set(port.valid, 0)
            elif cur is not None and ready:
                cur.t_accept = t
                self.log.accepted.append(cur)
                cur = None
                ctx.set(port.valid, 0)

    async def _sink(self, ctx, port, codec: Codec, out: list):
        held, t = None, 0
        name = "s2m_ndr" if codec is NDR else "s2m_drs"
        stall = self.stalls[name] = Stalls(self.rng, 0.0, **self.bursts)
        while True:
            stall.p = 1.0 - self.s2m_ready          # (tests change it mid-run)
            ready = not stall()
            ctx.set(port.ready, ready)
            _, rst, valid, payload = await ctx.tick().sample(port.valid, port.payload.as_value())
            t += 1
            if rst:
                held = None
                continue
            if held is not None:
                assert valid and payload == held, f"{port} dropped or changed a payload at {t}"
            held = payload if valid and not ready else None
            if valid and ready:
                out.append((t, codec.unpack(payload)))

    async def _monitor(self, ctx):
        dut, t = self.dut, 0
        while True:
            _, rst, err, info, occ, load, read, write, busy = await ctx.tick().sample(
                dut.o_err_set, dut.o_err_info.as_value(), dut.o_occupancy, dut.o_dev_load,
                dut.o_perf.read, dut.o_perf.write, dut.o_perf.busy)
            t += 1
            if self.reset_at is not None and t == self.reset_at:
                ctx.set(self.cd.rst, 1)
            if self.reset_at is not None and t == self.reset_at + 2:
                ctx.set(self.cd.rst, 0)
            if rst:
                continue
            if err:
                self.log.errors.append((t, err, ERR_INFO.unpack(info)))
            assert occ <= self.cfg.max_tags
            t1, t2, t3 = dev_load_thresholds(self.cfg.max_tags)
            assert load == (occ >= t1) + (occ >= t2) + (occ >= t3), (occ, load)
            assert busy or not occ
            self.log.max_occupancy = max(self.log.max_occupancy, occ)
            self.log.perf.update(read=read, write=write)

    async def _pmem(self, ctx):
        """AXI4 subordinate: reads sample memory when R is first presented and writes take
        effect when B is first presented, so an endpoint that issues a dependent request
        early sees the wrong data."""
        p, rng, t = self.dut.pmem, self.rng, 0
        ar_wait, aw_q, w_q, b_wait = [], deque(), deque(), []
        r_cur = b_cur = None
        outstanding: set[int] = set()
        held = {}
        axi_stalls = {k: Stalls(rng, 0.0, **self.bursts) for k in ("ar", "aw", "w")}
        self.stalls.update({f"axi_{k}": v for k, v in axi_stalls.items()})
        def latency(span):
            return rng.randint(*span)
        def pick(waiting):
            due = [x for x in waiting if x[0] <= t]
            if not due:
                return None
            x = rng.choice(due) if self.reorder else min(due, key=lambda x: x[1])
            waiting.remove(x)
            return x
        while True:
            if r_cur is None and (x := pick(ar_wait)):
                _, _, rid, line = x
                bad = self.bad_resp("r", line)
                r_cur = (rid, t + 1)
                ctx.set(p.rid, rid)
                ctx.set(p.rdata, self.pmem.get(line, 0))
                ctx.set(p.rresp, AxiResp.SLVERR if bad else AxiResp.OKAY)
                ctx.set(p.rlast, 1)
            if b_cur is None and (x := pick(b_wait)):
                _, _, bid, line, data, strb = x
                bad = self.bad_resp("w", line)
                self.pmem[line] = _line_int(_merge(_line_bytes(self.pmem.get(line, 0)), data, strb))
                b_cur = (bid, t + 1)
                ctx.set(p.bid, bid)
                ctx.set(p.bresp, AxiResp.SLVERR if bad else AxiResp.OKAY)
            ctx.set(p.rvalid, r_cur is not None)
            ctx.set(p.bvalid, b_cur is not None)
            ready = {}
            for k in ("ar", "aw", "w"):
                stall = axi_stalls[k]
                stall.p = 1.0 - self.axi_ready
                ready[k] = not stall()
            for k, v in ready.items():
                ctx.set(getattr(p, f"{k}ready"), v)
            sampled = await ctx.tick().sample(
                p.arvalid, p.arid, p.araddr, p.arlen, p.arsize, p.arburst, p.arlock, p.arcache,
                p.arprot, p.awvalid, p.awid, p.awaddr, p.awlen, p.awsize, p.awburst, p.awlock,
                p.awcache, p.awprot, p.wvalid, p.wdata, p.wstrb, p.wlast, p.rready, p.bready)
            t += 1
            _, rst, *v = sampled
            ar, aw, w = v[0:9], v[9:18], v[18:22]
            rready, bready = v[22:24]
            if rst:
                if not self.pmem_at_reset:
                    self.pmem_at_reset = dict(self.pmem)
                for pending in (ar_wait, aw_q, w_q, b_wait, outstanding, held):
                    pending.clear()
                r_cur = b_cur = None
                ctx.set(p.rvalid, 0)
                ctx.set(p.bvalid, 0)
                continue
            for name, chan, rdy in (("ar", ar, ready["ar"]), ("aw", aw, ready["aw"]),
                                    ("w", w, ready["w"])):
                if name in held:
                    assert chan[0] and tuple(chan) == held[name], f"{name} changed while waiting"
                held.pop(name, None)
                if chan[0] and not rdy:
                    held[name] = tuple(chan)
            for chan, rdy, log, lat in ((ar, ready["ar"], self.log.ar, self.rd_latency),
                                        (aw, ready["aw"], self.log.aw, self.wr_latency)):
                if not (chan[0] and rdy):
                    continue
                _, cid, addr, alen, size, burst, lock, cache, prot = chan
                assert (alen, size, burst, lock, cache, prot) == (0, 6, AxiBurst.INCR, 0, 0, 0)
                assert addr % LINE_BYTES == 0 and cid < self.cfg.max_tags
                assert cid not in outstanding, f"ID {cid} reused while in flight"
                outstanding.add(cid)
                log.append((t, cid, addr // LINE_BYTES))
                if chan is ar:
                    ar_wait.append((t + latency(lat) - 1, len(log), cid, addr // LINE_BYTES))
                else:
                    aw_q.append((t, cid, addr // LINE_BYTES))
            if w[0] and ready["w"]:
                assert w[3] == 1
                w_q.append((w[1], w[2]))
            while aw_q and w_q:
                ta, cid, line = aw_q.popleft()
                data, strb = w_q.popleft()
                b_wait.append((t + latency(self.wr_latency) - 1, ta, cid, line, data, strb))
            if r_cur is not None and rready:
                self.log.r.append((t, r_cur[0], r_cur[1]))
                outstanding.discard(r_cur[0])
                r_cur = None
            if b_cur is not None and bready:
                self.log.b.append((t, b_cur[0], b_cur[1]))
                outstanding.discard(b_cur[0])
                b_cur = None

    # Running and checking ---------------------------------------------------------------
    def run(self, *, max_cycles: int = 5000, hold=None, main=None):
        """Run until both queues are empty and the endpoint and memory are idle.

        ``hold(t)`` returning True keeps the run going regardless (e.g. while a test pauses
        a sink); ``main(ctx)`` is an extra testbench that runs alongside."""
        dut = self.dut

        async def bench(ctx):
            ctx.set(dut.hdm_base, self.base)
            ctx.set(dut.hdm_size, self.size)
            quiet, t = 0, 0
            while quiet < 8:
                _, _, busy, arv, awv, wv, rv, bv, qv, wvv = await ctx.tick().sample(
                    dut.o_perf.busy, dut.pmem.arvalid, dut.pmem.awvalid, dut.pmem.wvalid,
                    dut.pmem.rvalid, dut.pmem.bvalid, dut.i_m2s_req.valid, dut.i_m2s_rwd.valid)
                t += 1
                assert t < max_cycles, "endpoint did not drain (hang?)"
                pending = (busy or arv or awv or wv or rv or bv or qv or wvv or
                           self.queues["req"] or self.queues["rwd"] or
                           (hold is not None and hold(t)) or
                           (self.reset_at is not None and t <= self.reset_at + 2))
                quiet = 0 if pending else quiet + 1
            self.cycles = t

        async def req_driver(ctx):
            await self._driver(ctx, "req")

        async def rwd_driver(ctx):
            await self._driver(ctx, "rwd")

        async def ndr_sink(ctx):
            await self._sink(ctx, dut.o_s2m_ndr, NDR, self.log.ndr)

        async def drs_sink(ctx):
            await self._sink(ctx, dut.o_s2m_drs, DRS, self.log.drs)

        self.sim.add_testbench(bench)
        for process in (req_driver, rwd_driver, ndr_sink, drs_sink, self._pmem, self._monitor):
            self.sim.add_testbench(process, background=True)
        if main is not None:
            self.sim.add_testbench(main, background=True)
        self.sim.run()
        return self

    def check(self, *, initial: dict[int, int] | None = None, after: int = 0) -> dict[int, Expect]:
        """Scoreboard: replay the requests accepted after edge ``after`` in handshake order
        and compare every response, error count, PMEM access count and the final memory."""
        log = self.log
        accepted = sorted((i for i in log.accepted if i.t_accept > after), key=lambda i: i.t_accept)
        times = [i.t_accept for i in accepted]
        assert len(times) == len(set(times)), "two M2S handshakes in one cycle"
        mem = GoldenMemory(self.cfg.pmem_lines)
        for line, value in (self.pmem_at_reset if after else (initial or {})).items():
            mem.set(line, _line_bytes(value))
        # The meta state is kept over a reset: replay what was accepted before it.
        meta: dict[int, int] = {}
        for item in sorted((i for i in log.accepted if i.t_accept <= after),
                           key=lambda i: i.t_accept):
            meta_returned(item.ch, item.fields, cfg=self.cfg, base=self.base, size=self.size,
                          meta=meta)
        exp: dict[int, Expect] = {}
        for item in accepted:
            assert item.fields["tag"] not in exp, "test reused a tag"
            exp[item.fields["tag"]] = expected(item.ch, item.fields, cfg=self.cfg, base=self.base,
                                               size=self.size, mem=mem, bad_resp=self.bad_resp,
                                               meta=meta)
        for name, got in (("ndr", log.ndr), ("drs", log.drs)):
            got = [(t, f) for t, f in got if t > after]
            by_tag = {}
            for _, f in got:
                assert f["tag"] not in by_tag, f"two {name} for tag {f['tag']}"
                by_tag[f["tag"]] = {k: v for k, v in f.items() if k not in ("dev_load", "rsvd")}
                if name == "drs":
                    assert f["rsvd"] == 0
            want = {tag: getattr(e, name) for tag, e in exp.items() if getattr(e, name)}
            assert set(by_tag) == set(want), f"{name} tags differ: {set(by_tag) ^ set(want)}"
            for tag, f in want.items():
                assert by_tag[tag] == f, f"{name} tag {tag}: got {by_tag[tag]}, want {f}"
        errs = Counter()
        for t, bits, _ in log.errors:
            if t > after:
                errs.update(k for k in range(MemError.COUNT) if bits >> k & 1)
        want_errs = Counter(k for e in exp.values() for k in range(MemError.COUNT)
                            if e.errors >> k & 1)
        assert errs == want_errs
        n_rd = sum(e.pmem == "r" for e in exp.values())
        n_wr = sum(e.pmem == "w" for e in exp.values())
        assert len([a for a in log.ar if a[0] > after]) == n_rd
        assert len([a for a in log.aw if a[0] > after]) == n_wr
        if not after:
            assert (log.perf["read"], log.perf["write"]) == (n_rd, n_wr)
        for line in set(self.pmem) | set(mem.touched()):
            assert _line_bytes(self.pmem.get(line, 0)) == mem.read(line), f"line {line}"
        return exp


def _merge(old: bytes, data: int, strb: int) -> bytes:
    return merge_line(old, _line_bytes(data), strb)


def _error(tb: TB, kind: int) -> list[tuple[int, dict]]:
    return [(t, info) for t, bits, info in tb.log.errors if bits >> kind & 1]


def _ndr(tb: TB, tag: int) -> tuple[int, dict]:
    (hit,) = [(t, f) for t, f in tb.log.ndr if f["tag"] == tag]
    return hit


def _drs(tb: TB, tag: int) -> tuple[int, dict]:
    (hit,) = [(t, f) for t, f in tb.log.drs if f["tag"] == tag]
    return hit


# --- Construction ---------------------------------------------------------------------

def test_rejects_non_config():
    with pytest.raises(TypeError, match=r"config must be a DeviceConfig, not 'small'"):
        MemEndpoint(config="small")
    with pytest.raises(TypeError):
        MemEndpoint(small())  # keyword-only


def test_config_is_read_only():
    ep = MemEndpoint(config=small())
    assert ep.config == small()
    with pytest.raises(AttributeError):
        ep.config = odd()


def test_port_shapes_follow_config():
    cfg = odd()
    ep = MemEndpoint(config=cfg)
    assert len(ep.pmem.araddr) == cfg.pmem_addr_width
    assert len(ep.pmem.arid) == cfg.axi_id_width
    assert len(ep.pmem.wdata) == 512 and len(ep.pmem.wstrb) == 64
    assert len(ep.hdm_base) == 46 and len(ep.hdm_size) == 47
    assert len(ep.o_err_set) == MemError.COUNT == 6
    assert ep.o_occupancy.shape().width == (cfg.max_tags).bit_length()


@pytest.mark.parametrize("max_tags, want", [
    (1, (1, 1, 1)), (2, (1, 1, 2)), (3, (1, 2, 3)), (4, (1, 2, 3)), (48, (12, 24, 36)),
    (256, (64, 128, 192)), (5, (2, 3, 4)),
])
def test_dev_load_thresholds(max_tags, want):
    assert dev_load_thresholds(max_tags) == want


# --- Directed: every opcode -------------------------------------------------------------

@pytest.mark.parametrize("op, meta_value, ndr_op", [
    (Rq.MemRd, MetaValue.Shared, NDROpcode.CmpS),
    (Rq.MemRd, MetaValue.Any, NDROpcode.CmpE),
    (Rq.MemRd, MetaValue.Invalid, NDROpcode.Cmp),
    (Rq.MemRdData, MetaValue.Invalid, NDROpcode.CmpE),
])
def test_read_returns_data_and_ndr(op, meta_value, ndr_op):
    tb = TB(small().replace(meta_state=0))
    value = random.Random(1).getrandbits(512)
    tb.pmem[5] = value
    r = tb.req(op, tb.host(5), meta_value=meta_value.value, meta_field=0, ld_id=9, tag=0xBEEF)
    tb.run()
    tb.check(initial={5: value})
    assert [(cid, line) for _, cid, line in tb.log.ar] == [(0, 5)]    # first fresh slot
    t_drs, drs = _drs(tb, r["tag"])
    assert drs["data"] == value and drs["opcode"] == DRSOpcode.MemData.value
    assert drs["ld_id"] == 9 and drs["poison"] == 0 and drs["dev_load"] == 0
    t_ndr, ndr = _ndr(tb, r["tag"])
    assert t_drs == t_ndr
    assert ndr["opcode"] == ndr_op.value and ndr["meta_value"] == meta_value.value
    assert not tb.log.errors


def test_meta_noop_value_ignored():
    """MetaField No-Op (and the reserved 01 / 10): MetaValue is reserved and ignored, so
    MemRd, MemInv and MemInvNT complete with NDR Cmp whatever MetaValue says; MemRdData
    still grants E; the same requests with Meta0-State grant what MetaValue asks."""
    tb = TB(small(), rd_latency=(3, 3))
    sent = []
    for mf in (MetaField.NoOp.value, 0b01, 0b10, MetaField.Meta0State.value):
        for mv in range(4):
            for op in (Rq.MemRd, Rq.MemInv, Rq.MemInvNT, Rq.MemRdData):
                sent.append((op, mf, mv, tb.req(op, tb.host(7), meta_field=mf, meta_value=mv)))
    tb.run()
    tb.check()
    for op, mf, mv, f in sent:
        if op == Rq.MemRdData:
            want = NDROpcode.CmpE.value
        elif mf == MetaField.Meta0State.value:
            want = {MetaValue.Shared.value: NDROpcode.CmpS.value,
                    MetaValue.Any.value: NDROpcode.CmpE.value}.get(mv, NDROpcode.Cmp.value)
        else:
            want = NDROpcode.Cmp.value
        got = _ndr(tb, f["tag"])[1]["opcode"]
        assert got == want, f"{op.name} MetaField {mf:02b} MetaValue {mv:02b}: NDR {got:03b}"


def test_meta_state_stored_and_returned():
    """With ``meta_state`` every served in-range request with MetaField Meta0-State
    returns the line's state before it (Any after power-on) and stores its MetaValue;
    MetaField NoOp, errors, MemSpecRd and lines beyond the HDM leave it alone and echo.
    The state is kept over a reset."""
    inv, any_, shared = (v.value for v in (MetaValue.Invalid, MetaValue.Any, MetaValue.Shared))
    meta0, noop = MetaField.Meta0State.value, MetaField.NoOp.value
    tb = TB(small(), rd_latency=(3, 3), wr_latency=(3, 3))
    steps = [  # (channel, opcode, line, meta_field, meta_value, returned)
        ("req", Rq.MemRd, 4, meta0, shared, any_),       # power-on state: Any
        ("req", Rq.MemRd, 4, noop, inv, inv),            # NoOp: echo, no update
        ("req", Rq.MemRdData, 4, meta0, inv, shared),    # MetaValue ignored: S stays S
        ("rwd", Wr.MemWr, 4, meta0, inv, shared),
        ("req", Rq.MemRdData, 4, noop, shared, inv),     # MetaField ignored: I -> A
        ("req", Rq.MemSpecRd, 4, meta0, shared, None),   # no response, no update
        ("rwd", Wr.MemWrPtl, 4, meta0, shared, any_),
        ("rwd", Wr.MemWr, 4, 1, any_, any_),             # reserved MetaField: as NoOp
        ("req", Rq.MemInv, 4, meta0, any_, shared),
        ("req", Rq.MemInvNT, 4, meta0, shared, any_),
        ("req", Rq.MemClnEvct, 4, meta0, inv, shared),
        ("req", Rq.MemRd, 4, meta0, 1, inv),             # reserved MetaValue is stored
        ("req", Rq.MemRd, 4, meta0, any_, 1),
        ("req", Rq.MemRd, 9, meta0, inv, any_),          # another line: its own state
        ("req", Rq.MemRd, 9, meta0, shared, inv),
    ]
    # Bad requests of line 4 change nothing: poisoned, empty partial, beyond the HDM.
    steps += [("rwd", Wr.MemWr, 4, meta0, inv, inv), ("rwd", Wr.MemWrPtl, 4, meta0, inv, inv),
              ("req", Rq.MemRd, tb.size, meta0, inv, inv),
              ("req", Rq.MemRd, 4, meta0, shared, any_)]
    bad = {len(steps) - 4: dict(poison=1), len(steps) - 3: dict(byte_enable=0)}
    # One request every 40 cycles, so both channels together keep the list's order.
    fields, last_at = [], {"req": -1, "rwd": -1}
    for i, (ch, op, line, mf, mv, _) in enumerate(steps):
        delay, last_at[ch] = 40 * (i - last_at[ch]), i
        if ch == "req":
            fields.append(tb.req(op, tb.host(line), meta_field=mf, meta_value=mv, delay=delay))
        else:
            kw = dict(byte_enable=1 if op == Wr.MemWrPtl else 0) | bad.get(i, {})
            fields.append(tb.rwd(op, tb.host(line), 7, meta_field=mf, meta_value=mv,
                                 delay=delay, **kw))
    tb.run()
    tb.check()
    order = {id(item.fields): item.t_accept for item in tb.log.accepted}
    assert sorted(fields, key=lambda f: order[id(f)]) == fields, "accepted out of list order"
    for (_, op, line, _, _, want), f in zip(steps, fields, strict=True):
        if want is not None:    # from the NDR, or the DRS of a MemData-NXM (no NDR)
            rsp = [r for _, r in tb.log.ndr if r["tag"] == f["tag"]] or [_drs(tb, f["tag"])[1]]
            got = rsp[0]["meta_value"]
            assert got == want, f"{op.name} of line {line}: MetaValue {got}, want {want}"
    assert _drs(tb, fields[-1]["tag"])[1]["meta_value"] == any_

    # Kept over a reset: line 4 holds Shared, line 9 Shared.
    tb2 = TB(small(), rd_latency=(3, 3))
    tb2.req(Rq.MemRd, tb2.host(4), meta_field=meta0, meta_value=inv)
    tb2.reset_at = 12
    after = {}

    async def after_reset(ctx):
        for _ in range(tb2.reset_at + 3):
            await ctx.tick()
        after["r"] = tb2.req(Rq.MemRd, tb2.host(4), meta_field=meta0, meta_value=any_)

    tb2.run(main=after_reset)
    assert _drs(tb2, after["r"]["tag"])[1]["meta_value"] == inv


def test_meta_state_off_echoes():
    tb = TB(small().replace(meta_state=0))
    fields = [tb.req(Rq.MemRd, tb.host(4), meta_field=0, meta_value=v)
              for v in (MetaValue.Shared.value, MetaValue.Invalid.value)]
    tb.run()
    tb.check()
    assert [_ndr(tb, f["tag"])[1]["meta_value"] for f in fields] == [
        MetaValue.Shared.value, MetaValue.Invalid.value]


def test_write_full_and_partial():
    tb = TB(odd(), wr_latency=(3, 3))
    rng = random.Random(2)
    old, new, ptl = (rng.getrandbits(512) for _ in range(3))
    be = 0x00FF_0000_0000_F00F
    tb.pmem[7] = old
    tb.rwd(Wr.MemWr, tb.host(3), new)
    tb.rwd(Wr.MemWrPtl, tb.host(7), ptl, byte_enable=be)
    tb.run()
    tb.check(initial={7: old})
    assert tb.pmem[3] == new
    assert _line_bytes(tb.pmem[7]) == _merge(_line_bytes(old), ptl, be)
    assert [ndr["opcode"] for _, ndr in tb.log.ndr] == [NDROpcode.Cmp.value] * 2
    assert not tb.log.drs and not tb.log.errors


def test_write_completes_only_after_b():
    tb = TB(small(), wr_latency=(30, 30))
    w = tb.rwd(Wr.MemWr, tb.host(1), 123)
    tb.run()
    tb.check()
    (t_b, _, _), = tb.log.b
    t_ndr, _ = _ndr(tb, w["tag"])
    assert t_ndr == t_b + 2
    (t_aw, _, _), = tb.log.aw
    assert t_b - t_aw >= 29


@pytest.mark.parametrize("op, meta_field, meta_value, ndr_op", [
    (Rq.MemInv, MetaField.Meta0State, MetaValue.Invalid, NDROpcode.Cmp),
    (Rq.MemInv, MetaField.Meta0State, MetaValue.Shared, NDROpcode.CmpS),
    (Rq.MemInvNT, MetaField.Meta0State, MetaValue.Any, NDROpcode.CmpE),
    (Rq.MemClnEvct, MetaField.Meta0State, MetaValue.Any, NDROpcode.Cmp),
    # MetaField No-Op: MetaValue is reserved and ignored, nothing is granted.
    (Rq.MemInv, MetaField.NoOp, MetaValue.Shared, NDROpcode.Cmp),
    (Rq.MemInvNT, MetaField.NoOp, MetaValue.Any, NDROpcode.Cmp),
    (Rq.MemClnEvct, MetaField.NoOp, MetaValue.Any, NDROpcode.Cmp),
])
def test_no_memory_requests(op, meta_field, meta_value, ndr_op):
    tb = TB(small())
    r = tb.req(op, tb.host(2), meta_value=meta_value.value, meta_field=meta_field.value,
               ld_id=4)
    tb.run()
    tb.check()
    assert not tb.log.ar and not tb.log.aw and not tb.log.drs and not tb.log.errors
    _, ndr = _ndr(tb, r["tag"])
    assert ndr["opcode"] == ndr_op.value and ndr["meta_field"] == meta_field.value
    assert ndr["ld_id"] == 4


def test_biconflict_acked():
    tb = TB(small())
    w = tb.rwd(Wr.BIConflict, tb.host(2), 0, ld_id=2)
    tb.run()
    tb.check()
    _, ndr = _ndr(tb, w["tag"])
    assert ndr["opcode"] == NDROpcode.BIConflictAck.value
    assert not tb.log.aw and not tb.log.errors


def test_spec_read_dropped():
    tb = TB(small())
    tb.req(Rq.MemSpecRd, tb.host(2))
    tb.req(Rq.MemSpecRd, tb.host(0) - 1)    # out of range: dropped silently too
    r = tb.req(Rq.MemRd, tb.host(2))
    tb.run()
    tb.check()
    assert len(tb.log.accepted) == 3
    assert [f["tag"] for _, f in tb.log.ndr] == [r["tag"]]
    assert len(tb.log.ar) == 1 and not tb.log.errors


# --- Directed: bad input ----------------------------------------------------------------

def test_out_of_range_requests():
    cfg = odd()     # HDM window (12288 lines) smaller than PMEM (16384 lines)
    tb = TB(cfg)
    below, end = tb.host(0) - 1, tb.host(tb.size)
    rd = tb.req(Rq.MemRd, below, meta_value=MetaValue.Shared.value)
    rdd = tb.req(Rq.MemRdData, end)
    wr = tb.rwd(Wr.MemWr, end + 1000, 5)
    inv = tb.req(Rq.MemInvNT, below, meta_value=MetaValue.Any.value)
    tb.req(Rq.MemSpecRd, end)
    tb.run()
    tb.check()
    assert not tb.log.ar and not tb.log.aw
    for r in (rd, rdd):
        # MemData-NXM is the single response: all-ones data, Poison set, no NDR.
        _, drs = _drs(tb, r["tag"])
        assert drs["opcode"] == DRSOpcode.MemDataNXM.value and drs["data"] == (1 << 512) - 1
        assert drs["poison"] == 1
        assert not [f for _, f in tb.log.ndr if f["tag"] == r["tag"]]
    assert _ndr(tb, wr["tag"])[1]["opcode"] == NDROpcode.Cmp.value
    assert _ndr(tb, inv["tag"])[1]["opcode"] == NDROpcode.CmpE.value
    infos = [info for _, info in _error(tb, MemError.HDM_RANGE)]
    assert sorted(infos, key=repr) == sorted([
        {"channel": ErrorChannel.M2S_REQ, "opcode": Rq.MemRd.value, "address": below},
        {"channel": ErrorChannel.M2S_REQ, "opcode": Rq.MemRdData.value, "address": end},
        {"channel": ErrorChannel.M2S_RWD, "opcode": Wr.MemWr.value, "address": end + 1000},
        {"channel": ErrorChannel.M2S_REQ, "opcode": Rq.MemInvNT.value, "address": below},
    ], key=repr)


def test_hdm_larger_than_pmem_is_cut_at_pmem():
    cfg = small()
    tb = TB(cfg, hdm_base=0, hdm_size=4 * cfg.pmem_lines)
    tb.req(Rq.MemRd, cfg.pmem_lines - 1)
    r = tb.req(Rq.MemRd, cfg.pmem_lines)
    tb.run()
    tb.check()
    assert len(tb.log.ar) == 1
    assert _drs(tb, r["tag"])[1]["opcode"] == DRSOpcode.MemDataNXM.value


def test_reserved_opcodes():
    tb = TB(small())
    req_rsvd = sorted(set(range(16)) - {op.value for op in M2SReqOpcode})
    rwd_rsvd = sorted(set(range(16)) - {op.value for op in M2SRwDOpcode})
    for op in req_rsvd:
        tb.req(op, tb.host(1))
    for op in rwd_rsvd:
        tb.rwd(op, tb.host(1), 7)
    tb.run()
    tb.check()
    assert not tb.log.ar and not tb.log.aw and not tb.log.drs
    assert {f["opcode"] for _, f in tb.log.ndr} == {NDROpcode.Cmp.value}
    infos = [info for _, info in _error(tb, MemError.RSVD_OPCODE)]
    assert sorted((i["channel"], i["opcode"]) for i in infos) == sorted(
        [(0, op) for op in req_rsvd] + [(1, op) for op in rwd_rsvd])
    assert len(tb.log.ndr) == len(req_rsvd) + len(rwd_rsvd)


def test_forwards_unexpected():
    tb = TB(small())
    tb.req(Rq.MemRdFwd, tb.host(1), tag=0x123)
    tb.req(Rq.MemWrFwd, tb.host(2), tag=0x456)
    tb.run()
    tb.check()
    assert not tb.log.ndr and not tb.log.drs and not tb.log.ar
    infos = [info for _, info in _error(tb, MemError.UNEXPECTED_FWD)]
    assert [i["opcode"] for i in infos] == [Rq.MemRdFwd.value, Rq.MemWrFwd.value]
    assert [i["address"] for i in infos] == [tb.host(1), tb.host(2)]


def test_poisoned_and_empty_writes_leave_memory():
    tb = TB(small())
    tb.pmem[4] = 77
    p = tb.rwd(Wr.MemWr, tb.host(4), 1, poison=1)
    pp = tb.rwd(Wr.MemWrPtl, tb.host(4), 2, poison=1, byte_enable=3)
    e = tb.rwd(Wr.MemWrPtl, tb.host(4), 3, byte_enable=0)
    tb.run()
    tb.check(initial={4: 77})
    assert tb.pmem == {4: 77} and not tb.log.aw
    for w in (p, pp, e):
        assert _ndr(tb, w["tag"])[1]["opcode"] == NDROpcode.Cmp.value
    assert [i["opcode"] for _, i in _error(tb, MemError.POISON)] == [1, 2]
    assert [i["address"] for _, i in _error(tb, MemError.EMPTY_PTL)] == [tb.host(4)]
    assert all(bin(bits).count("1") == 1 for _, bits, _ in tb.log.errors)


def test_pmem_error_responses():
    tb = TB(small(), bad_resp=lambda kind, line: line == 9)
    r = tb.req(Rq.MemRd, tb.host(9))
    ok = tb.req(Rq.MemRd, tb.host(8))
    w = tb.rwd(Wr.MemWr, tb.host(9), 5)
    tb.run()
    tb.check()
    assert _drs(tb, r["tag"])[1]["poison"] == 1
    assert _drs(tb, ok["tag"])[1]["poison"] == 0
    assert _ndr(tb, w["tag"])[1]["opcode"] == NDROpcode.Cmp.value
    infos = sorted((i["channel"], i["opcode"], i["address"])
                   for _, i in _error(tb, MemError.PMEM_RESP))
    assert infos == [(ErrorChannel.PMEM_R, Rq.MemRd.value, 9),
                     (ErrorChannel.PMEM_B, Wr.MemWr.value, 9)]


def test_m2s_and_pmem_error_in_one_cycle():
    # MemRd handshake at edge k: AR at k+1, R taken at k+2, PMEM error flagged at k+4;
    # a reserved RwD accepted at k+3 is flagged at k+4 as well.
    tb = TB(small(), bad_resp=lambda kind, line: True)
    tb.req(Rq.MemRd, tb.host(1))
    tb.rwd(0xF, tb.host(1), 0, delay=3)
    tb.run()
    tb.check()
    (_, bits, info), = tb.log.errors
    assert bits == (1 << MemError.PMEM_RESP) | (1 << MemError.RSVD_OPCODE)
    assert info == {"channel": ErrorChannel.M2S_RWD, "opcode": 0xF, "address": tb.host(1)}


# --- Directed: ordering, tags, latency ---------------------------------------------------

def test_read_after_write_sees_new_data():
    tb = TB(small(), rd_latency=(1, 1), wr_latency=(40, 40))
    tb.rwd(Wr.MemWr, tb.host(6), 0xAAAA)
    r = tb.req(Rq.MemRd, tb.host(6), delay=2)
    tb.run()
    tb.check()
    assert _drs(tb, r["tag"])[1]["data"] == 0xAAAA
    assert tb.log.ar[0][0] > tb.log.b[0][0]


def test_write_after_read_does_not_change_read():
    tb = TB(small(), rd_latency=(40, 40), wr_latency=(1, 1))
    tb.pmem[6] = 0x5555
    r = tb.req(Rq.MemRd, tb.host(6))
    tb.rwd(Wr.MemWr, tb.host(6), 0xAAAA, delay=2)
    tb.run()
    tb.check(initial={6: 0x5555})
    assert _drs(tb, r["tag"])[1]["data"] == 0x5555
    assert tb.pmem[6] == 0xAAAA


def test_writes_to_one_line_in_order():
    tb = TB(small(), wr_latency=(1, 30), reorder=True, seed=3)
    for k in range(8):
        tb.rwd(Wr.MemWrPtl, tb.host(6), (k + 1) << (8 * k), byte_enable=0xFF | 1 << k)
    tb.run()
    tb.check()
    assert [line for _, _, line in tb.log.aw] == [6] * 8
    for (t_b, _, _), (t_next_aw, _, _) in zip(tb.log.b[:-1], tb.log.aw[1:], strict=True):
        assert t_next_aw > t_b      # each write issued only after the previous one's B


def test_independent_lines_overlap_and_reorder():
    tb = TB(small(), rd_latency=(1, 25), reorder=True, seed=4)
    for k in range(4):
        tb.pmem[k] = 1000 + k
        tb.req(Rq.MemRd, tb.host(k))
    tb.run()
    tb.check(initial={k: 1000 + k for k in range(4)})
    assert [t for t, _, _ in tb.log.ar] == [2, 3, 4, 5]     # issued back to back
    order = [f["tag"] for _, f in tb.log.drs]
    assert order != sorted(order), "seed should reorder; pick another"
    tag_of_id = {cid: item.fields["tag"]
                 for (_, cid, _), item in zip(tb.log.ar, tb.log.accepted, strict=True)}
    assert order == [tag_of_id[rid] for _, rid, _ in tb.log.r]


def test_fill_to_full_with_sinks_paused():
    cfg = small()
    tb = TB(cfg, s2m_ready=0.0)
    n = 3 * cfg.max_tags
    for k in range(n):
        tb.req(Rq.MemRd, tb.host(k))
    seen = {}

    async def pause(ctx):
        for _ in range(60):
            await ctx.tick()
        seen["occ"] = ctx.get(tb.dut.o_occupancy)
        seen["load"] = ctx.get(tb.dut.o_dev_load)
        seen["accepted"] = len(tb.log.accepted)
        seen["ready"] = ctx.get(tb.dut.i_m2s_req.ready)
        tb.s2m_ready = 1.0

    tb.run(main=pause, hold=lambda t: t < 62)
    tb.check()
    # max_tags in flight, one in the completion stage, one in each of the DRS/NDR registers
    assert seen == {"occ": cfg.max_tags, "load": 3, "accepted": cfg.max_tags + 2, "ready": 0}
    assert tb.log.max_occupancy == cfg.max_tags


def test_immediate_fifo_full_backpressures():
    tb = TB(small(), s2m_ready=0.0)
    for k in range(3 * IMM_FIFO_DEPTH):
        tb.req(Rq.MemInv, tb.host(k))
    seen = {}

    async def pause(ctx):
        for _ in range(30):
            await ctx.tick()
        seen["accepted"] = len(tb.log.accepted)
        tb.s2m_ready = 1.0

    tb.run(main=pause, hold=lambda t: t < 32)
    tb.check()
    # FIFO entries, the completion stage and the NDR register
    assert seen["accepted"] == IMM_FIFO_DEPTH + 2


def test_round_robin_between_channels():
    tb = TB(small())
    for k in range(6):
        tb.req(Rq.MemInv, tb.host(k))
        tb.rwd(Wr.BIConflict, tb.host(k), 0)
    tb.run()
    tb.check()
    chans = [i.ch for i in sorted(tb.log.accepted, key=lambda i: i.t_accept)]
    assert chans == ["req", "rwd"] * 6 or chans == ["rwd", "req"] * 6


def test_work_conserving_when_granted_channel_blocked():
    # A write waits on an in-flight read of its line; reads of other lines overtake it.
    tb = TB(small(), rd_latency=(20, 20))
    tb.req(Rq.MemRd, tb.host(0))
    tb.rwd(Wr.MemWr, tb.host(0), 1, delay=1)
    for k in range(1, 4):
        tb.req(Rq.MemRd, tb.host(k), delay=1 if k == 1 else 0)
    tb.run()
    tb.check()
    order = [(i.ch, i.t_accept) for i in sorted(tb.log.accepted, key=lambda i: i.t_accept)]
    assert [c for c, _ in order] == ["req", "req", "req", "req", "rwd"]


def test_latency():
    tb = TB(small(), rd_latency=(10, 10), wr_latency=(10, 10))
    r = tb.req(Rq.MemRd, tb.host(1))
    w = tb.rwd(Wr.MemWr, tb.host(2), 9, delay=30)
    tb.run()
    tb.check()
    rd_item, wr_item = sorted(tb.log.accepted, key=lambda i: i.t_accept)
    assert rd_item.t_valid == rd_item.t_accept              # accepted in its first cycle
    (t_ar, _, _), = tb.log.ar
    (t_r, _, t_r_valid), = tb.log.r
    t_drs, _ = _drs(tb, r["tag"])
    t_ndr, _ = _ndr(tb, r["tag"])
    assert t_ar - rd_item.t_valid == 1
    assert t_r == t_r_valid
    assert t_drs - t_r == 2 and t_ndr - t_r == 2            # 3 cycles added in total
    (t_aw, _, _), = tb.log.aw
    (t_b, _, _), = tb.log.b
    assert t_aw - wr_item.t_valid == 1
    assert _ndr(tb, w["tag"])[0] - t_b == 2


def test_immediate_response_latency():
    tb = TB(small())
    r = tb.req(Rq.MemInv, tb.host(1))
    tb.run()
    (item,) = tb.log.accepted
    assert _ndr(tb, r["tag"])[0] - item.t_accept == 4


def test_read_throughput_with_long_latency():
    cfg = DeviceConfig(name="thru", pmem_size=1 << 16, hdm_size=1 << 16, max_tags=128,
                       axi_id_width=7, hazard_buckets=16, engine_sequencers=4)
    tb = TB(cfg, rd_latency=(120, 120))
    n = 600
    for k in range(n):
        tb.req(Rq.MemRd, k % cfg.pmem_lines)
    tb.run(max_cycles=2000)
    tb.check()
    ts = [t for t, _ in tb.log.drs]
    rate = (n - 1) / (ts[-1] - ts[0])
    print(f"read throughput {rate:.3f} lines/cycle")
    assert rate >= 0.95


def test_reset_mid_traffic():
    cfg = small()
    tb = TB(cfg, rd_latency=(5, 15), wr_latency=(5, 15), reorder=True, seed=5)
    for k in range(12):
        tb.rwd(Wr.MemWr, tb.host(k % 5), k + 1)
        tb.req(Rq.MemRd, tb.host(k % 5))
    tb.reset_at = 20
    phase2 = {}

    async def after_reset(ctx):
        for _ in range(tb.reset_at + 3):   # plain ticks: they do not raise on reset
            await ctx.tick()
        assert ctx.get(tb.dut.o_occupancy) == 0 and ctx.get(tb.dut.o_perf.busy) == 0
        for k in range(10):
            tb.rwd(Wr.MemWr, tb.host(k % 3), 100 + k)
            tb.req(Rq.MemRd, tb.host(k % 3))
            tb.req(Rq.MemInv, tb.host(k % 3))
        phase2["start"] = tb.reset_at + 3

    tb.run(main=after_reset)
    assert tb.log.ndr[0][0] < tb.reset_at < tb.log.ndr[-1][0]
    tb.check(after=phase2["start"])


def _random_traffic(tb: TB, rng: random.Random, n: int, lines: list[int]):
    req_ops = [Rq.MemRd] * 6 + [Rq.MemRdData, Rq.MemInv, Rq.MemInvNT, Rq.MemClnEvct,
                                Rq.MemSpecRd, Rq.MemRdFwd, 0b0101]
    rwd_ops = [Wr.MemWr] * 4 + [Wr.MemWrPtl] * 3 + [Wr.BIConflict, 0b1111]
    def line():
        if rng.random() < 0.04:
            return rng.choice([tb.base - 1, tb.base + tb.size, tb.base + tb.size + 77])
        return tb.host(rng.choice(lines))
    for _ in range(n):
        meta = dict(meta_value=rng.choice([0, 1, 2, 3]), meta_field=rng.choice([0, 0, 1, 2, 3]),
                    ld_id=rng.randrange(16))
        if rng.random() < 0.5:
            tb.req(rng.choice(req_ops), line(), **meta)
        else:
            op = rng.choice(rwd_ops)
            be = rng.choice([0, FULL_MASK, rng.getrandbits(64)]) if op == Wr.MemWrPtl else 0
            tb.rwd(op, line(), rng.getrandbits(512), byte_enable=be,
                   poison=int(rng.random() < 0.03), **meta)


def tiny() -> DeviceConfig:
    """One tag and two ordering buckets: every request waits for the one before."""
    return DeviceConfig(name="tiny", pmem_size=1 << 16, hdm_base=0x3000, hdm_size=1 << 15,
                        max_tags=1, hazard_buckets=2)


RANDOM_CONFIGS = {"small": small, "odd": odd, "tiny": tiny}


@pytest.mark.parametrize("cfg_name", list(RANDOM_CONFIGS))
@pytest.mark.parametrize("stress", [False, True], ids=["nostall", "stall"])
def test_random_traffic(cfg_name, stress, seed):
    """Random M2S traffic (``stall``: 30 % idle and 40 % backpressure per cycle on every
    channel, and stall bursts of 16 to 96 cycles on each, ``tests.noise``)."""
    cfg = RANDOM_CONFIGS[cfg_name]()
    rng = random.Random(seed)
    knobs = dict(m2s_idle=0.3, s2m_ready=0.6, axi_ready=0.6, bursts=STALL_BURSTS) if stress else {}
    tb = TB(cfg, seed=seed, rd_latency=(1, 12), wr_latency=(1, 12), reorder=True,
            bad_resp=lambda kind, line: line == 1, **knobs)
    lines = rng.sample(range(min(tb.size, cfg.pmem_lines)), 6)
    initial = {line: rng.getrandbits(512) for line in lines}
    tb.pmem.update(initial)
    _random_traffic(tb, rng, 400, [*lines, 1])
    tb.run(max_cycles=40000 if stress else 8000)
    exp = tb.check(initial=initial)
    assert sum(e.pmem is not None for e in exp.values()) > 150
    if stress:
        bursts = {k: v.bursts for k, v in tb.stalls.items()}
        print("stall bursts per channel", bursts)
        assert sum(bursts.values()) >= 10, f"too few stall bursts: {bursts}"


def test_default_config_smoke():
    cfg = load_config("default")
    tb = TB(cfg)
    tb.rwd(Wr.MemWr, tb.host(cfg.pmem_lines - 1), 0x1234)
    r = tb.req(Rq.MemRd, tb.host(cfg.pmem_lines - 1), delay=1)
    tb.run()
    tb.check()
    assert _drs(tb, r["tag"])[1]["data"] == 0x1234
