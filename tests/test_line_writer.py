# amaranth: UnusedElaboratable=no
"""LineWriter (hw/engine/line_writer.py) in the Amaranth simulator.

Random writes (random addresses in a small region so lines are rewritten, random byte
strobes) are offered with random idle cycles; :class:`tb.pmem.PmemModel` serves the
port with random latency, AW/W backpressure and B idle cycles. Checks: the writes are
the items in order; the PMEM image is their strobed sequential application;
``w_count`` and ``b_count`` count the items taken and the Bs; ``resp_error`` pulses with
each error response; a stream-rule checker on AW and W; one write per cycle when
nothing pushes back. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.engine.line_writer import COUNT_BITS, LineWriter
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import AxiPmemPort, Traffic

AW = 20
LINE = 64
REGION = 0x2000


def _run(seed: int, *, traffic: Traffic, idle: float, n: int = 300, size: int = 1 << AW,
         latency: int = 10) -> dict:
    rng = random.Random(seed)
    dut = LineWriter(addr_width=AW, id_width=2)
    model = PmemModel(size=size, rng=random.Random(seed),
                      timing=PmemTiming(write_latency=latency, jitter=8, peak_lines_per_cycle=4))
    axi = AxiPmemPort(dut.pmem, model, rng, traffic)
    todo = [(LINE * rng.randrange(REGION // LINE), rng.getrandbits(512),
             rng.choice([(1 << 64) - 1, 0xFF, rng.getrandbits(64)])) for _ in range(n)]
    stats = {"errors": 0, "error_resps": 0, "cycles": 0}

    async def bench(ctx):
        offered, taken, bs, cycle = None, 0, 0, 0
        while taken < n or bs < n:
            if offered is None and taken < n and rng.random() >= idle:
                offered = todo[taken]
                ctx.set(dut.i_write.payload, dict(zip(("addr", "data", "strb"), offered,
                                                      strict=True)))
            ctx.set(dut.i_write.valid, offered is not None)
            ready, w_count, b_count, err, bvalid, bresp = await axi.tick(
                ctx, dut.i_write.ready, dut.w_count, dut.b_count, dut.resp_error,
                dut.pmem.bvalid, dut.pmem.bresp)
            assert (w_count, b_count) == (taken % (1 << COUNT_BITS), bs % (1 << COUNT_BITS))
            if offered is not None and ready:
                offered, taken = None, taken + 1
            stats["errors"] += err
            if bvalid:
                bs += 1
                stats["error_resps"] += bool(bresp)
            cycle += 1
            assert cycle < 100_000, "writer hangs"
        stats["cycles"] = cycle

    simulate(dut, bench)
    assert not axi.errors, axi.errors[:5]
    assert axi.aws == [a for a, _, _ in todo]
    assert stats["errors"] == stats["error_resps"]
    if size == 1 << AW:
        image = {}
        for a, d, strb in todo:
            line = bytearray(image.get(a, bytes(LINE)))
            for k in range(LINE):
                if strb >> k & 1:
                    line[k] = d >> 8 * k & 0xFF
            image[a] = bytes(line)
        for a, line in image.items():
            assert model.read(a, LINE) == line, hex(a)
    return stats


@pytest.mark.parametrize(("bp", "idle"), [(0.0, 0.0), (0.4, 0.3), (0.7, 0.1)],
                         ids=["smooth", "rough", "port_paused"])
def test_writes(bp, idle, seed):
    _run(seed, traffic=Traffic(aw_bp=bp, w_bp=bp / 2, b_idle=bp / 2), idle=idle)


def test_error_responses(seed):
    got = _run(seed, traffic=Traffic(b_idle=0.3), idle=0.2, size=REGION // 2)
    assert got["errors"] > 0


def test_one_write_per_cycle(seed):
    got = _run(seed, traffic=Traffic(), idle=0.0, n=200, latency=10)
    assert got["cycles"] < 200 + 40, got["cycles"]
