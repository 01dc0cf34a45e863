"""Fast tier: the golden persistence model of ``docs/checkpoint.md`` (``sim/ckpt.py``).

Formats and checksums, the logger's space / status rules, recovery on crash images
(torn and stale records, slot reuse, two live batches) and recovery's idempotency under
power cuts after any number of its writes. Every random test prints its seed;
``SEED=<n>`` replays it.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from hw.ckpt.formats import (
    COMMIT_MAGIC,
    COMMIT_WORD_ADDR,
    LOG_MAGIC,
    MLP_MAGIC,
    SB_MAGIC,
    SUM64_KEY,
)
from sim import ckpt
from sim.ckpt import (
    LINE_BYTES,
    CkStatus,
    Image,
    Logger,
    RecoveryStatus,
    TrainingOracle,
    commit_word,
    encode_mlp_slot,
    encode_record,
    format_device,
    format_superblock,
    mlp_slot_valid,
    parse_commit_word,
    parse_header,
    parse_mlp_header,
    parse_superblock,
    record_valid,
    recover,
    recover_steps,
    recover_with_crash,
    sum64,
    superblock_valid,
    tear,
)

GEOM = dict(log_base=0x1000, log_slots=16, slot_lines=3, mlp_slot0=0x4000,
            mlp_slot1=0x5000, mlp_slot_bytes=512)
TABLE_BASE = 0x10000
TABLES = 2
ROWS = 12
LPR = 2                       # lines per row (dim 32 fp32)
ROW_BYTES = LPR * LINE_BYTES


def rotl1(x: int) -> int:
    return ((x << 1) | (x >> 63)) & ((1 << 64) - 1)


# --- Checksum and formats ----------------------------------------------------------------

def test_sum64_definition(seed):
    rng = random.Random(seed)
    assert sum64([]) == SUM64_KEY
    assert sum64([0] * 8) == SUM64_KEY != 0
    assert sum64([1 << 63]) == 1 ^ SUM64_KEY
    for _ in range(200):
        ws = [rng.getrandbits(64) for _ in range(rng.randrange(1, 20))]
        assert sum64(ws) == rotl1(sum(ws) % (1 << 64)) ^ SUM64_KEY
        data = b"".join(w.to_bytes(8, "little") for w in ws)
        assert ckpt.words(data) == ws and ckpt.bytes_sum64(data) == sum64(ws)


def test_superblock_round_trip_and_bit_flips():
    line = format_superblock(**GEOM)
    assert len(line) == LINE_BYTES and superblock_valid(line)
    f = parse_superblock(line)
    assert f["magic"] == SB_MAGIC and f["version"] == 1 and f["rsvd0"] == 0
    assert {k: f[k] for k in GEOM} == GEOM
    assert line[:8] == b"TCXLSB01"
    assert f["check"] == sum64(ckpt.words(line[:56]))
    for bit in range(512):
        flipped = (int.from_bytes(line, "little") ^ (1 << bit)).to_bytes(64, "little")
        assert not superblock_valid(flipped), bit
    assert not superblock_valid(bytes(64))
    with pytest.raises(ValueError):
        format_superblock(**{**GEOM, "log_slots": 12})


def test_commit_word_round_trip():
    w = commit_word(0x12345678, 0xBEEF)
    assert len(w) == 8
    assert parse_commit_word(w) == {"committed": 0x12345678, "epoch": 0xBEEF,
                                    "magic": COMMIT_MAGIC}
    assert int.from_bytes(w, "little") == 0xC0DE_BEEF_1234_5678


def test_record_round_trip_and_bit_flips(seed):
    rng = random.Random(seed)
    payload = rng.randbytes(2 * LINE_BYTES)
    rec = encode_record(7, 0xABCDEF01, 0x1234, 0x0102, 0x55AA, 0x10040, payload)
    assert len(rec) == 3 * LINE_BYTES and rec[LINE_BYTES:] == payload
    hdr = rec[:LINE_BYTES]
    f = parse_header(hdr)
    assert rec[:4] == b"ULOG"
    assert (f["magic"], f["epoch"], f["n"], f["batch_id"], f["seq"], f["table_id"], f["row"],
            f["addr"]) == (LOG_MAGIC, 7, 2, 0xABCDEF01, 0x1234, 0x0102, 0x55AA, 0x10040)
    assert f["rsvd0"] == f["rsvd1"] == f["rsvd2"] == 0
    assert f["check"] == sum64(ckpt.words(hdr[:56]) + ckpt.words(payload))
    assert record_valid(hdr, payload, 7, slot_lines=3)
    assert not record_valid(hdr, payload, 8), "wrong epoch"
    assert not record_valid(hdr, payload, 7, slot_lines=2), "n out of range"
    assert not record_valid(hdr, payload[:LINE_BYTES], 7), "payload too short"
    whole = int.from_bytes(rec, "little")
    for bit in range(len(rec) * 8):
        bad = (whole ^ (1 << bit)).to_bytes(len(rec), "little")
        assert not record_valid(bad[:64], bad[64:], 7), bit
    zero = bytes(64)
    assert not record_valid(zero, bytes(128), 0)
    with pytest.raises(ValueError):
        encode_record(0, 1, 0, 0, 0, 0, b"short")


def test_mlp_slot_round_trip_and_bit_flips(seed):
    rng = random.Random(seed)
    params = rng.randbytes(200)
    data, hdr = encode_mlp_slot(42, params)
    assert len(data) == 256 and data[:200] == params and data[200:] == bytes(56)
    f = parse_mlp_header(hdr)
    assert (f["magic"], f["batch_id"], f["length"]) == (MLP_MAGIC, 42, 200)
    assert hdr[:4] == b"MLPC"
    assert mlp_slot_valid(hdr, data, 512)
    assert not mlp_slot_valid(hdr, data, 128), "length beyond the slot"
    h = int.from_bytes(hdr, "little")
    for bit in range(256):          # words 0..3: magic, batch, length, check
        assert not mlp_slot_valid((h ^ (1 << bit)).to_bytes(64, "little"), data, 512), bit
    d = int.from_bytes(data, "little")
    for bit in range(200 * 8):      # every payload bit in length
        assert not mlp_slot_valid(hdr, (d ^ (1 << bit)).to_bytes(256, "little"), 512), bit
    assert not mlp_slot_valid(bytes(64), bytes(64))


def test_image_reads_writes_and_snapshot(seed):
    rng = random.Random(seed)
    img = Image()
    ref = bytearray(4096)
    for _ in range(300):
        a = rng.randrange(3000)
        data = rng.randbytes(rng.randrange(1, 200))
        img.write(a, data)
        ref[a:a + len(data)] = data
        b = rng.randrange(3000)
        n = rng.randrange(0, 300)
        assert img.read(b, n) == bytes(ref[b:b + n])
    snap = img.snapshot()
    assert all(a % 64 == 0 and len(v) == 64 for a, v in snap.items())
    assert Image.from_snapshot(snap) == img and img.copy() == img


def test_tear_is_word_granular(seed):
    rng = random.Random(seed)
    old, new = rng.randbytes(64), rng.randbytes(64)
    for _ in range(50):
        t = tear(old, new, rng)
        for i in range(0, 64, 8):
            assert t[i:i + 8] in (old[i:i + 8], new[i:i + 8])


# --- A small device on an Image ------------------------------------------------------------

def table_addr(t: int, row: int = 0) -> int:
    return TABLE_BASE + (t * ROWS + row) * ROW_BYTES


class Device:
    """Logger + tables on one memory; the device's rules: records before row writes."""

    def __init__(self, mem, rng: random.Random, *, filter_rows: int = 0, fresh: bool = True,
                 geom=GEOM):
        self.mem = mem
        if fresh:
            format_device(mem, **geom)
            for t in range(TABLES):
                mem.write(table_addr(t), rng.randbytes(ROWS * ROW_BYTES))
        self.log = Logger(mem, filter_rows=filter_rows)

    def tables(self) -> dict[int, bytes]:
        return {t: self.mem.read(table_addr(t), ROWS * ROW_BYTES) for t in range(TABLES)}

    def op(self, op) -> object:
        kind = op[0]
        if kind == "capture":
            _, b, t, row = op
            return self.log.capture(b, t, row, table_addr(t, row),
                                    self.mem.read(table_addr(t, row), ROW_BYTES))
        if kind == "update":
            _, b, t, row, data = op
            status = self.log.update_allowed(b)
            if status == CkStatus.OK:
                self.mem.write(table_addr(t, row), data)
            return status
        if kind == "commit":
            return self.log.commit(op[1])
        raise ValueError(op)

    @staticmethod
    def region(op, geom=GEOM) -> tuple[int, int] | None:
        """Bytes an operation may write (for tearing); a capture's region is its slot."""
        if op[0] == "update":
            return table_addr(op[2], op[3]), ROW_BYTES
        if op[0] == "commit":
            return COMMIT_WORD_ADDR, 8
        return None


def make_ops(rng: random.Random, batches: range, *, lookahead: bool = False,
             rows_per_batch: int = 5, dup: float = 0.3) -> list[tuple]:
    """Per batch: captures (with duplicates), updates of a subset of captured rows,
    COMMIT. ``lookahead``: the next batch's captures come before COMMIT(b)."""
    per_batch = []
    for b in batches:
        keys = [(rng.randrange(TABLES), rng.randrange(ROWS)) for _ in range(rows_per_batch)]
        caps = [("capture", b, t, r) for t, r in keys]
        caps += [("capture", b, t, r) for t, r in keys if rng.random() < dup]
        ups = [("update", b, t, r, rng.randbytes(ROW_BYTES))
               for t, r in dict.fromkeys(keys) if rng.random() < 0.8]
        per_batch.append((b, caps, ups))
    ops: list[tuple] = []
    for i, (b, caps, ups) in enumerate(per_batch):
        if not (lookahead and i > 0):
            ops += caps
        ops += ups
        if lookahead and i + 1 < len(per_batch):
            ops += per_batch[i + 1][1]
        ops.append(("commit", b))
    return ops


def inflight_window(ops: list[tuple], k: int, m: int) -> list[tuple]:
    """Up to ``m`` ops from ``k`` that can be in flight together: consecutive ops of one
    kind (captures or updates); a COMMIT only alone."""
    if k >= len(ops):
        return []
    if ops[k][0] == "commit":
        return [ops[k]]
    win = []
    for op in ops[k:k + m]:
        if op[0] != ops[k][0] or (op[0] == "update" and op[1] != ops[k][1]):
            break
        win.append(op)
    return win


def run_and_crash(dev: Device, oracle: TrainingOracle, ops: list[tuple], k: int,
                  rng: random.Random, inflight: int = 1) -> None:
    """Complete ``ops[:k]``, then power fails with the next ops in flight (each dropped,
    applied or torn at 8-byte granularity)."""
    shadow = dev.tables()
    for op in ops[:k]:
        if op[0] == "commit":
            oracle.after_batch(op[1], shadow)
            oracle.commit_issued(op[1])
        status = dev.op(op)
        if op[0] == "commit":
            assert status == CkStatus.OK
            oracle.commit_completed(op[1])
        if op[0] == "update" and status == CkStatus.OK:
            shadow[op[2]] = dev.mem.read(table_addr(op[2]), ROWS * ROW_BYTES)
    for op in inflight_window(ops, k, inflight):
        fate = rng.choice(("dropped", "applied", "torn"))
        if op[0] == "commit":
            oracle.after_batch(op[1], shadow)
            oracle.commit_issued(op[1])
        if op[0] == "capture":
            slot_addr = dev.log.sb.slot_addr(dev.log.write_seq)
            region = (slot_addr, GEOM["slot_lines"] * LINE_BYTES)
        else:
            region = Device.region(op)
        old = dev.mem.read(*region)
        dev.op(op)
        new = dev.mem.read(*region)
        if fate == "dropped":
            dev.mem.write(region[0], old)
        elif fate == "torn":
            dev.mem.write(region[0], tear(old, new, rng))


def test_scenario_crash_anywhere(seed):
    """Batches 1..5, crash after every prefix of the op stream (records, row updates or
    the commit word in flight), recover, tables == golden after the last commit."""
    rng = random.Random(seed)
    base_rng = random.Random(rng.getrandbits(64))
    init = Image()
    Device(init, base_rng)
    for lookahead in (False, True):
        ops = make_ops(random.Random(rng.getrandbits(64)), range(1, 6), lookahead=lookahead)
        for k in range(len(ops) + 1):
            mem = init.copy()
            dev = Device(mem, rng, fresh=False, filter_rows=rng.choice((0, 4, 64)))
            oracle = TrainingOracle({t: (table_addr(t), v) for t, v in dev.tables().items()})
            run_and_crash(dev, oracle, ops, k, rng, inflight=rng.randrange(1, 4))
            report = recover(mem)
            oracle.check(mem, report)
            assert report.order_ok, report.restored
            assert report.epoch == 1
            # Rolled back: the valid live records of the uncommitted batches.
            assert all(r[2] > report.committed for r in report.restored)


def test_multi_epoch_training_with_crashes(seed):
    """Train, crash, recover, continue (batch ids repeat after a rollback, seq restarts
    at 0, the log wraps over committed and older-epoch records), many times."""
    rng = random.Random(seed)
    geom = {**GEOM, "log_slots": 8}
    mem = Image()
    Device(mem, rng, geom=geom)
    committed = 0
    for epoch in range(1, 13):
        dev = Device(mem, rng, fresh=False, filter_rows=rng.choice((0, 8)))
        oracle = TrainingOracle({t: (table_addr(t), v) for t, v in dev.tables().items()})
        oracle.commit_completed(committed)
        # One batch at a time (driver discipline), 8 slots: batches fit (<= 7 records).
        ops = make_ops(rng, range(committed + 1, committed + 4), rows_per_batch=4, dup=0.5)
        k = rng.randrange(len(ops) + 1)
        run_and_crash(dev, oracle, ops, k, rng, inflight=rng.randrange(1, 4))
        report = recover(mem)
        oracle.check(mem, report)
        assert report.epoch == epoch
        committed = report.committed
        assert ckpt.read_commit_word(mem) == (committed, epoch)


def test_runs_on_pmem_model_like_on_image(seed):
    """Duck typing: the same scenario on tb.pmem.PmemModel and on an Image."""
    from tb.pmem import PmemModel

    rng = random.Random(seed)
    ops = make_ops(random.Random(rng.getrandbits(64)), range(1, 4))
    k = rng.randrange(len(ops))
    results = []
    for mem in (Image(), PmemModel(size=1 << 20)):
        r = random.Random(seed)
        dev = Device(mem, r)
        oracle = TrainingOracle({t: (table_addr(t), v) for t, v in dev.tables().items()})
        run_and_crash(dev, oracle, ops, k, r)
        report = recover(mem)
        oracle.check(mem, report)
        results.append((mem.snapshot(), report.csrs, report.restored))
    assert results[0] == results[1]


# --- Torn, stale and reused records --------------------------------------------------------

def slot_image(geom=GEOM, committed=0, epoch=0) -> Image:
    mem = Image()
    format_device(mem, **geom)
    mem.write(COMMIT_WORD_ADDR, commit_word(committed, epoch))
    return mem


def test_torn_records_rejected(seed):
    rng = random.Random(seed)
    for _ in range(300):
        payload = rng.randbytes(ROW_BYTES)
        new = encode_record(3, 5, rng.randrange(100), 1, 2, table_addr(1, 2), payload)
        if rng.random() < 0.5:
            old = rng.randbytes(len(new))
        else:       # the slot's previous record, same epoch, committed batch
            old = encode_record(3, 4, rng.randrange(100), 1, 2, table_addr(1, 2),
                                rng.randbytes(ROW_BYTES))
        torn = tear(old, new, rng, p_new=rng.random())
        valid = record_valid(torn[:64], torn[64:], 3, 3)
        if torn == new:
            assert valid
        elif torn == old:
            assert valid == record_valid(old[:64], old[64:], 3, 3)
        else:
            assert not valid


def test_torn_record_not_restored_by_recovery(seed):
    """A record torn in flight is skipped; the rows it names keep their (unchanged)
    contents; the durable records are restored."""
    rng = random.Random(seed)
    for _ in range(50):
        mem = slot_image(committed=2, epoch=1)
        sb = ckpt.read_superblock(mem)
        rows = {}
        for seq in range(4):
            addr = table_addr(0, seq)
            old = rng.randbytes(ROW_BYTES)
            rows[addr] = old
            rec = encode_record(1, 3, seq, 0, seq, addr, old)
            if seq == 3:
                rec = tear(mem.read(sb.slot_addr(seq), len(rec)), rec, rng)
            mem.write(sb.slot_addr(seq), rec)
            if seq < 3:     # rows are updated only once their records are durable
                mem.write(addr, rng.randbytes(ROW_BYTES))
        current3 = mem.read(table_addr(0, 3), ROW_BYTES)
        torn_ok = record_valid(mem.read(sb.slot_addr(3), 64),
                               mem.read(sb.slot_addr(3) + 64, ROW_BYTES), 1, 3)
        report = recover(mem)
        assert report.rolled_back == 3 + torn_ok
        assert [r[1] for r in report.restored] == ([3] if torn_ok else []) + [2, 1, 0]
        for seq in range(3):
            assert mem.read(table_addr(0, seq), ROW_BYTES) == rows[table_addr(0, seq)]
        if not torn_ok:
            assert mem.read(table_addr(0, 3), ROW_BYTES) == current3


def test_stale_records_ignored(seed):
    """Older epoch and committed batches are never replayed; only valid live records."""
    rng = random.Random(seed)
    mem = slot_image(committed=5, epoch=3)
    sb = ckpt.read_superblock(mem)
    cases = [  # (epoch, batch, restored?)
        (2, 6, False),      # older epoch, batch > C
        (3, 5, False),      # committed batch
        (3, 4, False),
        (3, 6, True),
        (9, 7, False),      # another epoch (newer: only reachable by 16-bit wrap)
        (3, 6, True),
    ]
    before = {}
    for seq, (epoch, batch, _) in enumerate(cases):
        addr = table_addr(1, seq)
        before[addr] = mem.read(addr, ROW_BYTES)
        mem.write(sb.slot_addr(seq),
                  encode_record(epoch, batch, seq, 1, seq, addr, rng.randbytes(ROW_BYTES)))
    report = recover(mem)
    assert report.status == RecoveryStatus.DONE and report.committed == 5
    assert [r[1] for r in report.restored] == [5, 3]
    for seq, (_, _, restored) in enumerate(cases):
        addr = table_addr(1, seq)
        changed = mem.read(addr, ROW_BYTES) != before[addr]
        assert changed == restored, seq
    assert ckpt.read_commit_word(mem) == (5, 4)
    # A second recovery replays nothing: every record is of an older epoch now.
    snap = mem.snapshot()
    again = recover(mem)
    assert again.rolled_back == 0 and again.newest_seq is None
    assert {a: v for a, v in mem.snapshot().items() if a != 64} == \
        {a: v for a, v in snap.items() if a != 64}


def test_slot_reuse_after_commit(seed):
    """A small ring wraps several times over committed records; recovery restores the
    live batch only, from the newest slot backwards across the wrap."""
    rng = random.Random(seed)
    geom = {**GEOM, "log_slots": 4}
    mem = Image()
    dev = Device(mem, rng, geom=geom)
    golden = dev.tables()
    for b in range(1, 8):
        rows = [(rng.randrange(TABLES), rng.randrange(ROWS)) for _ in range(3)]
        for t, r in rows:
            assert dev.op(("capture", b, t, r)) is not None
        for t, r in dict.fromkeys(rows):
            assert dev.op(("update", b, t, r, rng.randbytes(ROW_BYTES))) == CkStatus.OK
        if b < 7:
            assert dev.op(("commit", b)) == CkStatus.OK
            golden = dev.tables()
    assert dev.log.write_seq == 21
    report = recover(mem)
    assert report.committed == 6 and report.rolled_back == 3
    assert [r[1] for r in report.restored] == [20, 19, 18]
    assert report.start_slot == 20 % 4
    assert dev.tables() == golden


# --- Recovery idempotency -------------------------------------------------------------------

def crash_image(rng: random.Random, lookahead: bool = False) -> Image:
    """A device image crashed with one live batch (records durable, some rows updated)
    or, with ``lookahead``, two (batch 3 updated, batch 4's records logged)."""
    mem = Image()
    dev = Device(mem, rng)
    ops = make_ops(rng, range(1, 5), lookahead=lookahead, rows_per_batch=6)
    if lookahead:
        k = ops.index(("commit", 3))
    else:
        last_updates = [i for i, op in enumerate(ops) if op[0] == "update" and op[1] == 4]
        k = rng.choice(last_updates) if last_updates else len(ops) - 1
    for op in ops[:k]:
        dev.op(op)
    return mem


def test_recovery_idempotent_under_cuts(seed):
    rng = random.Random(seed)
    for lookahead in (False, True):
        crashed = crash_image(rng, lookahead)
        clean = crashed.copy()
        clean_report = recover(clean)
        assert clean_report.rolled_back > 0
        total = clean_report.writes
        assert total == sum(parse_header(crashed.read(
            ckpt.read_superblock(crashed).slot_addr(r[0]), 64))["n"]
            for r in clean_report.restored) + 1
        for cut in range(total + 1):
            for torn in (False, True):
                mem = crashed.copy()
                first = recover_with_crash(mem, cut, rng if torn else None,
                                           inflight=rng.randrange(1, 4))
                if cut == total:
                    assert first is not None and mem == clean
                    assert first.csrs == clean_report.csrs
                    continue
                assert first is None
                second = recover(mem)
                assert second.committed == clean_report.committed
                assert second.mlp_slot == clean_report.mlp_slot
                cw = ckpt.read_commit_word(mem)
                if cw == ckpt.read_commit_word(clean):
                    # The first recovery's commit word never became durable.
                    assert mem == clean and second.csrs == clean_report.csrs
                else:
                    # The commit word was in flight and landed: recovery had finished.
                    assert cw == (clean_report.committed, clean_report.epoch + 1)
                    assert second.rolled_back == 0
                    assert {a: v for a, v in mem.snapshot().items() if a != 64} == \
                        {a: v for a, v in clean.snapshot().items() if a != 64}


def test_recovery_repeated_power_cuts(seed):
    """Power fails again and again during recovery; the tables end as one clean run."""
    rng = random.Random(seed)
    crashed = crash_image(rng)
    clean = crashed.copy()
    clean_report = recover(clean)
    tables = [(table_addr(t), ROWS * ROW_BYTES) for t in range(TABLES)]
    for _ in range(30):
        mem = crashed.copy()
        while recover_with_crash(mem, rng.randrange(clean_report.writes + 1), rng,
                                 inflight=rng.randrange(1, 4)) is None:
            pass
        for a, n in tables:
            assert mem.read(a, n) == clean.read(a, n)


def test_recover_steps_order_and_fence():
    rng = random.Random(5)
    mem = crash_image(rng)
    writes = list(recover_steps(mem.copy()))
    assert writes[-1].kind == "commit" and writes[-1].fence and len(writes[-1].data) == 8
    assert all(w.kind == "restore" and len(w.data) == 64 for w in writes[:-1])


def test_no_superblock():
    mem = Image()
    report = recover(mem)
    assert report.status == RecoveryStatus.NO_SUPERBLOCK and report.writes == 0
    assert mem.snapshot() == {}
    mem = slot_image()
    line = bytearray(mem.read(0, 64))
    line[20] ^= 1
    mem.write(0, bytes(line))
    before = mem.snapshot()
    assert recover(mem).status == RecoveryStatus.NO_SUPERBLOCK
    assert mem.snapshot() == before
    mem = slot_image()
    mem.write(COMMIT_WORD_ADDR, bytes(8))      # commit word without its magic
    assert recover(mem).status == RecoveryStatus.NO_SUPERBLOCK
    with pytest.raises(ValueError):
        Logger(Image())


def test_format_clears_stale_log():
    """Reformatting (commit word {0, 0}) must not revive records of a previous format."""
    rng = random.Random(1)
    mem = Image()
    dev = Device(mem, rng)
    for r in range(3):
        dev.op(("capture", 1, 0, r))
    format_device(mem, **GEOM)
    before = mem.snapshot()
    report = recover(mem)
    assert report.rolled_back == 0
    assert {a: v for a, v in mem.snapshot().items() if a != 64} == \
        {a: v for a, v in before.items() if a != 64}


# --- Two live batches and the pass-1 start -------------------------------------------------

def test_two_live_batches_restore_newest_first(seed):
    """LOOKUPs of b + 1 before COMMIT(b): both batches roll back, b + 1's records first,
    so a row in both ends at its value before b."""
    rng = random.Random(seed)
    mem = Image()
    dev = Device(mem, rng)
    before = dev.tables()
    dev.op(("capture", 1, 0, 3))
    dev.op(("update", 1, 0, 3, rng.randbytes(ROW_BYTES)))
    dev.op(("capture", 2, 0, 3))                # old value: batch 1's update
    dev.op(("capture", 2, 1, 4))
    assert dev.log.update_allowed(1) == CkStatus.BAD_BATCH
    report = recover(mem)
    assert [r[1] for r in report.restored] == [2, 1, 0] and report.order_ok
    assert dev.tables() == before


def test_pass1_ignores_torn_header_with_stale_seq(seed):
    """A torn header whose batch/seq word is stale from an older epoch (batch > C, larger
    seq) would pass a header-only check; pass 1 checks whole records, so it does not move
    pass 2's start and the restores stay in decreasing seq order."""
    rng = random.Random(seed)
    mem = slot_image(committed=0, epoch=1)
    sb = ckpt.read_superblock(mem)
    # Epoch 0 (rolled back) left a batch-1 record with seq 17 in slot 1.
    old = encode_record(0, 1, 17, 0, 0, table_addr(0, 0), rng.randbytes(ROW_BYTES))
    mem.write(sb.slot_addr(1), old)
    rows = {r: mem.read(table_addr(0, r), ROW_BYTES) for r in range(3)}
    for seq in range(3):
        rec = encode_record(1, 1, seq, 0, seq, table_addr(0, seq), rows[seq])
        if seq == 1:    # torn: word 0 new (epoch 1), word 1 (batch, seq) stale
            rec = rec[:8] + old[8:]
        mem.write(sb.slot_addr(seq), rec)
    report = recover(mem)
    assert report.newest_seq == 2 and report.start_slot == 2
    assert [r[1] for r in report.restored] == [2, 0]
    assert report.order_ok
    assert all(mem.read(table_addr(0, r), ROW_BYTES) == rows[r] for r in range(3))


# --- Logger rules ---------------------------------------------------------------------------

def test_log_full_overflows_batch(seed):
    rng = random.Random(seed)
    geom = {**GEOM, "log_slots": 4}
    mem = Image()
    dev = Device(mem, rng, geom=geom)
    before = dev.tables()
    log = dev.log
    for r in range(4):
        assert dev.op(("capture", 1, 0, r)) is not None
    assert log.full and not log.log_full
    assert dev.op(("capture", 1, 0, 4)) is None
    assert log.log_full and 1 in log.overflowed
    # Further lines of the batch are discarded even if they would fit later.
    assert dev.op(("update", 1, 0, 0, rng.randbytes(ROW_BYTES))) == CkStatus.LOG_FULL
    assert dev.tables() == before, "an overflowed batch changes no row"
    # The driver commits the overflowed batch (nothing changed) and continues.
    assert dev.op(("commit", 1)) == CkStatus.OK
    assert not log.full and log.log_full, "LOG_FULL is sticky"
    assert dev.op(("capture", 2, 1, 0)) is not None
    assert dev.op(("update", 2, 1, 0, rng.randbytes(ROW_BYTES))) == CkStatus.OK
    assert log.records[-1].slot == 0 and log.records[-1].seq == 4


def test_log_full_with_two_live_batches(seed):
    """The log never wraps over a live record: batch 2's captures overflow while batch 1
    is uncommitted, and recovery restores both correctly."""
    rng = random.Random(seed)
    geom = {**GEOM, "log_slots": 4}
    mem = Image()
    dev = Device(mem, rng, geom=geom)
    before = dev.tables()
    for r in range(3):
        dev.op(("capture", 1, 0, r))
    for r in range(3):
        dev.op(("update", 1, 0, r, rng.randbytes(ROW_BYTES)))
    assert dev.op(("capture", 2, 0, 5)) is not None
    assert dev.op(("capture", 2, 0, 6)) is None and 2 in dev.log.overflowed
    assert dev.log.update_allowed(2) == CkStatus.LOG_FULL
    report = recover(mem)
    assert report.rolled_back == 4 and dev.tables() == before


def test_bad_batch_rules(seed):
    rng = random.Random(seed)
    mem = Image()
    dev = Device(mem, rng)
    log = dev.log
    assert log.update_allowed(1) == CkStatus.BAD_BATCH, "no capturing LOOKUP yet"
    log.lookup(1)
    assert log.update_allowed(1) == CkStatus.OK
    assert log.update_allowed(2) == CkStatus.BAD_BATCH, "not the last LOOKUP's batch"
    assert log.commit(1) == CkStatus.OK
    assert log.update_allowed(1) == CkStatus.BAD_BATCH, "already committed"
    word = mem.read(COMMIT_WORD_ADDR, 8)
    assert log.commit(1) == CkStatus.BAD_BATCH and log.commit(0) == CkStatus.BAD_BATCH
    assert mem.read(COMMIT_WORD_ADDR, 8) == word, "BAD_BATCH changes nothing"
    assert log.commit(3) == CkStatus.OK and log.committed == 3
    assert parse_commit_word(mem.read(COMMIT_WORD_ADDR, 8))["committed"] == 3


def test_filter_dedups_bounded(seed):
    rng = random.Random(seed)
    for filter_rows in (0, 1, 4, 64):
        mem = Image()
        dev = Device(mem, rng, filter_rows=filter_rows, geom={**GEOM, "log_slots": 64})
        keys = [(rng.randrange(TABLES), rng.randrange(ROWS)) for _ in range(40)]
        for t, r in keys:
            dev.op(("capture", 1, t, r))
        logged = [(rec.table_id, rec.row) for rec in dev.log.records]
        assert set(logged) == set(keys), "every distinct row is logged at least once"
        assert len(logged) + dev.log.filtered == len(keys)
        if filter_rows == 0:
            assert len(logged) == len(keys)
        # Same batch, a different batch is never filtered by an older entry.
        n = len(dev.log.records)
        t, r = keys[-1]
        dev.op(("capture", 2, t, r))
        assert len(dev.log.records) == n + 1


def test_mlp_slots_reported(seed):
    rng = random.Random(seed)
    mem = Image()
    dev = Device(mem, rng)
    assert recover(mem.copy()).mlp_slot is None
    p = {b: rng.randbytes(rng.randrange(1, 513)) for b in (1, 2, 3)}
    for b in (1, 2):
        dev.log.write_mlp(dev.log.mlp_target(), b, p[b])
    assert recover(mem.copy()).mlp_slot is None, "no batch committed: no slot is usable"
    mem.write(COMMIT_WORD_ADDR, commit_word(2, ckpt.read_commit_word(mem)[1]))
    report = recover(mem.copy())
    assert (report.mlp_slot, report.mlp_batch) == (1, 2)
    mem.write(COMMIT_WORD_ADDR, commit_word(0, ckpt.read_commit_word(mem)[1]))
    sb = ckpt.read_superblock(mem)
    assert ckpt.read_mlp_slot(mem, sb, 1).payload(mem, sb) == p[2]
    assert dev.log.mlp_target() == 0
    # Batch 3 into slot 0: crash while its payload is half written.
    data, hdr = encode_mlp_slot(3, p[3])
    for cut in ("payload", "header"):
        m = mem.copy()
        if cut == "payload":
            m.write(GEOM["mlp_slot0"], tear(m.read(GEOM["mlp_slot0"], len(data)), data, rng))
        else:
            m.write(GEOM["mlp_slot0"], data)
            a = GEOM["mlp_slot0"] + GEOM["mlp_slot_bytes"]
            m.write(a, tear(m.read(a, 64), hdr, rng))
        r = recover(m)
        # Batch 3 was never committed (C = 0 here): no slot ahead of the tables is named.
        assert r.mlp_slot is None and not r.mlp_ahead


def test_oracle_detects_wrong_tables():
    rng = random.Random(3)
    mem = Image()
    dev = Device(mem, rng)
    oracle = TrainingOracle({t: (table_addr(t), v) for t, v in dev.tables().items()})
    arr = np.frombuffer(dev.tables()[0], dtype=np.float32).copy()
    arr.view(np.uint32)[5] ^= 1
    oracle.after_batch(1, {0: arr})
    oracle.commit_completed(1)
    report = recover(mem)      # committed 0 < completed 1
    with pytest.raises(AssertionError, match="completed COMMIT"):
        oracle.check(mem, report)
    mem.write(COMMIT_WORD_ADDR, commit_word(1, report.epoch))
    with pytest.raises(AssertionError, match="table 0 differs"):
        oracle.check(mem, recover(mem))
    mem.write(table_addr(0), arr.tobytes())
    oracle.check(mem, recover(mem))


def test_pass1_start_with_two_live_batches(seed):
    """Two uncommitted batches and a torn header whose batch/seq word is stale from an
    older epoch: pass 1 checks whole records, so pass 2 starts at the newest durable
    record (batch 2, seq 3) and a row logged by both batches ends at its value before
    batch 1 (the contract's fix of the header-only pass 1)."""
    rng = random.Random(seed)
    mem = slot_image(committed=0, epoch=1)
    sb = ckpt.read_superblock(mem)
    a, b, c = table_addr(0, 0), table_addr(0, 1), table_addr(0, 2)
    pre = {x: mem.read(x, ROW_BYTES) for x in (a, b, c)}
    stale = encode_record(0, 1, 18, 1, 9, table_addr(1, 9), rng.randbytes(ROW_BYTES))
    mem.write(sb.slot_addr(2), stale)                   # left by epoch 0
    mem.write(sb.slot_addr(0), encode_record(1, 1, 0, 0, 0, a, pre[a]))
    mem.write(sb.slot_addr(1), encode_record(1, 1, 1, 0, 1, b, pre[b]))
    mem.write(a, rng.randbytes(ROW_BYTES))              # UPDATE of batch 1
    post_a = mem.read(a, ROW_BYTES)
    torn = encode_record(1, 2, 2, 0, 2, c, pre[c])      # batch 2, in flight, torn
    mem.write(sb.slot_addr(2), torn[:8] + stale[8:])
    mem.write(sb.slot_addr(3), encode_record(1, 2, 3, 0, 0, a, post_a))
    report = recover(mem)
    assert (report.start_slot, report.newest_seq) == (3, 3)
    assert [r[1] for r in report.restored] == [3, 1, 0] and report.order_ok
    assert mem.read(a, ROW_BYTES) == pre[a] != post_a
