"""Fast tests of the pure-Python PMEM model (tb/pmem.py, docs/pmem-model.md)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest

from hw.bus.axi import AxiResp
from tb.pmem import LINE_BYTES, AxiProtocolError, PmemModel, PmemTiming, PowerFailReport

FULL = (1 << 64) - 1


@dataclass
class Port:
    """A manager at cycle level: R and B always ready, one R beat and one B per cycle."""

    model: PmemModel
    cycle: int = 0
    r: list[tuple] = field(default_factory=list)   # (cycle, id, data, resp, last)
    b: list[tuple] = field(default_factory=list)   # (cycle, id, resp)

    def step(self) -> None:
        """Finish the current cycle (responses presented and taken), go to the next."""
        m, c = self.model, self.cycle
        beat = m.r_beat(c)
        if beat is not None:
            self.r.append((c, *beat))
            m.r_accept(c)
        resp = m.b_resp(c)
        if resp is not None:
            self.b.append((c, *resp))
            m.b_accept(c)
        self.cycle += 1

    def run(self, cycles: int) -> None:
        for _ in range(cycles):
            self.step()

    def run_until_idle(self, limit: int = 1_000_000) -> None:
        for _ in range(limit):
            if self.model.outstanding == (0, 0):
                return
            self.step()
        raise AssertionError("model did not become idle")

    def write(self, wid: int, addr: int, lines: list[int], strbs: list[int] | None = None):
        """AW and every W beat in the current cycle."""
        strbs = strbs or [FULL] * len(lines)
        self.model.accept_aw(wid, addr, len(lines) - 1, self.cycle)
        for k, (d, s) in enumerate(zip(lines, strbs, strict=True)):
            self.model.accept_w(d, s, k == len(lines) - 1, self.cycle)

    def read(self, rid: int, addr: int, beats: int = 1):
        self.model.accept_ar(rid, addr, beats - 1, self.cycle)


def model(size=1 << 24, seed=1, **timing) -> PmemModel:
    return PmemModel(size=size, timing=PmemTiming(**timing), rng=random.Random(seed))


def expected_first_beat(t: PmemTiming, accepted: int, beats: int) -> int:
    """docs/pmem-model.md: block-aligned read on an idle one-channel model, no jitter.

    Block j of the burst starts at ``accepted + j*T``; line k is ready at
    ``ceil(start of its block) + read_latency``; the first beat waits so that beat k
    is never presented before line k is ready.
    """
    lines_per_block = t.media_bytes // LINE_BYTES
    return max(math.ceil(accepted + (k // lines_per_block) * t.block_cycles)
               + t.read_latency - k for k in range(beats))


# --- latency ------------------------------------------------------------------------

@pytest.mark.parametrize("timing", [
    {}, {"read_latency": 7, "write_latency": 3}, {"peak_lines_per_cycle": 0.5},
    {"peak_lines_per_cycle": 0.3}, {"media_bytes": 64}, {"media_bytes": 1024},
])
@pytest.mark.parametrize("beats", [1, 4, 16])
def test_isolated_read_latency(timing, beats):
    m = model(**timing)
    port = Port(m)
    port.run(10)
    port.read(3, 0x4000, beats)
    port.run_until_idle()
    first = port.r[0][0]
    assert first - 10 == expected_first_beat(m.timing, 10, beats) - 10
    assert [c for c, *_ in port.r] == list(range(first, first + beats)), "beats back to back"
    assert m.stats.read_latency == [first - 10]
    if beats * LINE_BYTES <= m.timing.media_bytes:
        assert first - 10 == m.timing.read_latency


@pytest.mark.parametrize("latency", [1, 40, 77])
def test_isolated_write_latency(latency):
    m = model(write_latency=latency)
    port = Port(m)
    port.run(5)
    port.write(1, 0x100, [0xAB])
    port.run_until_idle()
    assert port.b == [(5 + latency, 1, AxiResp.OKAY)]
    assert m.stats.write_latency == [latency]


def test_write_waits_for_last_w_beat():
    m = model()
    m.accept_aw(2, 0x0, 1, cycle=3)
    m.accept_w(1, FULL, False, cycle=4)
    m.accept_w(2, FULL, True, cycle=9)
    port = Port(m, cycle=9)
    port.run_until_idle()
    assert port.b[0][0] == 9 + m.timing.write_latency
    assert m.stats.write_latency == [m.timing.write_latency]


def test_w_before_aw():
    m = model()
    m.accept_w(0x11, FULL, False, cycle=0)
    m.accept_w(0x22, FULL, True, cycle=1)
    m.accept_aw(4, 0x80, 1, cycle=6)
    port = Port(m, cycle=6)
    port.run_until_idle()
    assert port.b == [(6 + 40, 4, AxiResp.OKAY)]
    assert m.read_line(0x80) == 0x11 and m.read_line(0xC0) == 0x22


# --- bandwidth ----------------------------------------------------------------------

def read_throughput(m: PmemModel, addrs: list[int], beats: int = 1) -> float:
    """Issue every read in cycle 0 (unlimited outstanding) and return lines/cycle."""
    port = Port(m)
    for i, a in enumerate(addrs):
        port.read(i % 64, a, beats)
    port.run_until_idle()
    span = port.r[-1][0] - port.r[0][0] + 1
    return len(port.r) / span


@pytest.mark.parametrize("peak", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_sequential_reads_reach_peak(peak, channels):
    m = model(peak_lines_per_cycle=peak, channels=channels)
    tput = read_throughput(m, [LINE_BYTES * i for i in range(4096)])
    assert tput == pytest.approx(peak, rel=0.03)


def test_sequential_reads_issued_one_per_cycle():
    m = model()
    port = Port(m)
    for i in range(2048):
        port.read(i % 8, LINE_BYTES * i)
        port.step()
    port.run_until_idle()
    cycles = [c for c, *_ in port.r]
    assert cycles == list(range(cycles[0], cycles[0] + 2048))
    assert m.stats.media_accesses == 512 and m.stats.buffer_hits == 1536


@pytest.mark.parametrize("channels", [1, 2])
def test_random_single_line_reads_cost_a_media_access(channels):
    m = model(channels=channels)
    rng = random.Random(5)
    blocks = rng.sample(range(1 << 14), 2000)  # distinct blocks: no buffer hits
    tput = read_throughput(m, [b * 256 + 64 * rng.randrange(4) for b in blocks])
    assert tput == pytest.approx(0.25, rel=0.05)


def test_random_block_bursts_reach_peak():
    m = model()
    rng = random.Random(6)
    tput = read_throughput(m, [b * 256 for b in rng.sample(range(1 << 14), 1000)], beats=4)
    assert tput == pytest.approx(1.0, rel=0.02)


def test_one_channel_of_several_gets_its_share():
    m = model(channels=4)
    blocks = [4 * i for i in range(500)]  # all on channel 0
    tput = read_throughput(m, [b * 256 + 64 * k for b in blocks for k in range(4)])
    assert tput == pytest.approx(0.25, rel=0.03)
    assert m.stats.media_busy[1:] == [0, 0, 0]


def test_reads_and_writes_share_media_time():
    m = model()
    port = Port(m)
    for i in range(500):
        port.read(0, 0x100000 + 256 * i, 4)
        port.write(1, 256 * i, [i] * 4)
    port.run_until_idle()
    span = max(port.r[-1][0], port.b[-1][0])
    assert span >= 2 * 500 * 4  # 4000 lines through a 1 line/cycle medium
    assert m.stats.lines_read == 2000 and m.stats.lines_written == 2000


@pytest.mark.parametrize("ratio", [1.0, 0.5, 1 / 6])
@pytest.mark.parametrize("channels", [1, 4])
def test_sequential_writes_reach_write_bandwidth(ratio, channels):
    """Streaming writes move ``peak_lines_per_cycle * write_bandwidth_ratio`` lines per
    cycle; reads on the same model still reach the read peak."""
    m = model(channels=channels, write_bandwidth_ratio=ratio)
    port = Port(m)
    n = 2048
    for i in range(n):
        port.write(i % 8, LINE_BYTES * i, [i])
        port.step()
    port.run_until_idle()
    cycles = [c for c, *_ in port.b]
    lo, hi = n // 10, 9 * n // 10
    assert (hi - lo) / (cycles[hi] - cycles[lo]) == pytest.approx(ratio, rel=0.03)
    assert m.stats.media_writes == n // 4
    # media_busy counts every block write's longer slot.
    assert sum(m.stats.media_busy) == pytest.approx(n // 4 * 4 * channels / ratio, rel=1e-9)
    assert read_throughput(m, [LINE_BYTES * i for i in range(4096)]) == pytest.approx(
        1.0, rel=0.03)


def test_writes_take_longer_media_slots_than_reads():
    """With half the write bandwidth, a block write holds its channel twice as long: a
    read queued behind it starts that much later."""
    t = PmemTiming(read_latency=10, write_latency=10, write_bandwidth_ratio=0.5)
    assert t.block_cycles == 4 and t.write_block_cycles == 8
    m = PmemModel(size=1 << 20, timing=t)
    port = Port(m)
    port.write(0, 0, [1, 2, 3, 4])
    port.read(1, 0x1000)
    port.run_until_idle()
    assert port.r[0][0] == 8 + 10      # the read starts when the write's 8-cycle slot ends


# --- ordering -----------------------------------------------------------------------

def test_jitter_reorders_across_ids_not_within():
    m = model(jitter=60, seed=3)
    port = Port(m)
    issued = []
    for i in range(400):
        rid = i % 4
        port.write(rid, 0x10000 + LINE_BYTES * i, [i + 1])
        port.step()
    for i in range(400):
        rid = i % 4
        issued.append((rid, LINE_BYTES * i))
        m.write_line(LINE_BYTES * i, i)
        port.read(rid, LINE_BYTES * i)
        port.step()
    port.run_until_idle()
    got = [(rid, data) for _, rid, data, _, _ in port.r]
    want = [(rid, a // LINE_BYTES) for rid, a in issued]
    assert got != want, "jitter must reorder responses across IDs"
    for rid in range(4):
        assert [d for r, d in got if r == rid] == [d for r, d in want if r == rid]
    bids = [rid for _, rid, _ in port.b]
    assert bids != [i % 4 for i in range(400)]
    assert sorted(bids) == sorted(i % 4 for i in range(400))


def test_same_id_waits_for_slow_predecessor():
    m = model(channels=2)
    port = Port(m)
    m.write_line(0x0, 0xA)        # block 0: channel 0
    m.write_line(0x100, 0xB)      # block 1: channel 1
    for i in range(40):           # keep channel 0 busy for 40 slots of 8 cycles
        port.read(1, 0x100000 + 512 * i)
    port.read(0, 0x0)             # slow: queued behind them on channel 0
    port.read(0, 0x100)           # fast on its own (idle channel 1), same ID
    port.read(2, 0x100)           # the same fast read on another ID
    port.run_until_idle()
    cycle = {(rid, data): c for c, rid, data, _, _ in port.r if rid != 1}
    assert cycle[(2, 0xB)] <= m.timing.read_latency + 1  # one R beat per cycle
    assert cycle[(0, 0xA)] > 300
    assert cycle[(0, 0xB)] > cycle[(0, 0xA)]


def test_bursts_do_not_interleave():
    m = model(jitter=20, seed=9)
    port = Port(m)
    for i in range(50):
        port.read(i % 5, 4096 * i, 8)
    port.run_until_idle()
    lasts = [(rid, last) for _, rid, _, _, last in port.r]
    for i in range(0, len(lasts), 8):
        chunk = lasts[i:i + 8]
        assert len({rid for rid, _ in chunk}) == 1
        assert [last for _, last in chunk] == [False] * 7 + [True]


# --- durability ---------------------------------------------------------------------

def test_write_durable_exactly_at_b():
    m = model(write_latency=30)
    port = Port(m)
    port.write(0, 0x200, [0x1234, 0x5678])
    for _ in range(30):
        assert m.read(0x200, 8) == bytes(8), f"durable before B at cycle {port.cycle}"
        port.step()
    port.step()
    assert port.b == [(30, 0, AxiResp.OKAY)]
    assert m.read_line(0x200) == 0x1234 and m.read_line(0x240) == 0x5678


def test_read_after_b_sees_the_write():
    m = model()
    port = Port(m)
    port.write(0, 0x300, [0xFEED])
    port.run_until_idle()
    port.read(0, 0x300)
    port.run_until_idle()
    assert port.r[-1][2] == 0xFEED


def test_strobes():
    m = model()
    m.write_line(0, int.from_bytes(bytes(range(64)), "little"))
    port = Port(m)
    port.write(0, 0, [(1 << 512) - 1], [0x00000000_0000_00F0])
    port.run_until_idle()
    got = m.read(0, 64)
    assert got == bytes(range(4)) + b"\xff" * 4 + bytes(range(8, 64))


# --- power failure ------------------------------------------------------------------

def fill_pending(m: PmemModel, rng: random.Random, n: int, port: Port) -> dict[int, tuple]:
    """``n`` single-line writes to distinct lines with random strobes, none acknowledged."""
    writes = {}
    for i in range(n):
        addr = 0x8000 + LINE_BYTES * i
        data = rng.getrandbits(512)
        strb = rng.getrandbits(64) | (1 << rng.randrange(64))
        port.write(i % 16, addr, [data], [strb])
        writes[addr] = (data, strb)
    return writes


def test_power_fail_outcomes():
    rng = random.Random(11)
    m = model()
    port = Port(m)
    for i in range(64):   # background image
        m.write_line(0x8000 + LINE_BYTES * i, rng.getrandbits(512))
    before = {a: m.read_line(a) for a in range(0x8000, 0x8000 + 64 * LINE_BYTES, LINE_BYTES)}
    writes = fill_pending(m, rng, 64, port)
    report = m.power_fail(random.Random(99))
    assert isinstance(report, PowerFailReport)
    assert {w.outcome for w in report.writes} == {"dropped", "applied", "torn"}
    assert len(report.writes) == 64
    for fate in report.writes:
        data, strb = writes[fate.addr]
        old, new = before[fate.addr], m.read_line(fate.addr)
        for j in range(8):
            word_strb = strb >> (8 * j) & 0xFF
            old_w = old >> (64 * j) & FULL
            new_w = new >> (64 * j) & FULL
            mask = sum(0xFF << (8 * b) for b in range(8) if word_strb >> b & 1)
            merged = (old_w & ~mask) | (data >> (64 * j) & mask)
            applied = (fate.outcome == "applied" or
                       (fate.outcome == "torn" and fate.addr + 8 * j in fate.words))
            assert new_w == (merged if applied else old_w), (fate, j)
        if fate.outcome == "torn":
            assert fate.candidate_words == sum(1 for j in range(8) if strb >> (8 * j) & 0xFF)
            assert all(strb >> (8 * ((w - fate.addr) // 8)) & 0xFF for w in fate.words)
    torn = [f for f in report.writes if f.outcome == "torn"]
    assert any(0 < len(f.words) < f.candidate_words for f in torn), "some write really tears"


def test_acknowledged_writes_survive_and_model_stops():
    rng = random.Random(4)
    m = model(jitter=30, seed=4)
    port = Port(m)
    acked = {}
    for i in range(300):
        addr = LINE_BYTES * i
        data = rng.getrandbits(512)
        port.write(i % 8, addr, [data])
        acked[(i % 8, addr)] = data
        port.step()
    port.read(0, 0)
    done_b = len(port.b)
    assert 0 < done_b < 300
    report = m.power_fail(random.Random(1))
    assert len(report.writes) == 300 - done_b
    assert report.reads_lost >= 1
    pending = {f.addr for f in report.writes}
    survivors = [a for (_, a) in acked if a not in pending]
    assert len(survivors) == done_b
    for (_, a), data in acked.items():
        if a not in pending:
            assert m.read_line(a) == data
    # Nothing answers, nothing is accepted, until power_on.
    assert m.r_beat(port.cycle + 10_000) is None and m.b_resp(port.cycle + 10_000) is None
    with pytest.raises(RuntimeError, match="powered off"):
        m.accept_ar(0, 0, 0, port.cycle)
    with pytest.raises(RuntimeError, match="powered off"):
        m.accept_w(0, FULL, True, port.cycle)
    with pytest.raises(RuntimeError, match="already powered off"):
        m.power_fail()
    m.power_on()
    assert m.outstanding == (0, 0)
    port.read(0, 0)
    port.run_until_idle()
    assert port.r[-1][2] == m.read_line(0)


def test_power_fail_incomplete_write_and_orphans():
    m = model()
    m.accept_aw(0, 0x0, 3, cycle=0)
    m.accept_w(0x1, FULL, False, cycle=0)
    m.accept_w(0x2, FULL, False, cycle=1)
    m.accept_aw(1, 0x1000, 0, cycle=1)
    report = m.power_fail(random.Random(0), weights=(0, 1, 0))
    assert [(f.addr, f.beats, f.beats_received, f.outcome) for f in report.writes] == [
        (0x0, 4, 2, "applied"), (0x1000, 1, 0, "dropped")]
    assert m.read_line(0) == 1 and m.read_line(0x40) == 2 and m.read_line(0x80) == 0


def test_power_fail_reproducible():
    def run(seed):
        rng = random.Random(seed)
        m = model(jitter=10, seed=seed)
        port = Port(m)
        fill_pending(m, rng, 100, port)
        port.run(45)
        report = m.power_fail(random.Random(seed + 1))
        return report, m.snapshot()

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_reset_applies_pending_writes_and_drops_reads():
    m = model()
    port = Port(m)
    port.write(0, 0x40, [0x99])
    port.read(1, 0x40)
    report = m.reset()
    assert [(f.addr, f.outcome) for f in report.writes] == [(0x40, "applied")]
    assert report.reads_lost == 1
    assert m.read_line(0x40) == 0x99
    assert m.outstanding == (0, 0)
    port.run(500)
    assert port.r == [] and port.b == []


# --- errors and address decoding ----------------------------------------------------

def test_decerr_beyond_size():
    m = model(size=0x1080)
    port = Port(m)
    port.read(0, 0x1040, 4)
    port.write(1, 0x1080, [0x5])
    port.run_until_idle()
    assert [resp for *_, resp, _ in port.r] == [0] + [AxiResp.DECERR] * 3
    assert port.b[0][2] == AxiResp.DECERR
    assert m.snapshot() == {}
    assert m.stats.decerr == 2


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: m.accept_ar(0, 0, 0, 0, size=5), "arsize must be 6 (64-byte beats), not 5"),
    (lambda m: m.accept_aw(0, 0, 0, 0, burst=2), "awburst must be INCR (1), not 2"),
    (lambda m: m.accept_ar(3, 0xFC0, 1, 0), "AR burst id 3 addr 0xfc0 len 1 crosses a 4 KiB"),
    (lambda m: m.accept_ar(0, 0, 256, 0), "arlen must be 0..255, not 256"),
])
def test_protocol_errors(call, message):
    with pytest.raises(AxiProtocolError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(model())


def test_wlast_on_wrong_beat():
    m = model()
    m.accept_aw(5, 0x40, 1, 0)
    with pytest.raises(AxiProtocolError, match=r"wlast=1 on beat 1 of a 2-beat write burst \(id 5"):
        m.accept_w(0, FULL, True, 0)


def test_4k_check_can_be_disabled():
    m = PmemModel(size=1 << 20, check_4k=False)
    port = Port(m)
    port.read(0, 0xFC0, 256)
    port.run_until_idle()
    assert len(port.r) == 256


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"read_latency": 0}, "read_latency must be at least 1, not 0"),
    ({"write_latency": -3}, "write_latency must be at least 1, not -3"),
    ({"read_latency": 1.5}, "read_latency must be an integer, not 1.5"),
    ({"peak_lines_per_cycle": 0}, "peak_lines_per_cycle must be a positive number, not 0"),
    ({"peak_lines_per_cycle": "1"}, "peak_lines_per_cycle must be a positive number, not '1'"),
    ({"channels": 0}, "channels must be at least 1, not 0"),
    ({"media_bytes": 96}, "media_bytes must be a power of two from 64 to 4096, not 96"),
    ({"media_bytes": 32}, "media_bytes must be a power of two from 64 to 4096, not 32"),
    ({"jitter": -1}, "jitter must be non-negative, not -1"),
    ({"write_bandwidth_ratio": 0}, r"write_bandwidth_ratio must be a number in \(0, 1\], not 0"),
    ({"write_bandwidth_ratio": 1.5},
     r"write_bandwidth_ratio must be a number in \(0, 1\], not 1.5"),
    ({"write_bandwidth_ratio": True},
     r"write_bandwidth_ratio must be a number in \(0, 1\], not True"),
])
def test_timing_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PmemTiming(**kwargs)


@pytest.mark.parametrize("size", [0, 100, -64, 1.5])
def test_size_validation(size):
    message = f"size must be a positive multiple of 64 bytes, not {size}"
    with pytest.raises(ValueError, match=message):
        PmemModel(size=size)


def test_power_fail_weights_validation():
    with pytest.raises(ValueError, match="weights must be three non-negative numbers"):
        model().power_fail(weights=(1, -1, 1))


# --- backdoor -----------------------------------------------------------------------

def test_backdoor_read_write_image():
    m = model()
    m.write(0x3D, b"hello, persistent world, spanning two lines" * 2)
    assert m.read(0x3D, 12) == b"hello, persi"
    assert m.read(0x3C, 1) == b"\0"
    image = m.snapshot()
    assert set(image) == {0x0, 0x40, 0x80} and all(len(v) == 64 for v in image.values())
    other = model()
    other.load_image(image)
    assert other.snapshot() == image
    assert m.read(0x100000, 3) == bytes(3)
