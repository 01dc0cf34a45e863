# amaranth: UnusedElaboratable=no
"""AxiToCache (hw/bus/axi_to_cache.py) in the Amaranth simulator.

A manager drives random single-beat reads and writes on ``sub`` with random idle
cycles and random ``rready`` / ``bready``; ``pmem`` is served by
:class:`tb.pmem.PmemModel` (random backpressure and idle R/B cycles) and the CXL.cache
side by an in-order responder with random latency, ``ready`` and idle cycles that
flags some lines as errors. Phases alternate ``host`` (reads to host memory) and PMEM
while no read is outstanding. Every R beat is checked in request order against the
memory it should come from; every write must reach PMEM in both modes; passive
checkers hold ``o_rd`` and R (and AR/AW/W of ``pmem``) to the stream rules. Random
tests print their seed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.bus.axi import AxiBurst, AxiResp
from hw.bus.axi_to_cache import AxiToCache
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import ROUGH, SMOOTH, AxiPmemPort, Traffic
from .conftest import assert_lints_clean
from .stream_rule import StreamRule

ADDR_WIDTH = 21
PMEM_SIZE = 1 << 20
LINE = 64
READ_SPAN = PMEM_SIZE // 2          # reads below, writes above: read data never changes
TIMING = PmemTiming(read_latency=12, write_latency=8, jitter=6)


def host_line(line: int) -> int:
    """Host memory's content: a fixed function of the line address."""
    return random.Random(line).getrandbits(512)


def _run(seed: int, traffic: Traffic, phases: list[bool], *, idle: float, host_bp: float,
         n_reads: int = 40, n_writes: int = 12) -> dict:
    rng = random.Random(seed)
    dut = AxiToCache(addr_width=ADDR_WIDTH, id_width=2)
    model = PmemModel(size=PMEM_SIZE, timing=TIMING, rng=random.Random(seed))
    model.write(0, random.Random(seed ^ 0x5A).randbytes(PMEM_SIZE))
    port = AxiPmemPort(dut.pmem, model, rng, traffic)
    sub, o_rd, i_rd = dut.sub, dut.o_rd, dut.i_rd
    rules = {"o_rd": StreamRule("o_rd"), "R": StreamRule("R")}
    stats = {"host_reads": 0, "pmem_reads": 0, "errors": 0, "writes": 0}

    async def bench(ctx):
        for ch in ("ar", "aw"):     # single 64-byte INCR beats
            ctx.set(getattr(sub, f"{ch}size"), 6)
            ctx.set(getattr(sub, f"{ch}burst"), AxiBurst.INCR)
        ctx.set(sub.wstrb, (1 << 64) - 1)
        ctx.set(sub.wlast, 1)
        last_host = max((k for k, host in enumerate(phases) if host), default=None)
        host_errors = 0                 # host reads answered with an error so far
        for k, host in enumerate(phases):
            base = rng.getrandbits(46)
            ctx.set(dut.host, host)
            ctx.set(dut.base_line, base)
            reads = deque(rng.randrange(0, READ_SPAN, LINE) for _ in range(n_reads))
            writes = deque((rng.randrange(READ_SPAN, PMEM_SIZE, LINE), rng.getrandbits(512))
                           for _ in range(n_writes))
            expect: deque[tuple[int, int]] = deque()     # (data, resp) per read, in order
            written: dict[int, int] = {}      # the last write of each line (one ID: in order)
            host_q: deque[list] = deque()                # [ready cycle, data, error]
            rsp = None
            ar = aw = w = None
            b_due = 0
            while reads or ar is not None or expect or writes or aw or w or b_due:
                assert port.cycle < 50_000, "hang"
                if ar is None and reads and not rng.random() < idle:
                    ar = reads.popleft()
                    ctx.set(sub.araddr, ar)
                ctx.set(sub.arvalid, ar is not None)
                if aw is None and w is None and writes and not rng.random() < idle:
                    aw = w = writes.popleft()
                    ctx.set(sub.awaddr, aw[0])
                    ctx.set(sub.wdata, w[1])
                ctx.set(sub.awvalid, aw is not None)
                ctx.set(sub.wvalid, w is not None)
                ctx.set(sub.rready, not rng.random() < idle)
                ctx.set(sub.bready, not rng.random() < idle)
                ctx.set(o_rd.ready, not rng.random() < host_bp)
                if rsp is None and host_q and host_q[0][0] <= port.cycle \
                        and not rng.random() < host_bp:
                    rsp = host_q.popleft()
                    ctx.set(i_rd.p.data, rsp[1])
                    ctx.set(i_rd.p.error, rsp[2])
                ctx.set(i_rd.valid, rsp is not None)
                (ar_ok, aw_ok, w_ok, rvalid, rready, rdata, rresp, rlast, rid, bvalid, bready,
                 rd_valid, rd_ready, rd_addr, rsp_ready, p_arvalid) = await port.tick(
                    ctx, sub.arready, sub.awready, sub.wready, sub.rvalid, sub.rready,
                    sub.rdata, sub.rresp, sub.rlast, sub.rid, sub.bvalid, sub.bready,
                    o_rd.valid, o_rd.ready, o_rd.p.address, i_rd.ready, dut.pmem.arvalid)
                cycle = port.cycle
                rules["o_rd"].observe(cycle, rd_valid, rd_ready, rd_addr)
                rules["R"].observe(cycle, rvalid, rready, (rdata, rresp, rlast, rid))
                if host:
                    assert not p_arvalid, "a host read reached PMEM"
                else:
                    assert not rd_valid, "a PMEM read reached CXL.cache"
                assert (rd_valid and rd_ready) == (host and ar is not None and ar_ok), \
                    f"AR and the read request did not pass together (cycle {cycle})"
                if ar is not None and ar_ok:
                    if host:
                        line = (base + ar // LINE) % (1 << 46)
                        assert rd_addr == line, f"host line {rd_addr:#x}, not {line:#x}"
                        # A run must see host errors: with none in the other reads (about
                        # 1 seed in 300,000), the last host read gets one.
                        error = rng.random() < 0.1 or (k == last_host and not reads
                                                        and not host_errors)
                        host_errors += error
                        host_q.append([cycle + rng.randint(1, 8), host_line(line), error])
                        expect.append((host_line(line), AxiResp.SLVERR if error else 0))
                    else:
                        expect.append((model.read_line(ar), AxiResp.OKAY))
                    ar = None
                if rsp is not None and rsp_ready:
                    rsp = None
                if rvalid and rready:
                    data, resp = expect.popleft()
                    assert rlast and rid == 0
                    assert (rdata, rresp) == (data, resp), f"read data/resp at cycle {cycle}"
                    stats["host_reads" if host else "pmem_reads"] += 1
                    stats["errors"] += resp != 0
                if aw is not None and aw_ok:
                    written[aw[0]] = aw[1]
                    aw = None
                    b_due += 1
                if w is not None and w_ok:
                    w = None
                if bvalid and bready:
                    b_due -= 1
                    stats["writes"] += 1
            for addr, data in written.items():
                assert model.read_line(addr) == data, f"write to {addr:#x} lost"
        assert model.outstanding == (0, 0)
        stats["cycles"] = port.cycle

    simulate(dut, bench)
    errors = port.errors + [e for r in rules.values() for e in r.errors]
    assert not errors, "\n".join(errors[:10])
    return stats


CASES = [(SMOOTH, 0.0, 0.0), (ROUGH, 0.3, 0.3)]


@pytest.mark.parametrize("traffic, idle, host_bp", CASES, ids=["smooth", "rough"])
@pytest.mark.parametrize("run", range(3))
def test_reads_steered_writes_pass(run, seed, traffic, idle, host_bp):
    """Alternating host and PMEM phases: every read answered in order from the right
    memory (host errors as SLVERR), every write in PMEM, stream rules kept."""
    stats = _run(seed, traffic, [True, False, True, True, False], idle=idle, host_bp=host_bp)
    assert stats["host_reads"] == 3 * 40 and stats["pmem_reads"] == 2 * 40
    assert stats["writes"] == 5 * 12 and stats["errors"] > 0


def test_full_rate_to_host():
    """No backpressure: one host read per cycle passes (combinational in both ways)."""
    stats = _run(1, SMOOTH, [True], idle=0.0, host_bp=0.0, n_reads=200, n_writes=0)
    assert stats["host_reads"] == 200 and stats["cycles"] <= 200 + 8 + 2, stats


def test_rejects_narrow_address():
    with pytest.raises(ValueError, match="addr_width must be above 6, not 6"):
        AxiToCache(addr_width=6, id_width=1)


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(AxiToCache(addr_width=48, id_width=3), "axi_to_cache_a48", tmp_path)
