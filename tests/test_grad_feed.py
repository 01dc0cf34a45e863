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
"""

from __future__ import annotations

import random

import pytest

from hw.engine.grad_feed import GradFeed
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import ROUGH, SMOOTH, AxiPmemPort, Traffic
from .conftest import assert_lints_clean

ADDR_WIDTH = 20
PMEM_SIZE = 1 << 20
LINE = 64
MAX_GLINES = 4
TIMING = PmemTiming(read_latency=30, write_latency=12, jitter=10)


def _updates(rng: random.Random, n: int) -> list[dict]:
    """``n`` UPDATEs: 1 to 12 bags (often one or two: their rows are over before their
    lines have all been asked for) of 0..5 counted rows (some empty), 1..MAX_GLINES
    gradient lines, items = glines or 2 * glines (bf16 tables), each in its own
    buffer."""
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
                     "row_delay": rng.choice((0, 0, 10))})
    return jobs


def _expected(model: PmemModel, job: dict) -> list[tuple]:
    out = []
    g = job["glines"]
    for b, rows in enumerate(job["rows"]):
        lines = [int.from_bytes(model.read(job["data_addr"] + (b * g + j) * LINE, LINE),
                                "little") for j in range(g)]
        for row, weight in zip(rows, job["weights"][b], strict=True):
            for j in range(job["items"]):
                out.append((row, j, weight, lines[j] if j < g else 0, 0, 0))
    return [*out, ("nop",)]


def _run(model: PmemModel, jobs: list[dict], *, seed: int, traffic: Traffic,
         row_gap: float, out_bp: float, max_cycles: int = 40_000
         ) -> list[tuple[list[tuple], int]]:
    """Run ``jobs`` back to back; per job its items and the cycles from ``start`` to
    the last item."""
    dut = GradFeed(addr_width=ADDR_WIDTH, id_width=2, max_glines=MAX_GLINES)
    rng = random.Random(seed)
    port = AxiPmemPort(dut.pmem, model, rng, traffic)
    got: list[tuple[list[tuple], int]] = []
    reads: list[int] = []
    o = dut.o_items

    async def bench(ctx):
        for job in jobs:
            items: list[tuple] = []
            for name in ("data_addr", "num_bags", "glines", "items"):
                ctx.set(getattr(dut, name), job[name])
            checked_at, row_delay = job.get("checked_at"), job.get("row_delay", 0)
            ctx.set(dut.start, 1)
            ctx.set(dut.checked, int(checked_at == 0))
            await port.tick(ctx)
            ctx.set(dut.start, 0)
            feed = []
            for b, rows in enumerate(job["rows"]):
                if not rows:
                    feed.append({"row": 0, "row_k": 0, "last_row": 0, "weight": 0,
                                 "empty_bag": 1, "count": 0})
                for k, (row, w) in enumerate(zip(rows, job["weights"][b], strict=True)):
                    feed.append({"row": row, "row_k": k, "last_row": int(k == len(rows) - 1),
                                 "weight": w, "empty_bag": 0, "count": len(rows)})
            finish_at = None
            start = port.cycle
            while True:
                assert port.cycle - start < max_cycles, "UPDATE did not finish (hang)"
                if checked_at is not None and port.cycle - start + 1 == checked_at:
                    ctx.set(dut.checked, 1)         # held until the job ends
                if feed and port.cycle - start >= row_delay and not rng.random() < row_gap:
                    ctx.set(dut.i_rows.payload, feed[0])
                    ctx.set(dut.i_rows.valid, 1)
                else:
                    ctx.set(dut.i_rows.valid, 0)
                ctx.set(dut.finish, int(finish_at is not None and port.cycle == finish_at))
                ctx.set(o.ready, not rng.random() < out_bp)
                (rv, rr, ov, orr, payload, arv, arr, ara) = await port.tick(
                    ctx, dut.i_rows.valid, dut.i_rows.ready, o.valid, o.ready, o.payload,
                    dut.pmem.arvalid, dut.pmem.arready, dut.pmem.araddr)
                if arv and arr:
                    reads.append(ara)
                if rv and rr:
                    feed.pop(0)
                    if not feed:
                        finish_at = port.cycle + job["finish_delay"]
                if ov and orr:
                    if payload.nop:
                        assert payload.last, "nop item without last"
                        items.append(("nop",))
                        break
                    assert not payload.last, "last on an update item"
                    items.append((payload.row, payload.line, payload.weight, payload.grad, 0,
                                  0))
            cycles = port.cycle - start
            ctx.set(dut.i_rows.valid, 0)
            ctx.set(dut.finish, 0)
            ctx.set(dut.checked, 0)
            (busy,) = await port.tick(ctx, dut.busy)
            assert not busy, "busy after the last item"
            assert model.outstanding == (0, 0), "reads in flight after the last item"
            got.append((items, cycles))

    simulate(dut, bench)
    assert not port.errors, "\n".join(port.errors[:10])
    # Every line of every gradient buffer read exactly once, nothing else read.
    want = sorted(job["data_addr"] + i * LINE for job in jobs
                  for i in range(job["num_bags"] * job["glines"]))
    assert sorted(reads) == want, "reads differ from the gradient buffers' lines"
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
        want = _expected(model, job)
        assert len(items) == len(want), f"UPDATE {k}: {len(items)} items, want {len(want)}"
        for i, (a, b) in enumerate(zip(items, want, strict=True)):
            assert a == b, f"UPDATE {k} item {i}: {a[:3]} differs from {b[:3]}"


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
