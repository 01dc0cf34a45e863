# amaranth: UnusedElaboratable=no
"""MlpCheck (hw/ckpt/mlp_check.py) in the Amaranth simulator against ``sim.ckpt``.

The bench plays the recovery: for slot 0 and then slot 1 it serves the header line at
``hdr_addr``, then the ``pay_lines`` lines at ``pay_addr`` (random idle cycles between
lines), then pulses ``decide``. Slots are built as in ``tests/test_ckpt_recovery.py``
(valid with every kind of length, torn, too long, zero, garbage; batches before, at and
after ``committed``). The addresses, the payload length and the result must match
``sim.ckpt.read_mlp_slot`` and ``newest_mlp``; the result stays ``MLP_NONE`` until slot
1 is decided, and ``clear`` resets it. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

from hw.ckpt.formats import MLP_MAGIC
from hw.ckpt.mlp_check import MLP_NONE, MlpCheck
from sim.ckpt import Image, Superblock, newest_mlp, parse_mlp_header, read_mlp_slot

from .amaranth_sim import simulate
from .test_ckpt_recovery import ADDR_WIDTH, MLP_BYTES, MLP_SLOTS, put_mlp

LINE = 64
KINDS = ["none", "zero", "valid", "valid", "valid", "torn", "long"]


def test_slots(seed):
    rng = random.Random(seed)
    dut = MlpCheck(addr_width=ADDR_WIDTH)
    sb = Superblock(0x1000, 16, 5, *MLP_SLOTS, MLP_BYTES)
    seen: set = set()

    async def line(ctx, img: Image, addr: int):
        while rng.random() < 0.4:
            await ctx.tick()
        ctx.set(dut.i_line.valid, 1)
        ctx.set(dut.i_line.payload, int.from_bytes(img.read(addr, LINE), "little"))
        await ctx.tick()
        ctx.set(dut.i_line.valid, 0)

    async def bench(ctx):
        ctx.set(dut.slot0, MLP_SLOTS[0])
        ctx.set(dut.slot1, MLP_SLOTS[1])
        ctx.set(dut.slot_bytes, MLP_BYTES)
        for _ in range(120):
            img = Image()
            committed = rng.randint(2, 6)
            kinds = [rng.choice(KINDS), rng.choice(KINDS)]
            if rng.random() < 0.5:      # one slot alone decides the result
                kinds[rng.randrange(2)] = "none"
            for slot in (0, 1):
                put_mlp(img, rng, slot, kinds[slot], rng.randint(1, committed + 1))
            ctx.set(dut.committed, committed)
            ctx.set(dut.clear, 1)
            await ctx.tick()
            ctx.set(dut.clear, 0)
            for slot in (0, 1):
                ref = read_mlp_slot(img, sb, slot)
                assert ctx.get(dut.second) == slot
                assert ctx.get(dut.hdr_addr) == sb.mlp_header_addr(slot)
                assert ctx.get(dut.pay_addr) == MLP_SLOTS[slot]
                await line(ctx, img, sb.mlp_header_addr(slot))
                lines = ctx.get(dut.pay_lines)
                hdr = parse_mlp_header(img.read(sb.mlp_header_addr(slot), LINE))
                header_ok = hdr["magic"] == MLP_MAGIC and hdr["length"] <= MLP_BYTES
                assert lines == (-(-ref.length // LINE) if header_ok else 0)
                for k in range(lines):
                    await line(ctx, img, MLP_SLOTS[slot] + LINE * k)
                assert (ctx.get(dut.mlp_slot), ctx.get(dut.mlp_batch)) == (MLP_NONE, 0)
                ctx.set(dut.decide, 1)
                await ctx.tick()
                ctx.set(dut.decide, 0)
            best = newest_mlp([read_mlp_slot(img, sb, s) for s in (0, 1)], committed)
            want = (MLP_NONE, 0) if best is None else (best.slot, best.batch_id)
            assert (ctx.get(dut.mlp_slot), ctx.get(dut.mlp_batch)) == want
            seen.add(want[0])
        print(f"results seen: {sorted(seen)}")
        assert seen == {0, 1, MLP_NONE}

    simulate(dut, bench)
