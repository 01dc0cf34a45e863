# amaranth: UnusedElaboratable=no
"""CacheReadPath (hw/cxl/cache_read_path.py) in the Amaranth simulator, against the
home model :class:`tb.cache_home.CacheHome` and a scoreboard written from the
docstring.

Each cycle the bench offers reads on ``i_req`` (random idle), takes ``o_req`` with
random backpressure (as the D2H Req arbiter would) and hands each RdCurr to the home,
presents the home's H2D Data (random idle; the home's latency, jitter and reordering;
Poison or GO-Err on some reads) and takes ``o_rsp`` with random backpressure. Between
the home's messages it injects bad H2D Data: CQIDs beyond the ring
(DATA_NOT_IN_FLIGHT), and second data for reads whose data was taken earlier and which
cannot have left yet, two or more behind the oldest read not delivered
(DATA_DUPLICATE). Checked: ``o_req`` is valid exactly while a read is
offered and a CQID is free, with RdCurr, the address and CQIDs 0, 1, 2, ... in turn;
``o_rsp`` returns in request order the tag, the line the home sent and the error flag
its fault calls for; every error pulse of ``o_errors``, kind and CQID, in order
(READ_ERROR for each line with ``error``); ``o_inflight`` counts
``o_cqids_in_flight``.
Passive checkers hold ``o_req`` and ``o_rsp`` to the stream rules. Seeds are printed;
``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.cxl.cache_layouts import ERR_DETAILS, ERR_REPORT, RD_RSP, CacheError
from hw.cxl.cache_read_path import CacheReadPath
from hw.cxl.messages import D2HReq, D2HReqOpcode, H2DData
from tb.cache_home import CacheHome, HomeTiming, Txn

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule

E = CacheError
KINDS = (E.DATA_NOT_IN_FLIGHT, E.DATA_DUPLICATE, E.READ_ERROR)


def _run(seed: int, cqids: int, *, idle: float, bp: float, reads: int = 250,
         bad: float = 0.3) -> dict:
    rng = random.Random(seed)
    dut = CacheReadPath(cqids=cqids)

    def faults(txn: Txn) -> set[str]:
        return {rng.choice(("poison", "go_err"))} if rng.random() < 0.2 else set()
    home = CacheHome(timing=HomeTiming(read_latency=15, jitter=15, reorder=True),
                     rng=random.Random(seed + 1), faults=faults)
    rules = {"o_req": StreamRule("o_req"), "o_rsp": StreamRule("o_rsp")}
    todo = deque((rng.getrandbits(46), rng.getrandbits(16)) for _ in range(reads))
    issued: list[tuple[int, int]] = []
    stats = {"delivered": 0, "max_inflight": 0}
    want: dict[int, list[int]] = {k: [] for k in KINDS}    # kind -> CQIDs, in order
    got: dict[int, list[int]] = {k: [] for k in KINDS}

    def issued_cqid(j: int) -> int:
        return j % cqids             # CQIDs are allocated in turn (checked on o_req)

    async def bench(ctx):
        cur = None
        offered = None
        checking = None                 # (kind, CQID) of a bad H2D Data taken last cycle
        has_data: list[int] = []        # reads (by index) whose data was taken
        cycle = quiet = 0
        while quiet < 8:
            if cur is None and todo and not rng.random() < idle:
                cur = todo.popleft()
                ctx.set(dut.i_req.payload, {"address": cur[0], "tag": cur[1]})
            ctx.set(dut.i_req.valid, cur is not None)
            ready = {"o_req": not rng.random() < bp, "o_rsp": not rng.random() < bp}
            ctx.set(dut.o_req.ready, ready["o_req"])
            ctx.set(dut.o_rsp.ready, ready["o_rsp"])
            injected = None
            if offered is None and not rng.random() < idle:
                offered = home.offer("data", cycle)
            if offered is None and rng.random() < bad:
                # A read two or more behind the oldest undelivered one cannot have left
                # the ROB (the output register holds at most one line) before the check.
                waiting = [j for j in has_data[-cqids:] if j >= stats["delivered"] + 2]
                if waiting and rng.random() < 0.7:
                    injected = (E.DATA_DUPLICATE, issued_cqid(rng.choice(waiting)))
                else:
                    injected = (E.DATA_NOT_IN_FLIGHT, rng.randrange(cqids, 1 << 12))
                fields = {"cqid": injected[1], "data": rng.getrandbits(512)}
            else:
                fields = offered
            ctx.set(dut.i_data.valid, fields is not None)
            if fields is not None:
                ctx.set(dut.i_data.payload.as_value(), pack(H2DData, fields))
            (_, _, req_valid, req, rsp_valid, rsp, in_flight, inflight, errors,
             data_ready) = await ctx.tick().sample(
                dut.o_req.valid, dut.o_req.payload.as_value(), dut.o_rsp.valid,
                dut.o_rsp.payload.as_value(), dut.o_cqids_in_flight, dut.o_inflight,
                dut.o_errors.as_value(), dut.i_data.ready)
            where = f"cycle {cycle}, seed {seed}"
            assert data_ready == 1, where
            assert inflight == bin(in_flight).count("1") <= cqids, where
            stats["max_inflight"] = max(stats["max_inflight"], inflight)
            assert req_valid == (cur is not None and inflight < cqids), where
            rules["o_req"].observe(cycle, req_valid, ready["o_req"], req)
            rules["o_rsp"].observe(cycle, rsp_valid, ready["o_rsp"], rsp)
            if checking is not None:
                want[checking[0]].append(checking[1])
                checking = None
            report = unpack(ERR_REPORT, errors)
            for kind in KINDS:
                if report["raised"] >> kind & 1:
                    details = unpack(ERR_DETAILS, report["info"] >> ERR_DETAILS.size * kind)
                    got[kind].append(details["id"])
            if req_valid and ready["o_req"]:
                f = unpack(D2HReq, req)
                assert f["opcode"] == D2HReqOpcode.RdCurr.value, where
                assert f["cqid"] == len(issued) % cqids, where
                assert (f["address"], f["nt"], f["rsvd0"], f["rsvd1"]) == (cur[0], 0, 0, 0)
                issued.append(cur)
                home.d2h("req", cycle, f)
                cur = None
            if rsp_valid and ready["o_rsp"]:
                j = stats["delivered"]
                assert j < len(issued), f"o_rsp with nothing requested ({where})"
                txn, f = home.reads[j], unpack(RD_RSP, rsp)
                assert f["tag"] == issued[j][1], f"tag out of order ({where})"
                assert f["data"] == txn.value, f"not the line sent for it ({where})"
                assert f["error"] == txn.expect_error, where
                if txn.expect_error:
                    want[E.READ_ERROR].append(txn.cqid)
                stats["delivered"] += 1
            if fields is not None:
                if injected is None:
                    home.take("data", cycle)
                    has_data.append(next(j for j in reversed(range(len(issued)))
                                         if issued_cqid(j) == offered["cqid"]))
                    offered = None
                else:
                    checking = injected
            busy = todo or cur is not None or not home.idle() or checking is not None
            busy = busy or stats["delivered"] < len(issued)
            quiet = 0 if busy else quiet + 1
            cycle += 1
            assert cycle < 100 * reads, f"hang ({where}): {home.outstanding()}"

    simulate(dut, bench)
    errors = [e for r in rules.values() for e in r.errors]
    assert not errors, "\n".join(errors[:10])
    assert stats["delivered"] == reads
    # READ_ERROR is raised as the line moves into the output register: before it leaves.
    assert got == want, f"errors raised {got}, expected {want}"
    stats["errors"] = {k: len(v) for k, v in got.items()}
    return stats


@pytest.mark.parametrize("cqids", [2, 8, 32])
@pytest.mark.parametrize("idle, bp", [(0.0, 0.0), (0.3, 0.3)], ids=["smooth", "rough"])
def test_reads_in_order(seed, cqids, idle, bp):
    stats = _run(seed, cqids, idle=idle, bp=bp)
    assert stats["errors"][E.READ_ERROR] > 10
    assert stats["errors"][E.DATA_NOT_IN_FLIGHT] + stats["errors"][E.DATA_DUPLICATE] > 5
    if cqids <= 8:
        assert stats["max_inflight"] == cqids


def test_duplicates_seen(seed):
    """Enough second H2D Data arrives while its read still waits that DATA_DUPLICATE is
    exercised (a slow sink keeps reads in the ROB)."""
    stats = _run(seed, 16, idle=0.0, bp=0.7, bad=0.3)
    assert stats["errors"][E.DATA_DUPLICATE] > 5


@pytest.mark.parametrize("cqids", [1, 3, 4096, True, 8.0])
def test_rejects_bad_cqids(cqids):
    with pytest.raises(ValueError,
                       match=f"^cqids must be a power of two from 2 to 2048, not {cqids!r}$"):
        CacheReadPath(cqids=cqids)


def test_cqids_is_a_read_only_property():
    dut = CacheReadPath(cqids=16)
    assert dut.cqids == 16
    with pytest.raises(AttributeError):
        dut.cqids = 8


@pytest.mark.parametrize("cqids", [2, 128])
def test_verilog_lints_clean(cqids, tmp_path):
    assert_lints_clean(CacheReadPath(cqids=cqids), f"cache_read_path_c{cqids}", tmp_path)
