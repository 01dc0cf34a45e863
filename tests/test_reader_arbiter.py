# amaranth: UnusedElaboratable=no
"""ReaderArbiter (hw/engine/reader_arbiter.py) in the Amaranth simulator.

Each reader requests bursts at random lines and lengths, holding a request until it is
granted or, now and then, withdrawing it (as a flushed reader does); AR has random
backpressure, and R beats with random IDs arrive with random idle cycles. Checked
against the contract: in each cycle the AR register is free (``~arvalid | arready``)
the first requesting reader after the last one granted (cyclically, reader 0 first
after reset), and only it, is granted, and no reader while it is busy; the AR transfers
are the granted bursts in grant order (``arid`` the reader, ``araddr`` its line,
``arlen``, 64-byte beats, INCR); each R beat is routed to the reader its ID names and
to no other; ``rready`` and ``bready`` are always 1. A passive checker holds AR to the
stream rules. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.bus.axi import AxiBurst
from hw.engine.reader_arbiter import ReaderArbiter

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .stream_rule import StreamRule

ADDR_WIDTH = 24


def run(seed: int, *, id_width: int, readers: int, rough: bool, cycles: int = 1000) -> dict:
    rng = random.Random(seed)
    dut = ReaderArbiter(addr_width=ADDR_WIDTH, id_width=id_width, readers=readers)
    ports = [getattr(dut, f"i_reader{k}") for k in range(readers)]
    p = dut.pmem
    rule = StreamRule("AR")
    granted: deque = deque()
    counts = {"grants": [0] * readers, "beats": 0}

    async def bench(ctx):
        requests = [None] * readers
        last = readers - 1                      # the last reader granted
        for cycle in range(cycles):
            for k, port in enumerate(ports):
                if requests[k] is None and rng.random() < 0.3:
                    requests[k] = (rng.getrandbits(ADDR_WIDTH - 6), rng.getrandbits(8))
                elif requests[k] is not None and rng.random() < 0.05:
                    requests[k] = None          # withdrawn
                ctx.set(port.req, requests[k] is not None)
                ctx.set(port.line, requests[k][0] if requests[k] else 0)
                ctx.set(port.len, requests[k][1] if requests[k] else 0)
            ctx.set(p.arready, not (rough and rng.random() < 0.5))
            beat = rng.random() < (0.5 if rough else 1.0)
            rid, rdata = rng.randrange(1 << id_width), rng.getrandbits(512)
            ctx.set(p.rvalid, beat)
            ctx.set(p.rid, rid)
            ctx.set(p.rdata, rdata)
            sampled = await ctx.tick().sample(
                p.arvalid, p.arready, p.arid, p.araddr, p.arlen, p.arsize, p.arburst,
                p.rready, p.bready, *(port.grant for port in ports),
                *(port.r.valid for port in ports), *(port.r.payload for port in ports))
            (ar_valid, ar_ready, ar_id, ar_addr, ar_len, ar_size, ar_burst, rready,
             bready) = sampled[2:11]
            grants = sampled[11:11 + readers]
            r_valid = sampled[11 + readers:11 + 2 * readers]
            r_data = sampled[11 + 2 * readers:]
            where = f"cycle {cycle}, seed {seed}"
            free = not ar_valid or ar_ready
            order = [(last + 1 + i) % readers for i in range(readers)]
            want = next((k for k in order if requests[k] is not None), None)
            assert list(grants) == [int(free and k == want) for k in range(readers)], (
                f"grants {list(grants)}, requests {requests}, AR free {free} ({where})")
            assert rready and bready, where
            rule.observe(cycle, ar_valid, ar_ready, (ar_id, ar_addr, ar_len, ar_size, ar_burst))
            if ar_valid and ar_ready:
                k, line, length = granted.popleft()
                assert (ar_id, ar_addr, ar_len, ar_size, ar_burst) == (
                    k, line << 6, length, 6, AxiBurst.INCR), f"AR ({where})"
            if free and want is not None:
                granted.append((want, *requests[want]))
                counts["grants"][want] += 1
                requests[want] = None
                last = want
            for k in range(readers):
                assert r_valid[k] == int(beat and rid == k), f"R to reader {k} ({where})"
                if r_valid[k]:
                    assert r_data[k] == rdata, f"R data of reader {k} ({where})"
                    counts["beats"] += 1

    simulate(dut, bench)
    assert not rule.errors, "\n".join(rule.errors[:10])
    return counts


@pytest.mark.parametrize("id_width, readers", [(1, 1), (2, 4), (3, 3)])
@pytest.mark.parametrize("rough", [False, True], ids=["smooth", "rough"])
def test_round_robin_and_routing(seed, id_width, readers, rough):
    counts = run(seed, id_width=id_width, readers=readers, rough=rough)
    assert all(counts["grants"]) and counts["beats"], counts


@pytest.mark.parametrize("kwargs, message", [
    ({"addr_width": 11, "id_width": 2, "readers": 4},
     "addr_width must be an integer from 12 to 48, not 11"),
    ({"addr_width": 30, "id_width": 0, "readers": 1},
     "id_width must be an integer from 1 to 16, not 0"),
    ({"addr_width": 30, "id_width": 17, "readers": 1},
     "id_width must be an integer from 1 to 16, not 17"),
    ({"addr_width": 30, "id_width": 2, "readers": 5},
     "readers must be an integer from 1 to 4, not 5"),
    ({"addr_width": 30, "id_width": 2, "readers": 0},
     "readers must be an integer from 1 to 4, not 0"),
    ({"addr_width": 30, "id_width": 2, "readers": "2"},
     "readers must be an integer from 1 to 4, not '2'"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        ReaderArbiter(**kwargs)


def test_parameters_are_read_only_properties():
    dut = ReaderArbiter(addr_width=30, id_width=3, readers=4)
    assert (dut.addr_width, dut.id_width, dut.readers) == (30, 3, 4)
    with pytest.raises(AttributeError):
        dut.readers = 2


def test_verilog_lints_clean(tmp_path):
    assert_lints_clean(ReaderArbiter(addr_width=30, id_width=3, readers=4),
                       "reader_arbiter_a30_i3_r4", tmp_path)
