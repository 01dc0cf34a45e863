# amaranth: UnusedElaboratable=no
"""RecordWriter (hw/ckpt/record_writer.py) in the Amaranth simulator.

Random lines (some flagged as headers) are offered on ``i_write`` with random idle
cycles; :class:`tb.pmem.PmemModel` serves the port with random latency, AW/W
backpressure and B idle cycles (and slow writes, so that :data:`MAX_WRITES` is
reached). Checks: the writes are the lines in order with their data; ``records``
pulses exactly with the B of each header line; ``resp_error`` with each error
response; never more than ``MAX_WRITES`` writes without their B; ``idle`` only with
nothing in flight; a stream-rule checker on AW and W; one line per cycle when nothing
pushes back. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.ckpt.record_writer import MAX_WRITES, RecordWriter
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import AxiPmemPort, Traffic
from .stream_rule import StreamRule

AW = 20
LINE = 64


def _run(seed: int, *, traffic: Traffic, idle: float, timing: PmemTiming, n: int = 400,
         size: int = 1 << AW) -> dict:
    rng = random.Random(seed)
    dut = RecordWriter(addr_width=AW, id_width=2)
    model = PmemModel(size=size, timing=timing, rng=random.Random(seed))
    axi = AxiPmemPort(dut.pmem, model, rng, traffic)
    rule = StreamRule("i_write (source)", strict=True)
    todo = [(LINE * rng.randrange((1 << AW) // LINE), rng.getrandbits(512), rng.random() < 0.3)
            for _ in range(n)]
    flags: list[bool] = []          # header flag of each AW, in order: Bs return so
    stats = {"records": 0, "want_records": 0, "errors": 0, "error_resps": 0, "max_out": 0,
             "cycles": 0}

    async def bench(ctx):
        offered = None
        bs = taken = cycle = 0
        while taken < n or not ctx.get(dut.idle) or cycle < 3:
            if offered is None and taken < n and rng.random() >= idle:
                offered = todo[taken]
            ctx.set(dut.i_write.valid, offered is not None)
            if offered is not None:
                ctx.set(dut.i_write.payload, dict(zip(("addr", "data", "header"), offered,
                                                      strict=True)))
            ready, records, resp_error, idle_, bvalid, bready, bresp = await axi.tick(
                ctx, dut.i_write.ready, dut.records, dut.resp_error, dut.idle,
                dut.pmem.bvalid, dut.pmem.bready, dut.pmem.bresp)
            rule.observe(cycle, offered is not None, ready, offered)
            if idle_:
                assert len(axi.aws) == bs == len(flags), "idle with a write in flight"
            if offered is not None and ready:
                flags.append(offered[2])
                offered = None
                taken += 1
            if bvalid and bready:
                assert records == flags[bs], f"records at B {bs}"
                stats["want_records"] += flags[bs]
                stats["error_resps"] += bool(bresp)
                bs += 1
            else:
                assert not records
            stats["records"] += records
            stats["errors"] += resp_error
            stats["max_out"] = max(stats["max_out"], len(flags) - bs)
            cycle += 1
            assert cycle < 200_000, "writer hangs"
        stats["cycles"] = cycle

    simulate(dut, bench)
    assert not axi.errors, axi.errors[:5]
    assert axi.aws == [a for a, _, _ in todo]
    assert model.outstanding == (0, 0)
    if size == 1 << AW:
        last = {a: d for a, d, _ in todo}
        for a, d in last.items():
            assert model.read(a, LINE) == d.to_bytes(LINE, "little"), hex(a)
    assert stats["max_out"] <= MAX_WRITES
    assert stats["records"] == stats["want_records"] and stats["errors"] == stats["error_resps"]
    return stats


TRAFFIC = {"smooth": (Traffic(), 0.0), "rough": (Traffic(aw_bp=0.4, w_bp=0.4, b_idle=0.3), 0.3),
           "aw_only": (Traffic(aw_bp=0.7), 0.1), "w_only": (Traffic(w_bp=0.7), 0.1)}


@pytest.mark.parametrize("traffic", list(TRAFFIC))
def test_lines(traffic, seed):
    t, idle = TRAFFIC[traffic]
    rng = random.Random(seed)
    _run(seed, traffic=t, idle=idle,
         timing=PmemTiming(write_latency=rng.randint(1, 40), jitter=8, peak_lines_per_cycle=4))


def test_outstanding_limit(seed):
    got = _run(seed, traffic=Traffic(), idle=0.0,
               timing=PmemTiming(write_latency=600, peak_lines_per_cycle=4))
    assert got["max_out"] == MAX_WRITES


def test_error_responses(seed):
    got = _run(seed, traffic=Traffic(b_idle=0.2), idle=0.2, size=1 << (AW - 1),
               timing=PmemTiming(write_latency=8, peak_lines_per_cycle=4))
    assert got["errors"] > 0


def test_one_line_per_cycle(seed):
    got = _run(seed, traffic=Traffic(), idle=0.0, n=200,
               timing=PmemTiming(write_latency=10, peak_lines_per_cycle=4))
    assert got["cycles"] < 200 + 40, got["cycles"]
