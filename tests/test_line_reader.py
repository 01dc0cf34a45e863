# amaranth: UnusedElaboratable=no
"""LineReader (hw/ckpt/line_reader.py) in the Amaranth simulator.

Random LINEAR and SLOTS commands (random rings: slot count, slot lines, start slot,
slot count to read) are served by :class:`tb.pmem.PmemModel` (latency, jitter, random
AR backpressure and R idle cycles) from an image whose lines are random; ``o_line`` is
taken with random backpressure. Every command's lines must come out in the order the
pattern names, each with the data stored there; reads in flight never exceed
``max_reads``; ``idle`` rises at the end of each command and not before; a stream-rule
checker watches AR and ``o_line``. ``stop`` halts the ARs (and no line is lost of
those issued); a read past the end of PMEM raises ``r_error`` with its beat. Seeds are
printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.ckpt.line_reader import LineReader, ReadMode
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import AxiPmemPort, Traffic
from .stream_rule import StreamRule

AW = 20
LINE = 64
SIZE = 1 << 18


def pattern(cmd: dict) -> list[int]:
    """The addresses a command reads, in order (the contract of LineReader)."""
    if cmd["mode"] == ReadMode.LINEAR:
        return [cmd["addr"] + LINE * i for i in range(cmd["count"])]
    out, sidx, slot = [], cmd["slot"], cmd["addr"]
    for _ in range(cmd["count"]):
        out += [slot + LINE * k for k in range(cmd["slot_lines"])]
        if sidx == 0:
            sidx, slot = cmd["last_slot"], cmd["last_addr"]
        else:
            sidx, slot = sidx - 1, slot - cmd["slot_lines"] * LINE
    return out


def random_command(rng: random.Random) -> dict:
    if rng.random() < 0.4:
        count = rng.choice([1, 2, rng.randint(1, 40)])
        return dict(mode=ReadMode.LINEAR, addr=LINE * rng.randrange(SIZE // LINE - count),
                    count=count)
    slots = rng.choice([1, 2, 4, 8])
    lines = rng.randint(2, 6)
    base = LINE * rng.randrange((SIZE - slots * lines * LINE) // LINE)
    first = rng.randrange(slots)
    return dict(mode=ReadMode.SLOTS, addr=base + first * lines * LINE,
                count=rng.choice([slots, rng.randint(1, slots)]), slot=first,
                last_slot=slots - 1, last_addr=base + (slots - 1) * lines * LINE,
                slot_lines=lines)


def _run(seed: int, *, max_reads: int, traffic: Traffic, take: float, n_cmds: int = 12,
         stop_at: int | None = None, size: int = SIZE) -> dict:
    rng = random.Random(seed)
    dut = LineReader(addr_width=AW, id_width=2, max_reads=max_reads)
    model = PmemModel(size=size, rng=random.Random(seed),
                      timing=PmemTiming(read_latency=rng.randint(1, 20), jitter=8))
    image = {a: rng.getrandbits(512) for a in range(0, SIZE, LINE)}
    for a, v in image.items():
        if a < size:
            model.write(a, v.to_bytes(LINE, "little"))
    axi = AxiPmemPort(dut.pmem, model, rng, traffic)
    rule = StreamRule("o_line")
    out: dict = {"errors": 0, "lines": 0}

    async def bench(ctx):
        cycle = 0
        # With a PMEM of half the image, 20 commands all stay below its end for about 1
        # seed in a million: commands are drawn on (same seed) until one reads past it.
        past_end = size == SIZE
        for k in range(100 * n_cmds):
            if k >= n_cmds and past_end:
                break
            cmd = random_command(rng)
            past_end = past_end or max(pattern(cmd)) >= size
            want = [image[a] for a in pattern(cmd)]
            ctx.set(dut.i_cmd.payload, cmd)
            ctx.set(dut.i_cmd.valid, 1)
            got, issued, taken, start = [], 0, 0, cycle
            while True:
                ready = rng.random() < take
                ctx.set(dut.o_line.ready, ready)
                if stop_at is not None and cycle == stop_at:
                    ctx.set(dut.stop, 1)
                arvalid, arready, valid, line, idle, r_error, rvalid, rready = await axi.tick(
                    ctx, dut.pmem.arvalid, dut.pmem.arready, dut.o_line.valid,
                    dut.o_line.payload, dut.idle, dut.r_error, dut.pmem.rvalid,
                    dut.pmem.rready)
                ctx.set(dut.i_cmd.valid, 0)
                cycle += 1
                rule.observe(cycle, valid, ready, line)
                issued += bool(arvalid and arready)
                taken += bool(rvalid and rready)
                assert issued - taken <= max_reads, "more reads in flight than max_reads"
                out["errors"] += r_error
                if valid and ready:
                    got.append(line)
                if idle and cycle > start + 1:      # (sampled in the command's cycle)
                    break
                assert cycle < 100_000, "reader hangs"
            out["lines"] += len(got)
            if stop_at is None:
                assert len(got) == len(want), f"{len(got)} lines of {len(want)}"
                if size == SIZE:
                    assert got == want, "a line differs from the image"
            else:
                assert got == want[:len(got)], "a line differs from the image"
                assert len(got) == issued
        assert not axi.errors and not rule.errors, (axi.errors + rule.errors)[:5]
        assert model.outstanding == (0, 0)

    simulate(dut, bench)
    return out


TRAFFIC = {"smooth": (Traffic(), 1.0),
           "rough": (Traffic(ar_bp=0.4, r_idle=0.4), 0.5),
           "sink_paused": (Traffic(ar_bp=0.1, r_idle=0.1), 0.1)}


@pytest.mark.parametrize("max_reads", [1, 2, 7, 64])
@pytest.mark.parametrize("traffic", list(TRAFFIC))
def test_patterns(traffic, max_reads, seed):
    t, take = TRAFFIC[traffic]
    _run(seed, max_reads=max_reads, traffic=t, take=take)


def test_stop_halts_reads(seed):
    """``stop`` from a random cycle: the ARs stop, those issued complete, ``idle``."""
    rng = random.Random(seed)
    got = _run(seed, max_reads=8, traffic=Traffic(ar_bp=0.3, r_idle=0.3), take=0.7,
               n_cmds=1, stop_at=rng.randrange(1, 30))
    print(f"{got['lines']} lines before the stop")


def test_error_response(seed):
    """Lines past the end of PMEM: DECERR beats, each with ``r_error``."""
    got = _run(seed, max_reads=4, traffic=Traffic(r_idle=0.3), take=0.8, n_cmds=20,
               size=SIZE // 2)
    assert got["errors"] > 0


@pytest.mark.parametrize("bad", [0, 257])
def test_rejects_bad_parameters(bad):
    with pytest.raises(ValueError,
                       match=f"^max_reads must be an integer from 1 to 256, not {bad!r}$"):
        LineReader(addr_width=AW, id_width=2, max_reads=bad)
