# amaranth: UnusedElaboratable=no
"""UpdatePipeline (hw/engine/update_pipeline.py) in the Amaranth simulator with a line
memory as in ScatterUpdate, against a sequential Python model of its docstring.

Random ops (fp32 and bf16, weighted or not, random ``dim`` so that some lanes are
padding) to a few cache lines, so that most ops depend on one issued a few cycles
before, are offered with random idle cycles. Every cycle ``i_op.ready`` must be low
exactly when an op at position 1 or 2 (or a bf16 one at 3) writes a granule of the
offered op's line, and ``busy``, ``slot_busy``, ``read_busy``, ``write_busy`` must
match the ops in flight. At the end the memory must hold, bit for bit, the ops applied
one after the other in issue order (fp32 arithmetic by numpy, bf16 rounded to nearest
even after every op; the values stay normal, so no NaN or subnormal arises). Seeds are
printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib.memory import Memory

from hw.engine.update_pipeline import UpdatePipeline, update_op

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack


def f32(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


def bits32(value) -> int:
    return int(np.array([value], np.float32).view(np.uint32)[0])


def bf16_rne(bits: int) -> int:
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def normal16(rng: random.Random) -> int:
    """A bf16 normal of moderate exponent (and so the high half of an fp32 normal)."""
    return (rng.getrandbits(1) << 15) | (rng.randint(120, 134) << 7) | rng.getrandbits(7)


class Harness(Elaboratable):
    def __init__(self, rng: random.Random, **params):
        self.dut = UpdatePipeline(**params)
        self.init = [sum(normal16(rng) << (16 * g) for g in range(32))
                     for _ in range(1 << self.dut.addr_bits)]

    def elaborate(self, platform):
        m = Module()
        dut = self.dut
        m.submodules.dut = dut
        m.submodules.lines = self.lines = Memory(shape=512, depth=len(self.init),
                                                 init=self.init)
        read = self.lines.read_port(transparent_for=())
        write = self.lines.write_port(granularity=16)
        m.d.comb += [read.addr.eq(dut.read_addr), dut.read_data.eq(read.data),
                     write.addr.eq(dut.write_addr), write.data.eq(dut.write_data),
                     write.en.eq(dut.write_en)]
        return m


def effect(op: dict, line_bits: int) -> tuple[int, int]:
    """(cache line, granule mask) an op writes, from the docstring's rules."""
    line, bf16 = op["line"], op["bf16"]
    tline = line >> 1 if bf16 else line
    live = [16 * line + e < op["dim"] for e in range(16)]
    if bf16:
        half = line & 1
        mask = sum(1 << (16 * half + e) for e in range(16) if live[e])
    else:
        mask = sum(3 << (2 * e) for e in range(16) if live[e])
    return (op["slot"] << line_bits) | (tline & ((1 << line_bits) - 1)), mask


def apply(mem: list[int], op: dict, line_bits: int) -> None:
    addr, mask = effect(op, line_bits)
    line = mem[addr]
    w = f32(op["weight"]) if op["weighted"] else np.float32(1.0)
    for e in range(16):
        g = f32((op["grad"] >> (32 * e)) & 0xFFFF_FFFF)
        if op["bf16"]:
            gran = 16 * (op["line"] & 1) + e
            if mask >> gran & 1:
                old = f32(((line >> (16 * gran)) & 0xFFFF) << 16)
                new = bf16_rne(bits32(np.float32(old + np.float32(w * g))))
                line = line & ~(0xFFFF << (16 * gran)) | new << (16 * gran)
        elif mask >> (2 * e) & 1:
            old = f32((line >> (32 * e)) & 0xFFFF_FFFF)
            new = bits32(np.float32(old + np.float32(w * g)))
            line = line & ~(0xFFFF_FFFF << (32 * e)) | new << (32 * e)
    mem[addr] = line


@pytest.mark.parametrize(("cache_rows", "max_lines", "idle"),
                         [(2, 1, 0.0), (4, 3, 0.5), (8, 16, 0.2)])
def test_sequential_result(cache_rows, max_lines, idle, seed):
    rng = random.Random(seed)
    top = Harness(rng, cache_rows=cache_rows, max_lines_per_row=max_lines)
    dut = top.dut
    line_bits = (max_lines - 1).bit_length()
    layout = update_op(cache_rows, max_lines)
    # One fp32 and one bf16 slot: a line is only ever read as one of them.
    slots = rng.sample(range(cache_rows), 2)
    mem = list(top.init)
    issued: list[dict | None] = []              # per cycle: the op issued, if any

    def random_op() -> dict:
        slot = rng.choice(slots)
        bf16 = slot == slots[1]
        lines = rng.randint(1, min(max_lines, 2))   # few lines: many dependent ops
        n = 2 * lines if bf16 else lines
        return {"slot": slot, "line": rng.randrange(n), "bf16": bf16,
                "weighted": rng.random() < 0.5, "dim": rng.randint(1, 16 * n),
                "weight": bits32(np.float32(rng.uniform(-2, 2))),
                "grad": sum(bits32(np.float32(rng.gauss(0, 4))) << (32 * e)
                            for e in range(16))}

    async def bench(ctx):
        op = None
        for cycle in range(300):
            if op is None and cycle < 280 and not rng.random() < idle:
                op = random_op()
            ctx.set(dut.i_op.valid, op is not None)
            if op is not None:
                ctx.set(dut.i_op.payload.as_value(), pack(layout, op))
            _, _, ready, busy, slot_busy, read_busy, write_busy = await ctx.tick().sample(
                dut.i_op.ready, dut.busy, dut.slot_busy, dut.read_busy, dut.write_busy)

            def at(k, cycle=cycle):             # the op at position k
                return issued[cycle - k] if cycle - k >= 0 else None

            if op is not None:
                addr, mask = effect(op, line_bits)
                blocked = any(o is not None and effect(o, line_bits)[0] == addr
                              and effect(o, line_bits)[1] & mask
                              and (k < 3 or o["bf16"]) for k, o in ((1, at(1)), (2, at(2)),
                                                                    (3, at(3))))
                assert ready == (not blocked), f"cycle {cycle}: ready {ready}"
                flight = [at(k) for k in range(1, 8) if at(k) is not None]
                assert slot_busy == any(o["slot"] == op["slot"] for o in flight)
            assert busy == any(at(k) is not None for k in range(1, 8))
            assert (read_busy, write_busy) == (at(2) is not None, at(7) is not None)
            if op is not None and ready:
                apply(mem, op, line_bits)
                issued.append(op)
                op = None
            else:
                issued.append(None)
        for addr, want in enumerate(mem):
            assert ctx.get(top.lines.data[addr]) == want, f"line {addr}"

    simulate(top, bench)
    assert sum(o is not None for o in issued) > 60


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cache_rows": 0}, "cache_rows must be an integer from 2 to 256, not 0"),
    ({"cache_rows": 12}, "cache_rows must be a power of two, not 12"),
    ({"max_lines_per_row": 100}, "max_lines_per_row must be an integer from 1 to 64, not 100"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        UpdatePipeline(**({"cache_rows": 4, "max_lines_per_row": 4} | kwargs))


def test_verilog_lints_clean(tmp_path):
    dut = UpdatePipeline(cache_rows=8, max_lines_per_row=5)
    assert_lints_clean(dut, "update_pipeline_c8_l5", tmp_path)
