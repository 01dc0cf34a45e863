# amaranth: UnusedElaboratable=no
"""ScatterUpdate (hw/engine/scatter_update.py): UPDATE items applied to tables in a
:class:`tb.pmem.PmemModel`, the final PMEM image compared bit for bit with
``sim.embedding.update``.

Each run feeds several descriptors back to back (different tables, dtypes, weighting and
``lines_per_row``; the same row numbers in different tables, so a stale cached row would
show). Bags come from ``sim.embedding.random_bags`` (uniform or Zipf-skewed, so rows
repeat within and across bags) over more rows than the cache holds, so rows are evicted
and re-read. Tables, gradients and weights are sprinkled with NaN, inf and subnormal
encodings; row padding holds random bytes that must survive. PMEM answers with jitter;
items idle, AXI channels and ``o_done`` are backpressured at random (seeded; the seed is
printed and ``SEED=<n>`` replays it). ``rows_written`` is checked against a
direct-mapped cache model and, when no row was evicted, against
``coalesce_stats(...).distinct_rows``.

Hits are pipelined, so long runs of one row (or two alternating rows, in different
slots or in the same one) check that every item sees the previous update of its line
at any distance, and a backpressure-free run measures (and prints) the cycles per hit,
fill and eviction.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest

from hw.engine.scatter_update import DONE, ITEM, ScatterUpdate, ctrl_layout
from sim.embedding import (
    BF16,
    FP32,
    LINE_BYTES,
    bags,
    coalesce_stats,
    lines_per_row,
    pack_rows,
    random_bags,
    unpack_rows,
    update,
)
from tb.pmem import PmemModel, PmemTiming

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule

PMEM_SIZE = 1 << 20
ADDR_WIDTH = 20
QNAN32, QNAN16 = 0x7FC0_0000, 0x7FC0

#: fp32 encodings sprinkled over tables, gradients and weights.
SPECIALS = np.array([
    0x0000_0000, 0x8000_0000, 0x7F80_0000, 0xFF80_0000,     # +-0, +-inf
    0x7FC0_0000, 0xFFC0_0001, 0x7F80_0001,                  # NaNs (quiet, signed, sig.)
    0x0000_0001, 0x8000_0001, 0x007F_FFFF, 0x0040_0000,     # subnormals
    0x0080_0000, 0x7F7F_FFFF, 0xFF7F_FFFF,                  # smallest normal, largest
], np.uint32)


def sprinkle(rng: np.random.Generator, values: np.ndarray, fraction: float) -> np.ndarray:
    """float32 ``values`` with a ``fraction`` replaced by :data:`SPECIALS`."""
    bits = values.astype(np.float32).view(np.uint32).copy()
    hit = rng.random(bits.shape) < fraction
    bits[hit] = rng.choice(SPECIALS, int(hit.sum()))
    return bits.view(np.float32)


@dataclass
class Desc:
    """One UPDATE descriptor: its table in PMEM and its bags, weights and gradients."""
    base: int
    table: np.ndarray
    indices: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray | None
    grads: np.ndarray
    image: bytes            # the table's PMEM image before the update

    @property
    def bf16(self) -> bool:
        return self.table.dtype == BF16

    @property
    def lines(self) -> int:
        return lines_per_row(self.table.shape[1], self.table.dtype)

    def ctrl(self) -> dict:
        return {"table_base": self.base, "lines_per_row": self.lines, "bf16": self.bf16,
                "weighted": self.weights is not None, "dim": self.table.shape[1]}

    def counted(self) -> list[tuple[int, int]]:
        """(bag, position in indices) of every counted index, in contract order."""
        out, pos = [], 0
        for b, bag in enumerate(bags(self.indices, self.offsets)):
            for _ in bag:
                out.append((b, pos))
                pos += 1
        return out

    def items(self) -> list[dict]:
        """The item stream: per counted index the gradient lines (two per table line for
        bf16, zero past the gradient vector's end)."""
        dim = self.table.shape[1]
        glines = lines_per_row(dim, FP32)
        n = 2 * self.lines if self.bf16 else self.lines
        gimg = pack_rows(self.grads)
        stride = glines * LINE_BYTES
        out = []
        for b, k in self.counted():
            w = 0 if self.weights is None else int(self.weights[k:k + 1].view(np.uint32)[0])
            for line in range(n):
                chunk = gimg[b * stride + line * LINE_BYTES:b * stride + (line + 1) * LINE_BYTES]
                out.append({"row": int(self.indices[k]), "line": line, "weight": w,
                            "grad": int.from_bytes(chunk, "little") if chunk else 0})
        out[-1]["last"] = 1
        return out

    def expected_rows_written(self, cache_rows: int) -> int:
        """Misses of a direct-mapped cache of ``cache_rows`` rows (each is written once)."""
        tags: dict[int, int] = {}
        misses = 0
        for _, k in self.counted():
            r = int(self.indices[k])
            if tags.get(r % cache_rows) != r:
                misses += 1
                tags[r % cache_rows] = r
        return misses


def make_desc(rng: np.random.Generator, model: PmemModel, base: int, *, dtype, dim: int,
              rows: int, num_bags: int, weighted: bool, zipf: float | None,
              special: float = 0.03, bags_: tuple[np.ndarray, np.ndarray] | None = None,
              grad_scale: float = 2.0 ** -3) -> Desc:
    """A random table at ``base`` and random bags (or ``bags_``: indices, offsets)."""
    scale = 2.0 ** rng.integers(-4, 5, (rows, dim))
    table = sprinkle(rng, rng.standard_normal((rows, dim)) * scale, special)
    with np.errstate(invalid="ignore"):     # NaNs narrowed to bf16 on purpose
        table = table.astype(dtype)
    if bags_ is not None:
        indices, offsets = bags_
        num_bags = len(offsets)
    else:
        while True:
            indices, offsets = random_bags(rng, num_bags, rows, pooling=3, zipf_alpha=zipf,
                                           max_len=8, empty_fraction=0.1)
            if len(indices):
                break
    grads = sprinkle(rng, rng.standard_normal((num_bags, dim)) * grad_scale, special)
    weights = (sprinkle(rng, rng.standard_normal(len(indices)), special)
               if weighted else None)
    stride = lines_per_row(dim, dtype) * LINE_BYTES
    garbage = rng.integers(0, 256, rows * stride, dtype=np.uint8).tobytes()
    image = pack_rows(table, base=garbage)
    model.write(base, image)
    return Desc(base, table, indices, offsets, weights, grads, image)


def check_table(model: PmemModel, d: Desc) -> None:
    """The PMEM image against ``update``: bit for bit, NaNs by class (the DUT's are
    canonical or untouched), padding bytes unchanged."""
    rows, dim = d.table.shape
    got_img = model.read(d.base, len(d.image))
    got = unpack_rows(got_img, rows, dim, d.table.dtype)
    want = update(d.table, d.indices, d.offsets, d.grads, weights=d.weights)
    uint = np.uint16 if d.bf16 else np.uint32
    gb, wb = got.view(uint), want.view(uint)
    nan = np.isnan(want.astype(np.float32))
    qnan = QNAN16 if d.bf16 else QNAN32
    bad = np.where(nan, ~np.isnan(got.astype(np.float32)) | ((gb != wb) & (gb != qnan)),
                   gb != wb)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise AssertionError(f"{int(bad.sum())} elements differ; first row {r} elem {c}: "
                             f"got {int(gb[r, c]):#x} want {int(wb[r, c]):#x} "
                             f"(was {int(d.table.view(uint)[r, c]):#x})")
    assert pack_rows(got, base=d.image) == got_img, "row padding was modified"


@dataclass
class Traffic:
    idle: float = 0.0       # i_items and i_lines valid withheld
    ar_bp: float = 0.0
    aw_bp: float = 0.0
    w_bp: float = 0.0
    r_idle: float = 0.0     # an R beat that is due withheld
    b_idle: float = 0.0
    done_bp: float = 0.0


SMOOTH = Traffic()
ROUGH = Traffic(idle=0.3, ar_bp=0.3, aw_bp=0.3, w_bp=0.3, r_idle=0.3, b_idle=0.3,
                done_bp=0.5)


def run(dut: ScatterUpdate, model: PmemModel, descs: list[Desc], *, seed: int,
        traffic: Traffic, max_cycles: int = 200_000, ahead: int = 12,
        accepts: list[int] | None = None) -> tuple[list[dict], int]:
    """Feed ``descs`` and, on ``i_lines``, every counted index's row read from PMEM up to
    ``ahead`` indices early; returns the ``o_done`` records and the cycles taken. The
    cycle of every item transfer is appended to ``accepts``, if given."""
    rng = random.Random(seed)
    ctrl_l = ctrl_layout(dut.addr_width)
    queue = [(pack(ctrl_l, d.ctrl()), pack(ITEM, it)) for d in descs for it in d.items()]
    queue.reverse()
    # The gather's read-ahead: every counted index's row, read from PMEM up to
    # ``ahead`` indices before the block takes its lines (so a row written back in
    # between is stale), never before the previous descriptor completed (UPDATE is
    # serialising in the engine).
    rows = [(n, d.base + it["row"] * d.lines * LINE_BYTES, d.lines)
            for n, d in enumerate(descs) for it in d.items() if it["line"] == 0]
    rows.reverse()
    lines: list[int] = []   # read ahead, in order
    dones: list[dict] = []
    checks = {n: StreamRule(n) for n in ("AR", "AW", "W", "o_done")}
    cycles = [0]
    p = dut.pmem

    async def bench(ctx):
        cur = beat = b = None
        cycle = 0
        line_out = None
        taken_rows: list[int] = []
        while len(dones) < len(descs):
            assert cycle < max_cycles, f"timeout: {len(dones)} of {len(descs)} done"
            if rows and rows[-1][0] <= len(dones) and len(taken_rows) < ahead:
                _, addr, n = rows.pop()
                img = model.read(addr, n * LINE_BYTES)
                lines.extend(int.from_bytes(img[i * LINE_BYTES:(i + 1) * LINE_BYTES],
                                            "little") for i in range(n))
                taken_rows.append(n)
            if line_out is None and lines and not rng.random() < traffic.idle:
                line_out = lines.pop(0)
                ctx.set(dut.i_lines.payload.as_value(), line_out)
            ctx.set(dut.i_lines.valid, line_out is not None)
            if cur is None and queue and not rng.random() < traffic.idle:
                cur = queue.pop()
                ctx.set(dut.i_ctrl.as_value(), cur[0])
                ctx.set(dut.i_items.payload.as_value(), cur[1])
            ctx.set(dut.i_items.valid, cur is not None)
            ctx.set(dut.o_done.ready, not rng.random() < traffic.done_bp)
            ctx.set(p.arready, not rng.random() < traffic.ar_bp)
            ctx.set(p.awready, not rng.random() < traffic.aw_bp)
            ctx.set(p.wready, not rng.random() < traffic.w_bp)
            if beat is None and not rng.random() < traffic.r_idle:
                beat = model.r_beat(cycle)
                if beat is not None:
                    ctx.set(p.rid, beat[0])
                    ctx.set(p.rdata, beat[1])
                    ctx.set(p.rresp, beat[2])
                    ctx.set(p.rlast, int(beat[3]))
            ctx.set(p.rvalid, beat is not None)
            if b is None and not rng.random() < traffic.b_idle:
                b = model.b_resp(cycle)
                if b is not None:
                    ctx.set(p.bid, b[0])
                    ctx.set(p.bresp, b[1])
            ctx.set(p.bvalid, b is not None)
            (_, _, l_ready, i_ready, d_valid, d_ready, d_p, arvalid, arready, awvalid,
             awready, wvalid, wready, wdata, wstrb, wlast, rready, bready,
             *addr) = await ctx.tick().sample(
                dut.i_lines.ready, dut.i_items.ready, dut.o_done.valid, dut.o_done.ready,
                dut.o_done.payload.as_value(), p.arvalid, p.arready, p.awvalid, p.awready,
                p.wvalid, p.wready, p.wdata, p.wstrb, p.wlast, p.rready, p.bready,
                p.arid, p.araddr, p.arlen, p.arsize, p.arburst,
                p.awid, p.awaddr, p.awlen, p.awsize, p.awburst)
            ar, aw = tuple(addr[:5]), tuple(addr[5:])
            if line_out is not None and l_ready:
                line_out = None
                taken_rows[0] -= 1
                if not taken_rows[0]:
                    taken_rows.pop(0)
            if cur is not None and i_ready:
                cur = None
                if accepts is not None:
                    accepts.append(cycle)
            checks["AR"].observe(cycle, arvalid, arready, ar)
            checks["AW"].observe(cycle, awvalid, awready, aw)
            checks["W"].observe(cycle, wvalid, wready, (wdata, wstrb, wlast))
            checks["o_done"].observe(cycle, d_valid, d_ready, d_p)
            if arvalid and arready:
                model.accept_ar(ar[0], ar[1], ar[2], cycle, size=ar[3], burst=ar[4])
            if awvalid and awready:
                model.accept_aw(aw[0], aw[1], aw[2], cycle, size=aw[3], burst=aw[4])
            if wvalid and wready:
                model.accept_w(wdata, wstrb, bool(wlast), cycle)
            if beat is not None and rready:
                model.r_accept(cycle)
                beat = None
            if b is not None and bready:
                model.b_accept(cycle)
                b = None
            if d_valid and d_ready:
                dones.append(unpack(DONE, d_p))
                # Durable at completion: nothing of it may still be in flight.
                assert model.outstanding == (0, 0), "o_done before every B"
            cycle += 1
        assert not rows and not lines and not taken_rows and line_out is None, (
            "gathered lines left over at the end")
        cycles[0] = cycle

    simulate(dut, bench)
    errors = [e for c in checks.values() for e in c.errors]
    assert not errors, "\n".join(errors[:10])
    return dones, cycles[0]


def check_run(dut: ScatterUpdate, model: PmemModel, descs: list[Desc], *, seed: int,
              traffic: Traffic, accepts: list[int] | None = None) -> tuple[list[dict], int]:
    dones, cycles = run(dut, model, descs, seed=seed, traffic=traffic, accepts=accepts)
    for d, done in zip(descs, dones, strict=True):
        check_table(model, d)
        stats = coalesce_stats(d.indices, d.offsets)
        assert done["updates"] == stats.updates
        want = d.expected_rows_written(dut.cache_rows)
        assert done["rows_written"] == want
        if want == stats.distinct_rows:
            continue
        assert want > stats.distinct_rows     # evictions happened: more writes
    return dones, cycles


# --- parameters ----------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    ({"addr_width": 11}, "addr_width must be an integer from 12 to 64, not 11"),
    ({"addr_width": True}, "addr_width must be an integer from 12 to 64, not True"),
    ({"id_width": 0}, "id_width must be an integer from 1 to 16, not 0"),
    ({"cache_rows": 1}, "cache_rows must be an integer from 2 to 256, not 1"),
    ({"cache_rows": 512}, "cache_rows must be an integer from 2 to 256, not 512"),
    ({"cache_rows": 24}, "cache_rows must be a power of two, not 24"),
    ({"max_lines_per_row": 0}, "max_lines_per_row must be an integer from 1 to 64, not 0"),
    ({"max_lines_per_row": 65}, "max_lines_per_row must be an integer from 1 to 64, not 65"),
])
def test_rejects_bad_parameters(kwargs, message):
    args = {"addr_width": ADDR_WIDTH, "id_width": 4} | kwargs
    with pytest.raises(ValueError, match=message):
        ScatterUpdate(**args)


def test_parameters_are_read_only_properties():
    dut = ScatterUpdate(addr_width=24, id_width=3, cache_rows=8, max_lines_per_row=5)
    assert (dut.addr_width, dut.id_width, dut.cache_rows, dut.max_lines_per_row) == (
        24, 3, 8, 5)
    with pytest.raises(AttributeError):
        dut.cache_rows = 4


# --- data ----------------------------------------------------------------------------

#: (dtype, dim): 1, 2 and 3 lines per row, with padding elements in most.
SHAPES = [(FP32, 7), (FP32, 32), (FP32, 40), (BF16, 20), (BF16, 64), (BF16, 90)]


def mixed(rng: np.random.Generator, model: PmemModel, *, rows: int, num_bags: int,
          shapes=SHAPES) -> list[Desc]:
    descs = []
    for n, (dtype, dim) in enumerate(shapes):
        # Tables 4 KiB apart plus a few lines, so some rows straddle a 4 KiB boundary.
        base = 0x8000 * (n + 1) + 64 * int(rng.integers(0, 64))
        descs.append(make_desc(rng, model, base, dtype=dtype, dim=dim, rows=rows,
                               num_bags=num_bags, weighted=bool(n % 2 == 0 or rng.random() < .5),
                               zipf=1.1 if n % 3 else None))
    return descs


@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
def test_update_with_evictions(traffic, seed):
    """More distinct rows than cache slots: rows are evicted and re-read."""
    nrng = np.random.default_rng(seed)
    model = PmemModel(size=PMEM_SIZE, timing=PmemTiming(read_latency=8, write_latency=8,
                                                        jitter=12), rng=random.Random(seed))
    dut = ScatterUpdate(addr_width=ADDR_WIDTH, id_width=2, cache_rows=4, max_lines_per_row=3)

    def evicts(d: Desc) -> bool:
        return d.expected_rows_written(4) > coalesce_stats(d.indices, d.offsets).distinct_rows
    # About 1 seed in 10,000 draws no descriptor that evicts: draw on (same seed).
    for _ in range(100):
        descs = mixed(nrng, model, rows=24, num_bags=6)
        if any(map(evicts, descs)):
            break
    check_run(dut, model, descs, seed=seed, traffic=traffic)
    assert any(map(evicts, descs)), "no eviction happened"


def test_update_coalesced_without_evictions(seed):
    """Every row fits: each distinct row is written exactly once per descriptor."""
    nrng = np.random.default_rng(seed)
    model = PmemModel(size=PMEM_SIZE, timing=PmemTiming(read_latency=8, jitter=12),
                      rng=random.Random(seed))
    dut = ScatterUpdate(addr_width=ADDR_WIDTH, id_width=1, cache_rows=16, max_lines_per_row=4)
    descs = mixed(nrng, model, rows=16, num_bags=8, shapes=SHAPES[1:2] + SHAPES[4:5])
    dones, _ = check_run(dut, model, descs, seed=seed, traffic=ROUGH)
    for d, done in zip(descs, dones, strict=True):
        assert done["rows_written"] == coalesce_stats(d.indices, d.offsets).distinct_rows


# --- read-after-write on the cached line ----------------------------------------------

#: (dtype, dim, weighted): fp32 rows of 1 to 3 lines, bf16 rows of 1 and 2 lines (two
#: items, one per half, per table line), padding elements in some.
RAW_SHAPES = [(FP32, 7, False), (FP32, 16, True), (FP32, 40, True), (BF16, 20, True),
              (BF16, 32, False), (BF16, 64, True)]
#: Rows cycled through by the indices; with 4 cache slots rows 1 and 2 are in different
#: slots, rows 1 and 5 in the same one (every index evicts the other row).
PATTERNS = {"one_row": (3,), "two_slots": (1, 2), "same_slot": (1, 5)}
#: Random gaps between items, no other backpressure: every distance between dependent
#: items occurs.
IDLE = Traffic(idle=0.5)


@pytest.mark.parametrize("traffic", [SMOOTH, IDLE, ROUGH], ids=["smooth", "idle", "rough"])
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_repeated_rows_see_previous_updates(pattern, traffic, seed):
    """Long runs of the same row(s): consecutive items update the same cached line (or
    the other half of a bf16 line), so each must see the result of the one before it,
    whatever the distance between them."""
    nrng = np.random.default_rng(seed)
    model = PmemModel(size=PMEM_SIZE, timing=PmemTiming(read_latency=4, write_latency=4,
                                                        jitter=4), rng=random.Random(seed))
    dut = ScatterUpdate(addr_width=ADDR_WIDTH, id_width=2, cache_rows=4, max_lines_per_row=3)
    rows = PATTERNS[pattern]
    descs = []
    for n, (dtype, dim, weighted) in enumerate(RAW_SHAPES):
        lengths = nrng.integers(2, 9, 4)
        phase = int(nrng.integers(0, len(rows)))
        indices = np.array([rows[(phase + k) % len(rows)] for k in range(lengths.sum())],
                           np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
        # Gradients as large as the table (so every bf16 update shows) and no
        # specials (a NaN would hide the rest of a row's updates).
        descs.append(make_desc(nrng, model, 0x8000 * (n + 1), dtype=dtype, dim=dim, rows=8,
                               num_bags=4, weighted=weighted, zipf=None, special=0.0,
                               bags_=(indices, offsets), grad_scale=1.0))
    check_run(dut, model, descs, seed=seed, traffic=traffic)


# --- throughput ------------------------------------------------------------------------

def classify(items: list[dict], cache_rows: int) -> list[str]:
    """Per item of one descriptor: ``hit``, ``fill`` (its row read into an empty slot),
    ``evict`` (the slot's row written back first) or ``last`` (flushes)."""
    tags: dict[int, int] = {}
    kinds = []
    for n, it in enumerate(items):
        row = it["row"]
        slot = row % cache_rows
        if n == len(items) - 1:
            kinds.append("last")
        elif tags.get(slot) == row:
            kinds.append("hit")
        else:
            kinds.append("evict" if slot in tags else "fill")
        tags[slot] = row
    return kinds


def cycles_per_item(dut: ScatterUpdate, model: PmemModel, descs: list[Desc], *,
                    seed: int) -> list[dict[str, float]]:
    """Per descriptor, the mean cycles an item of each kind (:func:`classify`) holds
    the input (the next item's transfer minus its own) when items are always valid and
    nothing is backpressured."""
    accepts: list[int] = []
    check_run(dut, model, descs, seed=seed, traffic=SMOOTH, accepts=accepts)
    held = np.diff(accepts)
    out, pos = [], 0
    for d in descs:
        kinds = classify(d.items(), dut.cache_rows)
        per: dict[str, list[int]] = {}
        for k, kind in enumerate(kinds):
            if kind != "last":
                per.setdefault(kind, []).append(int(held[pos + k]))
        pos += len(kinds)
        out.append({kind: float(np.mean(v)) for kind, v in per.items()})
    return out


def speed_descs(nrng: np.random.Generator, model: PmemModel) -> list[tuple[str, Desc]]:
    """Labelled descriptors of the throughput measurement (8 cache slots)."""
    descs = []

    def desc(label, dtype, dim, weighted, bags_=None):
        base = 0x8000 * (len(descs) + 1)
        descs.append((label, make_desc(nrng, model, base, dtype=dtype, dim=dim, rows=24,
                                       num_bags=24, weighted=weighted, zipf=1.1,
                                       bags_=bags_)))

    def repeat(rows, n):
        return (np.array([rows[k % len(rows)] for k in range(n)], np.int32),
                np.zeros(1, np.int32))

    # Zipf bags over 8 rows, all cached after their first miss: 4 items per index.
    for dtype, weighted in ((FP32, False), (FP32, True), (BF16, False), (BF16, True)):
        name = "fp32" if dtype == FP32 else "bf16"
        desc(f"{name} dim 64 {'weighted' if weighted else 'unweighted'}", dtype, 64,
             weighted, random_bags(nrng, 16, 8, pooling=6, zipf_alpha=1.1, max_len=12))
    # Dependency chains: one row over and over.
    desc("fp32 dim 16 one row (1 line)", FP32, 16, True, repeat((5,), 40))
    desc("fp32 dim 32 one row (2 lines)", FP32, 32, True, repeat((5,), 30))
    desc("bf16 dim 32 one row (1 line, 2 halves)", BF16, 32, True, repeat((5,), 30))
    # Misses: two rows of one slot alternating, every index evicts the other (4 lines).
    desc("fp32 dim 64 two rows of one slot", FP32, 64, True, repeat((3, 11), 12))
    return descs


@pytest.mark.long
def test_throughput(seed):
    """Cycle counts of the deterministic simulation (PMEM read and write latency 20, no
    jitter, no backpressure): hits take one item per cycle; asserted at least one per
    two cycles for the Zipf workloads."""
    nrng = np.random.default_rng(seed)
    model = PmemModel(size=PMEM_SIZE, timing=PmemTiming(read_latency=20, write_latency=20),
                      rng=random.Random(seed))
    dut = ScatterUpdate(addr_width=ADDR_WIDTH, id_width=1, cache_rows=8, max_lines_per_row=4)
    labelled = speed_descs(nrng, model)
    figures = cycles_per_item(dut, model, [d for _, d in labelled], seed=seed)
    for (label, _), fig in zip(labelled, figures, strict=True):
        print(f"{label}: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(fig.items()))
              + " cycles/item")
    for (label, _), fig in zip(labelled[:4], figures[:4], strict=True):
        assert fig["hit"] <= 2, f"{label}: {fig['hit']:.2f} cycles per hit"


def test_verilog_lints_clean(tmp_path):
    dut = ScatterUpdate(addr_width=48, id_width=4, cache_rows=8, max_lines_per_row=5)
    assert_lints_clean(dut, "scatter_update_a48_c8_l5", tmp_path)
