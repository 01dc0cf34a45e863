# amaranth: UnusedElaboratable=no
"""Recovery split into components (hw/ckpt/recovery.py) against the single-block
recovery it replaced (tests/_recovery_ref.py), cycle by cycle.

Both run in one simulation on the same inputs: the PMEM model (random latency and
jitter, random AR/AW/W backpressure and R/B idle cycles) serves the reference's port,
the new block sees exactly the same input values, and every output port of the two
(the AXI channels, ``busy``/``done`` and every result) must be equal on every cycle.
Stimulus: random undo-log histories (torn records, stale epochs, garbage slots, wrapped
rings, short slots), random MLP slots, bad superblocks and layouts, PMEM too small for
the log, a row or an MLP slot (DECERR on R and B), ``start`` pulses while busy and back
to back recoveries. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring

from hw.ckpt.recovery import Recovery
from tb.pmem import PmemModel, PmemTiming

from ._recovery_ref import RecoveryRef
from .amaranth_sim import simulate
from .axi_pmem import AxiPmemPort, Traffic
from .test_ckpt_recovery import (
    ADDR_WIDTH,
    BAD_LAYOUTS,
    MAX_SLOT_LINES,
    MLP_SLOTS,
    PMEM_SIZE,
    SCENARIOS,
    history,
    put_mlp,
    raw_superblock,
)


def ports(dut: wiring.Component, flow) -> list[tuple[str, object]]:
    return [(".".join(map(str, path)), value)
            for path, member, value in dut.signature.flatten(dut) if member.flow == flow]


class _Pair(Elaboratable):
    """The reference and the new block, the new one's inputs driven by the reference's."""

    def __init__(self, **params):
        self.ref = RecoveryRef(**params)
        self.new = Recovery(**params)

    def elaborate(self, platform):
        m = Module()
        m.submodules.ref = self.ref
        m.submodules.new = self.new
        for (name, a), (name_b, b) in zip(ports(self.ref, wiring.In),
                                          ports(self.new, wiring.In), strict=True):
            assert name == name_b
            m.d.comb += b.eq(a)
        return m


def random_image(rng: random.Random):
    """A PMEM image and the PMEM size that serves it."""
    kw = dict(rng.choice(list(SCENARIOS.values())))
    kw["torn"] = kw.get("torn", False) or rng.random() < 0.4
    kw["garbage"] = kw.get("garbage", 0) or rng.choice([0, 0, 2])
    sc = history(rng, **kw)
    img = sc.image
    kinds = ["none", "zero", "valid", "valid", "torn", "long"]
    for slot in (0, 1):
        put_mlp(img, rng, slot, rng.choice(kinds), rng.randint(0, sc.committed + 2))
    size = PMEM_SIZE
    case = rng.random()
    if case < 0.1:
        img.write(0, raw_superblock(**BAD_LAYOUTS[rng.choice(list(BAD_LAYOUTS))]))
    elif case < 0.15:
        img.write(0, raw_superblock(check=rng.getrandbits(64)))
    elif case < 0.35:       # DECERR: restore writes to the tables, or MLP slot 1's reads
        size = rng.choice([0x2_0000 + 64 * rng.randrange(24), 0x2_0000, MLP_SLOTS[1]])
    return img, size


@pytest.mark.parametrize("max_reads", [1, 3, 8, 128])
def test_same_as_reference(max_reads, seed):
    rng = random.Random(seed)
    pair = _Pair(addr_width=ADDR_WIDTH, id_width=2, max_slot_lines=MAX_SLOT_LINES,
                 max_reads=max_reads)
    outs = list(zip(ports(pair.ref, wiring.Out), ports(pair.new, wiring.Out), strict=True))
    runs = 6

    async def bench(ctx):
        for _ in range(runs):
            img, size = random_image(rng)
            model = PmemModel(size=size, rng=random.Random(rng.getrandbits(32)),
                              timing=PmemTiming(read_latency=rng.randint(1, 12),
                                                write_latency=rng.randint(1, 12),
                                                jitter=rng.choice([0, 4, 16])))
            for addr, data in img.snapshot().items():
                if addr < size:
                    model.write(addr, data)
            p = rng.choice([0.0, 0.1, 0.5])
            traffic = Traffic(ar_bp=p, aw_bp=p, w_bp=rng.choice([0.0, 0.3]),
                              r_idle=rng.choice([0.0, 0.3]), b_idle=p)
            axi = AxiPmemPort(pair.ref.pmem, model, rng, traffic)
            ctx.set(pair.ref.start, 1)
            cycle = 0
            while True:
                values = await axi.tick(ctx, *(v for (_, v), _ in outs),
                                        *(v for _, (_, v) in outs))
                n = len(outs)
                for ((name, _), _), a, b in zip(outs, values[:n], values[n:], strict=True):
                    a, b = getattr(a, "value", a), getattr(b, "value", b)   # enums
                    assert a == b, f"cycle {cycle}: {name} is {b}, the reference's {a}"
                ctx.set(pair.ref.start, rng.random() < 0.02)    # ignored while busy
                cycle += 1
                assert cycle < 200_000, "recovery did not finish"
                if ctx.get(pair.ref.done) and not ctx.get(pair.ref.start):
                    break
            assert not axi.errors, axi.errors[:5]
            assert model.outstanding == (0, 0)
            print(f"run of {cycle} cycles: status {ctx.get(pair.ref.status)}, "
                  f"{ctx.get(pair.ref.rolled_back)} rolled back, {len(axi.aws)} writes")
            for _ in range(rng.randint(0, 3)):
                await ctx.tick()

    simulate(pair, bench)

