# amaranth: UnusedElaboratable=no
"""CoalescedUpdate (hw/engine/coalesced_update.py): UPDATE items applied to tables in a
:class:`tb.pmem.PmemModel`, the final PMEM image compared bit for bit with
``sim.embedding.update`` applied descriptor by descriptor (the contract of
``docs/embedding.md``, "Update": per distinct row one fp32 sum of its
contributions in index order, one add to the row, one rounding, one read and one write).

Written from that contract and the golden model, not from the RTL. Each run feeds
several descriptors back to back: fp32 tables of 1 to 6 lines per row and bf16 tables
of 1 to 3 (2 to 6 items per index) at different bases (rows straddle 4 KiB
boundaries), weighted and not, dims with and without row padding (the padding holds
random bytes, -0 and NaN patterns among them, that must survive), uniform and
Zipf-skewed bags with empty bags, so rows repeat within and across bags; a table
updated by two descriptors of one run (nothing of the first may leak into the
second). Tables, gradients and weights are sprinkled with NaN, inf and
subnormal encodings. Descriptors end with a ``nop`` + ``last`` item or with ``last`` on
their final real item; ignored ``nop`` items with garbage payloads come between indices,
and while ``i_items`` is idle its payload is garbage. PMEM answers with jitter (and
so reorders the responses of different IDs); items idle, AR / AW / W ready, R / B valid and
``o_done`` ready are withheld at random (seeded; the seed is printed and ``SEED=<n>``
replays it).

Besides the image: ``o_done`` (``rows_written`` = distinct rows, ``updates`` = counted
indices, ``overflow`` and ``overflow_at``), completion only after every B of the
descriptor, each line of each distinct row read once and written once per descriptor
(every AR / AW line is charged to a descriptor in progress that owes it) and nothing
else touched, 64-byte INCR bursts that stay inside 4 KiB, the stream rule on AR, AW, W
and ``o_done``, and quiet ports after the last ``o_done``. Directed tests: long runs of
one row and of a few alternating rows (hazards in the accumulation), signed zeros,
overflow (``acc_rows + 1`` distinct rows: nothing written, then ``acc_rows`` distinct
rows applied), descriptors of only a ``nop`` + ``last`` item or of one real item, read
errors (one item ``bad``, anywhere: nothing written, ``read_error``, then the same rows
applied normally), the passes of a multi-pass UPDATE (each only its own rows); a
backpressure-free run prints the cycles per gradient line.

The simulator of a block is built once and reset between tests (:func:`simulate_dut`):
compiling the design costs about as much as a run.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pytest
from amaranth.hdl import Cat, ClockDomain, Module
from amaranth.sim import Simulator

from hw.engine.coalesced_update import DONE, ITEM, CoalescedUpdate, ctrl_layout
from sim.embedding import (
    BF16,
    FP32,
    LINE_BYTES,
    bags,
    in_pass,
    lines_per_row,
    overflow_at,
    pack_rows,
    random_bags,
    unpack_rows,
    update,
)
from tb.pmem import PmemModel, PmemTiming

from .conftest import assert_lints_clean
from .payload import pack, unpack
from .stream_rule import StreamRule

PMEM_SIZE = 1 << 24
ADDR_WIDTH = 24
#: The accumulator of the block under test in most tests (small: the runs are short).
ACC_ROWS = 16
MAX_ITEMS = 6

#: fp32 encodings sprinkled over tables, gradients and weights.
SPECIALS = np.array([
    0x0000_0000, 0x8000_0000, 0x7F80_0000, 0xFF80_0000,     # +-0, +-inf
    0x7FC0_0000, 0xFFC0_0001, 0x7F80_0001,                  # NaNs (quiet, signed, sig.)
    0x0000_0001, 0x8000_0001, 0x007F_FFFF, 0x0040_0000,     # subnormals
    0x0080_0000, 0x7F7F_FFFF, 0xFF7F_FFFF,                  # smallest normal, largest
], np.uint32)

#: 32-bit words sprinkled over row padding: -0 (fp32 and both bf16 halves), a
#: signalling and a negative NaN (fp32 and bf16), which an add of +0 would change.
PAD_SPECIALS = np.array([0x8000_0000, 0x8000_8000, 0x7F80_0001, 0xFFC1_FFC1, 0x7FA0_7FA0],
                        np.uint32)


def sprinkle(rng: np.random.Generator, values: np.ndarray, fraction: float) -> np.ndarray:
    """float32 ``values`` with a ``fraction`` replaced by :data:`SPECIALS`."""
    bits = values.astype(np.float32).view(np.uint32).copy()
    hit = rng.random(bits.shape) < fraction
    bits[hit] = rng.choice(SPECIALS, int(hit.sum()))
    return bits.view(np.float32)


# --- traffic -------------------------------------------------------------------------

@dataclass(frozen=True)
class Traffic:
    """Per-cycle probabilities of the bench's idle and backpressure cycles."""
    idle: float = 0.0       # i_items valid withheld
    ar_bp: float = 0.0
    aw_bp: float = 0.0
    w_bp: float = 0.0
    r_idle: float = 0.0     # an R beat that is due withheld
    b_idle: float = 0.0
    done_bp: float = 0.0


SMOOTH = Traffic()
IDLE = Traffic(idle=0.5)
ROUGH = Traffic(idle=0.3, ar_bp=0.3, aw_bp=0.3, w_bp=0.3, r_idle=0.3, b_idle=0.3,
                done_bp=0.5)


# --- tables and descriptors ----------------------------------------------------------

@dataclass
class Table:
    """A table in PMEM: its first image (padding reference) and expected contents."""
    base: int
    first: np.ndarray       # contents before the run
    image: bytes            # PMEM image before the run (rows and padding)
    want: np.ndarray        # expected contents after the descriptors so far

    @property
    def dtype(self):
        return self.first.dtype

    @property
    def bf16(self) -> bool:
        return self.dtype == BF16

    @property
    def rows(self) -> int:
        return self.first.shape[0]

    @property
    def dim(self) -> int:
        return self.first.shape[1]

    @property
    def lines(self) -> int:
        return lines_per_row(self.dim, self.dtype)

    @property
    def size(self) -> int:
        return self.rows * self.lines * LINE_BYTES

    def row_lines(self, row: int) -> list[int]:
        """Byte addresses of the lines of ``row``."""
        return [self.base + (row * self.lines + j) * LINE_BYTES for j in range(self.lines)]


def make_table(rng: np.random.Generator, model: PmemModel, base: int, *, dtype, dim: int,
               rows: int, special: float = 0.03) -> Table:
    """A random table at ``base``; its padding bytes random with :data:`PAD_SPECIALS`."""
    scale = 2.0 ** rng.integers(-4, 5, (rows, dim))
    values = sprinkle(rng, rng.standard_normal((rows, dim)) * scale, special)
    with np.errstate(invalid="ignore", over="ignore"):   # NaNs narrowed to bf16 on purpose
        values = values.astype(dtype)
    stride = lines_per_row(dim, dtype) * LINE_BYTES
    words = rng.integers(0, 1 << 32, rows * stride // 4, dtype=np.uint64).astype(np.uint32)
    hit = rng.random(words.shape) < 0.2
    words[hit] = rng.choice(PAD_SPECIALS, int(hit.sum()))
    image = pack_rows(values, base=words.astype("<u4").tobytes())
    model.write(base, image)
    return Table(base, values, image, values.copy())


@dataclass
class Desc:
    """One UPDATE descriptor on ``table``: bags, weights, gradients and how it ends
    (``end``: ``"nop"``, a final ``nop`` + ``last`` item; ``"last"``, ``last`` on the
    final real item). Its expected effect is computed when it is made (:func:`desc`)."""
    table: Table
    indices: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray | None
    grads: np.ndarray
    end: str = "nop"
    nop_fraction: float = 0.0   # ignored nop items between indices
    traffic: Traffic | None = None  # the bench's randomness while this one is current
    updates: int = 0
    distinct: int = 0
    overflow: bool = False
    overflow_at: int = 0        # counted indices before the first row that did not fit
    rows: list[int] = field(default_factory=list)   # distinct counted rows
    bad_at: int | None = None   # the item (index into its items) that comes ``bad``
    bad_nop: bool = False       # ... rather an ignored ``nop`` item inserted before it
    pass_: tuple[int, int] = (0, 0)     # (pass_level, pass_value): its rows, the others'
                                        # items skipped
    defer: bool = False         # its rows read only after its last item, if it writes

    @property
    def read_error(self) -> bool:
        return self.bad_at is not None

    @property
    def writes(self) -> bool:
        """Its rows are written (no overflow, no read error)."""
        return not (self.overflow or self.read_error)

    @property
    def n_items(self) -> int:
        """Gradient lines per counted index."""
        return 2 * self.table.lines if self.table.bf16 else self.table.lines

    def ctrl(self) -> dict:
        t = self.table
        return {"table_base": t.base, "lines_per_row": t.lines, "bf16": t.bf16,
                "weighted": self.weights is not None, "dim": t.dim}

    def counted(self) -> list[tuple[int, int]]:
        """(bag, position in indices) of every counted index, in contract order."""
        out, pos = [], 0
        for b, bag in enumerate(bags(self.indices, self.offsets)):
            for _ in bag:
                out.append((b, pos))
                pos += 1
        return out

    def items(self, rng: random.Random) -> list[dict]:
        """The item stream: per counted index, gradient lines ``0 .. n-1`` (item ``line``
        carries gradient elements ``16*line ..``, zero past the gradient's end), ignored
        ``nop`` items with garbage between indices, and the end (``end``)."""
        glines = lines_per_row(self.table.dim, FP32)
        gimg = pack_rows(self.grads)
        stride = glines * LINE_BYTES
        out: list[dict] = []
        for b, k in self.counted():
            if rng.random() < self.nop_fraction:
                out.append(garbage_item(rng))
            w = 0 if self.weights is None else int(self.weights[k:k + 1].view(np.uint32)[0])
            for line in range(self.n_items):
                chunk = gimg[b * stride + line * LINE_BYTES:b * stride + (line + 1) * LINE_BYTES]
                out.append({"row": int(self.indices[k]), "line": line, "weight": w,
                            "grad": int.from_bytes(chunk, "little") if chunk else 0})
        if self.end == "last" and out and not out[-1].get("nop"):
            out[-1]["last"] = 1
        else:
            assert self.end == "nop" or not self.updates, "end='last' needs an update"
            out.append(garbage_item(rng) | {"last": 1})
        if self.bad_at is not None and self.bad_nop:
            out.insert(self.bad_at, garbage_item(rng) | {"bad": 1})
        elif self.bad_at is not None:
            out[self.bad_at]["bad"] = 1
        return out


def garbage_item(rng: random.Random) -> dict:
    """A ``nop`` item with random row, line, weight and gradient (to be ignored)."""
    return {"row": rng.getrandbits(32), "line": rng.getrandbits(7),
            "weight": rng.getrandbits(32), "grad": rng.getrandbits(512), "nop": 1}


def desc(table: Table, indices, offsets, grads, weights=None, *, acc_rows: int = ACC_ROWS,
         end: str = "nop", nop_fraction: float = 0.0, bad_at: int | None = None,
         pass_: tuple[int, int] = (0, 0)) -> Desc:
    """A descriptor on ``table``; its expected effect applied to ``table.want`` (after
    the descriptors made before it: make them in feeding order). With ``bad_at`` its
    item of that index comes ``bad`` (a failed read upstream): nothing is written. With
    ``pass_`` only the rows of that pass are counted and updated (the others' items
    are ignored)."""
    indices = np.asarray(indices, np.int32)
    offsets = np.asarray(offsets, np.int32)
    counted = [r for bag in bags(indices, offsets) for r in bag if in_pass(r, *pass_)]
    rows = list(dict.fromkeys(counted))
    # The golden overflow point; rows only (one line each against acc_rows lines): the
    # bench's accumulator has lines for acc_rows rows of the widest item count.
    at = overflow_at(counted, 1, (acc_rows, acc_rows))
    d = Desc(table, indices, offsets, weights, grads, end=end, nop_fraction=nop_fraction,
             updates=len(counted), distinct=len(rows), overflow=len(rows) > acc_rows,
             overflow_at=at or 0, rows=rows, bad_at=bad_at, pass_=pass_)
    if d.writes:
        new = update(table.want, indices, offsets, grads, weights=weights,
                     rounding="nearest")
        want = table.want.copy()
        want[rows] = new[rows]              # the other rows are not in the pass
        table.want = want
    return d


def random_desc(rng: np.random.Generator, table: Table, *, num_bags: int, weighted: bool,
                zipf: float | None, special: float = 0.03, grad_scale: float = 2.0 ** -3,
                **kwargs) -> Desc:
    """Random bags (some empty) over ``table``'s rows, random gradients and weights."""
    indices, offsets = random_bags(rng, num_bags, table.rows, pooling=3, zipf_alpha=zipf,
                                   max_len=8, empty_fraction=0.1)
    return desc_with(rng, table, indices, offsets, weighted=weighted, special=special,
                     grad_scale=grad_scale, **kwargs)


def desc_with(rng: np.random.Generator, table: Table, indices, offsets, *, weighted: bool,
              special: float = 0.03, grad_scale: float = 2.0 ** -3, **kwargs) -> Desc:
    """Bags ``indices`` / ``offsets`` with random gradients and weights."""
    grads = sprinkle(rng, rng.standard_normal((len(offsets), table.dim)) * grad_scale,
                     special)
    weights = (sprinkle(rng, rng.standard_normal(len(indices)), special) if weighted
               else None)
    return desc(table, indices, offsets, grads, weights, **kwargs)


def check_tables(model: PmemModel, tables: list[Table], descs: list[Desc],
                 seed: int) -> None:
    """Every table's PMEM image against its expected contents, bit for bit (NaNs the
    canonical quiet NaN), and its padding bytes unchanged."""
    for t in tables:
        got_img = model.read(t.base, len(t.image))
        got = unpack_rows(got_img, t.rows, t.dim, t.dtype)
        uint = np.uint16 if t.bf16 else np.uint32
        gb, wb, ob = got.view(uint), t.want.view(uint), t.first.view(uint)
        bad = np.argwhere(gb != wb)
        if len(bad):
            per_line = 32 if t.bf16 else 16
            lines = []
            for r, e in bad[:6]:
                touched = [n for n, d in enumerate(descs) if d.table is t and r in d.rows]
                lines.append(
                    f"  row {r} elem {e} (table line {e // per_line}; item line {e // 16} "
                    f"lane {e % 16}): got {int(gb[r, e]):#x} want {int(wb[r, e]):#x} (was "
                    f"{int(ob[r, e]):#x}); descriptors naming the row: {touched}")
            raise AssertionError(
                f"SEED={seed}: table at {t.base:#x} ({t.dtype}, dim {t.dim}): "
                f"{len(bad)} elements differ\n" + "\n".join(lines))
        want_img = pack_rows(got, base=t.image)
        if want_img != got_img:
            pos = next(i for i, (a, b) in enumerate(zip(want_img, got_img, strict=True)) if a != b)
            stride = t.lines * LINE_BYTES
            raise AssertionError(
                f"SEED={seed}: table at {t.base:#x}: padding modified, row {pos // stride} "
                f"byte {pos % stride}: got {got_img[pos]:#x} want {want_img[pos]:#x}")


# --- the bench -----------------------------------------------------------------------

@dataclass
class Observed:
    dones: list[dict]
    cycles: int
    first_item: list[int]       # per descriptor: cycle of its first item transfer
    last_item: list[int]        # per descriptor: cycle of its last item transfer
    done_cycle: list[int]       # per descriptor: cycle of its o_done transfer
    reads: Counter              # line address -> lines read (AR)
    writes: Counter             # line address -> lines written (AW)
    errors: list[str] = field(default_factory=list)
    last_aw: dict[int, int] = field(default_factory=dict)   # descriptor -> cycle of its last AW


#: Cycles after the last ``o_done`` in which the block must stay quiet.
TAIL = 12


def pmem_model(seed: int, *, latency: int = 8, jitter: int = 12) -> PmemModel:
    return PmemModel(size=PMEM_SIZE, rng=random.Random(seed),
                     timing=PmemTiming(read_latency=latency, write_latency=latency,
                                       jitter=jitter))


def apart(a: Table, b: Table) -> bool:
    """Tables ``a`` and ``b`` share no byte."""
    return a.base + a.size <= b.base or b.base + b.size <= a.base


def run(dut: CoalescedUpdate, model: PmemModel, descs: list[Desc], *, seed: int,
        traffic: Traffic, max_cycles: int | None = None) -> Observed:
    """Feed ``descs``' items back to back and serve ``pmem`` from ``model``; returns
    what was observed. A descriptor's items wait for the ``o_done`` of every earlier
    descriptor whose table is not :func:`apart` from its own (the block's contract: its
    row reads may pass the earlier writes). The random idle and backpressure cycles
    follow the ``traffic`` of the descriptor whose ``o_done`` is awaited, or ``traffic``
    if it has none.

    Checks on the way: the stream rule on AR, AW, W and ``o_done``; 64-byte aligned
    INCR bursts of 64-byte beats inside 4 KiB and inside PMEM (the model raises
    otherwise); at each ``o_done`` transfer, that every write of that descriptor and
    the earlier ones has its B (and nothing at all is outstanding if the next
    descriptor has not started); after the last, :data:`TAIL` quiet cycles (no
    ``o_done``, no AR / AW / W)."""
    rng = random.Random(seed)
    traffics = [d.traffic or traffic for d in descs]
    ctrl_l = ctrl_layout(dut.addr_width)
    queue = [(n, pack(ctrl_l, d.ctrl()), pack(ITEM, it), it.get("last", 0),
              d.pass_[0] | (d.pass_[1] | d.defer << 32) << len(dut.pass_level))
             for n, d in enumerate(descs) for it in d.items(rng)]
    queue.reverse()
    if max_cycles is None:
        lines = sum(len(d.rows) * d.table.lines for d in descs)
        max_cycles = 20_000 + 40 * len(queue) + 200 * lines
    # Lines written (with their B) owed by the end of each descriptor, cumulated.
    owed = np.cumsum([len(d.rows) * d.table.lines if d.writes else 0 for d in descs])
    obs = Observed([], 0, [-1] * len(descs), [-1] * len(descs), [-1] * len(descs),
                   Counter(), Counter())
    checks = {n: StreamRule(n) for n in ("AR", "AW", "W", "o_done")}
    # Per descriptor, the line addresses it must read and write (each line of each
    # distinct row once) and, overflowing or with a read error, may read (nothing to
    # write). A line read or
    # written is charged to the oldest descriptor not yet complete that owes it (and
    # whose first item, or for a write last item, was taken); none: an error.
    must_r, may_r, must_w = [], [], []
    for d in descs:
        lines = Counter(a for r in d.rows for a in d.table.row_lines(r))
        must_r.append(lines if d.writes else Counter())
        may_r.append(Counter() if d.writes or d.defer else lines)   # deferred: none
        must_w.append(lines.copy() if d.writes else Counter())
    where = partial(describe, {id(d.table): d.table for d in descs}.values())

    def charge(kind: str, addr: int, cycle: int, upto: int, ended: int = -1) -> None:
        pools = (must_r, may_r) if kind == "AR" else (must_w,)
        for n in range(len(obs.dones), upto + 1):
            if kind == "AR" and descs[n].defer and n > ended:
                continue                # a deferred descriptor reads after its last item
            for c in pools:
                if c[n][addr]:
                    c[n][addr] -= 1
                    if kind == "AW":
                        obs.last_aw[n] = cycle
                    return
        obs.errors.append(f"cycle {cycle}: {kind} of line {where(addr)} owed by no "
                          f"descriptor in progress ({len(obs.dones)} to {upto})")

    p = dut.pmem
    mask = (1 << len(dut.i_items.payload.as_value())) - 1

    # Every input the bench drives, set in one ``ctx.set`` per cycle (each set of a
    # testbench settles the design, which dominates the run time).
    driven = {"valid": dut.i_items.valid, "item": dut.i_items.payload.as_value(),
              "ctrl": dut.i_ctrl.as_value(),
              "pass": Cat(dut.pass_level, dut.pass_value, dut.defer),
              "done_ready": dut.o_done.ready,
              "arready": p.arready, "awready": p.awready, "wready": p.wready,
              "rvalid": p.rvalid, "rid": p.rid, "rdata": p.rdata, "rresp": p.rresp,
              "rlast": p.rlast, "bvalid": p.bvalid, "bid": p.bid, "bresp": p.bresp}
    offsets, pos = {}, 0
    for name, sig in driven.items():
        offsets[name] = pos
        pos += len(sig)
    inputs = Cat(*driven.values())
    v = dict.fromkeys(driven, 0)

    async def bench(ctx):
        cur = beat = b = None
        cycle = 0
        started = -1                # latest descriptor an item of which was taken
        ended = -1                  # latest descriptor whose last item was taken
        aw_beats: dict[int, deque[int]] = {}
        lines_acked = 0
        last_set = None
        # Valid in the previous cycle, per channel: a ready is redrawn only then (fewer
        # input changes, and each change costs a settle of the design).
        d_valid = arvalid = awvalid = wvalid = True
        init_cycles = 0
        while len(obs.dones) < len(descs):
            t = traffics[len(obs.dones)]
            if cycle >= max_cycles:
                raise AssertionError(
                    f"SEED={seed}: timeout after {cycle} cycles: {len(obs.dones)} of "
                    f"{len(descs)} descriptors done, {len(queue) + (cur is not None)} items "
                    f"not taken, PMEM outstanding (reads, writes) {model.outstanding}")
            held = queue and any(not apart(descs[k].table, descs[queue[-1][0]].table)
                                 for k in range(len(obs.dones), queue[-1][0]))
            if cur is None and queue and not held and not rng.random() < t.idle:
                cur = queue.pop()
                v["ctrl"], v["item"], v["pass"] = cur[1], cur[2], cur[4]
            elif cur is None and v["valid"]:
                # Idle after a transfer: the payload turns to garbage (i_ctrl holds the
                # descriptor's settings).
                v["item"] = rng.getrandbits(600) & mask
            v["valid"] = cur is not None
            if d_valid:
                v["done_ready"] = not rng.random() < t.done_bp
            if arvalid:
                v["arready"] = not rng.random() < t.ar_bp
            if awvalid:
                v["awready"] = not rng.random() < t.aw_bp
            if wvalid:
                v["wready"] = not rng.random() < t.w_bp
            if beat is None and not rng.random() < t.r_idle:
                beat = model.r_beat(cycle)
                if beat is not None:
                    v["rid"], v["rdata"], v["rresp"], v["rlast"] = beat
            v["rvalid"] = beat is not None
            if b is None and not rng.random() < t.b_idle:
                b = model.b_resp(cycle)
                if b is not None:
                    v["bid"], v["bresp"] = b
            v["bvalid"] = b is not None
            value = 0
            for name, off in offsets.items():
                value |= int(v[name]) << off
            if value != last_set:
                ctx.set(inputs, value)
                last_set = value
            (_, _, init, i_ready, d_valid, d_ready, d_p, arvalid, arready, awvalid, awready,
             wvalid, wready, wdata, wstrb, wlast, rready, bready,
             *addr) = await ctx.tick().sample(
                dut.init, dut.i_items.ready, dut.o_done.valid, dut.o_done.ready,
                dut.o_done.payload.as_value(), p.arvalid, p.arready, p.awvalid, p.awready,
                p.wvalid, p.wready, p.wdata, p.wstrb, p.wlast, p.rready, p.bready,
                p.arid, p.araddr, p.arlen, p.arsize, p.arburst,
                p.awid, p.awaddr, p.awlen, p.awsize, p.awburst)
            ar, aw = tuple(addr[:5]), tuple(addr[5:])
            if init:
                # The hash table is cleared in the first 2 * acc_rows cycles only, taking
                # no item.
                if cycle != init_cycles or i_ready:
                    obs.errors.append(f"cycle {cycle}: init high after {init_cycles} init "
                                      f"cycles, i_items.ready {i_ready}")
                init_cycles += 1
            if cur is not None and i_ready:
                n = cur[0]
                if obs.first_item[n] < 0:
                    obs.first_item[n] = cycle
                obs.last_item[n] = cycle
                started = max(started, n)
                if cur[3]:
                    ended = n
                cur = None
            checks["AR"].observe(cycle, arvalid, arready, ar)
            checks["AW"].observe(cycle, awvalid, awready, aw)
            checks["W"].observe(cycle, wvalid, wready, (wdata, wstrb, wlast))
            checks["o_done"].observe(cycle, d_valid, d_ready, d_p)
            if arvalid and arready:
                assert ar[1] % LINE_BYTES == 0, f"SEED={seed}: AR address {ar[1]:#x} unaligned"
                model.accept_ar(ar[0], ar[1], ar[2], cycle, size=ar[3], burst=ar[4])
                for k in range(ar[2] + 1):
                    obs.reads[ar[1] + LINE_BYTES * k] += 1
                    charge("AR", ar[1] + LINE_BYTES * k, cycle, started, ended)
            if awvalid and awready:
                assert aw[1] % LINE_BYTES == 0, f"SEED={seed}: AW address {aw[1]:#x} unaligned"
                model.accept_aw(aw[0], aw[1], aw[2], cycle, size=aw[3], burst=aw[4])
                for k in range(aw[2] + 1):
                    obs.writes[aw[1] + LINE_BYTES * k] += 1
                    charge("AW", aw[1] + LINE_BYTES * k, cycle, ended)
                aw_beats.setdefault(aw[0], deque()).append(aw[2] + 1)
            if wvalid and wready:
                model.accept_w(wdata, wstrb, bool(wlast), cycle)
            if beat is not None and rready:
                model.r_accept(cycle)
                beat = None
            if b is not None and bready:
                model.b_accept(cycle)
                lines_acked += aw_beats[b[0]].popleft()
                b = None
            if d_valid and d_ready:
                n = len(obs.dones)
                obs.dones.append(unpack(DONE, d_p))
                obs.done_cycle[n] = cycle
                # Durable at completion: every write of this descriptor has its B.
                assert lines_acked >= owed[n], (
                    f"SEED={seed}: descriptor {n} completed with {owed[n] - lines_acked} "
                    f"written lines still without B")
                if started <= n:
                    assert model.outstanding == (0, 0), (
                        f"SEED={seed}: descriptor {n} completed with PMEM requests "
                        f"outstanding (reads, writes) {model.outstanding}")
                for kind, left in (("read", +must_r[n]), ("written", +must_w[n])):
                    if left:
                        obs.errors.append(
                            f"cycle {cycle}: descriptor {n} completed with lines not "
                            f"{kind}: " + ", ".join(f"{where(a)} x{c}"
                                                    for a, c in list(left.items())[:6]))
            cycle += 1
        obs.cycles = cycle
        if init_cycles != 2 * dut.acc_rows:
            obs.errors.append(f"init high for {init_cycles} cycles, not 2 * acc_rows")
        for k in range(TAIL):
            _, _, *valids = await ctx.tick().sample(dut.o_done.valid, p.arvalid, p.awvalid,
                                                    p.wvalid)
            assert not any(valids), (
                f"SEED={seed}: {k + 1} cycles after the last o_done: o_done / AR / AW / W "
                f"valid {valids}")

    simulate_dut(dut, bench)
    obs.errors += [e for c in checks.values() for e in c.errors]
    assert not queue, f"SEED={seed}: {len(queue)} items not taken"
    return obs


def check_done(descs: list[Desc], obs: Observed) -> list[str]:
    """The ``o_done`` records against the descriptors: the differences."""
    errors = []
    for n, (d, done) in enumerate(zip(descs, obs.dones, strict=True)):
        want = {"rows_written": d.distinct if d.writes else 0, "updates": d.updates,
                "overflow": int(d.overflow), "read_error": int(d.read_error),
                "overflow_at": d.overflow_at}
        got = {k: done.get(k) for k in want}
        if got != want:
            errors.append(f"descriptor {n}: o_done {got}, want {want}")
    return errors


def describe(tables, addr: int) -> str:
    """A line address, with its table, row and line."""
    for t in tables:
        if t.base <= addr < t.base + t.size:
            off = (addr - t.base) // LINE_BYTES
            return f"{addr:#x} (table at {t.base:#x}, row {off // t.lines} line {off % t.lines})"
    return f"{addr:#x} (outside every table)"


def check_run(dut: CoalescedUpdate, model: PmemModel, tables: list[Table],
              descs: list[Desc], *, seed: int, traffic: Traffic) -> Observed:
    """:func:`run`, then every check: the traffic and stream errors found on the way,
    the tables (:func:`check_tables`) and the ``o_done`` records, all reported
    together."""
    obs = run(dut, model, descs, seed=seed, traffic=traffic)
    print(f"{len(descs)} descriptors, {obs.cycles} cycles")
    errors = obs.errors[:10]
    if len(obs.errors) > 10:
        errors.append(f"... {len(obs.errors) - 10} more traffic / stream errors")
    try:
        check_tables(model, tables, descs, seed)
    except AssertionError as e:
        errors.append(str(e))
    errors += check_done(descs, obs)
    assert not errors, f"SEED={seed}:\n" + "\n".join(errors)
    return obs


#: Per parameter set: the block, its simulator (built once: compiling the design takes
#: seconds, far more than most runs) and the slot holding the bench of the current run.
_SIMS: dict[tuple, list] = {}


def new_dut(acc_rows: int = ACC_ROWS, max_items: int = MAX_ITEMS,
            id_width: int = 2, tails: int = 1) -> CoalescedUpdate:
    """The block for these parameters (one instance per parameter set, simulated by
    :func:`simulate_dut`)."""
    key = (acc_rows, max_items, id_width, tails)
    if key not in _SIMS:
        _SIMS[key] = [CoalescedUpdate(addr_width=ADDR_WIDTH, id_width=id_width,
                                      acc_rows=acc_rows, max_items=max_items, tails=tails),
                      None, [None]]
    return _SIMS[key][0]


def simulate_dut(dut: CoalescedUpdate, bench) -> None:
    """``tests.amaranth_sim.simulate(dut, bench)`` (one ``sync`` domain of 100 MHz), but
    the simulator is kept and reset for the next run of the same block: every run starts
    from the block's reset state, without recompiling the design."""
    entry = next(e for e in _SIMS.values() if e[0] is dut)
    sim, slot = entry[1], entry[2]
    slot[0] = bench
    if sim is None:
        top = Module()
        top.domains.sync = ClockDomain("sync")
        top.submodules.dut = dut
        sim = Simulator(top)
        sim.add_clock(1e-8)

        async def current(ctx):
            await slot[0](ctx)
        sim.add_testbench(current)
    else:
        sim.reset()
    entry[1] = None                 # kept only after a run that completed
    sim.run()
    entry[1] = sim


# --- parameters and layouts ----------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"acc_rows": 1}, {"acc_rows": 24}, {"acc_rows": 8192}, {"max_items": 0},
    {"max_items": 65}, {"tails": 0}, {"tails": 17},
], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_rejects_bad_parameters(kwargs):
    args = {"addr_width": ADDR_WIDTH, "id_width": 2, "acc_rows": 16, "max_items": 4} | kwargs
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        CoalescedUpdate(**args)


def test_layouts():
    assert {n: m.width for n, m in DONE} == {"rows_written": 32, "updates": 32, "overflow": 1,
                                            "read_error": 1, "overflow_at": 32}
    assert {n: m.width for n, m in ITEM} == {"row": 32, "line": 7, "weight": 32, "grad": 512,
                                            "last": 1, "nop": 1, "bad": 1}
    assert [n for n, _ in ctrl_layout(ADDR_WIDTH)] == [
        "table_base", "lines_per_row", "bf16", "weighted", "dim"]


# --- random runs ---------------------------------------------------------------------

#: (dtype, dim) of the random runs: fp32 rows of 1, 2 and 6 lines, bf16 rows of 1, 2
#: and 3 lines (up to ``MAX_ITEMS`` = 6 items per index), row padding in all but dims
#: 32 (fp32) and 64 (bf16), for bf16 dim 91 in the same 32-bit word as the last
#: element; each run takes half.
SHAPES = {"a": [(FP32, 7), (BF16, 64), (FP32, 84)],
          "b": [(BF16, 20), (FP32, 32), (BF16, 91)]}
#: The traffic of the descriptors of a random run, in turn from a random start.
TRAFFICS = [ROUGH, SMOOTH, ROUGH, IDLE]


def mixed(nrng: np.random.Generator, model: PmemModel, shapes, *, rows: int, num_bags: int,
          nop_fraction: float) -> tuple[list[Table], list[Desc]]:
    """One descriptor per shape, each on its own table (32 KiB apart plus a few lines,
    so some rows straddle a 4 KiB boundary), then one more on the first table; each
    randomly weighted, uniform or Zipf, ended either way, and with its traffic."""
    tables, descs = [], []
    for n, (dtype, dim) in enumerate(shapes):
        base = 0x8000 * (n + 1) + 64 * int(nrng.integers(0, 64))
        tables.append(make_table(nrng, model, base, dtype=dtype, dim=dim, rows=rows))
    phase = int(nrng.integers(0, len(TRAFFICS)))
    for k, n in enumerate([*range(len(shapes)), 0]):
        d = random_desc(nrng, tables[n], num_bags=num_bags, weighted=bool(nrng.random() < .6),
                        zipf=1.1 if nrng.random() < .6 else None, nop_fraction=nop_fraction,
                        end="last" if nrng.random() < .5 else "nop")
        if d.end == "last" and not d.updates:
            d.end = "nop"
        d.traffic = TRAFFICS[(phase + k) % len(TRAFFICS)]
        descs.append(d)
    return tables, descs


@pytest.mark.parametrize("shapes", list(SHAPES))
def test_random_descriptors(shapes, seed):
    """Descriptors back to back (see the module docstring): rows repeat within and
    across bags, a table is updated twice, traffic rough, smooth or idle in turn. Each
    descriptor is of another table than the one before it, so its items may be (and
    some are) taken before the one before it has reported."""
    nrng = np.random.default_rng(seed)
    model = pmem_model(seed)
    tables, descs = mixed(nrng, model, SHAPES[shapes], rows=20, num_bags=5,
                          nop_fraction=0.1)
    obs = check_run(new_dut(), model, tables, descs, seed=seed, traffic=ROUGH)
    early = [n for n in range(1, len(descs))
             if 0 <= obs.first_item[n] < obs.done_cycle[n - 1]]
    print(f"descriptors taken before the previous one reported: {early}")
    assert early, "no descriptor overlapped the one before it"


# --- hazards: long runs of few rows ------------------------------------------------------

#: Rows named over and over: one row; two alternating; three in turn; four at random.
PATTERNS = {"one_row": (3,), "two_rows": (1, 2), "three_rows": (0, 5, 9),
            "random4": (2, 6, 11, 14)}
#: (pattern, dtype, dim, weighted): fp32 rows of 1 line (with and without padding) and
#: 2 lines, bf16 rows of 1 line (two items per index, one per half), weighted and not.
RUNS = [("one_row", FP32, 7, False), ("one_row", FP32, 16, True),
        ("one_row", BF16, 32, True), ("two_rows", FP32, 16, False),
        ("two_rows", BF16, 21, True), ("three_rows", FP32, 7, True),
        ("three_rows", BF16, 32, False), ("random4", FP32, 32, True)]


def test_long_runs_accumulate_every_contribution(seed):
    """Index after index of the same row(s): each gradient line must be added to the
    sum of the ones before it (and a new row's first line start its sum), at every
    distance: no idle cycles for half of the descriptors, random gaps for the others."""
    nrng = np.random.default_rng(seed)
    model = pmem_model(seed, latency=4, jitter=4)
    tables, descs = [], []
    for n, (pattern, dtype, dim, weighted) in enumerate(RUNS):
        rows = PATTERNS[pattern]
        t = make_table(nrng, model, 0x4000 * (n + 1), dtype=dtype, dim=dim, rows=16,
                       special=0.0)
        lengths = nrng.integers(3, 7, 3)
        total = int(lengths.sum())
        if pattern == "random4":
            indices = nrng.choice(rows, total)
        else:
            phase = int(nrng.integers(0, len(rows)))
            indices = [rows[(phase + k) % len(rows)] for k in range(total)]
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        # Gradients as large as the table (so every contribution shows) and no
        # specials (a NaN would hide the rest of a row's sum).
        d = desc_with(nrng, t, indices, offsets, weighted=weighted, special=0.0,
                      grad_scale=1.0, end="last" if n % 3 else "nop")
        d.traffic = IDLE if n % 2 else SMOOTH
        tables.append(t)
        descs.append(d)
    check_run(new_dut(), model, tables, descs, seed=seed, traffic=SMOOTH)


def test_signed_zeros(seed):
    """The sum starts with the first contribution (not +0): -0 rows with -0 gradients
    stay -0 when named once or several times, +0 + -0 is +0."""
    nrng = np.random.default_rng(seed)
    model = pmem_model(seed, latency=4, jitter=2)
    tables, descs = [], []
    for n, (dtype, dim) in enumerate([(FP32, 20), (BF16, 41)]):
        t = make_table(nrng, model, 0x8000 * (n + 1), dtype=dtype, dim=dim, rows=8)
        # Rows 0-3: -0; rows 4-7: +0 (the padding keeps its random bytes).
        t.first[:4] = np.array(-0.0, dtype)
        t.first[4:] = np.array(0.0, dtype)
        t.image = pack_rows(t.first, base=t.image)
        t.want = t.first.copy()
        model.write(t.base, t.image)
        grads = np.full((3, dim), -0.0, np.float32)
        grads[2, ::2] = 0.0
        # Rows 0 and 4 once, 1 and 5 twice, 2 and 6 three times; 3 and 7 by bag 2 only.
        indices = [0, 1, 2, 4, 5, 6, 1, 2, 5, 6, 2, 6, 3, 7]
        offsets = [0, 6, 12]
        weights = (np.array([1, 2, -0.0, 3, 1, 1, 2, 1, 1, 1, 1, 1, 5, 1], np.float32)
                   if n else None)
        tables.append(t)
        descs.append(desc(t, indices, offsets, grads, weights, end="last"))
    for t in tables:
        assert np.signbit(t.want[:3].astype(np.float32)).any()    # the test has teeth
    check_run(new_dut(), model, tables, descs, seed=seed, traffic=SMOOTH)


# --- overflow and empty descriptors ------------------------------------------------------

def overflowing(nrng: np.random.Generator, t: Table, where: str, *, weighted: bool,
                end: str) -> Desc:
    """``ACC_ROWS + 1`` distinct rows of ``t`` and repeats; the last new row comes
    second (``early``), in the middle, or last followed by a known row (``end``)."""
    rows = [int(r) for r in nrng.permutation(t.rows)[:ACC_ROWS + 1]]
    extra = rows.pop()
    seq = rows + [int(r) for r in nrng.choice(rows, 4)]
    seq.insert({"early": 1, "middle": len(seq) // 2, "end": len(seq)}[where], extra)
    if where == "end":
        seq.append(rows[0])
    d = desc_with(nrng, t, seq, [0, 3, 3, 9], weighted=weighted, end=end)
    assert d.overflow
    return d


def full(nrng: np.random.Generator, t: Table, *, end: str) -> Desc:
    """Exactly ``ACC_ROWS`` distinct rows of ``t`` (not an overflow), repeats included."""
    rows = [int(r) for r in nrng.permutation(t.rows)[:ACC_ROWS]]
    seq = rows + [int(r) for r in nrng.choice(rows, 3)]
    d = desc_with(nrng, t, seq, [0, 4, 9], weighted=True, end=end)
    assert not d.overflow and d.distinct == ACC_ROWS
    return d


def test_overflow_then_normal(seed):
    """Descriptors of ``acc_rows + 1`` distinct rows (the last new one early, in the
    middle or at the end): ``overflow``, ``rows_written`` 0, nothing written; each
    followed by one of exactly ``acc_rows`` distinct rows of the same table (no
    overflow), applied normally."""
    nrng = np.random.default_rng(seed)
    model = pmem_model(seed)
    # 64K rows: the rows named are spread over all 16 bits of a row number.
    f32 = make_table(nrng, model, 0x8000 + 64 * int(nrng.integers(0, 64)), dtype=FP32,
                     dim=12, rows=1 << 16)
    b16 = make_table(nrng, model, 0x50_0000, dtype=BF16, dim=20, rows=2 * ACC_ROWS)
    descs = [overflowing(nrng, f32, "early", weighted=True, end="last"),
             full(nrng, f32, end="nop"),
             overflowing(nrng, b16, "end", weighted=False, end="nop"),
             full(nrng, b16, end="last"),
             overflowing(nrng, f32, "middle", weighted=False, end="nop"),
             random_desc(nrng, f32, num_bags=3, weighted=False, zipf=None)]
    for n, d in enumerate(descs):
        d.traffic = ROUGH if n % 2 else SMOOTH
    check_run(new_dut(), model, [f32, b16], descs, seed=seed, traffic=ROUGH)


def test_passes_update_only_their_rows(seed):
    """One UPDATE's items fed as the passes of a multi-pass UPDATE: ``(1, 0)`` then
    ``(1, 1)`` (together the whole UPDATE), then four ``(3, v)`` passes that split one
    level-1 half of another UPDATE, and its other half; each pass updates, counts
    and reads only its own rows (``docs/embedding.md``, "Passes"), so the table ends
    as after the UPDATE applied once. Then a level-0 descriptor (every row), a pass
    whose own rows overflow the accumulator: nothing written, and another level-0
    descriptor. The passes come with ``defer``, as the engine sends them: their rows
    are read only after their last item, and the overflowed one reads none; the
    level-0 descriptors read ahead (the first of them, of another table than the pass
    before it, while that pass's rows are being read)."""
    nrng = np.random.default_rng(seed)
    rng = random.Random(seed)
    model = pmem_model(seed)
    t = make_table(nrng, model, 0x8000, dtype=FP32, dim=20, rows=256)
    b16 = make_table(nrng, model, 0x20_0000, dtype=BF16, dim=40, rows=64)
    descs = []
    for table, n in ((t, 24), (b16, 20)):
        seq = [int(r) for r in nrng.choice(table.rows, n)] + [int(r) for r in nrng.choice(4, 6)]
        offsets = [0, n // 3, n // 2, n]
        grads = sprinkle(nrng, nrng.standard_normal((4, table.dim)) * 2.0 ** -3, 0.03)
        weights = sprinkle(nrng, nrng.standard_normal(len(seq)), 0.03)
        value = rng.randrange(2)
        split = [(3, value | 2 * k) for k in range(4)] + [(1, 1 - value)]
        for p in ([(1, 0), (1, 1)], split)[table is b16]:
            descs.append(desc(table, seq, offsets, grads, weights, pass_=p,
                              end=rng.choice(["nop", "last"])))
    descs.append(random_desc(nrng, t, num_bags=3, weighted=True, zipf=None))
    # ACC_ROWS + 1 rows all in pass (2, 3): that pass overflows.
    many = [r for r in range(t.rows) if in_pass(r, 2, 3)][:ACC_ROWS + 1]
    over = desc_with(nrng, t, many + many[:3], [0, 5, len(many) + 3], weighted=False,
                     pass_=(2, 3))
    assert over.overflow
    descs += [over, random_desc(nrng, b16, num_bags=3, weighted=False, zipf=None)]
    for d in descs:
        d.defer = d.pass_ != (0, 0)
    for d in descs:
        if d.end == "last" and not d.updates:
            d.end = "nop"
    assert all(d.updates for d in descs[:2]), "each half of the first UPDATE has rows"
    check_run(new_dut(), model, [t, b16], descs, seed=seed, traffic=ROUGH)


@pytest.mark.parametrize("tails", [1, 4])
def test_many_writes_without_b(seed, tails):
    """Descriptors of 200 and 150 distinct one-line rows against a PMEM whose Bs come
    600 cycles after each write: hundreds of writes are owed a B at once, and
    ``o_done`` must still wait for every one (a narrow count of the writes owed would
    wrap and report a descriptor before its rows are durable)."""
    nrng = np.random.default_rng(seed)
    model = PmemModel(size=PMEM_SIZE, rng=random.Random(seed),
                      timing=PmemTiming(read_latency=8, write_latency=600, jitter=0))
    tables, descs = [], []
    for n, distinct in enumerate((200, 150)):
        t = make_table(nrng, model, 0x4_0000 * (n + 1), dtype=FP32, dim=16, rows=256)
        rows = [int(r) for r in nrng.permutation(t.rows)[:distinct]]
        descs.append(desc_with(nrng, t, rows, [0, distinct // 4, distinct // 2],
                               weighted=False, end="last", acc_rows=256))
        tables.append(t)
    check_run(new_dut(acc_rows=256, tails=tails), model, tables, descs, seed=seed,
              traffic=SMOOTH)


def test_tails_overlap_write_latencies(seed):
    """``tails`` 4 against writes whose Bs take 150 cycles: descriptors of six tables
    back to back, each taken while up to four before it still wait for their Bs (some
    while two or more do), each reporting only once its own writes are durable and in
    order, tables and ``o_done`` as the golden model says; the last two are of the
    first two tables again, so their items wait for those descriptors' ``o_done``."""
    nrng = np.random.default_rng(seed)
    model = PmemModel(size=PMEM_SIZE, rng=random.Random(seed),
                      timing=PmemTiming(read_latency=8, write_latency=150, jitter=8))
    tables = [make_table(nrng, model, 0x8000 * (n + 1), dtype=FP32 if n % 2 else BF16,
                         dim=int(nrng.choice([16, 40])), rows=20) for n in range(6)]
    descs = []
    for t in [*tables, tables[0], tables[1]]:
        d = random_desc(nrng, t, num_bags=4, weighted=bool(nrng.random() < .5), zipf=None,
                        end="last")
        descs.append(d)
    obs = check_run(new_dut(tails=4), model, tables, descs, seed=seed, traffic=SMOOTH)
    deep = [n for n in range(2, len(descs)) if 0 <= obs.first_item[n] < obs.done_cycle[n - 2]]
    print(f"descriptors taken before the one two before reported: {deep}")
    assert deep, "no descriptor was taken while two before it waited for their Bs"


@pytest.mark.parametrize("tails", [1, 4])
def test_next_descriptor_accumulates_while_one_applies(seed, tails):
    """Row reads taking 120 cycles: descriptors of six tables back to back, each one's
    items taken while the one before still writes its rows (its first item before that
    one's last AW), tables and ``o_done`` as the golden model says."""
    nrng = np.random.default_rng(seed)
    model = PmemModel(size=PMEM_SIZE, rng=random.Random(seed),
                      timing=PmemTiming(read_latency=120, write_latency=8, jitter=8))
    tables = [make_table(nrng, model, 0x8000 * (n + 1), dtype=FP32 if n % 2 else BF16,
                         dim=int(nrng.choice([16, 40])), rows=20) for n in range(6)]
    descs = [random_desc(nrng, t, num_bags=4, weighted=bool(nrng.random() < .5), zipf=None,
                         end="last") for t in tables]
    obs = check_run(new_dut(tails=tails), model, tables, descs, seed=seed, traffic=SMOOTH)
    early = [n for n in range(1, len(descs))
             if n - 1 in obs.last_aw and 0 <= obs.first_item[n] < obs.last_aw[n - 1]]
    print(f"descriptors taken before the one before sent its last write: {early}")
    assert early, "no descriptor was taken while the one before still applied"


def test_nop_only_and_single_item_descriptors(seed):
    """A descriptor of only a ``nop`` + ``last`` item (and one of empty bags, ignored
    ``nop`` items before its end) completes with zeros and touches nothing; one whose
    only item is a real one with ``last`` updates its row; the descriptors around
    them are applied."""
    nrng = np.random.default_rng(seed)
    model = pmem_model(seed, latency=4, jitter=4)
    t = make_table(nrng, model, 0x8000, dtype=BF16, dim=47, rows=8)
    u = make_table(nrng, model, 0x9000, dtype=FP32, dim=16, rows=8)
    empty = np.zeros((0,), np.int32)
    descs = [desc(t, empty, [], np.zeros((0, t.dim), np.float32)),
             desc_with(nrng, t, [1, 2, 1], [0, 2], weighted=False, end="last"),
             desc(t, empty, [0, 0, 0], np.zeros((3, t.dim), np.float32)),
             desc_with(nrng, u, [5], [0], weighted=True, end="last"),
             desc(t, empty, [], np.zeros((0, t.dim), np.float32)),
             desc_with(nrng, u, [5], [0, 1], weighted=False, end="last"),
             desc_with(nrng, t, [2, 3], [0], weighted=True)]
    # Ignored nops before the end of the empty-bag descriptor.
    descs[2].items = lambda rng: [garbage_item(rng) for _ in range(3)] + [
        garbage_item(rng) | {"last": 1}]
    assert len(descs[3].items(random.Random(0))) == 1
    obs = check_run(new_dut(), model, [t, u], descs, seed=seed, traffic=ROUGH)
    for n in (0, 2, 4):
        assert obs.dones[n] == {"rows_written": 0, "updates": 0, "overflow": 0,
                                "read_error": 0, "overflow_at": 0}


# --- read errors -----------------------------------------------------------------------

def test_read_error_writes_nothing(seed):
    """An UPDATE one item of which comes ``bad`` (a read failed upstream): a real item
    in the middle, the final real item (with ``last``), only the final ``nop`` +
    ``last`` item (a failed read after the last row), an ignored ``nop`` item, an
    item of an overflowing UPDATE, the only item of an empty one. Nothing is written
    for it (no AW, no W: a write would be charged to no descriptor), ``o_done`` has
    ``read_error``, ``rows_written`` 0 and the counted ``updates``; each is followed
    by an UPDATE of the same rows (and one more), applied as the golden model says:
    the accumulator and the hash table start clean."""
    nrng = np.random.default_rng(seed)
    model = pmem_model(seed)
    f32 = make_table(nrng, model, 0x8000 + 64 * int(nrng.integers(0, 64)), dtype=FP32,
                     dim=40, rows=64)
    b16 = make_table(nrng, model, 0x50_0000, dtype=BF16, dim=20, rows=32)

    def pair(t: Table, where: str, *, end: str = "nop", weighted: bool = True,
             bad_nop: bool = False) -> list[Desc]:
        picked = [int(r) for r in nrng.permutation(t.rows)[:6]]
        seq = picked + [int(r) for r in nrng.choice(picked, 4)]
        offsets = [0, 3, 3, 7]
        n_items = (2 * t.lines if t.bf16 else t.lines) * len(seq) + (end == "nop")
        at = int(nrng.integers(1, n_items - 1)) if where == "middle" else -1
        bad = desc_with(nrng, t, seq, offsets, weighted=weighted, end=end, bad_at=at)
        bad.bad_nop = bad_nop
        again = [*seq, int(nrng.integers(0, t.rows))]
        nrng.shuffle(again)
        return [bad, desc_with(nrng, t, again, offsets, weighted=not weighted)]

    empty = np.zeros((0,), np.int32)
    descs = [*pair(f32, "middle"),
             *pair(b16, "middle", weighted=False),
             *pair(f32, "last", end="last"),                  # the final real item
             *pair(b16, "last"),                              # only the nop + last
             *pair(f32, "middle", bad_nop=True),              # an ignored nop item
             desc(f32, empty, [0], np.zeros((1, f32.dim), np.float32), bad_at=0),
             random_desc(nrng, f32, num_bags=3, weighted=True, zipf=1.1)]
    # Overflow and read error together.
    rows = [int(r) for r in nrng.permutation(f32.rows)[:ACC_ROWS + 1]]
    descs.append(desc_with(nrng, f32, rows, [0, 9], weighted=False, bad_at=3))
    assert descs[-1].overflow
    descs.append(full(nrng, f32, end="last"))
    for n, d in enumerate(descs):
        d.traffic = ROUGH if n % 2 else SMOOTH
    obs = check_run(new_dut(), model, [f32, b16], descs, seed=seed, traffic=ROUGH)
    assert sum(d["read_error"] for d in obs.dones) == 7


# --- throughput ----------------------------------------------------------------------

@pytest.mark.long
def test_cycles_per_gradient_line(seed):
    """No backpressure, PMEM latency 20 without jitter: prints, per descriptor, the
    cycles from its first item to its ``o_done`` per gradient line (no assertion)."""
    nrng = np.random.default_rng(seed)
    model = pmem_model(seed, latency=20, jitter=0)
    labelled = []

    def add(label, dtype, dim, weighted, indices, offsets):
        t = make_table(nrng, model, 0x8000 * (len(labelled) + 1), dtype=dtype, dim=dim,
                       rows=32)
        labelled.append((label, t, desc_with(nrng, t, indices, offsets, weighted=weighted)))

    for dtype, weighted in ((FP32, False), (BF16, True)):
        name = "fp32" if dtype == FP32 else "bf16"
        idx, offs = random_bags(nrng, 5, 16, pooling=3, zipf_alpha=1.1, max_len=8)
        add(f"{name} dim 64 {'weighted' if weighted else 'unweighted'}, Zipf bags over 16 "
            f"rows", dtype, 64, weighted, idx, offs)
    add("fp32 dim 16, one row x16", FP32, 16, True, [5] * 16, [0])
    add("bf16 dim 32, one row x8", BF16, 32, True, [5] * 8, [0])
    add("fp32 dim 64, 8 distinct rows once", FP32, 64, False, nrng.permutation(32)[:8], [0])
    tables = [t for _, t, _ in labelled]
    descs = [d for _, _, d in labelled]
    obs = check_run(new_dut(), model, tables, descs, seed=seed, traffic=SMOOTH)
    for n, (label, t, d) in enumerate(labelled):
        items = d.updates * d.n_items
        cycles = obs.done_cycle[n] - obs.first_item[n] + 1
        taking = obs.last_item[n] - obs.first_item[n] + 1
        print(f"{label}: {d.updates} indices, {items} gradient lines, {d.distinct} rows "
              f"({d.distinct * t.lines} lines read and written): {cycles} cycles from the "
              f"first item to o_done, {cycles / items:.2f} cycles per gradient line "
              f"({items / cycles:.2f} lines per cycle); items taken in {taking} cycles "
              f"({taking / items:.2f} per line), o_done "
              f"{obs.done_cycle[n] - obs.last_item[n]} cycles after the last")


def test_verilog_lints_clean(tmp_path):
    dut = CoalescedUpdate(addr_width=48, id_width=4, acc_rows=32, max_items=8)
    assert_lints_clean(dut, "coalesced_update_a48_r32_i8", tmp_path)
