# amaranth: UnusedElaboratable=no
"""SequencerPool (hw/engine/sequencer_pool.py): several bag sequencers and the ordered
merge, in the Amaranth simulator against :class:`tb.pmem.PmemModel`.

Random LOOKUPs and UPDATEs (some failing their checks) go in on ``i_desc`` with random
idle cycles; ``pmem`` has random backpressure and idle R cycles (:mod:`tests.axi_pmem`);
``o_rows`` and ``o_status`` have random backpressure. Tables and gradient buffers lie at
random addresses, so that successive UPDATEs' tables (and an UPDATE's gradients and the
table before it) sometimes overlap and sometimes not; ``scratch_host`` is random per run.
The bench plays the gradient feed and the scatter: one UPDATE at a time, from the
earliest, some random time after its status is offered (its rows have gone) and after the
UPDATE before it is durable, it pulses ``i_update_fed`` (its items are taken), and some
random time later ``i_update_done``. Checked: the rows
and statuses of all descriptors come out in the order the descriptors went in, each as
the golden models say (``sim.embedding`` through :mod:`tests.test_bag_sequencer`); every
row carries its descriptor's settings (lines per row from ``sim.embedding``); no row of
a LOOKUP after a good UPDATE passes before the UPDATE's writes are reported durable, and
no row of an UPDATE before the UPDATE before it is fed, or before it is durable unless
their tables (and, without ``scratch_host``, the later one's gradients and the earlier
one's table) are apart (:func:`apart`); UPDATEs do overlap so, and ``update_overlap``
marks exactly those whose turn began while the UPDATE before was not durable;
``update_start`` pulses once per UPDATE as its turn begins, with ``update`` holding its
settings, and each row's ``update`` flag marks exactly the UPDATE's rows;
``update_finish`` pulses exactly as the status of an UPDATE that passed its checks goes
(with its ``read_error``); ``ahead`` names only, with ``scratch_host``, the UPDATE that
begins next (the turn's, not begun, or the one after the turn's begun UPDATE, which then
completes OK), with its gradient buffer, and only one that passed its checks;
with several sequencers, descriptors are taken while earlier ones still stream. Passive
checkers hold ``o_rows``, ``o_status`` and the AXI channels to the stream rules. Random tests
print their seed; ``SEED=<n>`` replays one.

With read errors (:func:`tests.test_bag_sequencer.random_fault`): the statuses and the
rows' ``bad`` as for one sequencer, and a row marked ``bad`` never asks for an undo
capture (a failed read may have made it).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from hw.engine.bag_sequencer import ID_BITS, STATUS
from hw.engine.descriptor import DescKind, pack_descriptor
from hw.engine.sequencer_pool import SequencerPool, rows_layout, update_layout
from sim.embedding import lines_per_row
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import ROUGH, SMOOTH, ReadErrors, Traffic
from .conftest import assert_lints_clean
from .payload import unpack
from .stream_rule import StreamRule
from .test_bag_sequencer import (
    ADDR_WIDTH,
    PMEM_SIZE,
    TABLE_BASE,
    Alloc,
    Case,
    Fault,
    compare,
    random_case,
    random_fault,
    read_errors,
)

ID_WIDTH = 4


class ReadPort:
    """The sequencers' read-only AXI4 port served by ``model`` (bursts allowed), with
    random ``arready`` and idle R cycles and the read errors of ``faults``; AR held to
    the stream rule, writes refused."""

    def __init__(self, port, model: PmemModel, rng: random.Random, traffic: Traffic,
                 faults: ReadErrors):
        self.port, self.model, self.rng, self.traffic = port, model, rng, traffic
        self.faults = faults
        self.cycle = 0
        self.beat = None
        self.rule = StreamRule("AR")

    @property
    def errors(self) -> list[str]:
        return self.rule.errors

    async def tick(self, ctx, *extra) -> tuple:
        p, t, rng, model = self.port, self.traffic, self.rng, self.model
        ctx.set(p.arready, not rng.random() < t.ar_bp)
        if self.beat is None and not rng.random() < t.r_idle:
            self.beat = self.faults.beat(model.r_beat(self.cycle))
            if self.beat is not None:
                for sig, value in zip((p.rid, p.rdata, p.rresp, p.rlast), self.beat,
                                      strict=True):
                    ctx.set(sig, int(value))
        ctx.set(p.rvalid, self.beat is not None)
        values = (await ctx.tick().sample(
            p.arvalid, p.arready, p.arid, p.araddr, p.arlen, p.arsize, p.arburst, p.rready,
            p.awvalid, p.wvalid, *extra))[2:]
        arvalid, arready, *ar, rready, awvalid, wvalid = values[:10]
        assert not awvalid and not wvalid, "the sequencers must not write"
        self.rule.observe(self.cycle, arvalid, arready, tuple(ar))
        if arvalid and arready:
            model.accept_ar(ar[0], ar[1], ar[2], self.cycle, size=ar[3], burst=ar[4])
            self.faults.accept_ar(ar[0], ar[1], ar[2])
        if self.beat is not None and rready:
            model.r_accept(self.cycle)
            self.beat = None
        self.cycle += 1
        return values[10:]


def settings(f: dict, bad: int = 0) -> tuple[dict, dict]:
    """The gather settings every row of descriptor ``f`` carries (a ``bad`` one asks for
    no undo capture), and (for an UPDATE) the ``update`` output as its turn begins."""
    aw = (1 << ADDR_WIDTH) - 1
    dtype = "bfloat16" if f["bf16"] else np.float32
    lpr = lines_per_row(f["dim"], dtype)
    update = f["kind"] == DescKind.UPDATE.value
    gather = {"table_base": f["table_base"] & aw, "lines_per_row": lpr,
              "batch_id": f["batch_id"], "table_id": f["table_id"],
              "capture": int(f["capture_undo"] and not update and not bad),
              "pool": {"mode": f["mode"], "weighted": f["weighted"], "bf16": f["bf16"],
                       "lines_per_row": lpr}}
    glines = lines_per_row(f["dim"], np.float32)
    items = 2 * lines_per_row(f["dim"], "bfloat16") if f["bf16"] else glines
    upd = {"table_base": f["table_base"] & aw, "data_addr": f["data_addr"] & aw,
           "num_bags": f["num_bags"], "dim": f["dim"], "bf16": f["bf16"],
           "weighted": f["weighted"], "lines_per_row": lpr, "glines": glines,
           "items": items}
    return gather, upd


def nested(layout, value: int) -> dict:
    """``value`` unpacked through ``layout``, struct members as dicts."""
    out = {}
    for name, member in layout:
        v = (value >> member.offset) & ((1 << member.width) - 1)
        shape = member.shape
        out[name] = nested(shape, v) if hasattr(shape, "members") else v
    return out


def ranges(f: dict) -> tuple[int, int, int, int]:
    """The byte ranges ``[lo, hi)`` of descriptor ``f``'s table (``rows`` vectors) and
    of an UPDATE's gradients (``num_bags`` fp32 vectors), from ``docs/embedding.md``."""
    dtype = "bfloat16" if f["bf16"] else np.float32
    t_lo = f["table_base"]
    g_lo = f["data_addr"]
    return (t_lo, t_lo + f["rows"] * lines_per_row(f["dim"], dtype) * 64,
            g_lo, g_lo + f["num_bags"] * lines_per_row(f["dim"], np.float32) * 64)


def apart(later: dict, earlier: dict, scratch_host: bool) -> bool:
    """UPDATE ``later`` may overlap UPDATE ``earlier``: its table does not overlap the
    earlier one's, nor do its gradients unless they are in GPU memory."""
    t_lo, t_hi, g_lo, g_hi = ranges(later)
    e_lo, e_hi, _, _ = ranges(earlier)

    def disjoint(lo, hi):
        return hi <= e_lo or e_hi <= lo
    return disjoint(t_lo, t_hi) and (scratch_host or disjoint(g_lo, g_hi))


#: Lines above ``TABLE_BASE`` where :func:`spread` puts tables: tables of 1 to 5000 rows
#: from the same or different slots overlap or not.
_SLOTS = (0, 1, 300, 20_000)
#: More slots, far apart: runs of three or more UPDATEs apart from each other are common.
_MANY_SLOTS = (*_SLOTS, 40_000, 60_000, 80_000, 100_000)


def spread(rng: random.Random, c: Case, grads_in_tables: float,
           slots: tuple[int, ...] = _SLOTS) -> None:
    """Puts ``c``'s table at a random one of ``slots``, and with probability
    ``grads_in_tables`` its gradients too (the sequencers read neither)."""
    c.fields["table_base"] = TABLE_BASE + 64 * rng.choice(slots)
    if rng.random() < grads_in_tables:
        c.fields["data_addr"] = TABLE_BASE + 64 * rng.choice(slots)
    _, t_hi, _, g_hi = ranges(c.fields)
    assert max(t_hi, g_hi) <= PMEM_SIZE


def cases(rng: random.Random, n: int, faults: float = 0.0,
          updates_only: bool = False, slots: tuple[int, ...] = _SLOTS) -> list[Case]:
    """``n`` random descriptors (only UPDATEs with ``updates_only``), some failing their
    checks; with ``faults`` that share of the others with a read error
    (:func:`tests.test_bag_sequencer.random_fault`). Tables and gradients at random
    addresses (:func:`spread`)."""
    alloc = Alloc(rng)
    out = []
    for _ in range(n):
        c = random_case(rng, alloc)
        while updates_only and c.fields["kind"] != DescKind.UPDATE.value:
            c = random_case(rng, alloc)
        spread(rng, c, 0.5 if updates_only else 0.25, slots)
        if rng.random() < 0.15:             # a descriptor failing its checks
            if rng.random() < 0.5:
                c.fields["rows"] = 0        # every index out of range
            else:
                c.fields["offsets_addr"] += 2   # misaligned (same buffer, same lines)
        elif rng.random() < faults and (fault := random_fault(rng, c)) is not None:
            c.faults.append(fault)
        out.append(c)
    if faults:
        # At least one LOOKUP with capture_undo with a row marked ``bad`` (a failed
        # pass-2 read of its first offsets line), and one with a good row: drawn until
        # found, so that every seed exercises both.
        def capture_rows(c):
            if c.fields["kind"] != DescKind.LOOKUP.value or not c.fields["capture_undo"]:
                return set()
            return {e[1]["bad"] for e in c.expected() if e[0] == "row"}

        for bad in (1, 0):
            while not any(bad in capture_rows(c) for c in out):
                c = random_case(rng, alloc)
                spread(rng, c, 0.25)
                c.fields["capture_undo"] = 1
                if bad:
                    c.faults.append(Fault("offsets", 0, frozenset({1})))
                if bad in capture_rows(c):
                    out.insert(rng.randrange(len(out) + 1), c)
    return out


def _run(seed: int, sequencers: int, *, n: int, idle: float, bp: float,
         traffic: Traffic, faults: float = 0.0, updates_only: bool = False,
         write_time: int = 30, scratch_host: bool | None = None,
         updates: int = 2, slots: tuple[int, ...] = _SLOTS) -> dict:
    """A random run (module docstring); ``write_time``: the most cycles the scatter
    takes from an UPDATE's last item to its writes durable; ``updates``: the pool's
    parameter (UPDATEs begun and not durable at once); ``scratch_host`` None:
    random."""
    rng = random.Random(seed)
    # Each sequencer keeps the ID bits its buffer readers need.
    id_width = max(ID_WIDTH, (sequencers - 1).bit_length() + ID_BITS)
    dut = SequencerPool(addr_width=ADDR_WIDTH, id_width=id_width, sequencers=sequencers,
                        updates=updates)
    model = PmemModel(size=PMEM_SIZE, rng=random.Random(seed + 1),
                      timing=PmemTiming(read_latency=12, jitter=12))
    descs = cases(rng, n, faults, updates_only, slots)
    port = ReadPort(dut.pmem, model, rng, traffic,
                    read_errors(descs, random.Random(seed + 2)))
    for c in descs:
        c.write(model)
    want = [e for c in descs for e in c.expected()]
    rules = [StreamRule("o_rows"), StreamRule("o_status")]
    got: list[tuple] = []
    # Rows of LOOKUPs with capture_undo, by their ``bad``; UPDATEs whose rows went while
    # the UPDATE before them was not durable.
    stats = {"overlap": 0, "capture_good": 0, "capture_bad": 0, "early_updates": 0,
             "overlap_pulses": 0, "deepest": 0}
    if scratch_host is None:
        scratch_host = rng.random() < 0.5
    rows_l, upd_l = rows_layout(ADDR_WIDTH), update_layout(ADDR_WIDTH)

    async def bench(ctx):
        queue = [int.from_bytes(pack_descriptor(**c.fields), "little") for c in descs]
        cur = None
        taken = 0                   # descriptors taken
        out = 0                     # descriptors whose status went out
        started = -1                # the descriptor of the last update_start pulse
        durable_at = None           # cycle of the last done pulse
        checked_for = -1            # the descriptor of the last update_checked
        row_early = -1              # the last UPDATE counted in ``early_updates``
        # The scatter: UPDATEs whose turn began and whose writes are not durable, oldest
        # first, each [descriptor, rows gone, fed, cycle of the fed pulse, cycle of the
        # done pulse]. They are fed in order, and report durable in order.
        scatter: list[list] = []
        ahead_for: set[int] = set()     # the descriptors ``ahead`` named
        ahead_after: set[int] = set()   # begun UPDATEs while the next was named
        ctx.set(dut.scratch_host, scratch_host)
        while out < len(descs):
            assert port.cycle < 300_000, "hang"
            if cur is None and queue and not rng.random() < idle:
                cur = queue.pop(0)
                ctx.set(dut.i_desc.payload.as_value(), cur)
            ctx.set(dut.i_desc.valid, cur is not None)
            ctx.set(dut.o_rows.ready, not rng.random() < bp)
            ctx.set(dut.o_status.ready, not rng.random() < bp)
            feedee = next((e for e in scatter if not e[2]), None)
            fed = feedee is not None and feedee[1] and port.cycle >= feedee[3]
            head = scatter[0] if scatter else None
            pulse = head is not None and head[2] and port.cycle >= head[4]
            ctx.set(dut.i_update_fed, fed)
            ctx.set(dut.i_update_done, pulse)
            (d_ready, r_valid, r_ready, r_p, s_valid, s_ready, s_p, start, upd, checked,
             overlapping, ahead, a_addr, a_bags, a_glines, finish, finish_err
             ) = await port.tick(
                ctx, dut.i_desc.ready, dut.o_rows.valid, dut.o_rows.ready,
                dut.o_rows.payload.as_value(), dut.o_status.valid, dut.o_status.ready,
                dut.o_status.payload.as_value(), dut.update_start, dut.update.as_value(),
                dut.update_checked, dut.update_overlap, dut.ahead, dut.ahead_data_addr,
                dut.ahead_num_bags, dut.ahead_glines, dut.update_finish,
                dut.update_read_error)
            cycle = port.cycle
            where = f"cycle {cycle}, seed {seed}"
            rules[0].observe(cycle, r_valid, r_ready, r_p)
            rules[1].observe(cycle, s_valid, s_ready, s_p)
            if cur is not None and d_ready:
                cur = None
                taken += 1
                if taken - out > 1:
                    stats["overlap"] += 1
            f = descs[out].fields if out < len(descs) else None
            if ahead:
                # Only with the buffers in GPU memory, for the UPDATE that begins next
                # (the turn's if not begun, else the one after a begun UPDATE), once it
                # has passed its checks, with its gradient buffer.
                assert scratch_host, f"ahead with the buffers in PMEM ({where})"
                # (``update_start`` pulses in the first cycle the turn's UPDATE has begun)
                named = out + 1 if started == out or start else out
                fa = descs[named].fields if named < len(descs) else None
                assert f and f["kind"] == DescKind.UPDATE.value, (
                    f"ahead while the turn is no UPDATE's ({where})")
                assert fa and fa["kind"] == DescKind.UPDATE.value, (
                    f"ahead for no UPDATE that begins next ({where})")
                want_upd = settings(fa)[1]
                assert (a_addr, a_bags, a_glines) == tuple(
                    want_upd[k] for k in ("data_addr", "num_bags", "glines")), (
                    f"ahead settings ({where})")
                ahead_for.add(named)
                if named != out:
                    # the turn's UPDATE has begun: it must complete OK
                    ahead_after.add(out)
            if checked:
                # Only for the UPDATE whose turn it is, after its start, and only for
                # one that completes OK.
                assert f and f["kind"] == DescKind.UPDATE.value, f"checked ({where})"
                assert started == out or start, f"checked before update_start ({where})"
                checked_for = out
            if start:
                assert f and f["kind"] == DescKind.UPDATE.value and started < out, where
                assert nested(upd_l, upd) == settings(f)[1], f"update settings ({where})"
                started = out
                # ``update_overlap``: the UPDATE before was not durable as this one's
                # turn began (the cycle before; its done pulse may have been that cycle).
                assert overlapping == bool(scatter) or durable_at == cycle - 1, (
                    f"update_overlap {overlapping} ({where})")
                stats["overlap_pulses"] += overlapping
                scatter.append([out, False, False, 0, 0])
            # The feed ends an UPDATE only after its status has gone on with OK (the
            # engine's ``update_finish``); a failed one is never fed.
            if (s_valid and s_ready and f["kind"] == DescKind.UPDATE.value
                    and unpack(STATUS, s_p)["status"] == 0 and scatter[-1][0] == out
                    and not scatter[-1][1]):
                scatter[-1][1:4] = [True, False, cycle + rng.randint(0, 20)]
            if r_valid and r_ready:
                earlier = [e for e in scatter if e[0] != out]
                if f["kind"] != DescKind.UPDATE.value:
                    assert not earlier, f"a row passed before the UPDATE was durable ({where})"
                elif earlier:
                    assert len(earlier) < updates, (
                        f"an UPDATE row passed with {len(earlier)} earlier UPDATEs not "
                        f"durable ({where})")
                    for e in earlier:
                        assert e[2], (f"an UPDATE row passed before an UPDATE before it "
                                      f"was fed ({where})")
                        assert apart(f, descs[e[0]].fields, scratch_host), (
                            f"an UPDATE row passed before an overlapping UPDATE before it "
                            f"was durable ({where})")
                    stats["deepest"] = max(stats["deepest"], len(earlier))
                    if row_early != out:
                        stats["early_updates"] += 1
                        row_early = out
                row = nested(rows_l, r_p)
                gather, _ = settings(f, row["row"]["bad"])
                assert row["gather"] == gather, f"row settings ({where})"
                if f["capture_undo"] and f["kind"] == DescKind.LOOKUP.value:
                    stats["capture_bad" if row["row"]["bad"] else "capture_good"] += 1
                assert row["update"] == (f["kind"] == DescKind.UPDATE.value), where
                if f["kind"] == DescKind.UPDATE.value:
                    assert started == out, f"UPDATE rows before update_start ({where})"
                    assert checked, f"UPDATE row without update_checked ({where})"
                got.append(("row", row["row"]))
            # ``update_finish`` exactly as the status of an UPDATE that passed goes on.
            st = unpack(STATUS, s_p) if s_valid and s_ready else None
            want_finish = (st is not None and f["kind"] == DescKind.UPDATE.value
                           and st["status"] == 0)
            assert finish == want_finish, f"update_finish {finish} ({where})"
            assert not finish or finish_err == st["read_error"], (
                f"update_read_error {finish_err} ({where})")
            if st is not None:
                got.append(("status", st))
                status = st["status"]
                assert out not in ahead_for or status == 0, (
                    f"ahead for an UPDATE that failed its checks ({where})")
                assert out not in ahead_after or status == 0, (
                    f"ahead for the UPDATE after one that failed its checks ({where})")
                if f["kind"] == DescKind.UPDATE.value:
                    assert started == out, f"UPDATE without update_start ({where})"
                    assert checked_for != out or status == 0, (
                        f"update_checked for an UPDATE that failed ({where})")
                    if status != 0:     # no rows: the scatter never hears of it
                        assert scatter[-1][0] == out and not scatter[-1][2], where
                        scatter.pop()
                out += 1
            if fed:
                feedee[2] = True
                feedee[4] = cycle + 1 + rng.randint(0, write_time)
            if pulse:
                scatter.pop(0)
                durable_at = cycle
        stats["cycles"] = port.cycle
        stats["durable_pulses"] = durable_at is not None
        stats["ahead"] = len(ahead_for)
        stats["ahead_after"] = len(ahead_after)

    simulate(dut, bench)
    errors = port.errors + [e for r in rules for e in r.errors]
    assert not errors, "\n".join(errors[:10])
    compare(got, want)
    assert model.outstanding == (0, 0)
    stats["failed"] = len(port.faults.failed)
    return stats


@pytest.mark.parametrize("sequencers", [1, 2, 3])
@pytest.mark.parametrize("traffic, idle, bp", [(SMOOTH, 0.0, 0.0), (ROUGH, 0.3, 0.3)],
                         ids=["smooth", "rough"])
def test_rows_in_order_with_context(seed, sequencers, traffic, idle, bp):
    """Random descriptors: the merge's order, the rows' settings, the UPDATE gate."""
    stats = _run(seed, sequencers, n=40, idle=idle, bp=bp, traffic=traffic)
    print(stats)
    assert stats["durable_pulses"]
    if sequencers > 1:
        assert stats["overlap"], "no descriptor was taken while an earlier one streamed"


@pytest.mark.parametrize("updates", [2, 4])
@pytest.mark.parametrize("scratch_host", [False, True], ids=["pmem_scratch", "host_scratch"])
@pytest.mark.parametrize("sequencers", [1, 8])
def test_updates_of_apart_tables_overlap(seed, sequencers, scratch_host, updates):
    """Random UPDATEs only, writes that take up to 300 cycles: an UPDATE's rows go on
    while UPDATEs before it are still writing only when it is apart from each of them
    (checked on every row; gradients in PMEM count), fewer than ``updates`` of them,
    and some do (with ``updates`` 4, some with two or more before them: the random
    tables of 40 UPDATEs may not allow that, so up to four runs of 40, each checked in
    full, are drawn from the seed until one does)."""
    for attempt in range(4):
        stats = _run(seed + attempt, sequencers, n=40, idle=0.1, bp=0.1, traffic=SMOOTH,
                     updates_only=True, write_time=300, scratch_host=scratch_host,
                     updates=updates, slots=_SLOTS if updates == 2 else _MANY_SLOTS)
        print(f"run {attempt}: {stats}")
        if updates == 2 or stats["deepest"] >= 2:
            break
    assert stats["early_updates"], "no UPDATE overlapped the one before it"
    assert updates == 2 or stats["deepest"] >= 2, "no UPDATE overlapped two before it"
    assert stats["overlap_pulses"] >= stats["early_updates"], "update_overlap missed some"
    assert stats["ahead"] or not scratch_host, "no UPDATE's gradients offered ahead"
    assert stats["ahead_after"] or not scratch_host or sequencers == 1, (
        "no UPDATE's gradients offered ahead while the UPDATE before it ran")


@pytest.mark.parametrize("sequencers", [1, 3])
def test_read_errors(seed, sequencers):
    """Random descriptors, most of the good ones with a read error, rough traffic: the
    statuses (READ_ERROR for a failed pass-1 read, OK and ``read_error`` for pass 2)
    and the rows' ``bad`` as for one sequencer, each one's error kept to its own
    descriptor; a LOOKUP with ``capture_undo`` asks for the capture of its good rows
    only."""
    stats = _run(seed, sequencers, n=40, idle=0.3, bp=0.3, traffic=ROUGH, faults=0.7)
    print(stats)
    assert stats["failed"] and stats["durable_pulses"]
    assert stats["capture_good"] and stats["capture_bad"], "no bad or no good capture row"


@pytest.mark.parametrize("kwargs, message", [
    ({"addr_width": 24, "id_width": 4, "sequencers": 0}, "sequencers must be at least 1, not 0"),
    ({"addr_width": 24, "id_width": 2, "sequencers": 3},
     "id_width must be above 2 for 3 sequencers, not 2"),
    ({"addr_width": 24, "id_width": 4, "sequencers": 2, "updates": 0},
     "updates must be an integer from 1 to 16, not 0"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SequencerPool(**kwargs)


def test_verilog_lints_clean(tmp_path):
    dut = SequencerPool(addr_width=48, id_width=5, sequencers=3)
    assert_lints_clean(dut, "sequencer_pool_s3", tmp_path)
