"""cocotb tests of the bench infrastructure itself, on ``tb/designs/axi_loop.py``.

Random AXI traffic goes from :class:`~tb.stream.StreamSource` s through the
:class:`AxiLoop` register slices into the :class:`~tb.pmem.PmemAxi` model and back to
:class:`~tb.stream.StreamSink` s; a scoreboard checks every R beat and B, protocol
checkers watch every channel, and the final PMEM image is compared with the shadow.
Power failure and manager reset are injected mid-traffic.

Run through ``tests/test_infra_cocotb.py`` (or ``sim.runner.run``). Each test writes
``speed-<test>.json`` (cycles, wall seconds) into its run directory.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from dataclasses import dataclass, field

import cocotb

from hw.bus.axi import AxiResp
from hw.cxl.messages import Codec
from tb.designs.axi_loop import AxiLoop

from . import env
from .cycle import CycleLoop, start_clock_and_reset
from .pmem import LINE_BYTES, PmemAxi, PmemModel, PmemTiming, PowerFailReport, strb_mask
from .stream import StreamChecker, StreamSink, StreamSource

PAGE = 4096
LINES_PER_PAGE = PAGE // LINE_BYTES
FULL_STRB = (1 << LINE_BYTES) - 1


def _rng(name: str) -> random.Random:
    seed = f"{cocotb.RANDOM_SEED}-{name}"
    cocotb.log.info("rng seed %r (replay with COCOTB_RANDOM_SEED=%d)", seed, cocotb.RANDOM_SEED)
    return random.Random(seed)


@dataclass
class Op:
    kind: str            # "r" or "w"
    seq: int             # write: index in AW order since the last crash
    id: int
    addr: int
    lines: list[int]     # line indices
    decerr: bool
    data: list[int] = field(default_factory=list)
    strb: list[int] = field(default_factory=list)
    expect: list[int] = field(default_factory=list)
    next: int = 0


class InfraTB:
    """AxiLoop + PMEM model + random traffic + scoreboard."""

    def __init__(self, dut, rng: random.Random, *, stress: bool, ops: int):
        self.dut = dut
        self.rng = rng
        self.cfg = env.config()
        design = AxiLoop(config=self.cfg)
        idle = 0.3 if stress else 0.0
        bp = 0.3 if stress else 0.0
        self.loop = loop = CycleLoop(dut.clk)
        loop.add(self)  # first, so what drive() queues is presented in the same cycle
        self.aw = StreamSource(dut, "i_aw", design.addr_layout, loop, rng=rng, idle=idle)
        self.w = StreamSource(dut, "i_w", design.w_layout, loop, rng=rng, idle=idle)
        self.ar = StreamSource(dut, "i_ar", design.addr_layout, loop, rng=rng, idle=idle)
        self.in_reset = False     # the checkers' reset: a flag, not a signal read
        in_reset = lambda: self.in_reset
        self.b = StreamSink(dut, "o_b", design.b_layout, loop, rng=rng, backpressure=bp,
                            callback=self.on_b, reset=in_reset)
        self.r = StreamSink(dut, "o_r", design.r_layout, loop, rng=rng, backpressure=bp,
                            callback=self.on_r, reset=in_reset)
        # Our own sources are correct by construction; one checker proves it cheaply.
        self.checkers = [self.b.checker, self.r.checker,
                         StreamChecker(dut, "i_w", loop, reset=in_reset)]
        timing = PmemTiming(read_latency=rng.randint(2, 60), write_latency=rng.randint(1, 30),
                            channels=rng.choice([1, 2]), jitter=10 if stress else 0)
        # The top 4 KiB page of the port's address space is beyond the model: DECERR.
        self.model = PmemModel(size=self.cfg.pmem_size - PAGE, timing=timing, rng=rng)
        self.pmem = PmemAxi(dut, "pmem", loop, self.model, rng=rng,
                            ar_backpressure=bp, aw_backpressure=bp, w_backpressure=bp,
                            r_idle=idle / 2, b_idle=idle / 2, r_gap=idle / 4)
        cocotb.log.info("stress=%s %s", stress, timing)
        self.ids = 1 << self.cfg.axi_id_width
        self.max_outstanding = 24
        self.total = ops
        self.active = True
        self.issued = self.done = 0
        self.shadow: dict[int, int] = {}           # line -> value, all issued writes
        self.old: dict[int, int] = {}              # line -> durable value under a pending write
        self.busy: set[int] = set()
        self.rq: dict[int, deque[Op]] = {}
        self.wq: dict[int, deque[Op]] = {}
        self.write_seq = 0
        self.aw_base = 0                           # model.stats.writes at the last crash

    # --- traffic ------------------------------------------------------------------
    def drive(self) -> None:
        if (not self.active or self.issued >= self.total
                or self.issued - self.done >= self.max_outstanding
                or self.aw.pending > 3 or self.ar.pending > 3):
            return
        rng = self.rng
        beats = rng.choice((1, 1, 1, 2, 3, 4, 8))
        decerr = rng.random() < 0.03
        pages = self.cfg.pmem_size // PAGE
        page = pages - 1 if decerr else rng.randrange(min(pages - 1, 4))
        start = page * LINES_PER_PAGE + rng.randrange(LINES_PER_PAGE - beats + 1)
        lines = list(range(start, start + beats))
        if self.busy.intersection(lines):
            return
        rid = rng.randrange(min(self.ids, 8))
        addr = start * LINE_BYTES
        self.issued += 1
        self.busy.update(lines)
        fields = {"id": rid, "addr": addr, "len": beats - 1}
        if rng.random() < 0.5:
            op = Op("r", 0, rid, addr, lines, decerr,
                    expect=[0 if decerr else self.shadow.get(n, 0) for n in lines])
            self.rq.setdefault(rid, deque()).append(op)
            self.ar.send(fields)
        else:
            op = Op("w", self.write_seq, rid, addr, lines, decerr)
            self.write_seq += 1
            for k, n in enumerate(lines):
                data = rng.getrandbits(512)
                strb = FULL_STRB if rng.random() < 0.7 else rng.getrandbits(64)
                op.data.append(data)
                op.strb.append(strb)
                self.w.send({"data": data, "strb": strb, "last": int(k == beats - 1)})
                if not decerr:
                    self.old[n] = self.shadow.get(n, 0)
                    mask = strb_mask(strb)
                    self.shadow[n] = (self.shadow.get(n, 0) & ~mask) | (data & mask)
            self.wq.setdefault(rid, deque()).append(op)
            self.aw.send(fields)

    def _retire(self, op: Op) -> None:
        self.busy.difference_update(op.lines)
        for n in op.lines:
            self.old.pop(n, None)
        self.done += 1

    def on_r(self, f: dict, cycle: int) -> None:
        q = self.rq.get(f["id"])
        assert q, f"cycle {cycle}: R beat for id {f['id']} with no read outstanding"
        op = q[0]
        k = op.next
        where = f"cycle {cycle}: read id {op.id} addr {op.addr:#x} beat {k}/{len(op.lines)}"
        want_resp = AxiResp.DECERR if op.decerr else AxiResp.OKAY
        assert f["resp"] == want_resp, f"{where}: rresp {f['resp']} != {want_resp}"
        assert f["data"] == op.expect[k], (
            f"{where}: data {f['data']:#x} != expected {op.expect[k]:#x}")
        assert f["last"] == (k == len(op.lines) - 1), f"{where}: rlast {f['last']}"
        op.next += 1
        if f["last"]:
            q.popleft()
            self._retire(op)

    def on_b(self, f: dict, cycle: int) -> None:
        q = self.wq.get(f["id"])
        assert q, f"cycle {cycle}: B for id {f['id']} with no write outstanding"
        op = q.popleft()
        want = AxiResp.DECERR if op.decerr else AxiResp.OKAY
        assert f["resp"] == want, (
            f"cycle {cycle}: write id {op.id} addr {op.addr:#x}: bresp {f['resp']} != {want}")
        self._retire(op)

    # --- phases -------------------------------------------------------------------
    async def start(self) -> None:
        # Agents run from the end of reset: a stream port may look ready during reset.
        await start_clock_and_reset(self.dut)
        self.loop.start()

    async def finish(self, timeout: int = 200_000) -> None:
        await self.loop.wait_until(lambda: self.done >= self.total, timeout=timeout,
                                   what=f"{self.total} operations done")
        self.check_image()
        self.check_protocol()

    def check_protocol(self) -> None:
        for c in self.checkers:
            c.check()
        self.pmem.check()

    def check_image(self) -> None:
        want = {n * LINE_BYTES: v.to_bytes(LINE_BYTES, "little")
                for n, v in sorted(self.shadow.items()) if v}
        got = self.model.snapshot()
        bad = sorted(set(want) ^ set(got) | {a for a in want if got.get(a) != want[a]})
        assert not bad, (f"PMEM image differs from the shadow at {len(bad)} lines, first "
                         f"{[hex(a) for a in bad[:4]]}")

    async def crash(self, *, power: bool) -> PowerFailReport:
        """Power failure (or manager reset) now; the DUT is reset; traffic resumes.

        Checks the image against the report: acknowledged writes survive, every
        pending write is dropped, applied or torn exactly as reported.
        """
        self.active = False
        self.b.paused = self.r.paused = True
        self.dut.rst.value = 1
        self.in_reset = True
        for s in (self.aw, self.w, self.ar):
            s.clear()
        # Fail once the DUT is in reset, so it presents nothing new to the port; what
        # the port accepted or acknowledged in this last cycle is in the report.
        await self.loop.wait_cycles(1)
        report = self.pmem.power_fail(self.rng) if power else self.pmem.reset()
        await self.loop.wait_cycles(3)
        self.dut.rst.value = 0
        self.in_reset = False
        if power:
            self.pmem.power_on()
        self._reconcile(report)
        self.check_image()
        self.rq.clear()
        self.wq.clear()
        self.busy.clear()
        self.old.clear()
        self.done = self.issued   # what was in flight is accounted for by the report
        self.write_seq = 0
        self.aw_base = self.model.stats.writes
        self.b.paused = self.r.paused = False
        self.active = True
        return report

    def _reconcile(self, report: PowerFailReport) -> None:
        """Set the shadow to what the report says became durable."""
        fates = {f.addr: f for f in report.writes}
        accepted = self.model.stats.writes - self.aw_base
        pending = [op for q in self.wq.values() for op in q]
        for op in pending:
            if op.decerr:
                continue
            fate = fates.pop(op.addr, None)
            if op.seq >= accepted:
                assert fate is None, f"write {op.addr:#x} in the report but never accepted"
                beats_applied, words = 0, None
            elif fate is None:
                beats_applied, words = len(op.lines), None   # its B was issued: durable
            elif fate.outcome == "applied":
                beats_applied, words = fate.beats_received, None
            elif fate.outcome == "dropped":
                beats_applied, words = 0, None
            else:
                assert fate.outcome == "torn", fate
                beats_applied, words = fate.beats_received, set(fate.words)
            for k, n in enumerate(op.lines):
                value = self.old[n]
                if k < beats_applied:
                    strb = op.strb[k]
                    if words is not None:
                        strb &= sum(0xFF << (8 * j) for j in range(8)
                                    if n * LINE_BYTES + 8 * j in words)
                    mask = strb_mask(strb)
                    value = (value & ~mask) | (op.data[k] & mask)
                self.shadow[n] = value
        # Left over: DECERR writes only (skipped above, reported as dropped).
        unknown = [a for a in fates if a < self.model.size]
        assert not unknown, f"report names writes the bench did not issue: {unknown}"


@cocotb.test()
async def test_loop_and_waiters(dut):
    """CycleLoop timing: wait_cycles, wait_until, timeouts, same-cycle sends."""
    rng = _rng("loop")
    tb = InfraTB(dut, rng, stress=False, ops=0)
    await tb.start()
    loop = tb.loop
    c0 = loop.cycle
    await loop.wait_cycles(7)
    assert loop.cycle == c0 + 7
    await loop.wait_cycles(0)
    assert loop.cycle == c0 + 7
    # A send right after a wake is presented in the same cycle (i_ar is ready when empty).
    seen = []
    tb.ar.on_transfer = lambda payload, cycle: seen.append(cycle)
    tb.ar.send({"id": 0, "addr": 0, "len": 0})
    tb.rq.setdefault(0, deque()).append(Op("r", 0, 0, 0, [0], False, expect=[0]))
    tb.issued += 1
    woke = loop.cycle
    await tb.ar.drained(10)
    assert seen == [woke], (seen, woke)
    await loop.wait_until(lambda: tb.done == 1, timeout=500, what="read answered")
    try:
        await loop.wait_until(lambda: False, timeout=25, what="never")
    except TimeoutError as exc:
        assert str(exc) == "never not reached within 25 cycles", exc
    else:
        raise AssertionError("wait_until did not time out")
    start = loop.cycle
    await loop.wait_until(lambda: loop.cycle >= start + 3, timeout=10, what="3 cycles")
    assert loop.cycle == start + 4  # holds in cycle start+3, resumes after the next edge
    tb.check_protocol()
    loop.stop()


@cocotb.test()
@cocotb.parametrize(stress=[False, True])
async def test_traffic(dut, stress: bool):
    """Random AXI traffic through the PMEM model, data and ordering checked."""
    rng = _rng(f"traffic-{stress}")
    ops = env.params().get("ops", 1500)
    tb = InfraTB(dut, rng, stress=stress, ops=ops)
    await tb.start()
    # Process CPU time covers the simulator and Python (one process) and, unlike wall
    # time, does not count other jobs sharing the cores.
    t0, cpu0, c0 = time.perf_counter(), time.process_time(), tb.loop.cycle
    await tb.finish()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    cycles = tb.loop.cycle - c0
    stats = tb.model.stats.summary()
    cocotb.log.info("%d cycles in %.2f s (%.2f s CPU): %.0f cycles/s (%.0f per CPU second); %s",
                    cycles, wall, cpu, cycles / wall, cycles / cpu, stats)
    with open(f"speed-traffic-{stress}.json", "w") as f:
        json.dump({"cycles": cycles, "seconds": wall, "cpu_seconds": cpu, "stress": stress,
                   "stats": stats}, f)
    assert stats["reads"] > 0 and stats["writes"] > 0 and stats["decerr"] > 0
    assert stats["buffer_hits"] > 0
    tb.loop.stop()


@cocotb.test()
@cocotb.parametrize(stress=[False, True], power=[True, False])
async def test_crash_mid_traffic(dut, stress: bool, power: bool):
    """Power failure (or manager reset) at a random cycle, then more traffic."""
    rng = _rng(f"crash-{stress}-{power}")
    ops = env.params().get("ops", 1500)
    tb = InfraTB(dut, rng, stress=stress, ops=1 << 30)  # traffic until the last crash
    await tb.start()
    for _ in range(2):
        await tb.loop.wait_cycles(rng.randint(300, 1500))
        report = await tb.crash(power=power)
        cocotb.log.info("crash at cycle %s: %d writes (%d dropped, %d applied, %d torn), "
                        "%d reads lost", report.cycle, len(report.writes),
                        report.count("dropped"), report.count("applied"), report.count("torn"),
                        report.reads_lost)
        assert report.writes, "the crash should hit pending writes"
    tb.total = tb.issued + ops // 2
    await tb.finish()
    tb.loop.stop()


@cocotb.test()
async def test_checker_catches_violations(dut):
    """A stream checker reports a payload change and a valid drop before the transfer."""
    rng = _rng("checker")
    cfg = env.config()
    design = AxiLoop(config=cfg)
    loop = CycleLoop(dut.clk)
    model = PmemModel(size=cfg.pmem_size)
    pmem = PmemAxi(dut, "pmem", loop, model, rng=rng)
    checker = StreamChecker(dut, "i_ar", loop)
    codec = Codec(design.addr_layout)
    await start_clock_and_reset(dut)
    loop.start()
    pmem.power_fail()             # the port goes quiet: AR is never ready
    await loop.wait_cycles(1)
    dut.i_ar__valid.value = 1
    dut.i_ar__payload.value = codec.pack(id=1, addr=0x40, len=0)
    await loop.wait_cycles(4)     # one AR sits in the slice, the next one waits
    dut.i_ar__payload.value = codec.pack(id=2, addr=0x40, len=0)
    await loop.wait_cycles(2)
    dut.i_ar__valid.value = 0
    await loop.wait_cycles(2)
    assert checker.transfers == 1, checker.transfers
    try:
        checker.check()
    except AssertionError as exc:
        text = str(exc)
    else:
        raise AssertionError("checker missed the violations")
    assert "i_ar__payload changed from 0x" in text and "i_ar__valid fell" in text, text
    assert checker.violation_count == 2, text
    pmem.check()
    loop.stop()
