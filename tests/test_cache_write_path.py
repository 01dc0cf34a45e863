# amaranth: UnusedElaboratable=no
"""CacheWritePath (hw/cxl/cache_write_path.py) in the Amaranth simulator, against the
home model :class:`tb.cache_home.CacheHome` and a scoreboard written from the
docstring.

Each cycle the bench offers writes on ``i_req`` (random idle), takes ``o_req`` with
random backpressure (as the D2H Req arbiter would) and hands each ItoMWr to the home,
presents the home's H2D Rsp (random idle; the home's latency, jitter and reordering,
GO_WritePull or WritePull + GO, and write faults on some requests: GO_ERR_WritePull,
GO_WritePull_Drop, GO with state Error, a second WritePull, an ExtCmp), takes
``o_data`` and ``o_rsp`` with random backpressure. ``i_read_cqids_in_flight`` is a
random vector, and between the home's messages the bench injects H2D Rsp naming read
CQIDs and CQIDs beyond both rings. Checked: ``o_req`` is valid exactly while a write is
offered and a CQID is free, with ItoMWr, the address and CQIDs ``read_cqids + 0, 1,
...`` in turn; the home gets each line bit for bit with its pull's UQID (the home
rejects any protocol violation); ``o_rsp`` returns in request order the tag and the
error flag the fault calls for, after the write's GO and data; every error pulse of
``o_errors`` with its CQID, in order, by the contract: an H2D Rsp for a read in flight,
a second GO or pull, or an opcode no write takes is RSP_UNEXPECTED, one naming nothing
in flight RSP_NOT_IN_FLIGHT, each completion with ``error`` WRITE_ERROR. Passive
checkers hold ``o_req``, ``o_data`` and ``o_rsp`` to the stream rules. Seeds are
printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.cxl.cache_layouts import ERR_DETAILS, ERR_REPORT, WR_RSP, CacheError
from hw.cxl.cache_write_path import CacheWritePath
from hw.cxl.messages import D2HData, D2HReq, D2HReqOpcode, H2DRsp, H2DRspOpcode
from tb.cache_home import ERROR_FAULTS, WRITE_FAULTS, CacheHome, HomeTiming, Txn

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule

E = CacheError
KINDS = (E.RSP_NOT_IN_FLIGHT, E.RSP_UNEXPECTED, E.WRITE_ERROR)
OP = H2DRspOpcode
GOES = {op.value for op in (OP.GO, OP.GO_WritePull, OP.GO_ERR_WritePull,
                            OP.GO_WritePull_Drop)}
PULLS = {op.value for op in (OP.WritePull, OP.GO_WritePull, OP.GO_ERR_WritePull,
                             OP.GO_WritePull_Drop)}


def _run(seed: int, read_cqids: int, write_cqids: int, *, idle: float, bp: float,
         writes: int = 200, fault_rate: float = 0.25, bad: float = 0.1) -> dict:
    rng = random.Random(seed)
    dut = CacheWritePath(read_cqids=read_cqids, write_cqids=write_cqids)
    # Every run needs > 10 WRITE_ERROR and > 3 RSP_UNEXPECTED (from a second pull or an
    # ExtCmp): for about 1 seed in 100,000 the faults fall short, so once the writes left
    # are just enough, each draws on (same seed) until it has a fault of a kind still short.
    short = {frozenset(ERROR_FAULTS & set(WRITE_FAULTS)): 11,
             frozenset({"dup_pull", "ext_cmp"}): 4}
    left = [writes]

    def draw() -> set[str]:
        return {rng.choice(WRITE_FAULTS)} if rng.random() < fault_rate else set()

    def faults(txn: Txn) -> set[str]:
        got = draw()
        while sum(short.values()) >= left[0] and not any(got & k for k, n in short.items() if n):
            got = draw()
        for k in short:
            short[k] -= bool(short[k] and got & k)
        left[0] -= 1
        return got
    home = CacheHome(timing=HomeTiming(write_latency=10, jitter=10, reorder=True,
                                       split_writes=0.5),
                     rng=random.Random(seed + 1), faults=faults)
    streams = {"o_req": dut.o_req, "o_data": dut.o_data, "o_rsp": dut.o_rsp}
    rules = {name: StreamRule(name) for name in streams}
    todo = deque((rng.getrandbits(46), rng.getrandbits(512), rng.getrandbits(16))
                 for _ in range(writes))
    reads_in_flight = rng.getrandbits(read_cqids)
    issued: list[tuple[int, int, int]] = []
    seen: dict[int, set[str]] = {}      # write CQID -> "go" / "pull" of its latest write
    stats = {"completed": 0, "max_inflight": 0}
    want: dict[int, list[int]] = {k: [] for k in KINDS}    # kind -> CQIDs, in order
    got: dict[int, list[int]] = {k: [] for k in KINDS}

    def judge(f: dict) -> int | None:
        """The error kind the contract gives H2D Rsp ``f`` (None: accepted)."""
        cqid, op = f["cqid"], f["opcode"]
        if cqid < read_cqids:
            return E.RSP_UNEXPECTED if reads_in_flight >> cqid & 1 else E.RSP_NOT_IN_FLIGHT
        if cqid not in seen:
            return E.RSP_NOT_IN_FLIGHT
        kinds = {"go"} if op in GOES else set()
        kinds |= {"pull"} if op in PULLS else set()
        if not kinds or kinds & seen[cqid]:
            return E.RSP_UNEXPECTED
        seen[cqid] |= kinds
        return None

    async def bench(ctx):
        cur = None
        offered = None
        checking = None                 # the H2D Rsp taken last cycle
        cycle = quiet = 0
        ctx.set(dut.i_read_cqids_in_flight, reads_in_flight)
        while quiet < 8:
            if cur is None and todo and not rng.random() < idle:
                cur = todo.popleft()
                ctx.set(dut.i_req.payload, {"address": cur[0], "data": cur[1], "tag": cur[2]})
            ctx.set(dut.i_req.valid, cur is not None)
            ready = {name: not rng.random() < bp for name in streams}
            for name, port in streams.items():
                ctx.set(port.ready, ready[name])
            injected = False
            if offered is None and not rng.random() < idle:
                offered = home.offer("rsp", cycle)
            fields = offered
            if offered is None and rng.random() < bad:
                injected = True
                cqid = rng.choice([rng.randrange(read_cqids),
                                   rng.randrange(read_cqids + write_cqids, 1 << 12)])
                fields = {"opcode": rng.choice(list(OP)).value, "cqid": cqid,
                          "rsp_data": rng.getrandbits(12)}
            ctx.set(dut.i_rsp.valid, fields is not None)
            if fields is not None:
                ctx.set(dut.i_rsp.payload.as_value(), pack(H2DRsp, fields))
            _, _, rsp_ready, inflight, errors, *out = await ctx.tick().sample(
                dut.i_rsp.ready, dut.o_inflight, dut.o_errors.as_value(),
                *(x for p in streams.values() for x in (p.valid, p.payload.as_value())))
            valid = {name: out[2 * i] for i, name in enumerate(streams)}
            payload = {name: out[2 * i + 1] for i, name in enumerate(streams)}
            where = f"cycle {cycle}, seed {seed}"
            assert rsp_ready == 1, where
            assert inflight <= write_cqids, where
            stats["max_inflight"] = max(stats["max_inflight"], inflight)
            assert valid["o_req"] == (cur is not None and inflight < write_cqids), where
            for name in streams:
                rules[name].observe(cycle, valid[name], ready[name], payload[name])
            if checking is not None:
                kind = judge(checking)
                if kind is not None:
                    want[kind].append(checking["cqid"])
                checking = None
            report = unpack(ERR_REPORT, errors)
            for kind in KINDS:
                if report["raised"] >> kind & 1:
                    details = unpack(ERR_DETAILS, report["info"] >> ERR_DETAILS.size * kind)
                    got[kind].append(details["id"])
            if valid["o_req"] and ready["o_req"]:
                f = unpack(D2HReq, payload["o_req"])
                assert f["opcode"] == D2HReqOpcode.ItoMWr.value, where
                assert f["cqid"] == read_cqids + len(issued) % write_cqids, where
                assert f["address"] == cur[0], where
                issued.append(cur)
                seen[f["cqid"]] = set()
                home.d2h("req", cycle, f)
                cur = None
            if valid["o_data"] and ready["o_data"]:
                home.d2h("data", cycle, unpack(D2HData, payload["o_data"]))
            if valid["o_rsp"] and ready["o_rsp"]:
                j = stats["completed"]
                assert j < len(issued), f"o_rsp with nothing requested ({where})"
                txn, f = home.writes[j], unpack(WR_RSP, payload["o_rsp"])
                assert f["tag"] == issued[j][2], f"tag out of order ({where})"
                assert f["error"] == txn.expect_error, f"{where}: faults {txn.faults}"
                assert txn.t_go is not None and txn.t_go < cycle, f"before its GO ({where})"
                if "drop" not in txn.faults:
                    assert txn.t_data is not None and txn.t_data < cycle, where
                    assert txn.value == issued[j][1], f"the home got other data ({where})"
                if txn.expect_error:
                    want[E.WRITE_ERROR].append(txn.cqid)
                stats["completed"] += 1
            if fields is not None:
                checking = fields
                if not injected:
                    home.take("rsp", cycle)
                    offered = None
            busy = todo or cur is not None or not home.idle() or checking is not None
            busy = busy or stats["completed"] < len(issued)
            quiet = 0 if busy else quiet + 1
            cycle += 1
            assert cycle < 100 * writes, f"hang ({where}): {home.outstanding()}"

    simulate(dut, bench)
    errors = [e for r in rules.values() for e in r.errors]
    assert not errors, "\n".join(errors[:10])
    assert stats["completed"] == writes
    assert got == want, f"errors raised {got}, expected {want}"
    stats["errors"] = {k: len(v) for k, v in got.items()}
    return stats


@pytest.mark.parametrize("read_cqids, write_cqids", [(2, 2), (8, 4), (32, 8)])
@pytest.mark.parametrize("idle, bp", [(0.0, 0.0), (0.3, 0.3)], ids=["smooth", "rough"])
def test_writes_in_order(seed, read_cqids, write_cqids, idle, bp):
    stats = _run(seed, read_cqids, write_cqids, idle=idle, bp=bp)
    assert stats["errors"][E.WRITE_ERROR] > 10
    assert stats["errors"][E.RSP_UNEXPECTED] > 3
    assert stats["max_inflight"] == write_cqids


@pytest.mark.parametrize("kwargs, message", [
    ({"read_cqids": 1, "write_cqids": 2},
     "read_cqids must be a power of two from 2 to 2048, not 1"),
    ({"read_cqids": 4096, "write_cqids": 2},
     "read_cqids must be a power of two from 2 to 2048, not 4096"),
    ({"read_cqids": 64.0, "write_cqids": 2},
     "read_cqids must be a power of two from 2 to 2048, not 64.0"),
    ({"read_cqids": 8, "write_cqids": 16},
     r"write_cqids must be a power of two from 2 to read_cqids \(8\), not 16"),
    ({"read_cqids": 8, "write_cqids": 3},
     r"write_cqids must be a power of two from 2 to read_cqids \(8\), not 3"),
    ({"read_cqids": 8, "write_cqids": True},
     r"write_cqids must be a power of two from 2 to read_cqids \(8\), not True"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        CacheWritePath(**kwargs)


def test_parameters_are_read_only_properties():
    dut = CacheWritePath(read_cqids=32, write_cqids=8)
    assert (dut.read_cqids, dut.write_cqids) == (32, 8)
    with pytest.raises(AttributeError):
        dut.write_cqids = 4


@pytest.mark.parametrize("read_cqids, write_cqids", [(2, 2), (128, 16)])
def test_verilog_lints_clean(read_cqids, write_cqids, tmp_path):
    assert_lints_clean(CacheWritePath(read_cqids=read_cqids, write_cqids=write_cqids),
                       f"cache_write_path_r{read_cqids}_w{write_cqids}", tmp_path)
