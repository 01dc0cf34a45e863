# amaranth: UnusedElaboratable=no
"""RowFork (hw/engine/row_fork.py) in the Amaranth simulator.

Descriptors' worth of random rows (LOOKUPs and UPDATEs, some empty bags) go in with
random idle cycles; ``o_gather`` and ``o_grad`` have random backpressure. After each
UPDATE's last row the bench pulses ``i_finish`` (as the completion does once the
UPDATE's status has passed) and, as the engine's merge does, sends nothing more until
the gradient feed has been told (``finish``). Checked: ``o_gather`` gets every LOOKUP
row, with its settings, in order, and no UPDATE row; ``o_grad`` gets every UPDATE row, in
order; ``finish`` pulses once per UPDATE, only after its last row left the FIFO; with
``o_grad`` stalled the FIFO takes its depth of rows and then holds the input. Passive
checkers hold both outputs to the stream rules. Random tests print their seed;
``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.engine.row_fork import RowFork
from hw.engine.row_gather import ROW
from hw.engine.sequencer_pool import rows_layout

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack
from .stream_rule import StreamRule

ADDR_WIDTH = 20
LAYOUT = rows_layout(ADDR_WIDTH)


def row(rng: random.Random, update: int, gather: int, empty: float = 0.2) -> int:
    item = pack(ROW, row=rng.getrandbits(32), row_k=rng.getrandbits(16),
                empty_bag=int(rng.random() < empty), weight=rng.getrandbits(32))
    return pack(LAYOUT, row=item, gather=gather, update=update)


def groups(rng: random.Random, n: int) -> list[tuple[bool, list[int]]]:
    """``n`` descriptors: UPDATE or not, and their rows as packed ``rows_layout``."""
    out = []
    for _ in range(n):
        update = int(rng.random() < 0.5)
        gather = rng.getrandbits(LAYOUT["gather"].width)
        out.append((bool(update), [row(rng, update, gather) for _ in range(rng.randint(0, 12))]))
    return out


def field(v: int, name: str) -> int:
    return v >> ROW[name].offset & 1


def _run(seed: int, descs: list[tuple[bool, list[int]]], *, grad_rows: int, idle: float,
         bp: float, grad_pause: int = 0) -> dict:
    rng = random.Random(seed)
    dut = RowFork(addr_width=ADDR_WIDTH, grad_rows=grad_rows)
    row_mask = (1 << ROW.size) - 1
    want_g = deque(v for upd, g in descs for v in g if not upd)
    want_f = deque(v & row_mask for upd, g in descs for v in g if upd)
    rules = [StreamRule("o_gather"), StreamRule("o_grad")]
    stats = {"finishes": 0, "taken_while_paused": 0, "cycle": 0, "i_ready": 0,
             "valid": False}

    async def step(ctx):
        cycle = stats["cycle"]
        ctx.set(dut.o_gather.ready, not rng.random() < bp)
        ctx.set(dut.o_grad.ready, cycle >= grad_pause and not rng.random() < bp)
        (i_ready, gv, gready, gp, fv, fready, fp, finish) = (await ctx.tick().sample(
            dut.i_rows.ready, dut.o_gather.valid, dut.o_gather.ready,
            dut.o_gather.payload.as_value(), dut.o_grad.valid, dut.o_grad.ready,
            dut.o_grad.payload.as_value(), dut.finish))[2:]
        stats["i_ready"] = i_ready
        rules[0].observe(cycle, gv, gready, gp)
        rules[1].observe(cycle, fv, fready, fp)
        where = f"cycle {cycle}, seed {seed}"
        if gv and gready:
            assert want_g and gp == want_g.popleft(), f"o_gather ({where})"
        if i_ready and stats["valid"] and cycle < grad_pause:
            stats["taken_while_paused"] += 1
        if fv and fready:
            assert want_f and fp == want_f.popleft(), f"o_grad ({where})"
        if finish:
            assert not fv, f"finish while rows wait in the FIFO ({where})"
            stats["finishes"] += 1
        stats["cycle"] += 1

    async def bench(ctx):
        for update, g in descs:
            rows = deque(g)
            cur = None
            while rows or cur is not None:
                if cur is None and rows and not rng.random() < idle:
                    cur = rows.popleft()
                    ctx.set(dut.i_rows.payload.as_value(), cur)
                ctx.set(dut.i_rows.valid, cur is not None)
                stats["valid"] = cur is not None
                await step(ctx)
                if cur is not None and stats["i_ready"]:
                    cur = None
            ctx.set(dut.i_rows.valid, 0)
            stats["valid"] = False
            if update:
                ctx.set(dut.i_finish, 1)
                await step(ctx)
                ctx.set(dut.i_finish, 0)
                before = stats["finishes"]
                for _ in range(2000):
                    if stats["finishes"] > before:
                        break
                    await step(ctx)
                else:
                    raise AssertionError("no finish")
                assert stats["finishes"] == before + 1
        for _ in range(50):
            await step(ctx)
        assert stats["finishes"] == sum(upd for upd, _ in descs), "a finish too many"

    simulate(dut, bench)
    errors = [e for r in rules for e in r.errors]
    assert not errors, "\n".join(errors[:10])
    assert not want_g and not want_f, f"left: {len(want_g)} gather, {len(want_f)} grad"
    return stats


@pytest.mark.parametrize("grad_rows", [2, 16])
@pytest.mark.parametrize("idle, bp", [(0.0, 0.0), (0.3, 0.3)], ids=["smooth", "rough"])
def test_fork(seed, grad_rows, idle, bp):
    """Random rows: each side's items in order, one finish per UPDATE."""
    _run(seed, groups(random.Random(seed), 60), grad_rows=grad_rows, idle=idle, bp=bp)


def test_update_rows_fill_the_fifo(seed):
    """The feed stalled: the fork takes the FIFO's depth of an UPDATE's rows, then holds."""
    rng = random.Random(seed)
    rows = [row(rng, 1, 0, empty=0.0) for _ in range(40)]
    stats = _run(seed, [(True, rows)], grad_rows=16, idle=0.0, bp=0.0, grad_pause=500)
    assert stats["taken_while_paused"] == 16, stats


def test_rejects_shallow_fifo():
    with pytest.raises(ValueError, match="grad_rows must be at least 2, not 1"):
        RowFork(addr_width=ADDR_WIDTH, grad_rows=1)


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(RowFork(addr_width=48, grad_rows=16), "row_fork_g16", tmp_path)
