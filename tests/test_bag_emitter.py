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

``i_counted_only`` (low but in ``test_counted_only``): held high for whole descriptors
or raised at a random cycle of one, and low again once the descriptor is done. The
indices fed from then on may differ from those the bag's ``counted`` was taken from (a
failed re-read): the bench garbles the ones not yet offered at the rise (all of them
for a whole descriptor, sometimes none). Per the contract, an index taken while it is
high becomes a row if fewer than ``counted`` rows of its bag came before, whatever its
value, and is skipped otherwise; before the rise the normal model holds.
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
                        "empty_bag": 1, "count": 0, "bad": 0})
        for k, (i, w) in enumerate(counted):
            out.append({"row": i, "row_k": k & 0xFFFF, "last_row": int(k == n - 1),
                        "weight": w if desc["weighted"] else ONE_FP32, "empty_bag": 0,
                        "count": n & 0xFFFF, "bad": 0})
    return out


def counts(desc: dict) -> list[int]:
    """Each bag's ``counted`` as the scan sends it: ``desc["counted"]`` (counted from
    the indices the scan read), else the bags' indices other than the padding index."""
    return desc.get("counted") or [
        len([i for i, _ in b if not (desc["has_padding_idx"] and i == desc["padding_idx"])])
        for b in desc["bags"]]


def counted_only_rows(desc: dict, normal: int) -> list[dict]:
    """The items with ``i_counted_only`` high from the descriptor's index ``normal`` on
    (0: the whole descriptor): an index before it is a row unless it is the padding
    index (the model above); one from it on is a row while the bag has fewer than
    ``counted`` rows, whatever its value, and skipped after. Every bag has ``counted``
    rows, ``row_k`` 0.. on, ``last_row`` on its last; ``counted`` 0 gives the empty_bag
    item."""
    out, position = [], 0
    for bag, n in zip(desc["bags"], counts(desc), strict=True):
        if not n:
            out.append({"row": 0, "row_k": 0, "last_row": 0, "weight": ONE_FP32,
                        "empty_bag": 1, "count": 0, "bad": 0})
        k = 0
        for i, w in bag:
            if position >= normal:
                skip = k >= n
            else:
                skip = desc["has_padding_idx"] and i == desc["padding_idx"]
            if not skip:
                out.append({"row": i, "row_k": k & 0xFFFF, "last_row": int(k == n - 1),
                            "weight": w if desc["weighted"] else ONE_FP32, "empty_bag": 0,
                            "count": n & 0xFFFF, "bad": 0})
                k += 1
            position += 1
        assert k == n, "bench: a bag's indices before the rise disagree with its counted"
    return out


def garbled_index(rng: random.Random, desc: dict, index: int) -> int:
    """What a failed re-read may give for ``index``: the padding index, a counted index
    instead of it, or any word."""
    pad = desc["padding_idx"] if desc["has_padding_idx"] else None
    return rng.choice([index, pad if pad is not None else index, rng.randrange(20),
                       rng.getrandbits(32)])


def run(seed: int, descs: list[dict], *, idle: float, bp: float,
        stats: dict | None = None) -> None:
    """``desc["counted_only"]``: ``None`` (low), ``"all"`` (high from ``i_start``) or
    the cycle after ``i_start`` it rises at (it may come after the descriptor's end);
    ``desc["garble"]``: the chance each index fed while it is high is garbled.
    ``stats`` collects ``rises``: per descriptor it rose in (before its end), the
    descriptor's index it rose at."""
    rng = random.Random(seed)
    dut = BagEmitter()
    bag_in = Source(dut.i_bag, rng, idle)
    index_in = Source(dut.i_indices, rng, idle)
    weight_in = Source(dut.i_weights, rng, idle)
    rule = StreamRule("o_rows")
    got: list[dict] = []
    cycle = 0
    weighted = False                # the descriptor's weights go with its indices

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
        took_index = index_in.took(index_ready)
        took_weight = weight_in.took(weight_ready)
        if weighted:
            assert took_index == took_weight, (
                f"cycle {cycle}: index taken {took_index}, weight {took_weight} (seed {seed})")
        rule.observe(cycle, valid, ready, payload)
        if valid and ready:
            got.append(unpack(ROW, payload))
        cycle += 1
        return done

    def garble(desc: dict, first: int) -> None:
        """Garble the indices of ``desc`` not yet offered (``first``: the descriptor's
        index of the first of them) in the queue and in ``desc["bags"]``."""
        flat = [(i, w) for b in desc["bags"] for i, w in b]
        for q in range(len(index_in.items)):
            if rng.random() < desc.get("garble", 0.0):
                i, w = flat[first + q]
                flat[first + q] = (garbled_index(rng, desc, i), w)
                index_in.items[q] = flat[first + q][0]
        rest = iter(flat)
        desc["bags"] = [[next(rest) for _ in b] for b in desc["bags"]]

    async def bench(ctx):
        nonlocal weighted
        want: list[dict] = []
        for n, desc in enumerate(descs):
            rise = desc.get("counted_only")
            ctx.set(dut.i_desc, {k: v for k, v in desc.items()
                                 if k in ("weighted", "has_padding_idx", "padding_idx",
                                          "num_bags")})
            ctx.set(dut.i_start, 1)
            ctx.set(dut.i_counted_only, rise == "all")
            weighted = False
            await step(ctx)
            ctx.set(dut.i_start, 0)
            weighted = bool(desc["weighted"])
            bag_in.items.extend({"length": len(b), "counted": c}
                                for b, c in zip(desc["bags"], counts(desc), strict=True))
            index_in.items.extend(i for b in desc["bags"] for i, _ in b)
            if rise == "all":
                garble(desc, 0)
            if desc["weighted"]:
                weight_in.items.extend(w for b in desc["bags"] for _, w in b)
            else:
                weight_in.items.append(0xDEAD)      # offered, must not be taken
            weights_before = weight_in.taken
            indices_before = index_in.taken
            normal = 0 if rise == "all" else None   # the indices taken before the rise
            for t in range(100 * (len(index_in.items) + 10)):
                if rise not in (None, "all") and t + 1 == rise:
                    # High from this edge on: the index taken at it is the first.
                    ctx.set(dut.i_counted_only, 1)
                    normal = index_in.taken - indices_before
                    garble(desc, normal + (index_in.current is not None))
                    if stats is not None:
                        stats.setdefault("rises", {})[n] = normal
                if await step(ctx):
                    break
            else:
                raise AssertionError(f"descriptor {n}: no o_done (seed {seed})")
            ctx.set(dut.i_counted_only, 0)
            want += expected_rows(desc) if rise is None else counted_only_rows(
                desc, sum(map(len, desc["bags"])) if normal is None else normal)
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


def counted_only_desc(rng: random.Random, rise) -> dict:
    """A descriptor with a padding index (so that ``i_counted_only`` makes a
    difference) for ``i_counted_only`` from ``rise`` on (``"all"``, else a random cycle
    within the descriptor, mostly): its ``counted`` from the indices as the scan read
    them, the emitter's garbled at random once it is high (often, sometimes never)."""
    desc = random_desc(rng)
    indices = sum(map(len, desc["bags"]))
    while not desc["has_padding_idx"] or (rise != "all" and indices < 4):
        desc = random_desc(rng)
        indices = sum(map(len, desc["bags"]))
    desc["counted"] = counts(desc)
    if rise != "all":
        rise = rng.randrange(1, indices + desc["num_bags"] + 2)
    return desc | {"counted_only": rise, "garble": rng.choice([0.0, 0.3, 1.0])}


@pytest.mark.parametrize("idle, bp", [(0.0, 0.0), (0.3, 0.4)], ids=["smooth", "rough"])
def test_counted_only(seed, idle, bp):
    """``i_counted_only`` high for whole descriptors, or rising at a random cycle of
    one, the indices fed from then on garbled at random: every bag has ``counted``
    rows (the first ``counted`` indices once it is high, the normal model's before),
    ``row_k`` 0.., ``last_row`` on the last, an empty_bag item for ``counted`` 0, the
    weights taken with the indices; each followed by a descriptor with it low, which
    gives the normal model's items."""
    rng = random.Random(seed)
    descs = []
    for k in range(40):
        descs += [counted_only_desc(rng, "all" if k % 2 else "rise"), random_desc(rng)]
    stats: dict = {}
    run(seed, descs, idle=idle, bp=bp, stats=stats)
    # The rule mattered: the normal model differs for some descriptors it was high in,
    # and it rose within some descriptors, after their first index and before the last.
    assert any(counted_only_rows(d, 0) != expected_rows(d) for d in descs[2::4])
    mid = [r for n, r in stats.get("rises", {}).items()
           if 0 < r < sum(map(len, descs[n]["bags"]))]
    assert len(mid) >= 5, f"it rose within only {len(mid)} descriptors"


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(BagEmitter(), "bag_emitter", tmp_path)
