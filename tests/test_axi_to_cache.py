# amaranth: UnusedElaboratable=no
"""AxiToCache (hw/bus/axi_to_cache.py) in the Amaranth simulator.

A manager drives random reads and single-beat writes on ``sub`` with random idle
cycles and random ``rready`` / ``bready``; ``pmem`` is served by
:class:`tb.pmem.PmemModel` (random backpressure and idle R/B cycles) and the CXL.cache
side by an in-order responder with random latency, ``ready`` and idle cycles that
echoes the tag and flags some lines as errors. Phases alternate ``host`` (reads to host
memory) and PMEM while no read is outstanding. Host reads are INCR bursts of 1 to 8
64-byte beats (within 4 KiB) with random ``arid``; PMEM reads are single beats
(:class:`tests.axi_pmem.AxiPmemPort` serves no longer ones) with random ``arid``.
Some host phases put ``base_line`` just below the top of the 46-bit line space, so
bursts wrap. Checked against a model of the docstring, every cycle of a host phase:
``o_rd`` is valid exactly while a burst taken earlier has lines left, showing the next
one (line ``base_line + araddr // 64 + i`` modulo 2**46, tag ``arid << 1 | last``, the
top bits zero); ``arready`` is high exactly when ``o_rd`` is empty or its last line
of the burst leaves; AR and R of ``pmem`` stay idle. Every R beat is checked against
the memory it should come from: host beats in request order with their ``rid``,
``rlast`` and SLVERR for an error line, PMEM beats in request order per ID. Every write
must reach PMEM in both modes; passive checkers hold ``o_rd`` and R (and AR/AW/W of
``pmem``) to the stream rules. Random tests print their seed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.bus.axi import AxiBurst, AxiResp
from hw.bus.axi_to_cache import AxiToCache
from hw.cxl.cache_layouts import TAG_BITS
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import ROUGH, SMOOTH, AxiPmemPort, Traffic
from .conftest import assert_lints_clean
from .stream_rule import StreamRule

ADDR_WIDTH = 21
PMEM_SIZE = 1 << 20
LINE = 64
PAGE = 4096
LINE_SPACE = 1 << 46                # host line addresses wrap modulo this
READ_SPAN = PMEM_SIZE // 2          # reads below, writes above: read data never changes
TIMING = PmemTiming(read_latency=12, write_latency=8, jitter=6)


def host_line(line: int) -> int:
    """Host memory's content: a fixed function of the line address."""
    return random.Random(line).getrandbits(512)


def _read(rng: random.Random, id_width: int, max_beats: int) -> tuple[int, int, int]:
    """``(araddr, arlen, arid)`` of a random read below READ_SPAN within one 4 KiB page."""
    length = rng.randrange(max_beats)
    addr = rng.randrange(0, READ_SPAN, PAGE) + LINE * rng.randrange(PAGE // LINE - length)
    return addr, length, rng.getrandbits(id_width)


def _run(seed: int, traffic: Traffic, phases: list[bool], *, idle: float, host_bp: float,
         id_width: int = 2, n_reads: int = 40, n_writes: int = 12, max_beats: int = 8,
         latency: int = 8) -> dict:
    rng = random.Random(seed)
    dut = AxiToCache(addr_width=ADDR_WIDTH, id_width=id_width)
    model = PmemModel(size=PMEM_SIZE, timing=TIMING, rng=random.Random(seed))
    model.write(0, random.Random(seed ^ 0x5A).randbytes(PMEM_SIZE))
    port = AxiPmemPort(dut.pmem, model, rng, traffic)
    sub, o_rd, i_rd = dut.sub, dut.o_rd, dut.i_rd
    rules = {"o_rd": StreamRule("o_rd"), "R": StreamRule("R")}
    stats = {"host_bursts": 0, "host_beats": 0, "long_bursts": 0, "pmem_reads": 0,
             "errors": 0, "writes": 0, "ids": set(), "rd_cycles": [], "r_cycles": []}

    async def bench(ctx):
        for ch in ("ar", "aw"):     # 64-byte INCR beats
            ctx.set(getattr(sub, f"{ch}size"), 6)
            ctx.set(getattr(sub, f"{ch}burst"), AxiBurst.INCR)
        ctx.set(sub.wstrb, (1 << 64) - 1)
        ctx.set(sub.wlast, 1)
        last_host = max((k for k, host in enumerate(phases) if host), default=None)
        host_errors = 0                 # host lines answered with an error so far
        for k, host in enumerate(phases):
            if rng.random() < 0.5:
                base = rng.getrandbits(46)
            else:                       # bursts run over the top of the line space
                base = LINE_SPACE - rng.randrange(1, READ_SPAN // LINE)
            ctx.set(dut.host, host)
            ctx.set(dut.base_line, base)
            reads = deque(_read(rng, id_width, max_beats if host else 1)
                          for _ in range(n_reads))
            writes = deque((rng.randrange(READ_SPAN, PMEM_SIZE, LINE), rng.getrandbits(512))
                           for _ in range(n_writes))
            # Host: (data, resp, rid, rlast) per beat in request order. PMEM: per ID.
            expect: deque[tuple[int, int, int, int]] = deque()
            per_id: dict[int, deque[int]] = {}
            lines: deque[tuple[int, int, bool]] = deque()  # o_rd model: (line, tag, error)
            written: dict[int, int] = {}      # the last write of each line (one ID: in order)
            host_q: deque[list] = deque()                # [ready cycle, data, tag, error]
            rsp = None
            ar = aw = w = None
            b_due = 0
            while (reads or ar is not None or expect or any(per_id.values()) or lines
                   or host_q or rsp is not None or writes or aw or w or b_due):
                cycle = port.cycle
                assert cycle < 50_000, "hang"
                if ar is None and reads and not rng.random() < idle:
                    ar = reads.popleft()
                    ctx.set(sub.araddr, ar[0])
                    ctx.set(sub.arlen, ar[1])
                    ctx.set(sub.arid, ar[2])
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
                if rsp is None and host_q and host_q[0][0] <= cycle \
                        and not rng.random() < host_bp:
                    rsp = host_q.popleft()
                    ctx.set(i_rd.p.data, rsp[1])
                    ctx.set(i_rd.p.tag, rsp[2])
                    ctx.set(i_rd.p.error, rsp[3])
                ctx.set(i_rd.valid, rsp is not None)
                (ar_ok, aw_ok, w_ok, rvalid, rready, rdata, rresp, rlast, rid, bvalid, bready,
                 rd_valid, rd_ready, rd_addr, rd_tag, rsp_ready, p_arvalid,
                 p_rready) = await port.tick(
                    ctx, sub.arready, sub.awready, sub.wready, sub.rvalid, sub.rready,
                    sub.rdata, sub.rresp, sub.rlast, sub.rid, sub.bvalid, sub.bready,
                    o_rd.valid, o_rd.ready, o_rd.p.address, o_rd.p.tag, i_rd.ready,
                    dut.pmem.arvalid, dut.pmem.rready)
                where = f"cycle {cycle}, phase {k}, seed {seed}"
                rules["o_rd"].observe(cycle, rd_valid, rd_ready, (rd_addr, rd_tag))
                rules["R"].observe(cycle, rvalid, rready, (rdata, rresp, rlast, rid))
                if host:
                    assert not p_arvalid and not p_rready, f"AR/R of pmem not idle ({where})"
                    take = not lines or (rd_ready and len(lines) == 1)
                    assert ar_ok == take, f"arready {ar_ok}, o_rd holds {len(lines)} ({where})"
                    assert rd_valid == bool(lines), f"o_rd.valid {rd_valid} ({where})"
                    if lines:
                        want = lines[0][:2]
                        assert (rd_addr, rd_tag) == want, (
                            f"o_rd line/tag {rd_addr:#x}/{rd_tag:#x}, not "
                            f"{want[0]:#x}/{want[1]:#x} ({where})")
                else:
                    assert not rd_valid, f"a PMEM read reached CXL.cache ({where})"
                if rd_valid and rd_ready:
                    line, _, error = lines.popleft()
                    stats["rd_cycles"].append(cycle)
                    host_q.append([cycle + rng.randint(1, latency), host_line(line), rd_tag,
                                   error])
                if ar is not None and ar_ok:
                    addr, length, arid = ar
                    if host:
                        first = base + addr // LINE
                        stats["host_bursts"] += 1
                        stats["long_bursts"] += length > 0
                        stats["ids"].add(arid)
                        for i in range(length + 1):
                            line, last = (first + i) % LINE_SPACE, i == length
                            # A run must see host errors: with none in the other lines
                            # (about 1 seed in 10**20), the last host line gets one.
                            error = rng.random() < 0.1 or (k == last_host and not reads
                                                            and last and not host_errors)
                            host_errors += error
                            lines.append((line, arid << 1 | last, error))
                            expect.append((host_line(line),
                                           AxiResp.SLVERR if error else AxiResp.OKAY,
                                           arid, int(last)))
                    else:
                        per_id.setdefault(arid, deque()).append(model.read_line(addr))
                    ar = None
                if rsp is not None and rsp_ready:
                    rsp = None
                if rvalid and rready:
                    stats["r_cycles"].append(cycle)
                    if host:
                        assert expect, f"R beat with no host read outstanding ({where})"
                        data, resp, want_id, want_last = expect.popleft()
                        assert (rid, rlast) == (want_id, want_last), (
                            f"rid/rlast {rid}/{rlast}, not {want_id}/{want_last} ({where})")
                        stats["host_beats"] += 1
                    else:
                        assert per_id.get(rid), f"R beat of ID {rid} not outstanding ({where})"
                        data, resp, want_last = per_id[rid].popleft(), AxiResp.OKAY, 1
                        assert rlast == 1, f"rlast low on a single-beat read ({where})"
                        stats["pmem_reads"] += 1
                    assert (rdata, rresp) == (data, resp), f"read data/resp ({where})"
                    stats["errors"] += resp != AxiResp.OKAY
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
@pytest.mark.parametrize("id_width", [2, 13])
@pytest.mark.parametrize("run", range(2))
def test_reads_steered_writes_pass(run, seed, id_width, traffic, idle, host_bp):
    """Alternating host and PMEM phases: every read answered in order from the right
    memory (host bursts split into lines and reassembled with their IDs, host errors
    as SLVERR), every write in PMEM, stream rules kept."""
    stats = _run(seed, traffic, [True, False, True, True, False], idle=idle,
                 host_bp=host_bp, id_width=id_width)
    assert stats["host_bursts"] == 3 * 40 and stats["pmem_reads"] == 2 * 40
    assert stats["host_beats"] == len(stats["rd_cycles"]) > stats["host_bursts"]
    assert stats["long_bursts"] > 0 and stats["writes"] == 5 * 12 and stats["errors"] > 0
    assert len(stats["ids"]) >= min(1 << id_width, 100), stats["ids"]     # 120 bursts


@pytest.mark.parametrize("max_beats", [1, 8])
def test_full_rate_to_host(max_beats):
    """No backpressure, AR always offered, each response offered the cycle after its
    request: the first burst is taken in cycle 0, so its first line leaves in cycle 1
    (the register) and, as each next burst is taken in the cycle the last line of the
    one before leaves, all ``n`` lines leave in cycles 1 to ``n``; R is combinational,
    so each line's beat passes in the cycle after the line left, cycles 2 to ``n + 1``,
    and the run takes ``n + 2`` cycles."""
    stats = _run(1, SMOOTH, [True], idle=0.0, host_bp=0.0, n_reads=60, n_writes=0,
                 max_beats=max_beats, latency=1)
    n = stats["host_beats"]
    assert n >= 60 and (max_beats == 1 or n > 60 + 60), stats["host_beats"]
    assert stats["rd_cycles"] == list(range(1, n + 1)), stats["rd_cycles"][:20]
    assert stats["r_cycles"] == list(range(2, n + 2)), stats["r_cycles"][:20]
    assert stats["cycles"] == n + 2, stats["cycles"]


def test_rejects_narrow_address():
    with pytest.raises(ValueError, match="addr_width must be above 6, not 6"):
        AxiToCache(addr_width=6, id_width=1)


def test_rejects_wide_id():
    """The ID and the last-line bit must leave room in the tag for a mux's port number."""
    assert AxiToCache(addr_width=21, id_width=TAG_BITS - 3).id_width == 13
    for bad in (0, 14):
        with pytest.raises(ValueError, match=rf"^id_width must be from 1 to 13, not {bad}$"):
            AxiToCache(addr_width=21, id_width=bad)


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(AxiToCache(addr_width=48, id_width=3), "axi_to_cache_a48", tmp_path)
