# amaranth: UnusedElaboratable=no
"""EndpointCompletion (hw/cxl/endpoint_completion.py) in the Amaranth simulator against
a Python model of its docstring.

The bench issues requests on free slots with random context, later returns their R or
B beats (random order, random RRESP / BRESP, random idle cycles) and offers random
immediate entries (some MemData-NXM), while ``o_ndr`` / ``o_drs`` see random
backpressure (or none, where the two-cycle latency is checked) and DevLoad changes
every cycle. Checked: S0 takes one source per cycle, the first offered one after the
last taken in the order R, B, immediate (B first after reset); the NDR and DRS
messages, in S0's order, are the model's for what was taken, with the DevLoad of the
cycle the register loaded; ``o_release`` names the slot of a taken beat in that cycle,
``o_retire`` its bucket and kind and ``o_pmem_error`` a failed response's channel,
opcode and line in the next. Passive checkers hold ``o_ndr`` and ``o_drs`` to the
stream rules. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.bus.axi import AxiResp
from hw.config import DeviceConfig, load_config
from hw.cxl.endpoint_completion import EndpointCompletion
from hw.cxl.endpoint_layouts import ErrorChannel, ImmEntry, issue_layout
from hw.cxl.messages import S2MDRS, S2MNDR, DRSOpcode

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .flat_ports import FlatPorts
from .payload import pack, unpack
from .stream_rule import StreamRule

ECHO = ("tag", "ld_id", "meta_field", "meta_value")
SOURCES = ("r", "b", "imm")


def random_context(rng: random.Random, cfg: DeviceConfig) -> dict:
    entry = issue_layout(cfg)["entry"].shape
    return {name: rng.getrandbits(field.width) for name, field in entry}


def responses(source: str, beat: dict, ctx: dict | None) -> tuple[dict | None, dict | None]:
    """``(NDR, DRS)`` for one taken beat (without DevLoad)."""
    if source == "imm":
        echo = {k: beat[k] for k in ECHO}
        if beat["nxm"]:
            return None, echo | dict(opcode=DRSOpcode.MemDataNXM.value, poison=1, rsvd=0,
                                     data=(1 << 512) - 1)
        return echo | dict(opcode=beat["ndr_opcode"]), None
    echo = {k: ctx[k] for k in ECHO}
    ndr = echo | dict(opcode=ctx["ndr_opcode"])
    if source == "b":
        return ndr, None
    return ndr, echo | dict(opcode=DRSOpcode.MemData.value, rsvd=0, data=beat["data"],
                            poison=int(beat["resp"] != AxiResp.OKAY))


@pytest.mark.parametrize("cfg_name", ["small", "odd"])
@pytest.mark.parametrize("backpressure", [False, True], ids=["free", "backpressure"])
def test_completes_as_documented(cfg_name, backpressure, seed):
    rng = random.Random(seed)
    cfg = load_config(cfg_name)
    dut = EndpointCompletion(config=cfg)
    stats = {"ndr": 0, "drs": 0, "errors": 0}

    async def bench(ctx):
        rules = {"ndr": StreamRule("o_ndr", strict=True), "drs": StreamRule("o_drs", strict=True)}
        free = {s: -10 for s in range(cfg.max_tags)}        # slot -> cycle released
        issued: dict[int, tuple[int, str, dict]] = {}       # slot -> (cycle, kind, context)
        offers = dict.fromkeys(SOURCES)
        want = {"ndr": deque(), "drs": deque()}
        last = "r"                                          # B has priority after reset
        prev = {"ndr": (0, 0), "drs": (0, 0)}               # (valid, transferred) last cycle
        dev_load_prev = 0
        next_cycle_checks: list = []
        for cycle in range(3000):
            # Offers: issue a slot, present beats of issued slots, immediate entries.
            slot = rng.choice([s for s, t in free.items() if t <= cycle - 2] or [None])
            issue = slot is not None and rng.random() < 0.4
            new_context = random_context(rng, cfg)
            ctx.set(dut.i_issue.valid, issue)
            ctx.set(dut.i_issue.payload, {"slot": slot or 0, "entry": new_context})
            for kind in ("r", "b"):
                due = [s for s, (t, k, _) in issued.items() if k == kind and t <= cycle - 2
                       and all(offers[n] is None or offers[n]["id"] != s for n in ("r", "b"))]
                if offers[kind] is None and due and rng.random() < 0.5:
                    offers[kind] = {"id": rng.choice(due), "data": rng.getrandbits(512),
                                    "resp": rng.choice([AxiResp.OKAY] * 3 + [AxiResp.SLVERR])}
            if offers["imm"] is None and rng.random() < 0.3:
                offers["imm"] = {name: rng.getrandbits(f.width) for name, f in ImmEntry}
            for name in SOURCES:
                port = getattr(dut, f"i_{name}")
                ctx.set(port.valid, offers[name] is not None)
                if offers[name] is not None:
                    ctx.set(port.payload.as_value(), pack(port.p.shape(), offers[name]))
            dev_load = rng.randrange(4)
            ctx.set(dut.i_dev_load, dev_load)
            readiness = {n: rng.random() < (0.5 if backpressure else 1.0) for n in want}
            ctx.set(dut.o_ndr.ready, readiness["ndr"])
            ctx.set(dut.o_drs.ready, readiness["drs"])

            # What the DUT does in this cycle.
            assert ctx.get(dut.o_retire.valid) == bool(next_cycle_checks), f"cycle {cycle}"
            assert ctx.get(dut.o_pmem_error.valid) <= bool(next_cycle_checks)
            for check in next_cycle_checks:
                check()
            next_cycle_checks = []
            taken = [n for n in SOURCES if ctx.get(getattr(dut, f"i_{n}").ready)
                     and offers[n] is not None]
            assert len(taken) <= 1, f"cycle {cycle}: S0 took {taken}"
            release = (ctx.get(dut.o_release.valid), ctx.get(dut.o_release.payload))
            if taken:
                source = taken[0]
                order = SOURCES[SOURCES.index(last) + 1:] + SOURCES[:SOURCES.index(last) + 1]
                first = next(n for n in order if offers[n] is not None)
                assert source == first, f"cycle {cycle}: took {source}, round robin says {first}"
                last, beat = source, offers[source]
                offers[source] = None
                context = issued.pop(beat["id"])[2] if source != "imm" else None
                ndr, drs = responses(source, beat, context)
                for name, message in (("ndr", ndr), ("drs", drs)):
                    if message is not None:
                        want[name].append((cycle, message))
                if source != "imm":
                    assert release == (1, beat["id"]), f"cycle {cycle}"
                    free[beat["id"]] = cycle

                    def retired(source=source, beat=beat, context=context, cycle=cycle):
                        got = unpack(dut.o_retire.p.shape(),
                                     ctx.get(dut.o_retire.payload.as_value()))
                        assert got == {"bucket": context["bucket"], "write": source == "b"}
                        failed = beat["resp"] != AxiResp.OKAY
                        assert ctx.get(dut.o_pmem_error.valid) == failed
                        if failed:
                            stats["errors"] += 1
                            channel = ErrorChannel.PMEM_R if source == "r" else ErrorChannel.PMEM_B
                            assert unpack(dut.o_pmem_error.p.shape(),
                                          ctx.get(dut.o_pmem_error.payload.as_value())) == {
                                "channel": channel, "opcode": context["opcode"],
                                "address": context["dev_line"]}
                    next_cycle_checks.append(retired)
            if not (taken and taken[0] != "imm"):
                assert not release[0], f"cycle {cycle}: release without a beat"
            if issue:
                del free[slot]
                issued[slot] = (cycle, rng.choice("rb"), new_context)

            # Outputs: a new message is the model's next, with last cycle's DevLoad.
            for name, layout in (("ndr", S2MNDR), ("drs", S2MDRS)):
                port = getattr(dut, f"o_{name}")
                valid, payload = ctx.get(port.valid), ctx.get(port.payload.as_value())
                rules[name].observe(cycle, valid, readiness[name], payload)
                if valid and (not prev[name][0] or prev[name][1]):
                    got = unpack(layout, payload)
                    t_taken, message = want[name].popleft()
                    assert got == message | {"dev_load": dev_load_prev}, f"{name} cycle {cycle}"
                    if not backpressure:
                        assert cycle == t_taken + 2, f"{name}: taken {t_taken}, valid {cycle}"
                    stats[name] += 1
                prev[name] = (valid, valid and readiness[name])
            dev_load_prev = dev_load
            await ctx.tick()
        assert len(want["ndr"]) + len(want["drs"]) <= 4

    simulate(dut, bench)
    assert stats["ndr"] > 300 and stats["drs"] > 150 and stats["errors"] > 10


def test_rejects_non_config():
    with pytest.raises(TypeError, match=r"config must be a DeviceConfig, not 4"):
        EndpointCompletion(config=4)


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(FlatPorts(EndpointCompletion(config=load_config("small"))),
                       "tcxl_endpoint_completion_small", tmp_path)
