# amaranth: UnusedElaboratable=no
"""OrderingTable (hw/cxl/ordering_table.py) in the Amaranth simulator against a Python
model of its docstring.

Random reads and writes are issued into random buckets (at most ``depth`` in flight)
and retired in a random order, some in the cycle another enters the same bucket, with
idle cycles; every cycle ``o_read_busy`` / ``o_write_busy`` must flag exactly the
buckets with a read / write in flight after the previous edge. Seeds are printed;
``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from hw.cxl.ordering_table import OrderingTable

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .flat_ports import FlatPorts


@pytest.mark.parametrize("buckets, depth", [(2, 1), (2, 3), (8, 16)])
def test_counts_in_flight_per_bucket(buckets, depth, seed):
    rng = random.Random(seed)
    dut = OrderingTable(buckets=buckets, depth=depth)
    seen = Counter()

    async def bench(ctx):
        in_flight: list[tuple[int, bool]] = []      # (bucket, write)
        for cycle in range(3000):
            count = Counter(in_flight)
            for write, port in ((False, dut.o_read_busy), (True, dut.o_write_busy)):
                want = sum(1 << b for b in range(buckets) if count[b, write])
                assert ctx.get(port) == want, f"cycle {cycle}: write={write}"
            seen["busy"] += bool(in_flight)
            retire = bool(in_flight) and rng.random() < 0.45
            old = in_flight.pop(rng.randrange(len(in_flight))) if retire else (0, False)
            issue = len(in_flight) < depth and rng.random() < 0.5
            new = old if retire and rng.random() < 0.3 else (rng.randrange(buckets),
                                                             rng.random() < 0.5)
            seen["cancel"] += issue and retire and new == old
            for port, valid, (bucket, write) in ((dut.i_issue, issue, new),
                                                 (dut.i_retire, retire, old)):
                ctx.set(port.valid, valid)
                ctx.set(port.payload, {"bucket": bucket, "write": write})
            if issue:
                in_flight.append(new)
            await ctx.tick()

    simulate(dut, bench)
    assert seen["busy"] > 1000 and seen["cancel"] > 0


@pytest.mark.parametrize("buckets", [1, 3, 0, 4.0])
def test_rejects_bad_buckets(buckets):
    with pytest.raises(ValueError,
                       match=rf"buckets must be a power of two of at least 2, not {buckets!r}"):
        OrderingTable(buckets=buckets, depth=4)


@pytest.mark.parametrize("depth", [0, -2, "4"])
def test_rejects_bad_depth(depth):
    with pytest.raises(ValueError, match=rf"depth must be a positive int, not {depth!r}"):
        OrderingTable(buckets=4, depth=depth)


def test_parameters_are_read_only():
    table = OrderingTable(buckets=4, depth=7)
    assert (table.buckets, table.depth) == (4, 7)
    with pytest.raises(AttributeError):
        table.depth = 3


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(FlatPorts(OrderingTable(buckets=8, depth=5)), "tcxl_ordering_table_8",
                       tmp_path)
