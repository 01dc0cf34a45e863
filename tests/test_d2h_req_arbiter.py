"""D2HReqArbiter (hw/cxl/d2h_req_arbiter.py) in the Amaranth simulator against a model
of its docstring.

Random D2H Req messages on both inputs with random idle cycles, random backpressure on
``o_req``. The model, from the docstring alone: an input's ``ready`` is the register's
room unless the other input is valid and has the turn; a request taken in cycle ``t``
is on ``o_req`` from cycle ``t + 1``, whole; the turn passes to the other input after
each take. Checked every cycle: both ``ready`` and what ``o_req`` shows; at the end each
input's requests came out in their order, and both inputs were taken in turn while both
waited. A passive checker holds ``o_req`` to the stream rules. Seeds are printed;
``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.cxl.d2h_req_arbiter import D2HReqArbiter
from hw.cxl.messages import D2HReq

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .stream_rule import StreamRule


@pytest.mark.parametrize("idle, bp", [(0.0, 0.0), (0.3, 0.3), (0.0, 0.6)],
                         ids=["smooth", "rough", "stalled"])
def test_merge(seed, idle, bp):
    rng = random.Random(seed)
    dut = D2HReqArbiter()
    n = 300
    queues = {"rd": deque(rng.getrandbits(D2HReq.size) for _ in range(n)),
              "wr": deque(rng.getrandbits(D2HReq.size) for _ in range(n))}
    sent = {"rd": [], "wr": []}
    got = []
    rule = StreamRule("o_req")
    stats = {"contended": 0}

    async def bench(ctx):
        ports = {"rd": dut.i_rd, "wr": dut.i_wr}
        cur = {"rd": None, "wr": None}
        held = None                     # the model's o_req register
        wr_turn = False
        for cycle in range(20 * n):
            for k, port in ports.items():
                if cur[k] is None and queues[k] and not rng.random() < idle:
                    cur[k] = queues[k].popleft()
                    ctx.set(port.payload.as_value(), cur[k])
                ctx.set(port.valid, cur[k] is not None)
            out_ready = not rng.random() < bp
            ctx.set(dut.o_req.ready, out_ready)
            _, _, rd_ready, wr_ready, valid, payload = await ctx.tick().sample(
                dut.i_rd.ready, dut.i_wr.ready, dut.o_req.valid, dut.o_req.payload.as_value())
            where = f"cycle {cycle}, seed {seed}"
            assert valid == (held is not None), where
            if held is not None:
                assert payload == held, where
            rule.observe(cycle, valid, out_ready, payload)
            free = held is None or out_ready
            want_rd = free and not (cur["wr"] is not None and wr_turn)
            want_wr = free and not (cur["rd"] is not None and not wr_turn)
            assert (rd_ready, wr_ready) == (want_rd, want_wr), where
            if valid and out_ready:
                got.append(held)
                held = None
            both = cur["rd"] is not None and cur["wr"] is not None
            for k, ready in (("rd", rd_ready), ("wr", wr_ready)):
                if cur[k] is not None and ready:
                    stats["contended"] += both
                    sent[k].append(cur[k])
                    held, cur[k], wr_turn = cur[k], None, k == "rd"
            if not any(queues.values()) and not any(cur.values()) and held is None:
                break

    simulate(dut, bench)
    assert not rule.errors, rule.errors[:5]
    assert len(got) == 2 * n
    for k in ("rd", "wr"):
        assert [v for v in got if v in set(sent[k])] == sent[k], f"{k} out of order"
    if idle == 0.0:
        assert stats["contended"] > n, "both inputs seldom waited together"


def test_turns_alternate_when_both_wait():
    """Both inputs always valid, output always ready: rd, wr, rd, wr, ... from reset."""
    dut = D2HReqArbiter()
    order = []

    async def bench(ctx):
        ctx.set(dut.i_rd.valid, 1)
        ctx.set(dut.i_wr.valid, 1)
        ctx.set(dut.o_req.ready, 1)
        for _ in range(8):
            _, _, rd, wr = await ctx.tick().sample(dut.i_rd.ready, dut.i_wr.ready)
            assert rd + wr == 1
            order.append("rd" if rd else "wr")

    simulate(dut, bench)
    assert order == ["rd", "wr"] * 4


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(D2HReqArbiter(), "d2h_req_arbiter", tmp_path)
