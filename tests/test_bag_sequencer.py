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

Read errors (:class:`Fault`): chosen reads of chosen buffer lines are answered with
SLVERR or DECERR (:class:`tests.axi_pmem.ReadErrors`). A failed read in pass 1 must end
the descriptor with READ_ERROR and no row; one in pass 2 must leave the rows as they
are but mark them ``bad`` from the rows the failed line feeds on (and at least the
last row), the status OK with ``read_error``; the next descriptor is clean.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest

from hw.bus.axi import AxiResp
from hw.engine.bag_sequencer import STATUS, BagSequencer
from hw.engine.descriptor import DescKind, PoolMode, Status, pack_descriptor
from hw.engine.row_gather import ROW
from sim.embedding import bags, lines_per_row, random_bags, validate
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .axi_pmem import ReadErrors
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
LINE_WORDS = 16
#: An expected ``bad`` of a row that may be 0 or 1 (before the rows a failed read
#: feeds: the flag may come early, never late; :func:`compare` checks it never falls).
MAYBE = "0 or 1"


# --- descriptors, buffers and expected events ------------------------------------------

@dataclass(frozen=True)
class Fault:
    """Read errors on line ``line`` of buffer ``buffer`` (``"offsets"``, ``"indices"``
    or ``"weights"``): the reads of that line numbered in ``reads`` (0 its first read)
    are answered with ``resp``, carrying ``data`` (``"keep"``: the line's own data;
    ``"ones"``, ``"zero"`` or ``"random"``).

    The reads of a line of a descriptor that passes its field checks: offsets, 0 in
    pass 1 and 1 in pass 2; indices, 0 in pass 1 and 1, 2 in pass 2 (the emitter's and
    the count scan's copies, in either order); weights, 0 in pass 2 only (if
    ``weighted``). Pass 2 reads only the offsets of ``num_bags`` (not the last one of
    ``include_last_offset``), and only when ``num_bags`` > 0. A descriptor whose offsets
    and indices (pass 1's lines) fit in the replay store makes no pass-2 read of them.
    """
    buffer: str
    line: int
    reads: frozenset = frozenset({0})
    data: str = "keep"
    resp: int = AxiResp.SLVERR


def lines_of(words: int) -> int:
    return (words + LINE_WORDS - 1) // LINE_WORDS


@dataclass
class Case:
    """One descriptor and the contents of its buffers (written where its fields say),
    and the read errors of its buffers' lines (``faults``). ``garbage``: a pass-2 fault
    carries other data than the line's, so its rows are not predicted (only that some
    come, the last one ``bad``)."""
    fields: dict
    indices: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    weights: list[int] = field(default_factory=list)    # fp32 bit patterns
    faults: list[Fault] = field(default_factory=list)
    #: Lines of the sequencer's replay store (set by the bench; 0: none).
    replay: int = 0

    @property
    def replayed(self) -> bool:
        """Pass 2 takes the offsets and indices from the replay store: pass 1's lines of
        both fit in it."""
        f = self.fields
        ni, nb = f.get("num_indices", 0), f.get("num_bags", 0)
        return self.replay > 0 and (lines_of(nb + f.get("include_last_offset", 0))
                                    + lines_of(ni)) <= self.replay

    def fault_lines(self) -> dict[int, Fault]:
        """Line address -> fault."""
        return {(self.fields.get(f"{f.buffer}_addr", 0) & ~63) + 64 * f.line: f
                for f in self.faults}

    def read_fault(self, status: Status) -> tuple[str | None, list[Fault]]:
        """Where the faults act for a descriptor the golden model completes with
        ``status``: ``("pass1", faults)`` (READ_ERROR), ``("pass2", faults)`` (rows
        ``bad``, ``read_error``) or ``(None, [])`` (no failed read is ever made)."""
        f = self.fields
        ni, nb = f.get("num_indices", 0), f.get("num_bags", 0)
        ilo = f.get("include_last_offset", 0)
        S = Status
        if status not in (S.OK, S.BAD_OFFSETS, S.INDEX_RANGE):
            return None, []     # failed a field check: no read at all
        first_bad_line = None
        if status is S.INDEX_RANGE:
            idx = list(self.indices) + [0] * max(0, ni - len(self.indices))
            pad = f.get("padding_idx", 0) & M32 if f.get("has_padding_idx") else None
            for p in range(ni):
                v = idx[p] & M32
                if v != pad and (v >= 1 << 31 or v >= f.get("rows", 0)):
                    first_bad_line = p // LINE_WORDS
                    break
        pass1, pass2 = [], []
        for fault in self.faults:
            if fault.buffer == "offsets":
                if 0 in fault.reads and fault.line < lines_of(nb + ilo):
                    pass1.append(fault)
                if 1 in fault.reads and nb and fault.line < lines_of(nb) and not self.replayed:
                    pass2.append(fault)
            elif fault.buffer == "indices":
                if 0 in fault.reads and fault.line < lines_of(ni):
                    pass1.append(fault)
                if (fault.reads & {1, 2} and nb and fault.line < lines_of(ni)
                        and not self.replayed):
                    pass2.append(fault)
            else:
                assert fault.buffer == "weights", fault
                if 0 in fault.reads and f.get("weighted") and nb and fault.line < lines_of(ni):
                    pass2.append(fault)
        if status is not S.OK:
            # Only the reads every run makes before the check fails: the first offsets
            # line, and the indices up to the first bad one.
            certain = [x for x in pass1 if (x.buffer, x.line) == ("offsets", 0) or (
                x.buffer == "indices" and first_bad_line is not None
                and x.line <= first_bad_line)]
            assert certain == pass1, f"faults {pass1} may or may not be read for {status}"
            return ("pass1", pass1) if pass1 else (None, [])
        if pass1:
            return "pass1", pass1
        return ("pass2", pass2) if pass2 else (None, [])

    @property
    def garbage(self) -> bool:
        return any(x.data != "keep" for x in self.read_fault(self.golden_status())[1])

    def golden_status(self) -> Status:
        f = self.fields
        kind = f.get("kind", 0)
        if kind not in (DescKind.LOOKUP.value, DescKind.UPDATE.value):
            return Status.BAD_KIND
        ni, nb, ilo = f.get("num_indices", 0), f.get("num_bags", 0), f.get("include_last_offset", 0)
        idx = list(self.indices) + [0] * max(0, ni - len(self.indices))
        offs = list(self.offsets) + [0] * max(0, nb + ilo - len(self.offsets))
        return validate(f, indices=np.array(idx, np.int64), offsets=np.array(offs, np.int64),
                        pmem_size=PMEM_SIZE)

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
        """``("row", item)`` events, then ``("status", {"status": code, "read_error":
        bit})``; with garbage pass-2 data ``("rows",)`` (any rows) for the rows."""
        f = self.fields
        # NOP, COMMIT, FENCE, MLP_CHECKPOINT are dispatched elsewhere (BAD_KIND).
        status = self.golden_status()
        where, faults = self.read_fault(status)
        if where == "pass1":
            # ``read_error`` is documented for pass 2; with READ_ERROR it is moot (the
            # block sets it: the failed read is the same flag).
            return [("status", {"status": Status.READ_ERROR.value, "read_error": MAYBE})]
        if status is not Status.OK:
            return [("status", {"status": status.value, "read_error": 0})]
        if where == "pass2" and self.garbage:
            return [("rows",), ("status", {"status": Status.OK.value, "read_error": 1})]
        ni, nb, ilo = f.get("num_indices", 0), f.get("num_bags", 0), f.get("include_last_offset", 0)
        idx = list(self.indices) + [0] * max(0, ni - len(self.indices))
        offs = list(self.offsets) + [0] * max(0, nb + ilo - len(self.offsets))
        offs = np.array(offs[:nb + ilo], np.int64)
        pad = f["padding_idx"] if f.get("has_padding_idx") else None
        gold = bags(np.array(idx[:ni], np.int64), offs, ni, bool(ilo), pad)
        positions = bags(np.arange(ni), offs, ni, bool(ilo), None)
        events = []
        bag_of, position = [], []          # per row event: its bag, its index position
        for b, (want, pos) in enumerate(zip(gold, positions, strict=True)):
            counted = [p for p in pos if pad is None or (idx[p] & M32) != (pad & M32)]
            assert [idx[p] & M32 for p in counted] == [v & M32 for v in want]
            n = len(counted)
            if not n:
                events.append(("row", {"row": 0, "row_k": 0, "last_row": 0, "weight": ONE,
                                       "empty_bag": 1, "count": 0, "bad": 0}))
                bag_of.append(b)
                position.append(-1)
            for k, p in enumerate(counted):
                weight = self.weights[p] if f.get("weighted") else ONE
                events.append(("row", {"row": idx[p] & M32, "row_k": k,
                                       "last_row": int(k == n - 1), "weight": weight,
                                       "empty_bag": 0, "count": n, "bad": 0}))
                bag_of.append(b)
                position.append(p)
        read_error = int(where == "pass2")
        if read_error:
            # The rows the failed line feeds on, and every later one, must be bad; before
            # them the flag may already be up (a line that feeds no row -- padding
            # after the last row -- shows only in the status).
            first = len(events)
            for x in faults:
                if x.buffer == "offsets":
                    # Word j of the offsets ends bag j - 1: the scan sends that bag
                    # only once the word is in (word 0 is taken before bag 0).
                    bag = max(0, LINE_WORDS * x.line - 1)
                    first = min(first, bag_of.index(bag))
                else:
                    # The row of an index at or past the line's first word is made
                    # only once that word is in (either copy of the indices).
                    later = [k for k, p in enumerate(position) if p >= LINE_WORDS * x.line]
                    if later:
                        first = min(first, later[0])
            for k, (_, row) in enumerate(events):
                row["bad"] = 1 if k >= first else MAYBE
        events.append(("status", {"status": Status.OK.value, "read_error": read_error}))
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
                 timing: PmemTiming | None = None, hold_rows: bool = False,
                 replay_lines: int = 0):
        self.dut = BagSequencer(addr_width=ADDR_WIDTH, id_width=id_width,
                                replay_lines=replay_lines)
        self.replay_lines = replay_lines
        #: ``o_rows.ready`` held low until a read has failed.
        self.hold_rows = hold_rows
        self.seed = seed
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
            c.replay = self.replay_lines
        want = [e for c in cases for e in c.expected()]
        # (its own random data: the traffic of a seed is the same with or without faults)
        self.faults = faults = read_errors(cases, random.Random(self.seed + 2))
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
                held = self.hold_rows and not faults.failed
                ctx.set(dut.o_rows.ready, not (held or rng.random() < tr.rows_bp))
                ctx.set(dut.o_status.ready, not rng.random() < tr.status_bp)
                ctx.set(p.arready, not rng.random() < tr.ar_bp)
                if beat is None and not rng.random() < tr.r_idle:
                    beat = faults.beat(model.r_beat(cycle))
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
                    got.append(("status", unpack(STATUS, s_p)))
                    self.marks[-1]["status"] = cycle
                    statuses += 1
                if ar_valid and ar_ready:
                    model.accept_ar(ar_id, ar_addr, ar_len, cycle, size=ar_size,
                                    burst=ar_burst)
                    faults.accept_ar(ar_id, ar_addr, ar_len)
                if beat is not None and rready:
                    model.r_accept(cycle)
                    beat = None
                cycle += 1
            assert statuses == len(cases), (
                f"{statuses} of {len(cases)} statuses after {cycle} cycles (hang)")
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
        self.events = got
        print(f"{len(cases)} descriptors, {len(want)} events, {self.cycles} cycles, "
              f"{len(faults.failed)} reads failed")


def read_errors(cases: list[Case], rng: random.Random) -> ReadErrors:
    """The injector of ``cases``' faults (their lines never overlap)."""
    lines: dict[int, Fault] = {}
    for c in cases:
        for line, fault in c.fault_lines().items():
            assert line not in lines, f"two faults on line {line:#x}"
            lines[line] = fault
    ones = (1 << 512) - 1

    def fail(line, n):
        fault = lines.get(line)
        return fault.resp if fault is not None and n in fault.reads else 0

    def data(line, n, data):
        mode = lines[line].data
        if mode == "random":
            return rng.getrandbits(512)
        return {"keep": data, "ones": ones, "zero": 0}[mode]

    return ReadErrors(fail=fail, data=data)


def _descriptors(events: list[tuple]) -> list[list[tuple]]:
    """``events`` cut after each status."""
    out, cur = [], []
    for e in events:
        cur.append(e)
        if e[0] == "status":
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def _matches(got, want) -> bool:
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(
            (w == MAYBE and g in (0, 1)) or _matches(g, w) for g, w in zip(
                (got[k] for k in want), want.values(), strict=True))
    if isinstance(want, tuple) and isinstance(got, tuple) and len(got) == len(want):
        return all(_matches(g, w) for g, w in zip(got, want, strict=True))
    return got == want


def _shape(event: tuple) -> tuple:
    """A row without its ``row`` and ``weight``: what a ``bad`` row must still match
    (after a failed pass-2 read a bag's rows are its first ``count`` indices, whatever
    their values: only their place in the bag is defined)."""
    return event[0], {k: v for k, v in event[1].items() if k not in ("row", "weight")}


def compare(got: list[tuple], want: list[tuple]) -> None:
    """Events of each descriptor (up to its status) as expected: a ``bad`` of
    :data:`MAYBE` may be 0 or 1, a row that came ``bad`` is compared without its
    ``row`` and ``weight`` (:func:`_shape`); ``("rows",)`` stands for any rows, at
    least one. ``bad`` never falls within a descriptor."""
    got_d, want_d = _descriptors(got), _descriptors(want)
    i = 0
    for n, (g, w) in enumerate(zip(got_d, want_d, strict=False)):
        where = f"descriptor {n} of {len(want_d)} (event {i})"
        if w[0] == ("rows",):
            rows = g[:-1]
            assert rows and all(e[0] == "row" for e in rows), f"{where}: got {g[:3]}..."
            assert _matches(g[-1], w[-1]), f"{where}: got {g[-1]}, expected {w[-1]}"
        else:
            for k, (ge, we) in enumerate(zip(g, w, strict=False)):
                if ge[0] == we[0] == "row" and ge[1]["bad"] == 1:
                    ge, we = _shape(ge), _shape(we)
                if not _matches(ge, we):
                    raise AssertionError(f"{where}, its event {k}: got {ge}, expected {we}")
            assert len(g) == len(w), f"{where}: got {len(g)} events, expected {len(w)}"
        bad = [e[1]["bad"] for e in g if e[0] == "row"]
        assert bad == sorted(bad), f"{where}: bad falls within the rows: {bad}"
        i += len(g)
    assert len(got_d) == len(want_d), (
        f"got {len(got_d)} descriptors' events, expected {len(want_d)}")


# --- parameters ----------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"addr_width": 11, "id_width": 4}, "addr_width must be an integer from 12 to 48, not 11"),
    ({"addr_width": 49, "id_width": 4}, "addr_width must be an integer from 12 to 48, not 49"),
    ({"addr_width": "30", "id_width": 4},
     "addr_width must be an integer from 12 to 48, not '30'"),
    ({"addr_width": 30, "id_width": 1}, "id_width must be an integer from 2 to 16, not 1"),
    ({"addr_width": 30, "id_width": 17}, "id_width must be an integer from 2 to 16, not 17"),
    ({"addr_width": 30, "id_width": True}, "id_width must be an integer from 2 to 16, not True"),
    ({"addr_width": 30, "id_width": 4, "replay_lines": 1},
     "replay_lines must be an integer from 2 to 4096, not 1"),
    ({"addr_width": 30, "id_width": 4, "replay_lines": 24},
     "replay_lines must be a power of two, not 24"),
    ({"addr_width": 30, "id_width": 4, "replay_lines": 8192},
     "replay_lines must be an integer from 0 to 4096, not 8192"),
    ({"addr_width": 30, "id_width": 4, "replay_lines": 16.0},
     "replay_lines must be an integer from 0 to 4096, not 16.0"),
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
@pytest.mark.parametrize("replay", [0, 8])
def test_random_descriptors(seed, traffic, replay):
    rng = random.Random(seed)
    alloc = Alloc(rng)
    cases = [random_case(rng, alloc) for _ in range(40)]
    TB(seed=seed, traffic=traffic, replay_lines=replay).run(cases)


@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
def test_replay_reads_buffers_once(seed, traffic):
    """With a replay store of 8 lines, a descriptor that passes and whose offsets and
    indices fit in 8 lines reads each of their lines from memory exactly once (pass 1),
    and pass 2 takes them from the store (rows checked as always); one that does not
    fit reads them as without the store: the offsets twice, the indices three times.
    Both kinds occur."""
    rng = random.Random(seed)
    alloc = Alloc(rng)
    cases = [random_case(rng, alloc) for _ in range(40)]

    def kinds() -> set[bool]:
        """Of the good descriptors with bags: whether each fits in the 8-line store."""
        return {lines_of(c.fields["num_bags"] + c.fields["include_last_offset"])
                + lines_of(c.fields["num_indices"]) <= 8
                for c in cases if c.fields["num_bags"] and c.golden_status() is Status.OK}

    while len(kinds()) < 2 and len(cases) < 200:      # rare: one kind missing
        cases.append(random_case(rng, alloc))
    tb = TB(seed=seed, traffic=traffic, replay_lines=8)
    tb.run(cases)
    seen = Counter()
    for c in cases:
        f = c.fields
        nb, ni = f.get("num_bags", 0), f.get("num_indices", 0)
        if c.golden_status() is not Status.OK or not nb:
            continue
        seen[c.replayed] += 1
        ilo = f.get("include_last_offset", 0)
        for buffer, lines, again in (("offsets", lines_of(nb + ilo), 1),
                                     ("indices", lines_of(ni), 2)):
            base = f[f"{buffer}_addr"] & ~63
            for k in range(lines):
                want = 1 if c.replayed else 1 + again * (buffer == "indices" or k < lines_of(nb))
                got = tb.faults.reads[base + 64 * k]
                assert got == want, (f"{buffer} line {k} of a descriptor with {nb} bags, "
                                     f"{ni} indices: read {got} times, not {want}")
    assert seen[True] and seen[False], seen


# --- read errors ---------------------------------------------------------------------

def random_fault(rng: random.Random, case: Case) -> Fault | None:
    """A fault on a random line of one of ``case``'s buffers, on a random choice of the
    reads of that line (:class:`Fault`). Failed pass-1 reads carry random data
    (``keep``, ``ones``, ``zero`` or ``random``); failed pass-2 reads keep their data,
    so the rows stay predictable."""
    f = case.fields
    ni, nb, ilo = f["num_indices"], f["num_bags"], f["include_last_offset"]
    buffers = [(b, lines_of(n)) for b, n in (("offsets", nb + ilo), ("indices", ni),
                                             ("weights", ni if f["weighted"] else 0)) if n]
    if not buffers:
        return None
    buffer, lines = rng.choice(buffers)
    reads = frozenset(rng.choice({"offsets": [{0}, {1}, {1}, {0, 1}],
                                  "indices": [{0}, {1}, {2}, {1, 2}, {0, 1, 2}],
                                  "weights": [{0}]}[buffer]))
    data = (rng.choice(["keep", "ones", "zero", "random"])
            if buffer != "weights" and 0 in reads else "keep")
    return Fault(buffer, rng.randrange(lines), reads, data,
                 rng.choice([AxiResp.SLVERR, AxiResp.DECERR]))


@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
@pytest.mark.parametrize("replay", [0, 8])
def test_read_errors(seed, traffic, replay):
    """Random descriptors, two in three with a fault (:func:`random_fault`): failed
    pass-1 reads end their descriptor with READ_ERROR and no row; failed pass-2 reads
    mark the rows ``bad`` from the rows the line feeds on (the last one at least) and
    set ``read_error``; a descriptor without a failed read, after one with, is
    clean."""
    rng = random.Random(seed)
    alloc = Alloc(rng)
    cases = [random_case(rng, alloc) for _ in range(30)]
    for c in cases:
        c.replay = replay
        if rng.random() < 2 / 3 and (fault := random_fault(rng, c)) is not None:
            c.faults.append(fault)
    kinds = Counter(c.read_fault(c.golden_status())[0] for c in cases)
    print(f"descriptors with a failed read: {kinds['pass1']} in pass 1, "
          f"{kinds['pass2']} in pass 2; {kinds[None]} without")
    tb = TB(seed=seed, traffic=traffic, replay_lines=replay)
    tb.run(cases)
    assert tb.faults.failed or not (kinds["pass1"] or kinds["pass2"])


def test_row_waiting_at_a_read_error_keeps_its_payload(seed):
    """The first row of a LOOKUP of 512 one-index bags waits on ``o_rows`` (``ready``
    low) while both pass-2 copies of index line 30 (of 32) fail: the waiting row (made
    from the first line) keeps its payload, ``bad`` included, until it is taken (the
    stream rule, checked by the bench); the rows from the failed line on are ``bad``."""
    alloc = Alloc(random.Random(seed))
    n = 512
    indices = [(7 * i) % 100 for i in range(n)]
    fields = dict(kind=DescKind.LOOKUP.value, mode=PoolMode.SUM.value, dim=16, rows=100,
                  num_bags=n, num_indices=len(indices), indices_addr=alloc(4 * n),
                  offsets_addr=alloc(4 * n), weights_addr=alloc(4 * n),
                  data_addr=DATA_ADDR, table_base=TABLE_BASE)
    case = Case(fields, indices, list(range(n)), [0] * n,
                faults=[Fault("indices", 30, frozenset({1, 2}))])
    assert case.read_fault(case.golden_status())[0] == "pass2"
    tb = TB(seed=seed, hold_rows=True)
    tb.run([case])
    assert len(tb.faults.failed) == 2, tb.faults.failed
    bad = [e[1]["bad"] for e in tb.events if e[0] == "row"]
    assert len(bad) == n and bad[0] == 0 and bad[-1] == 1, bad


def tail_case(alloc: Alloc, *, bags_: int) -> Case:
    """A weighted LOOKUP of 1024 indices (64 lines) whose counted rows are its first 4:
    the other 1020 are the padding index, in the same bag (``bags_`` 1) or in a bag of
    their own (2). The count scan sends the last bag after ~1024 cycles; the emitter
    then emits its last item and walks the padding at one index per cycle, so the
    last 32 lines of its copy of the indices and of the weights are read (their
    readers buffer 32 lines) after the last item has gone."""
    pad = 77
    indices = [1, 2, 3, 4] + [pad] * 1020
    offsets = [0, 4][:bags_]
    weights = [0x3F000000 + i for i in range(len(indices))]
    fields = dict(kind=DescKind.LOOKUP.value, mode=PoolMode.SUM.value, weighted=1,
                  has_padding_idx=1, padding_idx=pad, dim=16, rows=100, num_bags=bags_,
                  num_indices=len(indices), indices_addr=alloc(4 * len(indices)),
                  offsets_addr=alloc(4 * len(offsets)), weights_addr=alloc(4 * len(indices)),
                  data_addr=DATA_ADDR, table_base=TABLE_BASE)
    return Case(fields, indices, offsets, weights)


@pytest.mark.parametrize("buffer, reads", [("weights", {0}), ("indices", {2})],
                         ids=["weights", "emitter-indices"])
def test_read_error_after_the_last_row(seed, buffer, reads):
    """A pass-2 read that fails after the last row has gone (the last line of the
    weights, or of the emitter's copy of the indices, both only padding): the rows are
    as without the failure (they left before it) and the status has ``read_error``
    (which the engine passes to the gradient feed, so an UPDATE still writes nothing:
    ``tests/test_grad_feed.py``, ``tb/test_coherence.py``)."""
    rng = random.Random(seed)
    alloc = Alloc(rng)
    cases = []
    for bags_ in (1, 2):
        c = tail_case(alloc, bags_=bags_)
        c.faults.append(Fault(buffer, 63, frozenset(reads)))
        cases += [c, base_case(alloc)]
    TB(seed=seed, timing=PmemTiming(read_latency=12, jitter=0)).run(cases)


@pytest.mark.parametrize("data", ["zero", "ones"])
def test_pass_2_read_error_with_other_data(seed, data):
    """A failed pass-2 read of the second offsets line whose beat carries other data
    than the line's (AXI leaves an error beat's data undefined; the PMEM model answers
    DECERR with zeros, poisoned CXL.cache data is arbitrary): the descriptor must still
    complete (OK, ``read_error``, its bags closed, the last row ``bad``: the failed line
    ends bags 15 on), and the next one cleanly."""
    rng = random.Random(seed)
    alloc = Alloc(rng)
    num_bags, ni = 40, 100
    offsets = [0, *sorted(rng.sample(range(1, ni), num_bags - 1))]
    indices = [rng.randrange(50) for _ in range(ni)]
    fields = dict(kind=DescKind.LOOKUP.value, mode=PoolMode.SUM.value, dim=16, rows=50,
                  num_bags=num_bags, num_indices=ni, indices_addr=alloc(4 * ni),
                  offsets_addr=alloc(4 * num_bags), data_addr=DATA_ADDR,
                  table_base=TABLE_BASE)
    c = Case(fields, indices, offsets, faults=[Fault("offsets", 1, frozenset({1}), data)])
    assert c.expected()[0] == ("rows",)
    # ~350 cycles when the data is the line's own: 3000 is a hang.
    tb = TB(seed=seed, traffic=ROUGH)
    tb.run([c, base_case(alloc)], max_cycles=3000)
    rows = _descriptors(tb.events)[0][:-1]
    assert sum(r[1]["last_row"] or r[1]["empty_bag"] for r in rows) == num_bags, rows
    assert rows[-1][1]["bad"], f"last row {rows[-1]} not bad"


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
    if status is S.READ_ERROR:
        return read_error_cases(b)
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


def read_error_cases(b) -> list[tuple[Case, Status]]:
    """Reads of :func:`base_case`'s buffers (one line each) answered with an error: in
    pass 1 READ_ERROR, before the checks that its data would fail; in pass 2 OK (rows
    ``bad``, ``read_error``); none for a descriptor that fails its field checks (it
    reads nothing) or on a line it does not read."""
    S = Status

    def fault(case, buffer, reads=(0,), data="keep", resp=AxiResp.SLVERR):
        case.faults.append(Fault(buffer, 0, frozenset(reads), data, resp))
        return case

    return [
        # pass 1: the offsets or the indices line, SLVERR or DECERR, with data that
        # would pass, fail BAD_OFFSETS (all ones) or INDEX_RANGE (all ones, zeros)
        (fault(b(), "offsets"), S.READ_ERROR),
        (fault(b(), "offsets", data="ones", resp=AxiResp.DECERR), S.READ_ERROR),
        (fault(b(), "indices", data="ones"), S.READ_ERROR),
        (fault(b(), "indices", data="random", resp=AxiResp.DECERR), S.READ_ERROR),
        (fault(b(kind=DescKind.UPDATE.value), "indices", reads=(0, 1, 2)), S.READ_ERROR),
        # data that fails the checks although the line is good, and the line read
        # again in pass 2 (an error on every read)
        (fault(with_buffers(b(), offsets=[0, 3, 2, 5]), "offsets", reads=(0, 1)),
         S.READ_ERROR),
        (fault(with_buffers(b(), indices=[3, 5, 3, 10, 9, 1, 0]), "indices", data="zero"),
         S.READ_ERROR),
        (fault(with_buffers(b(num_bags=0), indices=[1, 2, 8], offsets=[]), "indices"),
         S.READ_ERROR),                                 # no pass 2
        # pass 2: offsets, either copy of the indices, the weights (read only there)
        (fault(b(), "offsets", reads=(1,)), S.OK),
        (fault(b(kind=DescKind.UPDATE.value), "offsets", reads=(1,),
               resp=AxiResp.DECERR), S.OK),
        (fault(b(), "indices", reads=(1,)), S.OK),
        (fault(b(), "indices", reads=(2,)), S.OK),
        (fault(b(), "indices", reads=(1, 2)), S.OK),
        (fault(b(), "weights"), S.OK),
        (fault(b(kind=DescKind.UPDATE.value), "weights", resp=AxiResp.DECERR), S.OK),
        # no failed read: a field check fails first, or the line is not read
        (fault(b(offsets_addr=b().fields["offsets_addr"] + 4), "offsets"), S.MISALIGNED),
        (fault(b(mode=3), "indices", reads=(0, 1, 2)), S.UNSUPPORTED),
        (fault(b(weighted=0), "weights"), S.OK),
        (fault(with_buffers(b(num_bags=0), indices=[1, 2, 8], offsets=[]), "offsets"),
         S.OK),
    ]


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
        got = case.expected()[-1][1]["status"]
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
        got = case.expected()[-1][1]["status"]
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
