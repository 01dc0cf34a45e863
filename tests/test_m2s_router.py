"""M2S router (hw/cxl/m2s_router.py), fast tier: Amaranth simulator.

One testbench process drives, every cycle, random M2S Req and RwD messages (random
idle), random ``ready`` on the endpoint side, the forward sink and the check port, and a
DCOH stand-in that answers each check in order after a random delay. It then samples
every handshake. The scoreboard requires, from the contract in the router's docstring:

* disabled: each channel's output sequence is its input sequence, forwards included,
  and no check is asked;
* enabled: forwards reach ``o_fwd`` in order and nowhere else; each channel's output is
  its input minus the forwards, in order; exactly the in-range MemRd / MemRdData / MemWr
  / MemWrPtl messages, and the in-range MemInv / MemInvNT that claim a copy (MetaField
  Meta0-State, MetaValue Any or Shared), are checked, with the device line
  ``line - hdm_base``, in check order; a checked message leaves only after its check's answer;
* every output stream obeys the stream rules.

Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import os
import random
from collections import deque

import pytest
from amaranth.sim import Simulator

from hw.cxl.m2s_router import M2sRouter
from hw.cxl.messages import Codec, M2SReq, M2SReqOpcode, M2SRwD, M2SRwDOpcode, MetaField, MetaValue

from .conftest import assert_lints_clean
from .stream_rule import StreamRule

REQ, RWD = Codec(M2SReq), Codec(M2SRwD)
HDM_BASE = 0x4000         # host line of device line 0
HDM_LINES = 0x100
PMEM_LINES = 0xF0          # device memory ends inside the HDM window: lines beyond it
                           # are out of range for the endpoint, so unchecked
CHECKED_REQ = {M2SReqOpcode.MemRd.value, M2SReqOpcode.MemRdData.value}
CHECKED_RWD = {M2SRwDOpcode.MemWr.value, M2SRwDOpcode.MemWrPtl.value}
#: MemInv / MemInvNT are checked when they claim a copy for the host (Cmp-E / Cmp-S).
INV = {M2SReqOpcode.MemInv.value, M2SReqOpcode.MemInvNT.value}
CLAIMS = {MetaValue.Any.value, MetaValue.Shared.value}
FWD = {M2SReqOpcode.MemRdFwd.value, M2SReqOpcode.MemWrFwd.value}


def _seed() -> int:
    return int(os.environ.get("SEED", random.randrange(1 << 31)))


def _line(rng: random.Random) -> int:
    """Mostly in range, sometimes just outside either end."""
    return rng.choice([HDM_BASE + rng.randrange(HDM_LINES), HDM_BASE - 1 - rng.randrange(4),
                       HDM_BASE + HDM_LINES + rng.randrange(4)] + [None] * 3) \
        or HDM_BASE + rng.randrange(HDM_LINES)


def _line_of(channel: str, m: dict) -> int:
    return m["address"] >> 1 if channel == "req" else m["address"]


def _checked(channel: str, m: dict) -> bool:
    """The contract: in-range MemRd / MemRdData / MemWr / MemWrPtl are checked, and
    in-range MemInv / MemInvNT with MetaField Meta0-State and MetaValue Any or Shared."""
    ops = CHECKED_REQ if channel == "req" else CHECKED_RWD
    claim = (channel == "req" and m["opcode"] in INV
             and m["meta_field"] == MetaField.Meta0State.value and m["meta_value"] in CLAIMS)
    return (m["opcode"] in ops or claim) and 0 <= _line_of(channel, m) - HDM_BASE < min(
        HDM_LINES, PMEM_LINES)


def _messages(rng: random.Random, n: int):
    req_ops = [op.value for op in M2SReqOpcode]
    rwd_ops = [op.value for op in M2SRwDOpcode]
    reqs = [{"opcode": rng.choice(req_ops + [M2SReqOpcode.MemInv.value] * 2),
             "tag": i, "address": _line(rng) << 1,
             "meta_field": rng.choice((MetaField.Meta0State.value, MetaField.NoOp.value)),
             "meta_value": rng.randrange(4)} for i in range(n)]
    rwds = [{"opcode": rng.choice(rwd_ops), "tag": i, "address": _line(rng),
             "data": rng.getrandbits(512)} for i in range(n)]
    return reqs, rwds


def _run(*, enable: bool, seed: int, n: int = 300, idle: float = 0.3, bp: float = 0.3,
         max_delay: int = 5) -> dict:
    rng = random.Random(seed)
    print(f"m2s router: enable={enable} seed {seed} (replay: SEED={seed})")
    dut = M2sRouter(pmem_lines=PMEM_LINES)
    reqs, rwds = _messages(rng, n)
    out = {"req": [], "rwd": [], "fwd": [], "chk": [], "answered": [], "check_of": {}}
    rules = {name: StreamRule(name) for name in ("req", "rwd", "fwd", "chk")}

    async def bench(ctx):
        ctx.set(dut.enable, enable)
        ctx.set(dut.hdm_base, HDM_BASE)
        ctx.set(dut.hdm_size, HDM_LINES)
        pending = deque()           # checks taken: (due cycle,)
        src = {"req": (dut.i_req, REQ, deque(reqs)), "rwd": (dut.i_rwd, RWD, deque(rwds))}
        sinks = {"req": (dut.o_req, REQ), "rwd": (dut.o_rwd, RWD), "fwd": (dut.o_fwd, REQ)}
        offered = {"req": False, "rwd": False}     # valid held until the transfer
        cycle = 0
        while cycle < 20 * n:
            for name, (port, codec, queue) in src.items():
                valid = bool(queue) and (offered[name] or rng.random() >= idle)
                offered[name] = valid
                ctx.set(port.valid, valid)
                if queue:
                    ctx.set(port.payload.as_value(), codec.pack(**queue[0]))
            for port, _ in sinks.values():
                ctx.set(port.ready, rng.random() >= bp)
            ctx.set(dut.o_chk.ready, rng.random() >= bp)
            answer = bool(pending) and pending[0] <= cycle
            ctx.set(dut.i_chk.valid, answer)
            ctx.set(dut.i_chk.payload.as_value(), 0)
            # Sample the handshakes of this cycle. A checked message's check is taken in
            # the cycle it enters, which pairs each check with its message.
            v, r, p = ctx.get(dut.o_chk.valid), ctx.get(dut.o_chk.ready), ctx.get(dut.o_chk.payload)
            rules["chk"].observe(cycle, v, r, (p,))
            chk_now = p if v and r else None
            if chk_now is not None:
                out["chk"].append((cycle, p))
                pending.append(cycle + 1 + rng.randrange(max_delay))
            paired = False
            entered = False         # a message enters at this cycle's edge
            for name, (port, _codec, queue) in src.items():
                if ctx.get(port.valid) and ctx.get(port.ready):
                    entered = True
                    m = queue.popleft()
                    offered[name] = False
                    if enable and _checked(name, m):
                        assert chk_now == _line_of(name, m) - HDM_BASE and not paired, (
                            f"cycle {cycle}: {name} tag {m['tag']} entered without its check")
                        paired = True
                        out["check_of"][(name, m["tag"])] = len(out["chk"]) - 1
            assert chk_now is None or paired, f"cycle {cycle}: a check with no message"
            for name, (port, codec) in sinks.items():
                v, r, p = ctx.get(port.valid), ctx.get(port.ready), ctx.get(port.payload.as_value())
                rules[name].observe(cycle, v, r, (p,))
                if v and r:
                    out[name].append((cycle, codec.unpack(p)))
            if answer and ctx.get(dut.i_chk.ready):
                pending.popleft()
                out["answered"].append(cycle)
            if not src["req"][2] and not src["rwd"][2] and not pending and not entered \
                    and not ctx.get(dut.o_busy):
                break
            await ctx.tick()
            cycle += 1
        assert not src["req"][2] and not src["rwd"][2], f"inputs stuck at cycle {cycle}"
        assert not ctx.get(dut.o_busy), "router still busy at the end"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    for rule in rules.values():
        assert not rule.errors, rule.errors
    out["inputs"] = (reqs, rwds)
    return out


def _strip(msg: dict, keys) -> tuple:
    return tuple(msg[k] for k in keys)


@pytest.mark.parametrize("run", range(2))
def test_disabled_is_a_wire(run):
    out = _run(enable=False, seed=_seed())
    reqs, rwds = out["inputs"]
    assert [m["tag"] for _, m in out["req"]] == [m["tag"] for m in reqs]
    assert [m["tag"] for _, m in out["rwd"]] == [m["tag"] for m in rwds]
    assert out["fwd"] == [] and out["chk"] == []


@pytest.mark.parametrize("noise", [(0.0, 0.0, 1), (0.3, 0.3, 5), (0.0, 0.6, 8)])
def test_enabled_routes_checks_and_orders(noise):
    idle, bp, delay = noise
    out = _run(enable=True, seed=_seed(), idle=idle, bp=bp, max_delay=delay)
    reqs, rwds = out["inputs"]

    # Forwards: in order, only there.
    assert [m["tag"] for _, m in out["fwd"]] == [m["tag"] for m in reqs if m["opcode"] in FWD]
    assert [m["tag"] for _, m in out["req"]] == [m["tag"] for m in reqs
                                                 if m["opcode"] not in FWD]
    assert [m["tag"] for _, m in out["rwd"]] == [m["tag"] for m in rwds]
    got_rwd = {m["tag"]: m for _, m in out["rwd"]}
    assert all(got_rwd[m["tag"]]["data"] == m["data"] for m in rwds)
    # Exactly the in-range reads and writes are checked, with their device lines.
    checked_req = [m for m in reqs if _checked("req", m)]
    checked_rwd = [m for m in rwds if _checked("rwd", m)]
    assert len(out["chk"]) == len(checked_req) + len(checked_rwd)
    assert sorted(line for _, line in out["chk"]) == sorted(
        [(m["address"] >> 1) - HDM_BASE for m in checked_req]
        + [m["address"] - HDM_BASE for m in checked_rwd])
    # A checked message leaves only after its check's answer.
    answer_times = out["answered"]
    assert len(answer_times) == len(out["chk"])
    for name in ("req", "rwd"):
        for cycle, m in out[name]:
            k = out["check_of"].get((name, m["tag"]))
            assert (k is not None) == _checked(name, m), f"{name} tag {m['tag']}"
            if k is not None:
                assert answer_times[k] < cycle, (
                    f"{name} tag {m['tag']} left at cycle {cycle} before its check's answer "
                    f"(cycle {answer_times[k]})")


def test_router_lints_clean(tmp_path):
    assert_lints_clean(M2sRouter(pmem_lines=PMEM_LINES), "tcxl_m2s_router", tmp_path)
