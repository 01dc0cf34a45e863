# amaranth: UnusedElaboratable=no
"""DedupFilter (hw/ckpt/dedup_filter.py) in the Amaranth simulator against a Python
model of its docstring.

Random lookups, inserts and clears (random idle cycles between them, lookups in the
cycle of an insert to the same entry, tags drawn from a small pool so that hits,
misses on the batch, on the table and on the row, and evictions all happen) are
applied to the block and to the model; ``hit`` must match every cycle. The hardware
index is checked against :func:`filter_index` by the lookups themselves. Seeds are
printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.ckpt.dedup_filter import DedupFilter, filter_index

from .amaranth_sim import simulate


@pytest.mark.parametrize("rows", [2, 8, 256])
def test_against_model(rows, seed):
    rng = random.Random(seed)
    dut = DedupFilter(rows=rows)
    pool = [(rng.randrange(4), rng.randrange(3), rng.choice([rng.randrange(64),
                                                             rng.getrandbits(32)]))
            for _ in range(3 * rows)]
    entries: dict[int, tuple] = {}
    valid: set[int] = set()
    idx = read = head = None
    hits = {True: 0, False: 0}

    async def bench(ctx):
        nonlocal idx, read, head
        for cycle in range(3000):
            look = rng.random() < 0.6
            new = rng.choice(pool)
            insert = head is not None and rng.random() < 0.5
            clear = rng.random() < 0.01
            ctx.set(dut.look, look)
            ctx.set(dut.look_tag, dict(zip(("batch_id", "table_id", "row"), new, strict=True)))
            if head is not None:
                ctx.set(dut.tag, dict(zip(("batch_id", "table_id", "row"), head, strict=True)))
            ctx.set(dut.insert, insert)
            ctx.set(dut.clear, clear)
            _, _, hit = await ctx.tick().sample(dut.hit)
            if head is not None:
                want = idx in valid and read == head
                assert hit == want, f"cycle {cycle}: hit {hit}, model {want}"
                hits[want] += 1
            if insert:                          # at the edge, seen by a lookup with it
                entries[idx] = head
                valid.add(idx)
            if clear:
                valid.clear()
            if look:
                idx = filter_index(new[1], new[2], rows)
                read, head = entries.get(idx, (0, 0, 0)), new      # memory starts zeroed

    simulate(dut, bench)
    print(hits)
    assert hits[True] > 20 and hits[False] > 20


@pytest.mark.parametrize("bad", [1, 24])
def test_rejects_bad_parameters(bad):
    with pytest.raises(ValueError,
                       match=f"^rows must be a power of two of at least 2, not {bad!r}$"):
        DedupFilter(rows=bad)
