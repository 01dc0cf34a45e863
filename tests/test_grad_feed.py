# amaranth: UnusedElaboratable=no
"""UPDATE's gradient feed (hw/engine/grad_feed.py) in the Amaranth simulator.

The feed is checked against its contract (``GradFeed`` docstring, ``docs/embedding.md``):
for every counted row of bag ``b``, ``items`` items ``line = 0 .. items - 1`` carrying
line ``line`` of bag ``b``'s gradient at ``data_addr + b * glines * 64`` (zero past
``glines``) and the row's weight; one ``nop`` + ``last`` item after ``finish``; reads
only inside the gradient buffer, each line once, none left in flight at the end. Rows
arrive with random gaps, items leave under random backpressure, PMEM has latency,
jitter and (rough) random AR backpressure and R idle cycles; ``finish`` comes at a
random delay after the last row, sometimes at once (before the last bag's lines have
all been asked for). Seeds are printed and ``SEED=<n>`` replays one.

Read errors: a gradient line answered SLVERR / DECERR (:class:`tests.axi_pmem.
ReadErrors`), or a row arriving ``bad``, must make ``bad`` every item from the first
one that line or row feeds (and the final ``nop`` item), never fall, and not reach the
next UPDATE. So must a ``seq_error`` pulse (the sequencer's read failed), from the
first item handed over after it.

Reading the next UPDATE ahead: a job may have ``ahead`` raised with its settings at a
random point of the job before it (or before it, between jobs), held a random while
and dropped at its ``start``, as the sequencer pool does. Its gradient lines are then
read behind the current job's, and nothing may change: the same items, every line read
once and in job order, a failed line read ahead making only its own job's items
``bad``.
"""

from __future__ import annotations

import random

import pytest

from hw.bus.axi import AxiResp
from hw.engine.grad_feed import GradFeed
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import ROUGH, SMOOTH, AxiPmemPort, ReadErrors, Traffic
from .conftest import assert_lints_clean

ADDR_WIDTH = 20
PMEM_SIZE = 1 << 20
LINE = 64
MAX_GLINES = 4
TIMING = PmemTiming(read_latency=30, write_latency=12, jitter=10)
#: An expected ``bad`` that may be 0 or 1 (before the items a failed read or a bad row
#: feeds: the flag may come early, never late).
MAYBE = "0 or 1"


def _updates(rng: random.Random, n: int) -> list[dict]:
    """``n`` UPDATEs: 1 to 12 bags (often one or two: their rows are over before their
    lines have all been asked for) of 0..5 counted rows (some empty), 1..MAX_GLINES
    gradient lines, items = glines or 2 * glines (bf16 tables), each in its own
    buffer."""
    assert n <= 15, "each UPDATE has its own 64 KiB of the memory"
    jobs = []
    for k in range(n):
        num_bags = rng.choice((1, 1, 2, rng.randint(3, 12)))
        glines = rng.randint(1, MAX_GLINES)
        counts = [0 if rng.random() < 0.2 else rng.randint(1, 5) for _ in range(num_bags)]
        base = (k + 1) * (PMEM_SIZE // 16) + rng.randrange(0, 64) * LINE
        jobs.append({"num_bags": num_bags, "glines": glines, "counts": counts,
                     "items": glines * rng.choice((1, 2)), "data_addr": base,
                     "rows": [[rng.randrange(1 << 20) for _ in range(c)] for c in counts],
                     "weights": [[rng.getrandbits(32) for _ in range(c)] for c in counts],
                     "finish_delay": rng.choice((0, 0, 1, 3, 20)),
                     # ``checked`` from this cycle after ``start`` (None: never, the
                     # first row starts the read-ahead); the rows from ``row_delay``.
                     "checked_at": rng.choice((None, 0, 1, 5)),
                     "row_delay": rng.choice((0, 0, 10)),
                     # ``ahead`` for this job from this cycle after the previous job's
                     # start (None: never), held at least ``ahead_hold`` cycles.
                     "ahead_at": rng.choice((None, None, 0, 5, 40, 200)),
                     "ahead_hold": rng.choice((0, 3, 30))})
    return jobs


def _expected(model: PmemModel, job: dict) -> list[tuple]:
    """The items of ``job``; the last element of each is ``bad``: with a failed
    gradient read of bag ``b`` (``job["fault"]``) every item of bags ``b`` on (a bag's
    lines are all in before its first item), with a ``bad`` row (``job["bad_row"]``,
    counted in the row stream, empty bags included) its items and every later one,
    and the final ``nop`` item; :data:`MAYBE` before them. With a ``seq_error`` pulse
    (``job["seq_error_items"] = (a, b)`` from :func:`_run`: the items handed over
    before its edge, and those up to its edge's) the items from ``b`` on and the final
    one are bad, one handed over at its edge may be, those before it follow the rest.
    A job whose rows stop after ``job["rows_fed"]`` (a sequencer whose read failed
    emits no more) has the items of those rows only."""
    out = []
    g = job["glines"]
    fault, bad_row = job.get("fault"), job.get("bad_row")
    first = None                        # the first item that must be bad
    fed = 0                             # rows of the row stream before this bag's
    for b, rows in enumerate(job["rows"]):
        lines = [int.from_bytes(model.read(job["data_addr"] + (b * g + j) * LINE, LINE),
                                "little") for j in range(g)]
        if first is None and fault is not None and b >= fault[0]:
            first = len(out)
        for k, (row, weight) in enumerate(zip(rows, job["weights"][b], strict=True)):
            if first is None and bad_row is not None and fed + k >= bad_row:
                first = len(out)
            if fed + k >= job.get("rows_fed", fed + k + 1):
                break                   # the sequencer stopped before this row
            for j in range(job["items"]):
                out.append((row, j, weight, lines[j] if j < g else 0, 0, 0, 0))
        fed += max(1, len(rows))
    bad = fault is not None or bad_row is not None
    if bad:
        first = len(out) if first is None else first
        out = [(*it[:-1], MAYBE if k < first else 1) for k, it in enumerate(out)]
    seq = job.get("seq_error_items")
    if seq is not None:
        a, b = seq
        out = [(*it[:-1], 1 if k >= b else MAYBE if k >= a and it[-1] == 0 else it[-1])
               for k, it in enumerate(out)]
    return [*out, ("nop", int(bad or seq is not None))]


def _same(got: tuple, want: tuple) -> bool:
    return len(got) == len(want) and all(
        g == w or (w == MAYBE and g in (0, 1)) for g, w in zip(got, want, strict=True))


def _check(items: list[tuple], want: list[tuple], name: str) -> None:
    assert len(items) == len(want), f"{name}: {len(items)} items, want {len(want)}"
    for i, (a, b) in enumerate(zip(items, want, strict=True)):
        assert _same(a, b), (f"{name} item {i}: {a[:3]} bad {a[-1]} differs from {b[:3]} "
                             f"bad {b[-1]}" + (" (grad differs)" if a[3:-1] != b[3:-1] else ""))
    bad = [it[-1] for it in items]
    assert bad == sorted(bad), f"{name}: bad falls within the items: {bad}"


def _run(model: PmemModel, jobs: list[dict], *, seed: int, traffic: Traffic,
         row_gap: float, out_bp: float, max_cycles: int = 40_000
         ) -> list[tuple[list[tuple], int]]:
    """Run ``jobs`` back to back; per job its items and the cycles from ``start`` to
    the last item. A job's ``seq_error = (rows, delay)``: ``seq_error`` pulses once
    ``rows`` rows have been taken and ``delay`` cycles more have passed, or with
    ``finish`` if that comes first; its items' indices at the pulse are recorded as
    ``job["seq_error_items"]`` (see :func:`_expected`). With ``job["truncate"]`` no
    row is fed after those ``rows``, as a sequencer stops at a failed read (recorded as
    ``job["rows_fed"]``): the job's gradient lines are then read up to some point
    only."""
    dut = GradFeed(addr_width=ADDR_WIDTH, id_width=2, max_glines=MAX_GLINES)
    rng = random.Random(seed)
    # Each job's ``fault`` (bag, line, rresp): that gradient line answered with an error.
    failing = {job["data_addr"] + (job["fault"][0] * job["glines"] + job["fault"][1]) * LINE:
               job["fault"][2] for job in jobs if job.get("fault") is not None}
    errors = ReadErrors(fail=lambda line, n: failing.get(line, 0))
    port = AxiPmemPort(dut.pmem, model, rng, traffic, read_errors=errors)
    got: list[tuple[list[tuple], int]] = []
    reads: list[int] = []
    o = dut.o_items

    def set_ahead(ctx, job: dict | None) -> bool:
        """Raise ``ahead`` with ``job``'s settings (None: drop it)."""
        ctx.set(dut.ahead, job is not None)
        if job is not None:
            ctx.set(dut.ahead_addr, job["data_addr"])
            ctx.set(dut.ahead_bags, job["num_bags"])
            ctx.set(dut.ahead_glines, job["glines"])
        return job is not None

    async def tick(ctx, *extra):
        """One cycle, recording the read issued in it."""
        arv, arr, ara, *values = await port.tick(
            ctx, dut.pmem.arvalid, dut.pmem.arready, dut.pmem.araddr, *extra)
        if arv and arr:
            reads.append(ara)
        return values

    async def bench(ctx):
        start = 0                       # the previous job's start (the bench's, first)
        for k, job in enumerate(jobs):
            # This job read ahead: ``ahead`` held a while before its start.
            if job.get("ahead_at") is not None:
                until = max(start + job["ahead_at"], port.cycle) + job["ahead_hold"]
                set_ahead(ctx, job)
                while port.cycle < until:
                    await tick(ctx)
            set_ahead(ctx, None)
            nxt = jobs[k + 1] if k + 1 < len(jobs) else None
            nxt_at = None if nxt is None else nxt.get("ahead_at")
            items: list[tuple] = []
            for name in ("data_addr", "num_bags", "glines", "items"):
                ctx.set(getattr(dut, name), job[name])
            checked_at, row_delay = job.get("checked_at"), job.get("row_delay", 0)
            ctx.set(dut.start, 1)
            ctx.set(dut.checked, int(checked_at == 0))
            await tick(ctx)
            ctx.set(dut.start, 0)
            feed = []
            for b, rows in enumerate(job["rows"]):
                if not rows:
                    feed.append({"row": 0, "row_k": 0, "last_row": 0, "weight": 0,
                                 "empty_bag": 1, "count": 0})
                for i, (row, w) in enumerate(zip(rows, job["weights"][b], strict=True)):
                    feed.append({"row": row, "row_k": i, "last_row": int(i == len(rows) - 1),
                                 "weight": w, "empty_bag": 0, "count": len(rows)})
            if job.get("bad_row") is not None:
                feed[job["bad_row"]]["bad"] = 1
            if job.get("truncate"):
                job["rows_fed"] = job["seq_error"][0]
                del feed[job["rows_fed"]:]
            finish_at = None
            start = port.cycle
            seq_error, reached = job.get("seq_error"), None
            taken = 0
            ahead = False               # the next job is being offered ahead
            while True:
                assert port.cycle - start < max_cycles, "UPDATE did not finish (hang)"
                if nxt_at is not None and port.cycle - start + 1 >= nxt_at:
                    ahead = set_ahead(ctx, nxt)
                if checked_at is not None and port.cycle - start + 1 == checked_at:
                    ctx.set(dut.checked, 1)         # held until the job ends
                if feed and port.cycle - start >= row_delay and not rng.random() < row_gap:
                    ctx.set(dut.i_rows.payload, feed[0])
                    ctx.set(dut.i_rows.valid, 1)
                else:
                    ctx.set(dut.i_rows.valid, 0)
                finishing = finish_at is not None and port.cycle == finish_at
                ctx.set(dut.finish, int(finishing))
                if seq_error is not None and reached is None and taken >= seq_error[0]:
                    reached = port.cycle
                pulse = (seq_error is not None and "seq_error_items" not in job
                         and (finishing or (reached is not None
                                            and port.cycle - reached >= seq_error[1])))
                ctx.set(dut.seq_error, int(pulse))
                before = len(items)
                ctx.set(o.ready, not rng.random() < out_bp)
                (rv, rr, ov, orr, payload) = await tick(
                    ctx, dut.i_rows.valid, dut.i_rows.ready, o.valid, o.ready, o.payload)
                if rv and rr:
                    feed.pop(0)
                    taken += 1
                if not feed and finish_at is None:
                    finish_at = port.cycle + job["finish_delay"]
                if ov and orr:
                    job.setdefault("first_item", port.cycle - start)
                    if payload.nop:
                        assert payload.last, "nop item without last"
                        items.append(("nop", payload.bad))
                        break
                    assert not payload.last, "last on an update item"
                    items.append((payload.row, payload.line, payload.weight, payload.grad, 0,
                                  0, payload.bad))
                if pulse:
                    job["seq_error_items"] = (before, len(items))
            assert seq_error is None or "seq_error_items" in job, "no seq_error pulse"
            cycles = port.cycle - start
            ctx.set(dut.i_rows.valid, 0)
            ctx.set(dut.finish, 0)
            ctx.set(dut.seq_error, 0)
            ctx.set(dut.checked, 0)
            (busy,) = await tick(ctx, dut.busy)
            if not ahead:
                assert not busy, "busy after the last item"
                assert model.outstanding == (0, 0), "reads in flight after the last item"
            got.append((items, cycles))
        while model.outstanding != (0, 0):
            await tick(ctx)

    simulate(dut, bench)
    assert not port.errors, "\n".join(port.errors[:10])
    # Every line of every gradient buffer read exactly once, in order, job after job,
    # nothing else read; a job fed only part of its rows: a first part of its lines.
    at = 0
    for k, job in enumerate(jobs):
        lines = [job["data_addr"] + i * LINE for i in range(job["num_bags"] * job["glines"])]
        n = 0
        while n < len(lines) and at + n < len(reads) and reads[at + n] == lines[n]:
            n += 1
        assert n == len(lines) or job.get("truncate"), (
            f"UPDATE {k}: read {n} of its {len(lines)} gradient lines in order")
        at += n
    assert at == len(reads), f"reads outside the gradient buffers: {reads[at:at + 4]}"
    assert len(errors.failed) == len(failing), f"failed reads {errors.failed}"
    return got


def _model(seed: int) -> PmemModel:
    model = PmemModel(size=PMEM_SIZE, timing=TIMING, rng=random.Random(seed))
    model.write(0, random.Random(seed ^ 0x3C3C).randbytes(PMEM_SIZE))
    return model


@pytest.mark.parametrize("noise", [(SMOOTH, 0.0, 0.0), (ROUGH, 0.3, 0.3), (SMOOTH, 0.6, 0.0),
                                   (ROUGH, 0.0, 0.7)],
                         ids=["smooth", "rough", "slow-rows", "slow-out"])
def test_items_match_contract(noise, seed):
    traffic, row_gap, out_bp = noise
    model = _model(seed)
    jobs = _updates(random.Random(seed), 6)
    got = _run(model, jobs, seed=seed, traffic=traffic, row_gap=row_gap, out_bp=out_bp)
    for k, (job, (items, _)) in enumerate(zip(jobs, got, strict=True)):
        _check(items, _expected(model, job), f"UPDATE {k}")


@pytest.mark.parametrize("noise", [(SMOOTH, 0.0, 0.0), (ROUGH, 0.3, 0.3)],
                         ids=["smooth", "rough"])
def test_read_errors(noise, seed):
    """UPDATEs with a gradient line answered SLVERR or DECERR (of a random bag, empty
    ones included, read ahead or not), with a row arriving ``bad`` (an empty bag's
    among them), or clean, in random order: the items from those the line or row
    feeds on are ``bad``, the final one too, and the next UPDATE's are not."""
    traffic, row_gap, out_bp = noise
    rng = random.Random(seed)
    model = _model(seed)
    jobs = _updates(rng, 9)
    for k, job in enumerate(jobs):
        kind = k % 3
        if kind == 0:
            bag = rng.randrange(job["num_bags"])
            job["fault"] = (bag, rng.randrange(job["glines"]),
                            rng.choice([AxiResp.SLVERR, AxiResp.DECERR]))
        elif kind == 1:
            job["bad_row"] = rng.randrange(sum(max(1, c) for c in job["counts"]))
    rng.shuffle(jobs)
    got = _run(model, jobs, seed=seed, traffic=traffic, row_gap=row_gap, out_bp=out_bp)
    for k, (job, (items, _)) in enumerate(zip(jobs, got, strict=True)):
        _check(items, _expected(model, job), f"UPDATE {k}")


@pytest.mark.parametrize("noise", [(SMOOTH, 0.0, 0.0), (ROUGH, 0.3, 0.3)],
                         ids=["smooth", "rough"])
def test_seq_error(noise, seed):
    """UPDATEs with a ``seq_error`` pulse at a random point (before any row, between
    rows, after the last one, with ``finish`` as the engine gives it), some with a
    failed gradient read or a ``bad`` row as well, each followed by a clean UPDATE: the
    items handed over after the pulse are ``bad``, the final one too, those before it
    are not (unless the other cause makes them), and the next UPDATE's are clean. Some
    get no rows after the pulse's point (the sequencer stops), so their last bags'
    lines are never consumed, read ahead of the next UPDATE or not."""
    traffic, row_gap, out_bp = noise
    rng = random.Random(seed)
    model = _model(seed)
    jobs = _updates(rng, 12)
    for k, job in enumerate(jobs[::2]):
        rows = sum(max(1, c) for c in job["counts"])
        job["seq_error"] = (rng.randrange(rows + 1), rng.choice([0, 0, 1, 5, 30, 1 << 30]))
        if k % 3 == 0:
            job["truncate"] = rng.random() < 0.5
        elif k % 3 == 1:
            job["fault"] = (rng.randrange(job["num_bags"]), rng.randrange(job["glines"]),
                            rng.choice([AxiResp.SLVERR, AxiResp.DECERR]))
        elif k % 3 == 2:
            job["bad_row"] = rng.randrange(rows)
    got = _run(model, jobs, seed=seed, traffic=traffic, row_gap=row_gap, out_bp=out_bp)
    for k, (job, (items, _)) in enumerate(zip(jobs, got, strict=True)):
        _check(items, _expected(model, job), f"UPDATE {k}")


def test_stopped_update_keeps_its_read_offered(seed):
    """UPDATEs whose sequencer stops before any row (``seq_error`` at once, no row fed)
    with ``checked`` and ``finish`` at ``start``, under heavy AR backpressure: the feed
    has gradient reads offered when it reaches its end item, and an offered read stays
    offered until it is taken (the port's AXI checker); the end item waits for it."""
    rng = random.Random(seed)
    model = _model(seed)
    jobs = _updates(rng, 14)            # (each in its own 64 KiB of the 1 MiB)
    for job in jobs:
        job.update(checked_at=0, row_delay=0, finish_delay=rng.choice((0, 1)),
                   seq_error=(0, 0), truncate=True, ahead_at=None)
        job["glines"] = MAX_GLINES
        job["items"] = MAX_GLINES
    traffic = Traffic(ar_bp=0.7, aw_bp=0.0, w_bp=0.0, r_idle=0.3, b_idle=0.0)
    got = _run(model, jobs, seed=seed, traffic=traffic, row_gap=0.0, out_bp=0.3)
    for k, (job, (items, _)) in enumerate(zip(jobs, got, strict=True)):
        _check(items, _expected(model, job), f"UPDATE {k}")


def test_reads_ahead():
    """One-row bags of one gradient line: the ring keeps reads in flight, so the items
    come at the feed's rate (a few cycles per bag), not one read latency per bag."""
    model = _model(3)
    bags = 64
    job = {"num_bags": bags, "glines": 1, "items": 1, "counts": [1] * bags,
           "data_addr": 0x10000, "rows": [[b] for b in range(bags)],
           "weights": [[0] for _ in range(bags)], "finish_delay": 0}
    [(items, cycles)] = _run(model, [job], seed=3, traffic=SMOOTH, row_gap=0.0, out_bp=0.0)
    assert items == _expected(model, job)
    latency = TIMING.read_latency + TIMING.jitter
    assert cycles < 4 * bags + 2 * latency, f"{cycles} cycles for {bags} one-line bags"


def test_verilog_lints_clean(tmp_path):
    dut = GradFeed(addr_width=48, id_width=3, max_glines=16)
    assert_lints_clean(dut, "grad_feed_a48", tmp_path)


def test_next_bag_follows_without_a_gap():
    """Bags of several rows whose lines are read ahead: a bag's first row follows the
    previous bag's last item at once, so the items leave at one per cycle (plus the
    first read latency and the end item), not two cycles more per bag."""
    model = _model(4)
    bags, per_bag, glines = 48, 3, 2
    job = {"num_bags": bags, "glines": glines, "items": glines, "counts": [per_bag] * bags,
           "data_addr": 0x20000,
           "rows": [[(b * per_bag + k) % 50 for k in range(per_bag)] for b in range(bags)],
           "weights": [[0] * per_bag for _ in range(bags)], "finish_delay": 0}
    [(items, cycles)] = _run(model, [job], seed=4, traffic=SMOOTH, row_gap=0.0, out_bp=0.0)
    assert items == _expected(model, job)
    n = bags * per_bag * glines
    latency = TIMING.read_latency + TIMING.jitter
    assert cycles < n + 2 * latency + 16, f"{cycles} cycles for {n} items in {bags} bags"


def test_checked_starts_the_read_ahead_before_the_first_row():
    """With ``checked`` at ``start``, the gradient is read while the rows are still to
    come: the first item follows the first row at once instead of one read latency
    later."""
    model = _model(5)
    delay = 100
    job = {"num_bags": 4, "glines": 2, "items": 2, "counts": [1] * 4, "data_addr": 0x30000,
           "rows": [[b] for b in range(4)], "weights": [[0] for _ in range(4)],
           "finish_delay": 0, "checked_at": 0, "row_delay": delay}
    [(items, cycles)] = _run(model, [job], seed=5, traffic=SMOOTH, row_gap=0.0, out_bp=0.0)
    assert items == _expected(model, job)
    assert cycles < delay + 4 * 4 + 10, f"{cycles} cycles: the reads waited for the rows"
    [(_, late)] = _run(model, [job | {"checked_at": None}], seed=5, traffic=SMOOTH,
                       row_gap=0.0, out_bp=0.0)
    assert late >= delay + TIMING.read_latency, f"{late} cycles without checked"


def _one_row_bags(base: int, bags: int, glines: int, **extra) -> dict:
    return {"num_bags": bags, "glines": glines, "items": glines, "counts": [1] * bags,
            "data_addr": base, "rows": [[b] for b in range(bags)],
            "weights": [[0] for _ in range(bags)], "finish_delay": 0, **extra}


def test_next_update_read_ahead_hides_the_read_latency():
    """With ``ahead`` raised while an UPDATE runs, the next UPDATE's gradients are read
    behind its lines: its first item follows its first row at once instead of one read
    latency after its ``start``."""
    model = _model(6)
    def jobs(ahead_at):
        return [_one_row_bags(0x40000, 4, 2, checked_at=0),
                _one_row_bags(0x50000, 4, 2, checked_at=0, ahead_at=ahead_at, ahead_hold=0)]
    ahead, plain = jobs(0), jobs(None)
    got = _run(model, ahead, seed=6, traffic=SMOOTH, row_gap=0.0, out_bp=0.0)
    for job, (items, _) in zip(ahead, got, strict=True):
        assert items == _expected(model, job)
    assert ahead[1]["first_item"] < 8, f"first item {ahead[1]['first_item']} cycles in"
    _run(model, plain, seed=6, traffic=SMOOTH, row_gap=0.0, out_bp=0.0)
    assert plain[1]["first_item"] >= TIMING.read_latency, "no read latency without ahead"


def test_a_stopped_update_ends_after_its_reads_with_the_next_read_ahead():
    """An UPDATE whose sequencer stopped before any row (``seq_error``), its gradient
    lines all asked for and the next UPDATE read ahead behind them: its end item waits
    until its own lines have come back, so the next one's items carry the next one's
    lines (not lines still landing in the ring)."""
    model = _model(7)
    jobs = [_one_row_bags(0x60000, 2, 4, checked_at=0, seq_error=(0, 1 << 30), truncate=True)
            | {"finish_delay": 12},     # its 8 reads issued before ``finish``
            _one_row_bags(0x70000, 3, 2, checked_at=0, ahead_at=0, ahead_hold=0)]
    got = _run(model, jobs, seed=7, traffic=SMOOTH, row_gap=0.0, out_bp=0.0)
    for k, (job, (items, _)) in enumerate(zip(jobs, got, strict=True)):
        _check(items, _expected(model, job), f"UPDATE {k}")
    assert got[0][1] >= TIMING.read_latency, f"ended {got[0][1]} cycles in, reads in flight"
