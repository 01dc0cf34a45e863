# amaranth: UnusedElaboratable=no
"""EndpointAdmission (hw/cxl/endpoint_admission.py) in the Amaranth simulator against a
Python model of its docstring.

Random decoded requests (PMEM reads and writes, immediate ones, MemData-NXM, ones that
get no answer; random errors, NDR opcodes, meta actions, a few lines and buckets so
that they collide) are offered on both channels with random idle cycles; free slots
come and go, the ordering table's busy buckets are random, and ``o_ar``, ``o_aw``,
``o_w`` and ``o_imm`` see random backpressure. Every cycle the model says which channel
may be accepted (round robin, Req first after reset) and the bench checks the
handshakes, the slot taken, ``o_issue``, ``o_order`` and ``o_error`` in that cycle,
the AR / AW / W registers from the next, the immediate entries in order on ``o_imm``
(and no later than three cycles after they could move), ``o_busy``, and with
``meta_state`` the Meta0-State returned and stored. Passive checkers hold ``o_ar``,
``o_aw``, ``o_w`` and ``o_imm`` to the stream rules. Seeds are printed; ``SEED=<n>``
replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.config import DeviceConfig, load_config
from hw.cxl.endpoint_admission import EndpointAdmission
from hw.cxl.endpoint_layouts import (
    IMM_FIFO_DEPTH,
    ErrorChannel,
    ErrorInfo,
    ImmEntry,
    M2SError,
    request_layout,
)
from hw.cxl.messages import MetaValue

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .flat_ports import FlatPorts
from .payload import pack, unpack
from .stream_rule import StreamRule

ECHO = ("tag", "ld_id", "meta_field", "meta_value")


def random_request(rng: random.Random, cfg: DeviceConfig, ch: str, lines: list[int]) -> dict:
    """A decoded request as :class:`~hw.cxl.m2s_decoder.M2SDecoder` can make it."""
    layout = request_layout(cfg)
    f = {name: rng.getrandbits(field.width) for name, field in layout}
    kind = rng.choice(["pmem", "pmem", "imm", "none"] if ch == "req" else ["pmem", "imm"])
    f.update(to_pmem=int(kind == "pmem"), immediate=int(kind == "imm"),
             dev_line=rng.choice(lines), bucket=rng.randrange(min(4, cfg.hazard_buckets)),
             errors=rng.getrandbits(6) if rng.random() < 0.2 else 0,
             nxm=int(ch == "req" and kind == "imm" and rng.random() < 0.3),
             meta_promote=int(ch == "req" and rng.random() < 0.3))
    if ch == "req":
        f.update(data=0, wstrb=0)
    return f


def may_accept(ch: str, *, offers: dict, busy: dict, regs: dict, ready: dict,
               slot_offered: bool, imm_count: int) -> bool | None:
    """Whether channel ``ch``'s offer can be accepted in this cycle (``None``: the model
    cannot tell, the FIFO's room with one entry left depends on where its entries are)."""
    f = offers[ch]
    if f is None:
        return False
    if f["to_pmem"]:
        if ch == "req":
            waiting = offers["rwd"] is not None and offers["rwd"]["to_pmem"]
            order_ok = not (busy["write"] >> f["bucket"] & 1) and not (
                waiting and offers["rwd"]["bucket"] == f["bucket"])
            free = regs["ar"] is None or ready["ar"]
        else:
            order_ok = not ((busy["read"] | busy["write"]) >> f["bucket"] & 1)
            free = (regs["aw"] is None or ready["aw"]) and (regs["w"] is None or ready["w"])
        return slot_offered and order_ok and free
    if not f["immediate"]:
        return True
    return None if imm_count == IMM_FIFO_DEPTH - 1 else imm_count < IMM_FIFO_DEPTH


@pytest.mark.parametrize("cfg_name, meta_state", [("small", 1), ("small", 0), ("odd", 1)])
def test_accepts_as_documented(cfg_name, meta_state, seed):
    rng = random.Random(seed)
    cfg = load_config(cfg_name).replace(meta_state=meta_state)
    dut = EndpointAdmission(config=cfg)
    layout = request_layout(cfg)
    lines = rng.sample(range(cfg.pmem_lines), 4)
    stats = {"req": 0, "rwd": 0, "imm": 0, "full": 0}

    async def bench(ctx):
        rules = {n: StreamRule(f"o_{n}", strict=True) for n in ("ar", "aw", "w", "imm")}
        offers = {"req": None, "rwd": None}
        slot_offer = None
        regs = {"ar": None, "aw": None, "w": None}     # the registers' model
        imm_fifo: deque[tuple[int, dict]] = deque()    # (cycle written, entry)
        imm_free_since = 0
        meta = dict.fromkeys(range(cfg.pmem_lines), MetaValue.Any.value)
        prefer_rwd = False
        for cycle in range(3000):
            for ch in offers:
                if offers[ch] is None and rng.random() < 0.6:
                    offers[ch] = random_request(rng, cfg, ch, lines)
                port = getattr(dut, f"i_{ch}")
                ctx.set(port.valid, offers[ch] is not None)
                if offers[ch] is not None:
                    ctx.set(port.payload.as_value(), pack(layout, offers[ch]))
            if slot_offer is None and rng.random() < 0.5:
                slot_offer = rng.randrange(cfg.max_tags)
            ctx.set(dut.i_slot.valid, slot_offer is not None)
            ctx.set(dut.i_slot.payload, slot_offer or 0)
            busy = {k: rng.getrandbits(cfg.hazard_buckets) & rng.getrandbits(cfg.hazard_buckets)
                    for k in ("read", "write")}
            ctx.set(dut.i_read_busy, busy["read"])
            ctx.set(dut.i_write_busy, busy["write"])
            ready = {n: rng.random() < 0.6 for n in ("ar", "aw", "w", "imm")}
            for name, r in ready.items():
                ctx.set(getattr(dut, f"o_{name}").ready, r)

            # Registers and the FIFO as the model has them.
            for name in ("ar", "aw", "w"):
                port = getattr(dut, f"o_{name}")
                valid, payload = ctx.get(port.valid), ctx.get(port.payload.as_value())
                assert valid == (regs[name] is not None), f"cycle {cycle}: o_{name}.valid"
                if valid:
                    assert unpack(port.p.shape(), payload) == regs[name], f"cycle {cycle} {name}"
                rules[name].observe(cycle, valid, ready[name], payload)
            imm_valid = ctx.get(dut.o_imm.valid)
            imm_payload = ctx.get(dut.o_imm.payload.as_value())
            if imm_valid:
                assert unpack(ImmEntry, imm_payload) == imm_fifo[0][1], f"cycle {cycle}"
            elif imm_fifo:
                assert cycle - max(imm_fifo[0][0], imm_free_since) < 3, f"cycle {cycle}: o_imm late"
            assert ctx.get(dut.o_busy) == bool(imm_fifo)
            rules["imm"].observe(cycle, imm_valid, ready["imm"], imm_payload)

            # Which channel the model lets go.
            state = dict(offers=offers, busy=busy, regs=regs, ready=ready,
                         slot_offered=slot_offer is not None, imm_count=len(imm_fifo))
            go = {ch: may_accept(ch, **state) for ch in offers}
            took = {ch: bool(ctx.get(getattr(dut, f"i_{ch}").ready)) for ch in offers}
            assert not all(took.values()), f"cycle {cycle}: two handshakes"
            for ch, other, first in (("req", "rwd", not prefer_rwd), ("rwd", "req", prefer_rwd)):
                if go[ch] is not None and go[other] is not None:
                    assert took[ch] == (go[ch] and (not go[other] or first)), f"cycle {cycle} {ch}"
                elif took[ch]:
                    assert go[ch] is not False
            ch = "rwd" if took["rwd"] else "req" if took["req"] else None
            f = offers[ch] if ch else None
            pmem = bool(f and f["to_pmem"])
            assert ctx.get(dut.i_slot.ready) == pmem and ctx.get(dut.o_issue.valid) == pmem
            assert ctx.get(dut.o_order.valid) == pmem
            errors = bool(f and f["errors"])
            assert ctx.get(dut.o_error.valid) == errors
            if f:
                stats[ch] += 1
                echo = {k: f[k] for k in ECHO}
                if cfg.meta_state and f["meta_store"]:
                    old = meta[f["dev_line"]]
                    echo["meta_value"] = old
                    if f["meta_promote"]:
                        meta[f["dev_line"]] = MetaValue.Any.value if old == 0 else old
                    else:
                        meta[f["dev_line"]] = f["meta_value"]
                if errors:
                    channel = ErrorChannel.M2S_RWD if ch == "rwd" else ErrorChannel.M2S_REQ
                    info = pack(ErrorInfo, channel=channel, opcode=f["opcode"], address=f["line"])
                    assert unpack(M2SError, ctx.get(dut.o_error.payload.as_value())) == {
                        "errors": f["errors"], "info": info}, f"cycle {cycle}"
                if pmem:
                    issue = unpack(dut.o_issue.p.shape(), ctx.get(dut.o_issue.payload.as_value()))
                    entry = echo | {k: f[k] for k in ("ndr_opcode", "opcode", "bucket", "dev_line")}
                    assert issue == {"slot": slot_offer,
                                     "entry": pack(dut.o_issue.p.shape()["entry"].shape, entry)}
                    order = unpack(dut.o_order.p.shape(), ctx.get(dut.o_order.payload.as_value()))
                    assert order == {"bucket": f["bucket"], "write": int(ch == "rwd")}
                elif f["immediate"]:
                    imm_fifo.append((cycle, echo | {"ndr_opcode": f["ndr_opcode"],
                                                    "nxm": f["nxm"]}))
                    stats["imm"] += 1
                    stats["full"] += len(imm_fifo) == IMM_FIFO_DEPTH
                offers[ch] = None
                prefer_rwd = ch == "req"

            # The registers at the clock edge.
            for name in ("ar", "aw", "w"):
                if regs[name] is not None and ready[name]:
                    regs[name] = None
            if pmem and ch == "req":
                regs["ar"] = {"id": slot_offer, "line": f["dev_line"]}
            elif pmem:
                regs["aw"] = {"id": slot_offer, "line": f["dev_line"]}
                regs["w"] = {"data": f["data"], "strb": f["wstrb"]}
            if pmem:
                slot_offer = None
            if imm_valid and ready["imm"]:
                imm_fifo.popleft()
                imm_free_since = cycle + 1
            await ctx.tick()

    simulate(dut, bench)
    assert min(stats["req"], stats["rwd"]) > 400 and stats["imm"] > 100 and stats["full"] > 0


def test_rejects_non_config():
    with pytest.raises(TypeError, match=r"config must be a DeviceConfig, not None"):
        EndpointAdmission(config=None)


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(FlatPorts(EndpointAdmission(config=load_config("small"))),
                       "tcxl_endpoint_admission_small", tmp_path)
