# amaranth: UnusedElaboratable=no
"""M2SDecoder (hw/cxl/m2s_decoder.py) in the Amaranth simulator against a Python model
of its docstring.

Random M2S Req and RwD requests (every opcode, reserved ones included; lines just
inside and outside the HDM window and PMEM; random MetaField / MetaValue, Poison and
byte enables) are offered with random idle cycles while the decoded outputs see random
backpressure; HDM windows ending inside PMEM, beyond it and covering the whole space.
Every cycle the handshake must pass straight through and a valid output must carry the
request decoded as the model says. Passive checkers hold both outputs to the stream
rules. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.config import DeviceConfig, load_config
from hw.cxl.endpoint_layouts import LINE_SHIFT, MemError, request_layout
from hw.cxl.m2s_decoder import M2SDecoder
from hw.cxl.messages import (
    M2SReq,
    M2SReqOpcode,
    M2SRwD,
    M2SRwDOpcode,
    MetaField,
    MetaValue,
    NDROpcode,
)

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule

Rq, Wr = M2SReqOpcode, M2SRwDOpcode
ECHO = ("tag", "ld_id", "meta_field", "meta_value")


def ndr_for_meta(meta_field: int, meta_value: int) -> int:
    if meta_field != MetaField.Meta0State.value:
        return NDROpcode.Cmp.value
    return {MetaValue.Shared.value: NDROpcode.CmpS.value,
            MetaValue.Any.value: NDROpcode.CmpE.value}.get(meta_value, NDROpcode.Cmp.value)


def decoded(ch: str, f: dict, cfg: DeviceConfig, base: int, size: int) -> dict:
    """The decoder's contract for one request."""
    line = f["address"] >> 1 if ch == "req" else f["address"]
    offset = line - base
    in_range = 0 <= offset < min(size, cfg.pmem_lines)
    line_width = cfg.pmem_addr_width - LINE_SHIFT
    dev_line = offset % (1 << line_width)
    bucket, width = 0, cfg.hazard_bucket_width
    for k in range(0, line_width, width):
        bucket ^= dev_line >> k & ((1 << width) - 1)
    op, meta0 = f["opcode"], f["meta_field"] == MetaField.Meta0State.value
    out = {k: f[k] for k in ECHO} | dict(opcode=op, line=line, dev_line=dev_line,
                                         bucket=bucket, data=0, wstrb=0, nxm=0,
                                         meta_promote=0)
    errors = 0
    if ch == "req":
        rd, inv = op in (Rq.MemRd.value, Rq.MemRdData.value), op in (Rq.MemInv.value,
                                                                    Rq.MemInvNT.value)
        evct, rsvd = op == Rq.MemClnEvct.value, op not in {o.value for o in Rq}
        rdd = op == Rq.MemRdData.value
        errors |= ((rd or inv or evct) and not in_range) << MemError.HDM_RANGE
        errors |= rsvd << MemError.RSVD_OPCODE
        errors |= (op in (Rq.MemRdFwd.value, Rq.MemWrFwd.value)) << MemError.UNEXPECTED_FWD
        ndr = (NDROpcode.CmpE.value if rdd else
               ndr_for_meta(f["meta_field"], f["meta_value"])
               if op == Rq.MemRd.value or inv else NDROpcode.Cmp.value)
        out |= dict(to_pmem=int(rd and in_range),
                    immediate=int((rd and not in_range) or inv or evct or rsvd),
                    ndr_opcode=ndr, nxm=int(rd and not in_range), meta_promote=int(rdd),
                    meta_store=int(in_range and (rdd or (meta0 and (
                        op == Rq.MemRd.value or inv or evct)))))
    else:
        ptl = op == Wr.MemWrPtl.value
        wr = op == Wr.MemWr.value or ptl
        empty = ptl and f["byte_enable"] == 0
        to_pmem = wr and in_range and not f["poison"] and not empty
        errors |= (wr and not in_range) << MemError.HDM_RANGE
        errors |= (op not in {o.value for o in Wr}) << MemError.RSVD_OPCODE
        errors |= (wr and f["poison"]) << MemError.POISON
        errors |= empty << MemError.EMPTY_PTL
        out |= dict(to_pmem=int(to_pmem), immediate=int(not to_pmem),
                    ndr_opcode=(NDROpcode.BIConflictAck.value if op == Wr.BIConflict.value
                                else NDROpcode.Cmp.value),
                    meta_store=int(to_pmem and meta0), data=f["data"],
                    wstrb=f["byte_enable"] if ptl else (1 << 64) - 1)
    return out | {"errors": errors}


def random_request(rng: random.Random, ch: str, lines: list[int]) -> dict:
    f = dict(opcode=rng.randrange(16), tag=rng.getrandbits(16), ld_id=rng.randrange(16),
             meta_field=rng.randrange(4), meta_value=rng.randrange(4))
    line = rng.choice(lines)
    if ch == "req":
        return f | dict(address=line << 1 | rng.getrandbits(1))
    if rng.random() < 0.6:
        f["opcode"] = rng.choice([Wr.MemWr.value, Wr.MemWrPtl.value])
    return f | dict(address=line, data=rng.getrandbits(512), poison=int(rng.random() < 0.2),
                    byte_enable=rng.choice([0, (1 << 64) - 1, rng.getrandbits(64)]))


@pytest.mark.parametrize("cfg_name", ["small", "odd"])
@pytest.mark.parametrize("window", ["config", "beyond_pmem", "whole_space"])
def test_decodes_as_documented(cfg_name, window, seed):
    rng = random.Random(seed)
    cfg = load_config(cfg_name)
    dut = M2SDecoder(config=cfg)
    layout = request_layout(cfg)
    base, size = {"config": (cfg.hdm_base >> 6, cfg.hdm_size >> 6),
                  "beyond_pmem": (rng.getrandbits(20), 3 * cfg.pmem_lines),
                  "whole_space": (0, 1 << 46)}[window]
    edges = [base - 1, base, base + size - 1, base + size, base + cfg.pmem_lines - 1,
             base + cfg.pmem_lines, (1 << 46) - 1]
    lines = [x % (1 << 46) for x in edges] + [base + rng.randrange(cfg.pmem_lines)
                                              for _ in range(8)]
    checked = {"req": 0, "rwd": 0}

    async def bench(ctx):
        ctx.set(dut.hdm_base, base)
        ctx.set(dut.hdm_size, size)
        rules = {ch: StreamRule(f"o_{ch}", strict=True) for ch in checked}
        offers = {"req": None, "rwd": None}
        for cycle in range(1500):
            for ch, layout_in in (("req", M2SReq), ("rwd", M2SRwD)):
                if offers[ch] is None and rng.random() < 0.6:
                    offers[ch] = random_request(rng, ch, lines)
                port = getattr(dut, f"i_{ch}")
                ctx.set(port.valid, offers[ch] is not None)
                if offers[ch] is not None:
                    ctx.set(port.payload.as_value(), pack(layout_in, offers[ch]))
                ctx.set(getattr(dut, f"o_{ch}").ready, rng.random() < 0.7)
            for ch in checked:
                i, o = getattr(dut, f"i_{ch}"), getattr(dut, f"o_{ch}")
                valid, ready, in_ready, payload = (ctx.get(o.valid), ctx.get(o.ready),
                                                   ctx.get(i.ready), ctx.get(o.payload.as_value()))
                assert valid == (offers[ch] is not None) and in_ready == ready
                if valid:
                    got = unpack(layout, payload)
                    want = decoded(ch, offers[ch], cfg, base, size)
                    assert got == want, f"cycle {cycle} {ch}: {offers[ch]}"
                    checked[ch] += 1
                rules[ch].observe(cycle, valid, ready, payload)
                if valid and ready:
                    offers[ch] = None
            await ctx.tick()

    simulate(dut, bench)
    assert min(checked.values()) > 500


def test_rejects_non_config():
    with pytest.raises(TypeError, match=r"config must be a DeviceConfig, not 'small'"):
        M2SDecoder(config="small")


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(M2SDecoder(config=load_config("odd")), "tcxl_m2s_decoder_odd", tmp_path)
