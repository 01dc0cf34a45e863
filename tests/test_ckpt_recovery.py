# amaranth: UnusedElaboratable=no
"""Recovery (hw/ckpt/recovery.py) in the Amaranth simulator against the golden model.

PMEM images are built from the contract (``docs/checkpoint.md``) with the encoders of
``sim/ckpt.py``: a formatted superblock, tables, and an undo-log history of batches
(some committed, some not; rows repeated within and across batches, duplicate records
as a filter miss leaves them, stale records of the previous epoch, a ring that wraps,
a torn last record). The image is served by :class:`tb.pmem.PmemModel` with latency,
jitter, random AR/AW/W backpressure and R/B idle cycles (seeded; the seed is printed
and ``SEED=<n>`` replays it). After recovery the whole PMEM image is compared bit for
bit with ``sim.ckpt.recover`` run on a copy of the initial image, the reported values
with its report, and the tables with the state after the last committed batch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from hw.ckpt.formats import (
    COMMIT_WORD_ADDR,
    SB_MAGIC,
    SB_VERSION,
    SUPERBLOCK_CODEC,
)
from hw.ckpt.recovery import MLP_NONE, Recovery, Status
from sim.ckpt import (
    Image,
    RecoveryStatus,
    bytes_sum64,
    commit_word,
    encode_mlp_slot,
    encode_record,
    format_superblock,
    parse_commit_word,
    recover,
    tear,
)
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import ROUGH, SMOOTH, Traffic
from .conftest import assert_lints_clean
from .stream_rule import StreamRule

ADDR_WIDTH = 20
PMEM_SIZE = 1 << 20
MAX_SLOT_LINES = 5
LOG_BASE = 0x1000
MLP_SLOTS = (0x80000, 0x90000)
#: MLP slot payload capacity (a multiple of 64, as the contract requires).
MLP_BYTES = 0x440
#: (base, rows, lines per row) of the tables.
TABLES = ((0x20000, 24, 1), (0x28000, 16, 4), (0x30000, 20, 2))
LINE = 64


# --- bench ---------------------------------------------------------------------------

FAST = PmemTiming(read_latency=8, write_latency=8, jitter=12)

RESULTS = ("status", "committed", "epoch", "rolled_back", "mlp_slot", "mlp_batch",
           "log_base", "log_slots_log2", "slot_lines", "mlp_slot0", "mlp_slot1",
           "mlp_slot_bytes")


def run(model: PmemModel, *, seed: int, traffic: Traffic = SMOOTH, max_reads: int = 8,
        addr_width: int = ADDR_WIDTH, max_cycles: int = 100_000,
        fail_at: int | None = None) -> dict | None:
    """One recovery on ``model``: the results, ``cycles`` and ``writes`` (``(addr,
    wstrb)`` of every AW/W pair); ``None`` when power failed at cycle ``fail_at``."""
    dut = Recovery(addr_width=addr_width, id_width=2, max_slot_lines=MAX_SLOT_LINES,
                   max_reads=max_reads)
    rng = random.Random(seed)
    p = dut.pmem
    checks = {n: StreamRule(n) for n in ("AR", "AW", "W")}
    out: dict = {}
    aws: list[int] = []
    ws: list[int] = []

    async def bench(ctx):
        beat = b = None
        cycle = 0
        ctx.set(dut.start, 1)
        while True:
            assert cycle < max_cycles, "recovery did not finish (hang)"
            if fail_at is not None and cycle == fail_at:
                model.power_fail(rng)
                model.power_on()
                out["failed"] = True
                return
            ctx.set(p.arready, not rng.random() < traffic.ar_bp)
            ctx.set(p.awready, not rng.random() < traffic.aw_bp)
            ctx.set(p.wready, not rng.random() < traffic.w_bp)
            if beat is None and not rng.random() < traffic.r_idle:
                beat = model.r_beat(cycle)
                if beat is not None:
                    ctx.set(p.rid, beat[0])
                    ctx.set(p.rdata, beat[1])
                    ctx.set(p.rresp, beat[2])
                    ctx.set(p.rlast, int(beat[3]))
            ctx.set(p.rvalid, beat is not None)
            if b is None and not rng.random() < traffic.b_idle:
                b = model.b_resp(cycle)
                if b is not None:
                    ctx.set(p.bid, b[0])
                    ctx.set(p.bresp, b[1])
            ctx.set(p.bvalid, b is not None)
            (_, _, done, busy, arvalid, arready, awvalid, awready, wvalid, wready, wdata, wstrb,
             wlast, rready, bready, *addr) = await ctx.tick().sample(
                dut.done, dut.busy, p.arvalid, p.arready, p.awvalid, p.awready,
                p.wvalid, p.wready, p.wdata, p.wstrb, p.wlast, p.rready, p.bready,
                p.arid, p.araddr, p.arlen, p.arsize, p.arburst,
                p.awid, p.awaddr, p.awlen, p.awsize, p.awburst)
            ctx.set(dut.start, 0)
            ar, aw = tuple(addr[:5]), tuple(addr[5:])
            checks["AR"].observe(cycle, arvalid, arready, ar)
            checks["AW"].observe(cycle, awvalid, awready, aw)
            checks["W"].observe(cycle, wvalid, wready, (wdata, wstrb, wlast))
            if arvalid and arready:
                assert ar[2] == 0 and ar[1] % LINE == 0, f"AR {ar}"
                model.accept_ar(ar[0], ar[1], ar[2], cycle, size=ar[3], burst=ar[4])
            if awvalid and awready:
                assert aw[2] == 0 and aw[1] % LINE == 0, f"AW {aw}"
                aws.append(aw[1])
                model.accept_aw(aw[0], aw[1], aw[2], cycle, size=aw[3], burst=aw[4])
            if wvalid and wready:
                ws.append(wstrb)
                model.accept_w(wdata, wstrb, bool(wlast), cycle)
            if beat is not None and rready:
                model.r_accept(cycle)
                beat = None
            if b is not None and bready:
                model.b_accept(cycle)
                b = None
            cycle += 1
            if done:
                assert not busy
                break
            assert busy or cycle == 1
        assert model.outstanding == (0, 0), "done with transactions outstanding"
        for name in RESULTS:
            out[name] = ctx.get(getattr(dut, name))
        out["cycles"] = cycle
        out["writes"] = list(zip(aws, ws, strict=True))

    simulate(dut, bench)
    errors = [e for c in checks.values() for e in c.errors]
    assert not errors, "\n".join(errors[:10])
    return None if out.get("failed") else out


def model_of(image: Image, seed: int, *, size: int = PMEM_SIZE,
             timing: PmemTiming = FAST) -> PmemModel:
    model = PmemModel(size=size, timing=timing, rng=random.Random(seed))
    for addr, data in image.snapshot().items():
        model.write(addr, data)
    return model


def image_of(model: PmemModel) -> Image:
    return Image(model.snapshot())


# --- images ----------------------------------------------------------------------------

def raw_superblock(**fields) -> bytes:
    """Superblock line 0 with any field values (a correct ``check`` unless given)."""
    f = dict(magic=SB_MAGIC, version=SB_VERSION, log_slots=16, log_base=LOG_BASE,
             slot_lines=MAX_SLOT_LINES, rsvd0=0, mlp_slot0=MLP_SLOTS[0],
             mlp_slot1=MLP_SLOTS[1], mlp_slot_bytes=MLP_BYTES) | fields
    check = f.pop("check", None)
    line = SUPERBLOCK_CODEC.pack(**f).to_bytes(LINE, "little")
    if check is None:
        check = bytes_sum64(line[:56])
    return SUPERBLOCK_CODEC.pack(**f, check=check).to_bytes(LINE, "little")


def slot_addr(slot: int, log_slots: int, slot_lines: int) -> int:
    return LOG_BASE + (slot % log_slots) * slot_lines * LINE


def row_addr(table: int, row: int) -> int:
    base, _, lpr = TABLES[table]
    return base + row * lpr * LINE


def tables_of(img: Image) -> bytes:
    return b"".join(img.read(base, rows * lpr * LINE) for base, rows, lpr in TABLES)


@dataclass
class Scenario:
    image: Image
    expected_tables: bytes      # the tables after the last committed batch
    epoch: int
    committed: int
    same_row_open: int = 0      # rows logged (with different content) by 2+ open batches


def history(rng: random.Random, *, log_slots: int = 16, slot_lines: int = MAX_SLOT_LINES,
            epoch: int = 3, c0: int = 0, committed: int = 2, open_batches: int = 2,
            rows_per_batch: int = 4, stale: int = 0, torn: bool = False,
            same_rows: bool = False, garbage: int = 0) -> Scenario:
    """A device after ``committed + open_batches`` batches from ``c0 + 1`` on, of which
    the first ``committed`` are committed, then a power failure."""
    img = Image()
    img.write(0, format_superblock(LOG_BASE, log_slots, slot_lines, *MLP_SLOTS, MLP_BYTES))
    for base, rows, lpr in TABLES:
        img.write(base, rng.randbytes(rows * lpr * LINE))
    all_rows = [(t, r) for t, (_, rows, lpr) in enumerate(TABLES) for r in range(rows)
                if lpr < slot_lines]
    big = [(t, r) for t, r in all_rows if TABLES[t][2] == slot_lines - 1] or all_rows
    c = c0 + committed
    # Records of the previous generation (epoch - 1), live by batch: must be ignored.
    for s in rng.sample(range(log_slots), stale):
        t, r = rng.choice(all_rows)
        lpr = TABLES[t][2]
        rec = encode_record((epoch - 1) & 0xFFFF, c + rng.randint(1, 4),
                            s + log_slots * rng.randint(0, 3), t, r, row_addr(t, r),
                            rng.randbytes(lpr * LINE))
        img.write(slot_addr(s, log_slots, slot_lines), rec)
    for s in rng.sample(range(log_slots), garbage):
        img.write(slot_addr(s, log_slots, slot_lines), rng.randbytes(slot_lines * LINE))
    seq = open_records = 0
    snapshot = None
    open_rows: dict[tuple[int, int], set[bytes]] = {}
    last = c0 + committed + open_batches
    shared = rng.sample(all_rows, 2)
    for b in range(c0 + 1, last + 1):
        if b == c + 1:
            snapshot = tables_of(img)
        rows = [rng.choice(all_rows if rng.random() < .6 else big)
                for _ in range(rows_per_batch)]
        if same_rows and b > c:
            rows[:2] = shared
        logged: list[tuple[int, int]] = []
        records: list[tuple[int, bytes]] = []
        for t, r in rows:
            if (t, r) in logged and rng.random() < .7:
                continue                        # a filter hit: no second record
            if (t, r) not in logged:
                logged.append((t, r))
            lpr = TABLES[t][2]
            old = img.read(row_addr(t, r), lpr * LINE)
            if b > c:
                open_rows.setdefault((t, r), set()).add(old)
            records.append((slot_addr(seq, log_slots, slot_lines),
                            encode_record(epoch, b, seq, t, r, row_addr(t, r), old)))
            seq += 1
        if b > c:
            open_records += len(records)
        tear_last = torn and b == last
        for i, (a, rec) in enumerate(records):
            if tear_last and i == len(records) - 1:
                old = img.read(a, len(rec))
                cut = bytearray(tear(old, rec, rng))
                diff = [k for k in range(0, len(rec), 8) if old[k:k + 8] != rec[k:k + 8]]
                k = rng.choice(diff)
                cut[k:k + 8] = old[k:k + 8]      # at least one word stays old
                img.write(a, bytes(cut))
            else:
                img.write(a, rec)
        if not tear_last:                       # UPDATE runs once its records are durable
            for t, r in logged:
                img.write(row_addr(t, r), rng.randbytes(TABLES[t][2] * LINE))
    assert open_records <= log_slots, "the open batches do not fit the ring"
    if snapshot is None:
        snapshot = tables_of(img)
    img.write(COMMIT_WORD_ADDR, commit_word(c, epoch))
    same = sum(1 for v in open_rows.values() if len(v) > 1)
    return Scenario(img, snapshot, epoch, c, same)


def put_mlp(img: Image, rng: random.Random, slot: int, kind: str, batch: int) -> None:
    """MLP slot ``slot``: ``none`` (garbage), ``valid``, ``torn`` (one payload word
    changed), ``long`` (``length > mlp_slot_bytes``, check right) or ``zero``."""
    base = MLP_SLOTS[slot]
    hdr_addr = base + MLP_BYTES
    img.write(base, rng.randbytes(MLP_BYTES))
    if kind == "none":
        img.write(hdr_addr, rng.randbytes(LINE))
        return
    if kind == "zero":
        img.write(hdr_addr, bytes(LINE))
        return
    # Multiples of 64 as the contract says, and others (the golden model's reading:
    # ceil(length / 8) payload words as stored).
    length = rng.choice([MLP_BYTES, 64, 128 * rng.randint(1, MLP_BYTES // 128),
                         MLP_BYTES - 1, 8, 1, rng.randint(1, MLP_BYTES)])
    if kind == "long":
        length = MLP_BYTES + 8
    payload, header = encode_mlp_slot(batch, rng.randbytes(length))
    img.write(base, payload[:MLP_BYTES])
    words = -(-length // 8) * 8
    if words % LINE and words < MLP_BYTES:      # garbage past the payload's last word
        tail = LINE - words % LINE
        img.write(base + words, rng.randbytes(min(tail, MLP_BYTES - words)))
    if kind == "torn":
        k = rng.randrange(0, words, 8)
        old = img.read(base + k, 8)
        img.write(base + k, bytes(x ^ 0x5A for x in old))
    img.write(hdr_addr, header)


# --- checks ----------------------------------------------------------------------------

def expected(image: Image) -> tuple[Image, object]:
    ref = image.copy()
    report = recover(ref)
    return ref, report


def check_against_golden(image: Image, got: dict, after: Image) -> object:
    ref, report = expected(image)
    assert report.status == RecoveryStatus.DONE
    assert got["status"] == Status.OK
    assert got["committed"] == report.committed
    assert got["epoch"] == report.epoch
    assert got["rolled_back"] == report.rolled_back
    assert got["mlp_slot"] == (MLP_NONE if report.mlp_slot is None else report.mlp_slot)
    assert got["mlp_batch"] == report.mlp_batch
    if after.snapshot() != ref.snapshot():
        g, w = after.snapshot(), ref.snapshot()
        bad = sorted(a for a in set(g) | set(w) if g.get(a) != w.get(a))
        raise AssertionError(f"{len(bad)} lines differ from the golden model, first "
                             f"{[hex(a) for a in bad[:8]]}")
    # The commit word is the last write and has only bytes 0..7 strobed.
    assert got["writes"][-1] == (COMMIT_WORD_ADDR, 0xFF)
    assert sum(1 for a, _ in got["writes"] if a == COMMIT_WORD_ADDR) == 1
    return report


def check_scenario(sc: Scenario, seed: int, traffic: Traffic, **kw) -> dict:
    model = model_of(sc.image, seed)
    got = run(model, seed=seed, traffic=traffic, **kw)
    after = image_of(model)
    check_against_golden(sc.image, got, after)
    assert tables_of(after) == sc.expected_tables, "tables differ from the committed state"
    cw = parse_commit_word(after.read(COMMIT_WORD_ADDR, 8))
    assert (cw["committed"], cw["epoch"]) == (sc.committed, (sc.epoch + 1) & 0xFFFF)
    assert got["log_base"] == LOG_BASE and got["mlp_slot0"] == MLP_SLOTS[0]
    assert got["mlp_slot1"] == MLP_SLOTS[1] and got["mlp_slot_bytes"] == MLP_BYTES
    return got


# --- parameters ----------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    ({"addr_width": 15}, "addr_width must be an integer from 16 to 64, not 15"),
    ({"id_width": 0}, "id_width must be an integer from 1 to 16, not 0"),
    ({"max_slot_lines": 1}, "max_slot_lines must be an integer from 2 to 255, not 1"),
    ({"max_slot_lines": 256}, "max_slot_lines must be an integer from 2 to 255, not 256"),
    ({"max_reads": 0}, "max_reads must be an integer from 1 to 256, not 0"),
])
def test_rejects_bad_parameters(kwargs, message):
    args = {"addr_width": ADDR_WIDTH, "id_width": 2, "max_slot_lines": 5} | kwargs
    with pytest.raises(ValueError, match=message):
        Recovery(**args)


# --- log replay ----------------------------------------------------------------------

SCENARIOS = {
    "no_live_records": dict(committed=3, open_batches=0),
    "batches": dict(committed=3, open_batches=2, c0=5),
    "same_row_two_batches": dict(committed=1, open_batches=3, same_rows=True),
    "torn_record": dict(committed=2, open_batches=1, torn=True),
    "torn_after_two": dict(committed=1, open_batches=2, torn=True, same_rows=True),
    "stale_epoch": dict(committed=1, open_batches=1, stale=10, epoch=0),
    "wrapped_ring": dict(log_slots=8, committed=5, open_batches=1, rows_per_batch=3,
                         stale=3, epoch=0xFFFF),
    "garbage_slots": dict(committed=2, open_batches=2, garbage=6, rows_per_batch=3),
    "short_slots": dict(slot_lines=3, committed=2, open_batches=2, log_slots=32),
}


@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_log_replay(name, traffic, seed):
    rng = random.Random(seed)
    kw = SCENARIOS[name]
    # With one open batch whose only record is torn (its rows all one row, the filter
    # hitting: about 1 seed in 100,000) nothing is rolled back: draw on (same seed).
    for _ in range(100):
        sc = history(rng, **kw)
        for kind, slot in (("valid", 0), ("none", 1)):
            put_mlp(sc.image, rng, slot, kind, sc.committed)
        if kw.get("open_batches") == 0 or expected(sc.image)[1].rolled_back:
            break
    if kw.get("same_rows"):
        assert sc.same_row_open, "no row logged by two open batches"
    got = check_scenario(sc, seed, traffic, max_reads=rng.choice([1, 2, 8, 32, 128]))
    if kw.get("open_batches") == 0:
        assert got["rolled_back"] == 0
    else:
        assert got["rolled_back"] > 0
    assert got["log_slots_log2"] == kw.get("log_slots", 16).bit_length() - 1
    assert got["slot_lines"] == kw.get("slot_lines", MAX_SLOT_LINES)


def test_older_record_wins(seed):
    """A row logged by two open batches ends with the OLDER record's content."""
    rng = random.Random(seed)
    img = Image()
    img.write(0, format_superblock(LOG_BASE, 8, MAX_SLOT_LINES, *MLP_SLOTS, MLP_BYTES))
    addr = row_addr(1, 3)
    v0, v1, v2 = (rng.randbytes(4 * LINE) for _ in range(3))
    img.write(addr, v2)
    img.write(slot_addr(0, 8, 5), encode_record(7, 11, 0, 1, 3, addr, v0))   # batch 11
    img.write(slot_addr(1, 8, 5), encode_record(7, 12, 1, 1, 3, addr, v1))   # batch 12
    img.write(COMMIT_WORD_ADDR, commit_word(10, 7))
    model = model_of(img, seed)
    got = run(model, seed=seed, traffic=ROUGH)
    assert model.read(addr, 4 * LINE) == v0
    assert got["rolled_back"] == 2 and got["epoch"] == 8 and got["committed"] == 10
    check_against_golden(img, got, image_of(model))


def test_pass1_checks_whole_record(seed):
    """A header torn between records (new word 0, a stale word 1 with a large ``seq``)
    must not start pass 2: started there, the walk would restore the older record of a
    row first and the newer one last."""
    rng = random.Random(seed)
    img = Image()
    img.write(0, format_superblock(LOG_BASE, 8, MAX_SLOT_LINES, *MLP_SLOTS, MLP_BYTES))
    addr = row_addr(1, 5)
    v0, v1, v2 = (rng.randbytes(4 * LINE) for _ in range(3))
    img.write(addr, v2)
    img.write(slot_addr(2, 8, 5), encode_record(4, 11, 10, 1, 5, addr, v0))   # batch 11
    img.write(slot_addr(4, 8, 5), encode_record(4, 12, 12, 1, 5, addr, v1))   # batch 12
    new = encode_record(4, 12, 11, 0, 1, row_addr(0, 1), rng.randbytes(LINE))
    stale = encode_record(4, 12, 1000, 0, 2, row_addr(0, 2), rng.randbytes(LINE))
    img.write(slot_addr(3, 8, 5), new[:8] + stale[8:16] + rng.randbytes(2 * LINE - 16))
    img.write(COMMIT_WORD_ADDR, commit_word(10, 4))
    model = model_of(img, seed)
    got = run(model, seed=seed, traffic=ROUGH)
    assert model.read(addr, 4 * LINE) == v0
    assert got["rolled_back"] == 2
    check_against_golden(img, got, image_of(model))


def test_idempotent(seed):
    """Recovery run again on its own result changes nothing but the epoch."""
    rng = random.Random(seed)
    sc = history(rng, committed=2, open_batches=2, stale=3)
    put_mlp(sc.image, rng, 0, "valid", 2)
    put_mlp(sc.image, rng, 1, "valid", 1)
    model = model_of(sc.image, seed)
    first = run(model, seed=seed, traffic=ROUGH)
    once = image_of(model)
    second = run(model, seed=seed + 1, traffic=ROUGH)
    twice = image_of(model)
    assert first["rolled_back"] > 0 and second["rolled_back"] == 0
    assert second["epoch"] == (first["epoch"] + 1) & 0xFFFF
    assert (second["mlp_slot"], second["mlp_batch"]) == (0, 2)
    a, b = once.snapshot(), twice.snapshot()
    assert {k for k in set(a) | set(b) if a.get(k) != b.get(k)} == {COMMIT_WORD_ADDR}
    assert tables_of(twice) == sc.expected_tables
    assert second["writes"] == [(COMMIT_WORD_ADDR, 0xFF)]


def test_power_failure_during_recovery(seed):
    """Power fails at a random cycle of the first recovery (writes in flight dropped,
    applied or torn); a second recovery still yields the committed tables."""
    rng = random.Random(seed)
    sc = history(rng, committed=2, open_batches=2, rows_per_batch=6)
    for trial in range(3):
        # The uninterrupted recovery with the same seeds (the PMEM model's jitter and
        # the traffic), so that the power surely fails while it runs.
        full = run(model_of(sc.image, seed + trial), seed=seed + trial)
        model = model_of(sc.image, seed + trial)
        fail_at = rng.randrange(1, full["cycles"])
        assert run(model, seed=seed + trial, fail_at=fail_at) is None
        got = run(model, seed=seed + trial + 7, traffic=ROUGH)
        assert got["status"] == Status.OK
        assert tables_of(image_of(model)) == sc.expected_tables, f"fail at {fail_at}"


# --- superblock --------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["empty", "bad_check", "bad_magic", "commit_magic"])
def test_no_superblock(case, seed):
    rng = random.Random(seed)
    sc = history(rng, committed=1, open_batches=1)
    img = sc.image
    if case == "empty":
        img.write(0, bytes(2 * LINE))
    elif case == "bad_check":
        img.write(0, raw_superblock(check=rng.getrandbits(64)))
    elif case == "bad_magic":
        img.write(0, raw_superblock(magic=SB_MAGIC ^ 1))
    else:
        img.write(COMMIT_WORD_ADDR, (0x1234_0001_0000_0001).to_bytes(8, "little"))
    model = model_of(img, seed)
    got = run(model, seed=seed, traffic=ROUGH)
    assert got["status"] == Status.NO_SUPERBLOCK
    assert got["writes"] == []
    assert image_of(model) == img
    assert recover(img.copy()).status == RecoveryStatus.NO_SUPERBLOCK


BAD_LAYOUTS = {
    "version": dict(version=2),
    "log_slots_zero": dict(log_slots=0),
    "log_slots_not_pow2": dict(log_slots=12),
    "slot_lines_zero": dict(slot_lines=0),
    "slot_lines_one": dict(slot_lines=1),
    "slot_lines_too_big": dict(slot_lines=MAX_SLOT_LINES + 1),
    "slot_lines_huge": dict(slot_lines=0x1_0005),
    "log_base_unaligned": dict(log_base=LOG_BASE + 8),
    "ring_past_address_space": dict(log_base=(1 << ADDR_WIDTH) - 0x1000),
    "log_base_huge": dict(log_base=1 << 40),
    "log_slots_huge": dict(log_slots=1 << 31),
    "mlp_slot_unaligned": dict(mlp_slot1=MLP_SLOTS[1] + 4),
    "mlp_past_address_space": dict(mlp_slot0=(1 << ADDR_WIDTH) - 0x400),
    "mlp_slot_bytes_huge": dict(mlp_slot_bytes=1 << 32),
    "mlp_slot_bytes_unaligned": dict(mlp_slot_bytes=MLP_BYTES - 24),
}


@pytest.mark.parametrize("name", list(BAD_LAYOUTS))
def test_bad_layout(name, seed):
    """Superblock fields out of range (with a correct check): BAD_LAYOUT, no write.
    (The golden model reports NO_SUPERBLOCK for some of these and accepts others.)"""
    rng = random.Random(seed)
    sc = history(rng, committed=1, open_batches=1)
    img = sc.image
    img.write(0, raw_superblock(**BAD_LAYOUTS[name]))
    model = model_of(img, seed)
    got = run(model, seed=seed, traffic=ROUGH)
    assert got["status"] == Status.BAD_LAYOUT
    assert got["writes"] == []
    assert image_of(model) == img


# --- MLP slots -----------------------------------------------------------------------

MLP_CASES = [
    ("none", "none"), ("zero", "zero"), ("valid", "none"), ("none", "valid"),
    ("valid", "valid"), ("valid", "valid"), ("torn", "valid"), ("valid", "torn"),
    ("torn", "torn"), ("long", "valid"), ("valid", "long"), ("ahead", "valid"),
    ("valid", "ahead"), ("ahead", "ahead"),
]


@pytest.mark.parametrize(("k0", "k1"), MLP_CASES)
def test_mlp_slots(k0, k1, seed):
    """Valid slots report the larger batch not after C (an ``ahead`` slot is valid but
    of a batch after C: ignored)."""
    rng = random.Random(seed)
    sc = history(rng, committed=4, open_batches=1)
    b0, b1 = rng.sample(range(1, 5), 2)
    if k0 == "ahead":
        b0 = rng.randint(5, 9)
    if k1 == "ahead":
        b1 = rng.randint(5, 9)
    put_mlp(sc.image, rng, 0, "valid" if k0 == "ahead" else k0, b0)
    put_mlp(sc.image, rng, 1, "valid" if k1 == "ahead" else k1, b1)
    got = check_scenario(sc, seed, ROUGH)
    valid = {i: b for i, (k, b) in enumerate(((k0, b0), (k1, b1))) if k == "valid"}
    if not valid:
        assert (got["mlp_slot"], got["mlp_batch"]) == (MLP_NONE, 0)
    else:
        slot = max(valid, key=lambda i: valid[i])
        assert (got["mlp_slot"], got["mlp_batch"]) == (slot, valid[slot])


# --- AXI errors ----------------------------------------------------------------------

def test_error_in_pass1(seed):
    """The log lies past the end of PMEM: DECERR reads, PMEM_ERROR, nothing written."""
    rng = random.Random(seed)
    sc = history(rng, committed=1, open_batches=1)
    img = sc.image
    img.write(0, raw_superblock(log_base=0xF_C000, log_slots=16))
    model = model_of(img, seed, size=0xF_D000)
    got = run(model, seed=seed, traffic=ROUGH)
    assert got["status"] == Status.PMEM_ERROR
    assert got["writes"] == []


def test_error_in_restore_write(seed):
    """A valid live record whose row is past the end of PMEM: the restore write gets
    DECERR; the commit word is not written."""
    rng = random.Random(seed)
    sc = history(rng, committed=1, open_batches=2)
    img = sc.image
    seq = 1000
    img.write(slot_addr(seq, 16, 5), encode_record(sc.epoch, sc.committed + 1, seq, 0, 0,
                                                   0xF_F000, rng.randbytes(LINE)))
    model = model_of(img, seed, size=0xF_E000)
    before = model.read(COMMIT_WORD_ADDR, 8)
    got = run(model, seed=seed, traffic=ROUGH)
    assert got["status"] == Status.PMEM_ERROR
    assert model.read(COMMIT_WORD_ADDR, 8) == before
    assert all(a != COMMIT_WORD_ADDR for a, _ in got["writes"])


def test_error_in_mlp_read(seed):
    """An MLP slot past the end of PMEM: PMEM_ERROR after the commit word."""
    rng = random.Random(seed)
    sc = history(rng, committed=1, open_batches=1)
    img = sc.image
    img.write(0, raw_superblock(mlp_slot1=0xF_8000))
    model = model_of(img, seed, size=0xF_8000)
    got = run(model, seed=seed, traffic=ROUGH)
    assert got["status"] == Status.PMEM_ERROR
    assert got["writes"][-1] == (COMMIT_WORD_ADDR, 0xFF)
    assert tables_of(image_of(model)) == sc.expected_tables


# --- throughput and lint -------------------------------------------------------------

@pytest.mark.long
@pytest.mark.parametrize("live", [0, 63])
def test_cycles_64_slots(live, seed):
    """64 slots of 5 lines, PMEM at its default timing (120-cycle reads, 40-cycle
    writes), no backpressure: the measured cycles are printed."""
    rng = random.Random(seed)
    img = Image()
    img.write(0, format_superblock(LOG_BASE, 64, 5, *MLP_SLOTS, MLP_BYTES))
    img.write(COMMIT_WORD_ADDR, commit_word(0, 1))
    for s in range(64):
        batch = 1 if s < live else 0
        addr = 0x40000 + s * 4 * LINE
        img.write(slot_addr(s, 64, 5), encode_record(1, batch, s, 0, s, addr,
                                                     rng.randbytes(4 * LINE)))
    put_mlp(img, rng, 0, "valid", 1)
    for reads in (8, 32, 128):
        model = model_of(img, seed, timing=PmemTiming())
        got = run(model, seed=seed, max_reads=reads)
        print(f"64 slots x 5 lines, {live} live, max_reads={reads}: {got['cycles']} cycles")
        assert got["rolled_back"] == live
        check_against_golden(img, got, image_of(model))
        if reads == 128:
            assert got["cycles"] < 2500


def test_verilog_lints_clean(tmp_path):
    dut = Recovery(addr_width=48, id_width=4, max_slot_lines=17)
    assert_lints_clean(dut, "ckpt_recovery_a48_l17", tmp_path)


def test_verilog_lints_clean_small(tmp_path):
    dut = Recovery(addr_width=16, id_width=1, max_slot_lines=2, max_reads=1)
    assert_lints_clean(dut, "ckpt_recovery_a16_l2", tmp_path)
