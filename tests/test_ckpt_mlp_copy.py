# amaranth: UnusedElaboratable=no
"""The MLP checkpoint copier (hw/ckpt/mlp_copy.py) in the Amaranth simulator.

PMEM is :class:`tb.pmem.PmemModel` with latency, jitter and (in the rough cases) random
AR/AW/W backpressure and R/B idle cycles; seeds are printed and ``SEED=<n>`` replays one.
Every copy is checked against the contract (``docs/checkpoint.md``, "MLP checkpoint")
through ``sim.ckpt.encode_mlp_slot``: the slot's payload equals the staging bytes, its
header line is the golden header, nothing else in PMEM changed, and the header's write
is issued only after every payload write's B.
"""

from __future__ import annotations

import random

import pytest

from hw.ckpt.mlp_copy import MlpCopier
from sim.ckpt import encode_mlp_slot, mlp_slot_valid
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import ROUGH, SMOOTH, AxiPmemPort, Traffic
from .conftest import assert_lints_clean

ADDR_WIDTH = 21                 # above PMEM_SIZE: addresses past it answer DECERR
PMEM_SIZE = 1 << 20
LINE = 64
TIMING = PmemTiming(read_latency=20, write_latency=12, jitter=10)


def _copies(model: PmemModel, jobs: list[dict], *, seed: int, traffic: Traffic,
            buffer_lines: int = 8, max_cycles: int = 50_000) -> list[dict]:
    """Run ``jobs`` (``src, dst, header_addr, lines, batch_id``) back to back, with a
    random gap; per job: ``error``, ``cycles`` and the write order seen on AW."""
    dut = MlpCopier(addr_width=ADDR_WIDTH, id_width=2, buffer_lines=buffer_lines)
    rng = random.Random(seed)
    port = AxiPmemPort(dut.pmem, model, rng, traffic)
    results: list[dict] = []

    async def bench(ctx):
        for job in jobs:
            for _ in range(rng.randrange(3)):
                await port.tick(ctx)
            for name in ("src", "dst", "header_addr", "lines", "batch_id"):
                ctx.set(getattr(dut, name), job[name])
            ctx.set(dut.start, 1)
            start = port.cycle
            first_aw = len(port.aws)
            (busy,) = await port.tick(ctx, dut.busy)
            ctx.set(dut.start, 0)
            hdr_b_before = None
            while True:
                assert port.cycle - start < max_cycles, "copy did not finish (hang)"
                outstanding_writes = model.outstanding[1]
                done, error, busy = await port.tick(ctx, dut.done, dut.error, dut.busy)
                if hdr_b_before is None and port.aws[first_aw:] \
                        and port.aws[-1] == job["header_addr"]:
                    hdr_b_before = outstanding_writes
                if done:
                    break
                assert busy, "busy dropped before done"
            (busy,) = await port.tick(ctx, dut.busy)
            assert not busy
            results.append({"error": error, "cycles": port.cycle - start,
                            "aws": port.aws[first_aw:], "writes_open_at_header": hdr_b_before})
        assert model.outstanding == (0, 0), "done with transactions outstanding"

    simulate(dut, bench)
    assert not port.errors, "\n".join(port.errors[:10])
    return results


def _model(seed: int) -> PmemModel:
    model = PmemModel(size=PMEM_SIZE, timing=TIMING, rng=random.Random(seed))
    rng = random.Random(seed ^ 0x5A5A)
    model.write(0, rng.randbytes(PMEM_SIZE))
    return model


@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
@pytest.mark.parametrize("run", range(3))
def test_copies_match_contract(run, seed, traffic):
    """Random copies of 1..40 lines between random places: slot payload and header bit
    for bit as the contract's encoder makes them, nothing else written, header last."""
    rng = random.Random(seed)
    model = _model(seed)
    jobs = []
    window = PMEM_SIZE // 8                 # each job's slot in its own window
    for k in range(4):
        lines = rng.randint(1, 40)
        src = rng.randrange(0, PMEM_SIZE // 2 - lines * LINE, LINE)
        low = PMEM_SIZE // 2 + k * window
        dst = rng.randrange(low, low + window - (lines + 2) * LINE, LINE)
        slot_bytes = lines * LINE + rng.choice((0, LINE))     # slot at least as large
        jobs.append({"src": src, "dst": dst, "header_addr": dst + slot_bytes, "lines": lines,
                     "batch_id": rng.getrandbits(32)})
    # Expected image: apply each job in order to a copy of the initial memory.
    image = bytearray(model.read(0, PMEM_SIZE))
    for job in jobs:
        payload = bytes(image[job["src"]:job["src"] + job["lines"] * LINE])
        padded, header = encode_mlp_slot(job["batch_id"], payload)
        image[job["dst"]:job["dst"] + len(padded)] = padded
        image[job["header_addr"]:job["header_addr"] + LINE] = header
    results = _copies(model, jobs, seed=seed, traffic=traffic)
    for job, res in zip(jobs, results, strict=True):
        assert not res["error"]
        n = job["lines"]
        assert res["aws"] == [job["dst"] + LINE * i for i in range(n)] + [job["header_addr"]]
        assert res["writes_open_at_header"] == 0, "header issued before payload was durable"
        header = model.read(job["header_addr"], LINE)
        assert mlp_slot_valid(header, model.read(job["dst"], n * LINE))
    got = model.read(0, PMEM_SIZE)
    if got != bytes(image):
        bad = next(i for i in range(PMEM_SIZE) if got[i] != image[i])
        raise AssertionError(f"PMEM differs from the contract's image at {bad:#x}")


def test_read_error_skips_header(seed):
    """A staging range past the end of PMEM (DECERR on its last reads): ``done`` with
    ``error``, no hang, the header line untouched; the next copy works."""
    model = _model(seed)
    src = PMEM_SIZE - 3 * LINE
    bad = {"src": src, "dst": 0x1000, "header_addr": 0x1000 + 8 * LINE, "lines": 6,
           "batch_id": 7}
    good = {"src": 0x8000, "dst": 0x1000, "header_addr": 0x1000 + 8 * LINE, "lines": 5,
            "batch_id": 8}
    old_header = model.read(bad["header_addr"], LINE)
    payload = model.read(good["src"], good["lines"] * LINE)
    res = _copies(model, [bad], seed=seed, traffic=ROUGH)
    assert res[0]["error"]
    assert bad["header_addr"] not in res[0]["aws"]
    assert model.read(bad["header_addr"], LINE) == old_header
    res = _copies(model, [good], seed=seed + 1, traffic=ROUGH)
    assert not res[0]["error"]
    assert model.read(good["header_addr"], LINE) == encode_mlp_slot(8, payload)[1]


def test_full_rate_when_smooth():
    """With no backpressure a long copy runs at the media's rate: reads and writes
    share one channel of one line per cycle, so 256 lines take at least 512 cycles;
    they must take no more than that plus the latencies and a small margin."""
    model = _model(1)
    job = {"src": 0x10000, "dst": 0x40000, "header_addr": 0x40000 + 256 * LINE, "lines": 256,
           "batch_id": 3}
    res = _copies(model, [job], seed=1, traffic=SMOOTH, buffer_lines=32)
    assert res[0]["cycles"] < 512 + 2 * (TIMING.read_latency + TIMING.write_latency
                                         + TIMING.jitter), res


def test_verilog_lints_clean(tmp_path):
    dut = MlpCopier(addr_width=48, id_width=3)
    assert_lints_clean(dut, "ckpt_mlp_copy_a48", tmp_path)
