# amaranth: UnusedElaboratable=no
"""DoneWalker (hw/cxl/done_walker.py) in the Amaranth simulator.

The bench fills free entries with a random number of random handles (0 .. ``lines``,
one store a cycle, random idle), then queues the entry (``i_queued`` until the walker
picks it) and reuses it once freed; ``o_done`` has random backpressure. Golden model,
from the contract: each pick names the first queued entry at or after the one after the
last pick; the dones are, pick by pick, the picked entry's handles in slot order; each
picked entry is freed exactly once, and no other; everything queued is walked.
A passive checker holds ``o_done`` to the stream rules. Random tests print their seed;
``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.cxl.done_walker import DoneWalker

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .stream_rule import StreamRule


def _run(seed: int, *, entries: int, lines: int, handle_bits: int, idle: float, bp: float,
         walks: int = 100) -> dict:
    rng = random.Random(seed)
    dut = DoneWalker(entries=entries, lines=lines, handle_bits=handle_bits)
    slot_bits = max(1, lines.bit_length() - 1)
    state = ["free"] * entries
    handles: list[list[int]] = [[] for _ in range(entries)]
    stores: deque[tuple[int, int, int]] = deque()    # (entry, slot, handle) to write
    want: deque[int] = deque()
    rule = StreamRule("o_done")
    stats = {"walks": 0, "dones": 0, "empty": 0}

    async def bench(ctx):
        started = 0
        empty = False                   # a walk without handles was started
        ptr = 0
        cycle = 0
        # Each walk stores up to ``lines`` handles and sends them under backpressure.
        per_walk = max(100, (lines + 2) * (2 + int(1 / (1 - bp))))
        # Past ``walks``, walks go on (same seed) until one without handles was started:
        # with 16 lines, all 100 walks have handles for about 1 seed in 400.
        while stats["walks"] < max(started, walks) or want or not empty:
            assert cycle < max(started, walks) * per_walk, f"no progress (seed {seed})"
            free = [e for e in range(entries) if state[e] == "free"]
            if free and (started < walks or not empty) and rng.random() < 0.5:
                e = rng.choice(free)
                handles[e] = [rng.getrandbits(handle_bits) for _ in range(rng.randint(0, lines))]
                empty = empty or not handles[e]
                state[e] = "storing"
                stores.extend((e, k, h) for k, h in enumerate(handles[e]))
                stores.append((e, -1, 0))                    # then queue it
                started += 1
            store = stores[0] if stores and not rng.random() < idle else None
            if store is not None:
                stores.popleft()
            ctx.set(dut.i_store, store is not None and store[1] >= 0)
            if store is not None and store[1] >= 0:
                ctx.set(dut.i_store_addr, store[0] << slot_bits | store[1])
                ctx.set(dut.i_store_handle, store[2])
            queued = sum(1 << e for e in range(entries) if state[e] == "queued")
            ctx.set(dut.i_queued, queued)
            for e in range(entries):
                ctx.set(dut.i_counts[e], len(handles[e]))
            ready = not rng.random() < bp
            ctx.set(dut.o_done.ready, ready)
            *_, valid, payload, picked, freed = await ctx.tick().sample(
                dut.o_done.valid, dut.o_done.payload, dut.o_picked, dut.o_freed)
            where = f"cycle {cycle}, seed {seed}"
            rule.observe(cycle, valid, ready, payload)
            if valid and ready:
                assert want and payload == want.popleft(), f"done {payload} ({where})"
                stats["dones"] += 1
            if picked:
                order = [(ptr + i) % entries for i in range(entries)]
                first = next(e for e in order if queued >> e & 1)
                assert picked == 1 << first, f"picked {picked:#x}, not entry {first} ({where})"
                state[first] = "walking"
                want.extend(handles[first])
                ptr = (first + 1) % entries
                stats["walks"] += 1
                stats["empty"] += not handles[first]
            for e in range(entries):
                if freed >> e & 1:
                    assert state[e] == "walking", f"entry {e} freed while {state[e]} ({where})"
                    state[e] = "free"
            if store is not None and store[1] < 0:
                state[store[0]] = "queued"
            cycle += 1
        for _ in range(5):
            assert not ctx.get(dut.o_done.valid)
            await ctx.tick()
        assert all(s == "free" for s in state), state
        assert not ctx.get(dut.o_busy)

    simulate(dut, bench)
    assert not rule.errors, rule.errors[:5]
    return stats


@pytest.mark.parametrize("traffic", ["smooth", "rough"])
@pytest.mark.parametrize("config", [dict(entries=32, lines=16, handle_bits=6),
                                    dict(entries=2, lines=1, handle_bits=1),
                                    dict(entries=4, lines=4, handle_bits=3)],
                         ids=["gate_default", "smallest", "small"])
def test_random_traffic(config, traffic, seed):
    p = 0.4 if traffic == "rough" else 0.0
    stats = _run(seed, **config, idle=p, bp=p)
    print(stats)
    assert stats["empty"] > 0


def test_sink_paused(seed):
    """Nearly no ``ready``: the walk holds, nothing is lost or freed early."""
    _run(seed, entries=4, lines=8, handle_bits=4, idle=0.0, bp=0.95, walks=20)


@pytest.mark.parametrize("kwargs, message", [
    (dict(entries=3), "entries must be a power of two from 2 to 128, not 3"),
    (dict(entries=256), "entries must be a power of two from 2 to 128, not 256"),
    (dict(lines=6), "lines must be a power of two from 1 to 256, not 6"),
    (dict(lines=512), "lines must be a power of two from 1 to 256, not 512"),
    (dict(handle_bits=0), "handle_bits must be an integer from 1 to 8, not 0"),
    (dict(handle_bits=9), "handle_bits must be an integer from 1 to 8, not 9"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DoneWalker(**{"entries": 32, "lines": 16, "handle_bits": 6, **kwargs})


def test_parameters_are_read_only_properties():
    dut = DoneWalker(entries=4, lines=8, handle_bits=3)
    assert (dut.entries, dut.lines, dut.handle_bits) == (4, 8, 3)
    with pytest.raises(AttributeError):
        dut.lines = 4


@pytest.mark.parametrize("config", [dict(entries=32, lines=16, handle_bits=6),
                                    dict(entries=2, lines=1, handle_bits=1)],
                         ids=["gate_default", "smallest"])
def test_verilog_lints_clean(config, tmp_path):
    assert_lints_clean(DoneWalker(**config), "done_walker", tmp_path)
