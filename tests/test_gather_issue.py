# amaranth: UnusedElaboratable=no
"""GatherIssue (hw/engine/gather_issue.py) in the Amaranth simulator against a model of
its docstring.

Rows of tables of 1 to 70 lines per row, placed so that rows cross 4 KiB pages (and,
for the small buffer, are longer than it), and empty bags, go in with random idle
cycles; ``o_meta`` and ``o_ar`` have random backpressure. The bench plays the reorder
buffer (``head`` follows the allocated lines at a random pace) and PMEM (each burst's
ID comes back on ``i_burst_done`` a random time after its AR). Checked: the metadata
of every row in order; every allocation (first line at ``tail``, the next ID
round-robin, never an ID still outstanding, never more than ``rob_lines`` lines in
use); the ARs in allocation order with the bursts the docstring asks for (4 KiB pages,
at most ``min(64, rob_lines)`` lines); ``tail`` and ``busy``; passive checkers on
``o_meta`` and ``o_ar``. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.engine.gather_issue import GatherIssue
from hw.engine.gather_layouts import (
    ROW,
    ROW_META,
    alloc_layout,
    ar_layout,
    ctrl_layout,
    rows_layout,
)
from hw.engine.pool_reduce import CTRL

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule

CONFIGS = {"a24-ids2-rob16": dict(addr_width=24, ids=2, rob_lines=16),
           "a24-ids8-rob64": dict(addr_width=24, ids=8, rob_lines=64),
           "a30-ids16-rob256": dict(addr_width=30, ids=16, rob_lines=256)}


def random_rows(rng: random.Random, addr_width: int, n: int) -> list[dict]:
    rows = []
    while len(rows) < n:
        lpr = rng.choice([1, 3, 4, 5, 17, 64, 70])
        base = (rng.randrange(1 << (addr_width - 12)) << 12) - 64 * rng.randrange(4)
        ctrl = {"table_base": base % (1 << addr_width), "lines_per_row": lpr,
                "batch_id": rng.getrandbits(32), "table_id": rng.getrandbits(16),
                "capture": rng.getrandbits(1), "pool": rng.getrandbits(CTRL.size)}
        update = rng.getrandbits(1)
        for _ in range(rng.randint(1, 12)):
            row = {"row": rng.randrange(200), "row_k": rng.getrandbits(16),
                   "last_row": rng.getrandbits(1), "weight": rng.getrandbits(32),
                   "empty_bag": int(rng.random() < 0.1), "count": rng.getrandbits(16)}
            rows.append({"row": row, "gather": ctrl, "update": update})
    return rows


def row_addr(item: dict, addr_width: int) -> int:
    g = item["gather"]
    return (g["table_base"] + item["row"]["row"] * g["lines_per_row"] * 64) % (1 << addr_width)


def expected_meta(item: dict, addr_width: int) -> dict:
    row, g = item["row"], item["gather"]
    return {**row, "last_line": 0 if row["empty_bag"] else (g["lines_per_row"] - 1) % 256,
            "batch_id": g["batch_id"], "table_id": g["table_id"], "capture": g["capture"],
            "pool": g["pool"], "update": item["update"], "row_addr": row_addr(item, addr_width)}


def expected_bursts(item: dict, addr_width: int, rob_lines: int) -> list[tuple]:
    """``(empty, address, lines)`` of each allocation the row takes."""
    if item["row"]["empty_bag"]:
        return [(True, None, 1)]
    addr, left, out = row_addr(item, addr_width), item["gather"]["lines_per_row"], []
    while left:
        k = min(left, (4096 - addr % 4096) // 64, 64, rob_lines)
        out.append((False, addr, k))
        addr = (addr + 64 * k) % (1 << addr_width)
        left -= k
    return out


@pytest.mark.parametrize("rough", [False, True], ids=["smooth", "rough"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_allocations_and_bursts(config, rough, seed):
    rng = random.Random(seed)
    params = CONFIGS[config]
    aw, ids, rob = params["addr_width"], params["ids"], params["rob_lines"]
    dut = GatherIssue(**params)
    layout = rows_layout(aw)
    items = random_rows(rng, aw, 150)
    want_meta = deque(expected_meta(it, aw) for it in items)
    want_alloc = deque(b for it in items for b in expected_bursts(it, aw, rob))
    n_ar = sum(not b[0] for b in want_alloc)
    rules = [StreamRule("o_meta"), StreamRule("o_ar")]
    p = 0.3 if rough else 0.0

    async def bench(ctx):
        queue = deque(items)
        cur = None
        tail = head = 0
        next_id = 0
        outstanding = set()
        ar_queue = deque()          # (id, addr, len) allocated, AR not yet taken
        done_at = []                # (cycle, id) bursts to report done
        ars = 0
        for cycle in range(20000):
            if cur is None and queue and not rng.random() < p:
                cur = queue.popleft()
                ctx.set(dut.i_rows.payload.as_value(), pack(layout, row=pack(ROW, cur["row"]),
                        gather=pack(ctrl_layout(aw), cur["gather"]), update=cur["update"]))
            ctx.set(dut.i_rows.valid, cur is not None)
            ctx.set(dut.o_meta.ready, not rng.random() < p)
            ctx.set(dut.o_ar.ready, not rng.random() < p)
            head = min(tail, head + rng.choice([0, 1, 1, 2, 4]))
            ctx.set(dut.head, head % (2 * rob))
            due = [d for d in done_at if d[0] <= cycle]
            done = rng.choice(due) if due else None
            ctx.set(dut.i_burst_done.valid, done is not None)
            if done:
                ctx.set(dut.i_burst_done.payload, done[1])
            (_, _, rows_ready, meta_valid, meta_ready, meta, ar_valid, ar_ready, ar,
             alloc_valid, alloc, tail_out, busy) = await ctx.tick().sample(
                dut.i_rows.ready, dut.o_meta.valid, dut.o_meta.ready,
                dut.o_meta.payload.as_value(), dut.o_ar.valid, dut.o_ar.ready,
                dut.o_ar.payload.as_value(), dut.o_alloc.valid, dut.o_alloc.payload.as_value(),
                dut.tail, dut.busy)
            where = f"cycle {cycle}, seed {seed}"
            rules[0].observe(cycle, meta_valid, meta_ready, meta)
            rules[1].observe(cycle, ar_valid, ar_ready, ar)
            assert tail_out == tail % (2 * rob), f"tail ({where})"
            if cur is not None and rows_ready:
                cur = None
            if meta_valid and meta_ready:
                got = unpack(ROW_META, meta)
                assert want_meta and got == want_meta.popleft(), f"o_meta ({where})"
            if done:
                done_at.remove(done)
                outstanding.discard(done[1])
            if alloc_valid:
                a = unpack(alloc_layout(rob.bit_length() - 1, ids.bit_length() - 1), alloc)
                empty, addr, k = want_alloc.popleft()
                assert a["line"] == tail % rob and a["empty"] == empty, f"o_alloc ({where})"
                assert tail + k - head <= rob, f"more than rob_lines in use ({where})"
                if not empty:
                    assert a["id"] == next_id, f"not round-robin ({where})"
                    assert next_id not in outstanding, f"ID still outstanding ({where})"
                    outstanding.add(next_id)
                    ar_queue.append((next_id, addr, k - 1))
                    next_id = (next_id + 1) % ids
                tail += k
            if ar_valid and ar_ready:
                got = tuple(unpack(ar_layout(aw, ids.bit_length() - 1), ar).values())
                assert ar_queue and got == ar_queue.popleft(), f"o_ar {got} ({where})"
                done_at.append((cycle + rng.randint(1, 40), got[0]))
                ars += 1
            if not queue and cur is None and not want_alloc and not ar_queue and not done_at:
                break
        assert not want_meta and not want_alloc and ars == n_ar, "stalled"
        for _ in range(3):
            ctx.set(dut.o_meta.ready, 1)
            *_, busy = await ctx.tick().sample(dut.busy)
        assert not busy

    simulate(dut, bench)
    errors = [e for r in rules for e in r.errors]
    assert not errors, errors[:5]


@pytest.mark.parametrize("kwargs, message", [
    ({"addr_width": 11, "ids": 2, "rob_lines": 16},
     "addr_width must be an integer from 12 to 64, not 11"),
    ({"addr_width": 65, "ids": 2, "rob_lines": 16},
     "addr_width must be an integer from 12 to 64, not 65"),
    ({"addr_width": 30, "ids": 2, "rob_lines": 8},
     "rob_lines must be a power of two from 16 to 4096, not 8"),
    ({"addr_width": 30, "ids": 2, "rob_lines": 100},
     "rob_lines must be a power of two from 16 to 4096, not 100"),
    ({"addr_width": 30, "ids": 1, "rob_lines": 16},
     r"ids must be a power of two from 2 to rob_lines \(16\), not 1"),
    ({"addr_width": 30, "ids": 32, "rob_lines": 16},
     r"ids must be a power of two from 2 to rob_lines \(16\), not 32"),
    ({"addr_width": 30, "ids": 3, "rob_lines": 16},
     r"ids must be a power of two from 2 to rob_lines \(16\), not 3"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        GatherIssue(**kwargs)


def test_parameters_are_read_only_properties():
    dut = GatherIssue(addr_width=30, ids=8, rob_lines=64)
    assert (dut.addr_width, dut.ids, dut.rob_lines) == (30, 8, 64)
    with pytest.raises(AttributeError):
        dut.ids = 4


@pytest.mark.parametrize("params", list(CONFIGS.values())[::2], ids=list(CONFIGS)[::2])
def test_verilog_lints_clean(params, tmp_path):
    name = "gather_issue_" + "_".join(f"{k}{v}" for k, v in params.items())
    assert_lints_clean(GatherIssue(**params), name, tmp_path)
