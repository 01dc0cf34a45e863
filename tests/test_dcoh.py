# amaranth: UnusedElaboratable=no
"""DCOH (hw/cxl/dcoh.py), fast tier: Amaranth simulator.

A :class:`TB` runs one simulator process that, each cycle, drives the access requests
(random idle), the grant sink's ``ready`` (random backpressure, or paused), the dones
(each granted access returns its handle after a random delay, or is held by the test), the
forwards and H2D answers (GO-E, GO-Err) from :class:`tb.dcoh_host.DcohHost` (random idle;
the host's own latency, jitter and reordering), the D2H Req ``ready`` (random
backpressure), host checks (random idle) and their sink's ``ready`` (random backpressure),
flip commands and error clears; then it samples every handshake. The scoreboard requires
each grant to name an access waiting for one, with the error flag exactly for lines beyond
device memory and for requests the host answered GO-Err (then also ``denied``);
:class:`tb.dcoh_host.BiasChecker` holds every grant, check answer and flip to the bias
rules (no host-bias grant before its forward, no device-bias grant unless every line of
the page was claimed since the host last touched it and the host caches none of them, no
check answered while an access it must wait for is undone, no successful flip leaving a
line unclaimed or cached); the host rejects protocol violations (CQID reuse, unexpected
opcodes, reserved bits) and a :class:`StreamRule` watches every output stream. Error
pulses are counted per kind and compared with what the test injected.

Random tests print their seed; ``SEED=<n>`` replays one. (The linter option on the first
line lets tests build DCOHs only to see them rejected.)
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from hw.cxl.dcoh import ACC_REQ, CHK_RSP, ERR_INFO, Dcoh, DcohError
from hw.cxl.messages import (
    Codec,
    D2HReq,
    D2HReqOpcode,
    GoState,
    H2DData,
    H2DRsp,
    H2DRspOpcode,
    M2SReq,
    M2SReqOpcode,
)
from tb.dcoh_host import (
    FAILING,
    FWD_FAULTS,
    BiasChecker,
    DcohHost,
    HostReq,
    HostTiming,
    fwd_fields,
    h2d_answer,
)

from .conftest import assert_lints_clean
from .stream_rule import StreamRule

E = DcohError
CODEC = {name: Codec(layout) for name, layout in {
    "acc": ACC_REQ, "chk_rsp": CHK_RSP, "d2h_req": D2HReq, "fwd": M2SReq, "err": ERR_INFO,
    "flip_status": Dcoh.FLIP_STATUS, "rsp": H2DRsp, "data": H2DData}.items()}
FAULT_ERRORS = {"wrong_opcode": E.FWD_OPCODE, "wrong_address": E.FWD_ADDRESS,
                "not_fwd": E.FWD_OPCODE}


# --- bench ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Traffic:
    """Per-cycle probabilities of idle and backpressure, and the done delay."""
    acc_idle: float = 0.0       # i_acc valid withheld
    grant_bp: float = 0.0       # o_grant ready low
    d2h_bp: float = 0.0         # o_d2h_req ready low
    fwd_idle: float = 0.0       # i_fwd valid withheld
    chk_idle: float = 0.0       # i_host_chk valid withheld
    chk_bp: float = 0.0         # o_host_chk ready low
    done_delay: int = 0         # a done follows its grant after 1 .. 1 + done_delay cycles


SMOOTH = Traffic()
ROUGH = Traffic(acc_idle=0.3, grant_bp=0.3, d2h_bp=0.3, fwd_idle=0.3, chk_idle=0.3,
                chk_bp=0.3, done_delay=12)


@dataclass
class Acc:
    line: int
    write: bool
    tag: int
    t_issue: int = -1
    t_grant: int = -1
    handle: int = -1
    host_bias: bool | None = None
    error: bool | None = None
    denied: bool | None = None


@dataclass
class Chk:
    line: int
    state: str | None           # what the host caches after the answer
    t_chk: int = -1
    t_ans: int = -1
    flipped: bool | None = None
    error: bool | None = None


@dataclass
class Flip:
    first: int
    pages: int
    to_host: bool
    t_start: int = -1
    t_end: int = -1
    error: bool | None = None


Script = Generator[Callable[[], bool], None, None]


class TB:
    """Clock, the DCOH, the host model, drivers, sinks, checkers and scoreboard.

    Directed tests queue stimulus and steer the run with ``script``: a generator that
    yields conditions (zero-argument callables); each cycle, while the current condition
    holds, the generator runs on to its next ``yield``, so the code between two yields
    runs in the first cycle the earlier condition is true. ``hooks`` run every cycle.
    """

    def __init__(self, *, seed: int, traffic: Traffic = SMOOTH,
                 timing: HostTiming | None = None,
                 faults: Callable[[HostReq], Iterable[str]] | None = None,
                 answer: Callable[[HostReq], str] | None = None,
                 hdm_base: int | None = None, **dcoh: object):
        self.dut = Dcoh(**dcoh)
        self.rng = random.Random(seed)
        self.traffic = traffic
        self.host = DcohHost(timing=timing or HostTiming(latency=12, jitter=8, reorder=True),
                             rng=random.Random(seed + 1), read_opcode=self.dut.read_opcode,
                             faults=faults, answer=answer)
        self.hdm_base = self.rng.getrandbits(40) << 4 if hdm_base is None else hdm_base
        self.lpp = self.dut.lines_per_page
        self.total_lines = self.dut.pages * self.lpp
        self.checker = BiasChecker(self.host, hdm_base=self.hdm_base, lines_per_page=self.lpp)
        self.grant_codec = Codec(self.dut.grant_layout)
        self.flip_codec = Codec(self.dut.flip_layout)
        self.acc_q: deque[Acc] = deque()
        self.chk_q: deque[Chk] = deque()
        self.flip_q: deque[Flip] = deque()
        self.accs: list[Acc] = []               # accepted, in order
        self.waiting: dict[int, Acc] = {}       # tag -> accepted, not granted
        self.chks: list[Chk] = []               # accepted, in order
        self.answered = 0
        self.flips: list[Flip] = []             # started
        self.lost_flips: list[Flip] = []        # started, then lost to a reset
        self.cur_acc: Acc | None = None         # driven on i_acc
        self.dones: list[tuple[int, int]] = []  # (due cycle, handle), sorted
        self.held: list[int] = []               # handles whose done the test holds
        self.hold: Callable[[Acc], bool] = lambda acc: False
        self.done_log: list[tuple[int, int]] = []
        self.raw_dones: dict[int, int] = {}     # cycle -> handle sent regardless
        self.starts: dict[int, Flip] = {}       # cycle -> start pulse regardless of busy
        self.clears: dict[int, int] = {}        # cycle -> i_err_clear
        self.errors: Counter = Counter()        # o_err_set bits seen
        self.expect: Counter = Counter()        # error pulses the test injected
        self.status = 0
        self.first: dict = {}
        self.max_inflight = 0
        self.pause_grant = 0                    # o_grant ready held low before this cycle
        self.hooks: list[Callable[[TB, int], None]] = []
        self.script: Script | None = None
        self.reset_at: int | None = None
        self.after_reset: Callable[[TB], None] | None = None
        self.base_req = 0                       # host requests before the last reset
        self.next_tag = 0
        self.cycles = 0

    # Stimulus ---------------------------------------------------------------------------
    def access(self, line: int, write: bool = False) -> Acc:
        acc = Acc(line, write, self.next_tag)
        self.next_tag = (self.next_tag + 1) % (1 << 16)
        self.acc_q.append(acc)
        return acc

    def check(self, line: int, state: str | None = None) -> Chk:
        chk = Chk(line, state)
        self.chk_q.append(chk)
        return chk

    def flip(self, first: int, pages: int, to_host: bool = False) -> Flip:
        cmd = Flip(first, pages, to_host)
        self.flip_q.append(cmd)
        return cmd

    def page_line(self, page: int, rng: random.Random | None = None) -> int:
        return page * self.lpp + (rng or self.rng).randrange(self.lpp)

    def random_accesses(self, n: int, *, pages: Iterable[int] | None = None,
                        write_share: float = 0.4, oor_share: float = 0.0) -> None:
        """``n`` accesses of random lines of ``pages`` (default all), some beyond device
        memory with probability ``oor_share``."""
        pages = list(range(self.dut.pages) if pages is None else pages)
        for _ in range(n):
            if self.rng.random() < oor_share:
                line = self.total_lines + self.rng.choice((0, 1, self.rng.getrandbits(30)))
            else:
                line = self.page_line(self.rng.choice(pages))
            self.access(line, self.rng.random() < write_share)

    def populate(self, share: float = 0.5) -> None:
        """The host caches a random share of all lines (clean or dirty), as it may while
        every page is in host bias."""
        for line in range(self.total_lines):
            if self.rng.random() < share:
                self.host.touch(self.hdm_base + line, self.rng.choice("SM"))

    def release(self, at: int | None = None) -> None:
        """Send the held dones (from cycle ``at`` on, one per cycle, if given)."""
        self.hold = lambda acc: False
        for i, handle in enumerate(self.held):
            if at is None:
                self._schedule_done(self.cycles, handle)
            else:
                self.dones.append((at + i, handle))
        self.dones.sort()
        self.held = []

    def _schedule_done(self, t: int, handle: int) -> None:
        delay = 1 + (self.rng.randint(0, self.traffic.done_delay)
                     if self.traffic.done_delay else 0)
        self.dones.append((t + delay, handle))
        self.dones.sort()

    # Queries ------------------------------------------------------------------------------
    def granted(self) -> bool:
        """Every access queued so far has been granted."""
        return not self.acc_q and self.cur_acc is None and not self.waiting

    def flips_done(self) -> bool:
        return not self.flip_q and all(f.t_end >= 0 for f in self.flips)

    # Running ---------------------------------------------------------------------------------
    def run(self, *, max_cycles: int = 30_000, drain: int = 6) -> TB:
        """Run until every queued access, check, flip and script step is through, the
        host and the DCOH are idle for ``drain`` cycles."""
        dut, host, rng, tr = self.dut, self.host, self.rng, self.traffic
        outs = {"grant": dut.o_grant, "d2h_req": dut.o_d2h_req, "chk": dut.o_host_chk}
        rules = {name: StreamRule(name) for name in outs}
        sampled = [dut.i_acc.ready, dut.i_host_chk.ready, dut.i_fwd.ready, dut.i_done.ready,
                   *(x for p in outs.values() for x in (p.valid, p.payload.as_value())),
                   dut.o_flip.as_value(), dut.o_err_set, dut.o_err_status,
                   dut.o_err_first.as_value(), dut.o_inflight, dut.o_busy,
                   dut.i_h2d_rsp.ready, dut.i_h2d_data.ready]
        h2d_ports = {"rsp": dut.i_h2d_rsp, "data": dut.i_h2d_data}
        acc_codec, flip_codec = CODEC["acc"], self.flip_codec
        cond = next(self.script) if self.script else None

        async def bench(ctx):
            nonlocal cond
            self.cur_acc = None
            cur_chk: Chk | None = None
            offered: dict | None = None
            h2d: tuple[str, dict] | None = None
            t, quiet = 0, 0
            ctx.set(dut.hdm_base, self.hdm_base)
            while True:
                self.cycles = t
                if t == self.reset_at:
                    ctx.set(cd.rst, 1)
                    await ctx.tick()
                    ctx.set(cd.rst, 0)
                    self.cur_acc = cur_chk = offered = h2d = None
                    self._reset(rules)
                    if self.after_reset:
                        self.after_reset(self)
                    t += 1
                    self.cycles = t
                for hook in self.hooks:
                    hook(self, t)
                while cond is not None and cond():
                    cond = next(self.script, None)
                # Access requests.
                if self.cur_acc is None and self.acc_q and not rng.random() < tr.acc_idle:
                    self.cur_acc = self.acc_q.popleft()
                    ctx.set(dut.i_acc.payload.as_value(), acc_codec.pack(
                        line=self.cur_acc.line, write=self.cur_acc.write, tag=self.cur_acc.tag))
                ctx.set(dut.i_acc.valid, self.cur_acc is not None)
                # Sinks.
                ready = {"grant": t >= self.pause_grant and not rng.random() < tr.grant_bp,
                         "d2h_req": not rng.random() < tr.d2h_bp,
                         "chk": not rng.random() < tr.chk_bp}
                for name, port in outs.items():
                    ctx.set(port.ready, ready[name])
                # Dones (always ready: one per cycle).
                done = self.raw_dones.get(t)
                if done is None and self.dones and self.dones[0][0] <= t:
                    done = self.dones.pop(0)[1]
                ctx.set(dut.i_done.valid, done is not None)
                if done is not None:
                    ctx.set(dut.i_done.payload, done)
                # Forwards (always ready).
                if offered is None and not rng.random() < tr.fwd_idle:
                    offered = host.offer(t)
                    if offered is not None:
                        ctx.set(dut.i_fwd.payload.as_value(), CODEC["fwd"].pack(**offered))
                ctx.set(dut.i_fwd.valid, offered is not None)
                # H2D Rsp / Data (always ready).
                if h2d is None and not rng.random() < tr.fwd_idle:
                    h2d = host.offer_h2d(t)
                    if h2d is not None:
                        port = h2d_ports[h2d[0]]
                        ctx.set(port.payload.as_value(), CODEC[h2d[0]].pack(**h2d[1]))
                for name, port in h2d_ports.items():
                    ctx.set(port.valid, h2d is not None and h2d[0] == name)
                # Host checks.
                if cur_chk is None and self.chk_q and not rng.random() < tr.chk_idle:
                    cur_chk = self.chk_q.popleft()
                    ctx.set(dut.i_host_chk.payload, cur_chk.line)
                ctx.set(dut.i_host_chk.valid, cur_chk is not None)
                # Flip commands: queued ones start when the DCOH is not busy.
                start = self.starts.get(t)      # forced: not tracked as a flip
                if start is None and self.flip_q and not ctx.get(dut.o_flip.busy) and \
                        all(f.t_end >= 0 for f in self.flips):
                    start = self.flip_q.popleft()
                    start.t_start = t
                    self.flips.append(start)
                ctx.set(dut.i_flip_start, start is not None)
                if start is not None:
                    ctx.set(dut.i_flip.as_value(), flip_codec.pack(
                        first_page=start.first, pages=start.pages, to_host=start.to_host))
                ctx.set(dut.i_err_clear, self.clears.get(t, 0))

                _, _, *v = await ctx.tick().sample(*sampled)
                acc_ready, chk_ready, fwd_ready, done_ready = v[:4]
                out_v = {name: (v[4 + 2 * i], v[5 + 2 * i]) for i, name in enumerate(outs)}
                flip_st, err_set, status, first, inflight, busy, rsp_ready, data_ready = v[10:]
                assert fwd_ready and done_ready, "i_fwd / i_done must always be ready"
                assert rsp_ready and data_ready, "i_h2d_rsp / i_h2d_data must always be ready"

                if self.cur_acc is not None and acc_ready:
                    self.cur_acc.t_issue = t
                    self.accs.append(self.cur_acc)
                    self.waiting[self.cur_acc.tag] = self.cur_acc
                    self.cur_acc = None
                if done is not None:
                    self.done_log.append((t, done))
                    if t not in self.raw_dones:
                        self.checker.done(t, done)
                if offered is not None:
                    host.take(t)
                    offered = None
                if h2d is not None:
                    host.take_h2d(t)
                    h2d = None
                if cur_chk is not None and chk_ready:
                    cur_chk.t_chk = t
                    self.chks.append(cur_chk)
                    cur_chk = None
                for name, (valid, payload) in out_v.items():
                    rules[name].observe(t, valid, ready[name], payload)
                    if valid and ready[name]:
                        getattr(self, f"_out_{name}")(t, payload)
                fs = CODEC["flip_status"].unpack(flip_st)
                for f in self.flips:
                    if f.t_end < 0 and t > f.t_start and not fs["busy"]:
                        assert fs["done"], f"flip started at {f.t_start} ended without done"
                        f.t_end, f.error = t, bool(fs["error"])
                        self.checker.flip_done(f.t_start, t, f.first, f.pages,
                                               to_host=f.to_host, error=f.error)
                if err_set:
                    self.errors.update(k for k in range(E.COUNT) if err_set >> k & 1)
                self.status, self.first = status, CODEC["err"].unpack(first)
                self.max_inflight = max(self.max_inflight, inflight)
                assert inflight <= dut.cqids

                t += 1
                assert t < max_cycles, (
                    f"no progress after {t} cycles (hang?): {len(self.waiting)} accesses "
                    f"waiting, {len(self.chks) - self.answered} checks, dones "
                    f"{len(self.dones)} scheduled / {len(self.held)} held, host: "
                    f"{host.outstanding()}")
                pending = (busy or self.acc_q or self.waiting or self.cur_acc or self.chk_q
                           or cur_chk or self.answered < len(self.chks) or self.dones or self.flip_q
                           or any(f.t_end < 0 for f in self.flips) or offered or h2d
                           or not host.idle() or cond is not None
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

    def _reset(self, rules: dict) -> None:
        """The DCOH was reset: everything in flight is lost, the host and the checker
        forget it."""
        self.host.reset()
        self.checker.reset()
        for r in rules.values():
            r.held = None
        self.base_req = len(self.host.reqs)
        self.acc_q.clear()
        self.chk_q.clear()
        self.flip_q.clear()
        self.waiting.clear()
        self.dones.clear()
        self.held.clear()
        self.accs = [a for a in self.accs if a.t_grant >= 0]
        self.chks = self.chks[:self.answered]
        self.lost_flips += [f for f in self.flips if f.t_end < 0]
        self.flips = [f for f in self.flips if f.t_end >= 0]

    # Scoreboard ----------------------------------------------------------------------------
    def _out_grant(self, t: int, payload: int) -> None:
        g = self.grant_codec.unpack(payload)
        acc = self.waiting.pop(g["tag"], None)
        assert acc is not None, f"grant at {t} with tag {g['tag']} that no access waits for"
        acc.t_grant, acc.handle = t, g["handle"]
        acc.host_bias, acc.error = bool(g["host_bias"]), bool(g["error"])
        acc.denied = bool(g["denied"])
        oor = acc.line >= self.total_lines
        failed = self.host.failed.pop(self.dut.cqid_base + acc.handle, None)
        assert acc.denied == (failed is not None), \
            f"grant at {t} of line {acc.line:#x}: denied {acc.denied}, host answer {failed}"
        assert acc.error == (oor or acc.denied), \
            f"grant at {t} of line {acc.line:#x}: error {acc.error}"
        if acc.denied:
            assert acc.host_bias and failed.line == (self.hdm_base + acc.line) & ((1 << 46) - 1)
            assert failed.opcode == (D2HReqOpcode.RdOwn.value if acc.write
                                     else self.dut.read_opcode.value)
            return
        if oor:
            assert not acc.host_bias
            self.expect[E.ACC_RANGE] += 1
            return
        self.checker.grant(t, line=acc.line, write=acc.write, handle=acc.handle,
                           cqid=self.dut.cqid_base + acc.handle, host_bias=acc.host_bias)
        if self.hold(acc):
            self.held.append(acc.handle)
        else:
            self._schedule_done(t, acc.handle)

    def _out_d2h_req(self, t: int, payload: int) -> None:
        f = CODEC["d2h_req"].unpack(payload)
        base, n = self.dut.cqid_base, self.dut.cqids
        assert base <= f["cqid"] < base + n, f"D2H Req at {t}: CQID {f['cqid']} outside the pool"
        self.host.d2h(t, f)

    def _out_chk(self, t: int, payload: int) -> None:
        r = CODEC["chk_rsp"].unpack(payload)
        assert self.answered < len(self.chks), f"check answer at {t} with no check taken"
        chk = self.chks[self.answered]
        self.answered += 1
        chk.t_ans, chk.flipped, chk.error = t, bool(r["flipped"]), bool(r["error"])
        oor = chk.line >= self.total_lines
        assert chk.error == oor, f"check of line {chk.line:#x} answered at {t}: {r}"
        if oor:
            assert not chk.flipped
            self.expect[E.CHK_RANGE] += 1
            return
        self.checker.check_answered(chk.t_chk, t, chk.line, chk.flipped)
        self.host.touch(self.hdm_base + chk.line, chk.state)

    def expected_errors(self) -> Counter:
        want = Counter(self.expect)
        for req in self.host.reqs[self.base_req:]:
            want.update(FAULT_ERRORS[f] for f in req.faults)
            if req.answer in FAILING and req.t_fwd is not None:
                want[E.HOST_ERROR] += 1
        return +want

    def check_end(self, *, contended_ok: bool = False) -> None:
        """Everything completed; error pulses as injected (FLIP_CONTENDED may come from
        random checks during flips when ``contended_ok``)."""
        assert not self.waiting and not self.acc_q, "not every access was granted"
        assert self.answered == len(self.chks) and not self.chk_q
        assert not self.held and not self.dones and not self.checker.outstanding
        assert not self.host.failed, f"GO-Err answers without a denied grant: {self.host.failed}"
        assert self.host.idle(), self.host.outstanding()
        seen = Counter(self.errors)
        if contended_ok:
            contended = seen.pop(E.FLIP_CONTENDED, 0)
            flip_errors = any(f.error for f in self.flips)
            assert bool(contended) == flip_errors or (contended and self.lost_flips), \
                "FLIP_CONTENDED pulses and flip errors disagree"
        want = self.expected_errors()
        assert seen == want, f"error pulses {dict(seen)}, expected {dict(want)}"


def random_faults(rng: random.Random, rate: float) -> Callable[[HostReq], set[str]]:
    """A ``faults`` callable: each request gets one bad forward with probability ``rate``."""
    def choose(req: HostReq) -> set[str]:
        return {rng.choice(FWD_FAULTS)} if rng.random() < rate else set()
    return choose



# --- parameters ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"pages": 0}, "pages must be an integer from 1 to 16777216, not 0"),
    ({"pages": 1 << 25}, "pages must be an integer from 1 to 16777216, not 33554432"),
    ({"pages": 8.0}, "pages must be an integer from 1 to 16777216, not 8.0"),
    ({"pages": True}, "pages must be an integer from 1 to 16777216, not True"),
    ({"page_bytes": 32}, "page_bytes must be a power of two from 64 to 2097152, not 32"),
    ({"page_bytes": 3000}, "page_bytes must be a power of two from 64 to 2097152, not 3000"),
    ({"page_bytes": 1 << 22},
     "page_bytes must be a power of two from 64 to 2097152, not 4194304"),
    ({"page_bytes": "4096"},
     "page_bytes must be a power of two from 64 to 2097152, not '4096'"),
    ({"cqids": 1}, "cqids must be a power of two from 2 to 256, not 1"),
    ({"cqids": 48}, "cqids must be a power of two from 2 to 256, not 48"),
    ({"cqids": 512}, "cqids must be a power of two from 2 to 256, not 512"),
    ({"cqids": None}, "cqids must be a power of two from 2 to 256, not None"),
    ({"cqid_base": 100}, r"cqid_base must be a multiple of cqids \(64\) from 0 to 4032, not 100"),
    ({"cqid_base": 4096}, r"cqid_base must be a multiple of cqids \(64\) from 0 to 4032, not 4096"),
    ({"cqid_base": -64}, r"cqid_base must be a multiple of cqids \(64\) from 0 to 4032, not -64"),
    ({"cqids": 8, "cqid_base": 4092},
     r"cqid_base must be a multiple of cqids \(8\) from 0 to 4088, not 4092"),
    ({"cqid_base": False},
     r"cqid_base must be a multiple of cqids \(64\) from 0 to 4032, not False"),
    ({"read_opcode": D2HReqOpcode.RdOwn},
     "read_opcode must be D2HReqOpcode.RdCurr or D2HReqOpcode.RdShared, not "
     "<D2HReqOpcode.RdOwn: 2>"),
    ({"read_opcode": 1},
     "read_opcode must be D2HReqOpcode.RdCurr or D2HReqOpcode.RdShared, not 1"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        Dcoh(**kwargs)


def test_parameters_are_read_only_properties():
    dut = Dcoh(pages=5, page_bytes=256, cqids=8, cqid_base=8,
               read_opcode=D2HReqOpcode.RdShared)
    assert (dut.pages, dut.page_bytes, dut.lines_per_page, dut.cqids, dut.cqid_base,
            dut.read_opcode) == (5, 256, 4, 8, 8, D2HReqOpcode.RdShared)
    assert dut.grant_layout.size == 16 + 3 + 1 + 1 + 1
    assert {n: f.width for n, f in dut.flip_layout} == \
        {"first_page": 3, "pages": 3, "to_host": 1}
    default = Dcoh()
    assert (default.pages, default.page_bytes, default.cqids, default.cqid_base,
            default.read_opcode) == (256, 4096, 64, 0, D2HReqOpcode.RdCurr)
    with pytest.raises(AttributeError):
        dut.pages = 6


def test_host_model_rejects_bad_values():
    with pytest.raises(ValueError, match=r"^latency must be a non-negative integer, not -1$"):
        HostTiming(latency=-1)
    with pytest.raises(ValueError, match=r"^jitter must be a non-negative integer, not 1.5$"):
        HostTiming(jitter=1.5)
    host = DcohHost()
    with pytest.raises(ValueError, match=r"^state must be 'S', 'M' or None, not 'E'$"):
        host.touch(3, "E")


# --- the checker and the host catch what they are for -------------------------------------

def test_checker_catches_violations():
    """The bias checker and the host model reject each kind of violation they exist for,
    so a DCOH that made one would fail the random tests."""
    from tb.dcoh_host import DcohHostError

    def fresh() -> tuple[DcohHost, BiasChecker]:
        host = DcohHost(timing=HostTiming(latency=0))
        return host, BiasChecker(host, hdm_base=0x100, lines_per_page=2)

    def claim(host: DcohHost, line: int, cqid: int, t: int) -> None:
        host.d2h(t, {"opcode": D2HReqOpcode.RdOwnNoData.value, "cqid": cqid,
                     "address": 0x100 + line})
        assert host.offer(t) is not None
        host.take(t)

    host, chk = fresh()
    with pytest.raises(AssertionError, match="host-bias grant before its forward"):
        chk.grant(5, line=0, write=False, handle=0, cqid=0, host_bias=True)
    with pytest.raises(AssertionError, match="0 of 2 lines claimed"):
        chk.grant(5, line=0, write=False, handle=0, cqid=0, host_bias=False)
    claim(host, 0, 1, 1)
    claim(host, 1, 2, 2)
    host.touch(0x101, "S")          # the host re-caches a claimed line
    with pytest.raises(AssertionError, match="while the host caches"):
        chk.grant(5, line=1, write=True, handle=0, cqid=0, host_bias=False)
    host, chk = fresh()
    claim(host, 0, 1, 1)
    claim(host, 1, 2, 2)
    chk.grant(5, line=1, write=True, handle=3, cqid=3, host_bias=False)
    with pytest.raises(AssertionError, match=r"device-bias handle 3 .* undone"):
        chk.check_answered(6, 8, 0, True)
    host, chk = fresh()
    host.d2h(1, {"opcode": D2HReqOpcode.RdCurr.value, "cqid": 4, "address": 0x102})
    host.offer(2)
    host.take(2)
    chk.grant(4, line=2, write=False, handle=4, cqid=4, host_bias=True)
    chk.check_answered(3, 9, 3, False)    # another line of the page: need not wait
    with pytest.raises(AssertionError, match="whose forward came at 2"):
        chk.check_answered(3, 9, 2, False)
    host, chk = fresh()
    with pytest.raises(AssertionError, match="flip reported success with page 0 not claimed"):
        chk.flip_done(0, 5, 0, 1, to_host=False, error=False)
    with pytest.raises(DcohHostError, match="CQID 7 reused while open"):
        host.d2h(1, {"opcode": D2HReqOpcode.RdOwn.value, "cqid": 7, "address": 1})
        host.d2h(2, {"opcode": D2HReqOpcode.RdOwn.value, "cqid": 7, "address": 2})
    with pytest.raises(DcohHostError, match="not expected from the DCOH"):
        host.d2h(3, {"opcode": D2HReqOpcode.ItoMWr.value, "cqid": 8, "address": 2})


# --- random traffic ----------------------------------------------------------------------

CONFIGS = {
    # The smallest DCOH: one page of one line, two entries.
    "smallest": dict(pages=1, page_bytes=64, cqids=2),
    # A non-power-of-two number of pages, RdShared reads, a CQID base.
    "odd": dict(pages=5, page_bytes=256, cqids=8, cqid_base=8,
                read_opcode=D2HReqOpcode.RdShared),
    "mid": dict(pages=8, page_bytes=1024, cqids=32, cqid_base=2048),
}


def random_hook(*, flip_rate: float, chk_rate: float, oor_share: float
                ) -> Callable[[TB, int], None]:
    """While accesses are queued: now and then a flip of a random range (a quarter of them
    to host bias) and host checks of random lines (some beyond device memory), the host
    then caching the line clean, dirty or not at all."""
    def hook(tb: TB, t: int) -> None:
        if not tb.acc_q:
            return
        rng, pages = tb.rng, tb.dut.pages
        if not tb.flip_q and tb.flips_done() and rng.random() < flip_rate:
            first = rng.randrange(pages)
            tb.flip(first, rng.randint(1, pages - first), to_host=rng.random() < 0.25)
        if rng.random() < chk_rate:
            line = (tb.total_lines + rng.randrange(4) if rng.random() < oor_share
                    else rng.randrange(tb.total_lines))
            tb.check(line, rng.choice(("S", "M", None)))
    return hook


@pytest.mark.parametrize("traffic", ["smooth", "rough"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_random_traffic(config, traffic, seed):
    """Random reads and writes over every page, some beyond device memory, while flips
    (to device and to host bias) and host checks come and go; the host reorders forwards
    and starts with a share of the lines cached. With ``rough``, idle and backpressure on
    every stream and late dones. Every grant and answer obeys the bias rules, nothing is
    lost, the errors are exactly the out-of-range ones."""
    tb = TB(seed=seed, traffic=ROUGH if traffic == "rough" else SMOOTH, **CONFIGS[config])
    tb.populate()
    tb.flip(0, tb.dut.pages)
    tb.random_accesses(300, oor_share=0.03)
    tb.hooks.append(random_hook(flip_rate=0.02, chk_rate=0.03, oor_share=0.1))
    tb.run()
    tb.check_end(contended_ok=True)
    print(f"{config}/{traffic}: {tb.cycles} cycles, grants {tb.checker.grants}, checks "
          f"{tb.checker.checks}, flips {len(tb.flips)} "
          f"({sum(bool(f.error) for f in tb.flips)} with error), max in flight "
          f"{tb.max_inflight}")
    assert tb.checker.grants["host"] > 0 and tb.checker.grants["device"] > 0
    assert tb.max_inflight == tb.dut.cqids or config == "mid"


@pytest.mark.parametrize("config", list(CONFIGS))
def test_random_bad_forwards(config, seed):
    """As above (rough) with a bad forward before the good one for a third of the
    requests, claims included: wrong opcode, wrong address, a MemRd. Each is dropped and
    counted, no grant goes to the wrong access, every request completes."""
    rng = random.Random(seed + 7)
    draw = random_faults(rng, 0.33)
    claims: list[HostReq] = []

    def faults(req: HostReq) -> set[str]:
        # A claim must get a bad forward in every run (with 15 to 30 claims, as in the
        # smallest DCOH, none did for about 1 seed in 3,000): the first claim draws on
        # (same seed) until it gets one.
        got = draw(req)
        if req.opcode == D2HReqOpcode.RdOwnNoData.value:
            while not claims and not got:
                got = draw(req)
            claims.append(req)
        return got
    tb = TB(seed=seed, traffic=ROUGH, faults=faults, **CONFIGS[config])
    tb.populate()
    tb.flip(0, tb.dut.pages)
    tb.random_accesses(200)
    tb.hooks.append(random_hook(flip_rate=0.02, chk_rate=0.02, oor_share=0.0))
    tb.run()
    tb.check_end(contended_ok=True)
    faulted = [r for r in tb.host.reqs if r.faults]
    assert len(faulted) > 10
    assert any(r.opcode == D2HReqOpcode.RdOwnNoData.value for r in faulted)


# --- capacity --------------------------------------------------------------------------

#: The largest pool, at the top of the CQID space, with 2 MiB pages (lint only: the
#: simulator takes 15 ms a cycle for it; the same trees are simulated at 2 to 64 entries).
LARGEST = dict(pages=5000, page_bytes=1 << 21, cqids=256, cqid_base=3840)


def test_fill_to_full_with_sink_paused(seed):
    """The default DCOH (64 entries) with its grant sink paused, accesses to a
    device-bias and a host-bias page, idle and backpressure on the other streams: the
    pool fills to every entry, the DCOH stops taking accesses, nothing is lost; on
    release every access is granted once."""
    tb = TB(seed=seed, traffic=Traffic(acc_idle=0.1, d2h_bp=0.2, fwd_idle=0.2, done_delay=4))
    snap = {}

    def script() -> Script:
        tb.flip(0, 1)
        yield tb.flips_done
        tb.pause_grant = tb.cycles + 400
        for i in range(tb.dut.cqids + 30):
            tb.access(tb.page_line(0 if i % 2 else 10), write=i % 3 == 0)
        yield lambda: tb.cycles == tb.pause_grant - 1
        snap["accepted"] = len(tb.accs)
        snap["granted"] = sum(a.t_grant >= 0 for a in tb.accs)
        snap["inflight"] = tb.max_inflight
    tb.script = script()
    tb.run()
    tb.check_end()
    # Every entry permitted or waiting, plus one access held in the decision stage.
    assert snap == {"accepted": tb.dut.cqids + 1, "granted": 0, "inflight": tb.dut.cqids}
    assert len(tb.accs) == tb.dut.cqids + 30
    assert {a.host_bias for a in tb.accs} == {False, True}


# --- flips -------------------------------------------------------------------------------

def d2h_since(tb: TB, t: int, opcode: D2HReqOpcode | None = None) -> list[dict]:
    return [f for ts, ch, f in tb.host.log if ch == "d2h_req" and ts >= t
            and (opcode is None or f["opcode"] == opcode.value)]


def test_flip_to_device_and_back(seed):
    """A flip claims every line of each host-bias page once with RdOwnNoData (the host
    writes dirty copies back and drops them), after which the pages' accesses are
    granted at once with no CXL.cache message; a flip over pages already in device bias
    claims nothing for them; a flip to host bias waits for the device-bias accesses
    granted before it, and the pages' accesses go through the host again."""
    tb = TB(seed=seed, traffic=Traffic(grant_bp=0.2, d2h_bp=0.2, fwd_idle=0.2),
            pages=6, page_bytes=256, cqids=8)
    tb.populate(1.0)
    lpp, base = tb.lpp, tb.hdm_base
    dirty = {x for x, s in tb.host.cache.items() if s == "M"}
    log = {}

    def script() -> Script:
        tb.flip(1, 3)
        yield tb.flips_done
        claims = d2h_since(tb, 0, D2HReqOpcode.RdOwnNoData)
        assert sorted(f["address"] for f in claims) == list(range(base + lpp, base + 4 * lpp))
        assert not tb.host.cached(range(base + lpp, base + 4 * lpp))
        assert {x for _, x in tb.host.writebacks} == {x for x in dirty
                                                      if base + lpp <= x < base + 4 * lpp}
        t0 = tb.cycles
        for page in (1, 2, 3, 0, 4, 5):
            tb.access(tb.page_line(page), write=page % 2 == 1)
        yield tb.granted
        assert [a.host_bias for a in tb.accs[-6:]] == [False] * 3 + [True] * 3
        assert len(d2h_since(tb, t0)) == 3
        t1 = tb.cycles
        tb.flip(0, 3)                   # pages 1 and 2 are skipped
        yield tb.flips_done
        assert [f["address"] for f in d2h_since(tb, t1)] == list(range(base, base + lpp))
        # Device-bias accesses of page 1, their dones held; then a flip to host bias.
        tb.hold = lambda acc: True
        for _ in range(4):
            tb.access(tb.page_line(1), write=True)
        yield tb.granted
        assert len(tb.held) == 4 and not any(a.host_bias for a in tb.accs[-4:])
        flip = tb.flip(1, 2, to_host=True)
        yield lambda: flip.t_start >= 0 and tb.cycles > flip.t_start + 40
        assert flip.t_end < 0, "the flip to host bias did not wait for the dones"
        log["release"] = tb.cycles
        tb.release()
        yield tb.flips_done
        for page in (1, 2, 3):
            tb.access(tb.page_line(page))
        yield tb.granted
        assert [a.host_bias for a in tb.accs[-3:]] == [True, True, False]
    tb.script = script()
    tb.run()
    tb.check_end()
    assert all(not f.error for f in tb.flips)
    assert tb.flips[-1].t_end > log["release"]


def test_flip_commands_rejected(seed):
    """A range beyond the table ends at once with error (FLIP_RANGE, nothing claimed);
    zero pages end at once without; a start while a flip runs or during the reset sweep
    is ignored (FLIP_BUSY) and the running flip finishes normally."""
    tb = TB(seed=seed, pages=6, page_bytes=256, cqids=8)
    tb.starts[2] = Flip(0, 1, False)            # during the reset sweep
    seen = {}

    def script() -> Script:
        yield lambda: tb.cycles > 10
        bad = [tb.flip(4, 3), tb.flip(6, 1), tb.flip(0, 0), tb.flip(7, 0)]
        yield tb.flips_done
        seen["bad"] = [(f.error, f.t_end - f.t_start) for f in bad]
        seen["first"] = dict(tb.first)
        good = tb.flip(2, 2)
        yield lambda: good.t_start >= 0
        tb.starts[tb.cycles + 3] = Flip(0, 6, False)
        yield tb.flips_done
        seen["good"] = good.error
    tb.script = script()
    tb.run()
    tb.expect.update({E.FLIP_RANGE: 2, E.FLIP_BUSY: 2})
    tb.check_end()
    assert seen["bad"] == [(True, 1), (True, 1), (False, 1), (False, 1)]
    assert seen["first"] == {"code": E.FLIP_BUSY, "opcode": 0, "id": 0, "address": 0}
    assert seen["good"] is False
    claims = d2h_since(tb, 0, D2HReqOpcode.RdOwnNoData)
    assert sorted(f["address"] - tb.hdm_base for f in claims) == list(range(8, 16))
    ignored = [f for f in tb.flips if f.t_end < 0 or f.error is None]
    assert not ignored


def test_flip_contended(seed):
    """A host check of a page while the flip claims its lines: the page stays in host
    bias (its accesses still go through the host), the flip goes on with the next page
    and ends with error, FLIP_CONTENDED naming the page."""
    tb = TB(seed=seed, timing=HostTiming(latency=40), pages=3, page_bytes=1024, cqids=8)
    tb.populate()

    def script() -> Script:
        tb.flip(0, 3)
        yield lambda: len(d2h_since(tb, 0, D2HReqOpcode.RdOwnNoData)) > tb.lpp + 2
        tb.check(tb.lpp + 5, "M")       # page 1, while its lines are being claimed
        yield tb.flips_done
        for page in range(3):
            tb.access(tb.page_line(page))
        yield tb.granted
    tb.script = script()
    tb.run()
    tb.expect[E.FLIP_CONTENDED] += 1
    tb.check_end()
    assert tb.flips[0].error
    assert [a.host_bias for a in tb.accs] == [False, True, False]
    assert tb.first == {"code": E.FLIP_CONTENDED, "opcode": 0, "id": 0, "address": 1}
    assert tb.status == 1 << E.FLIP_CONTENDED


# --- the host touching device memory ----------------------------------------------------------

def test_host_touch_device_page(seed):
    """A host check of a device-bias page waits until every access of the page granted
    before it is done, then flips the page back to host bias and answers ``flipped``;
    later accesses of the page go through the host. A check of a host-bias page with
    nothing to wait for is answered two cycles after its handshake, in order."""
    tb = TB(seed=seed, traffic=Traffic(grant_bp=0.2, d2h_bp=0.2, fwd_idle=0.2),
            pages=4, page_bytes=256, cqids=8)
    log = {}

    def script() -> Script:
        tb.flip(0, 2)
        yield tb.flips_done
        tb.hold = lambda acc: acc.line // tb.lpp == 0
        for i in range(6):
            tb.access(tb.page_line(i % 2), write=i % 3 == 0)
        yield tb.granted
        assert not any(a.host_bias for a in tb.accs) and len(tb.held) == 3
        chk = tb.check(2, "M")          # page 0
        yield lambda: tb.cycles > chk.t_chk + 50 >= 50
        assert chk.t_ans < 0, "answered with device accesses of the page undone"
        log["release"] = tb.cycles
        tb.release()
        yield lambda: chk.t_ans >= 0
        assert chk.flipped and chk.t_ans > log["release"]
        tb.access(tb.page_line(0))
        tb.access(tb.page_line(1))
        plain = [tb.check(tb.page_line(p)) for p in (2, 3, 1)]
        yield lambda: tb.granted() and plain[-1].t_ans >= 0
        assert [a.host_bias for a in tb.accs[-2:]] == [True, False]
        log["plain"] = [(c.flipped, c.t_ans - c.t_chk) for c in plain]
    tb.script = script()
    tb.run()
    tb.check_end()
    assert log["plain"][:2] == [(False, 2), (False, 2)]
    assert log["plain"][2][0] is True
    assert tb.checker.checks == {"plain": 2, "flipped": 2}


def test_host_check_waits_for_host_bias_grants(seed):
    """In host bias too, a check waits for the accesses to its line whose forward came
    before it (the host may take the line back while the device still writes it), but
    not for an access still waiting for its forward (that one is ordered after the
    check), nor for a host-bias access to another line of the page (a burst holding it
    would deadlock against the host's write-back of that other line)."""
    tb = TB(seed=seed, timing=HostTiming(latency=60), pages=2, page_bytes=256, cqids=4)
    log = {}

    def script() -> Script:
        tb.access(1, write=True)
        yield lambda: len(d2h_since(tb, 0)) == 1
        early = tb.check(2, "S")        # same page; the access waits for its forward
        yield lambda: early.t_ans >= 0
        log["early"] = early.t_ans - early.t_chk
        tb.hold = lambda acc: True
        yield tb.granted
        assert tb.accs[0].t_grant > early.t_ans and tb.accs[0].host_bias
        other = tb.check(0, "S")        # same page, another line: answered at once
        yield lambda: other.t_ans >= 0
        log["other"] = other.t_ans - other.t_chk
        late = tb.check(1, "S")
        yield lambda: late.t_chk >= 0 and tb.cycles > late.t_chk + 30
        log["late_waiting"] = late.t_ans < 0
        log["release"] = tb.cycles
        tb.release()
        yield lambda: late.t_ans >= 0
        log["late_after_release"] = late.t_ans > log["release"]
    tb.script = script()
    tb.run()
    tb.check_end()
    assert log == {"early": 2, "other": 2, "late_waiting": True, "late_after_release": True,
                   "release": log["release"]}


@pytest.mark.parametrize("bias", ["host", "device"])
def test_check_drain_vs_done_timing(bias, seed):
    """The done of the only access a check must wait for arrives in each cycle around the
    check's snapshot: the check is answered after it (or at once if it came before), never
    hangs and never answers early."""
    for offset in range(-2, 5):
        tb = TB(seed=seed + offset, timing=HostTiming(latency=4), pages=2, page_bytes=128,
                cqids=4)
        got = {}

        def script(offset=offset, tb=tb, got=got) -> Script:
            if bias == "device":
                tb.flip(0, 1)
                yield tb.flips_done
            tb.hold = lambda acc: True
            tb.access(1, write=True)
            yield tb.granted
            start = tb.cycles + 3
            yield lambda: tb.cycles == start
            # Device bias: any line of the page waits; host bias: the access's own line.
            chk = tb.check(0 if bias == "device" else 1)
            tb.release(at=start + 1 + offset)
            yield lambda: chk.t_ans >= 0
            done = next(t for t, _ in tb.done_log)
            got["ok"] = chk.t_ans > done and chk.flipped == (bias == "device")
        tb.script = script()
        tb.run(max_cycles=2000)
        tb.check_end()
        assert got == {"ok": True}, f"done offset {offset}"


def test_flip_to_host_waits_behind_a_check(seed):
    """A check flipped a device-bias page back and waits for its held accesses; a flip to
    host bias of that page (now in host bias) still waits for them before it is done."""
    tb = TB(seed=seed, pages=2, page_bytes=256, cqids=8)
    log = {}

    def script() -> Script:
        tb.flip(0, 1)
        yield tb.flips_done
        tb.hold = lambda acc: True
        for _ in range(3):
            tb.access(tb.page_line(0), write=True)
        yield tb.granted
        chk = tb.check(1)
        yield lambda: chk.t_chk >= 0 and tb.cycles > chk.t_chk + 5
        flip = tb.flip(0, 2, to_host=True)
        yield lambda: flip.t_start >= 0 and tb.cycles > flip.t_start + 30
        log["waiting"] = flip.t_end < 0 and chk.t_ans < 0
        log["release"] = tb.cycles
        tb.release()
        yield tb.flips_done
        log["after"] = flip.t_end > log["release"] and chk.flipped
    tb.script = script()
    tb.run()
    tb.check_end()
    assert log == {"waiting": True, "release": log["release"], "after": True}


# --- bad input ----------------------------------------------------------------------------

def test_bad_forwards_directed(seed):
    """Forwards naming no request in flight (a free entry, CQIDs outside the pool, Tags
    beyond 12 bits), of the wrong opcode (MemWrFwd, the answer to none of the DCOH's
    requests, or a MemRd) or address: each dropped, counted, the first one latched with its
    opcode, Tag and address; the requests are granted only by their good forwards;
    status clears with i_err_clear."""
    want = {}

    def faults(req: HostReq) -> set[str]:
        kind = ("wrong_opcode", "wrong_address", "not_fwd")[req.seq % 3]
        want[req.seq] = kind
        return {kind}
    tb = TB(seed=seed, faults=faults, pages=2, page_bytes=128, cqids=4, cqid_base=12)
    rd, wr = M2SReqOpcode.MemRdFwd.value, M2SReqOpcode.MemWrFwd.value
    for t, tag in ((8, 13), (9, 16), (10, 11), (11, 4095 + 0x1000), (12, 0x800C)):
        tb.host.raw(t, fwd_fields(rd if tag % 2 else wr, tag, tb.hdm_base + 1))
    tb.clears = {20: (1 << E.FWD_NOT_IN_FLIGHT)}
    log = {}

    def script() -> Script:
        yield lambda: tb.cycles > 22
        log["first"] = dict(tb.first)
        log["status"] = tb.status
        tb.access(0)
        tb.access(1, write=True)
        tb.flip(1, 1)
        yield lambda: tb.granted() and tb.flips_done()
    tb.script = script()
    tb.run()
    tb.expect[E.FWD_NOT_IN_FLIGHT] += 5
    tb.check_end()
    assert log["first"] == {"code": E.FWD_NOT_IN_FLIGHT, "opcode": rd, "id": 13,
                            "address": tb.hdm_base + 1}
    assert log["status"] == 0, "i_err_clear did not clear the status"
    assert len(want) == 4 and set(want.values()) == set(FWD_FAULTS)
    assert [a.host_bias for a in tb.accs] == [True, True]
    assert not tb.flips[0].error


def test_stray_forward_aliasing_a_waiting_entry(seed):
    """Forwards whose Tag has the low bits of an entry waiting for its forward, with the
    right opcode and address, but lies outside the pool (another pool's CQID, Tag bit 12
    or above set): dropped as not in flight; only the good forward grants."""
    tb = TB(seed=seed, timing=HostTiming(latency=40), pages=2, page_bytes=128, cqids=4,
            cqid_base=8)
    log = {}

    def script() -> Script:
        acc = tb.access(3, write=True)
        yield lambda: len(d2h_since(tb, 0)) == 1
        req = d2h_since(tb, 0)[0]
        for i, tag in enumerate((req["cqid"] ^ 4, req["cqid"] ^ 8, req["cqid"] | 0x1000,
                                 req["cqid"] | 0x8000)):
            tb.host.raw(tb.cycles + 2 + i, fwd_fields(M2SReqOpcode.MemRdFwd.value, tag,
                                                      req["address"]))
        yield tb.granted
        fwd = next(t for t, ch, f in tb.host.log if ch == "fwd" and f["tag"] == req["cqid"])
        log["after_good"] = acc.t_grant > fwd
    tb.script = script()
    tb.run()
    tb.expect[E.FWD_NOT_IN_FLIGHT] += 4
    tb.check_end()
    assert log == {"after_good": True}


def test_bad_dones(seed):
    """A done for a free handle, for an entry waiting for its forward, for a grant not yet
    delivered and a second done for one grant: each dropped and counted
    (DONE_UNEXPECTED), the first latched with the handle; the accesses complete
    normally."""
    tb = TB(seed=seed, timing=HostTiming(latency=40), pages=2, page_bytes=256, cqids=4)
    tb.raw_dones[12] = 3                        # free (during the reset sweep's tail)
    log = {}

    def script() -> Script:
        yield lambda: tb.cycles > 14
        log["first"] = dict(tb.first)
        tb.access(1)                            # host bias: waits 40 cycles for its forward
        yield lambda: len(d2h_since(tb, 0)) == 1
        tb.raw_dones[tb.cycles + 2] = 0         # the entry waits for its forward
        yield tb.granted
        tb.flip(0, 1)
        yield tb.flips_done
        tb.pause_grant = tb.cycles + 20
        tb.access(2)                            # device bias, grant held in the register
        yield lambda: len(tb.accs) == 2
        tb.raw_dones[tb.cycles + 5] = 0         # permitted, not yet delivered
        yield tb.granted
        acc = tb.accs[-1]
        yield lambda: any(h == acc.handle and t > acc.t_grant for t, h in tb.done_log)
        tb.raw_dones[tb.cycles + 1] = acc.handle     # second done
        yield lambda: tb.cycles > tb.pause_grant + 10
    tb.script = script()
    tb.run()
    tb.expect[E.DONE_UNEXPECTED] += 4
    tb.check_end()
    assert log["first"] == {"code": E.DONE_UNEXPECTED, "opcode": 0, "id": 3, "address": 0}
    assert [a.host_bias for a in tb.accs] == [True, False]


def test_out_of_range(seed):
    """An access beyond device memory is granted at once with error (no entry, no CXL
    message, no done expected); a check beyond it is answered with error; the first
    error names the access's tag and line."""
    tb = TB(seed=seed, pages=5, page_bytes=128, cqids=4)

    def script() -> Script:
        tb.access(10)                           # the first line beyond the five pages
        tb.access(7)
        tb.access(1 << 45, write=True)
        yield tb.granted
        tb.check(12)
        tb.check(9)
    tb.script = script()
    tb.run()
    tb.check_end()
    assert [a.error for a in tb.accs] == [True, False, True]
    assert [c.error for c in tb.chks] == [True, False]
    assert tb.first == {"code": E.ACC_RANGE, "opcode": 0, "id": tb.accs[0].tag, "address": 10}
    assert len(d2h_since(tb, 0)) == 1


# --- reset, latency, lint ---------------------------------------------------------------------

def test_reset_in_traffic(seed):
    """Reset with accesses, checks and a flip in flight and pages in device bias, the host
    reset with it: the DCOH sweeps every page back to host bias before it takes an
    access, and fresh traffic afterwards is exact and all through the host."""
    tb = TB(seed=seed, traffic=ROUGH, **CONFIGS["mid"])
    tb.populate()
    tb.flip(0, 8)
    tb.random_accesses(150)
    tb.hooks.append(random_hook(flip_rate=0.05, chk_rate=0.02, oor_share=0.0))
    tb.reset_at = 400

    def device_bias_first(tb: TB, t: int) -> None:
        # The pages reach device bias one by one while the flip runs: for about 1 seed in
        # 250 no access was granted in device bias by cycle 400. Until one is, the reset
        # waits and a random access (same seed) is added whenever none is queued.
        if t == tb.reset_at - 1 and all(a.host_bias is not False for a in tb.accs):
            tb.reset_at += 1
            if not tb.acc_q:
                tb.random_accesses(1)
    tb.hooks.append(device_bias_first)
    fresh = {}

    def after(tb: TB) -> None:
        tb.hooks.clear()
        fresh["from"] = len(tb.accs)
        fresh["t"] = tb.cycles
        tb.random_accesses(60)
    tb.after_reset = after
    tb.run()
    tb.check_end(contended_ok=True)
    new = tb.accs[fresh["from"]:]
    assert len(new) == 60 and all(a.host_bias for a in new)
    assert min(a.t_issue for a in new) >= fresh["t"] + tb.dut.pages
    assert any(not a.host_bias for a in tb.accs[:fresh["from"]]), "nothing was device-biased"


def test_idle_latency(seed):
    """The latencies the docstring states, on an idle DCOH with ready outputs."""
    tb = TB(seed=seed, timing=HostTiming(latency=10), pages=4, page_bytes=128, cqids=4)
    got = {}

    def script() -> Script:
        yield lambda: tb.cycles > 6
        acc = tb.access(1)
        yield tb.granted
        req = next(ts for ts, ch, _ in tb.host.log if ch == "d2h_req")
        fwd = next(ts for ts, ch, _ in tb.host.log if ch == "fwd")
        got["host"] = (req - acc.t_issue, acc.t_grant - fwd)
        tb.flip(0, 1)
        yield tb.flips_done
        acc = tb.access(0)
        yield tb.granted
        got["device"] = acc.t_grant - acc.t_issue
        f = tb.flip(1, 1)
        yield tb.flips_done
        claims = [ts for ts, ch, fl in tb.host.log if ch == "fwd" and ts > f.t_start]
        got["flip"] = f.t_end - max(claims)
        chks = [tb.check(4), tb.check(0)]
        yield lambda: chks[-1].t_ans >= 0
        got["check"] = [c.t_ans - c.t_chk for c in chks]
    tb.script = script()
    tb.run()
    tb.check_end()
    assert got == {"host": (2, 3), "device": 3, "flip": 5, "check": [2, 3]}


@pytest.mark.parametrize("config", ["default", "smallest", "odd", "largest"])
def test_verilog_lints_clean(config, tmp_path):
    kwargs = {"default": {}, "largest": LARGEST, **CONFIGS}[config]
    assert_lints_clean(Dcoh(**kwargs), f"dcoh_{config}", tmp_path)


# --- the host's other answers: GO-E, GO-Err, unexpected H2D messages -----------------------

def random_answers(rng: random.Random, *, go_e: float = 0.5, fail: float = 0.0
                   ) -> Callable[[HostReq], str]:
    """An ``answer`` callable: a claim is answered GO-E with probability ``go_e``; any
    request fails (GO-Err, or GO-Err Data for a read) with probability ``fail``."""
    def choose(req: HostReq) -> str:
        if rng.random() < fail:
            if req.opcode in (D2HReqOpcode.RdCurr.value, D2HReqOpcode.RdShared.value):
                return rng.choice(("go_err", "data_err"))
            return "go_err"
        if req.opcode == D2HReqOpcode.RdOwnNoData.value and rng.random() < go_e:
            return "go_e"
        return "fwd"
    return choose


@pytest.mark.parametrize("fail", [0.0, 0.1])
def test_random_answers(seed, fail):
    """Random accesses and flips to device bias and back while the host answers claims
    with MemRdFwd or GO-E at random and, with ``fail``, answers some requests GO-Err:
    every access is granted (denied exactly for the failed ones), every flip ends, the
    bias rules hold, HOST_ERROR pulses once per failed request, nothing else."""
    rng = random.Random(seed + 7)
    tb = TB(seed=seed, answer=random_answers(rng, fail=fail), pages=6, page_bytes=256,
            cqids=16)
    tb.populate()
    for _ in range(4):
        tb.random_accesses(40)
        first = rng.randrange(tb.dut.pages - 1)
        tb.flip(first, 2)
        tb.random_accesses(40)
        tb.flip(first, 2, to_host=True)
    tb.run(max_cycles=60_000)
    tb.check_end()
    answers = Counter(r.answer for r in tb.host.reqs)
    assert answers["go_e"] and answers["fwd"], answers
    assert bool(tb.errors[E.HOST_ERROR]) == bool(fail), dict(tb.errors)
    if fail:
        denied = sum(bool(a.denied) for a in tb.accs)
        assert denied == sum(r.answer in FAILING and r.opcode != D2HReqOpcode.RdOwnNoData.value
                             for r in tb.host.reqs) > 0
    claims_failed = any(r.answer in FAILING and r.opcode == D2HReqOpcode.RdOwnNoData.value
                        for r in tb.host.reqs)
    assert any(f.error for f in tb.flips) == claims_failed


def test_go_e_completes_claims(seed):
    """A flip to device bias whose claims are all answered GO-E (no MemRdFwd): the page
    turns to device bias, and the next access to it is granted in device bias."""
    tb = TB(seed=seed, answer=lambda req: "go_e" if req.opcode ==
            D2HReqOpcode.RdOwnNoData.value else "fwd", pages=2, page_bytes=256, cqids=8)
    log = {}

    def script() -> Script:
        tb.flip(1, 1)
        yield tb.flips_done
        log["error"] = tb.flips[0].error
        tb.access(tb.page_line(1), write=True)
        yield tb.granted
    tb.script = script()
    tb.run()
    tb.check_end()
    claims = [f for t, ch, f in tb.host.log if ch == "h2d_rsp"]
    assert len(claims) == tb.lpp and not any(ch == "fwd" for _, ch, _ in tb.host.log)
    assert log == {"error": False}
    assert tb.accs[-1].host_bias is False


def test_go_err_denies_accesses_and_claims(seed):
    """GO-Err on a read, on a write, GO-Err Data on a read, GO-Err on one claim of a
    flip: each access is granted with error and denied (no done), the flip ends with
    error and its page stays in host bias, HOST_ERROR pulses four times with the first
    error's H2D opcode and CQID latched; later requests are served normally."""
    plan = iter(["go_err", "go_err", "data_err"])
    claim_failed = []

    def answer(req: HostReq) -> str:
        if req.opcode == D2HReqOpcode.RdOwnNoData.value:
            if not claim_failed:
                claim_failed.append(req.cqid)
                return "go_err"
            return "fwd"
        return next(plan, "fwd")
    tb = TB(seed=seed, answer=answer, pages=2, page_bytes=256, cqids=8)
    log = {}

    def script() -> Script:
        tb.access(0)
        yield tb.granted
        log["first"] = dict(tb.first)
        tb.access(1, write=True)
        tb.access(2)
        yield tb.granted
        tb.flip(1, 1)
        yield tb.flips_done
        tb.access(tb.page_line(1))
        tb.access(3, write=True)
        yield tb.granted
    tb.script = script()
    tb.run()
    tb.check_end()
    assert [a.denied for a in tb.accs] == [True, True, True, False, False]
    assert all(a.host_bias for a in tb.accs), "the failed flip left its page in host bias"
    assert tb.flips[0].error
    assert tb.errors == Counter({E.HOST_ERROR: 4})
    first_cqid = tb.host.reqs[0].cqid
    assert log["first"] == {"code": E.HOST_ERROR, "opcode": H2DRspOpcode.GO.value,
                            "id": first_cqid, "address": 0}


def test_unexpected_h2d_messages(seed):
    """H2D messages for DCOH CQIDs that may not come: GO-E for a waiting access, GO-Err
    for a free entry, H2D Data without GO-Err for a waiting read, GO-Err Data for a
    waiting write, a GO_WritePull and a GO with state I for a waiting claim, a GO-Err
    naming a CQID outside the pool with a waiting entry's low bits. Each is dropped and
    flagged RSP_UNEXPECTED; every request is then granted by its own forward."""
    tb = TB(seed=seed, timing=HostTiming(latency=60), pages=2, page_bytes=128, cqids=8,
            cqid_base=8)
    log = {}

    def script() -> Script:
        tb.access(0)
        tb.access(1, write=True)
        tb.flip(1, 1)
        yield lambda: len(d2h_since(tb, 0)) == 4
        reqs = {f["opcode"]: f["cqid"] for f in d2h_since(tb, 0)}
        rd, wr = reqs[D2HReqOpcode.RdCurr.value], reqs[D2HReqOpcode.RdOwn.value]
        claim = reqs[D2HReqOpcode.RdOwnNoData.value]
        free = next(c for c in range(8, 16) if c not in {f["cqid"] for f in d2h_since(tb, 0)})

        def rsp(cqid, opcode=H2DRspOpcode.GO, state=GoState.Error):
            return {"opcode": opcode.value, "rsp_data": state.value, "rsp_pre": 0,
                    "cqid": cqid, "rsvd": 0}
        data = {"cqid": rd, "chunk_valid": 0, "poison": 0, "go_err": 0, "rsvd": 0, "data": 5}
        msgs = [("rsp", rsp(rd, state=GoState.E)), ("rsp", rsp(free)), ("data", data),
                h2d_answer("data_err", wr), ("rsp", rsp(claim, H2DRspOpcode.GO_WritePull)),
                ("rsp", rsp(claim, state=GoState.I)), ("rsp", rsp(rd ^ 8))]
        for i, (channel, fields) in enumerate(msgs):
            tb.host.raw_h2d(tb.cycles + 1 + i, channel, fields)
        log["n"] = len(msgs)
        yield lambda: tb.granted() and tb.flips_done()
    tb.script = script()
    tb.run()
    tb.expect[E.RSP_UNEXPECTED] += log["n"]
    tb.check_end()
    assert [a.denied for a in tb.accs] == [False, False]
    assert not tb.flips[0].error
