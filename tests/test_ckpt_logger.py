# amaranth: UnusedElaboratable=no
"""UndoLogger (hw/ckpt/logger.py): random undo-capture streams logged to a
:class:`tb.pmem.PmemModel`; the PMEM image is decoded with a decoder written from
``docs/checkpoint.md`` (below) and compared record by record with a reference model of
the logger (dedup filter modelled exactly, space accounting, overflow, restart).

Items idle and AW/W are backpressured and Bs withheld at random (seeded; the seed is
printed and ``SEED=<n>`` replays it). Every cycle the bench checks that ``drained``
implies no write in flight, and for every write that no live record of another
``seq`` is overwritten.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

import pytest

from hw.ckpt.logger import UNDO_IN, UndoLogger, filter_index
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack
from .stream_rule import StreamRule

PMEM_SIZE = 1 << 20
ADDR_WIDTH = 20
LOG_BASE = 0x4_0000
FULL_STRB = (1 << 64) - 1

# --- decoder written from docs/checkpoint.md -------------------------------------------

LOG_MAGIC = 0x474F4C55          # "ULOG"
SUM64_KEY = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1


def sum64(words) -> int:
    """Sum mod 2**64, rotated left by one, XOR-ed with the key."""
    s = sum(words) & M64
    return (((s << 1) | (s >> 63)) & M64) ^ SUM64_KEY


def words(line: bytes) -> list[int]:
    return list(struct.unpack("<8Q", line))


def parse_header(line: bytes) -> dict:
    magic, epoch, n, rsvd0, batch, seq, table, rsvd1, row, addr = struct.unpack(
        "<IHBBIIHHIQ", line[:32])
    return {"magic": magic, "epoch": epoch, "n": n, "rsvd0": rsvd0, "batch": batch,
            "seq": seq, "table": table, "rsvd1": rsvd1, "row": row, "addr": addr,
            "rsvd2": line[32:56], "check": struct.unpack("<Q", line[56:64])[0]}


def read_slot(model: PmemModel, slot: int, slot_lines: int) -> tuple[dict, list[int]]:
    """The header of ``slot`` and its payload lines (as 512-bit integers)."""
    base = LOG_BASE + slot * slot_lines * 64
    hdr = parse_header(model.read(base, 64))
    n = hdr["n"] if 1 <= hdr["n"] < slot_lines else 0
    payload = [int.from_bytes(model.read(base + 64 * (1 + k), 64), "little") for k in range(n)]
    return hdr, payload


def record_valid(model: PmemModel, slot: int, slot_lines: int, epoch: int) -> bool:
    hdr, payload = read_slot(model, slot, slot_lines)
    if hdr["magic"] != LOG_MAGIC or hdr["epoch"] != epoch or not 1 <= hdr["n"] < slot_lines:
        return False
    base = LOG_BASE + slot * slot_lines * 64
    ws = words(model.read(base, 64))[:7]
    for p in payload:
        ws += [(p >> (64 * i)) & M64 for i in range(8)]
    return hdr["check"] == sum64(ws)


# --- reference model -------------------------------------------------------------------

@dataclass
class Row:
    batch: int
    table: int
    row: int
    addr: int
    lines: list[int]

    @property
    def key(self):
        return (self.batch, self.table, self.row)


@dataclass
class Model:
    """The logger as the contract and the block's docstring describe it."""
    slots: int
    slot_lines: int
    filter_rows: int
    epoch: int
    seq: int = 0
    committed: int = 0
    overflow: bool = False
    overflow_batch: int = 0
    cur_batch: int | None = None
    tracker: list = field(default_factory=list)       # (batch, first seq)
    filt: dict = field(default_factory=dict)
    image: dict = field(default_factory=dict)         # slot -> record dict
    written: list = field(default_factory=list)       # every record, in order
    captured: dict = field(default_factory=dict)      # key -> times captured

    def live(self):
        return [(b, f) for b, f in self.tracker if b > self.committed]

    def row(self, r: Row) -> None:
        self.captured[r.key] = self.captured.get(r.key, 0) + 1
        if self.overflow and r.batch == self.overflow_batch:
            return
        idx = filter_index(r.table, r.row, self.filter_rows)
        if self.filt.get(idx) == r.key:
            return
        live = self.live()
        new = self.cur_batch != r.batch
        if ((live and self.seq - live[0][1] >= self.slots) or (new and len(live) >= 4)
                or not 1 <= len(r.lines) < self.slot_lines):
            self.overflow, self.overflow_batch = True, r.batch
            return
        self.filt[idx] = r.key
        if new:
            self.tracker = [*live, (r.batch, self.seq)]
            self.cur_batch = r.batch
        rec = {"batch": r.batch, "seq": self.seq, "table": r.table, "row": r.row,
               "addr": r.addr, "n": len(r.lines), "epoch": self.epoch, "payload": r.lines}
        self.image[self.seq % self.slots] = rec
        self.written.append(rec)
        self.seq += 1

    def commit(self, b: int) -> None:
        self.committed = b
        self.tracker = self.live()
        if self.overflow and b >= self.overflow_batch:
            self.overflow = False

    def restart(self, epoch: int) -> None:
        self.seq, self.committed, self.overflow, self.overflow_batch = 0, 0, False, 0
        self.cur_batch, self.tracker, self.filt, self.epoch = None, [], {}, epoch

    def status(self) -> dict:
        live = self.live()
        full = bool(live) and self.seq - live[0][1] >= self.slots
        return {"overflow": int(self.overflow),
                "overflow_batch": self.overflow_batch if self.overflow else None,
                "full": int(full), "seq": self.seq}


# --- stimulus --------------------------------------------------------------------------

@dataclass
class Traffic:
    idle: float = 0.0
    aw_bp: float = 0.0
    w_bp: float = 0.0
    b_idle: float = 0.0


SMOOTH = Traffic()
ROUGH = Traffic(idle=0.3, aw_bp=0.3, w_bp=0.3, b_idle=0.3)


class Tables:
    """A few tables with their own lines per row and base address."""

    def __init__(self, rng: random.Random, count: int, max_lines: int):
        self.rng = rng
        self.lines = [rng.randint(1, max_lines) for _ in range(count)]
        self.base = [0x1000 * (t + 1) * 64 for t in range(count)]

    def capture(self, batch: int, table: int, row: int, content: dict) -> Row:
        n = self.lines[table]
        key = (batch, table, row)
        if key not in content:      # rows keep their content within a batch
            content[key] = [self.rng.getrandbits(512) for _ in range(n)]
        return Row(batch, table, row, self.base[table] + row * n * 64, content[key])


def batch_rows(rng: random.Random, tables: Tables, batch: int, rows: int,
               row_range: int, content: dict) -> list[Row]:
    out = []
    for _ in range(rows):
        t = rng.randrange(len(tables.lines))
        out.append(tables.capture(batch, t, rng.randrange(row_range), content))
    return out


# --- bench -----------------------------------------------------------------------------

@dataclass
class Result:
    cycles: int
    records: int
    status: list            # DUT status at every "drain" step
    ready_low: int          # cycles i_undo.valid was high and ready low
    first_xfer: int | None
    last_xfer: int | None
    drained_at: int
    aw_held: int = 0        # AW transfers while ``hold`` was high


def run(dut: UndoLogger, model: PmemModel, script: list, *, log2: int, slot_lines: int,
        epoch: int, seed: int, traffic: Traffic, enable: bool = True,
        hold=None, max_cycles: int = 200_000) -> Result:
    """``script``: ``("row", Row)``, ``("commit", b)`` (pulsed once the items before it
    were taken), ``("drain",)`` (wait for ``drained``, record the status) and
    ``("restart", epoch)`` (wait for ``drained``, pulse ``restart``, new epoch).
    ``hold(cycle)``: the ``hold`` input in that cycle (default low)."""
    rng = random.Random(seed)
    slots = 1 << log2
    steps = []
    for step in script:
        if step[0] == "row":
            r = step[1]
            for k, line in enumerate(r.lines):
                steps.append(("item", pack(UNDO_IN, batch_id=r.batch, table_id=r.table,
                                                row=r.row, line=k, data=line,
                                                row_addr=r.addr, n_lines=len(r.lines))))
        else:
            steps.append(step)
    steps.append(("drain",))
    steps.reverse()
    checks = {n: StreamRule(n) for n in ("AW", "W")}
    p = dut.pmem
    res = Result(0, 0, [], 0, None, None, 0)
    state = {"committed": 0, "epoch": epoch}
    shadow: dict[int, tuple] = {}       # slot -> (batch, epoch, seq) of its last header
    aw_q: list[int] = []
    w_q: list[int] = []
    errors: list[str] = []

    def pair() -> None:
        while aw_q and w_q:
            addr, wdata = aw_q.pop(0), w_q.pop(0)
            off = addr - LOG_BASE
            assert 0 <= off < slots * slot_lines * 64 and off % 64 == 0, hex(addr)
            slot, line = divmod(off // 64, slot_lines)
            old = shadow.get(slot)
            hdr = parse_header(wdata.to_bytes(64, "little")) if line == 0 else None
            if (old is not None and old[0] > state["committed"] and old[1] == state["epoch"]
                    and (hdr is None or hdr["seq"] != old[2])):
                errors.append(f"write to slot {slot} line {line} over live record {old}")
            if hdr is not None:
                shadow[slot] = (hdr["batch"], hdr["epoch"], hdr["seq"])

    async def bench(ctx):
        ctx.set(dut.enable, enable)
        ctx.set(dut.log_base, LOG_BASE)
        ctx.set(dut.log_slots_log2, log2)
        ctx.set(dut.slot_lines, slot_lines)
        ctx.set(dut.epoch, epoch)
        cur = None
        b = None
        cycle = 0
        quiet_after = 0         # drained counts only from this cycle on
        restart = False
        while True:
            assert cycle < max_cycles, f"timeout at {len(steps)} steps left"
            held = bool(hold(cycle)) if hold is not None else False
            ctx.set(dut.hold, held)
            ctx.set(dut.commit, 0)
            ctx.set(dut.restart, restart)
            restart = False
            if cur is None and steps and steps[-1][0] == "item":
                if not rng.random() < traffic.idle:
                    cur = steps.pop()[1]
                    ctx.set(dut.i_undo.payload.as_value(), cur)
            elif cur is None and steps and steps[-1][0] == "commit":
                batch = steps.pop()[1]
                ctx.set(dut.commit, 1)
                ctx.set(dut.commit_batch, batch)
                state["committed"] = batch
                quiet_after = cycle + 2
            ctx.set(dut.i_undo.valid, cur is not None)
            ctx.set(p.awready, not rng.random() < traffic.aw_bp)
            ctx.set(p.wready, not rng.random() < traffic.w_bp)
            if b is None and not rng.random() < traffic.b_idle:
                b = model.b_resp(cycle)
                if b is not None:
                    ctx.set(p.bid, b[0])
                    ctx.set(p.bresp, b[1])
            ctx.set(p.bvalid, b is not None)
            (_, _, i_ready, drained, records, ovf, ovf_b, full, seq, awvalid, awready, wvalid,
             wready, wdata, wstrb, wlast, bready, arvalid,
             *aw) = await ctx.tick().sample(
                dut.i_undo.ready, dut.drained, dut.records, dut.overflow, dut.overflow_batch,
                dut.full, dut.seq, p.awvalid, p.awready, p.wvalid, p.wready, p.wdata,
                p.wstrb, p.wlast, p.bready, p.arvalid,
                p.awid, p.awaddr, p.awlen, p.awsize, p.awburst)
            aw = tuple(aw)
            assert not arvalid
            if drained:
                assert model.outstanding[1] == 0, f"drained with a write in flight ({cycle})"
            if cur is not None:
                if i_ready:
                    res.first_xfer = cycle if res.first_xfer is None else res.first_xfer
                    res.last_xfer = cycle
                    quiet_after = cycle + 1
                    cur = None
                else:
                    res.ready_low += 1
            res.records += records
            checks["AW"].observe(cycle, awvalid, awready, aw)
            checks["W"].observe(cycle, wvalid, wready, (wdata, wstrb, wlast))
            if awvalid and awready:
                res.aw_held += held
                assert aw[2] == 0 and aw[0] == 0
                model.accept_aw(aw[0], aw[1], aw[2], cycle, size=aw[3], burst=aw[4])
                aw_q.append(aw[1])
            if wvalid and wready:
                assert wstrb == FULL_STRB and wlast
                model.accept_w(wdata, wstrb, True, cycle)
                w_q.append(wdata)
            pair()
            if b is not None and bready:
                model.b_accept(cycle)
                b = None
            if cur is None and steps and steps[-1][0] in ("drain", "restart") \
                    and drained and cycle > quiet_after:
                step = steps.pop()
                if step[0] == "drain":
                    res.status.append({"overflow": ovf, "overflow_batch": ovf_b if ovf else None,
                                       "full": full, "seq": seq})
                    if not steps:
                        res.drained_at = cycle
                        cycle += 1
                        break
                else:
                    restart = True
                    ctx.set(dut.epoch, step[1])
                    state["epoch"] = step[1]
                    state["committed"] = 0
                    quiet_after = cycle + 2
            cycle += 1
        res.cycles = cycle

    simulate(dut, bench)
    errors += [e for c in checks.values() for e in c.errors]
    assert not errors, "\n".join(errors[:10])
    return res


def expected(script: list, *, log2: int, slot_lines: int, filter_rows: int,
             epoch: int) -> tuple[Model, list]:
    ref = Model(1 << log2, slot_lines, filter_rows, epoch)
    status = []
    for step in script:
        if step[0] == "row":
            ref.row(step[1])
        elif step[0] == "commit":
            ref.commit(step[1])
        elif step[0] == "drain":
            status.append(ref.status())
        else:
            ref.restart(step[1])
    status.append(ref.status())
    return ref, status


def check_image(model: PmemModel, ref: Model, slot_lines: int) -> None:
    """Every slot holds exactly the model's last record for it (or nothing)."""
    for slot in range(ref.slots):
        hdr, payload = read_slot(model, slot, slot_lines)
        want = ref.image.get(slot)
        if want is None:
            assert hdr["magic"] == 0 and hdr["check"] == 0, f"slot {slot} written"
            continue
        got = {k: hdr[k] for k in ("batch", "seq", "table", "row", "addr", "n", "epoch")}
        assert got == {k: want[k] for k in got}, f"slot {slot}: {got} != {want}"
        assert hdr["magic"] == LOG_MAGIC and hdr["rsvd0"] == 0 and hdr["rsvd1"] == 0
        assert hdr["rsvd2"] == bytes(24)
        assert payload == want["payload"], f"slot {slot}: payload differs"
        assert record_valid(model, slot, slot_lines, want["epoch"]), f"slot {slot}: check"


def pmem(seed: int, latency: int = 8, jitter: int = 12) -> PmemModel:
    return PmemModel(size=PMEM_SIZE, rng=random.Random(seed),
                     timing=PmemTiming(write_latency=latency, jitter=jitter,
                                       peak_lines_per_cycle=4))


def check_run(dut: UndoLogger, script: list, *, log2: int, slot_lines: int, seed: int,
              traffic: Traffic, epoch: int = 0x1234) -> tuple[Model, Result, PmemModel]:
    mem = pmem(seed)
    ref, status = expected(script, log2=log2, slot_lines=slot_lines,
                           filter_rows=dut.filter_rows, epoch=epoch)
    res = run(dut, mem, script, log2=log2, slot_lines=slot_lines, epoch=epoch, seed=seed,
              traffic=traffic)
    assert res.status == status
    assert res.records == len(ref.written)
    check_image(mem, ref, slot_lines)
    return ref, res, mem


# --- tests -----------------------------------------------------------------------------

@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
def test_ring_wraps_with_duplicates_and_evictions(traffic, seed):
    """Many batches over a small ring: slots are reused once their batch is committed
    (sometimes while the next batch streams); a small filter evicts, so some duplicates
    are logged again, exactly as modelled."""
    rng = random.Random(seed)
    slot_lines = 6
    tables = Tables(rng, 3, slot_lines - 1)
    dut = UndoLogger(addr_width=ADDR_WIDTH, id_width=2, max_slot_lines=slot_lines,
                     filter_rows=8, fifo_lines=16)
    content: dict = {}
    script: list = []
    pending = None
    # 8 batches; for about 1 seed in 350 the filter skips no duplicate in them: then more
    # batches (same seed) until the model has wrapped the ring and skipped a duplicate.
    for batch in range(1, 41):
        if batch > 8:
            ref, _ = expected(script, log2=5, slot_lines=slot_lines, filter_rows=8,
                              epoch=0x1234)
            if ref.seq > 32 and len(ref.written) < sum(ref.captured.values()):
                break
        rows = batch_rows(rng, tables, batch, rng.randint(4, 12), 10, content)
        at = rng.randrange(len(rows) + 1)
        for i, r in enumerate(rows):
            if i == at and pending is not None:
                script.append(("commit", pending))      # while this batch streams
                pending = None
            script.append(("row", r))
        if pending is not None:
            script.append(("commit", pending))
        script.append(("drain",))
        if rng.random() < 0.5:
            script.append(("commit", batch))
            pending = None
        else:
            pending = batch
    # 2 batches of <= 12 records live at most: never full, whatever the commit timing.
    ref, res, _ = check_run(dut, script, log2=5, slot_lines=slot_lines, seed=seed,
                            traffic=traffic)
    assert ref.seq > 32, "the ring did not wrap"
    assert not any(s["overflow"] for s in res.status)
    assert len(ref.written) < sum(ref.captured.values()), "no duplicate skipped"
    for key, times in ref.captured.items():
        logged = sum(1 for r in ref.written if (r["batch"], r["table"], r["row"]) == key)
        assert 1 <= logged <= times


def test_every_distinct_row_once_without_evictions(seed):
    """A filter larger than the rows in play: each distinct row exactly one record, in
    arrival order."""
    rng = random.Random(seed)
    slot_lines = 9
    tables = Tables(rng, 4, slot_lines - 1)
    dut = UndoLogger(addr_width=ADDR_WIDTH, id_width=1, max_slot_lines=slot_lines,
                     filter_rows=256, fifo_lines=8)
    content: dict = {}
    script: list = []
    order = []
    for batch in (1, 2, 3):
        rows = batch_rows(rng, tables, batch, 25, 6, content)
        for r in rows:
            script.append(("row", r))
            if r.key not in order:
                order.append(r.key)
        script += [("drain",), ("commit", batch)]
    # No two keys of a batch may collide in the filter for exactness.
    for batch in (1, 2, 3):
        idx = [filter_index(t, r, 256) for b, t, r in order if b == batch]
        if len(set(idx)) != len(idx):
            pytest.skip("hash collision in this draw")
    ref, _, _ = check_run(dut, script, log2=7, slot_lines=slot_lines, seed=seed,
                          traffic=ROUGH)
    assert [(r["batch"], r["table"], r["row"]) for r in ref.written] == order
    assert [r["seq"] for r in ref.written] == list(range(len(order)))


@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
def test_back_to_back_duplicates(traffic, seed):
    """One-line rows repeated back to back: the repeat's filter lookup happens in the
    cycle the first one is entered (the read must see that write)."""
    rng = random.Random(seed)
    tables = Tables(rng, 2, 1)
    tables.lines = [1, 2]
    dut = UndoLogger(addr_width=ADDR_WIDTH, id_width=1, max_slot_lines=3, filter_rows=64,
                     fifo_lines=8)
    content: dict = {}
    script: list = []
    for batch in (1, 2):
        for _ in range(20):
            r = tables.capture(batch, rng.randrange(2), rng.randrange(40), content)
            script += [("row", r)] * rng.randint(1, 3)
        script += [("drain",), ("commit", batch)]
    ref, _, _ = check_run(dut, script, log2=7, slot_lines=3, seed=seed, traffic=traffic)
    assert len(ref.written) < sum(ref.captured.values())


def test_overflow_then_commit_then_restart(seed):
    """A batch larger than the log overflows: no live record is overwritten, the rest of
    the batch is discarded; after its commit the next batch logs again; a later batch
    overflows too; restart begins at seq 0 with the new epoch."""
    rng = random.Random(seed)
    slot_lines = 4
    tables = Tables(rng, 2, slot_lines - 1)
    dut = UndoLogger(addr_width=ADDR_WIDTH, id_width=3, max_slot_lines=slot_lines,
                     filter_rows=64, fifo_lines=4)
    content: dict = {}
    distinct = [tables.capture(1, t, r, content) for t in range(2) for r in range(8)]
    rng.shuffle(distinct)
    script = [("row", r) for r in distinct[:12]] + [("drain",)]
    script += [("row", r) for r in distinct[12:]] + [("drain",), ("commit", 1), ("drain",)]
    b2 = [tables.capture(2, t, r, content) for t in range(2) for r in range(3)]
    script += [("row", r) for r in b2] + [("drain",)]
    # Batch 3 without committing 2: 2 slots left, then overflow.
    b3 = [tables.capture(3, 0, r, content) for r in range(5)]
    script += [("row", r) for r in b3] + [("drain",)]
    script += [("commit", 3), ("drain",), ("restart", 0x4321)]
    b4 = [tables.capture(4, 1, r, content) for r in range(3)]
    script += [("row", r) for r in b4] + [("drain",)]
    _ref, res, mem = check_run(dut, script, log2=3, slot_lines=slot_lines, seed=seed,
                              traffic=ROUGH)
    assert res.status[0] == {"overflow": 1, "overflow_batch": 1, "full": 1, "seq": 8}
    assert res.status[1]["overflow"] == 1
    assert res.status[2] == {"overflow": 0, "overflow_batch": None, "full": 0, "seq": 8}
    assert res.status[4] == {"overflow": 1, "overflow_batch": 3, "full": 1, "seq": 16}
    assert res.status[6]["seq"] == 3 and res.status[6]["overflow"] == 0
    # After restart: slots 0..2 hold batch 4 in epoch 0x4321, the rest batch 2/3 records
    # of the old epoch (invalid now).
    for slot in range(8):
        assert record_valid(mem, slot, slot_lines, 0x4321) == (slot < 3)


def test_disabled_drops_everything(seed):
    rng = random.Random(seed)
    tables = Tables(rng, 2, 3)
    dut = UndoLogger(addr_width=ADDR_WIDTH, id_width=1, max_slot_lines=4, fifo_lines=4)
    content: dict = {}
    script = [("row", r) for r in batch_rows(rng, tables, 1, 10, 5, content)]
    mem = pmem(seed)
    res = run(dut, mem, script, log2=3, slot_lines=4, epoch=1, seed=seed, traffic=ROUGH,
              enable=False)
    assert res.records == 0 and res.status[-1]["seq"] == 0
    assert mem.stats.writes == 0


@pytest.mark.parametrize("rows", [10, 60])
def test_hold_defers_records(rows, seed):
    """``hold`` high while the rows stream in (and 100 cycles longer): with fewer lines
    than three quarters of the FIFO no record is written until it falls, and the input
    never waits; with many more, records are written all the same once the FIFO is three
    quarters full (the input is never blocked for good), but only that excess. Either
    way every row is logged as without ``hold``."""
    rng = random.Random(seed)
    fifo = 32
    dut = UndoLogger(addr_width=ADDR_WIDTH, id_width=1, max_slot_lines=2, filter_rows=256,
                     fifo_lines=fifo)
    rows_ = [Row(1, 0, r, 64 * r, [rng.getrandbits(512)]) for r in range(rows)]
    script = [("row", r) for r in rows_]
    state = {"until": None}

    def hold(cycle):
        # High until 100 cycles after the estimated end of the input, then low.
        if state["until"] is None:
            state["until"] = cycle + 4 * rows + 100
        return cycle < state["until"]

    ref, status = expected(script, log2=7, slot_lines=2, filter_rows=256, epoch=1)
    mem = pmem(seed)
    res = run(dut, mem, script, log2=7, slot_lines=2, epoch=1, seed=seed, traffic=ROUGH,
              hold=hold)
    assert res.status == status and res.records == len(ref.written) == rows
    check_image(mem, ref, 2)
    assert res.last_xfer < state["until"], "the input did not finish while held"
    high_water = (3 * fifo + 3) // 4
    if rows < high_water:
        assert res.aw_held == 0, f"{res.aw_held} writes while held"
        assert res.ready_low == 0
    else:
        # One-line rows: two writes each; at least high_water - 1 lines stay buffered.
        assert 0 < res.aw_held <= 2 * (rows - high_water + 2), res.aw_held


@pytest.mark.long
def test_throughput(seed):
    """Distinct rows back to back, PMEM always ready: one write per cycle (a row of n
    lines takes n + 1 cycles), and a burst no longer than the FIFO is taken at one line
    per cycle."""
    rng = random.Random(seed)
    slot_lines, n = 5, 4
    dut = UndoLogger(addr_width=ADDR_WIDTH, id_width=1, max_slot_lines=slot_lines,
                     filter_rows=256, fifo_lines=64)
    rows = [Row(1, 0, r, 64 * n * r, [rng.getrandbits(512) for _ in range(n)])
            for r in range(100)]
    script = [("row", r) for r in rows]
    mem = pmem(seed, latency=20, jitter=0)
    res = run(dut, mem, script, log2=7, slot_lines=slot_lines, epoch=1, seed=seed,
              traffic=SMOOTH)
    writes = len(rows) * (n + 1)
    span = res.drained_at - res.first_xfer
    rate = writes / span
    print(f"{writes} writes in {span} cycles: {rate:.3f} writes/cycle, "
          f"{len(rows) * n / span:.3f} lines/cycle; input stalled {res.ready_low} cycles")
    assert rate > 0.9
    # A burst of 60 lines (15 rows) is taken without a stall.
    mem = pmem(seed, latency=20, jitter=0)
    res = run(dut, mem, script[:15], log2=7, slot_lines=slot_lines, epoch=1, seed=seed,
              traffic=SMOOTH)
    assert res.ready_low == 0 and res.last_xfer - res.first_xfer == 15 * n - 1


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"addr_width": 13}, "addr_width must be an integer from 14 to 64, not 13"),
    ({"id_width": 0}, "id_width must be an integer from 1 to 16, not 0"),
    ({"max_slot_lines": 1}, "max_slot_lines must be an integer from 2 to 255, not 1"),
    ({"filter_rows": 24}, "filter_rows must be a power of two, not 24"),
    ({"filter_rows": 1}, "filter_rows must be an integer from 2 to 4096, not 1"),
    ({"fifo_lines": 1}, "fifo_lines must be an integer from 2 to 4096, not 1"),
])
def test_rejects_bad_parameters(kwargs, message):
    args = {"addr_width": ADDR_WIDTH, "id_width": 4, "max_slot_lines": 9} | kwargs
    with pytest.raises(ValueError, match=message):
        UndoLogger(**args)


def test_verilog_lints_clean(tmp_path):
    dut = UndoLogger(addr_width=48, id_width=4, max_slot_lines=9, filter_rows=64,
                     fifo_lines=32)
    assert_lints_clean(dut, "undo_logger_a48_f64", tmp_path)
