# amaranth: UnusedElaboratable=no
"""BagEmitter (hw/engine/bag_emitter.py) in the Amaranth simulator.

Descriptors of random bags (empty ones, bags of padding only, weighted or not) go in one
after the other: the bench pulses ``i_start`` while the block is idle, then offers each
bag's ``length`` and ``counted`` on ``i_bag`` and the indices and weights on their
streams, each with random idle cycles; ``o_rows`` has random backpressure. The items
must equal those the contract gives (a golden model written from the docstring), the
block must take exactly the indices (and, when weighted, the weights) of the bags and
raise ``o_done`` only once every item of the descriptor has been loaded. A passive
checker holds ``o_rows`` to the stream rules. Seeds are printed; ``SEED=<n>`` replays
one.
"""

from __future__ import annotations

import random

import pytest

from hw.engine.bag_emitter import ONE_FP32, BagEmitter
from hw.engine.row_gather import ROW

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import unpack
from .stream_rule import StreamRule
from .stream_source import Source

M32 = 0xFFFFFFFF


def random_desc(rng: random.Random) -> dict:
    """Settings and bags (lists of ``(index, weight)``) of one descriptor."""
    pad = rng.choice([None, 7, M32])
    bags = []
    for _ in range(rng.choice([1, 2, rng.randint(1, 12)])):
        shape = rng.random()
        length = 0 if shape < 0.15 else rng.randint(1, 3) if shape < 0.6 else rng.randint(1, 30)
        only_padding = pad is not None and rng.random() < 0.15
        bags.append([(pad if only_padding or (pad is not None and rng.random() < 0.3)
                      else rng.randrange(20), rng.getrandbits(32)) for _ in range(length)])
    return {"weighted": int(rng.random() < 0.5), "has_padding_idx": int(pad is not None),
            "padding_idx": pad or 0, "num_bags": len(bags), "bags": bags}


def expected_rows(desc: dict) -> list[dict]:
    """The docstring's items: each counted index, or one empty_bag item per bag."""
    out = []
    for bag in desc["bags"]:
        counted = [(i, w) for i, w in bag
                   if not (desc["has_padding_idx"] and i == desc["padding_idx"])]
        n = len(counted)
        if not n:
            out.append({"row": 0, "row_k": 0, "last_row": 0, "weight": ONE_FP32,
                        "empty_bag": 1, "count": 0})
        for k, (i, w) in enumerate(counted):
            out.append({"row": i, "row_k": k & 0xFFFF, "last_row": int(k == n - 1),
                        "weight": w if desc["weighted"] else ONE_FP32, "empty_bag": 0,
                        "count": n & 0xFFFF})
    return out


def run(seed: int, descs: list[dict], *, idle: float, bp: float) -> None:
    rng = random.Random(seed)
    dut = BagEmitter()
    bag_in = Source(dut.i_bag, rng, idle)
    index_in = Source(dut.i_indices, rng, idle)
    weight_in = Source(dut.i_weights, rng, idle)
    rule = StreamRule("o_rows")
    got: list[dict] = []
    cycle = 0

    async def step(ctx) -> int:
        nonlocal cycle
        for source in (bag_in, index_in, weight_in):
            source.drive(ctx)
        ctx.set(dut.o_rows.ready, not rng.random() < bp)
        (bag_ready, index_ready, weight_ready, valid, ready, payload,
         done) = (await ctx.tick().sample(
            dut.i_bag.ready, dut.i_indices.ready, dut.i_weights.ready, dut.o_rows.valid,
            dut.o_rows.ready, dut.o_rows.payload.as_value(), dut.o_done))[2:]
        bag_in.took(bag_ready)
        index_in.took(index_ready)
        weight_in.took(weight_ready)
        rule.observe(cycle, valid, ready, payload)
        if valid and ready:
            got.append(unpack(ROW, payload))
        cycle += 1
        return done

    async def bench(ctx):
        want: list[dict] = []
        for n, desc in enumerate(descs):
            ctx.set(dut.i_desc, {k: v for k, v in desc.items() if k != "bags"})
            ctx.set(dut.i_start, 1)
            await step(ctx)
            ctx.set(dut.i_start, 0)
            bag_in.items.extend({"length": len(b), "counted": len(
                [i for i, _ in b if not (desc["has_padding_idx"] and i == desc["padding_idx"])])}
                for b in desc["bags"])
            index_in.items.extend(i for b in desc["bags"] for i, _ in b)
            if desc["weighted"]:
                weight_in.items.extend(w for b in desc["bags"] for _, w in b)
            else:
                weight_in.items.append(0xDEAD)      # offered, must not be taken
            want += expected_rows(desc)
            weights_before = weight_in.taken
            for _ in range(100 * (len(index_in.items) + 10)):
                if await step(ctx):
                    break
            else:
                raise AssertionError(f"descriptor {n}: no o_done (seed {seed})")
            assert bag_in.empty and index_in.empty, f"descriptor {n}: inputs left"
            if desc["weighted"]:
                assert weight_in.empty, f"descriptor {n}: weights left"
            else:
                assert weight_in.taken == weights_before, f"descriptor {n}: took a weight"
                weight_in.items.clear()
                weight_in.current = None
            # Done: every item loaded, the last one may still wait in o_rows.
            assert len(got) >= len(want) - 1, f"descriptor {n}: o_done before its items"
        for _ in range(40):
            ctx.set(dut.o_rows.ready, 1)
            await step(ctx)

        for i, (g, w) in enumerate(zip(got, want, strict=False)):
            assert g == w, f"item {i}: got {g}, expected {w} (seed {seed})"
        assert len(got) == len(want), f"{len(got)} items, expected {len(want)}"

    simulate(dut, bench)
    assert not rule.errors, "\n".join(rule.errors[:10])


@pytest.mark.parametrize("idle, bp", [(0.0, 0.0), (0.3, 0.4)], ids=["smooth", "rough"])
def test_random_bags(seed, idle, bp):
    rng = random.Random(seed)
    run(seed, [random_desc(rng) for _ in range(40)], idle=idle, bp=bp)


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(BagEmitter(), "bag_emitter", tmp_path)
