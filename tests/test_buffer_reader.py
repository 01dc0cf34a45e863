# amaranth: UnusedElaboratable=no
"""BufferReader (hw/engine/buffer_reader.py) in the Amaranth simulator.

Buffers of random length (0 to a few hundred words) at random line addresses, often a
few lines before a 4 KiB boundary, are read one after the other, in word mode (random
backpressure on ``o_word``) or in line mode (every line taken at once, as the contract
requires). The bench is the read port: it grants a request at random and returns each
burst's beats in order after a random latency, with random idle cycles. Checked against
the contract: bursts of at most 8 lines that never cross 4 KiB and cover the buffer's
lines in order; lines requested and not yet delivered never more than the credit of the
mode (and more than the word mode's in line mode, with a long latency); the words, or
the lines with their ``mask`` and ``last``, in order; after a flush (raised at a random
point and held until ``o_idle``) nothing is offered or requested, every beat in flight
is absorbed and the next buffer reads normally. A passive checker holds ``o_word`` to
the stream rules. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.engine.buffer_reader import BUF_LINES, BURST, FLY_LINES, LINE, BufferReader

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import unpack
from .stream_rule import StreamRule

ADDR_WIDTH = 24
WORDS = 16


def line_data(seed: int, line: int) -> int:
    return random.Random(seed * 1_000_003 + line).getrandbits(512)


def words_of(seed: int, base: int, count: int) -> list[int]:
    return [line_data(seed, base + w // WORDS) >> (32 * (w % WORDS)) & 0xFFFFFFFF
            for w in range(count)]


def random_buffer(rng: random.Random) -> dict:
    lines_total = 1 << (ADDR_WIDTH - 6)
    count = rng.choice([0, 1, rng.randint(1, 40), rng.randint(100, 400)])
    if rng.random() < 0.5:
        base = (rng.randrange(lines_total // 64) + 1) * 64 - rng.randint(1, 9)
    else:
        base = rng.randrange(lines_total - 64)
    return {"base": base, "count": count, "line_mode": rng.random() < 0.5,
            "flush_at": rng.randint(0, 30) if rng.random() < 0.25 else None}


def run(seed: int, buffers: list[dict], *, latency: int, idle: float, bp: float) -> dict:
    rng = random.Random(seed)
    dut = BufferReader(addr_width=ADDR_WIDTH)
    port = dut.pmem
    rule = StreamRule("o_word")
    stats = {"max_in_flight": 0}
    cycle = 0
    beats: deque = deque()          # (due cycle, line) of every granted line, in order

    async def step(ctx, buf: dict, state: dict) -> None:
        nonlocal cycle
        line_mode, flushing = buf["line_mode"], state["flushing"]
        ctx.set(dut.i_line_mode, line_mode)
        ctx.set(dut.i_flush, flushing)
        ctx.set(dut.o_line.ready, 1)
        ctx.set(dut.o_word.ready, not rng.random() < bp)
        beat = beats[0][1] if beats and beats[0][0] <= cycle and not rng.random() < idle \
            else None
        ctx.set(port.r.valid, beat is not None)
        ctx.set(port.r.payload, line_data(seed, beat) if beat is not None else 0)
        req = ctx.get(port.req)
        grant = req and not rng.random() < idle
        ctx.set(port.grant, grant)
        (line, length, w_valid, w_ready, word, l_valid, line_item, idle_out) = (
            await ctx.tick().sample(port.line, port.len, dut.o_word.valid, dut.o_word.ready,
                                    dut.o_word.payload, dut.o_line.valid,
                                    dut.o_line.payload.as_value(), dut.o_idle))[2:]
        where = f"cycle {cycle}, buffer {buf}, seed {seed}"
        if beat is not None:
            beats.popleft()
        if flushing:        # a flush withdraws the word offered
            assert not req and not w_valid and not l_valid, f"active while flushed ({where})"
            rule.held = None
        rule.observe(cycle, w_valid, w_ready, word)
        if grant:
            n = length + 1
            assert n <= BURST and line % 64 + n <= 64, f"burst {line}+{n} ({where})"
            assert line == state["next_line"], f"burst at {line} ({where})"
            state["next_line"] += n
            consumed = (state["taken"] + (WORDS - 1 if state["taken"] == buf["count"] else 0)
                        ) // WORDS
            in_flight = state["granted"] + n - consumed
            credit = FLY_LINES if line_mode else BUF_LINES
            assert in_flight <= credit, f"{in_flight} lines in flight ({where})"
            stats["max_in_flight"] = max(stats["max_in_flight"], in_flight)
            state["granted"] += n
            due = max(cycle + latency + rng.randint(0, 8), beats[-1][0] if beats else 0)
            beats.extend((due, line + k) for k in range(n))
        if w_valid and w_ready:
            assert not line_mode, f"a word offered in line mode ({where})"
            want = state["words"][state["taken"]]
            assert word == want, f"word {state['taken']}: {word:#x}, expected {want:#x}"
            state["taken"] += 1
        if l_valid:
            assert line_mode, f"a line offered in word mode ({where})"
            got = unpack(LINE, line_item)
            first = state["taken"]
            chunk = state["words"][first:first + WORDS]
            data = line_data(seed, buf["base"] + first // WORDS)
            assert got == {"data": data, "mask": (1 << len(chunk)) - 1,
                           "last": int(first + WORDS >= buf["count"])}, f"line ({where})"
            state["taken"] += len(chunk)
        state["idle"] = idle_out
        cycle += 1

    async def bench(ctx):
        for buf in buffers:
            state = {"flushing": False, "next_line": buf["base"], "granted": 0, "taken": 0,
                     "words": words_of(seed, buf["base"], buf["count"]), "idle": 0}
            ctx.set(dut.i_base, buf["base"])
            ctx.set(dut.i_count, buf["count"])
            ctx.set(dut.i_start, 1)
            await step(ctx, buf, state)
            ctx.set(dut.i_start, 0)
            state["idle"] = 0           # sampled before the start took effect
            for n in range(20 * (buf["count"] + 100) + 40 * latency):
                if buf["flush_at"] is not None and n == buf["flush_at"]:
                    state["flushing"] = True
                if state["idle"] and (state["taken"] == buf["count"] or state["flushing"]):
                    break
                await step(ctx, buf, state)
            else:
                raise AssertionError(f"buffer {buf}: not idle (seed {seed})")
            assert not beats, f"buffer {buf}: idle with beats in flight"
            if not state["flushing"]:
                lines = (buf["count"] + WORDS - 1) // WORDS
                assert state["granted"] == lines, f"buffer {buf}: {state['granted']} lines"

    simulate(dut, bench)
    assert not rule.errors, "\n".join(rule.errors[:10])
    return stats


@pytest.mark.parametrize("idle, bp", [(0.0, 0.0), (0.3, 0.4)], ids=["smooth", "rough"])
def test_random_buffers(seed, idle, bp):
    rng = random.Random(seed)
    run(seed, [random_buffer(rng) for _ in range(30)], latency=rng.randint(1, 20),
        idle=idle, bp=bp)


def test_line_mode_keeps_more_lines_in_flight(seed):
    """A long buffer in line mode at a latency of 100: more than ``BUF_LINES`` lines in
    flight (the word mode's credit), never more than ``FLY_LINES``."""
    rng = random.Random(seed)
    buf = {"base": 64 * rng.randrange(100), "count": 16 * 300, "line_mode": True,
           "flush_at": None}
    stats = run(seed, [buf], latency=100, idle=0.0, bp=0.0)
    assert BUF_LINES < stats["max_in_flight"] <= FLY_LINES, stats


@pytest.mark.parametrize("bad", [11, 49, "24", True])
def test_rejects_bad_addr_width(bad):
    with pytest.raises(ValueError, match=f"^addr_width must be an integer from 12 to 48, "
                                         f"not {bad!r}$"):
        BufferReader(addr_width=bad)


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(BufferReader(addr_width=30), "buffer_reader_a30", tmp_path)
