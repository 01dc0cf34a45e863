# amaranth: UnusedElaboratable=no
"""BufferCheck (hw/engine/buffer_check.py) in the Amaranth simulator.

Random descriptors, most of their buffers good and some with one bad word (an offset
that decreases, is negative, exceeds ``num_indices``, a first offset other than 0, a
wrong last offset with ``include_last_offset``; an index negative or ``>= rows`` that
is or is not the padding index), go in one after the other: the bench pulses
``i_start``, then offers the offsets and indices a line at a time, with the words past
the buffer junk and masked off, each stream with random idle cycles. After each
descriptor both flags must equal the contract's verdicts (a golden model written from
the docstring), and both must read 0 after the next ``i_start``. Seeds are printed;
``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

from hw.engine.buffer_check import BufferCheck

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .stream_source import Source

M32 = 0xFFFFFFFF
WORDS = 16


def lines(words: list[int], rng: random.Random) -> list[dict]:
    """``words`` as ``LINE`` payloads: 16 a line, the last line's spare words junk."""
    out = []
    for start in range(0, len(words), WORDS):
        chunk = words[start:start + WORDS]
        padded = chunk + [rng.getrandbits(32) for _ in range(WORDS - len(chunk))]
        out.append({"data": sum(w << (32 * k) for k, w in enumerate(padded)),
                    "mask": (1 << len(chunk)) - 1, "last": int(start + WORDS >= len(words))})
    return out


def random_desc(rng: random.Random) -> dict:
    rows = rng.choice([1, 10, 1000, 0x7FFFFFFF])
    num_indices = rng.choice([0, 1, rng.randint(1, 20), rng.randint(15, 70)])
    num_bags = rng.choice([0, 1, rng.randint(1, 20), rng.randint(15, 50)])
    ilo = int(rng.random() < 0.5)
    pad = rng.choice([None, rng.randrange(rows), rows, M32])
    indices = [rng.randrange(min(rows, 50)) for _ in range(num_indices)]
    offsets = sorted(rng.randint(0, num_indices) for _ in range(num_bags + ilo))
    if offsets:
        offsets[0] = 0
        if ilo:
            offsets[-1] = num_indices
    if pad is not None and indices and rng.random() < 0.5:
        for _ in range(rng.randint(1, 4)):
            indices[rng.randrange(num_indices)] = pad
    flaw = rng.random()
    if flaw < 0.3 and indices:
        indices[rng.randrange(num_indices)] = rng.choice([rows, rows + 5, M32, 0x80000000])
    elif flaw < 0.6 and offsets:
        p = rng.randrange(len(offsets))
        offsets[p] = rng.choice([offsets[p] + 1, offsets[p] - 1, num_indices + 1,
                                 0x80000000 | offsets[p], M32]) & M32
    return {"rows": rows, "num_indices": num_indices, "include_last_offset": ilo,
            "has_padding_idx": int(pad is not None), "padding_idx": (pad or 0) & M32,
            "offsets": offsets, "indices": indices}


def verdicts(desc: dict) -> tuple[bool, bool]:
    """(bad offsets, bad index) as the docstring defines them."""
    offs, n = desc["offsets"], desc["num_indices"]
    signed = [o - (1 << 32) if o >> 31 else o for o in offs]
    bad_offsets = (
        any(o < 0 or o > n for o in signed)
        or any(b < a for a, b in pairwise(signed))
        or bool(offs and offs[0] != 0)
        or bool(desc["include_last_offset"] and offs and offs[-1] != n))
    bad_index = any((i >> 31 or i >= desc["rows"])
                    and not (desc["has_padding_idx"] and i == desc["padding_idx"])
                    for i in desc["indices"])
    return bad_offsets, bad_index


def run(seed: int, descs: list[dict], *, idle: float) -> dict:
    rng = random.Random(seed)
    dut = BufferCheck()
    offset_in = Source(dut.i_offsets, rng, idle)
    index_in = Source(dut.i_indices, rng, idle)
    counts = {"bad_offsets": 0, "bad_index": 0}

    async def step(ctx) -> tuple[int, int]:
        offset_in.drive(ctx)
        index_in.drive(ctx)
        (offset_ready, index_ready, bad_offsets, bad_index) = (await ctx.tick().sample(
            dut.i_offsets.ready, dut.i_indices.ready, dut.o_bad_offsets,
            dut.o_bad_index))[2:]
        assert offset_in.current is None or offset_ready, "a line not taken at once"
        assert index_in.current is None or index_ready, "a line not taken at once"
        offset_in.took(offset_ready)
        index_in.took(index_ready)
        return bad_offsets, bad_index

    async def bench(ctx):
        for n, desc in enumerate(descs):
            ctx.set(dut.i_desc, {k: desc[k] for k in ("rows", "num_indices",
                                                      "include_last_offset",
                                                      "has_padding_idx", "padding_idx")})
            ctx.set(dut.i_start, 1)
            await step(ctx)
            ctx.set(dut.i_start, 0)
            assert await step(ctx) == (0, 0), f"descriptor {n}: flags not cleared by i_start"
            offset_in.items.extend(lines(desc["offsets"], rng))
            index_in.items.extend(lines(desc["indices"], rng))
            while not (offset_in.empty and index_in.empty):
                await step(ctx)
            flags = await step(ctx)
            want = verdicts(desc)
            assert flags == want, (f"descriptor {n} {desc}: flags {flags}, expected {want} "
                                   f"(seed {seed})")
            counts["bad_offsets"] += want[0]
            counts["bad_index"] += want[1]

    simulate(dut, bench)
    return counts


@pytest.mark.parametrize("idle", [0.0, 0.4], ids=["smooth", "rough"])
def test_random_buffers(seed, idle):
    rng = random.Random(seed)
    counts = run(seed, [random_desc(rng) for _ in range(200)], idle=idle)
    assert counts["bad_offsets"] > 10 and counts["bad_index"] > 10, counts


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(BufferCheck(), "buffer_check", tmp_path)
