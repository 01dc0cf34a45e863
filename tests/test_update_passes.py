# amaranth: UnusedElaboratable=no
"""UpdatePasses (hw/engine/update_passes.py) in the Amaranth simulator, against the
golden pass schedule (``sim.embedding.update_passes``, from ``docs/embedding.md``,
"Passes").

The bench plays the dispatcher (random LOOKUPs and UPDATEs on ``i_exec``, random idle
cycles, ``quiet`` from its own count of descriptors not yet completed), the bag
sequencers (a status per descriptor sent on ``o_exec``, after a random delay; some
first passes fail their checks, a few later ones fail too) and the scatter (a report
per pass that passed, after a random delay: each UPDATE has a random multiset of rows,
and a pass reports the rows of that multiset in it, overflowing when they are more than
the accumulator holds; a few report a read error), and takes ``o_status`` and
``o_done`` with random backpressure. It checks that every UPDATE is sent once per pass
of the golden schedule, in its order, with ``pass_level`` / ``pass_value`` naming the
pass while it runs and 0 otherwise, and ``defer`` high exactly while a multi-pass
UPDATE runs; that each descriptor gives the completion exactly
one status and, if that passed and it is an UPDATE, one report, with the sums over its
passes; that a multi-pass UPDATE is taken only when nothing is outstanding; and that
``ev_pass`` counts the UPDATEs sent. Stream rules are checked on every output. Seeds
are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest
from amaranth.hdl import Const, Module, Signal
from amaranth.sim import Simulator

from hw.engine.bag_sequencer import STATUS
from hw.engine.descriptor import DescKind, Descriptor, Status
from hw.engine.update_layouts import DONE
from hw.engine.update_passes import UpdatePasses, in_pass
from sim import embedding as emb

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule

ACC_ROWS, ACC_LINES, MAX_PASSES = 8, 32, 8
#: Rows whose pass hash ends in three zero bits: all in pass (L, 0) for L <= 3, so an
#: UPDATE of more of them than the accumulator holds overflows there too.
CROWD = [r for r in range(1 << 14) if emb.pass_hash(r) & 7 == 0]


def random_desc(rng: random.Random, cookie: int) -> dict:
    """A LOOKUP, or an UPDATE of 1 to MAX_PASSES passes by its size, with the rows it
    names (``counted``: the counted rows, with repeats; fewer than ``num_indices`` when
    some are padding)."""
    kind = DescKind.LOOKUP if rng.random() < 0.3 else DescKind.UPDATE
    dim = rng.choice([16, 32, 48, 64])
    bf16 = rng.randrange(2)
    glines = emb.grad_lines(dim, bf16)
    passes = rng.choice([1, 1, 2, 3, 4, 8])
    cap = min(ACC_ROWS, ACC_LINES // glines)
    n = rng.randint(max(1, (passes - 1) * cap + 1), passes * cap)
    distinct = rng.randint(1, n)
    pool = (rng.sample(range(1 << 20), distinct) if rng.random() < 0.8
            else rng.sample(CROWD, distinct))
    counted = [rng.choice(pool) for _ in range(n - rng.randrange(3))]
    return {"kind": kind.value, "dim": dim, "bf16": bf16, "num_indices": n,
            "cookie": cookie, "counted": counted, "glines": glines}


def schedule(d: dict) -> list[tuple[int, int, bool]]:
    if d["kind"] != DescKind.UPDATE.value:
        return [(0, 0, False)]
    return emb.update_passes(d["counted"], d["num_indices"], d["glines"], (ACC_ROWS, ACC_LINES))


def test_in_pass_matches_the_contract(seed):
    """The logic's pass hash and membership against ``sim.embedding.pass_hash``."""
    rng = random.Random(seed)
    for _ in range(300):
        row, level = rng.getrandbits(32), rng.randint(0, 32)
        value = rng.getrandbits(32) & ((1 << level) - 1)
        if rng.random() < 0.5:                          # make it a member
            value = emb.pass_hash(row) & ((1 << level) - 1)
        got = in_pass(Const(row, 32), Const(level, 6), Const(value, 32))
        assert bool(_const_value(got)) == emb.in_pass(row, level, value), (row, level, value)


def _const_value(value) -> int:
    """A constant expression's value, from the simulator."""
    out = Signal(value.shape())
    result = {}

    async def bench(ctx):
        result["v"] = ctx.get(out)

    m = Module()
    m.d.comb += out.eq(value)
    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    return result["v"]


@pytest.mark.parametrize("bp", [0.0, 0.4])
def test_passes_against_the_schedule(seed, bp):
    rng = random.Random(seed)
    dut = UpdatePasses(acc_rows=ACC_ROWS, acc_lines=ACC_LINES, max_passes=MAX_PASSES)
    rules = [StreamRule("o_exec"), StreamRule("o_status"), StreamRule("o_done")]
    stats = {"multi": 0, "overflow": 0, "split": 0, "late_fail": 0, "first_fail": 0,
             "read_error": 0}

    async def bench(ctx):
        todo = deque(random_desc(rng, c) for c in range(160))
        offered = None
        taken: deque[dict] = deque()        # descriptors taken, not yet completed
        expect_exec: deque[tuple] = deque()  # (desc, level, value) the next sends
        seq_q: deque[list] = deque()        # [cycles left, desc, pass index] statuses due
        scat_q: deque[list] = deque()       # [cycles left, desc, pass index] reports due
        out_status: deque[dict] = deque()   # statuses the completion should see, in order
        out_done: deque[dict] = deque()
        st_offer = dn_offer = None
        passes_sent = 0
        ev_count = 0
        running = None                      # (desc, pass index) sent, not yet reported
        for cycle in range(60_000):
            if not todo and not taken and offered is None:
                break
            if offered is None and todo and rng.random() < 0.5:
                offered = todo.popleft()
            quiet = not taken
            ctx.set(dut.quiet, quiet)
            ctx.set(dut.i_exec.valid, offered is not None)
            if offered is not None:
                ctx.set(dut.i_exec.p.as_value(), pack(Descriptor, offered))
            ctx.set(dut.o_exec.ready, rng.random() >= bp)
            # The sequencer's status and the scatter's report, when due.
            if st_offer is None and seq_q and seq_q[0][0] <= 0:
                st_offer = seq_q.popleft()
            if dn_offer is None and scat_q and scat_q[0][0] <= 0:
                dn_offer = scat_q.popleft()
            for q in (seq_q, scat_q):
                for item in q:
                    item[0] -= 1
            st_payload = dn_payload = None
            if st_offer is not None:
                _, d, k = st_offer
                fail_first = k == 0 and d["cookie"] % 9 == 4
                fail_late = k > 0 and d["cookie"] % 4 == 1 and k == len(d["sched"]) - 1
                st_payload = {"status": Status.INDEX_RANGE.value if fail_first
                              else Status.READ_ERROR.value if fail_late else 0,
                              "read_error": 0}
                ctx.set(dut.i_status.p.as_value(), pack(STATUS, st_payload))
            ctx.set(dut.i_status.valid, st_offer is not None)
            if dn_offer is not None:
                _, d, k = dn_offer
                level, value, over = d["sched"][k] if d["kind"] == DescKind.UPDATE.value \
                    else (0, 0, False)
                mine = [r for r in d["counted"] if emb.in_pass(r, level, value)]
                rerr = d["cookie"] % 17 == 3 and k == len(d["sched"]) // 2
                dn_payload = {"rows_written": 0 if over or rerr else len(set(mine)),
                              "updates": len(mine), "overflow": int(over),
                              "read_error": int(rerr),
                              "overflow_at": emb.overflow_at(mine, d["glines"],
                                                             (ACC_ROWS, ACC_LINES)) or 0}
                ctx.set(dut.i_done.p.as_value(), pack(DONE, dn_payload))
            ctx.set(dut.i_done.valid, dn_offer is not None)
            st_ready, dn_ready = rng.random() >= bp, rng.random() >= bp
            ctx.set(dut.o_status.ready, st_ready)
            ctx.set(dut.o_done.ready, dn_ready)

            (_, _, ix_ready, ox_valid, ox_p, ox_ready, is_ready, os_valid, os_p,
             id_ready, od_valid, od_p, level, value, ev, defer) = await ctx.tick().sample(
                dut.i_exec.ready, dut.o_exec.valid, dut.o_exec.p.as_value(),
                dut.o_exec.ready, dut.i_status.ready, dut.o_status.valid,
                dut.o_status.p.as_value(), dut.i_done.ready, dut.o_done.valid,
                dut.o_done.p.as_value(), dut.pass_level, dut.pass_value, dut.ev_pass,
                dut.defer)
            for rule, v, r, p in ((rules[0], ox_valid, ox_ready, ox_p),
                                  (rules[1], os_valid, st_ready, os_p),
                                  (rules[2], od_valid, dn_ready, od_p)):
                rule.observe(cycle, v, r, p)
            ev_count += ev
            where = f"cycle {cycle}"
            # The pass named while a pass of a multi-pass UPDATE runs (from its send to
            # its report); 0 while none is taken.
            multi_on = any(t.get("multi_active") for t in taken)
            assert defer == multi_on, (where, defer)
            if not multi_on:
                assert (level, value) == (0, 0), (where, level, value)
            elif running is not None:
                d, k = running
                assert (level, value) == d["sched"][k][:2], (where, level, value, d["sched"][k])
            if offered is not None and ix_ready:
                d = offered
                d["sched"] = schedule(d)
                multi = d["kind"] == DescKind.UPDATE.value and emb.passes_needed(
                    d["num_indices"], d["glines"], (ACC_ROWS, ACC_LINES)) > 1
                if multi:
                    assert quiet, f"{where}: a multi-pass UPDATE taken while not quiet"
                    stats["multi"] += 1
                    d["multi_active"] = True
                d["next_pass"] = 0
                taken.append(d)
                if not multi:
                    out_status.append(d)
                    expect_exec.append((d, 0))
                else:
                    expect_exec.append((d, 0))
                offered = None
            if ox_valid and ox_ready:
                assert expect_exec, f"{where}: an o_exec nobody expects"
                d, k = expect_exec.popleft()
                got = unpack(Descriptor, ox_p)
                assert (got["cookie"], got["kind"]) == (d["cookie"], d["kind"]), where
                passes_sent += d["kind"] == DescKind.UPDATE.value
                seq_q.append([rng.randint(0, 12), d, k])
                running = (d, k)
                d.setdefault("sent", []).append(k)
            if st_offer is not None and is_ready:
                _, d, k = st_offer
                st_offer = None
                failed = st_payload["status"] != 0
                if k == 0 and d.get("multi_active"):
                    out_status.append(d)
                if failed:
                    stats["first_fail" if k == 0 else "late_fail"] += 1
                    d["failed_at"] = k
                    if k > 0:
                        d["result"] = "merged_error"
                        out_done.append(d)
                    running = None
                    _retire(d, expect_exec)
                elif d["kind"] == DescKind.UPDATE.value:
                    scat_q.append([rng.randint(0, 20), d, k])
                else:
                    running = None
            if dn_offer is not None and id_ready:
                _, d, k = dn_offer
                dn_offer = None
                running = None
                d.setdefault("reports", []).append(dn_payload)
                if dn_payload["read_error"]:
                    stats["read_error"] += 1
                    out_done.append(d)
                    _retire(d, expect_exec)
                elif k + 1 < len(d["sched"]):
                    stats["overflow"] += dn_payload["overflow"]
                    stats["split"] += dn_payload["overflow"] and d["sched"][k][0] > 0
                    expect_exec.append((d, k + 1))
                else:
                    out_done.append(d)
                    _retire(d, expect_exec)
            # What the completion sees.
            if os_valid and st_ready:
                assert out_status, f"{where}: a status nobody expects"
                d = out_status.popleft()
                got = unpack(STATUS, os_p)
                d["st_out"] = got["status"]
                if got["status"] != 0 or d["kind"] != DescKind.UPDATE.value:
                    taken.remove(d)
            if od_valid and dn_ready:
                assert out_done, f"{where}: a report nobody expects"
                d = out_done.popleft()
                got = unpack(DONE, od_p)
                good = [r for r in d.get("reports", []) if not r["overflow"]
                        and not r["read_error"]]
                want = {"rows_written": sum(r["rows_written"] for r in good),
                        "updates": sum(r["updates"] for r in good),
                        "overflow": 0, "overflow_at": 0,
                        "read_error": int(d.get("result") == "merged_error" or any(
                            r["read_error"] for r in d.get("reports", [])))}
                if not d.get("multi_active"):
                    want = d["reports"][-1]
                assert got == want, (where, got, want)
                if d.get("multi_active"):
                    assert d["sent"] == list(range(len(d["sent"]))), where
                    if not want["read_error"]:
                        assert len(d["sent"]) == len(d["sched"]), where
                taken.remove(d)
        else:
            raise AssertionError("the bench did not finish")
        assert not todo and not taken and not out_status and not out_done
        assert ev_count == passes_sent
        assert stats["multi"] > 10 and stats["overflow"] > 0 and stats["split"] > 0, stats
        assert stats["first_fail"] and stats["late_fail"] and stats["read_error"], stats
        print(stats)

    simulate(dut, bench)
    errors = [e for rule in rules for e in rule.errors]
    assert not errors, errors[:5]


def _retire(d: dict, expect_exec: deque) -> None:
    """``d`` sends nothing more."""
    for item in list(expect_exec):
        if item[0] is d:
            expect_exec.remove(item)


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(UpdatePasses(acc_rows=4096, acc_lines=16384, max_passes=64),
                       "update_passes", tmp_path)
