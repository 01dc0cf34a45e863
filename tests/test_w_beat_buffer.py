# amaranth: UnusedElaboratable=no
"""WBeatBuffer (hw/cxl/w_beat_buffer.py) in the Amaranth simulator.

Bursts of random length go in on ``i_w`` with random idle cycles; their AWs are
"issued" (``i_aw_issued``) at random times, never more than ``entries`` ahead of the
bursts that have left; a random share of the bursts is denied (``i_denied`` names their
entry from the AW's issue to the burst's last beat). ``o_w`` has random backpressure.
Golden model, from the contract: the beats leave in order, unchanged but for the strobes
of a denied burst (all low); a beat leaves only once its burst's AW was issued in an
earlier cycle; ``i_w.ready`` is low only while the buffer holds ``depth`` beats;
``o_busy`` is high while beats are owed and low while no beat is held or owed. A
passive checker holds ``o_w`` to the stream rules. Random tests print their seed;
``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.cxl.w_beat_buffer import WBeatBuffer, w_beat_layout

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule


def _run(seed: int, *, data_width: int, depth: int, entries: int, idle: float, bp: float,
         bursts: int = 60) -> dict:
    rng = random.Random(seed)
    dut = WBeatBuffer(data_width=data_width, depth=depth, entries=entries)
    layout = w_beat_layout(data_width)
    plan = []                   # (beats, denied) per burst
    for _ in range(bursts):
        n = rng.randint(1, 2 * depth)
        beats = [{"data": rng.getrandbits(data_width), "strb": rng.getrandbits(data_width // 8),
                  "last": int(k == n - 1)} for k in range(n)]
        plan.append((beats, rng.random() < 0.3))
    to_send = deque(b for beats, _ in plan for b in beats)
    want = deque((i, b) for i, (beats, _) in enumerate(plan) for b in beats)
    rule = StreamRule("o_w")
    stats = {"beats": 0, "full_stalls": 0}

    async def bench(ctx):
        issued = closed = held = 0
        cur = None
        cycle = 0
        while want:
            assert cycle < 200 * bursts, "no progress"
            if cur is None and to_send and not rng.random() < idle:
                cur = to_send.popleft()
                ctx.set(dut.i_w.payload.as_value(), pack(layout, cur))
            ctx.set(dut.i_w.valid, cur is not None)
            issue = issued < bursts and issued - closed < entries and rng.random() < 0.3
            ctx.set(dut.i_aw_issued, issue)
            denied = 0
            for j in range(closed, issued):
                if plan[j][1]:
                    denied |= 1 << (j % entries)
            ctx.set(dut.i_denied, denied)
            ready = not rng.random() < bp
            ctx.set(dut.o_w.ready, ready)
            *_, in_ready, valid, payload, busy = await ctx.tick().sample(
                dut.i_w.ready, dut.o_w.valid, dut.o_w.payload.as_value(), dut.o_busy)
            rule.observe(cycle, valid, ready, payload)
            where = f"cycle {cycle}, seed {seed}"
            if cur is not None and not in_ready:
                assert held == depth, f"i_w.ready low with {held} beats held ({where})"
                stats["full_stalls"] += 1
            assert busy >= (issued > closed), f"o_busy low with beats owed ({where})"
            assert busy <= bool(held or issued > closed), f"o_busy high, idle ({where})"
            if valid and ready:
                burst, beat = want.popleft()
                assert burst < issued, f"beat of burst {burst} before its AW ({where})"
                expect = dict(beat, strb=0) if plan[burst][1] else beat
                assert unpack(layout, payload) == expect, f"beat of burst {burst} ({where})"
                held -= 1
                closed += beat["last"]
                stats["beats"] += 1
            if cur is not None and in_ready:
                held += 1
                cur = None
            issued += issue
            cycle += 1

    simulate(dut, bench)
    assert not rule.errors, rule.errors[:5]
    return stats


@pytest.mark.parametrize("traffic", ["smooth", "rough"])
@pytest.mark.parametrize("config", [dict(data_width=512, depth=32, entries=16),
                                    dict(data_width=8, depth=4, entries=2),
                                    dict(data_width=64, depth=5, entries=4)],
                         ids=["gate_default", "smallest", "odd_depth"])
def test_random_traffic(config, traffic, seed):
    p = 0.4 if traffic == "rough" else 0.0
    stats = _run(seed, **config, idle=p, bp=p)
    print(stats)


def test_fill_to_full_with_sink_paused(seed):
    stats = _run(seed, data_width=32, depth=6, entries=4, idle=0.0, bp=0.9, bursts=20)
    assert stats["full_stalls"] > 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(data_width=12), "data_width must be a power of two from 8 to 1024, not 12"),
    (dict(data_width=2048), "data_width must be a power of two from 8 to 1024, not 2048"),
    (dict(depth=0), "depth must be an integer from 1 to 4096, not 0"),
    (dict(depth=True), "depth must be an integer from 1 to 4096, not True"),
    (dict(entries=3), "entries must be a power of two from 2 to 64, not 3"),
    (dict(entries=128), "entries must be a power of two from 2 to 64, not 128"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WBeatBuffer(**{"data_width": 512, "depth": 32, "entries": 16, **kwargs})


def test_parameters_are_read_only_properties():
    dut = WBeatBuffer(data_width=64, depth=5, entries=4)
    assert (dut.data_width, dut.depth, dut.entries) == (64, 5, 4)
    with pytest.raises(AttributeError):
        dut.depth = 6


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(WBeatBuffer(data_width=512, depth=32, entries=16), "w_beat_buffer",
                       tmp_path)
