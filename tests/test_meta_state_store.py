# amaranth: UnusedElaboratable=no
"""MetaStateStore (hw/cxl/meta_state_store.py) in the Amaranth simulator against a
Python model of its docstring: random reads, stores and MemRdData promotions of a few
lines (so that one line is updated in consecutive cycles), every state before each
update checked in the same cycle, Any at power-on. Seeds are printed; ``SEED=<n>``
replays one."""

from __future__ import annotations

import random

import pytest

from hw.cxl.messages import MetaValue
from hw.cxl.meta_state_store import MetaStateStore

from .amaranth_sim import simulate
from .conftest import assert_lints_clean


@pytest.mark.parametrize("lines", [1, 6, 64])
def test_stores_and_promotes(lines, seed):
    rng = random.Random(seed)
    dut = MetaStateStore(lines=lines)
    hot = rng.sample(range(lines), min(lines, 3))
    promoted = 0

    async def bench(ctx):
        nonlocal promoted
        state = dict.fromkeys(range(lines), MetaValue.Any.value)
        for cycle in range(2000):
            line = rng.choice(hot) if rng.random() < 0.7 else rng.randrange(lines)
            store, promote, value = rng.random() < 0.5, rng.random() < 0.3, rng.randrange(4)
            for port, v in ((dut.i_line, line), (dut.i_store, store),
                            (dut.i_promote, promote), (dut.i_value, value)):
                ctx.set(port, v)
            assert ctx.get(dut.o_state) == state[line], f"cycle {cycle}, line {line}"
            if store and promote:
                promoted += state[line] == MetaValue.Invalid.value
                if state[line] == MetaValue.Invalid.value:
                    state[line] = MetaValue.Any.value
            elif store:
                state[line] = value
            await ctx.tick()

    simulate(dut, bench)
    assert promoted > 10


@pytest.mark.parametrize("lines", [0, -1, 3.5, False])
def test_rejects_bad_lines(lines):
    with pytest.raises(ValueError, match=rf"lines must be a positive int, not {lines!r}"):
        MetaStateStore(lines=lines)


def test_lines_is_read_only():
    store = MetaStateStore(lines=8)
    assert store.lines == 8
    with pytest.raises(AttributeError):
        store.lines = 4


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(MetaStateStore(lines=512), "tcxl_meta_state_store_512", tmp_path)
