# amaranth: UnusedElaboratable=no
"""CacheReadMux (hw/cxl/cache_read_mux.py) in the Amaranth simulator against a model of
its docstring.

Each user offers read requests (random line, random tag with its top ``port_bits``
zero) with random idle cycles and takes its responses with random ``ready``; ``o_rd``
has random backpressure and feeds an in-order model of the CXL.cache agent that answers
each request after a random latency (random idle cycles, some lines with ``error``),
echoing the tag, with data a fixed function of the line. With a number of users that is
not a power of two the agent also slips in responses whose port bits name no user.
Checked every cycle against the model: each ``i_req{k}.ready`` (round robin: the first
valid input at or after the one after the last taken, input 0 first after reset, and
only while the output register is empty or being taken); ``o_rd`` valid exactly while
the register holds a request, showing it with the port number in its top tag bits;
each ``o_rsp{k}`` valid exactly for a response naming ``k``, with the data, error and
the tag's top bits cleared; ``i_rd.ready`` the addressed user's ``ready``, or 1 for a
response naming no user. At the end each user got exactly its own responses, in its
request order, with its original tags. Passive checkers hold ``o_rd`` and every
``o_rsp{k}`` to the stream rules. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.cxl.cache_layouts import RD_REQ, RD_RSP, TAG_BITS
from hw.cxl.cache_read_mux import CacheReadMux

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule
from .stream_source import Source


def line_data(line: int) -> int:
    """Host memory's content: a fixed function of the line address."""
    return random.Random(line).getrandbits(512)


def _run(seed: int, ports: int, *, idle: float, bp: float, reads: int = 120,
         latency: int = 8, bad: float = 0.0) -> dict:
    rng = random.Random(seed)
    dut = CacheReadMux(ports=ports)
    low = TAG_BITS - dut.port_bits
    reqs = [getattr(dut, f"i_req{k}") for k in range(ports)]
    rsps = [getattr(dut, f"o_rsp{k}") for k in range(ports)]
    o_rd, i_rd = dut.o_rd, dut.i_rd
    rules = {"o_rd": StreamRule("o_rd"), **{f"o_rsp{k}": StreamRule(f"o_rsp{k}")
                                            for k in range(ports)}}
    sent: list[list[dict]] = [[] for _ in range(ports)]    # RD_REQ fields
    expect: list[list[tuple[int, int, int]]] = [[] for _ in range(ports)]
    got: list[list[tuple[int, int, int]]] = [[] for _ in range(ports)]
    stats = {"grants": [], "rd_cycles": [], "rsp_cycles": [], "dropped": 0, "errors": 0}

    async def bench(ctx):
        srcs = [Source(req, rng, idle) for req in reqs]
        for src in srcs:
            src.items.extend({"address": rng.getrandbits(46), "tag": rng.getrandbits(low)}
                             for _ in range(reads))
        held = None                     # the model's o_rd register: (user, request)
        nxt = 0                         # the first input the round robin considers
        agent: deque[list] = deque()    # [ready cycle, response] in request order
        cur = None                      # the response offered on i_rd
        cycle = 0
        while any(not s.empty for s in srcs) or held or agent or cur is not None:
            assert cycle < 100 * reads, "hang"
            for src in srcs:
                src.drive(ctx)
            out_ready = not rng.random() < bp
            ctx.set(o_rd.ready, out_ready)
            user_ready = [not rng.random() < bp for _ in range(ports)]
            for rsp, ready in zip(rsps, user_ready, strict=True):
                ctx.set(rsp.ready, ready)
            if cur is None:
                if rng.random() < bad:  # names no user
                    port = rng.randrange(ports, 1 << dut.port_bits)
                    cur = pack(RD_RSP, data=rng.getrandbits(512),
                               tag=port << low | rng.getrandbits(low),
                               error=rng.getrandbits(1))
                elif agent and agent[0][0] <= cycle and not rng.random() < idle:
                    cur = agent.popleft()[1]
                if cur is not None:
                    ctx.set(i_rd.payload.as_value(), cur)
            ctx.set(i_rd.valid, cur is not None)
            sampled = await ctx.tick().sample(
                o_rd.valid, o_rd.payload.as_value(), i_rd.ready,
                *(r.ready for r in reqs), *(r.valid for r in rsps),
                *(r.payload.as_value() for r in rsps))
            rd_valid, rd_payload, rd_ready = sampled[2:5]
            req_ready = sampled[5:5 + ports]
            rsp_valid = sampled[5 + ports:5 + 2 * ports]
            rsp_payload = sampled[5 + 2 * ports:]
            where = f"cycle {cycle}, seed {seed}"

            # --- requests
            rules["o_rd"].observe(cycle, rd_valid, out_ready, rd_payload)
            assert rd_valid == (held is not None), f"o_rd.valid {rd_valid} ({where})"
            if held is not None:
                k, req = held
                want = pack(RD_REQ, address=req["address"], tag=k << low | req["tag"])
                assert rd_payload == want, (
                    f"o_rd {unpack(RD_REQ, rd_payload)}, not {unpack(RD_REQ, want)} "
                    f"from user {k} ({where})")
            free = held is None or out_ready
            order = [(nxt + i) % ports for i in range(ports)]
            chosen = next((k for k in order if srcs[k].current is not None), None)
            want_ready = [int(free and k == chosen) for k in range(ports)]
            assert list(req_ready) == want_ready, (
                f"i_req ready {list(req_ready)}, not {want_ready} (valid "
                f"{[int(s.current is not None) for s in srcs]}, next {nxt}, o_rd free "
                f"{free}; {where})")
            if rd_valid and out_ready:
                k, req = held
                error = int(rng.random() < 0.1)
                expect[k].append((line_data(req["address"]), req["tag"], error))
                agent.append([cycle + rng.randint(1, latency),
                              pack(RD_RSP, data=line_data(req["address"]),
                                   tag=unpack(RD_REQ, rd_payload)["tag"], error=error)])
                stats["rd_cycles"].append(cycle)
                held = None
            for k, src in enumerate(srcs):
                req = src.current
                if src.took(req_ready[k]):
                    held, nxt = (k, req), (k + 1) % ports
                    sent[k].append(req)
                    stats["grants"].append((cycle, k))

            # --- responses
            for k in range(ports):
                rules[f"o_rsp{k}"].observe(cycle, rsp_valid[k], user_ready[k],
                                           rsp_payload[k])
            port = None if cur is None else unpack(RD_RSP, cur)["tag"] >> low
            assert list(rsp_valid) == [int(port == k) for k in range(ports)], (
                f"o_rsp valid {list(rsp_valid)} for a response to port {port} ({where})")
            if port is not None:
                fields = unpack(RD_RSP, cur)
                want_ready = user_ready[port] if port < ports else 1
                assert rd_ready == want_ready, (
                    f"i_rd.ready {rd_ready} for port {port} ({where})")
                if port < ports:
                    out = unpack(RD_RSP, rsp_payload[port])
                    want = {**fields, "tag": fields["tag"] & ((1 << low) - 1)}
                    assert out == want, f"o_rsp{port} {out}, not {want} ({where})"
                if rd_ready:
                    if port < ports:
                        got[port].append((fields["data"], fields["tag"] & ((1 << low) - 1),
                                          fields["error"]))
                        stats["rsp_cycles"].append(cycle)
                        stats["errors"] += fields["error"]
                    else:
                        stats["dropped"] += 1
                    cur = None
            cycle += 1
        stats["cycles"] = cycle

    simulate(dut, bench)
    errors = [e for r in rules.values() for e in r.errors]
    assert not errors, "\n".join(errors[:10])
    for k in range(ports):
        assert len(sent[k]) == reads, f"user {k}: {len(sent[k])} of {reads} requests taken"
        assert got[k] == expect[k], f"user {k}: responses differ from its requests"
        assert [(line_data(r["address"]), r["tag"]) for r in sent[k]] \
            == [g[:2] for g in got[k]], (
            f"user {k}: responses not its own, in its order, with its tags")
    return stats


CASES = [(0.0, 0.0), (0.3, 0.3), (0.0, 0.6)]


@pytest.mark.parametrize("idle, bp", CASES, ids=["smooth", "rough", "stalled"])
@pytest.mark.parametrize("ports", [2, 3, 5, 8])
def test_merge_and_route(seed, ports, idle, bp):
    """Random requests from every user: the round robin, the register, the routing of
    the responses by port number (and the dropping of those naming no user)."""
    reads = 200 if ports <= 3 else 80
    bad = 0.1 if ports & (ports - 1) else 0.0
    stats = _run(seed, ports, idle=idle, bp=bp, reads=reads, bad=bad)
    assert stats["errors"] > 0
    assert (stats["dropped"] > 0) == bool(bad), stats["dropped"]


@pytest.mark.parametrize("ports", [2, 3, 8])
def test_full_rate(ports):
    """Every user always requesting, ``o_rd`` and every user always ready, the agent
    answering in the cycle after each request: the inputs are taken in turn, 0, 1, 2,
    ..., one per cycle from cycle 0; the requests leave in cycles 1 to ``n`` (the
    register) and the responses, combinational, in cycles 2 to ``n + 1``."""
    reads = 20
    stats = _run(ports, ports, idle=0.0, bp=0.0, reads=reads, latency=1)
    n = ports * reads
    assert stats["grants"] == [(c, c % ports) for c in range(n)], stats["grants"][:12]
    assert stats["rd_cycles"] == list(range(1, n + 1)), stats["rd_cycles"][:12]
    assert stats["rsp_cycles"] == list(range(2, n + 2)), stats["rsp_cycles"][:12]
    assert stats["cycles"] == n + 2


@pytest.mark.parametrize("ports, valid, order", [
    (3, (1, 1, 1), [0, 1, 2] * 4),
    (3, (0, 1, 1), [1, 2] * 6),
    (8, (1,) * 8, list(range(8)) * 2),
    (5, (1, 0, 0, 1, 1), [0, 3, 4] * 4),
])
def test_round_robin_rotates(ports, valid, order):
    """The inputs in ``valid`` always requesting, ``o_rd`` always ready: one is taken
    per cycle, in turn from input 0 (reset), each at most once per round."""
    dut = CacheReadMux(ports=ports)
    reqs = [getattr(dut, f"i_req{k}") for k in range(ports)]
    taken = []

    async def bench(ctx):
        for k, req in enumerate(reqs):
            ctx.set(req.valid, valid[k])
        ctx.set(dut.o_rd.ready, 1)
        for _ in order:
            ready = (await ctx.tick().sample(*(r.ready for r in reqs)))[2:]
            assert sum(ready) == 1, ready
            taken.append(list(ready).index(1))

    simulate(dut, bench)
    assert taken == order


def test_unknown_port_dropped():
    """With three users, a response naming port 3 is taken at once (``ready`` 1 while
    every user's ``ready`` is low) and reaches no user; the next response, to user 1,
    waits for its ``ready`` only."""
    dut = CacheReadMux(ports=3)
    low = TAG_BITS - dut.port_bits
    rsps = [getattr(dut, f"o_rsp{k}") for k in range(3)]
    data = random.Random(3).getrandbits(512)

    async def bench(ctx):
        ctx.set(dut.i_rd.valid, 1)
        for tag, ready, want_ready, want_valid in [
            (3 << low | 0x123, 0, 1, [0, 0, 0]),
            (3 << low, 0, 1, [0, 0, 0]),
            (1 << low | 0x2A5, 0, 0, [0, 1, 0]),
            (1 << low | 0x2A5, 1, 1, [0, 1, 0]),
            ((1 << TAG_BITS) - 1, 0, 1, [0, 0, 0]),
        ]:
            ctx.set(dut.i_rd.payload.as_value(), pack(RD_RSP, data=data, tag=tag, error=1))
            ctx.set(rsps[1].ready, ready)
            got = (await ctx.tick().sample(dut.i_rd.ready, *(r.valid for r in rsps),
                                           rsps[1].payload.as_value()))[2:]
            assert (got[0], list(got[1:4])) == (want_ready, want_valid), (tag, got[:4])
            if want_valid[1]:
                assert unpack(RD_RSP, got[4]) == {"data": data, "tag": 0x2A5, "error": 1}

    simulate(dut, bench)


@pytest.mark.parametrize("ports", [1, 9, 0, "3"])
def test_rejects_bad_ports(ports):
    with pytest.raises(ValueError,
                       match=f"^ports must be an integer from 2 to 8, not {ports!r}$"):
        CacheReadMux(ports=ports)


def test_parameters_are_read_only_properties():
    assert [CacheReadMux(ports=n).port_bits for n in (2, 3, 4, 5, 8)] == [1, 2, 2, 3, 3]
    dut = CacheReadMux(ports=3)
    assert dut.ports == 3
    with pytest.raises(AttributeError):
        dut.ports = 4


@pytest.mark.parametrize("ports", [3, 8])
def test_verilog_lints_clean(tmp_path, ports):
    assert_lints_clean(CacheReadMux(ports=ports), f"cache_read_mux_p{ports}", tmp_path)
