# amaranth: UnusedElaboratable=no
"""CXL.cache agent (hw/cxl/cache_agent.py), fast tier: Amaranth simulator.

A :class:`TB` runs one simulator process that, each cycle, drives the user request
streams (random idle), the sinks' ``ready`` (random backpressure, or paused), the three
H2D channels from :class:`tb.cache_home.CacheHome` (random idle; the home's own latency,
jitter and reordering) and the three D2H ``ready`` (random backpressure), then samples
every handshake. The scoreboard matches the k-th ``i_rd`` with the k-th RdCurr the home
accepted (reads issue in request order) and requires ``o_rd`` to return, in request
order, its tag, the very line the home sent for it and the error flag the home's
injected faults call for; writes likewise (data that reached the home bit for bit, GO
taken and data received before the completion). :class:`tb.cache_home.CoherenceChecker`
holds reads and writes of shared lines to the home's order, the home itself rejects
protocol violations (CQID reuse, unknown UQIDs, wrong snoop answers), and a
:class:`StreamRule` watches every output stream. Error pulses are counted per kind and
compared with what the faults and injected messages call for.

Random tests print their seed; ``SEED=<n>`` replays one. (The linter option on the first
line lets tests build agents only to see them rejected.)
"""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from hw.cxl.cache_agent import (
    ERR_INFO,
    RD_REQ,
    RD_RSP,
    WR_REQ,
    WR_RSP,
    CacheAgent,
    CacheError,
)
from hw.cxl.messages import (
    Codec,
    D2HData,
    D2HReq,
    D2HReqOpcode,
    D2HRsp,
    GoState,
    H2DData,
    H2DReq,
    H2DReqOpcode,
    H2DRsp,
    H2DRspOpcode,
)
from tb.cache_home import (
    READ_FAULTS,
    WRITE_FAULTS,
    CacheHome,
    CoherenceChecker,
    HomeTiming,
    Txn,
    background_line,
)

from .conftest import assert_lints_clean
from .stream_rule import StreamRule

CODEC = {name: Codec(layout) for name, layout in {
    "rd_req": RD_REQ, "rd_rsp": RD_RSP, "wr_req": WR_REQ, "wr_rsp": WR_RSP,
    "d2h_req": D2HReq, "d2h_rsp": D2HRsp, "d2h_data": D2HData,
    "h2d_req": H2DReq, "h2d_rsp": H2DRsp, "h2d_data": H2DData, "err": ERR_INFO}.items()}
E = CacheError

#: Error kinds each fault raises besides the request's error flag (READ_ERROR /
#: WRITE_ERROR, counted from ``Txn.expect_error``).
FAULT_ERRORS = {"dup_go": E.RSP_UNEXPECTED,
                "write_pull": E.RSP_UNEXPECTED, "dup_pull": E.RSP_UNEXPECTED,
                "ext_cmp": E.RSP_UNEXPECTED}


# --- bench ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Traffic:
    """Per-cycle probabilities of idle and backpressure on the ten streams."""
    user_idle: float = 0.0      # i_rd / i_wr valid withheld
    user_bp: float = 0.0        # o_rd / o_wr ready low
    h2d_idle: float = 0.0       # H2D Req / Rsp / Data valid withheld
    d2h_bp: float = 0.0         # D2H Req / Rsp / Data ready low
    snoops: float = 0.0         # a snoop sent by the home (while user requests run)


SMOOTH = Traffic()
ROUGH = Traffic(user_idle=0.3, user_bp=0.3, h2d_idle=0.3, d2h_bp=0.3, snoops=0.1)


@dataclass
class Op:
    kind: str                   # "rd" / "wr"
    line: int
    tag: int
    data: int = 0
    t_issue: int = -1


class TB:
    """Clock, the agent, the home model, drivers, sinks, checkers and scoreboard."""

    def __init__(self, *, seed: int, traffic: Traffic = SMOOTH,
                 timing: HomeTiming | None = None,
                 faults: Callable[[Txn], set[str]] | None = None, **agent: object):
        self.dut = CacheAgent(**agent)
        self.rng = random.Random(seed)
        timing = timing or HomeTiming(read_latency=20, write_latency=10, jitter=10,
                                      reorder=True, split_writes=0.5)
        self.home = CacheHome(timing=timing, rng=random.Random(seed + 1), faults=faults)
        self.checker = CoherenceChecker(self.home)
        self.traffic = traffic
        self.queues: dict[str, deque[Op]] = {"rd": deque(), "wr": deque()}
        self.issued: dict[str, list[Op]] = {"rd": [], "wr": []}
        self.done = {"rd": 0, "wr": 0}
        self.base = {"rd": 0, "wr": 0}          # home txns before the last reset
        self.out_cycles: dict[str, list[int]] = {"rd": [], "wr": []}
        self.errors: Counter = Counter()        # o_err_set bits seen
        self.status = 0
        self.first: dict = {}
        self.max_inflight = {"rd": 0, "wr": 0}
        self.pause = {"rd": 0, "wr": 0}         # sink ready held low before this cycle
        self.clears: dict[int, int] = {}        # cycle -> i_err_clear
        self.reserved_snoops = 0
        self.hooks: list[Callable[[TB, int], None]] = []
        self.reset_at: int | None = None
        self.after_reset: Callable[[TB], None] | None = None
        self.next_tag = 0
        self.cycles = 0

    # Stimulus -----------------------------------------------------------------------------
    def _tag(self, tag: int | None) -> int:
        if tag is None:
            tag, self.next_tag = self.next_tag, (self.next_tag + 1) % (1 << 16)
        return tag

    def read(self, line: int, tag: int | None = None) -> None:
        self.queues["rd"].append(Op("rd", line, self._tag(tag)))

    def write(self, line: int, data: int, tag: int | None = None) -> None:
        self.queues["wr"].append(Op("wr", line, self._tag(tag), data))

    def random_ops(self, n: int, *, lines: int = 8, write_share: float = 0.4) -> None:
        """``n`` reads and writes of ``lines`` lines (so they collide), in random order."""
        base = self.rng.getrandbits(40) << 4
        for _ in range(n):
            line = base + self.rng.randrange(lines)
            if self.rng.random() < write_share:
                self.write(line, self.rng.getrandbits(512))
            else:
                self.read(line)

    # Running ---------------------------------------------------------------------------------
    def run(self, *, max_cycles: int = 20_000, drain: int = 6,
            hold: Callable[[int], bool] | None = None) -> TB:
        """Run until every queued request has completed, the home and the agent are idle
        for ``drain`` cycles and ``hold(t)`` (if given) is false."""
        dut, home, rng, tr = self.dut, self.home, self.rng, self.traffic
        user_in = {"rd": (dut.i_rd, CODEC["rd_req"]), "wr": (dut.i_wr, CODEC["wr_req"])}
        h2d = {"req": (dut.i_h2d_req, CODEC["h2d_req"]), "rsp": (dut.i_h2d_rsp, CODEC["h2d_rsp"]),
               "data": (dut.i_h2d_data, CODEC["h2d_data"])}
        outs = {"rd": dut.o_rd, "wr": dut.o_wr, "d2h_req": dut.o_d2h_req,
                "d2h_rsp": dut.o_d2h_rsp, "d2h_data": dut.o_d2h_data}
        rules = {name: StreamRule(name) for name in outs}
        sampled = [dut.i_rd.ready, dut.i_wr.ready,
                   *(p.ready for p, _ in h2d.values()),
                   *(x for p in outs.values() for x in (p.valid, p.payload.as_value())),
                   dut.o_err_set, dut.o_err_status, dut.o_err_first.as_value(),
                   dut.o_rd_inflight, dut.o_wr_inflight, dut.o_busy]

        async def bench(ctx):
            cur: dict[str, Op | None] = {"rd": None, "wr": None}
            offered: dict[str, dict | None] = dict.fromkeys(h2d)
            t, quiet = 0, 0
            while True:
                if t == self.reset_at:
                    ctx.set(cd.rst, 1)
                    await ctx.tick()
                    ctx.set(cd.rst, 0)
                    self._reset(cur, offered, rules)
                    if self.after_reset:
                        self.after_reset(self)
                    t += 1
                for hook in self.hooks:
                    hook(self, t)
                busy_user = (any(self.queues.values())
                              or any(self.done[k] < len(self.issued[k]) for k in self.done))
                if tr.snoops and busy_user and rng.random() < tr.snoops:
                    home.snoop(t, rng.getrandbits(46), rng.choice((1, 2, 3)))
                for k, (port, codec) in user_in.items():
                    if cur[k] is None and self.queues[k] and not rng.random() < tr.user_idle:
                        op = cur[k] = self.queues[k].popleft()
                        fields = {"address": op.line, "tag": op.tag}
                        if k == "wr":
                            fields["data"] = op.data
                        ctx.set(port.payload.as_value(), codec.pack(**fields))
                    ctx.set(port.valid, cur[k] is not None)
                ready = {}
                for name, port in outs.items():
                    if name in ("rd", "wr"):
                        ready[name] = t >= self.pause[name] and not rng.random() < tr.user_bp
                    else:
                        ready[name] = not rng.random() < tr.d2h_bp
                    ctx.set(port.ready, ready[name])
                for c, (port, codec) in h2d.items():
                    if offered[c] is None and not rng.random() < tr.h2d_idle:
                        offered[c] = home.offer(c, t)
                        if offered[c] is not None:
                            ctx.set(port.payload.as_value(), codec.pack(**offered[c]))
                    ctx.set(port.valid, offered[c] is not None)
                ctx.set(dut.i_err_clear, self.clears.get(t, 0))

                _, _, *v = await ctx.tick().sample(*sampled)
                rd_ready, wr_ready, h2d_ready = v[0], v[1], v[2:5]
                out_v = {name: (v[5 + 2 * i], v[6 + 2 * i]) for i, name in enumerate(outs)}
                err_set, status, first, rd_infl, wr_infl, busy = v[15:]

                for k, accepted in (("rd", rd_ready), ("wr", wr_ready)):
                    if cur[k] is not None and accepted:
                        self._issued(cur[k], t)
                        cur[k] = None
                for (c, _), accepted in zip(h2d.items(), h2d_ready, strict=True):
                    if offered[c] is not None and accepted:
                        home.take(c, t)
                        if c == "req" and offered[c]["opcode"] not in (1, 2, 3):
                            self.reserved_snoops += 1
                        offered[c] = None
                for name, (valid, payload) in out_v.items():
                    rules[name].observe(t, valid, ready[name], payload)
                    if valid and ready[name]:
                        if name in ("rd", "wr"):
                            self._completed(name, CODEC[f"{name}_rsp"].unpack(payload), t)
                        else:
                            home.d2h(name[4:], t, CODEC[name].unpack(payload))
                if err_set:
                    self.errors.update(k for k in range(E.COUNT) if err_set >> k & 1)
                self.status, self.first = status, CODEC["err"].unpack(first)
                self.max_inflight["rd"] = max(self.max_inflight["rd"], rd_infl)
                self.max_inflight["wr"] = max(self.max_inflight["wr"], wr_infl)
                assert rd_infl <= dut.cqids and wr_infl <= dut.write_cqids

                t += 1
                assert t < max_cycles, (
                    f"no progress after {t} cycles (hang?): rd {self.done['rd']}/"
                    f"{len(self.issued['rd'])} wr {self.done['wr']}/{len(self.issued['wr'])}"
                    f", home: {home.outstanding()}")
                pending = (busy or busy_user or any(cur.values()) or any(offered.values())
                           or not home.idle()
                           or (hold is not None and hold(t))
                           or (self.reset_at is not None and t <= self.reset_at + 1))
                quiet = 0 if pending else quiet + 1
                if quiet >= drain:
                    self.cycles = t
                    return

        top = Module()
        top.domains.sync = cd = ClockDomain("sync")
        top.submodules.dut = dut
        sim = Simulator(top)
        sim.add_clock(1e-8)
        sim.add_testbench(bench)
        sim.run()
        errors = [e for r in rules.values() for e in r.errors]
        assert not errors, "\n".join(errors[:10])
        return self

    def _reset(self, cur: dict, offered: dict, rules: dict) -> None:
        """The agent was reset: requests in flight are lost, the home forgets them."""
        self.home.reset()
        for k in cur:
            cur[k] = None
        for c in offered:
            offered[c] = None
        for r in rules.values():
            r.held = None
        self.base = {"rd": len(self.home.reads), "wr": len(self.home.writes)}
        self.issued = {"rd": [], "wr": []}
        self.done = {"rd": 0, "wr": 0}
        for q in self.queues.values():
            q.clear()

    # Scoreboard ----------------------------------------------------------------------------
    def _issued(self, op: Op, t: int) -> None:
        op.t_issue = t
        self.issued[op.kind].append(op)
        if op.kind == "rd":
            self.checker.read_issued(id(op), op.line, t)
        else:
            self.checker.write_issued(id(op), op.line, op.data, t)

    def _completed(self, kind: str, f: dict, t: int) -> None:
        j = self.done[kind]
        assert j < len(self.issued[kind]), f"o_{kind} at {t} with nothing requested"
        op = self.issued[kind][j]
        self.done[kind] += 1
        self.out_cycles[kind].append(t)
        txns = self.home.reads if kind == "rd" else self.home.writes
        txn = txns[self.base[kind] + j]
        where = f"o_{kind} #{j} at {t} (tag {op.tag}, line {op.line:#x}, cqid {txn.cqid})"
        assert f["tag"] == op.tag, f"{where}: tag {f['tag']} out of order"
        assert txn.line == op.line, f"{where}: the home saw line {txn.line:#x}"
        assert f["error"] == txn.expect_error, f"{where}: error {f['error']}, faults " \
                                               f"{sorted(txn.faults)}"
        if kind == "rd":
            assert f["data"] == txn.value, f"{where}: not the line the home sent for it"
            self.checker.read_delivered(id(op), f["data"], f["error"], t)
        else:
            assert txn.t_go is not None and txn.t_go < t, f"{where}: before its GO"
            if "drop" not in txn.faults:
                assert txn.t_data is not None and txn.t_data < t, f"{where}: before its data"
                assert txn.value == op.data, f"{where}: the home received other data"
            self.checker.write_completed(id(op), f["error"], t)

    def expected_errors(self) -> Counter:
        """Error pulses the home's faults and the reserved snoops call for."""
        want = Counter()
        for kind, txns in (("rd", self.home.reads), ("wr", self.home.writes)):
            for txn in txns[self.base[kind]:]:
                if txn.expect_error:
                    want[E.READ_ERROR if kind == "rd" else E.WRITE_ERROR] += 1
                want.update(FAULT_ERRORS[f] for f in txn.faults if f in FAULT_ERRORS)
        want[E.SNOOP_RESERVED] += self.reserved_snoops
        return +want

    def check_end(self, *, extra_errors: Counter | None = None) -> None:
        for k in ("rd", "wr"):
            assert self.done[k] == len(self.issued[k]), f"{k}: not every request completed"
        assert self.home.idle(), self.home.outstanding()
        assert self.home.snoops_answered == self.home.snoops_sent
        want = self.expected_errors() + (extra_errors or Counter())
        assert self.errors == want, f"error pulses {dict(self.errors)}, expected {dict(want)}"


def random_faults(rng: random.Random, rate: float) -> Callable[[Txn], set]:
    """A ``faults`` callable: each request gets one fault with probability ``rate``."""
    def choose(txn: Txn) -> set[str]:
        if rng.random() >= rate:
            return set()
        return {rng.choice(READ_FAULTS if txn.kind == "read" else WRITE_FAULTS)}
    return choose


# --- parameters ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"cqids": 1}, "cqids must be a power of two from 2 to 2048, not 1"),
    ({"cqids": 96}, "cqids must be a power of two from 2 to 2048, not 96"),
    ({"cqids": 4096}, "cqids must be a power of two from 2 to 2048, not 4096"),
    ({"cqids": True}, "cqids must be a power of two from 2 to 2048, not True"),
    ({"cqids": 64.0}, "cqids must be a power of two from 2 to 2048, not 64.0"),
    ({"cqids": 64, "write_cqids": 1},
     r"write_cqids must be a power of two from 2 to cqids \(64\), not 1"),
    ({"cqids": 64, "write_cqids": 128},
     r"write_cqids must be a power of two from 2 to cqids \(64\), not 128"),
    ({"cqids": 64, "write_cqids": 12},
     r"write_cqids must be a power of two from 2 to cqids \(64\), not 12"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        CacheAgent(**kwargs)


def test_parameters_are_read_only_properties():
    dut = CacheAgent(cqids=32, write_cqids=8)
    assert (dut.cqids, dut.write_cqids, dut.write_cqid_base) == (32, 8, 32)
    default = CacheAgent()
    assert (default.cqids, default.write_cqids) == (128, 16)
    with pytest.raises(AttributeError):
        dut.cqids = 64


def test_home_timing_rejects_bad_values():
    with pytest.raises(ValueError, match=r"^jitter must be a non-negative integer, not -1$"):
        HomeTiming(jitter=-1)
    with pytest.raises(ValueError, match=r"^split_writes must be a probability, not 2$"):
        HomeTiming(split_writes=2)


# --- data ----------------------------------------------------------------------------

CONFIGS = {
    # The smallest agent: every CQID is reused all the time.
    "c2w2": dict(cqids=2, write_cqids=2),
    "c8w4": dict(cqids=8, write_cqids=4),
    "c32w8": dict(cqids=32, write_cqids=8),
}


@pytest.mark.parametrize("traffic", ["smooth", "rough"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_random_traffic(config, traffic, seed):
    """Random reads and writes of a few shared lines, the home reordering data, GO and
    requests and mixing GO_WritePull with WritePull + GO; with ``rough``, idle and
    backpressure on all ten streams and snoops under traffic: every line bit for bit in
    request order, every write in the home before its completion, no error."""
    tb = TB(seed=seed, traffic=ROUGH if traffic == "rough" else SMOOTH, **CONFIGS[config])
    tb.random_ops(250)
    tb.run()
    tb.check_end()
    assert tb.checker.reads_checked + tb.checker.writes_checked == 250
    assert tb.max_inflight["rd"] == tb.dut.cqids or config == "c32w8"


@pytest.mark.parametrize("config", list(CONFIGS))
def test_random_faults(config, seed):
    """As above (rough traffic) with a fault in a quarter of the requests: poisoned data,
    GO-Err with all-ones data, a stray GO or a WritePull naming a read,
    GO_ERR_WritePull, GO_WritePull_Drop, WritePull + GO-Error, a second WritePull, an
    ExtCmp. Each request completes (never a hang), with the error flag exactly when the
    fault calls for one, and the error pulses count every fault."""
    rng = random.Random(seed + 7)
    tb = TB(seed=seed, traffic=ROUGH, faults=random_faults(rng, 0.25),
            **CONFIGS[config])
    tb.random_ops(250)
    tb.run()
    tb.check_end()
    faulted = [t for t in tb.home.reads + tb.home.writes if t.faults]
    assert len(faulted) > 20
    assert tb.status == sum(1 << k for k in tb.errors)


@pytest.mark.parametrize("kind", ["rd", "wr"])
def test_fill_to_full_with_sink_paused(kind, seed):
    """The default agent (128 read, 16 write CQIDs) with its user sink paused for 400
    cycles, idle and backpressure on the CXL channels: the ring fills to every CQID, the
    agent stops taking requests, nothing is lost; on release every request completes in
    order."""
    tb = TB(seed=seed, traffic=Traffic(user_idle=0.1, h2d_idle=0.2, d2h_bp=0.2),
            timing=HomeTiming(read_latency=5, write_latency=5, jitter=5, reorder=True,
                              split_writes=0.5))
    ring = tb.dut.cqids if kind == "rd" else tb.dut.write_cqids
    n = ring + 20
    for i in range(n):
        if kind == "rd":
            tb.read(0x100 + i)
        else:
            tb.write(0x100 + i, tb.rng.getrandbits(512))
    tb.pause[kind] = 400
    snapshot = {}

    def watch(tb: TB, t: int) -> None:
        if t == 399:
            snapshot["issued"] = len(tb.issued[kind])
            snapshot["done"] = tb.done[kind]
    tb.hooks.append(watch)
    tb.run(hold=lambda t: t < 400)
    tb.check_end()
    assert tb.max_inflight[kind] == ring
    # Held: a full ring and the first completion in the output register (whose entry is
    # free again), nothing delivered.
    assert snapshot == {"issued": ring + 1, "done": 0}
    assert tb.done[kind] == n


def test_snoops_full_rate(seed):
    """A snoop offered every cycle while reads and writes run: each answered RspIHitI
    with its UQID, one per cycle when D2H Rsp is always ready; reserved opcodes too,
    flagged SNOOP_RESERVED."""
    tb = TB(seed=seed, cqids=16, write_cqids=4)
    tb.random_ops(60)
    snoops = 300

    kinds = [H2DReqOpcode.SnpData.value, H2DReqOpcode.SnpInv.value, H2DReqOpcode.SnpCur.value]

    def snoop(tb: TB, t: int) -> None:
        if t < snoops:      # every 50th a reserved opcode (0, 4, 7 in turn)
            opcode = (0, 4, 7)[t // 50 % 3] if t % 50 == 49 else kinds[t % 3]
            tb.home.snoop(t, t, opcode)
    tb.hooks.append(snoop)
    tb.run()
    tb.check_end()
    answers = [t for t, ch, _ in tb.home.log if ch == "d2h_rsp"]
    assert len(answers) == snoops
    assert answers[-1] - answers[0] == snoops - 1, "snoops not answered at full rate"
    assert tb.reserved_snoops == snoops // 50

    rough = TB(seed=seed, traffic=Traffic(h2d_idle=0.2, d2h_bp=0.5, snoops=0.5),
               cqids=16, write_cqids=4)
    rough.random_ops(60)
    rough.run()
    rough.check_end()
    assert rough.home.snoops_answered > 50


def test_unknown_cqids_dropped(seed):
    """H2D Rsp and H2D Data naming no request in flight (a free read CQID, a free write
    CQID, CQIDs beyond both rings, write CQIDs for data) are dropped with their error
    kind; the first error is latched, the status is sticky until cleared, nothing is
    sent, and traffic afterwards is untouched."""
    tb = TB(seed=seed, cqids=8, write_cqids=4)
    rsp, dat = H2DRspOpcode, {"data": 0x1234, "poison": 0, "go_err": 0}
    tb.home.raw("rsp", 2, {"opcode": rsp.GO.value, "cqid": 5, "rsp_data": 3})
    tb.home.raw("rsp", 3, {"opcode": rsp.GO_WritePull.value, "cqid": 9, "rsp_data": 7})
    tb.home.raw("rsp", 4, {"opcode": rsp.WritePull.value, "cqid": 4095, "rsp_data": 7})
    tb.home.raw("rsp", 5, {"opcode": 0, "cqid": 12, "rsp_data": 0})
    tb.home.raw("data", 3, {**dat, "cqid": 3})
    tb.home.raw("data", 4, {**dat, "cqid": 10})
    tb.home.raw("data", 5, {**dat, "cqid": 16})
    tb.home.raw("data", 80, {**dat, "cqid": 7})
    both = (1 << E.RSP_NOT_IN_FLIGHT) | (1 << E.DATA_NOT_IN_FLIGHT)
    tb.clears = {40: 1 << E.RSP_NOT_IN_FLIGHT, 70: both}
    seen = []

    def watch(tb: TB, t: int) -> None:
        seen.append((tb.status, dict(tb.first)))
        if t == 100:        # traffic only once the bad messages are through
            tb.random_ops(30)
    tb.hooks.append(watch)
    tb.run(hold=lambda t: t <= 100)
    tb.check_end(extra_errors=Counter({E.RSP_NOT_IN_FLIGHT: 4, E.DATA_NOT_IN_FLIGHT: 4}))
    # The first error: the GO for CQID 5 (its data-channel twin came a cycle later).
    assert next(first for status, first in seen if status) == \
        {"code": E.RSP_NOT_IN_FLIGHT, "opcode": rsp.GO.value, "id": 5}
    assert seen[39][0] == both and seen[42][0] == 1 << E.DATA_NOT_IN_FLIGHT
    assert seen[42][1]["code"] == E.RSP_NOT_IN_FLIGHT, "first error kept while any bit set"
    assert seen[75][0] == 0
    # After the status was all clear, the next error is the first again.
    assert tb.first == {"code": E.DATA_NOT_IN_FLIGHT, "opcode": 0, "id": 7}
    assert tb.status == 1 << E.DATA_NOT_IN_FLIGHT
    answered = [t for t, ch, _ in tb.home.log if ch.startswith("d2h")]
    assert min(answered) > 100, "the agent answered a dropped message"


@pytest.mark.parametrize("fault", list(READ_FAULTS))
def test_read_fault_directed(fault, seed):
    """One read with the fault among clean reads and writes: it completes, flagged when
    the fault calls for it, the others are clean; the error record names its CQID."""
    def faults(txn: Txn) -> set[str]:
        return {fault} if txn.kind == "read" and txn.seq == 3 else set()
    tb = TB(seed=seed, faults=faults, cqids=8, write_cqids=4)
    for i in range(10):
        tb.read(0x40 + i)
        tb.write(0x80 + i, tb.rng.getrandbits(512))
    tb.run()
    tb.check_end()
    cqid = tb.home.reads[3].cqid
    want_code = E.READ_ERROR if tb.home.reads[3].expect_error else FAULT_ERRORS[fault]
    assert tb.first == {"code": want_code, "opcode": tb.first["opcode"], "id": cqid}


def test_rdcurr_completes_on_data_without_go(seed):
    """The default agent against a host that answers RdCurr with H2D Data only, as the
    specification describes it (CXL 1.1 §3.2.4.1.6, 3.x §3.2.4.2.6): every read
    completes in order with the host's line, on its data, and no H2D Rsp is sent."""
    tb = TB(seed=seed, traffic=ROUGH)
    for i in range(40):
        tb.read(0x200 + i)
    tb.run(max_cycles=20_000)
    tb.check_end()
    assert tb.done["rd"] == 40
    assert not [f for _, ch, f in tb.home.log if ch == "h2d_rsp"]
    data_at = {f["cqid"]: t for t, ch, f in tb.home.log if ch == "h2d_data"}
    for j, t in enumerate(tb.out_cycles["rd"]):
        assert t >= data_at[tb.home.reads[j].cqid] + 3


def test_go_for_a_read_is_unexpected(seed):
    """A GO naming a RdCurr in flight (whatever state it grants) is dropped as
    RSP_UNEXPECTED and does not complete the read: the read still waits for its data."""
    tb = TB(seed=seed, cqids=8, write_cqids=4,
            timing=HomeTiming(read_latency=60, write_latency=10))
    tb.read(0x40)
    for t, state in ((10, GoState.I), (12, GoState.Error), (14, GoState.E)):
        tb.home.raw("rsp", t, {"opcode": H2DRspOpcode.GO.value, "cqid": 0,
                               "rsp_data": state.value})
    tb.run()
    tb.check_end(extra_errors=Counter({E.RSP_UNEXPECTED: 3}))
    data_at = next(t for t, ch, _ in tb.home.log if ch == "h2d_data")
    assert tb.out_cycles["rd"] == [data_at + 3]
    assert tb.first == {"code": E.RSP_UNEXPECTED, "opcode": H2DRspOpcode.GO.value, "id": 0}


def test_duplicate_read_data(seed):
    """A second H2D Data for a read that cannot leave yet (an older read waits at the
    ROB head) is dropped as DATA_DUPLICATE; the first line is kept."""
    tb = TB(seed=seed, cqids=8, write_cqids=4,
            timing=HomeTiming(read_latency=60, write_latency=10))
    tb.read(0x40)
    tb.read(0x41)
    good = background_line(0x41)
    tb.home.raw("data", 10, {"cqid": 1, "data": good, "poison": 0, "go_err": 0})
    tb.home.raw("data", 11, {"cqid": 1, "data": good ^ ((1 << 512) - 1), "poison": 0,
                             "go_err": 0})
    tb.run()
    # The home's own data for CQID 1 comes while read 0 still waits: a duplicate too.
    tb.check_end(extra_errors=Counter({E.DATA_DUPLICATE: 2}))
    assert tb.first == {"code": E.DATA_DUPLICATE, "opcode": 0, "id": 1}


@pytest.mark.parametrize("fault", list(WRITE_FAULTS))
def test_write_fault_directed(fault, seed):
    """One write with the fault among clean reads and writes (see the read case)."""
    def faults(txn: Txn) -> set[str]:
        return {fault} if txn.kind == "write" and txn.seq == 2 else set()
    tb = TB(seed=seed, faults=faults, cqids=8, write_cqids=4)
    for i in range(8):
        tb.write(0x80 + i, tb.rng.getrandbits(512))
        tb.read(0x80 + i)
    tb.run()
    tb.check_end()
    txn = tb.home.writes[2]
    want_code = E.WRITE_ERROR if txn.expect_error else FAULT_ERRORS[fault]
    assert tb.first["code"] == want_code and tb.first["id"] == txn.cqid
    sent = [f for _, ch, f in tb.home.log if ch == "d2h_data"]
    assert len(sent) == 8 - (fault == "drop"), "a line sent twice, or sent for a drop"


def test_reset_in_traffic(seed):
    """Reset with reads and writes in flight, the home reset with it: afterwards the
    agent starts from CQID 0 and fresh traffic is exact."""
    tb = TB(seed=seed, traffic=ROUGH, cqids=8, write_cqids=4)
    tb.random_ops(80)
    tb.reset_at = 150

    def fresh(tb: TB) -> None:
        tb.random_ops(60)
    tb.after_reset = fresh
    tb.run()
    tb.check_end()
    assert tb.home.reads[tb.base["rd"]].cqid == 0
    assert tb.home.writes[tb.base["wr"]].cqid == tb.dut.write_cqid_base
    assert tb.done["rd"] + tb.done["wr"] == 60


def test_idle_latency():
    """The latencies the docstring states, on an idle agent with ready sinks."""
    tb = TB(seed=1, cqids=4, write_cqids=2,
            timing=HomeTiming(read_latency=10, write_latency=10, go_after_data=0))
    tb.read(0x10)
    tb.run()
    log = tb.home.log
    req = next(t for t, ch, _ in log if ch == "d2h_req")
    last_h2d = max(t for t, ch, _ in log if ch.startswith("h2d"))
    issue = tb.issued["rd"][0].t_issue
    assert req == issue + 1
    assert tb.out_cycles["rd"][0] == last_h2d + 3

    tb = TB(seed=1, cqids=4, write_cqids=2,
            timing=HomeTiming(read_latency=10, write_latency=10, go_after_data=0))
    tb.write(0x10, 5)
    tb.run()
    log = tb.home.log
    pull = next(t for t, ch, _ in log if ch == "h2d_rsp")
    data = next(t for t, ch, _ in log if ch == "d2h_data")
    assert data == pull + 4
    assert tb.out_cycles["wr"][0] == data + 2


@pytest.mark.parametrize("cqids", [64, 128])
def test_rdcurr_throughput(cqids):
    """A long RdCurr stream (host latency 100, no jitter, everything ready): prints lines
    per cycle, the issue benchmark's ``rdcurr_utilization``; the steady-state rate must
    reach 90% of Little's-law bound ``min(1, cqids / (latency + 4))``."""
    latency, n = 100, 1500
    tb = TB(seed=3, cqids=cqids, write_cqids=8,
            timing=HomeTiming(read_latency=latency, jitter=0))
    for i in range(n):
        tb.read(0x1000 + i)
    start = time.perf_counter()
    tb.run(max_cycles=n * 3 + 1000)
    wall = time.perf_counter() - start
    tb.check_end()
    first_issue = tb.issued["rd"][0].t_issue
    out = tb.out_cycles["rd"]
    total = n / (out[-1] - first_issue + 1)
    steady = (n - 1) / (out[-1] - out[0])
    bound = min(1.0, cqids / (latency + 4))
    print(f"rdcurr cqids={cqids} latency={latency}: {total:.3f} lines/cycle overall, "
          f"{steady:.3f} after the first line (bound {bound:.3f}); "
          f"{out[-1] - first_issue + 1} cycles simulated in {wall:.1f} s")
    assert steady > 0.9 * bound


@pytest.mark.parametrize("config", ["default", "c2w2"])
def test_verilog_lints_clean(config, tmp_path):
    kwargs = {} if config == "default" else dict(cqids=2, write_cqids=2)
    assert_lints_clean(CacheAgent(**kwargs), f"cxl_cache_agent_{config.replace('-', '_')}",
                       tmp_path)


def test_d2h_req_fields(seed):
    """Every D2H Req is RdCurr or ItoMWr with the request's line address, NT and reserved
    bits zero, read CQIDs below ``cqids`` and write CQIDs in the write range."""
    tb = TB(seed=seed, cqids=8, write_cqids=4)
    tb.random_ops(40, lines=1 << 20)
    tb.run()
    tb.check_end()
    reqs = [f for _, ch, f in tb.home.log if ch == "d2h_req"]
    for f in reqs:
        assert f["nt"] == f["rsvd0"] == f["rsvd1"] == 0
        if f["opcode"] == D2HReqOpcode.RdCurr.value:
            assert f["cqid"] < 8
        else:
            assert f["opcode"] == D2HReqOpcode.ItoMWr.value and 8 <= f["cqid"] < 12
    assert [f["address"] for f in reqs if f["opcode"] == D2HReqOpcode.RdCurr.value] == \
        [op.line for op in tb.issued["rd"]]
