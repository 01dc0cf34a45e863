# amaranth: UnusedElaboratable=no
"""PoolReduce (hw/engine/pool_reduce.py): the pooling arithmetic of LOOKUP, bit for bit
against the golden model ``sim.embedding.pool``.

Every data test feeds whole descriptors (table, indices, offsets, mode, weights) to both
the DUT (as the line stream the gather stage would deliver: counted rows in index order,
empty bags as lone items) and the golden model, and compares every element of every
pooled vector bit for bit (NaNs by class, the DUT's being canonical). Descriptors of
different dims, dtypes and modes follow each other in one run, so the control changes
while the previous bag is still being finished. A passive checker holds ``o_pooled`` to
the stream rules. Random idle input cycles and output backpressure derive from the
printed seed; ``SEED=<n>`` replays it. (The linter option on the first line lets tests
build blocks only to see them rejected.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from hw.engine.descriptor import PoolMode
from hw.engine.pool_reduce import CTRL, LINE, POOLED, PoolReduce
from sim.embedding import BF16, FP32, lines_per_row, pack_rows, pool, unpack_rows

from .conftest import assert_lints_clean
from .payload import pack, unpack

SUM, MEAN, MAX = PoolMode.SUM, PoolMode.MEAN, PoolMode.MAX
#: Cycles the sink keeps watching after the last expected line.
DRAIN = 20
DTYPES = {"fp32": FP32, "bf16": BF16}
#: Dims giving 1, 2, 3 and 5 lines per row.
DIMS = {"fp32": (7, 32, 40, 80), "bf16": (20, 64, 90, 150)}



# --- stimulus ------------------------------------------------------------------------

#: fp32 encodings the tables and weights are sprinkled with.
SPECIALS = np.array([
    0x0000_0000, 0x8000_0000,                       # +-0
    0x7F80_0000, 0xFF80_0000,                       # +-inf
    0x7FC0_0000, 0xFFC0_0001, 0x7F80_0001,          # quiet, signed, signalling NaN
    0x0000_0001, 0x8000_0001, 0x007F_FFFF, 0x0040_0000, 0x8001_0000,  # subnormals
    0x0080_0000, 0x7F7F_FFFF, 0xFF7F_FFFF,          # smallest normal, +-largest
], np.uint32)
#: Their bf16 counterparts, and bf16 subnormals and NaN payloads.
BF16_SPECIALS = np.concatenate([
    (SPECIALS >> 16).astype(np.uint16),
    np.array([0x0001, 0x8001, 0x007F, 0x7FC1, 0x7F81, 0xFF81], np.uint16),
])


def random_table(rng: np.random.Generator, rows: int, dim: int, dtype,
                 special: float = 0.0) -> np.ndarray:
    """Values of mixed magnitude and sign (so sums round and cancel), a fraction
    ``special`` replaced by the encodings in ``SPECIALS``."""
    mag = rng.standard_normal((rows, dim)) * 2.0 ** rng.integers(-6, 7, (rows, dim))
    table = mag.astype(np.float32)
    if dtype == BF16:
        table = table.astype(BF16)
    specials = SPECIALS if dtype == FP32 else BF16_SPECIALS
    hit = rng.random((rows, dim)) < special
    table.view(specials.dtype)[hit] = rng.choice(specials, int(hit.sum()))
    return table


@dataclass
class Desc:
    """One LOOKUP's pooling work: what the golden model and the DUT both receive."""
    table: np.ndarray
    indices: np.ndarray
    offsets: np.ndarray
    mode: PoolMode
    weights: np.ndarray | None = None
    padding_idx: int | None = None

    @property
    def dim(self) -> int:
        return self.table.shape[1]

    @property
    def lines(self) -> int:
        return lines_per_row(self.dim, self.table.dtype)

    @property
    def num_bags(self) -> int:
        return len(self.offsets)

    def expected(self, partials: int) -> np.ndarray:
        return pool(self.table, self.indices, self.offsets, mode=self.mode,
                    weights=self.weights, padding_idx=self.padding_idx, partials=partials)

    def ctrl(self) -> int:
        return pack(CTRL, mode=self.mode.value, weighted=self.weights is not None,
                    bf16=self.table.dtype == BF16, lines_per_row=self.lines)

    def items(self) -> list[int]:
        """The ``i_lines`` payloads: every counted row of every bag, line by line."""
        image = pack_rows(self.table)
        stride = self.lines * 64
        ends = [*self.offsets[1:].tolist(), len(self.indices)]
        items = []
        for start, end in zip(self.offsets.tolist(), ends, strict=True):
            counted = [pos for pos in range(start, end) if self.indices[pos] != self.padding_idx]
            if not counted:
                items.append(pack(LINE, empty_bag=1))
            for k, pos in enumerate(counted):
                row = int(self.indices[pos])
                weight = 0 if self.weights is None else int(self.weights[pos:pos + 1]
                                                            .view(np.uint32)[0])
                for line in range(self.lines):
                    chunk = image[row * stride + line * 64:row * stride + line * 64 + 64]
                    items.append(pack(LINE, data=int.from_bytes(chunk, "little"), line=line,
                                      row_k=k, last_row=k == len(counted) - 1,
                                      weight=weight, count=len(counted)))
        return items


def random_desc(rng: np.random.Generator, *, dim: int, dtype, mode: PoolMode,
                weighted: bool = False, lengths: list[int], special: float = 0.05,
                padding_idx: int | None = None) -> Desc:
    """Bags of the given lengths (0 = empty) over a small random table."""
    rows = 12
    table = random_table(rng, rows, dim, dtype, special)
    indices = rng.integers(0, rows, sum(lengths)).astype(np.int32)
    if padding_idx is not None:
        indices[rng.random(indices.size) < 0.2] = padding_idx
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    weights = None
    if weighted:
        weights = (rng.standard_normal(indices.size) * 2.0 ** rng.integers(-4, 5, indices.size)
                   ).astype(np.float32)
        hit = rng.random(indices.size) < special
        weights.view(np.uint32)[hit] = rng.choice(SPECIALS, int(hit.sum()))
    return Desc(table, indices, offsets, mode, weights, padding_idx)


# --- test bench ----------------------------------------------------------------------

@dataclass
class TB:
    """Amaranth-simulator bench for :class:`PoolReduce`.

    Owns a source on ``i_lines`` (each line with its descriptor's ``ctrl``; random idle cycles
    when ``idle``), a sink on ``o_pooled`` (random backpressure when ``backpressure``),
    a passive stream-rule checker on ``o_pooled`` and the scoreboard (``sim.embedding.
    pool``). Widths and parameters come from the DUT.
    """

    params: dict
    seed: int
    idle: bool = True
    backpressure: bool = True
    dut: PoolReduce = field(init=False)
    log: dict = field(init=False, default_factory=dict)

    def __post_init__(self):
        self.dut = PoolReduce(**self.params)
        self.rng = random.Random(self.seed)

    def run(self, descs: list[Desc], *, pause_sink: int = 0,
            reset_after: int = 0) -> list[dict[str, int]]:
        """Stream the descriptors through; returns the ``o_pooled`` transfers in order.

        ``pause_sink``: hold ``o_pooled.ready`` low for that many cycles first.
        ``reset_after``: pulse reset right after the last input transfer of the first
        ``reset_after`` descriptors (their bags still in flight); only the outputs after
        the reset are returned. ``self.log`` gets the cycle of every transfer.
        """
        dut = self.dut
        top = Module()
        top.submodules.dut = dut
        top.domains.sync = domain = ClockDomain("sync")
        work = [(d.ctrl(), item) for d in descs for item in d.items()]
        reset_at = sum(len(d.items()) for d in descs[:reset_after]) if reset_after else None
        wanted = sum(d.num_bags * d.lines for d in descs[reset_after:])
        log: dict[str, list] = {"accepted": [], "delivered": [], "out": []}
        finished = []
        # Generous: every beat of every row alone in the pipeline, and a combination of
        # 8 rounds per bag, with idle cycles and backpressure.
        beats = 2 * dut.beats_per_line
        bags = sum(d.num_bags for d in descs)
        limit = pause_sink + 3 * (beats * len(work) + bags * (8 * beats * 5 + 40)) + 200

        async def source(ctx):
            for index, (ctrl, item) in enumerate(work):
                while self.idle and self.rng.random() < 0.3:
                    await ctx.tick()
                ctx.set(dut.i_lines.payload.as_value(), item)
                ctx.set(dut.i_lines.payload.ctrl.as_value(), ctrl)
                ctx.set(dut.i_lines.valid, 1)
                # (Plain awaits rather than ``until``: an async generator left suspended
                # by a failing bench raises again when it is garbage-collected.)
                while not (await ctx.tick().sample(dut.i_lines.ready))[2]:
                    pass
                ctx.set(dut.i_lines.valid, 0)
                if index + 1 == reset_at:
                    ctx.set(domain.rst, 1)
                    await ctx.tick()
                    ctx.set(domain.rst, 0)
            finished.append(True)

        async def sink(ctx):
            for _ in range(pause_sink):
                await ctx.tick()
            for _ in range(limit):
                if finished and len(log["out"]) >= wanted:
                    # A few more ready cycles: any extra line would show up.
                    ctx.set(dut.o_pooled.ready, 1)
                    await ctx.tick().repeat(DRAIN)
                    return
                ctx.set(dut.o_pooled.ready,
                        not (self.backpressure and self.rng.random() < 0.3))
                await ctx.tick()
            raise AssertionError(f"seed {self.seed}: {len(log['out'])} of {wanted} lines "
                                 f"after {limit} cycles")

        async def monitor(ctx):
            # Transfers and the stream rules on o_pooled, sampled at every clock edge.
            cycle, held = 0, None
            i, o = dut.i_lines, dut.o_pooled
            while True:
                _, _, reset, i_valid, i_ready, valid, ready, payload = await ctx.tick().sample(
                    domain.rst, i.valid, i.ready, o.valid, o.ready, o.payload.as_value())
                if reset:
                    for transfers in log.values():
                        transfers.clear()
                else:
                    if held is not None:
                        assert valid, "o_pooled.valid dropped before the transfer"
                        assert payload == held, "o_pooled.payload changed before the transfer"
                    if i_valid and i_ready:
                        log["accepted"].append(cycle)
                    if valid and ready:
                        log["delivered"].append(cycle)
                        log["out"].append(unpack(POOLED, payload))
                held = payload if valid and not ready and not reset else None
                cycle += 1

        sim = Simulator(top)
        sim.add_clock(1e-8)
        sim.add_testbench(monitor, background=True)
        sim.add_testbench(source)
        sim.add_testbench(sink)
        sim.run()
        self.log = log
        return log["out"]

    def check(self, descs: list[Desc], **kwargs) -> list[dict[str, int]]:
        out = self.run(descs, **kwargs)
        check_outputs(descs[kwargs.get("reset_after", 0):], out, self.dut.partials, self.seed)
        return out


def check_outputs(descs: list[Desc], out: list[dict[str, int]], partials: int,
                  seed: int) -> None:
    """Every line's numbering and ``last`` flag, then every element bit for bit."""
    position = 0
    for number, desc in enumerate(descs):
        lines = out[position:position + desc.num_bags * desc.lines]
        position += len(lines)
        assert len(lines) == desc.num_bags * desc.lines, \
            f"seed {seed}: descriptor {number}: {len(lines)} lines"
        numbering = [(line["line"], line["last"]) for line in lines]
        assert numbering == [(k, k == desc.lines - 1)
                             for _ in range(desc.num_bags) for k in range(desc.lines)], \
            f"seed {seed}: descriptor {number}: line numbers / last flags {numbering}"
        image = b"".join(line["data"].to_bytes(64, "little") for line in lines)
        got = unpack_rows(image, desc.num_bags, desc.dim, desc.table.dtype)
        expected = desc.expected(partials)
        compare(expected, got, f"seed {seed}: descriptor {number} ({desc.mode.name}, "
                               f"{desc.table.dtype}, dim {desc.dim})")
    assert position == len(out), f"seed {seed}: {len(out) - position} extra lines"


def compare(expected: np.ndarray, got: np.ndarray, what: str) -> None:
    """Bit for bit; where the model's result is NaN the DUT's must be the canonical NaN."""
    uint, qnan = (np.uint32, 0x7FC0_0000) if expected.dtype == FP32 else (np.uint16, 0x7FC0)
    e, g = expected.view(uint), got.view(uint)
    nan = np.isnan(expected.astype(np.float32))
    bad = np.where(nan, g != qnan, g != e)
    if bad.any():
        where = [tuple(int(x) for x in w) for w in np.argwhere(bad)[:6]]
        raise AssertionError(f"{what}: {int(bad.sum())} mismatches (bag, element: "
                             f"expected, got): " + ", ".join(
                                 f"{w}: {e[w]:#x}, {g[w]:#x}" for w in where))


# --- constructor ---------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lanes": 5}, "lanes must be 4, 8 or 16, not 5"),
    ({"lanes": 32}, "lanes must be 4, 8 or 16, not 32"),
    ({"lanes": 4.0}, "lanes must be 4, 8 or 16, not 4.0"),
    ({"partials": 0}, "partials must be an integer from 1 to 8, not 0"),
    ({"partials": 9}, "partials must be an integer from 1 to 8, not 9"),
    ({"partials": True}, "partials must be an integer from 1 to 8, not True"),
    ({"max_lines_per_row": 0}, "max_lines_per_row must be an integer from 1 to 256, not 0"),
    ({"max_lines_per_row": 257},
     "max_lines_per_row must be an integer from 1 to 256, not 257"),
    ({"div_bits_per_cycle": 0}, "div_bits_per_cycle must be an integer from 1 to 25, not 0"),
    ({"div_bits_per_cycle": 26},
     "div_bits_per_cycle must be an integer from 1 to 25, not 26"),
    ({"div_bits_per_cycle": "5"},
     "div_bits_per_cycle must be an integer from 1 to 25, not '5'"),
])
def test_validation_names_the_bad_value(kwargs, message):
    with pytest.raises(ValueError) as info:
        PoolReduce(**kwargs)
    assert str(info.value) == message


def test_parameters_are_keyword_only():
    with pytest.raises(TypeError):
        PoolReduce(16)


def test_parameters_are_exposed():
    dut = PoolReduce(lanes=8, partials=3, max_lines_per_row=5, div_bits_per_cycle=2)
    assert (dut.lanes, dut.partials, dut.max_lines_per_row, dut.div_bits_per_cycle,
            dut.beats_per_line) == (8, 3, 5, 2, 2)
    default = PoolReduce()
    assert (default.lanes, default.partials, default.max_lines_per_row,
            default.div_bits_per_cycle, default.beats_per_line) == (16, 4, 64, 5, 1)
    with pytest.raises(AttributeError):
        dut.lanes = 4


# --- pooling, bit for bit --------------------------------------------------------------

CONFIGS = {
    "lanes4-p4": {"lanes": 4, "partials": 4, "max_lines_per_row": 10},
    "lanes4-p1": {"lanes": 4, "partials": 1, "max_lines_per_row": 10},
    "lanes8-p3": {"lanes": 8, "partials": 3, "max_lines_per_row": 10},
    "lanes16-p4": {"lanes": 16, "partials": 4, "max_lines_per_row": 10},
}

#: (mode, weighted) as the tests name them.
MODES = {"sum": (SUM, False), "wsum": (SUM, True), "mean": (MEAN, False), "max": (MAX, False)}


def mixed_lengths(rng: np.random.Generator, partials: int = 4) -> list[int]:
    """An empty and a length-1 bag, one of 2..P rows (fewer partials to combine than P)
    and one of P+1..2P+1 rows (partials updated twice or more), in random order."""
    lengths = [0, 1, int(rng.integers(2, max(2, partials) + 1)),
               int(rng.integers(partials + 1, 2 * partials + 2))]
    rng.shuffle(lengths)
    return lengths


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("config", ["lanes4-p4"])
def test_pool_matches_golden(config, dtype, mode, seed):
    rng = np.random.default_rng(seed)
    pool_mode, weighted = MODES[mode]
    descs = [random_desc(rng, dim=dim, dtype=DTYPES[dtype], mode=pool_mode, weighted=weighted,
                         lengths=mixed_lengths(rng)) for dim in DIMS[dtype]]
    TB(CONFIGS[config], seed).check(descs)


def mixed_descs(rng: np.random.Generator, partials: int) -> list[Desc]:
    """Four descriptors, 1, 2, 3 and 5 lines per row, fp32 and bf16 tables, every mode
    once, so the settings change from one descriptor to the next."""
    plan = [("fp32", 0, "max"), ("bf16", 1, "wsum"), ("bf16", 2, "mean"), ("fp32", 3, "sum")]
    return [random_desc(rng, dim=DIMS[dtype][which], dtype=DTYPES[dtype], mode=MODES[mode][0],
                        weighted=MODES[mode][1], lengths=mixed_lengths(rng, partials))
            for dtype, which, mode in plan]


@pytest.mark.parametrize("config", ["lanes4-p1", "lanes8-p3", "lanes16-p4"])
def test_other_configurations(config, seed):
    """P = 1 (PyTorch's order), a P that is not a power of two, one line per cycle."""
    rng = np.random.default_rng(seed)
    params = CONFIGS[config]
    TB(params, seed).check(mixed_descs(rng, params["partials"]))


@pytest.mark.parametrize("config", ["lanes4-p1", "lanes8-p3", "lanes16-p4"])
def test_dense_short_bags(config, seed):
    """Many short bags back to back with no idle cycle and a ready sink, so a bag's
    combination overlaps the next bag's rows as closely as it can: the combining
    pipeline reads the accumulating pipeline's last results by forwarding, and the two
    banks alternate bag by bag. Every mode, both dtypes, 1 to 5 lines per row."""
    rng = np.random.default_rng(seed)
    params = CONFIGS[config]
    descs = []
    for dtype, which, mode in [("fp32", 0, "sum"), ("fp32", 1, "max"), ("bf16", 0, "mean"),
                               ("bf16", 1, "wsum"), ("fp32", 3, "sum"), ("bf16", 2, "max")]:
        lengths = rng.integers(0, 2 * params["partials"] + 2, 8).tolist()
        descs.append(random_desc(rng, dim=DIMS[dtype][which], dtype=DTYPES[dtype],
                                 mode=MODES[mode][0], weighted=MODES[mode][1],
                                 lengths=lengths))
    TB(params, seed, idle=False, backpressure=False).check(descs)


@pytest.mark.parametrize(("idle", "backpressure"), [(False, False), (True, False),
                                                    (False, True)],
                         ids=["dense-ready", "idle-ready", "dense-backpressure"])
def test_stream_timing_does_not_change_results(idle, backpressure, seed):
    """The data tests run with idle cycles and backpressure both on; here each alone
    and neither."""
    rng = np.random.default_rng(seed)
    descs = [random_desc(rng, dim=40, dtype=FP32, mode=MEAN, lengths=[3, 0, 6]),
             random_desc(rng, dim=20, dtype=BF16, mode=SUM, lengths=[1, 5], weighted=True)]
    TB(CONFIGS["lanes4-p4"], seed, idle=idle, backpressure=backpressure).check(descs)


def test_long_bag(seed):
    """A bag of more than 200 rows (count above 8 bits) next to short ones, mean."""
    rng = np.random.default_rng(seed)
    lengths = [2, int(rng.integers(200, 230)), 0, 1]
    TB(CONFIGS["lanes4-p4"], seed).check(
        [random_desc(rng, dim=7, dtype=FP32, mode=MEAN, lengths=lengths, special=0.002)])


@pytest.mark.long
def test_throughput(seed):
    """lanes = 16, dense input and a ready sink: one line per cycle while accumulating
    whenever lines_per_row * P >= 3, the adder's latency (sum and max; results are
    forwarded to the operations issued 3 to 5 cycles after them), 2 lines per 3 cycles
    with one line and P = 2, and the final round emits one line per cycle. A bag's
    combination overlaps the next bag's rows: a stream of bags takes max(n * L,
    (R - 1) * max(L, 3) + L) cycles per bag (R = max(min(n, P) - 1, 1) rounds)."""
    rng = np.random.default_rng(seed)
    plan = [  # (dim, mode, bag lengths)
        (32, SUM, [30]), (32, MAX, [30]), (16, SUM, [24]),
        (80, SUM, [1]),                 # waits 2 cycles for the 24-row bag's combination
        (16, SUM, [8, 8, 8]),           # 8 cycles of rows against 7 of combination
        (64, SUM, [20, 20, 20]),        # the engine bench's p20: 80 against 12
        (64, SUM, [1] * 6),             # its p1: 4 against 4 (the first waits for 12)
        (16, SUM, [4] * 5),             # 4 against 7: combination-bound
    ]
    descs = [random_desc(rng, dim=dim, dtype=FP32, mode=mode, lengths=lengths, special=0)
             for dim, mode, lengths in plan]
    tb = TB(CONFIGS["lanes16-p4"], seed, idle=False, backpressure=False)
    tb.check(descs)
    accepted, delivered = tb.log["accepted"], tb.log["delivered"]
    # The input register takes a line when the one before it issues, so the gap after
    # transfer i is the wait of line i's issue: a bag's last line waits there for the
    # combining pipeline. First line of each bag:
    bounds = np.cumsum([0] + [lines_per_row(dim, FP32) * n for dim, _, lengths in plan
                              for n in lengths]).tolist()
    gaps = np.diff(accepted).tolist()
    slow = {i: g for i, g in enumerate(gaps) if g != 1}
    print(f"gaps other than 1 (after transfer i): {slow}")
    one_row_80 = bounds[3]                      # the 80-element row
    after_p20 = bounds[3 + 1 + 3 + 3]           # the first one-row bag
    four_row = bounds[3 + 1 + 3 + 3 + 6]        # the first 4-row bag
    expected = {one_row_80 + 4: 3,              # its 5th, last line waits 7 - 5 cycles
                after_p20 + 3: 12 - 4 + 1}      # the one-row bag after a 20-row bag
    for bag in range(2, 5):     # 4-row bags 2..4 (bag 1 follows a 4-cycle combination;
        # bag 5's last line has no transfer after it): 7 cycles each
        expected[four_row + 4 * bag - 1] = 7 - 3
    assert slow == expected, (slow, expected)
    assert np.diff(delivered[5:10]).tolist() == [1] * 4     # the 80-element row's lines
    # P = 2: rows k and k + 2 share a line, 2 cycles apart: 2 rows every 3 cycles.
    tb = TB({"lanes": 16, "partials": 2, "max_lines_per_row": 10}, seed, idle=False,
            backpressure=False)
    tb.check([random_desc(rng, dim=16, dtype=FP32, mode=SUM, lengths=[24], special=0)])
    accepted = tb.log["accepted"]
    assert np.diff(accepted[2:24:2]).tolist() == [3] * 10


def test_fill_with_sink_paused(seed):
    """With the output stalled the block fills, stops taking input, and loses nothing."""
    rng = np.random.default_rng(seed)
    descs = [random_desc(rng, dim=20, dtype=FP32, mode=SUM, lengths=[1, 2, 0, 1, 3, 1, 2, 1]),
             random_desc(rng, dim=20, dtype=FP32, mode=MEAN, lengths=[2, 1, 3, 0, 1])]
    pause = 600
    tb = TB(CONFIGS["lanes4-p4"], seed, idle=True, backpressure=True)
    tb.check(descs, pause_sink=pause)
    assert tb.log["accepted"][-1] > pause, "input was not held back by the stalled output"


def test_reset_in_the_middle_of_traffic(seed):
    """Reset drops the bags in flight: none of their lines appear, and the bags after
    the reset come out right."""
    rng = np.random.default_rng(seed)
    descs = [random_desc(rng, dim=40, dtype=FP32, mode=SUM, lengths=[3, 5]),
             random_desc(rng, dim=20, dtype=BF16, mode=MEAN, lengths=[2, 0, 6])]
    TB(CONFIGS["lanes4-p4"], seed).check(descs, reset_after=1)


# --- generated Verilog ---------------------------------------------------------------

@pytest.mark.parametrize("params", [{"lanes": 16}, {"lanes": 4, "partials": 3,
                                                   "max_lines_per_row": 5}],
                         ids=["lanes16-default", "lanes4-p3-m5"])
def test_verilog_lints_clean(params, tmp_path):
    name = "pool_reduce_" + "_".join(f"{k}{v}" for k, v in params.items())
    assert_lints_clean(PoolReduce(**params), name, tmp_path)
