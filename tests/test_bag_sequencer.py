# amaranth: UnusedElaboratable=no
"""BagSequencer (hw/engine/bag_sequencer.py): descriptors checked and bags emitted as
RowGather's per-row stream, compared with the golden models of ``sim/embedding.py``.

A :class:`TB` runs one Amaranth-simulator process that each cycle drives ``i_desc``
(random idle), the sinks' ``ready`` (random backpressure) and the AXI subordinate (a
:class:`tb.pmem.PmemModel` with jitter: random ``arready`` and random gaps before R
beats). Every ``o_rows`` and ``o_status`` transfer is recorded in one event list, which
must equal the expected one exactly: for each descriptor its rows (from
``sim.embedding.bags``, plus weights) followed by its status (``sim.embedding.validate``),
so a bad descriptor emitting any row, or a status before the last row, fails. Passive
checkers hold ``o_rows``, ``o_status`` and AR to the stream rules; the model rejects
4 KiB crossings. Random tests print their seed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest

from hw.engine.bag_sequencer import STATUS, BagSequencer
from hw.engine.descriptor import DescKind, PoolMode, Status, pack_descriptor
from hw.engine.row_gather import ROW
from sim.embedding import bags, lines_per_row, random_bags, validate
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import unpack
from .stream_rule import StreamRule

ADDR_WIDTH = 24
PMEM_SIZE = 1 << ADDR_WIDTH
#: Table and data regions: checked, never read by this block, so every case shares them.
TABLE_BASE = PMEM_SIZE // 2
DATA_ADDR = TABLE_BASE + PMEM_SIZE // 4
ONE = 0x3F800000
M32 = 0xFFFFFFFF


# --- descriptors, buffers and expected events ------------------------------------------

@dataclass
class Case:
    """One descriptor and the contents of its buffers (written where its fields say)."""
    fields: dict
    indices: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    weights: list[int] = field(default_factory=list)    # fp32 bit patterns

    def write(self, model: PmemModel) -> None:
        f = self.fields

        def put(addr, words):
            addr &= ~63
            data = b"".join((w & M32).to_bytes(4, "little") for w in words)
            if data and addr + len(data) <= model.size:
                model.write(addr, data)

        put(f.get("indices_addr", 0), self.indices)
        put(f.get("offsets_addr", 0), self.offsets)
        if f.get("weighted"):
            put(f.get("weights_addr", 0), self.weights)

    def expected(self) -> list[tuple]:
        """``("row", item)`` events, then ``("status", code)``."""
        f = self.fields
        kind = f.get("kind", 0)
        if kind not in (DescKind.LOOKUP.value, DescKind.UPDATE.value):
            # NOP, COMMIT, FENCE, MLP_CHECKPOINT are dispatched elsewhere.
            return [("status", Status.BAD_KIND.value)]
        ni, nb, ilo = f.get("num_indices", 0), f.get("num_bags", 0), f.get("include_last_offset", 0)
        idx = list(self.indices) + [0] * max(0, ni - len(self.indices))
        offs = list(self.offsets) + [0] * max(0, nb + ilo - len(self.offsets))
        status = validate(f, indices=np.array(idx, np.int64), offsets=np.array(offs, np.int64),
                          pmem_size=PMEM_SIZE)
        if status is not Status.OK:
            return [("status", status.value)]
        offs = np.array(offs[:nb + ilo], np.int64)
        pad = f["padding_idx"] if f.get("has_padding_idx") else None
        gold = bags(np.array(idx[:ni], np.int64), offs, ni, bool(ilo), pad)
        positions = bags(np.arange(ni), offs, ni, bool(ilo), None)
        events = []
        for want, pos in zip(gold, positions, strict=True):
            counted = [p for p in pos if pad is None or (idx[p] & M32) != (pad & M32)]
            assert [idx[p] & M32 for p in counted] == [v & M32 for v in want]
            n = len(counted)
            if not n:
                events.append(("row", {"row": 0, "row_k": 0, "last_row": 0, "weight": ONE,
                                       "empty_bag": 1, "count": 0}))
            for k, p in enumerate(counted):
                weight = self.weights[p] if f.get("weighted") else ONE
                events.append(("row", {"row": idx[p] & M32, "row_k": k,
                                       "last_row": int(k == n - 1), "weight": weight,
                                       "empty_bag": 0, "count": n}))
        events.append(("status", Status.OK.value))
        return events


class Alloc:
    """Random line-aligned, non-overlapping buffer addresses in the PMEM."""

    def __init__(self, rng: random.Random, start: int = 0):
        self.rng = rng
        self.next = start

    def __call__(self, nbytes: int) -> int:
        # Sometimes start a buffer a few lines before a 4 KiB boundary.
        if self.rng.random() < 0.3:
            page_end = (self.next // 4096 + 1) * 4096
            addr = page_end - 64 * self.rng.randint(1, 4)
            addr = max(addr, self.next)
        else:
            addr = self.next + 64 * self.rng.randint(0, 8)
        self.next = addr + (nbytes + 63) // 64 * 64 + 64
        assert self.next <= TABLE_BASE
        return addr


def random_case(rng: random.Random, alloc: Alloc) -> Case:
    """A valid LOOKUP / UPDATE over random bags (``sim.embedding.random_bags``)."""
    g = np.random.default_rng(rng.getrandbits(64))
    kind = rng.choice([DescKind.LOOKUP, DescKind.UPDATE])
    weighted = rng.random() < 0.4
    modes = [PoolMode.SUM] if weighted else [PoolMode.SUM, PoolMode.MEAN] + (
        [PoolMode.MAX] if kind is DescKind.LOOKUP else [])
    rows = rng.choice([1, 7, 300, 5000])
    has_pad = rng.random() < 0.5
    padding_idx = rng.choice([rng.randrange(rows), M32, rows + 3])
    ilo = int(rng.random() < 0.5)
    num_bags = rng.choice([0, 1, rng.randint(1, 6), rng.randint(5, 40)])
    indices, offsets = random_bags(
        g, num_bags, rows, pooling=rng.choice([1.0, 2.5, 5.0]),
        zipf_alpha=rng.choice([None, 1.2]), padding_idx=padding_idx if has_pad else None,
        empty_fraction=rng.choice([0.0, 0.2]), max_len=rng.choice([None, 20]),
        padding_fraction=rng.choice([0.1, 0.5]), include_last_offset=bool(ilo))
    indices = [int(v) & M32 for v in indices]
    if num_bags == 0 and not ilo and rng.random() < 0.5:
        indices = [rng.randrange(rows) for _ in range(rng.randint(1, 20))]  # in no bag
    offsets = [int(v) & M32 for v in offsets]
    weights = [int(w) for w in np.float32(g.normal(size=len(indices))).view(np.uint32)]
    dim = rng.choice([1, 16, 33])
    bf16 = int(rng.random() < 0.3)
    dtype = "bfloat16" if bf16 else np.float32
    table_bytes = rows * lines_per_row(dim, dtype) * 64
    data_bytes = num_bags * lines_per_row(dim, dtype if kind is DescKind.LOOKUP
                                          else np.float32) * 64
    fields = dict(
        kind=kind.value, mode=rng.choice(modes).value, weighted=int(weighted),
        has_padding_idx=int(has_pad), include_last_offset=ilo, bf16=bf16,
        capture_undo=rng.randrange(2), table_id=rng.getrandbits(16),
        batch_id=rng.getrandbits(32), dim=dim, rows=rows, padding_idx=padding_idx,
        num_bags=num_bags, num_indices=len(indices),
        indices_addr=alloc(4 * len(indices)), offsets_addr=alloc(4 * len(offsets)),
        weights_addr=alloc(4 * len(indices)), data_addr=DATA_ADDR, table_base=TABLE_BASE,
        cookie=rng.getrandbits(64))
    assert TABLE_BASE + table_bytes <= DATA_ADDR and DATA_ADDR + data_bytes <= PMEM_SIZE
    return Case(fields, indices, offsets, weights)


# --- bench ---------------------------------------------------------------------------

@dataclass
class Traffic:
    idle: float = 0.0       # i_desc valid withheld
    rows_bp: float = 0.0    # o_rows.ready low
    status_bp: float = 0.0  # o_status.ready low
    ar_bp: float = 0.0      # arready low
    r_idle: float = 0.0     # no R beat presented although one is due


SMOOTH = Traffic()
ROUGH = Traffic(idle=0.3, rows_bp=0.4, status_bp=0.3, ar_bp=0.3, r_idle=0.3)


class TB:
    """Clock, PMEM model as AXI subordinate, ``i_desc`` driver, sinks and checkers."""

    def __init__(self, *, seed: int, traffic: Traffic = SMOOTH, id_width: int = 3,
                 timing: PmemTiming | None = None):
        self.dut = BagSequencer(addr_width=ADDR_WIDTH, id_width=id_width)
        self.rng = random.Random(seed)
        self.model = PmemModel(size=PMEM_SIZE, rng=random.Random(seed + 1),
                               timing=timing or PmemTiming(read_latency=12, jitter=12))
        self.traffic = traffic
        #: Per descriptor: the cycle ``i_desc`` was taken, of its first ``o_rows``
        #: transfer (None if it has none) and of its ``o_status`` transfer.
        self.marks: list[dict] = []

    def run(self, cases: list[Case], *, max_cycles: int = 200_000) -> None:
        dut, model, rng, tr = self.dut, self.model, self.rng, self.traffic
        for c in cases:
            c.write(model)
        want = [e for c in cases for e in c.expected()]
        queue = [int.from_bytes(pack_descriptor(**c.fields), "little") for c in cases]
        got: list[tuple] = []
        checks = [StreamRule("o_rows"), StreamRule("o_status"), StreamRule("AR")]
        p = dut.pmem
        result = {}

        async def bench(ctx):
            cur = None
            beat = None
            cycle = 0
            statuses = 0
            while statuses < len(cases) and cycle < max_cycles:
                if cur is None and queue and not rng.random() < tr.idle:
                    cur = queue.pop(0)
                    ctx.set(dut.i_desc.payload.as_value(), cur)
                ctx.set(dut.i_desc.valid, cur is not None)
                ctx.set(dut.o_rows.ready, not rng.random() < tr.rows_bp)
                ctx.set(dut.o_status.ready, not rng.random() < tr.status_bp)
                ctx.set(p.arready, not rng.random() < tr.ar_bp)
                if beat is None and not rng.random() < tr.r_idle:
                    beat = model.r_beat(cycle)
                    if beat is not None:
                        rid, data, resp, last = beat
                        ctx.set(p.rid, rid)
                        ctx.set(p.rdata, data)
                        ctx.set(p.rresp, resp)
                        ctx.set(p.rlast, int(last))
                ctx.set(p.rvalid, beat is not None)
                (_, _, passed, d_ready, r_valid, r_ready, r_p, s_valid, s_ready, s_p, ar_valid,
                 ar_ready, ar_id, ar_addr, ar_len, ar_size, ar_burst, rready, awvalid,
                 wvalid) = await ctx.tick().sample(
                    dut.passed, dut.i_desc.ready, dut.o_rows.valid, dut.o_rows.ready,
                    dut.o_rows.payload.as_value(), dut.o_status.valid, dut.o_status.ready,
                    dut.o_status.payload.as_value(), p.arvalid, p.arready, p.arid, p.araddr,
                    p.arlen, p.arsize, p.arburst, p.rready, p.awvalid, p.wvalid)
                assert not awvalid and not wvalid, "the sequencer must not write"
                if cur is not None and d_ready:
                    cur = None
                    self.marks.append({"taken": cycle, "first_row": None})
                checks[0].observe(cycle, r_valid, r_ready, r_p)
                checks[1].observe(cycle, s_valid, s_ready, s_p)
                checks[2].observe(cycle, ar_valid, ar_ready,
                                  (ar_id, ar_addr, ar_len, ar_size, ar_burst))
                # ``passed`` is high while rows are offered, and only for a descriptor
                # that completes OK.
                assert passed or not r_valid, f"cycle {cycle}: a row without passed"
                if passed:
                    self.marks[-1]["passed"] = True
                if s_valid and s_ready and self.marks[-1].get("passed"):
                    assert unpack(STATUS, s_p)["status"] == Status.OK.value, (
                        f"cycle {cycle}: passed set for a descriptor that failed")
                if r_valid and r_ready:
                    got.append(("row", unpack(ROW, r_p)))
                    if self.marks[-1]["first_row"] is None:
                        self.marks[-1]["first_row"] = cycle
                if s_valid and s_ready:
                    got.append(("status", unpack(STATUS, s_p)["status"]))
                    self.marks[-1]["status"] = cycle
                    statuses += 1
                if ar_valid and ar_ready:
                    model.accept_ar(ar_id, ar_addr, ar_len, cycle, size=ar_size,
                                    burst=ar_burst)
                if beat is not None and rready:
                    model.r_accept(cycle)
                    beat = None
                cycle += 1
            # Idle afterwards: nothing more comes out, nothing is left in flight.
            for _ in range(20):
                ctx.set(dut.o_rows.ready, 1)
                ctx.set(dut.i_desc.valid, 0)
                _, _, r_valid, s_valid, ar_valid = await ctx.tick().sample(
                    dut.o_rows.valid, dut.o_status.valid, p.arvalid)
                assert not (r_valid or s_valid or ar_valid), "activity after the last status"
            result["cycles"] = cycle
            result["in_flight"] = model.outstanding

        simulate(dut, bench)
        errors = [e for c in checks for e in c.errors]
        assert not errors, "\n".join(errors[:10])
        compare(got, want)
        assert result["in_flight"] == (0, 0), f"reads left in flight: {result['in_flight']}"
        self.cycles = result["cycles"]
        print(f"{len(cases)} descriptors, {len(want)} events, {self.cycles} cycles")


def compare(got: list[tuple], want: list[tuple]) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            raise AssertionError(f"event {i} of {len(want)}: got {g}, expected {w}")
    assert len(got) == len(want), f"got {len(got)} events, expected {len(want)}"


# --- parameters ----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"addr_width": 11, "id_width": 4}, "addr_width must be an integer from 12 to 48, not 11"),
    ({"addr_width": 49, "id_width": 4}, "addr_width must be an integer from 12 to 48, not 49"),
    ({"addr_width": "30", "id_width": 4},
     "addr_width must be an integer from 12 to 48, not '30'"),
    ({"addr_width": 30, "id_width": 1}, "id_width must be an integer from 2 to 16, not 1"),
    ({"addr_width": 30, "id_width": 17}, "id_width must be an integer from 2 to 16, not 17"),
    ({"addr_width": 30, "id_width": True}, "id_width must be an integer from 2 to 16, not True"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        BagSequencer(**kwargs)


def test_parameters_are_read_only_properties():
    dut = BagSequencer(addr_width=30, id_width=6)
    assert (dut.addr_width, dut.id_width) == (30, 6)
    with pytest.raises(AttributeError):
        dut.addr_width = 31


def test_lints_clean(tmp_path):
    assert_lints_clean(BagSequencer(addr_width=30, id_width=6), "bag_sequencer_a30_i6", tmp_path)
    assert_lints_clean(BagSequencer(addr_width=12, id_width=2), "bag_sequencer_a12_i2", tmp_path)


# --- random descriptors --------------------------------------------------------------

@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
def test_random_descriptors(seed, traffic):
    rng = random.Random(seed)
    alloc = Alloc(rng)
    cases = [random_case(rng, alloc) for _ in range(40)]
    TB(seed=seed, traffic=traffic).run(cases)


# --- crafted bad descriptors, one test per status code -------------------------------

def base_case(alloc: Alloc, room: int = 64, **changes) -> Case:
    """A valid weighted LOOKUP: 4 bags (one empty, one of padding only), padding on;
    ``room`` bytes for each of its index, offset and weight buffers."""
    indices = [3, 5, 3, 9, 9, 1, 0]
    offsets = [0, 3, 3, 5]        # bags [3 5 3] [] [9 9] [1 0]
    fields = dict(kind=DescKind.LOOKUP.value, mode=PoolMode.SUM.value, weighted=1,
                  has_padding_idx=1, padding_idx=9, dim=20, rows=10, num_bags=4,
                  num_indices=len(indices))
    fields.update(indices_addr=alloc(room), offsets_addr=alloc(room),
                  weights_addr=alloc(room), data_addr=DATA_ADDR, table_base=TABLE_BASE)
    fields.update(changes)
    weights = [0x3F000000 + 0x1000 * i for i in range(len(indices))]
    return Case(fields, indices, offsets, weights)


def with_buffers(case: Case, indices=None, offsets=None) -> Case:
    if indices is not None:
        case.indices = list(indices)
        case.weights = [0x40000000 + i for i in range(len(indices))]
        case.fields["num_indices"] = len(indices)
    if offsets is not None:
        case.offsets = list(offsets)
    return case


def crafted(status: Status, alloc: Alloc) -> list[tuple[Case, Status]]:
    """(case, status it must complete with) for one status code; some are OK on
    purpose (a field that looks bad but is exempt)."""
    b = lambda room=64, **kw: base_case(alloc, room, **kw)
    S = Status
    top = PMEM_SIZE
    if status is S.BAD_KIND:
        return [(b(kind=k), S.BAD_KIND) for k in (0, 3, 4, 5, 6, 255)] + [
            (b(kind=7, mode=3, table_base=4), S.BAD_KIND)]      # before the field checks
    if status is S.UNSUPPORTED:
        return [(b(rsvd_flag=1), S.UNSUPPORTED), (b(mode=3, weighted=0), S.UNSUPPORTED),
                (b(dim=0), S.UNSUPPORTED), (b(dim=4097), S.UNSUPPORTED),
                (b(dim=4096), S.OK),
                (b(mode=PoolMode.MEAN.value), S.UNSUPPORTED),
                (b(mode=PoolMode.MAX.value), S.UNSUPPORTED),
                (b(kind=DescKind.UPDATE.value, mode=PoolMode.MAX.value, weighted=0),
                 S.UNSUPPORTED),
                (b(kind=DescKind.UPDATE.value, mode=PoolMode.MEAN.value, weighted=0), S.OK),
                (b(mode=3, indices_addr=top + 64), S.UNSUPPORTED)]  # before MISALIGNED
    if status is S.MISALIGNED:
        return [(b(table_base=b().fields["table_base"] + 4), S.MISALIGNED),
                (b(indices_addr=b().fields["indices_addr"] + 32), S.MISALIGNED),
                (b(offsets_addr=b().fields["offsets_addr"] + 1), S.MISALIGNED),
                (b(data_addr=b().fields["data_addr"] + 8), S.MISALIGNED),
                (b(weights_addr=b().fields["weights_addr"] + 4), S.MISALIGNED),
                (b(weights_addr=3, weighted=0), S.OK),     # ignored without weights
                (b(offsets_addr=top + 4), S.MISALIGNED)]   # before ADDR_RANGE
    if status is S.ADDR_RANGE:
        return [(b(rows=1 << 31), S.ADDR_RANGE),
                (b(table_base=top - 64 * 19), S.ADDR_RANGE),    # 10 rows x 2 lines
                (b(table_base=top - 64 * 20), S.OK),
                (b(indices_addr=top - 64, num_indices=17), S.ADDR_RANGE),
                (b(offsets_addr=top - 64, num_bags=16, include_last_offset=1),
                 S.ADDR_RANGE),
                (b(data_addr=top - 64 * 4 * 2 + 64), S.ADDR_RANGE),   # 4 bags x 2 lines
                (b(data_addr=top - 64 * 4 * 2, bf16=1, dim=64), S.OK),
                (b(weights_addr=top - 16), S.MISALIGNED),
                (b(weights_addr=top), S.ADDR_RANGE),
                (b(weights_addr=top, weighted=0), S.OK),
                (with_buffers(b(num_bags=0, num_indices=0, indices_addr=top), offsets=[]),
                 S.OK),                                       # empty region at the end
                (with_buffers(b(num_bags=0, num_indices=0, indices_addr=top + 64),
                              offsets=[]), S.ADDR_RANGE),
                (with_buffers(b(indices_addr=(1 << 48) - 64), offsets=[1, 0, 0, 0]),
                 S.ADDR_RANGE)]                               # before BAD_OFFSETS
    if status is S.BAD_OFFSETS:
        return [(with_buffers(b(), offsets=[1, 3, 3, 5]), S.BAD_OFFSETS),
                (with_buffers(b(), offsets=[0, 3, 2, 5]), S.BAD_OFFSETS),
                (with_buffers(b(), offsets=[0, 3, 0x80000000, 5]), S.BAD_OFFSETS),
                (with_buffers(b(), offsets=[0, 3, 3, 8]), S.BAD_OFFSETS),
                (with_buffers(b(), offsets=[0, 3, 3, 7]), S.OK),
                (with_buffers(b(include_last_offset=1), offsets=[0, 3, 3, 5, 6]),
                 S.BAD_OFFSETS),
                (with_buffers(b(include_last_offset=1), offsets=[0, 3, 3, 5, 7]), S.OK),
                (with_buffers(b(include_last_offset=1, num_bags=0), offsets=[0]),
                 S.BAD_OFFSETS),
                (with_buffers(b(), indices=[3, 5, 99, 9, 9, 1, 0], offsets=[0, 3, 3, 9]),
                 S.BAD_OFFSETS)]                              # before INDEX_RANGE
    assert status is S.INDEX_RANGE
    long = [1] * 2000
    return [(with_buffers(b(), indices=[3, 5, 3, 10, 9, 1, 0]), S.INDEX_RANGE),
            (with_buffers(b(), indices=[3, 5, 3, M32, 9, 1, 0]), S.INDEX_RANGE),
            (with_buffers(b(padding_idx=M32), indices=[3, 5, 3, M32, 10, 1, 0]),
             S.INDEX_RANGE),
            (with_buffers(b(padding_idx=M32), indices=[3, 5, 3, M32, 8, 1, 0]), S.OK),
            (with_buffers(b(padding_idx=100), indices=[3, 5, 100, 100, 100, 1, 0]), S.OK),
            (with_buffers(b(has_padding_idx=0), indices=[3, 5, 3, 9, 9, 1, 0]), S.OK),
            (with_buffers(b(), indices=[0, 1, 2, 3, 4, 5, 0x80000000]), S.INDEX_RANGE),
            (with_buffers(b(num_bags=0), indices=[1, 2, 10], offsets=[]), S.INDEX_RANGE),
            (with_buffers(b(num_bags=0), indices=[1, 2, 8], offsets=[]), S.OK),
            # A bad index early in a long buffer: the block stops reading it and drains.
            (with_buffers(b(room=8192), indices=[10, *long], offsets=[0, 1, 1, 1500]),
             S.INDEX_RANGE),
            (with_buffers(b(room=8192), indices=long, offsets=[0, 1, 1, 1500]), S.OK)]


#: Statuses the sequencer itself reports (LOG_FULL and BAD_BATCH come from the engine's
#: checkpoint rules, docs/checkpoint.md).
SEQUENCER_STATUSES = [s for s in Status if s not in (Status.OK, Status.LOG_FULL,
                                                     Status.BAD_BATCH)]


@pytest.mark.parametrize("status", SEQUENCER_STATUSES, ids=lambda s: s.name)
def test_crafted_status(seed, status):
    rng = random.Random(seed)
    alloc = Alloc(rng, start=0)
    cases = []
    for case, want in crafted(status, alloc):
        got = case.expected()[-1][1]
        assert got == want.value, (f"crafted case {case.fields} is {Status(got).name} for "
                                   f"the golden model, not {want.name}")
        cases.append(case)
        cases.append(base_case(alloc))      # a good descriptor after each one
    TB(seed=seed, traffic=ROUGH).run(cases)


# --- the 16 lanes of pass 1 ----------------------------------------------------------

#: 3 whole lines of indices and a last line of 5; offsets of 40 bags, 2.5 lines.
LANE_INDICES = 53
LANE_BAGS = 40
LANE_ROWS = 1000


def lane_case(alloc: Alloc, rng: random.Random, *, ilo: int = 0, pad: int | None = None,
              indices=None, offsets=None) -> Case:
    """A weighted LOOKUP of ``LANE_BAGS`` bags over ``LANE_INDICES`` indices, each buffer
    followed by junk up to the end of its last line (past the buffer: never checked)."""
    num_offsets = LANE_BAGS + ilo
    if indices is None:
        indices = [rng.randrange(LANE_ROWS) for _ in range(LANE_INDICES)]
    if offsets is None:
        offsets = sorted([0] + [rng.randint(0, LANE_INDICES) for _ in range(LANE_BAGS - 1)])
        offsets += [LANE_INDICES] * ilo
    assert len(indices) == LANE_INDICES and len(offsets) == num_offsets
    junk = [M32, 0x80000000, LANE_ROWS, 0]
    indices = list(indices) + [rng.choice(junk) for _ in range(-LANE_INDICES % 16)]
    offsets = list(offsets) + [rng.choice(junk) for _ in range(-num_offsets % 16)]
    weights = [0x3F000000 + 0x100 * i for i in range(len(indices))]
    fields = dict(kind=DescKind.LOOKUP.value, mode=PoolMode.SUM.value, weighted=1,
                  has_padding_idx=int(pad is not None), padding_idx=pad or 0,
                  include_last_offset=ilo, dim=16, rows=LANE_ROWS, num_bags=LANE_BAGS,
                  num_indices=LANE_INDICES, indices_addr=alloc(4 * len(indices)),
                  offsets_addr=alloc(4 * len(offsets)), weights_addr=alloc(4 * len(indices)),
                  data_addr=DATA_ADDR, table_base=TABLE_BASE)
    return Case(fields, indices, offsets, weights)


def lane_cases(alloc: Alloc, rng: random.Random) -> list[tuple[Case, Status]]:
    """Bad and exempt words in every lane of a whole line and of a last partial line."""
    S = Status
    out = []
    bad_values = [LANE_ROWS, LANE_ROWS + 12345, M32, 0x80000000, 0x7FFFFFFF]
    # INDEX_RANGE at every position (lanes 0..15 of lines 0..2, lanes 0..4 of line 3).
    for p in range(LANE_INDICES):
        c = lane_case(alloc, rng)
        c.indices[p] = bad_values[p % len(bad_values)]
        out.append((c, S.INDEX_RANGE))
    # The padding index in every lane (all indices, and all but one bad one), with a
    # padding index that is not a valid row.
    for pad in (M32, LANE_ROWS + 7):
        out.append((lane_case(alloc, rng, pad=pad, indices=[pad] * LANE_INDICES), S.OK))
        for p in (0, 7, 15, 16, 31, 47, 48, 52):
            indices = [pad] * LANE_INDICES
            indices[p] = pad + 1 if pad != M32 else LANE_ROWS
            out.append((lane_case(alloc, rng, pad=pad, indices=indices), S.INDEX_RANGE))
        indices = [rng.choice([pad, rng.randrange(LANE_ROWS)]) for _ in range(LANE_INDICES)]
        out.append((lane_case(alloc, rng, pad=pad, indices=indices), S.OK))
    # BAD_OFFSETS: a decrease at every position (lane 0 of a line compares with the
    # last offset of the line before), an offset past num_indices, a negative one.
    for ilo in (0, 1):
        num_offsets = LANE_BAGS + ilo
        for p in range(1, num_offsets):
            offsets = [min(LANE_INDICES, i) for i in range(num_offsets)]
            offsets[p] = offsets[p - 1] - 1 if offsets[p - 1] else M32
            out.append((lane_case(alloc, rng, ilo=ilo, offsets=offsets), S.BAD_OFFSETS))
        for p in (1, 15, 16, 17, 31, 32, num_offsets - 1):
            offsets = [min(LANE_INDICES, i) for i in range(num_offsets)]
            offsets[p:] = [LANE_INDICES + 1] * (num_offsets - p)
            out.append((lane_case(alloc, rng, ilo=ilo, offsets=offsets), S.BAD_OFFSETS))
            offsets[p:] = [0x80000000 + p] * (num_offsets - p)
            out.append((lane_case(alloc, rng, ilo=ilo, offsets=offsets), S.BAD_OFFSETS))
        # Offsets equal across a line boundary, and offsets[0] other than 0.
        offsets = [0] * 16 + [LANE_INDICES] * (num_offsets - 16)
        out.append((lane_case(alloc, rng, ilo=ilo, offsets=offsets), S.OK))
        offsets = [1] + [LANE_INDICES] * (num_offsets - 1)
        out.append((lane_case(alloc, rng, ilo=ilo, offsets=offsets), S.BAD_OFFSETS))
    # include_last_offset: the last offset in lane 15 and in lane 0 of a line.
    for num_bags in (15, 16, 31, 32):
        for last, want in ((LANE_INDICES, S.OK), (LANE_INDICES - 1, S.BAD_OFFSETS)):
            offsets = [min(LANE_INDICES, i) for i in range(num_bags)] + [last]
            c = lane_case(alloc, rng, ilo=1, offsets=[0] * (LANE_BAGS + 1))
            c.fields["num_bags"] = num_bags
            c.offsets = offsets + [M32] * (-len(offsets) % 16)
            out.append((c, want))
    # A bad offset and a bad index: the offsets win.
    c = lane_case(alloc, rng, offsets=[0] * 20 + [5, 4] + [LANE_INDICES] * 18)
    c.indices[20] = M32
    out.append((c, S.BAD_OFFSETS))
    return out


@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
def test_lane_checks(seed, traffic):
    rng = random.Random(seed)
    alloc = Alloc(rng)
    cases = []
    for case, want in lane_cases(alloc, rng):
        got = case.expected()[-1][1]
        assert got == want.value, (f"lane case {case.fields} is {Status(got).name} for "
                                   f"the golden model, not {want.name}")
        cases.append(case)
    rng.shuffle(cases)
    TB(seed=seed, traffic=traffic).run(cases)


# --- throughput (printed figures, not asserted) --------------------------------------

def bench_case(alloc: Alloc, *, bag_len: int, num_bags: int, weighted: bool,
               bad_last: bool = False) -> Case:
    """A LOOKUP of ``num_bags`` bags of ``bag_len`` indices, dim 64 fp32 (4 lines a row);
    with ``bad_last`` its very last index is out of range (so it fails after reading
    every index: its status time is pass 1's)."""
    rows = 5000
    ni = bag_len * num_bags
    indices = [(i * 7919) % rows for i in range(ni)]
    if bad_last:
        indices[-1] = rows
    offsets = [b * bag_len for b in range(num_bags)]
    weights = [0x3F000000 + i for i in range(ni)]
    fields = dict(kind=DescKind.LOOKUP.value, mode=PoolMode.SUM.value,
                  weighted=int(weighted), dim=64, rows=rows, num_bags=num_bags,
                  num_indices=ni, indices_addr=alloc(4 * ni), offsets_addr=alloc(4 * num_bags),
                  weights_addr=alloc(4 * ni), data_addr=DATA_ADDR, table_base=TABLE_BASE)
    return Case(fields, indices, offsets, weights)


@pytest.mark.long
def test_throughput(seed):
    """Pass 1 of a 128 x 20 LOOKUP (its status time when its last index is bad, and its
    first row's time when good), and rows/cycle overall for 4000 weighted indices in
    bags of 50, 4 and 1, at PMEM read latency 120 and no backpressure."""
    rng = random.Random(seed)
    alloc = Alloc(rng)
    cases = [bench_case(alloc, bag_len=20, num_bags=128, weighted=False, bad_last=True),
             bench_case(alloc, bag_len=20, num_bags=128, weighted=False)]
    cases += [bench_case(alloc, bag_len=n, num_bags=4000 // n, weighted=True)
              for n in (50, 4, 1)]
    tb = TB(seed=seed, timing=PmemTiming(read_latency=120))
    tb.run(cases)
    pass1, good, *rates = tb.marks
    print(f"2560 indices, L=120: pass 1 {pass1['status'] - pass1['taken']} cycles "
          f"(INDEX_RANGE on the last index); first row after "
          f"{good['first_row'] - good['taken']} cycles")
    for n, mark in zip((50, 4, 1), rates, strict=True):
        cycles = mark["status"] - mark["taken"]
        print(f"bags of {n}: 4000 rows in {cycles} cycles, {4000 / cycles:.2f} rows/cycle")
