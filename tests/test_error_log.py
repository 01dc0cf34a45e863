# amaranth: UnusedElaboratable=no
"""ErrorLog (hw/csr/error_log.py), fast tier: Amaranth simulator.

Random raises, details and clears every cycle against a reference model written from
the contract in the class docstring (registered pulses, sticky flags with
write-1-to-clear where a new raise wins, the lowest kind of the first cycle with an
error recorded). ``SEED=<n>`` replays a run. (The linter option on the first line lets
tests build logs only to look at their layout.)
"""

from __future__ import annotations

import random

import pytest
from amaranth.lib import data

from hw.csr.error_log import ErrorLog

from .amaranth_sim import simulate

INFO = data.StructLayout({"opcode": 5, "id": 12})


def test_rejects_bad_parameters():
    with pytest.raises(ValueError, match="kinds must be an integer from 1 to 32, not 0"):
        ErrorLog(kinds=0, info=INFO)
    with pytest.raises(ValueError, match="kinds must be an integer from 1 to 32, not 33"):
        ErrorLog(kinds=33, info=INFO)
    with pytest.raises(ValueError, match="without a 'code' field"):
        ErrorLog(kinds=3, info=data.StructLayout({"code": 2}))


def test_record_layout():
    log = ErrorLog(kinds=11, info=INFO)
    assert list(log.record_layout.members.items()) == [("code", 4), ("opcode", 5), ("id", 12)]
    assert ErrorLog(kinds=1, info=INFO).record_layout.members["code"] == 1


@pytest.mark.parametrize("kinds", [1, 7, 11])
def test_random(seed, kinds):
    rng = random.Random(seed)
    dut = ErrorLog(kinds=kinds, info=INFO)
    mask = (1 << kinds) - 1

    async def bench(ctx):
        status, first = 0, None
        for cycle in range(3000):
            # Errors are rare in some stretches and dense in others.
            rate = 0.05 if (cycle // 300) % 2 else 0.4
            raised = sum(1 << k for k in range(kinds) if rng.random() < rate / kinds * 2)
            info = [{"opcode": rng.getrandbits(5), "id": rng.getrandbits(12)}
                    for _ in range(kinds)]
            clear = rng.getrandbits(kinds) if rng.random() < 0.2 else 0
            ctx.set(dut.i_raise, raised)
            ctx.set(dut.i_clear, clear)
            for k in range(kinds):
                ctx.set(dut.i_info[k], info[k])
            await ctx.tick()
            kept = status & ~clear & mask
            if not kept and raised:
                low = (raised & -raised).bit_length() - 1
                first = {"code": low, **info[low]}
            status = kept | raised
            assert ctx.get(dut.o_set) == raised, f"cycle {cycle}: o_set"
            assert ctx.get(dut.o_status) == status, f"cycle {cycle}: o_status"
            if status:
                got = ctx.get(dut.o_first)
                assert {"code": got.code, "opcode": got.opcode, "id": got.id} == first, \
                    f"cycle {cycle}: o_first"

    simulate(dut, bench)
