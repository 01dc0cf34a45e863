"""cocotb tests of the checkpoint logger and recovery in the whole device: the crash
campaign of ``docs/checkpoint.md`` and the bad inputs around it.

The campaign formats the device, creates small random tables and runs recovery (which
turns checkpointing on). A crash point then runs a training-like window of ``BATCHES``
batches from the committed one (per batch: a capturing LOOKUP per table, an UPDATE per
table, COMMIT, MLP_CHECKPOINT of fresh random "MLP parameters" with relaxation K = 1)
while the power fails at a random cycle (unacked PMEM writes dropped, applied or torn at
8-byte granularity, seeded); reset; recovery; then the invariants of ``docs/architecture.md`` are
checked bit for bit:

* the committed batch is at least the last COMMIT that completed before the crash and
  at most the last one issued;
* every table equals the golden model after exactly that batch (row padding included),
  and recovery changed no line of the image outside the tables and the commit word;
* the MLP slot recovery names holds exactly the parameters staged for its batch (payload
  and the contract's header), that batch is not after the committed one, not older than
  a copy seen finished before the crash, and lags the committed batch by at most K;
* the engine works afterwards: the next point trains on from the recovered state, as a
  resumed training does (after re-checkpointing the MLP if its slot is behind the
  committed batch), so points chain through log-ring wrap-around and MLP-slot reuse;
  every ``FRESH_EVERY`` points the device is formatted again with new tables, and one
  last batch after the last point must commit and match the model.

Of every ``DIRECTED_EVERY`` points, those named in ``DIRECTED`` fail the power while a
write of a short phase (commit word, MLP copy, table row, undo record) is in flight; the
others at a random cycle. Each point records the phase its failure caught (from the
PMEM model's report), and each run must have caught every directed phase among its
points.

A point survives only if all of its checks pass; a failed point is counted, recorded
(point, crash cycle, seed, the first line of the failure) and the campaign goes on from
a freshly formatted device; the test fails at the end if any point failed.

Test parameters: ``n_points`` (crash points per campaign test); ``part`` and ``parts``
run points ``n_points * part // parts`` up to the next part's first of them, so the
points of one campaign spread over several simulator runs (each formats the device and
measures the window afresh; default: every point in one run); ``inject_fault`` (a point
number): that point's tables are changed behind the device after its recovery, so its
check must fail, and the test passes only if exactly that point is counted lost (the
campaign's check of its own counting).
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
import numpy as np

from hw.ckpt.logger import filter_index
from hw.engine.descriptor import DescKind, PoolMode, Status
from hw.engine.engine import PMEM_KIND_CSRS
from sim import ckpt
from sim import embedding as emb
from sim.embedding import BF16, FP32, LINE_BYTES
from tb.ckpt_driver import CkptDriver
from tb.device_tb import DeviceTB
from tb.engine_driver import Batch, random_table
from tb.groups import group

#: Batches per crash window, tables, bags per batch and rows per bag.
BATCHES, TABLES, BAGS, POOLING = 2, 2, 4, 3
#: Crash points between two formats of the device (new tables).
FRESH_EVERY = 10
#: Directed crash points: point ``p`` with ``p % DIRECTED_EVERY`` a key of ``DIRECTED``
#: fails the power while a write of that (short) phase is in flight; the other points at
#: a random cycle.
DIRECTED_EVERY = 10
DIRECTED = {1: "commit word", 3: "MLP copy", 5: "table rows", 7: "undo records"}
#: The campaign's MLP relaxation (CK_MLP_K) and largest MLP checkpoint (bytes).
MLP_K, MLP_BYTES = 1, 1024


def _fixed_bags(rng, rows: int, bags: int = BAGS, pooling: int = POOLING) -> Batch:
    idx = emb.power_law_rows(rng, bags * pooling, rows, 1.05).astype(np.int32)
    return Batch(idx, (np.arange(bags) * pooling).astype(np.int32))


class Campaign:
    """One device, one driver and the golden tables per batch of the current point."""

    def __init__(self, tb: DeviceTB, *, log_slots: int = 32):
        self.tb = tb
        self.rng = np.random.default_rng(tb.rng.getrandbits(64))
        self.drv = CkptDriver(tb, log_slots=log_slots, mlp_bytes=MLP_BYTES)
        self.tables = []
        self.golden: dict[int, list[np.ndarray]] = {}
        self.issued = self.completed = 0
        self.mlp_seen = 0               # newest MLP copy seen finished before the crash
        self.corrupt_after_recovery = False

    async def fresh(self) -> None:
        """Reset, format, new tables, ``CK_MLP_K``, recovery (checkpointing on)."""
        drv = self.drv
        await self.tb.reset_device()
        drv.heap.release(drv.layout_end)
        drv.reset_state()
        await drv.setup()
        drv.format()
        dims = [d for d in (16, 40, 64) if d <= self.tb.config.engine_max_dim]
        self.tables = []
        for i in range(TABLES):
            dtype = BF16 if i % 2 else FP32
            data = random_table(self.rng, 16, dims[i % len(dims)], dtype)
            self.tables.append(await drv.add_table(data, rng=self.rng))
        self.mark = drv.heap.next
        await self.tb.csr.write("CK_MLP_K", MLP_K)
        res = await drv.recover()
        assert res.status == 0 and res.committed == 0 and res.rolled_back == 0, res
        assert res.mlp_slot == 3 and res.mlp_batch == 0, res
        self.golden = {0: [t.data for t in self.tables]}
        self.issued = self.completed = self.mlp_seen = 0

    async def train(self, first: int, last: int, *, mlp: bool = True) -> None:
        """Batches ``first..last``: LOOKUPs (capturing), UPDATEs, COMMIT and (with
        ``mlp``) MLP_CHECKPOINT, one doorbell and wait per batch; ``completed`` follows
        the COMMITs seen done."""
        drv = self.drv
        for b in range(first, last + 1):
            drv.heap.release(self.mark)
            batches = [_fixed_bags(self.rng, t.rows) for t in self.tables]
            for t, batch in zip(self.tables, batches, strict=True):
                await drv.lookup(t, batch, mode=PoolMode.SUM, batch_id=b, capture_undo=True)
            for t, batch in zip(self.tables, batches, strict=True):
                grads = (self.rng.standard_normal((batch.num_bags, t.dim)) * 0.5).astype(
                    np.float32)
                exp = await drv.update(t, batch, grads, batch_id=b)
                assert exp.status is Status.OK, exp.status
            self.golden[b] = [t.data for t in self.tables]
            await drv.plain(DescKind.COMMIT, batch_id=b)
            if mlp:
                exp = await drv.mlp_checkpoint(b, self.mlp_params())
                assert exp.status is Status.OK, exp.status
            self.issued = b
            await drv.run()
            self.completed = b

    def mlp_params(self, nbytes: int | None = None) -> bytes:
        """Random "MLP parameters" of ``nbytes`` (default: 1 to 16 random lines)."""
        if nbytes is None:
            nbytes = LINE_BYTES * int(self.rng.integers(1, MLP_BYTES // LINE_BYTES + 1))
        return self.rng.bytes(nbytes)

    def check_tables(self, batch: int) -> None:
        if self.corrupt_after_recovery:     # the campaign's self-check (``inject_fault``)
            self.corrupt_after_recovery = False
            t = self.tables[0]
            line = self.tb.pmem.read(t.base, LINE_BYTES)
            self.tb.pmem.write(t.base, bytes([line[0] ^ 1]) + line[1:])
        for t, want in zip(self.tables, self.golden[batch], strict=True):
            got = self.tb.pmem.read(t.base, t.nbytes)
            if got != emb.pack_rows(want, base=t.image0):
                stride = emb.lines_per_row(t.dim, t.data.dtype) * LINE_BYTES
                img = emb.pack_rows(want, base=t.image0)
                bad = [r for r in range(t.rows)
                       if got[r * stride:(r + 1) * stride] != img[r * stride:(r + 1) * stride]]
                raise AssertionError(f"table {t.table_id} differs from the golden model after "
                                     f"batch {batch} in rows {bad}")

    async def crash(self) -> set[str]:
        """Power failure now (once the CSR port is idle), then reset. Returns what the
        failure caught (:meth:`caught`)."""
        tb = self.tb
        await tb.loop.wait_until(lambda: tb.csr.axil.idle(), timeout=1000, what="CSR idle")
        self.mlp_seen = max(self.mlp_seen, self.drv.mlp_done)
        _, report = await tb.reset_device(power_fail=True)
        self.drv.reset_state()
        await self.drv.setup()
        return self.caught(report)

    def in_table(self, addr: int) -> bool:
        return any(t.base <= addr < t.base + t.nbytes for t in self.tables)

    def region(self, addr: int) -> str:
        """What the PMEM line at ``addr`` belongs to."""
        drv = self.drv
        if addr // LINE_BYTES == 1:
            return "commit word"
        if self.in_table(addr):
            return "table rows"
        log_end = drv.log_base + drv.log_slots * drv.slot_lines * LINE_BYTES
        if drv.log_base <= addr < log_end:
            return "undo records"
        if any(base <= addr < base + drv.mlp_bytes + LINE_BYTES for base in drv.mlp):
            return "MLP copy"
        return "other writes"

    def caught(self, report) -> set[str]:
        """What a power failure caught, from the PMEM model's report: the kinds
        (:meth:`region`) of the writes in flight, else ``reads only`` (gather, scatter or
        descriptor reads in flight) or ``idle`` (nothing in flight: the host was polling
        or between doorbells)."""
        kinds = {self.region(w.addr) for w in report.writes}
        return kinds or {"reads only" if report.reads_lost else "idle"}

    @staticmethod
    def phase(caught: set[str]) -> str:
        """One phase for the histogram: the most urgent kind caught (the commit word,
        then the MLP copy, the table rows, the undo records, any other write)."""
        for kind in ("commit word", "MLP copy", "table rows", "undo records", "other writes",
                     "reads only"):
            if kind in caught:
                return kind
        return "idle"

    def writes_pending(self, kind: str) -> bool:
        """A write of ``kind`` (:meth:`region`) is in flight and the CSR port is idle (so
        that :meth:`crash` fails the power at once)."""
        return (self.tb.csr.axil.idle()
                and any(self.region(a) == kind for a in self.tb.pmem.pending_write_addrs()))

    def check_recovery_writes(self, before: dict[int, bytes]) -> None:
        """Recovery writes only table rows (its restores) and the commit word's line
        (``docs/checkpoint.md``, "Recovery"): every other line of the image (superblock,
        log ring, MLP slots, descriptor ring, staging, the rest) is as it was before it."""
        after = self.tb.pmem.snapshot()
        zero = bytes(LINE_BYTES)
        stray = [a for a in sorted(before.keys() | after.keys())
                 if before.get(a, zero) != after.get(a, zero)
                 and self.region(a) not in ("table rows", "commit word")]
        assert not stray, (f"recovery changed {len(stray)} lines outside the tables and the "
                           f"commit word, first at {[hex(a) for a in stray[:4]]}")

    async def measure_recovery(self) -> int:
        """Cycles a recovery of the PMEM image as it is takes (from the ``CK_CMD`` write
        to ``CK_STATUS`` seen done, polled every 16 cycles); then the device is reset and
        the image put back as it was, so that a recovery can start again from the same
        state."""
        tb = self.tb
        image = tb.pmem.snapshot()
        res = await self.drv.recover(poll=16)
        await tb.reset_device()
        tb.pmem.restore(image)
        self.drv.reset_state()
        await self.drv.setup()
        return res.cycles

    async def recover_and_check(self) -> int:
        before = self.tb.pmem.snapshot()
        res = await self.drv.recover()
        self.tb.log.debug("recovery: %s", res)
        assert res.status == 0, f"recovery failed: {res}"
        self.check_recovery_writes(before)
        c = res.committed
        assert self.completed <= c <= self.issued, (
            f"committed batch {c} after recovery; COMMITs completed up to "
            f"{self.completed}, issued up to {self.issued}")
        self.check_tables(c)
        # The slot named is the contract's choice, read back from the image with the
        # golden model (``sim.ckpt``): the valid slot of the newest batch not after C,
        # not merely some slot within K of it.
        sb = ckpt.read_superblock(self.tb.pmem)
        want = ckpt.newest_mlp([ckpt.read_mlp_slot(self.tb.pmem, sb, s) for s in (0, 1)], c)
        want = (3, 0) if want is None else (want.slot, want.batch_id)
        assert (res.mlp_slot, res.mlp_batch) == want, (
            f"{res}: recovery named MLP slot {res.mlp_slot} (batch {res.mlp_batch}); the "
            f"newest valid slot not after batch {c} is {want[0]} (batch {want[1]})")
        if res.mlp_slot == 3:
            assert res.mlp_batch == 0 and self.mlp_seen == 0, res
        else:
            self.drv.check_mlp(res.mlp_slot, res.mlp_batch)
            assert self.mlp_seen <= res.mlp_batch <= c, (
                f"{res}: MLP checkpoint of batch {res.mlp_batch} named; a copy of batch "
                f"{self.mlp_seen} was seen finished, {c} is committed")
        assert c - res.mlp_batch <= MLP_K, f"{res}: the MLP checkpoint lags by more than K"
        for t, data in zip(self.tables, self.golden[c], strict=True):
            t.data = data
        self.issued = self.completed = c
        self.golden = {b: g for b, g in self.golden.items() if b <= c}
        return c

    async def resume(self, c: int) -> None:
        """What a resumed training does before its next batch: checkpoint the MLP of the
        committed batch ``c`` when the slot recovery named is older (a crash between
        COMMIT and MLP_CHECKPOINT), so K bounds the lag again."""
        if self.drv.mlp_batch < c:
            exp = await self.drv.mlp_checkpoint(c, self.mlp_params())
            assert exp.status is Status.OK, exp.status
            await self.drv.run()
            await self.drv.wait_mlp(c)


async def _campaign(dut, name: str, *, during_recovery: bool = False):
    tb = DeviceTB(dut, name, idle=True, backpressure=True)
    await tb.start()
    camp = Campaign(tb)
    n_points = tb.params.get("n_points", 20)
    part, parts = tb.params.get("part", 0), tb.params.get("parts", 1)
    assert 0 <= part < parts, f"part {part} of {parts}"
    points = range(n_points * part // parts, n_points * (part + 1) // parts)
    # One uncrashed run measures the window crash points are drawn from.
    await camp.fresh()
    start = tb.loop.cycle
    await camp.train(1, BATCHES)
    window = tb.loop.cycle - start
    camp.check_tables(BATCHES)
    tb.log.info("%d batches take %d cycles; crash points %d to %d of %d", BATCHES, window,
                points.start, points.stop - 1, n_points)
    # ``inject_fault``: a point whose check must fail (a table line is changed behind
    # the device's back after its recovery), so the count below is seen to follow the
    # checks' outcomes; the campaign then expects exactly that point to be lost.
    inject = tb.params.get("inject_fault")
    survived = rolled = 0
    failures: list[dict] = []
    phases: dict[str, int] = {}         # what the first power failure of each point caught
    # With ``during_recovery``: per point, how far into its recovery the power failed
    # (fraction of the recovery's measured length) and whether it was still busy.
    second: list[tuple[float, bool]] = []
    c = BATCHES
    for point in points:
        if point != points.start and point % FRESH_EVERY == 0:
            await camp.fresh()
            c = 0
        at = tb.rng.randrange(window + 50)
        task = cocotb.start_soon(camp.train(c + 1, c + BATCHES))
        start = tb.loop.cycle
        directed = DIRECTED.get(point % DIRECTED_EVERY)
        if directed is not None:
            # A directed point: the power fails while a write of that short phase is
            # in flight (the first time one is, within the window).
            await tb.loop.wait_until(
                lambda t=task, k=directed: t.done() or camp.writes_pending(k),
                timeout=4 * window, what=f"a {directed} write")
            at = tb.loop.cycle - start
        else:
            await _wait_or_done(tb, task, at)
        if not task.done():
            task.cancel()
        caught = await camp.crash()
        if directed is not None:
            assert directed in caught, f"point {point}: directed at {directed}, caught {caught}"
        phase = directed or camp.phase(caught)
        phases[phase] = phases.get(phase, 0) + 1
        tb.log.info("point %d: the power failure caught %s%s", point, ", ".join(sorted(caught)),
                    f" (directed: {directed})" if directed else "")
        if during_recovery:
            # The second failure is drawn over the whole recovery of this very image:
            # its length is measured first (the image is then put back), so the late
            # steps (the commit word, the MLP-slot scan) are hit as often as the early
            # ones. CK_STATUS, read right before the power fails, shows whether the
            # recovery was still running (its length varies with the PMEM timing, so a
            # draw near the end may find it over; most must find it busy, below).
            length = await camp.measure_recovery()
            await camp.drv.start_recovery()
            into = tb.rng.randrange(1, length)
            await tb.loop.wait_cycles(into)
            busy = bool((await tb.csr.read_fields("CK_STATUS")).busy)
            await camp.crash()
            second.append((into / length, busy))
            tb.log.info("point %d: power failed again %d of %d cycles into recovery (%s)",
                        point, into, length, "busy" if busy else "recovery had ended")
        issued, completed = camp.issued, camp.completed
        # A point survives only if every check of it passes; a failed one is recorded
        # (with the seed that replays the run) and the campaign goes on from a freshly
        # formatted device.
        try:
            if point == inject:
                camp.corrupt_after_recovery = True
            c = await camp.recover_and_check()
            rolled += await tb.csr.read("CK_ROLLED_BACK")
            await camp.resume(c)
        except (AssertionError, TimeoutError) as e:
            failures.append({"point": point, "at": at, "seed": tb.seed,
                             "kind": type(e).__name__,
                             "error": str(e).splitlines()[0][:300]})
            tb.log.error("point %d (crash at +%d cycles) FAILED: %s", point, at, e)
            camp.corrupt_after_recovery = False
            await camp.fresh()
            c = 0
            continue
        survived += 1
        tb.log.info("point %d: crash at +%d cycles, committed %d (completed %d, issued %d)",
                    point, at, c, completed, issued)
    await camp.train(c + 1, c + 1)                  # the device trains on after the last
    camp.check_tables(c + 1)
    tb.log.info("crash points tried %d, survived %d; %d records rolled back in all",
                len(points), survived, rolled)
    tb.check_protocol()
    if "out" in tb.params:          # the benchmark's figures (sim/bench.py)
        out = Path(tb.params["out"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "crash_points_tried": len(points), "crash_points_survived": survived,
            "failures": failures, "records_rolled_back": rolled,
            "batches_per_point": BATCHES, "window_cycles": window, "phases": phases,
            "recovery_crashes": _recovery_crashes(second)}, indent=2) + "\n")
    tb.log.info("phases the power failures caught: %s", phases)
    # Every phase of the window with a directed point in the run was caught (the
    # random points spread over the rest: reads, idle polling, other writes).
    want = {DIRECTED[q % DIRECTED_EVERY] for q in points if q % DIRECTED_EVERY in DIRECTED}
    missing = sorted(k for k in want if not phases.get(k))
    assert not missing, f"no crash point caught {missing}: {phases}"
    if second:
        tb.log.info("second power failures, by tenth of the recovery: %s",
                    _recovery_crashes(second))
        busy = sum(b for _, b in second)
        assert 2 * busy >= len(second), (
            f"only {busy} of {len(second)} second power failures found recovery running")
    lost = [f["point"] for f in failures]
    want = [inject] if inject in points else []
    assert lost == want and survived == len(points) - len(want), (
        f"{len(points)} crash points, {survived} survived; failed {failures} "
        f"(expected to fail: {want})")


def _recovery_crashes(second: list[tuple[float, bool]]) -> dict:
    """Second power failures per tenth of the recovery's measured length: how many, and
    how many found the recovery still busy."""
    tenths = [[0, 0] for _ in range(10)]
    for fraction, busy in second:
        tenths[min(9, int(fraction * 10))][0] += 1
        tenths[min(9, int(fraction * 10))][1] += busy
    return {"per_tenth": [t[0] for t in tenths], "busy_per_tenth": [t[1] for t in tenths]}


async def _wait_or_done(tb: DeviceTB, task, cycles: int) -> None:
    end = tb.loop.cycle + cycles
    await tb.loop.wait_until(lambda: task.done() or tb.loop.cycle >= end,
                             timeout=cycles + 10, what="crash point")


@group("campaign")
@cocotb.test()
async def test_crash_campaign(dut):
    """Power failure at random cycles of a multi-batch training sequence; recovery; the
    invariants of ``docs/architecture.md`` bit for bit; training continues."""
    await _campaign(dut, "crash_campaign")


@group("recovery")
@cocotb.test()
async def test_crash_during_recovery(dut):
    """As the campaign, and the power fails again while recovery runs (anywhere in it:
    drawn over the recovery's measured length): a second recovery gives the same result
    (recovery is idempotent)."""
    await _campaign(dut, "crash_during_recovery", during_recovery=True)


@group("directed")
@cocotb.test()
async def test_commit_just_before_crash(dut):
    """A COMMIT whose completion the host saw survives a power failure right after it."""
    tb = DeviceTB(dut, "commit_before_crash", idle=True, backpressure=True)
    await tb.start()
    camp = Campaign(tb)
    for _ in range(3):
        await camp.fresh()
        await camp.train(1, 2)
        await camp.crash()
        c = await camp.recover_and_check()
        assert c == 2, f"the completed COMMIT of batch 2 was lost (committed {c})"
    tb.check_protocol()


@group("directed")
@cocotb.test()
async def test_bad_batches_and_busy_recovery(dut):
    """UPDATE of a batch never looked up, UPDATE of a committed batch and COMMIT out of
    order complete with BAD_BATCH and change nothing; RECOVER while the engine is busy
    is refused (CK_STATUS.REJECTED) and nothing is lost."""
    tb = DeviceTB(dut, "bad_batches", idle=True, backpressure=True)
    await tb.start()
    camp = Campaign(tb)
    await camp.fresh()
    drv, t = camp.drv, camp.tables[0]
    await camp.train(1, 1)
    batch = _fixed_bags(camp.rng, t.rows)
    grads = np.ones((batch.num_bags, t.dim), np.float32)
    for bad in (5, 1):          # never looked up; already committed
        exp = await drv.update(t, batch, grads, batch_id=bad)
        assert exp.status is Status.BAD_BATCH
    exp = await drv.plain(DescKind.COMMIT, batch_id=1)
    assert exp.status is Status.BAD_BATCH
    await drv.run()
    camp.check_tables(1)
    # A long LOOKUP keeps the engine busy while RECOVER is written.
    big = _fixed_bags(camp.rng, t.rows, bags=64, pooling=8)
    await drv.lookup(t, big, batch_id=2, capture_undo=True)
    await drv.ring()
    await tb.loop.wait_cycles(20)
    await tb.csr.write_fields("CK_CMD", recover=1)
    status = await tb.csr.read_fields("CK_STATUS")
    assert status.rejected and status.on and not status.busy, (
        f"{status}: RECOVER during a LOOKUP must be refused")
    await drv.wait()
    await drv.plain(DescKind.COMMIT, batch_id=2)
    await drv.run()
    assert await tb.csr.read("CK_COMMITTED") == 2
    tb.check_protocol()


async def _expect_overflow(tb: DeviceTB, batch_id: int) -> None:
    """The undo log overflowed in batch ``batch_id``: ``CK_STATUS.OVERFLOW`` and
    ``CK_OVERFLOW_BATCH``. A LOOKUP completes before the logger has taken all of its
    records (they wait while LOOKUPs gather), so the status is read once none is left
    (``LOG_BUSY`` clear)."""
    limit = tb.loop.cycle + 20_000
    while (status := await tb.csr.read_fields("CK_STATUS")).log_busy:
        assert tb.loop.cycle < limit, f"{status}: the undo log still busy"
    assert status.overflow, f"{status}: OVERFLOW not set"
    assert await tb.csr.read("CK_OVERFLOW_BATCH") == batch_id


@group("directed")
@cocotb.test()
async def test_log_overflow(dut):
    """A batch needing more records than the log holds overflows: CK_STATUS.OVERFLOW,
    its UPDATE completes with LOG_FULL touching no row, no live record is overwritten;
    after its COMMIT the next batch works."""
    tb = DeviceTB(dut, "log_overflow", idle=True, backpressure=True)
    await tb.start()
    camp = Campaign(tb, log_slots=4)
    await camp.fresh()
    drv, t = camp.drv, camp.tables[0]
    rows = np.arange(min(10, t.rows), dtype=np.int32)        # distinct rows: 10 records
    batch = Batch(rows, np.array([0], np.int32))
    await drv.lookup(t, batch, batch_id=1, capture_undo=True)
    await drv.run()
    await _expect_overflow(tb, 1)
    drv.overflowed.add(1)
    grads = np.ones((1, t.dim), np.float32)
    exp = await drv.update(t, batch, grads, batch_id=1)
    assert exp.status is Status.LOG_FULL
    await drv.plain(DescKind.COMMIT, batch_id=1)
    await drv.run()
    camp.golden[1] = camp.golden[0]
    camp.check_tables(1)
    # Batch 2 fits (two rows).
    small = Batch(np.array([1, 2], np.int32), np.array([0], np.int32))
    await drv.lookup(t, small, batch_id=2, capture_undo=True)
    exp = await drv.update(t, small, grads, batch_id=2)
    assert exp.status is Status.OK
    await drv.plain(DescKind.COMMIT, batch_id=2)
    await drv.run()
    tb.check_protocol()


@group("directed")
@cocotb.test()
async def test_mlp_checkpoint(dut):
    """MLP_CHECKPOINT: UNSUPPORTED with checkpointing off; BAD_BATCH for a batch after
    the committed one or not newer than the last copy; MISALIGNED and ADDR_RANGE for the
    staging range and length; copies staged with CXL.mem writes alternate between the
    slots, bit for bit; with K = 0 a COMMIT waits for a running copy (CK_MLP_STALL) and
    CK_STATUS.MLP_LAG follows K; the copy's PMEM lines count as ENG_PMEM_*_CKPT, the
    records and the commit word as ENG_PMEM_WR_OTHER, the kinds summing to the totals."""
    tb = DeviceTB(dut, "mlp_checkpoint", idle=True, backpressure=True)
    await tb.start()
    camp = Campaign(tb)
    drv = camp.drv
    await drv.setup()
    exp = await drv.plain(DescKind.MLP_CHECKPOINT, batch_id=1, data_addr=drv.staging[0],
                          num_indices=LINE_BYTES)
    assert exp.status is Status.UNSUPPORTED
    await drv.run()
    await camp.fresh()
    await camp.train(1, 2, mlp=False)
    src, size = drv.staging[0], tb.config.pmem_size
    bad = [(3, src, 64, Status.BAD_BATCH),              # after the committed batch
           (1, src + 8, 64, Status.MISALIGNED),
           (1, src, 100, Status.MISALIGNED),
           (1, src, 0, Status.ADDR_RANGE),
           (1, src, MLP_BYTES + 64, Status.ADDR_RANGE),
           (1, size - 64, 128, Status.ADDR_RANGE)]      # past the end of device memory
    for batch, addr, length, status in bad:
        exp = await drv.plain(DescKind.MLP_CHECKPOINT, batch_id=batch, data_addr=addr,
                              num_indices=length)
        assert exp.status is status, (batch, addr, length, exp.status)
    await drv.run()
    assert await tb.csr.read("CK_MLP_SLOT") == 3
    drv.via_cxl = True                  # the host stages the parameters over CXL.mem
    for b in (1, 2):
        exp = await drv.mlp_checkpoint(b, camp.mlp_params())
        assert exp.status is Status.OK
    exp = await drv.mlp_checkpoint(2, camp.mlp_params())       # not newer than the last
    assert exp.status is Status.BAD_BATCH
    await drv.run()
    await drv.wait_mlp(2)
    drv.check_mlp(0, 1)                 # the older copy is intact in the other slot
    drv.via_cxl = False
    # K = 0: COMMIT(4) right behind a long copy of batch 3 waits for it.
    await tb.csr.write("CK_MLP_K", 0)
    await camp.train(3, 3, mlp=False)
    await tb.csr.write("PERF_CTRL", 1)
    await drv.mlp_checkpoint(3, camp.mlp_params(MLP_BYTES))
    await drv.plain(DescKind.COMMIT, batch_id=4)
    await drv.run()
    stall = await tb.csr.read64("CK_MLP_STALL")
    assert stall > 0, "COMMIT(4) did not wait for the running copy with K = 0"
    assert await tb.csr.read64("CK_MLP_LINES") == MLP_BYTES // LINE_BYTES
    await drv.wait_mlp(3)
    # PMEM lines per kind since the clear: the copy's reads and writes are CKPT; the two
    # descriptors, their records and the commit word (the completion writes it) "other";
    # no LOOKUP or UPDATE.
    kinds = {k: await tb.csr.read64(n) for k, n in PMEM_KIND_CSRS.items()}
    totals = [await tb.csr.read64(f"ENG_PMEM_{d}_LINES") for d in ("RD", "WR")]
    assert [sum(v for k, v in kinds.items() if k.startswith(d)) for d in ("rd", "wr")] == totals, (
        kinds, totals)
    assert kinds["rd_lookup"] == kinds["rd_update"] == kinds["wr_update"] == 0, kinds
    assert kinds["rd_ckpt"] == MLP_BYTES // LINE_BYTES, kinds
    assert kinds["wr_ckpt"] > MLP_BYTES // LINE_BYTES, kinds          # and the header
    assert kinds["rd_other"] > 0 and kinds["wr_other"] == 3, kinds
    status = await tb.csr.read_fields("CK_STATUS")
    assert status.mlp_lag, f"{status}: MLP_LAG clear with committed 4, MLP 3"
    await tb.csr.write("CK_MLP_K", 1)
    status = await tb.csr.read_fields("CK_STATUS")
    assert not status.mlp_lag, f"{status}: MLP_LAG set within K"
    tb.log.info("COMMIT waited %d cycles for the MLP copy", stall)
    tb.check_protocol()


# --- directed tests of the cases the crash campaign does not reach ----------------------

#: ``CK_STATUS.RESULT`` of a recovery that did not succeed (``docs/registers.md``).
NO_SUPERBLOCK, PMEM_ERROR, BAD_LAYOUT = 1, 2, 3


async def _logged_batch(camp: Campaign, b: int, rows: list[int], *, table: int = 0) -> None:
    """Batch ``b`` without its COMMIT: a capturing LOOKUP of ``rows`` (distinct, one bag)
    of table ``table`` and its UPDATE, run to completion. The UPDATE starts only once the
    batch's records are durable (``docs/checkpoint.md``, "Ordering"), so afterwards
    ``CK_LOG_SEQ`` counts them: one record per row, the rows being distinct."""
    drv, t = camp.drv, camp.tables[table]
    assert len(set(rows)) == len(rows), rows
    drv.heap.release(camp.mark)
    batch = Batch(np.asarray(rows, np.int32), np.array([0], np.int32))
    await drv.lookup(t, batch, batch_id=b, capture_undo=True)
    grads = (camp.rng.standard_normal((1, t.dim)) * 0.5).astype(np.float32)
    exp = await drv.update(t, batch, grads, batch_id=b)
    assert exp.status is Status.OK, exp.status
    await drv.run()
    camp.golden[b] = [x.data for x in camp.tables]


async def _commit(camp: Campaign, b: int) -> None:
    await camp.drv.plain(DescKind.COMMIT, batch_id=b)
    await camp.drv.run()
    assert await camp.tb.csr.read("CK_COMMITTED") == b
    camp.issued = camp.completed = b


async def _check_log_space(tb: DeviceTB, *, seq: int, full: bool) -> None:
    """``CK_LOG_SEQ`` (the next record number) and ``CK_STATUS.LOG_FULL`` (``write_seq -
    oldest == log_slots``, ``docs/checkpoint.md``, "Space")."""
    got = await tb.csr.read("CK_LOG_SEQ")
    status = await tb.csr.read_fields("CK_STATUS")
    assert (got, bool(status.log_full)) == (seq, full), (
        f"CK_LOG_SEQ {got}, {status}; expected {seq} records, log full: {full}")


def _check_ring(camp: Campaign, records: list[tuple[int, int, int]], *, table: int = 0) -> None:
    """The log ring holds exactly ``records`` (``(seq, batch, row)`` of table ``table``)
    in their slots (``seq mod log_slots``), bit for bit as ``docs/checkpoint.md`` defines
    them: the header with the commit word's epoch, the row's address and the old content
    of the row (its value after batch ``batch - 1``) as payload."""
    tb, drv, t = camp.tb, camp.drv, camp.tables[table]
    _, epoch = ckpt.read_commit_word(tb.pmem)
    stride = emb.lines_per_row(t.dim, t.data.dtype) * LINE_BYTES
    for seq, b, row in records:
        old = emb.pack_rows(camp.golden[b - 1][table], base=t.image0)
        want = ckpt.encode_record(epoch, b, seq, t.table_id, row, t.base + row * stride,
                                  old[row * stride:(row + 1) * stride])
        slot = drv.log_base + (seq % drv.log_slots) * drv.slot_lines * LINE_BYTES
        got = tb.pmem.read(slot, len(want))
        assert got == want, (f"log slot {seq % drv.log_slots} is not record {seq} (batch {b}, "
                             f"row {row}): header {ckpt.parse_header(got)}")


@group("directed")
@cocotb.test()
async def test_log_overflow_after_skipped_row(dut):
    """The row that overflows the log comes right after a row the duplicate filter
    skips: a 4-slot log, a LOOKUP of four rows (the log is then full), the first of them
    again (logged already: skipped), then two new rows. The overflow is taken all the
    same: CK_STATUS.OVERFLOW, CK_OVERFLOW_BATCH, exactly the four records that fit in the
    ring bit for bit (CK_LOG_SEQ 4, CK_STATUS.LOG_FULL), the UPDATE completes with
    LOG_FULL touching no row; COMMIT clears OVERFLOW and LOG_FULL. (The device-level
    overflow of ``test_log_overflow`` comes after a logged row; the logger decides a row
    that comes after a skipped one in another state.)"""
    tb = DeviceTB(dut, "log_overflow_skip", idle=True, backpressure=True)
    await tb.start()
    camp = Campaign(tb, log_slots=4)
    await camp.fresh()
    drv, t = camp.drv, camp.tables[0]
    # Four rows in four different filter entries (``docs/checkpoint.md``, "What the RTL
    # does"), so that the filter surely still holds the first when it comes again.
    logged = [int(r) for r in camp.rng.permutation(8)[:4]]
    assert len({filter_index(t.table_id, r, tb.config.ckpt_filter_rows) for r in logged}) == 4
    rest = [int(r) for r in camp.rng.permutation(sorted(set(range(t.rows)) - set(logged)))[:2]]
    rows = logged + logged[:1] + rest
    batch = Batch(np.asarray(rows, np.int32), np.array([0], np.int32))
    await drv.lookup(t, batch, batch_id=1, capture_undo=True)
    await drv.run()
    await _expect_overflow(tb, 1)
    await _check_log_space(tb, seq=4, full=True)
    _check_ring(camp, [(s, 1, r) for s, r in enumerate(logged)])
    drv.overflowed.add(1)
    grads = np.ones((1, t.dim), np.float32)
    exp = await drv.update(t, batch, grads, batch_id=1)
    assert exp.status is Status.LOG_FULL
    await _commit(camp, 1)
    camp.golden[1] = camp.golden[0]
    camp.check_tables(1)
    status = await tb.csr.read_fields("CK_STATUS")
    assert not status.overflow and not status.log_full, f"{status} after COMMIT(1)"
    tb.check_protocol()


@group("directed")
@cocotb.test()
async def test_live_batches_before_commit(dut):
    """Several batches live at once: batches 2 and 3 log and update before COMMIT(1)
    (``docs/checkpoint.md`` orders the LOOKUPs of ``b + 1`` after the UPDATEs of ``b``, not
    after COMMIT(``b``); a row of several live batches is restored newest first). In an
    8-slot log, batches of 3, 3 and 2 rows (sharing rows) fill it exactly: CK_LOG_SEQ and
    CK_STATUS.LOG_FULL follow, the ring holds the eight records bit for bit. COMMIT(1)
    frees batch 1's slots at once (LOG_FULL clear), and batch 4 writes its 3 records over
    them (the ring wraps; full again). The power then fails: recovery (committed 1)
    restores the 8 live records of batches 2 to 4 newest first, so every table is as
    after batch 1 exactly (CK_ROLLED_BACK 8, CK_LOG_SEQ back to 0)."""
    tb = DeviceTB(dut, "live_batches", idle=True, backpressure=True)
    await tb.start()
    camp = Campaign(tb, log_slots=8)
    await camp.fresh()
    table = 1                       # rows of two lines: two payload lines per record
    t = camp.tables[table]
    p = [int(r) for r in camp.rng.permutation(t.rows)]
    rows = {1: [p[0], p[1], p[2]], 2: [p[1], p[3], p[4]], 3: [p[3], p[1]],
            4: [p[4], p[0], p[5]]}
    records, seq = [], 0
    for b in (1, 2, 3):
        await _logged_batch(camp, b, rows[b], table=table)
        records += [(seq + i, b, r) for i, r in enumerate(rows[b])]
        seq += len(rows[b])
        await _check_log_space(tb, seq=seq, full=seq == camp.drv.log_slots)
    assert seq == camp.drv.log_slots
    _check_ring(camp, records, table=table)
    await _commit(camp, 1)
    await _check_log_space(tb, seq=8, full=False)
    await _logged_batch(camp, 4, rows[4], table=table)
    records = records[3:] + [(seq + i, 4, r) for i, r in enumerate(rows[4])]
    await _check_log_space(tb, seq=11, full=True)
    _check_ring(camp, records, table=table)
    await camp.crash()
    c = await camp.recover_and_check()
    assert c == 1, f"committed {c} after recovery, COMMIT(1) completed, nothing after it"
    rolled = await tb.csr.read("CK_ROLLED_BACK")
    assert rolled == len(records), f"CK_ROLLED_BACK {rolled}, {len(records)} live records"
    await _check_log_space(tb, seq=0, full=False)
    tb.check_protocol()


def _superblock_with(line0: bytes, **fields) -> bytes:
    """Superblock line 0 with ``fields`` changed and a correct ``check``."""
    f = ckpt.parse_superblock(line0) | fields
    del f["check"]
    raw = ckpt.SUPERBLOCK_CODEC.pack(**f).to_bytes(LINE_BYTES, "little")
    return ckpt.SUPERBLOCK_CODEC.pack(**f, check=ckpt.bytes_sum64(raw[:56])).to_bytes(
        LINE_BYTES, "little")


@group("directed")
@cocotb.test()
async def test_recovery_refuses_bad_images(dut):
    """Recovery of an image it must not replay, after a power failure that left batch 2
    live (batch 1 committed): superblock line 0 erased or with a wrong check, a commit
    word without 0xC0DE (NO_SUPERBLOCK); a correct check over another ``version`` or a
    layout out of the device's range, ``log_slots`` not a power of two or ``slot_lines``
    0 or above ``1 + engine_max_dim / 16`` (BAD_LAYOUT); a PMEM error response to a read
    of the superblock or of the log ring (PMEM_ERROR). Each reports its RESULT with
    DONE, not BUSY, not ON, CK_ROLLED_BACK 0, and writes nothing: the whole image,
    tables and commit word included, is unchanged (``docs/checkpoint.md``, "What the RTL
    does"). With the image put back, RECOVER again (no descriptor has run since the
    reset) succeeds: batch 2's records are restored, the epoch goes up by one only,
    checkpointing is on."""
    tb = DeviceTB(dut, "recovery_bad_images", idle=True, backpressure=True)
    await tb.start()
    camp = Campaign(tb, log_slots=8)
    await camp.fresh()
    drv, cfg = camp.drv, tb.config
    p = [int(r) for r in camp.rng.permutation(camp.tables[0].rows)]
    await _logged_batch(camp, 1, p[:3])
    await _commit(camp, 1)
    await _logged_batch(camp, 2, p[1:5])
    await camp.crash()
    line0 = tb.pmem.read(0, LINE_BYTES)
    commit_line = tb.pmem.read(LINE_BYTES, LINE_BYTES)
    committed, epoch = ckpt.read_commit_word(tb.pmem)
    assert committed == 1, committed
    ring_lines = drv.log_slots * drv.slot_lines
    bad_word = commit_line[:6] + bytes([commit_line[6] ^ 0x01]) + commit_line[7:]
    cases = [
        ("line 0 erased", NO_SUPERBLOCK, {0: bytes(LINE_BYTES)}, ()),
        ("wrong check", NO_SUPERBLOCK, {0: line0[:56] + bytes([line0[56] ^ 0x10]) + line0[57:]},
         ()),
        ("commit word without 0xC0DE", NO_SUPERBLOCK, {LINE_BYTES: bad_word}, ()),
        ("log_slots not a power of two", BAD_LAYOUT,
         {0: _superblock_with(line0, log_slots=drv.log_slots * 3 // 2)}, ()),
        ("slot_lines 0", BAD_LAYOUT, {0: _superblock_with(line0, slot_lines=0)}, ()),
        ("another version", BAD_LAYOUT,
         {0: _superblock_with(line0, version=ckpt.SB_VERSION + 1)}, ()),
        ("slot_lines too large", BAD_LAYOUT,
         {0: _superblock_with(line0, slot_lines=2 + cfg.engine_max_dim // 16)}, ()),
        ("superblock read error", PMEM_ERROR, {}, (0,)),
        ("log ring read error", PMEM_ERROR, {},
         (drv.log_base // LINE_BYTES + tb.rng.randrange(ring_lines),)),
    ]
    for what, want, lines, faults in cases:
        for addr, data in lines.items():
            tb.pmem.write(addr, data)
        tb.pmem.read_error_lines.update(faults)
        before = tb.pmem.snapshot()
        res = await drv.recover()
        tb.pmem.read_error_lines.clear()
        assert res.status == want, f"{what}: {res}, expected RESULT {want}"
        assert res.rolled_back == 0, f"{what}: {res}"
        status = await tb.csr.read_fields("CK_STATUS")
        assert status.done and not status.busy and not status.on, f"{what}: {status}"
        changed = [hex(a) for a, v in tb.pmem.snapshot().items() if before.get(a) != v]
        assert not changed and tb.pmem.snapshot().keys() == before.keys(), (
            f"{what}: recovery wrote lines {changed[:4]}")
        tb.pmem.write(0, line0)
        tb.pmem.write(LINE_BYTES, commit_line)
        tb.log.info("%s: RESULT %d, nothing written", what, res.status)
    c = await camp.recover_and_check()
    assert c == 1, f"committed {c} after recovery, COMMIT(1) completed"
    assert await tb.csr.read("CK_ROLLED_BACK") == 4
    assert ckpt.read_commit_word(tb.pmem) == (1, epoch + 1)
    assert await tb.csr.read("CK_EPOCH") == epoch + 1
    assert (await tb.csr.read_fields("CK_STATUS")).on
    tb.check_protocol()
