# amaranth: UnusedElaboratable=no
"""EntryAllocator (hw/cxl/entry_allocator.py) in the Amaranth simulator.

Random accesses (some beyond device memory) with random idle cycles, random claims of
the flip, a bias table the bench models as the DCOH's transparent synchronous read port
(pages change bias at random), entries the bench frees at random, a sweep after reset, random
backpressure on ``o_d2h_req``. Golden model, from the contract: accesses are decided in
order, each with the bias read a cycle earlier for its own page; each allocation takes
the lowest free entry and says what for (``o_wait`` host bias, ``o_permit`` device
bias, ``o_range_error`` beyond memory, ``o_claim``), with the entry's info, page and
line; a decision or claim that can go does go, and when both can they take turns; the
D2H Reqs (RdOwn for writes, the read opcode for reads, RdOwnNoData for claims, CQID
``cqid_base`` + entry, host line ``hdm_base`` + device line) come in allocation order;
``o_writes`` follows the allocations; no access is taken while sweeping. A passive
checker holds ``o_d2h_req`` to the stream rules. Random tests print their seed;
``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.cxl.entry_allocator import ACC_REQ, ENTRY_INFO, EntryAllocator
from hw.cxl.messages import D2HReq, D2HReqOpcode

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule

CONFIGS = {
    "smallest": dict(pages=1, lines_per_page=1, entries=2, cqid_base=0,
                     read_opcode=D2HReqOpcode.RdCurr),
    "odd": dict(pages=5, lines_per_page=4, entries=4, cqid_base=8,
                read_opcode=D2HReqOpcode.RdShared),
    "mid": dict(pages=8, lines_per_page=16, entries=32, cqid_base=2048,
                read_opcode=D2HReqOpcode.RdCurr),
}
MASK46 = (1 << 46) - 1


def _run(seed: int, config: dict, *, idle: float, bp: float, cycles: int = 1500) -> dict:
    rng = random.Random(seed)
    dut = EntryAllocator(**config)
    lpp, n = config["lines_per_page"], config["entries"]
    total = config["pages"] * lpp
    hdm_base = rng.getrandbits(46)
    bias = [rng.random() < 0.5 for _ in range(config["pages"])]
    rule = StreamRule("o_d2h_req")
    stats = {"wait": 0, "permit": 0, "range": 0, "claim": 0, "contested": 0}

    def line() -> int:
        return rng.randrange(total) if rng.random() < 0.9 else total + rng.getrandbits(20)

    async def bench(ctx):
        ctx.set(dut.i_hdm_base, hdm_base)
        used: set[int] = set()
        writes = 0
        decided: deque[dict] = deque()      # taken from i_acc, not yet allocated
        reqs: deque[dict] = deque()         # D2H Reqs expected
        cur = None
        claim = None
        last_page = None                    # o_bias_page of the previous cycle
        bias_dev = 0                        # what the read port shows this cycle
        last_go = "claim"                   # after reset, an access wins a contest
        sweep_cycles = 4 + rng.randrange(3)  # one sweep, from reset on
        for t in range(cycles):
            sweeping = t < sweep_cycles
            ctx.set(dut.i_sweeping, sweeping)
            if cur is None and t < cycles - 100 and not rng.random() < idle:
                cur = {"line": line(), "write": rng.random() < 0.4, "tag": rng.getrandbits(16)}
                ctx.set(dut.i_acc.payload.as_value(), pack(ACC_REQ, cur))
            ctx.set(dut.i_acc.valid, cur is not None)
            if claim is None and t < cycles - 100 and rng.random() < 0.1:
                page = rng.randrange(config["pages"])
                claim = {"page": page, "line": page * lpp + rng.randrange(lpp)}
            ctx.set(dut.i_claim_want, claim is not None)
            if claim is not None:
                ctx.set(dut.i_claim_line, claim["line"])
                ctx.set(dut.i_claim_page, claim["page"])
            free = ((1 << n) - 1) & ~sum(1 << e for e in used)
            ctx.set(dut.i_free, free)
            ctx.set(dut.i_bias_dev, bias_dev)
            ready = not rng.random() < bp
            ctx.set(dut.o_d2h_req.ready, ready)
            *_, acc_ready, page, alloc, wait, permit, rng_err, claimed, claim_go, o_page, \
                o_line, info_en, info_addr, info, o_writes, req_valid, req = \
                await ctx.tick().sample(
                    dut.i_acc.ready, dut.o_bias_page, dut.o_alloc, dut.o_wait, dut.o_permit,
                    dut.o_range_error, dut.o_claim, dut.o_claim_go, dut.o_page, dut.o_line,
                    dut.o_info_en, dut.o_info_addr, dut.o_info.as_value(), dut.o_writes,
                    dut.o_d2h_req.valid, dut.o_d2h_req.payload.as_value())
            where = f"cycle {t}, seed {seed}"
            rule.observe(t, req_valid, ready, req)
            assert not (sweeping and acc_ready), f"access taken while sweeping ({where})"
            assert o_writes == writes, f"o_writes {o_writes:#x}, not {writes:#x} ({where})"
            if req_valid and ready:
                assert reqs and req == pack(D2HReq, reqs.popleft()), f"D2H Req ({where})"
            # Who can go, and who must.
            req_free = not req_valid or ready
            head = decided[0] if decided else None
            if head is not None:
                assert last_page == head["line"] // lpp % (1 << len(dut.o_bias_page)) \
                    or head["line"] >= total, f"bias read for another page ({where})"
                head_kind = ("range" if head["line"] >= total
                             else "permit" if bias_dev else "wait")
            access_can = bool(head and free and (head_kind != "wait" or req_free))
            claim_can = bool(claim and free and req_free)
            want = ("claim" if claim_can and (not access_can or last_go == "access")
                    else "access" if access_can else None)
            stats["contested"] += access_can and claim_can
            got = "claim" if claim_go else "access" if alloc and not claimed else None
            assert got == want, f"allocated for {got}, not {want} ({where})"
            if want:
                e = (free & -free).bit_length() - 1
                assert alloc == 1 << e and info_en and info_addr == e, f"entry ({where})"
                used.add(e)
                last_go = want
                fields = unpack(ENTRY_INFO, info)
                cqid = config["cqid_base"] + e
                if want == "claim":
                    assert (claimed, wait | permit | rng_err, o_page) == (1 << e, 0, claim["page"])
                    host = (hdm_base + claim["line"]) & MASK46
                    assert (fields["claim"], fields["host_line"]) == (1, host), where
                    reqs.append({"opcode": D2HReqOpcode.RdOwnNoData.value, "cqid": cqid,
                                 "address": host})
                    writes &= ~(1 << e)
                    claim = None
                else:
                    decided.popleft()
                    got_kind = {wait: "wait", permit: "permit", rng_err: "range"}.get(1 << e)
                    assert got_kind == head_kind and claimed == 0, f"{got_kind} ({where})"
                    page_bits = len(dut.o_page)
                    assert (o_line, o_page) == (head["line"],
                                                head["line"] // lpp % (1 << page_bits)), where
                    host = (hdm_base + head["line"]) & MASK46
                    assert fields == {"host_line": head["line"] if head_kind == "range" else host,
                                      "tag": head["tag"], "claim": 0,
                                      "host_bias": int(head_kind == "wait"),
                                      "error": int(head_kind == "range")}, f"{fields} ({where})"
                    if head_kind == "wait":
                        op = (D2HReqOpcode.RdOwn if head["write"] else config["read_opcode"])
                        reqs.append({"opcode": op.value, "cqid": cqid, "address": host})
                    writes = writes | 1 << e if head["write"] else writes & ~(1 << e)
                stats[want if want == "claim" else head_kind] += 1
            else:
                assert alloc == 0 and not claim_go, f"allocated nothing expected ({where})"
            # The edge: the taken access, freed entries, bias writes, the read port.
            if cur is not None and acc_ready:
                decided.append(cur)
                cur = None
            used -= {e for e in list(used) if rng.random() < 0.1}
            if rng.random() < 0.05:
                bias[rng.randrange(len(bias))] ^= True
            bias_dev = int(bias[page]) if page < len(bias) else 0
            last_page = page
        assert not decided and not reqs

    simulate(dut, bench)
    assert not rule.errors, rule.errors[:5]
    return stats


@pytest.mark.parametrize("traffic", ["smooth", "rough"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_random_traffic(config, traffic, seed):
    p = 0.4 if traffic == "rough" else 0.0
    stats = _run(seed, CONFIGS[config], idle=p, bp=p)
    print(stats)
    assert all(stats.values()), stats


BAD = [
    (dict(pages=0), "pages must be an integer from 1 to 16777216, not 0"),
    (dict(lines_per_page=3), "lines_per_page must be a power of two from 1 to 32768, not 3"),
    (dict(entries=1), "entries must be a power of two from 2 to 256, not 1"),
    (dict(entries=512), "entries must be a power of two from 2 to 256, not 512"),
    (dict(cqid_base=4), r"cqid_base must be a multiple of entries \(8\) from 0 to 4088, not 4"),
    (dict(cqid_base=4096), r"cqid_base must be a multiple of entries \(8\) from 0 to 4088, "
                           "not 4096"),
    (dict(read_opcode=D2HReqOpcode.RdOwn), "read_opcode must be D2HReqOpcode.RdCurr or "
                                           "D2HReqOpcode.RdShared, not"),
]


@pytest.mark.parametrize("kwargs, message", BAD)
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EntryAllocator(**{**CONFIGS["odd"], "entries": 8, **kwargs})


def test_parameters_are_read_only_properties():
    dut = EntryAllocator(**CONFIGS["odd"])
    assert (dut.pages, dut.lines_per_page, dut.entries, dut.cqid_base, dut.read_opcode) == \
        (5, 4, 4, 8, D2HReqOpcode.RdShared)
    with pytest.raises(AttributeError):
        dut.entries = 8


@pytest.mark.parametrize("config", ["smallest", "mid"])
def test_verilog_lints_clean(config, tmp_path):
    assert_lints_clean(EntryAllocator(**CONFIGS[config]), f"entry_allocator_{config}", tmp_path)
