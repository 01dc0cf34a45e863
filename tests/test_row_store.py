# amaranth: UnusedElaboratable=no
"""RowStore and StoreReader (hw/engine/row_store.py): the scatter's read bursts answered
from the store or from PMEM, checked against a memory model line by line.

Written from the blocks' contracts (``docs/embedding.md``, "Row store", and the
docstrings): a burst is answered in AR order with the memory's current data whichever
way it is served; a burst goes to ``down`` unchanged and in order unless every line
of it is in the store; a line is in the store once filled (a fill in a cycle with a
probe presented or due, with ``flash`` or with an AW on the invalidation port is
dropped) until a write's invalidation of that line, a fill of another line with the
same :func:`store_index`, or ``flash``.

The random test mixes fills (with the memory's data from before the cycle's write),
writes (the memory changes in the AW's cycle and the AW goes to the invalidation port,
held while ``inv_room`` is low; never to a line a read in flight covers), flashes and read
bursts of 1 to 4 lines from a small pool of lines, two of which share an entry, with
AR backpressure and idle cycles on ``down``, random R latency and ``rready`` low at
random on ``up``. The directed test checks which bursts the store serves. Seeds are
printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from collections import deque

import pytest
from amaranth.hdl import Module

from hw.engine.row_store import RowStore, StoreReader, store_index

from .amaranth_sim import simulate

AW = 20
IDW = 4
LINES = 16
MAX_BURST = 4
LINE = 64


def _dut(entries: int = LINES):
    m = Module()
    m.submodules.store = store = RowStore(addr_width=AW, lines=entries)
    m.submodules.reader = reader = StoreReader(addr_width=AW, id_width=IDW,
                                               max_burst=MAX_BURST, queue=8)
    m.d.comb += [
        store.probe_valid.eq(reader.probe_valid),
        store.probe_addr.eq(reader.probe_addr),
        reader.probe_ok.eq(store.probe_ok),
        reader.hit.eq(store.hit),
        reader.data.eq(store.data),
    ]
    return m, store, reader


class Bench:
    """Drives the two blocks cycle by cycle and checks every beat on ``up``."""

    def __init__(self, rng: random.Random, *, r_idle=0.3, ar_bp=0.3, rready_low=0.3,
                 latency=(3, 12)):
        self.rng = rng
        self.mem: dict[int, int] = {}
        self.r_idle, self.ar_bp, self.rready_low, self.latency = (r_idle, ar_bp,
                                                                 rready_low, latency)
        self.cycle = 0
        self.up_ar = None                   # (addr, len, id) offered on up
        self.expect = deque()               # per accepted AR: [id, [data...]]
        self.accepted = deque()             # ARs accepted, not yet seen on down or answered
        self.down_q = deque()               # (ready cycle, id, [data...]) served by "PMEM"
        self.down_beat = None
        self.downs = []                     # ARs seen on down
        self.store_beats = 0
        self.beats = 0
        self.busy_lines: dict[int, int] = {}  # lines of reads in flight -> count

    def data(self, line: int) -> int:
        if line not in self.mem:
            self.mem[line] = self.rng.getrandbits(512)
        return self.mem[line]

    def read_lines(self, addr, length):
        return [addr + LINE * k for k in range(length + 1)]

    async def run(self, ctx, dut, steps):
        """``steps(bench)`` yields per cycle a dict of actions: ``fill`` (addr),
        ``write`` ((addr, len)), ``flash``, ``read`` ((addr, len)); a read is offered
        once the previous one has been taken."""
        _, store, reader = dut
        up, down = reader.up, reader.down
        for action in steps(self):
            # --- drive
            rng = self.rng
            if self.up_ar is None and action.get("read") is not None:
                addr, length = action["read"]
                self.up_ar = (addr, length, rng.randrange(1 << IDW))
            ctx.set(up.arvalid, self.up_ar is not None)
            if self.up_ar is not None:
                ctx.set(up.araddr, self.up_ar[0])
                ctx.set(up.arlen, self.up_ar[1])
                ctx.set(up.arid, self.up_ar[2])
            ctx.set(up.rready, not rng.random() < self.rready_low)
            ctx.set(down.arready, not rng.random() < self.ar_bp)
            if (self.down_beat is None and self.down_q and self.down_q[0][0] <= self.cycle
                    and not rng.random() < self.r_idle):
                _, rid, beats = self.down_q[0]
                self.down_beat = (rid, beats[0], len(beats) == 1)
            ctx.set(down.rvalid, self.down_beat is not None)
            if self.down_beat is not None:
                ctx.set(down.rid, self.down_beat[0])
                ctx.set(down.rdata, self.down_beat[1])
                ctx.set(down.rlast, self.down_beat[2])
                ctx.set(down.rresp, 0)
            fill = action.get("fill")
            ctx.set(store.fill_valid, fill is not None)
            if fill is not None:
                ctx.set(store.fill_addr, fill)
                ctx.set(store.fill_data, self.data(fill))
            write = action.get("write")
            if write is not None and not ctx.get(store.inv_room):
                write = None
            if write is not None and any(line in self.busy_lines
                                         for line in self.read_lines(*write)):
                write = None
            ctx.set(store.inv_valid, write is not None)
            if write is not None:
                ctx.set(store.inv_addr, write[0])
                ctx.set(store.inv_len, write[1])
                for line in self.read_lines(*write):
                    self.mem[line] = rng.getrandbits(512)
            ctx.set(store.flash, bool(action.get("flash")))
            # --- one clock edge
            (arready, rvalid, rready, rdata, rlast, rid, store_beat, d_arvalid, d_arready,
             d_araddr, d_arlen, d_arid, d_rready) = (await ctx.tick().sample(
                up.arready, up.rvalid, up.rready, up.rdata, up.rlast, up.rid,
                reader.store_beat, down.arvalid, down.arready, down.araddr, down.arlen,
                down.arid, down.rready))[2:]
            # --- observe
            if self.up_ar is not None and arready:
                addr, length, aid = self.up_ar
                lines = self.read_lines(addr, length)
                for line in lines:
                    self.busy_lines[line] = self.busy_lines.get(line, 0) + 1
                self.expect.append([aid, [self.data(line) for line in lines], lines])
                self.accepted.append(self.up_ar)
                self.up_ar = None
            if d_arvalid and d_arready:
                ar = (d_araddr, d_arlen, d_arid)
                while self.accepted and self.accepted[0] != ar:
                    self.accepted.popleft()     # answered from the store
                assert self.accepted, f"cycle {self.cycle}: AR {ar} on down never came on up"
                self.accepted.popleft()
                self.downs.append(ar)
                lat = rng.randint(*self.latency)
                self.down_q.append((self.cycle + lat, d_arid,
                                    [self.data(line) for line in self.read_lines(d_araddr,
                                                                                 d_arlen)]))
            if self.down_beat is not None and d_rready:
                beats = self.down_q[0][2]
                beats.pop(0)
                if not beats:
                    self.down_q.popleft()
                self.down_beat = None
            if rvalid and rready:
                assert self.expect, f"cycle {self.cycle}: R beat on up with no read in flight"
                aid, datas, lines = self.expect[0]
                want = datas.pop(0)
                line = lines.pop(0)
                assert rid == aid, f"cycle {self.cycle}: rid {rid}, expected {aid}"
                assert rdata == want, (f"cycle {self.cycle}: line {line:#x} read "
                                       f"{'from the store' if store_beat else 'from down'} "
                                       f"differs from memory")
                assert bool(rlast) == (not datas), f"cycle {self.cycle}: rlast {rlast}"
                self.busy_lines[line] -= 1
                if not self.busy_lines[line]:
                    del self.busy_lines[line]
                if not datas:
                    self.expect.popleft()
                self.beats += 1
                self.store_beats += bool(store_beat)
            self.cycle += 1


def _pool(entries: int = LINES) -> list[int]:
    """Line addresses of the random test (a store of ``entries``): two runs of 6 lines in
    two 4 KiB pages, in 12 distinct entries, and a line that shares the entry of the
    first one."""
    bits = entries.bit_length() - 1
    lines = [page * 4096 + LINE * k for page in (1, 2) for k in range(6)]
    assert len({store_index(a, bits) for a in lines}) == len(lines)
    twin = next(a for a in range(0x20000, 0x40000, LINE)
                if store_index(a, bits) == store_index(lines[0], bits))
    return [*lines, twin]


@pytest.mark.parametrize("entries", [LINES, 256])
def test_random_traffic(seed, entries):
    """Also with 256 entries, where the valid bits' one-hot decodes have two levels."""
    rng = random.Random(seed)
    dut = _dut(entries)
    bench = Bench(rng)
    pool = _pool(entries)

    def burst():
        addr = rng.choice(pool)
        length = rng.randrange(MAX_BURST)
        length = min(length, (4096 - addr % 4096) // LINE - 1)
        return addr, length

    def steps(b):
        for _ in range(6000):
            action = {}
            if rng.random() < 0.4:
                action["fill"] = rng.choice(pool)
            if rng.random() < 0.05:
                action["write"] = burst()
            if rng.random() < 0.005:
                action["flash"] = True
            if rng.random() < 0.25:
                action["read"] = burst()
            yield action
        while b.expect or b.up_ar is not None:
            yield {}

    async def bench_fn(ctx):
        await bench.run(ctx, dut, steps)

    simulate(dut[0], bench_fn)
    print(f"{bench.beats} beats, {bench.store_beats} from the store, "
          f"{len(bench.downs)} bursts from down")
    assert bench.beats > 1500
    assert 0.1 * bench.beats < bench.store_beats < 0.9 * bench.beats


def test_which_bursts_the_store_serves(seed):
    """Lines filled are served from the store; a write's lines, a colliding fill's victim
    and everything after a flash are read from ``down``; a fill in a probe's cycle is
    dropped; a read right after a write of several lines does not see the old last
    line; a fill in the cycle of a write of its line is dropped."""
    rng = random.Random(seed)
    dut = _dut()
    bench = Bench(rng, r_idle=0.2, ar_bp=0.2, rready_low=0.2)
    bits = LINES.bit_length() - 1
    # Lines of distinct entries: one per entry.
    lines, used = [], set()
    for addr in range(0x1000, 0x8000, LINE):
        if store_index(addr, bits) not in used:
            used.add(store_index(addr, bits))
            lines.append(addr)
    twin = next(a for a in range(0x9000, 0x20000, LINE)
                if store_index(a, bits) == store_index(lines[3], bits))
    phases = {}
    run = [0xA000 + LINE * k for k in range(4)]        # four lines in four entries
    assert len({store_index(a, bits) for a in run}) == 4

    def drain(b):
        while b.expect or b.up_ar is not None:
            yield {}

    def read_all(b, addrs):
        for addr in addrs:
            yield {"read": (addr, 0)}
            while b.up_ar is not None:
                yield {}

    def steps(b):
        for addr in lines:
            yield {"fill": addr}
        yield from read_all(b, lines)
        yield from drain(b)
        phases["filled"] = len(b.downs)
        yield {"write": (lines[0], 1)}                  # two lines from lines[0]
        yield {"fill": twin}                            # evicts lines[3]
        for _ in range(4):
            yield {}
        yield from read_all(b, lines)
        yield from drain(b)
        phases["after_write"] = b.downs[phases["filled"]:]
        yield {"flash": True}
        yield from read_all(b, lines[:4])
        yield from drain(b)
        phases["after_flash"] = b.downs[phases["filled"] + len(phases["after_write"]):]
        # A fill presented with a probe is dropped: fill the line as a read of another
        # line is probed, then read it.
        start = len(b.downs)
        yield {"read": (lines[5], 0)}                   # taken now, probed next cycle
        yield {"fill": lines[6]}                        # with the probe
        yield {"fill": lines[6]}                        # with its result
        for _ in range(3):
            yield {}
        yield {"read": (lines[6], 0)}
        yield from drain(b)
        phases["probe_fill"] = b.downs[start:]
        # A burst's lines are looked up one per cycle: a read of its last line taken
        # in the next cycle waits for the look-up (else it would hit the old line).
        for addr in run:
            yield {"fill": addr}
        yield {"write": (run[0], len(run) - 1)}
        yield {"read": (run[-1], 0)}
        yield from drain(b)
        # A fill in the cycle of an AW that writes its line carries the line as it was
        # before the write: it is dropped, whatever its entry held (here another line).
        for addr in (twin, lines[3], twin):
            start = len(b.downs)
            yield {"fill": addr}
            yield {}
            yield {"fill": lines[3], "write": (lines[3], 0)}
            for _ in range(3):
                yield {}
            yield {"read": (lines[3], 0)}
            yield from drain(b)
            phases.setdefault("inv_fill", []).append(b.downs[start:])

    async def bench_fn(ctx):
        await bench.run(ctx, dut, steps)

    simulate(dut[0], bench_fn)
    assert phases["filled"] == 0, f"{phases['filled']} bursts of filled lines went to PMEM"
    written = {lines[0], lines[0] + LINE}
    want = [a for a in lines if a in written or a == lines[3]]
    assert [ar[0] for ar in phases["after_write"]] == want, phases["after_write"]
    assert [ar[0] for ar in phases["after_flash"]] == lines[:4], phases["after_flash"]
    got = [ar[0] for ar in phases["probe_fill"]]
    assert lines[6] in got, f"the fill during a probe was kept: {got}"
    for got in phases["inv_fill"]:
        assert [ar[0] for ar in got] == [lines[3]], f"the fill during its write was kept: {got}"
