# amaranth: UnusedElaboratable=no
"""LineReplay (hw/engine/line_replay.py) in the Amaranth simulator.

Descriptors one after the other: ``i_begin`` pulses with random ``off_base``,
``idx_base`` and ``off_lines`` (held until the next descriptor, as the bag sequencer
holds its descriptor), then the offsets lines (``i_off``) and the index lines
(``i_idx``) of random data come interleaved at random, at most one per cycle, with
random idle cycles and random data on the inputs that are not valid. Then the three
ports request random bursts inside the lines captured (port 0 the offsets, ports 1 and
2 the indices), each raised after a random idle time and held, with its ``line`` and
``len``, until granted; several ports often request at once. A golden model written
from the docstring (the ``k``-th offsets line in slot ``k``, the ``k``-th index line
in slot ``off_lines + k``, a line past ``lines`` slots dropped; line ``l`` of port 0
is slot ``l - off_base``, of ports 1 and 2 slot ``off_lines + l - idx_base``) predicts
every line. Checked: a grant only to a requesting port, at most one per cycle, to the
first requesting port after the last one granted (cyclically), never so early that
its lines would meet the last burst's, and late enough to leave at most one idle cycle
on ``r`` after a burst while a port requests; no port waits for more than ``REPLAY_PORTS - 1``
other grants; each burst's ``len + 1`` lines, and nothing else, on its port's ``r``,
one per cycle from a fixed delay after its grant (:data:`LATENCY`), in request order,
each equal to the line captured. Lines captured past the capacity (up to more than
twice it) are dropped without disturbing the slots that fit. Bad parameters raise
``ValueError`` with ``hw.widths``' messages. Seeds are printed; ``SEED=<n>`` replays
one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from hw.engine.line_replay import REPLAY_PORTS, LineReplay

from .amaranth_sim import simulate

ADDR_WIDTH = 30
LINE_SPAN = 1 << (ADDR_WIDTH - 6)
#: Cycles from a grant to its burst's first line ("from the second cycle after the
#: grant").
LATENCY = 2


def capture_order(rng: random.Random, n_off: int, n_idx: int, idle: float) -> list:
    """The capture inputs of one descriptor, a cycle each: ``"off"``, ``"idx"`` or
    ``None`` (idle), the offsets and index lines interleaved at random."""
    kinds = ["off"] * n_off + ["idx"] * n_idx
    rng.shuffle(kinds)
    out = []
    for kind in kinds:
        while rng.random() < idle:
            out.append(None)
        out.append(kind)
    return out


def random_bursts(rng: random.Random, base: int, n: int) -> list[tuple[int, int]]:
    """A few bursts ``(line, len)`` inside the ``n`` lines from ``base``."""
    if n == 0:
        return []
    bursts = []
    for _ in range(rng.randint(1, 6)):
        start = rng.randrange(n)
        longest = min(n - start, rng.choice([1, 4, 16, n]))
        bursts.append((base + start, rng.randint(1, longest) - 1))
    return bursts


def random_desc(rng: random.Random, lines: int) -> dict:
    off_lines = rng.choice([0, lines, rng.randint(0, lines), rng.randint(0, lines)])
    idx_lines = rng.choice([lines - off_lines, rng.randint(0, lines - off_lines)])
    off_base = rng.randrange(LINE_SPAN - lines)
    idx_base = rng.randrange(LINE_SPAN - lines)
    return {
        "off_base": off_base, "idx_base": idx_base, "off_lines": off_lines,
        "off": [rng.getrandbits(512) for _ in range(off_lines)],
        "idx": [rng.getrandbits(512) for _ in range(idx_lines)],
        "bursts": [random_bursts(rng, off_base, off_lines),
                   random_bursts(rng, idx_base, idx_lines),
                   random_bursts(rng, idx_base, idx_lines)],
    }


def run(seed: int, lines: int, descs: list[dict], *, idle: float,
        latency: int = LATENCY) -> dict:
    """Capture and replay ``descs`` in order; check every cycle against the golden
    model. Returns counts of grants, lines and cycles with several ports requesting."""
    rng = random.Random(seed)
    dut = LineReplay(addr_width=ADDR_WIDTH, lines=lines)
    ports = [getattr(dut, f"i_port{p}") for p in range(REPLAY_PORTS)]
    stats = {"grants": [0] * REPLAY_PORTS, "lines": 0, "contended": 0}
    store: dict[int, int] = {}      # the golden model's slots
    longest = max((length for d in descs for bursts in d["bursts"] for _, length in bursts),
                  default=0) + 1
    #: Cycles a request may wait: the other ports' bursts, each from grant to last line.
    wait_bound = (REPLAY_PORTS - 1) * (longest + latency + 1) + latency + 2

    async def bench(ctx):
        cycle = 0
        expected: dict[int, tuple] = {}     # cycle -> (port, line, data)
        requests: list = [None] * REPLAY_PORTS      # (line, len, raised at, grants seen)
        last = None                         # the last port granted (None: none yet)

        async def step(desc: dict, queues: list[deque], capture=None, begin=False):
            nonlocal cycle, last
            where = ("cycle {}, descriptor off_base {off_base} idx_base {idx_base} "
                     "off_lines {off_lines}").format(cycle, **desc)
            for p, port in enumerate(ports):
                if requests[p] is None and queues[p] and rng.random() >= idle:
                    requests[p] = (*queues[p].popleft(), cycle, 0)
                req = requests[p]
                ctx.set(port.req, req is not None)
                ctx.set(port.line, req[0] if req else rng.randrange(LINE_SPAN))
                ctx.set(port.len, req[1] if req else rng.getrandbits(8))
                ctx.set(port.r.ready, 1)        # always ready, by the channel's contract
            ctx.set(dut.i_begin, begin)
            if begin:
                ctx.set(dut.off_base, desc["off_base"])
                ctx.set(dut.idx_base, desc["idx_base"])
                ctx.set(dut.off_lines, desc["off_lines"])
            ctx.set(dut.i_off, capture is not None and capture[0] == "off")
            ctx.set(dut.i_idx, capture is not None and capture[0] == "idx")
            for kind in ("off", "idx"):
                data = capture[1] if capture and capture[0] == kind else rng.getrandbits(512)
                ctx.set(getattr(dut, f"i_{kind}_data"), data)
            sampled = (await ctx.tick().sample(
                *(port.grant for port in ports), *(port.r.valid for port in ports),
                *(port.r.payload for port in ports)))[2:]
            grants = sampled[:REPLAY_PORTS]
            r_valid = sampled[REPLAY_PORTS:2 * REPLAY_PORTS]
            r_data = sampled[2 * REPLAY_PORTS:3 * REPLAY_PORTS]

            # --- r: exactly the lines due this cycle
            due = expected.pop(cycle, None)
            for p in range(REPLAY_PORTS):
                want = due is not None and due[0] == p
                assert r_valid[p] == want, (
                    f"SEED={seed}: port {p} r.valid {r_valid[p]}, expected "
                    f"{'line ' + str(due[1]) if want else 'none'} ({where})")
                if want:
                    assert r_data[p] == due[2], (
                        f"SEED={seed}: port {p} line {due[1]}: wrong data ({where})")
                    stats["lines"] += 1

            # --- grants: round-robin among the requesting ports, one burst at a time
            asking = [p for p in range(REPLAY_PORTS) if requests[p] is not None]
            stats["contended"] += len(asking) > 1
            granted = [p for p in range(REPLAY_PORTS) if grants[p]]
            assert len(granted) <= 1, f"SEED={seed}: grants {granted} at once ({where})"
            for p in granted:
                assert p in asking, f"SEED={seed}: port {p} granted without req ({where})"
            if asking and not any(c >= cycle + latency - 1 for c in expected):
                assert granted, (
                    f"SEED={seed}: ports {asking} request, no burst served, no grant ({where})")
            if granted:
                p = granted[0]
                assert not any(c >= cycle + latency for c in expected), (
                    f"SEED={seed}: port {p} granted while a burst is served ({where})")
                if last is not None:
                    want = next(q for q in ((last + 1 + i) % REPLAY_PORTS
                                            for i in range(REPLAY_PORTS)) if q in asking)
                    assert p == want, (
                        f"SEED={seed}: port {p} granted, round-robin after port {last} "
                        f"among {asking} gives port {want} ({where})")
                line, length, _, _ = requests[p]
                for k in range(length + 1):
                    if p == 0:
                        slot = line + k - desc["off_base"]
                    else:
                        slot = desc["off_lines"] + line + k - desc["idx_base"]
                    expected[cycle + latency + k] = (p, line + k, store[slot])
                requests[p] = None
                last = p
                stats["grants"][p] += 1
                for q in asking:
                    if q != p:
                        line_q, len_q, since, seen = requests[q]
                        assert seen + 1 < REPLAY_PORTS, (
                            f"SEED={seed}: port {q} passed over {seen + 1} times ({where})")
                        requests[q] = (line_q, len_q, since, seen + 1)
            for p in asking:
                if requests[p] is not None:
                    assert cycle - requests[p][2] < wait_bound, (
                        f"SEED={seed}: port {p} waits {cycle - requests[p][2]} cycles "
                        f"({where})")
            cycle += 1

        for desc in descs:
            none = [deque() for _ in range(REPLAY_PORTS)]
            await step(desc, none, begin=True)
            offs, idxs = deque(desc["off"]), deque(desc["idx"])
            n_off, n_idx = 0, 0
            for kind in capture_order(rng, len(offs), len(idxs), idle):
                if kind == "off":
                    data = offs.popleft()
                    if n_off < lines:
                        store[n_off] = data
                    n_off += 1
                elif kind == "idx":
                    data = idxs.popleft()
                    if desc["off_lines"] + n_idx < lines:
                        store[desc["off_lines"] + n_idx] = data
                    n_idx += 1
                await step(desc, none, capture=(kind, data) if kind else None)
            for _ in range(rng.choice([0, 1, rng.randint(2, 10)])):
                await step(desc, none)
            queues = [deque(bursts) for bursts in desc["bursts"]]
            # All ports start at once now and then (the usual case in pass 2).
            for p in range(REPLAY_PORTS):
                if queues[p] and rng.random() < 0.5:
                    requests[p] = (*queues[p].popleft(), cycle, 0)
            while any(queues) or any(r is not None for r in requests) or expected:
                await step(desc, queues)
                assert cycle < 100_000, f"SEED={seed}: runaway bench"
            for _ in range(latency + 2):    # nothing more arrives
                await step(desc, queues)

    simulate(dut, bench)
    return stats


@pytest.mark.parametrize("lines", [8, 64])
@pytest.mark.parametrize("idle", [0.0, 0.4], ids=["smooth", "rough"])
def test_random_traffic(seed, lines, idle):
    rng = random.Random(seed)
    descs = [random_desc(rng, lines) for _ in range(40 if lines == 8 else 20)]
    stats = run(seed, lines, descs, idle=idle)
    want = sum(length + 1 for d in descs for bursts in d["bursts"] for _, length in bursts)
    assert stats["lines"] == want, f"SEED={seed}: {stats}, {want} lines requested"
    assert all(stats["grants"]) and stats["contended"], f"SEED={seed}: {stats}"


@pytest.mark.parametrize("off_lines, n_off, n_idx", [(3, 3, 9), (8, 19, 2), (0, 0, 19),
                                                    (5, 5, 3)])
def test_lines_past_the_capacity_are_dropped(seed, off_lines, n_off, n_idx):
    """``lines`` = 8, more lines captured than fit (up to more than twice the
    capacity): every slot that fits replays the line captured for it (a dropped line
    overwrites nothing), on all three ports; then a descriptor that fits replays
    normally."""
    rng = random.Random(seed)
    lines = 8
    off_kept, idx_kept = min(n_off, lines), max(0, min(n_idx, lines - off_lines))
    off_base, idx_base = rng.randrange(LINE_SPAN - 64), rng.randrange(LINE_SPAN - 64)
    over = {
        "off_base": off_base, "idx_base": idx_base, "off_lines": off_lines,
        "off": [rng.getrandbits(512) for _ in range(n_off)],
        "idx": [rng.getrandbits(512) for _ in range(n_idx)],
        "bursts": [[(off_base, off_kept - 1)] if off_kept else [],
                   [(idx_base, idx_kept - 1)] if idx_kept else [],
                   [(idx_base + k, 0) for k in range(idx_kept)]],
    }
    descs = [over, random_desc(rng, lines)]
    stats = run(seed, lines, descs, idle=0.3)
    want = sum(length + 1 for d in descs for bursts in d["bursts"] for _, length in bursts)
    assert stats["lines"] == want, f"SEED={seed}: {stats}, {want} lines requested"


@pytest.mark.parametrize("kwargs, message", [
    ({"addr_width": 11, "lines": 8}, "addr_width must be an integer from 12 to 64, not 11"),
    ({"addr_width": 65, "lines": 8}, "addr_width must be an integer from 12 to 64, not 65"),
    ({"addr_width": "30", "lines": 8},
     "addr_width must be an integer from 12 to 64, not '30'"),
    ({"addr_width": 30, "lines": 1}, "lines must be an integer from 2 to 4096, not 1"),
    ({"addr_width": 30, "lines": 24}, "lines must be a power of two, not 24"),
    ({"addr_width": 30, "lines": 8192}, "lines must be an integer from 2 to 4096, not 8192"),
    ({"addr_width": 30, "lines": True}, "lines must be an integer from 2 to 4096, not True"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        LineReplay(**kwargs)
