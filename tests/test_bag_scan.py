# amaranth: UnusedElaboratable=no
"""BagScan (hw/engine/bag_scan.py) in the Amaranth simulator.

Descriptors of random bags (empty ones, bags of padding only, with and without a
padding index) go in one after the other: the bench pulses ``i_start`` while the block
is idle and offers the ``num_bags`` offsets (``offsets[0] = 0`` first) and the
``num_indices`` indices on their streams, each with random idle cycles; ``o_bag`` has
random backpressure. The bags sent must be those the contract gives (a golden model
written from the docstring: each bag's length from the offsets and ``num_indices``, its
count of indices that are not the padding index); the block must take exactly the
offsets and indices of the descriptor. A passive checker holds ``o_bag`` to the stream
rules. Seeds are printed; ``SEED=<n>`` replays one.

Garbled offsets (a failed pass-2 re-read, after pass 1 checked them): some of the
offsets fed are replaced by values smaller than the one before, past ``num_indices``,
``0xFFFFFFFF`` or ``0x80000000`` (the first offset, skipped, among them). The contract
clamps each non-last bag's end into ``[position, num_indices]`` (``position``: where
the bag starts; the words compared as the unsigned 32-bit values the stream carries,
like ``num_indices``), so the scan still sends ``num_bags`` bags of ``num_indices``
indices in all, within a cycle bound; a descriptor of valid offsets after it gives the
bags of the model above.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from hw.engine.bag_scan import BAG, BagScan

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import unpack
from .stream_rule import StreamRule
from .stream_source import Source

M32 = 0xFFFFFFFF


def random_desc(rng: random.Random) -> dict:
    """Settings, ``offsets`` (``num_bags`` of them) and ``indices`` of one descriptor."""
    pad = rng.choice([None, 7, M32])
    offsets, indices = [], []
    for _ in range(rng.choice([1, 2, rng.randint(1, 12)])):
        offsets.append(len(indices))
        shape = rng.random()
        length = 0 if shape < 0.2 else rng.randint(1, 3) if shape < 0.6 else rng.randint(1, 30)
        only_padding = pad is not None and rng.random() < 0.15
        indices += [pad if only_padding or (pad is not None and rng.random() < 0.3)
                    else rng.randrange(20) for _ in range(length)]
    return {"has_padding_idx": int(pad is not None), "padding_idx": pad or 0,
            "num_bags": len(offsets), "num_indices": len(indices), "offsets": offsets,
            "indices": indices}


def expected_bags(desc: dict) -> list[dict]:
    """The docstring's bags: bag ``b`` runs from ``offsets[b]`` to the next offset, the
    last one to ``num_indices``."""
    ends = [*desc["offsets"][1:], desc["num_indices"]]
    out = []
    for start, end in zip(desc["offsets"], ends, strict=True):
        bag = desc["indices"][start:end]
        counted = [i for i in bag if not (desc["has_padding_idx"] and i == desc["padding_idx"])]
        out.append({"length": len(bag), "counted": len(counted)})
    return out


def garble(rng: random.Random, desc: dict) -> dict:
    """``desc`` with some of its offsets (at least one) replaced as a failed re-read
    could: decreasing, past ``num_indices``, all-ones or ``0x80000000`` (negative as
    int32), and ``include_last_offset`` at random (the scan is fed ``num_bags`` offsets
    either way: pass 2 does not read the last one)."""
    offsets = list(desc["offsets"])
    n = desc["num_indices"]
    spots = [b for b in range(len(offsets)) if rng.random() < 0.4] or \
        [rng.randrange(len(offsets))]
    for b in spots:
        kind = rng.randrange(5)
        top = max(desc["offsets"][b - 1] if b else 0, desc["offsets"][b])
        if kind == 0:       # smaller than the (valid) offset before, or than its own
            offsets[b] = rng.randrange(top) if top else M32
        elif kind == 1:     # past num_indices
            offsets[b] = n + rng.choice([1, 2, rng.randrange(1, 1 << 20),
                                         rng.randrange(1, M32 - n + 1)])
        elif kind == 2:
            offsets[b] = M32
        elif kind == 3:
            offsets[b] = 0x80000000
        else:               # any word
            offsets[b] = rng.getrandbits(32)
    return desc | {"offsets": offsets, "garbled": spots,
                   "include_last_offset": rng.randrange(2)}


def clamped_bags(desc: dict) -> list[dict]:
    """The bags the clamping rule gives for the offsets fed (garbled or not): a non-last
    bag ends at its offset clamped into ``[position, num_indices]`` (``position``: the
    end of the bag before), the last one at ``num_indices``."""
    n, nb = desc["num_indices"], desc["num_bags"]
    out, position = [], 0
    for b in range(nb):
        end = n if b == nb - 1 else min(max(desc["offsets"][b + 1], position), n)
        bag = desc["indices"][position:end]
        counted = [i for i in bag if not (desc["has_padding_idx"] and i == desc["padding_idx"])]
        out.append({"length": end - position, "counted": len(counted)})
        position = end
    assert position == n and len(out) == nb
    return out


def run(seed: int, descs: list[dict], *, idle: float, bp: float,
        max_cycles: Callable[[dict], int] | None = None) -> None:
    """``max_cycles(desc)``: the cycles from ``i_start`` to the last bag sent must not
    exceed it (by default only a hang bound)."""
    rng = random.Random(seed)
    dut = BagScan()
    offset_in = Source(dut.i_offsets, rng, idle)
    index_in = Source(dut.i_indices, rng, idle)
    rule = StreamRule("o_bag")
    got: list[dict] = []
    cycle = 0

    async def step(ctx) -> None:
        nonlocal cycle
        offset_in.drive(ctx)
        index_in.drive(ctx)
        ctx.set(dut.o_bag.ready, not rng.random() < bp)
        (offset_ready, index_ready, valid, ready, payload) = (await ctx.tick().sample(
            dut.i_offsets.ready, dut.i_indices.ready, dut.o_bag.valid, dut.o_bag.ready,
            dut.o_bag.payload.as_value()))[2:]
        offset_in.took(offset_ready)
        index_in.took(index_ready)
        rule.observe(cycle, valid, ready, payload)
        if valid and ready:
            got.append(unpack(BAG, payload))
        cycle += 1

    async def bench(ctx):
        want: list[dict] = []
        for n, desc in enumerate(descs):
            ctx.set(dut.i_desc, {k: desc.get(k, 0) for k in (
                "has_padding_idx", "padding_idx", "num_bags", "num_indices",
                "include_last_offset")})
            ctx.set(dut.i_start, 1)
            started = cycle
            await step(ctx)
            ctx.set(dut.i_start, 0)
            offset_in.items.extend(desc["offsets"])
            index_in.items.extend(desc["indices"])
            want += clamped_bags(desc) if desc.get("garbled") else expected_bags(desc)
            for _ in range(100 * (desc["num_indices"] + desc["num_bags"] + 10)):
                if len(got) >= len(want):
                    break
                await step(ctx)
            else:
                raise AssertionError(f"descriptor {n}: {len(want) - len(got)} bags missing "
                                     f"(offsets {desc['offsets']}, seed {seed})")
            if max_cycles is not None:
                assert cycle - started <= max_cycles(desc), (
                    f"descriptor {n}: {cycle - started} cycles, bound {max_cycles(desc)} "
                    f"(offsets {desc['offsets']}, seed {seed})")
            assert offset_in.empty and index_in.empty, f"descriptor {n}: inputs left"
        # An extra word on each input, never taken: the scan is idle.
        offset_in.items.append(0)
        index_in.items.append(0)
        for _ in range(40):
            await step(ctx)
        assert offset_in.taken == sum(d["num_bags"] for d in descs), "an offset too many"
        assert index_in.taken == sum(d["num_indices"] for d in descs), "an index too many"
        for i, (g, w) in enumerate(zip(got, want, strict=False)):
            assert g == w, f"bag {i}: got {g}, expected {w} (seed {seed})"
        assert len(got) == len(want), f"{len(got)} bags, expected {len(want)}"
        first = 0
        for n, desc in enumerate(descs):        # the totals, whatever the model says
            bags = got[first:first + desc["num_bags"]]
            first += desc["num_bags"]
            assert sum(b["length"] for b in bags) == desc["num_indices"], f"descriptor {n}"
            assert all(b["counted"] <= b["length"] for b in bags), f"descriptor {n}"

    simulate(dut, bench)
    assert not rule.errors, "\n".join(rule.errors[:10])


@pytest.mark.parametrize("idle, bp", [(0.0, 0.0), (0.3, 0.4)], ids=["smooth", "rough"])
def test_random_bags(seed, idle, bp):
    rng = random.Random(seed)
    run(seed, [random_desc(rng) for _ in range(40)], idle=idle, bp=bp)


@pytest.mark.parametrize("idle, bp", [(0.0, 0.0), (0.3, 0.4)], ids=["smooth", "rough"])
def test_garbled_offsets(seed, idle, bp):
    """Descriptors whose offsets fed are garbled (with and without a padding index and
    ``include_last_offset``), each followed by one of valid offsets: every one ends
    with the clamping rule's bags (the valid ones with the old model's), taking exactly
    its offsets and indices; smooth, within one cycle per index and two per bag (an
    empty bag's cycle and its offset's) and a few more."""
    rng = random.Random(seed)
    descs = []
    for _ in range(30):
        garbled = garble(rng, random_desc(rng))
        # The rule must matter: a bag of the old model's would differ for some.
        descs += [garbled, random_desc(rng)]
    assert any(clamped_bags(d) != expected_bags(d) for d in descs[::2])
    bound = None if idle or bp else (lambda d: d["num_indices"] + 2 * d["num_bags"] + 4)
    run(seed, descs, idle=idle, bp=bp, max_cycles=bound)


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(BagScan(), "bag_scan", tmp_path)
