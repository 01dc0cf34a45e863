# amaranth: UnusedElaboratable=no
"""PooledMask (hw/engine/pooled_mask.py) in the Amaranth simulator.

Random vectors (``dim`` up to 1024, the configurations' limit; fp32 and bf16; loaded
at random times) and random pooled lines of every index around the vector's end pass
through with random idle cycles and random backpressure; every line must come out
unchanged but for the bytes at or past ``dim`` elements, zeroed, with valid / ready
passed straight through. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

from hw.engine.pooled_mask import PooledMask

from .amaranth_sim import simulate

#: The largest ``dim`` a device executes (``DeviceConfig.engine_max_dim``).
MAX_DIM = 1024


def masked(data: int, line: int, dim: int, bf16: bool) -> int:
    keep = dim * (2 if bf16 else 4)
    out = 0
    for k in range(64):
        if 64 * line + k < keep:
            out |= data & (0xFF << 8 * k)
    return out


def test_masks(seed):
    rng = random.Random(seed)
    dut = PooledMask()
    seen = 0

    async def bench(ctx):
        nonlocal seen
        dim, bf16 = 1, False
        for i in range(2000):
            if i == 0 or rng.random() < 0.05:
                dim = rng.choice([1, 15, 16, 17, 32, MAX_DIM, rng.randint(1, MAX_DIM)])
                bf16 = rng.random() < 0.5
                ctx.set(dut.dim, dim)
                ctx.set(dut.bf16, bf16)
                ctx.set(dut.load, 1)
                await ctx.tick()
                ctx.set(dut.load, 0)
                ctx.set(dut.dim, rng.getrandbits(13))    # only the loaded value counts
            end = dim * (2 if bf16 else 4) // 64
            line = rng.choice([0, end, end + 1, max(0, end - 1), rng.randrange(256)]) % 256
            data = rng.getrandbits(512)
            valid, ready = rng.random() < 0.7, rng.random() < 0.6
            ctx.set(dut.i_line.valid, valid)
            ctx.set(dut.i_line.payload, {"data": data, "line": line, "last": line & 1})
            ctx.set(dut.o_line.ready, ready)
            o_valid, i_ready, out = ctx.get(dut.o_line.valid), ctx.get(dut.i_line.ready), \
                ctx.get(dut.o_line.payload)
            assert (o_valid, i_ready) == (valid, ready)
            assert out.line == line and out.last == line & 1
            assert out.data == masked(data, line, dim, bf16), (dim, bf16, line)
            seen += valid and ready
            await ctx.tick()

    simulate(dut, bench)
    assert seen > 500
