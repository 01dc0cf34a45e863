# amaranth: UnusedElaboratable=no
"""Completion split into components (hw/engine/completion.py) against the single-block
stage it replaced (tests/_completion_ref.py), cycle by cycle.

Random traffic on every input: descriptors of every sort (not via the sequencer,
COMMIT with and without the commit word, LOOKUP and UPDATE, random ``dim`` / ``bf16``
/ bag counts) with random idle cycles, sequencer statuses (some failing), pooled lines
(random ``line`` and ``last``), scatter results, host-record answers for the records
sent on ``o_rec`` (random backpressure on ``o_rec``), records in PMEM or in GPU memory;
the PMEM port is served by :class:`tb.pmem.PmemModel` with random AW/W backpressure
and B idle cycles. The inputs are random beyond the protocol (a status may come at any
time), which only widens what the two must agree on: every output port, at every
clock edge (:class:`tests.equivalence.Pair`). Seeds are printed; ``SEED=<n>`` replays
one.
"""

from __future__ import annotations

import random

import pytest

from hw.engine.completion import Completion
from tb.pmem import PmemModel, PmemTiming

from ._completion_ref import CompletionRef
from .amaranth_sim import simulate
from .axi_pmem import AxiPmemPort, Traffic
from .equivalence import Pair

AW = 20


def random_info(rng: random.Random, seq: int) -> dict:
    sort = rng.choice(["pre", "commit", "lookup", "lookup", "update"])
    return {"seq": seq, "kind": rng.getrandbits(8), "table_id": rng.getrandbits(16),
            "batch_id": rng.getrandbits(32), "cookie": rng.getrandbits(64),
            "pre_status": rng.choice([0, 0, rng.getrandbits(8)]),
            "via_seq": sort in ("lookup", "update"), "lookup": sort == "lookup",
            "update": sort == "update", "num_bags": rng.choice([0, 1, 2, 3]),
            "data_addr": 64 * rng.getrandbits(AW - 6), "dim": rng.randint(1, 200),
            "bf16": rng.random() < 0.5, "commit": sort == "commit" and rng.random() < 0.7,
            "commit_word": rng.getrandbits(64)}


@pytest.mark.parametrize("cq_host", [False, True], ids=["pmem_cq", "host_cq"])
@pytest.mark.parametrize("rough", [False, True], ids=["smooth", "rough"])
def test_same_as_reference(cq_host, rough, seed):
    rng = random.Random(seed)
    pair = Pair(CompletionRef(addr_width=AW, id_width=2), Completion(addr_width=AW, id_width=2))
    model = PmemModel(size=1 << AW, rng=random.Random(seed),
                      timing=PmemTiming(write_latency=rng.randint(1, 30), jitter=8,
                                        peak_lines_per_cycle=4))
    p = 0.4 if rough else 0.0
    axi = AxiPmemPort(pair.pmem, model, rng, Traffic(aw_bp=p, w_bp=p, b_idle=p))
    counts = {"complete": 0, "host_records": 0, "bags": 0}

    async def bench(ctx):
        ctx.set(pair.cq_host, cq_host)
        ctx.set(pair.cq_base, 64 * rng.getrandbits(AW - 6))
        ctx.set(pair.cq_host_line, rng.getrandbits(46))
        ctx.set(pair.ring_order, rng.randint(0, 12))
        seq = 0
        offers = {"i_info": None, "i_status": None, "i_pooled": None, "i_done": None}
        answers = 0                         # host records sent and not yet answered
        due = []                            # cycles at which answers arrive
        for cycle in range(3000):
            for name, make in (
                    ("i_info", lambda s=seq: random_info(rng, s)),
                    ("i_status", lambda: {"status": rng.choice([0, 0, 0, 1, 9])}),
                    ("i_pooled", lambda: {"data": rng.getrandbits(512),
                                          "line": rng.randrange(4), "last": rng.random() < 0.4}),
                    ("i_done", lambda: {"rows_written": rng.getrandbits(32),
                                        "updates": rng.getrandbits(32)})):
                if offers[name] is None and rng.random() < (0.2 if name == "i_info" else 0.5):
                    offers[name] = make()
                port = getattr(pair, name)
                ctx.set(port.valid, offers[name] is not None)
                if offers[name] is not None:
                    ctx.set(port.payload, offers[name])
            answer = bool(due) and due[0] <= cycle
            ctx.set(pair.i_rec.valid, answer)
            ctx.set(pair.i_rec.payload, {"tag": 0, "error": rng.random() < 0.1})
            ctx.set(pair.o_rec.ready, rng.random() < (0.5 if rough else 1.0))
            ready = [getattr(pair, n).ready for n in offers]
            *taken, rec_valid, rec_ready, complete, bag = await axi.tick(
                ctx, *ready, pair.o_rec.valid, pair.o_rec.ready, pair.complete,
                pair.bag_written)
            for name, t in zip(list(offers), taken, strict=True):
                if t and offers[name] is not None:
                    seq += name == "i_info"
                    offers[name] = None
            if answer:
                due.pop(0)
                answers -= 1
            if rec_valid and rec_ready:
                answers += 1
                due.append(cycle + rng.randint(1, 20))
                counts["host_records"] += 1
            counts["complete"] += complete
            counts["bags"] += bag
        assert not axi.errors, axi.errors[:5]

    simulate(pair, bench)
    print(counts)
    assert counts["complete"] > 20 and counts["bags"] > 0
    assert (counts["host_records"] > 0) == cq_host
