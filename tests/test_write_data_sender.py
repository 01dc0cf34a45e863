# amaranth: UnusedElaboratable=no
"""WriteDataSender (hw/cxl/write_data_sender.py) in the Amaranth simulator against a
model of its docstring.

Random lines are written into random entries and the entries pulled at random (each
entry at most once while its line waits, a line written before its pull, as the
write path does), with random idle cycles on both inputs and random backpressure on
``o_data``. Checked: ``o_data`` carries, in pull order, the line the entry held when
it was pulled and the pull's UQID, with ChunkValid, Bogus and Poison zero; ``o_sent``
pulses exactly in the cycles of an ``o_data`` handshake, ``o_sent_entry`` names the
pull's entry while ``o_data`` is valid;
``o_busy`` while a pull waits; the idle latency of the docstring. A passive checker
holds ``o_data`` to the stream rules. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.cxl.messages import D2HData
from hw.cxl.write_data_sender import WriteDataSender

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import unpack
from .stream_rule import StreamRule


def _run(seed: int, lines: int, *, idle: float, bp: float, pulls: int = 300) -> dict:
    rng = random.Random(seed)
    dut = WriteDataSender(lines=lines)
    rule = StreamRule("o_data")
    stats = {"sent": 0, "max_waiting": 0}

    async def bench(ctx):
        held: dict[int, int] = {}           # entry -> line written in an earlier cycle
        waiting: set[int] = set()           # entries pulled, line not yet sent
        expect: deque[tuple[int, int, int]] = deque()   # (entry, line, uqid) in pull order
        left = pulls
        cycle = 0
        while left or expect:
            line = pull = None
            free = [e for e in range(lines) if e not in waiting]
            if free and not rng.random() < idle:
                line = (rng.choice(free), rng.getrandbits(512))
            ready_to_pull = [e for e in held if e not in waiting and (line is None
                                                                      or line[0] != e)]
            if left and ready_to_pull and not rng.random() < idle:
                pull = (rng.choice(ready_to_pull), rng.getrandbits(12))
            ctx.set(dut.i_line.valid, line is not None)
            if line is not None:
                ctx.set(dut.i_line.payload, {"entry": line[0], "data": line[1]})
            ctx.set(dut.i_pull.valid, pull is not None)
            if pull is not None:
                ctx.set(dut.i_pull.payload, {"entry": pull[0], "uqid": pull[1]})
            ready = not rng.random() < bp
            ctx.set(dut.o_data.ready, ready)
            _, _, valid, payload, sent_valid, sent_entry, busy = await ctx.tick().sample(
                dut.o_data.valid, dut.o_data.payload.as_value(), dut.o_sent,
                dut.o_sent_entry, dut.o_busy)
            where = f"cycle {cycle}, seed {seed}"
            rule.observe(cycle, valid, ready, payload)
            assert sent_valid == (valid and ready), where
            assert busy or not expect, where
            if valid:
                assert expect, f"o_data with nothing pulled ({where})"
                entry, want_line, want_uqid = expect[0]
                f = unpack(D2HData, payload)
                assert (f["data"], f["uqid"]) == (want_line, want_uqid), where
                assert f["chunk_valid"] == f["bogus"] == f["poison"] == 0, where
                assert sent_entry == entry, where
            if valid and ready:
                expect.popleft()
                waiting.discard(entry)
                stats["sent"] += 1
            if pull is not None:
                expect.append((pull[0], held[pull[0]], pull[1]))
                waiting.add(pull[0])
                left -= 1
            if line is not None:
                held[line[0]] = line[1]
            stats["max_waiting"] = max(stats["max_waiting"], len(waiting))
            cycle += 1
            assert cycle < 50 * pulls, f"hang ({where})"

    simulate(dut, bench)
    assert not rule.errors, rule.errors[:5]
    return stats


@pytest.mark.parametrize("lines", [2, 16])
@pytest.mark.parametrize("idle, bp", [(0.0, 0.0), (0.3, 0.3), (0.1, 0.8)],
                         ids=["smooth", "rough", "stalled"])
def test_pulled_lines_in_order(seed, lines, idle, bp):
    stats = _run(seed, lines, idle=idle, bp=bp)
    assert stats["sent"] == 300
    if bp > 0.5:
        assert stats["max_waiting"] == lines, "the queue never filled"


def test_idle_latency():
    """A pull taken in cycle t is on o_data in cycle t + 3 (queue empty, o_data free)."""
    dut = WriteDataSender(lines=4)

    async def bench(ctx):
        ctx.set(dut.o_data.ready, 0)
        ctx.set(dut.i_line.valid, 1)
        ctx.set(dut.i_line.payload, {"entry": 2, "data": 0xABC})
        await ctx.tick()
        ctx.set(dut.i_line.valid, 0)
        ctx.set(dut.i_pull.valid, 1)
        ctx.set(dut.i_pull.payload, {"entry": 2, "uqid": 77})
        valid_at = []
        for _ in range(6):
            _, _, valid = await ctx.tick().sample(dut.o_data.valid)
            ctx.set(dut.i_pull.valid, 0)
            valid_at.append(valid)
        assert valid_at.index(1) == 3
        assert ctx.get(dut.o_data.p.data) == 0xABC and ctx.get(dut.o_data.p.uqid) == 77

    simulate(dut, bench)


@pytest.mark.parametrize("lines", [1, 3, 4096, True, 8.0])
def test_rejects_bad_lines(lines):
    with pytest.raises(ValueError,
                       match=f"^lines must be a power of two from 2 to 2048, not {lines!r}$"):
        WriteDataSender(lines=lines)


def test_lines_is_a_read_only_property():
    dut = WriteDataSender(lines=8)
    assert dut.lines == 8
    with pytest.raises(AttributeError):
        dut.lines = 4


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(WriteDataSender(lines=16), "write_data_sender_l16", tmp_path)
