"""Bulk-vector verification of the ``hw.arith`` units against numpy / ml_dtypes.

The golden model is numpy float32 arithmetic (``a + b``, ``a * b``, ``a / b``,
``numpy.maximum``) and ``ml_dtypes.bfloat16`` casts; the comparison rule is the one in
``docs/numerics.md``: where the reference is NaN the RTL must return its canonical NaN
(``0x7FC00000``, or ``0x7FC0`` for bf16), elsewhere the bits must be identical,
including the sign of zero. bf16 -> fp32 widening is compared bit for bit, NaN payloads
included.

The RTL side is a Verilator C++ model of the unit's generated Verilog driven by
``sim/fpcheck_main.cpp``, which streams vectors from a binary file with random idle
cycles and backpressure (about 7 M cycles/s on one core), so a million-vector check
takes about a second once built (the divider, 26 cycles per operation, about four).
Each (unit, parameters) pair builds once into ``build/fpcheck/<unit>-<tag>/`` under a
file lock; every run uses its own vector files, so ``pytest -n auto`` is safe.

Command line (``SEED`` or ``--seed`` replays a run)::

    python -m sim.fpcheck                              # every unit, 1M random vectors
    python -m sim.fpcheck --unit fp_div --count 20000 --seed 1 --param bits_per_cycle=2

Nothing here imports a simulator; ``hw`` is imported only to elaborate a unit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np
from filelock import FileLock

from . import toolenv

__all__ = [
    "BF16_QNAN",
    "QNAN",
    "UNITS",
    "CheckResult",
    "build",
    "check",
    "directed_vectors",
    "main",
    "mismatches",
    "random_vectors",
    "reference",
    "run_rtl",
]

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "fpcheck"
MAIN_CPP = Path(__file__).resolve().parent / "fpcheck_main.cpp"

QNAN = 0x7FC0_0000
BF16_QNAN = 0x7FC0
F32 = np.float32
U32 = np.uint32


# --- golden model ------------------------------------------------------------------------

def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=U32).view(F32)


def _binary(op: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    def ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(op(_f32(a), _f32(b)), dtype=F32).view(U32)
    return ref


def _to_bf16(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(all="ignore"):
        return _f32(a).astype(ml_dtypes.bfloat16).view(np.uint16).astype(U32)


def _from_bf16(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    return np.asarray(a, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(F32).view(U32)


@dataclass(frozen=True)
class UnitSpec:
    """What the harness needs to know about one unit."""

    name: str
    arity: int            # operands per operation (1 or 2)
    in_bits: int          # width of each operand
    reference: Callable[..., np.ndarray]
    #: The RTL's NaN where the reference is NaN; None compares NaNs bit for bit.
    nan: int | None
    defaults: dict = field(default_factory=dict)


UNITS: dict[str, UnitSpec] = {
    "fp_add": UnitSpec("fp_add", 2, 32, _binary(np.add), QNAN, {"stages": 3}),
    "fp_mul": UnitSpec("fp_mul", 2, 32, _binary(np.multiply), QNAN, {"stages": 3}),
    "fp_max": UnitSpec("fp_max", 2, 32, _binary(np.maximum), QNAN, {"stages": 1}),
    "fp_div": UnitSpec("fp_div", 2, 32, _binary(np.divide), QNAN, {"bits_per_cycle": 1}),
    "fp32_to_bf16": UnitSpec("fp32_to_bf16", 1, 32, _to_bf16, BF16_QNAN),
    "bf16_to_fp32": UnitSpec("bf16_to_fp32", 1, 16, _from_bf16, None),
}


def _spec(unit: str) -> UnitSpec:
    try:
        return UNITS[unit]
    except KeyError:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, not {unit!r}") from None


def reference(unit: str, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Reference result bits (uint32) of ``unit`` on operand bit patterns."""
    spec = _spec(unit)
    return spec.reference(a, b) if spec.arity == 2 else spec.reference(a)


def _is_nan(bits: np.ndarray, width: int) -> np.ndarray:
    frac_bits = 23 if width == 32 else 7
    exp_mask = ((1 << (width - 1)) - 1) & ~((1 << frac_bits) - 1)
    return ((bits & exp_mask) == exp_mask) & ((bits & ((1 << frac_bits) - 1)) != 0)


def mismatches(unit: str, a: np.ndarray, b: np.ndarray | None, got: np.ndarray) -> np.ndarray:
    """Boolean mask of the results that break the numerics contract."""
    spec = _spec(unit)
    expected = reference(unit, a, b)
    got = np.asarray(got, dtype=U32)
    if spec.nan is None:
        return got != expected
    width = 16 if unit == "fp32_to_bf16" else 32
    return np.where(_is_nan(expected, width), got != spec.nan, got != expected)


# --- vectors -----------------------------------------------------------------------------

def _compose(sign: np.ndarray, exp: np.ndarray, frac: np.ndarray) -> np.ndarray:
    return ((sign.astype(U32) << 31) | (np.clip(exp, 0, 255).astype(U32) << 23)
            | (frac.astype(U32) & 0x7F_FFFF)).astype(U32)


def _bits(rng: np.random.Generator, n: int, width: int = 32) -> np.ndarray:
    return rng.integers(0, 1 << width, n, dtype=np.uint64).astype(U32)


def _fields(rng: np.random.Generator, n: int, exp: np.ndarray) -> np.ndarray:
    return _compose(rng.integers(0, 2, n), exp, _bits(rng, n, 23))


def _near(rng: np.random.Generator, a: np.ndarray) -> np.ndarray:
    """Operands close to ``a`` (and to ``-a``): cancellation, equal values, ulp steps."""
    n = len(a)
    width = rng.integers(0, 27, n).astype(U32)
    mask = ((np.uint64(1) << width.astype(np.uint64)) - np.uint64(1)).astype(U32)
    b = a ^ (_bits(rng, n) & mask)
    b = np.where(rng.random(n) < 0.1, a, b)                       # exactly equal
    return (b ^ (rng.integers(0, 2, n).astype(U32) << 31)).astype(U32)  # either sign


def _subnormalish(rng: np.random.Generator, n: int) -> np.ndarray:
    exp = np.where(rng.random(n) < 0.6, 0, rng.integers(1, 26, n))
    return _fields(rng, n, exp)


def _ranged(rng: np.random.Generator, unit: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Exponent pairs that put results near underflow, overflow and alignment limits."""
    ea = rng.integers(0, 255, n)
    if unit == "fp_mul":
        # Result exponent ~ ea + eb - 127: gradual underflow and overflow boundaries.
        target = np.where(rng.random(n) < 0.7, rng.integers(95, 131, n), rng.integers(372, 386, n))
        ea = rng.integers(np.maximum(0, target - 254), np.minimum(254, target) + 1)
        eb = target - ea
    elif unit == "fp_div":
        # Result exponent ~ ea - eb + 127.
        delta = np.where(rng.random(n) < 0.7, rng.integers(-155, -122, n),
                         rng.integers(122, 131, n))
        ea = rng.integers(np.maximum(0, delta), np.minimum(254, 254 + delta) + 1)
        eb = ea - delta
    else:
        # Alignment distances around the guard/round/sticky window, and huge operands.
        eb = np.where(rng.random(n) < 0.8, ea + rng.integers(-30, 31, n), rng.integers(248, 255, n))
        ea = np.where(eb >= 248, rng.integers(248, 255, n), ea)
    return _fields(rng, n, ea), _fields(rng, n, np.clip(eb, 0, 254))


def _ties(rng: np.random.Generator, unit: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Operands whose exact result lies on (or next to) a rounding midpoint."""
    sign_a, sign_b = rng.integers(0, 2, n), rng.integers(0, 2, n)
    if unit == "fp_mul":
        # Odd x * odd y with a 25-bit product: exactly half an ulp below the LSB.
        k = rng.integers(2, 24, n)
        x = (rng.integers(1 << 40, 1 << 41, n) >> (42 - k)) | 1       # k - 1 bits, odd
        lo = -(-(1 << 24) // x)
        hi = ((1 << 25) - 1) // x
        y = (lo + (rng.random(n) * np.maximum(hi - lo + 1, 1)).astype(np.int64)) | 1
        ok = (y <= hi) & (y < (1 << 24))
        x, y = np.where(ok, x, 3), np.where(ok, y, 5592407)         # 3 * 5592407 = 2^24+5
        ea = rng.integers(60, 200, n)
        # Sometimes push the product into the subnormal range (ties after denormalizing).
        eb = np.where(rng.random(n) < 0.3, 104 - ea + rng.integers(-10, 24, n),
                      rng.integers(60, 200, n))
        a = np.ldexp(x.astype(np.float64), (ea - 127 - (k - 1)).astype(np.int64))
        b = np.ldexp(y.astype(np.float64), (np.clip(eb, 1, 254) - 127 - 23).astype(np.int64))
        a, b = a.astype(F32).view(U32), b.astype(F32).view(U32)
    elif unit == "fp_div":
        # Dividing by a power of two is exact unless the quotient is subnormal. With
        # a = M * 2^(ea-150) and b = 2^(d+ea-1) the quotient is M / 2^d subnormal ulps:
        # give M's low d bits the patterns 10..0 (a tie), 10..01 and 01..1.
        d = rng.integers(1, 25, n)
        ea = rng.integers(1, 61, n)
        half = (np.int64(1) << (d - 1))
        low = np.choose(rng.integers(0, 3, n), [half, half + (d > 1), half - 1])
        mant = ((rng.integers(1 << 23, 1 << 24, n) >> d) << d) | low
        a = _compose(sign_a, ea, mant)
        b = _compose(sign_b, d + ea - 1 + 127, np.zeros(n, dtype=U32))
        # And quotients a hair away from a midpoint: a = b * (midpoint), rounded.
        mid = (rng.integers(1 << 23, 1 << 24, n) * 2 + 1).astype(np.float64) / (1 << 24)
        bb = _fields(rng, n, rng.integers(100, 155, n))
        with np.errstate(all="ignore"):
            aa = (_f32(bb).astype(np.float64) * mid).astype(F32).view(U32)
        pick = rng.random(n) < 0.5
        a, b = np.where(pick, a, aa), np.where(pick, b, bb)
    else:
        # fp_add / fp_max: b is an odd multiple of half of a's ulp.
        ea = rng.integers(1, 255, n)
        a = _fields(rng, n, ea)
        odd = (rng.integers(0, 1 << 20, n) >> rng.integers(0, 20, n)) * 2 + 1
        b = np.ldexp(odd.astype(np.float64), (np.maximum(ea, 1) - 151).astype(np.int64))
        with np.errstate(all="ignore"):
            b = b.astype(F32).view(U32)
    a = a | (sign_a.astype(U32) << 31)
    b = (b & 0x7FFF_FFFF) | (sign_b.astype(U32) << 31)
    return a.astype(U32), b.astype(U32)


def _split(n: int, weights: dict[str, float]) -> dict[str, int]:
    counts = {k: int(n * w) for k, w in weights.items()}
    counts[next(iter(counts))] += n - sum(counts.values())
    return counts


def random_vectors(unit: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``n`` random operand sets for ``unit``, a fixed mix of categories, shuffled.

    Binary units: 40 % uniform over all 2^32 encodings (each operand), 15 % near-equal
    pairs of either sign (cancellation), 15 % subnormal-heavy, 15 % exponent-targeted
    (underflow/overflow/alignment limits), 10 % rounding ties, 5 % ordinary magnitudes.
    fp32 -> bf16: uniform, ties in the dropped half, subnormals and near-overflow.
    bf16 -> fp32: uniform 16-bit patterns.
    """
    spec = _spec(unit)
    rng = np.random.default_rng(seed)
    if unit == "bf16_to_fp32":
        return _bits(rng, n, 16), None
    if spec.arity == 1:
        parts = _split(n, {"uniform": 0.4, "ties": 0.3, "subnormal": 0.15, "huge": 0.15})
        low = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=U32)
        chunks = [
            _bits(rng, parts["uniform"]),
            (_bits(rng, parts["ties"]) & 0xFFFF_0000) | rng.choice(low, parts["ties"]),
            _subnormalish(rng, parts["subnormal"]),
            _fields(rng, parts["huge"], rng.integers(250, 256, parts["huge"])),
        ]
        a = np.concatenate(chunks)
        return a[rng.permutation(n)], None
    parts = _split(n, {"uniform": 0.40, "near": 0.15, "subnormal": 0.15, "ranged": 0.15,
                       "ties": 0.10, "ordinary": 0.05})
    a_chunks, b_chunks = [], []
    a_chunks.append(_bits(rng, parts["uniform"]))
    b_chunks.append(_bits(rng, parts["uniform"]))
    near = _fields(rng, parts["near"], rng.integers(0, 256, parts["near"]))
    a_chunks.append(near)
    b_chunks.append(_near(rng, near))
    k = parts["subnormal"]
    sub_a = _subnormalish(rng, k)
    a_chunks.append(sub_a)
    b_chunks.append(np.where(rng.random(k) < 0.5, _subnormalish(rng, k), _bits(rng, k)))
    for chunks, part in zip((a_chunks, b_chunks), _ranged(rng, unit, parts["ranged"]),
                            strict=True):
        chunks.append(part)
    for chunks, part in zip((a_chunks, b_chunks), _ties(rng, unit, parts["ties"]), strict=True):
        chunks.append(part)
    k = parts["ordinary"]
    a_chunks.append(_fields(rng, k, rng.integers(110, 145, k)))
    b_chunks.append(_fields(rng, k, rng.integers(110, 145, k)))
    a, b = np.concatenate(a_chunks), np.concatenate(b_chunks)
    # Swap half of the pairs so that no category favours one operand position.
    swap = rng.random(n) < 0.5
    a, b = np.where(swap, b, a), np.where(swap, a, b)
    order = rng.permutation(n)
    return a[order].astype(U32), b[order].astype(U32)


#: Magnitudes whose every signed ordered pair is checked: zeros, infinities, NaNs (quiet,
#: signalling, full payload), subnormal and normal limits, and values around 1 and the
#: rounding boundaries (1 + 2^-24 is a tie, 2^103 is half an ulp of the largest normal).
SPECIAL_MAGNITUDES = (
    0x0000_0000, 0x7F80_0000, 0x7FC0_0000, 0x7F80_0001, 0x7FFF_FFFF, 0x7FA0_0000,
    0x0000_0001, 0x0000_0002, 0x0000_0003, 0x0040_0000, 0x007F_FFFF, 0x0080_0000,
    0x0080_0001, 0x00FF_FFFF, 0x7F7F_FFFF, 0x7F7F_FFFE, 0x7F00_0000, 0x7EFF_FFFF,
    0x3F80_0000, 0x3F80_0001, 0x3F7F_FFFF, 0x3FFF_FFFF, 0x4000_0000, 0x3F00_0000,
    0x3FC0_0000, 0x4040_0000, 0x3380_0000, 0x3300_0000, 0x3400_0000, 0x3380_0001,
    0x337F_FFFF, 0x4B80_0000, 0x4B7F_FFFF, 0x7300_0000, 0x72FF_FFFF, 0x7300_0001,
    0x0C80_0000, 0x3400_0001,
)


def directed_vectors(unit: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The directed set: every signed ordered pair of :data:`SPECIAL_MAGNITUDES` for the
    binary units; the specials with every rounding pattern of the dropped half for
    fp32 -> bf16; all 65536 encodings for bf16 -> fp32."""
    spec = _spec(unit)
    if unit == "bf16_to_fp32":
        return np.arange(1 << 16, dtype=U32), None
    mags = np.array(SPECIAL_MAGNITUDES, dtype=U32)
    values = np.concatenate([mags, mags | 0x8000_0000]).astype(U32)
    if spec.arity == 1:
        low = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=U32)
        highs = np.concatenate([values & 0xFFFF_0000, (values & 0xFFFF_0000) ^ 0x1_0000])
        tied = (highs[:, None] | low[None, :]).ravel()
        return np.unique(np.concatenate([values, tied])).astype(U32), None
    a, b = np.meshgrid(values, values, indexing="ij")
    return a.ravel().astype(U32), b.ravel().astype(U32)


# --- the RTL side ------------------------------------------------------------------------

def _params(unit: str, params: dict | None) -> dict:
    return {**_spec(unit).defaults, **(params or {})}


def _tag(unit: str, params: dict) -> str:
    short = {"stages": "s", "bits_per_cycle": "k"}
    return "".join(f"{short.get(k, k)}{v}" for k, v in sorted(params.items())) or "base"


def module_name(unit: str, params: dict | None = None) -> str:
    """Verilog module name of ``unit`` built with ``params`` (unique per configuration)."""
    return f"tcxl_{unit}_{_tag(unit, _params(unit, params))}"


def build(unit: str, params: dict | None = None) -> Path:
    """Elaborate ``unit`` and build its Verilator harness; returns the executable.

    Rebuilds only when the Verilog, the driver source or the flags change.
    """
    from amaranth.back import verilog

    from hw.arith import UNITS as CLASSES

    toolenv.setup()
    params = _params(unit, params)
    name = module_name(unit, params)
    directory = BUILD / f"{unit}-{_tag(unit, params)}"
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "obj" / "fpcheck"
    with FileLock(str(directory) + ".lock"):
        text = verilog.convert(CLASSES[unit](**params), name=name, emit_src=False)
        source = directory / f"{name}.v"
        if not source.exists() or source.read_text() != text:
            source.write_text(text)
        command = [
            "verilator", "--cc", "--exe", "-O3",
            "--x-assign", "fast", "--x-initial", "fast", "-Wno-fatal", "-Wno-CASEINCOMPLETE",
            "--prefix", "Vtop", "--top-module", name, "-Mdir", "obj", "-o", "fpcheck",
            "-CFLAGS", "-O1", source.name, str(MAIN_CPP),
        ]
        make = ["make", "-C", "obj", "-f", "Vtop.mk", "-j", "1"]
        digest = hashlib.sha256("\0".join(
            [text, MAIN_CPP.read_text(), *command]).encode()).hexdigest()
        stamp = directory / "stamp"
        if not exe.exists() or not stamp.exists() or stamp.read_text() != digest:
            log: list[str] = []

            def run(step: list[str]) -> None:
                result = subprocess.run(step, cwd=directory, capture_output=True, text=True)
                log.append(result.stdout + result.stderr)
                (directory / "build.log").write_text("".join(log))
                if result.returncode != 0:
                    raise RuntimeError(f"Verilator build of {name} failed; see "
                                       f"{directory / 'build.log'}:\n{result.stderr[-2000:]}")

            runtime = _runtime_dir(command)
            run(command)
            _seed_runtime(runtime, directory / "obj")
            run(make)
            _keep_runtime(directory / "obj", runtime)
            stamp.write_text(digest)
    return exe


#: Verilator's run-time library objects, the same for every harness built with the same
#: Verilator and flags: compiled once and copied into each harness's build (about 8 s of
#: the 12 s of C++ compilation of a harness).
_RUNTIME_OBJECTS = ("verilated.o", "verilated_threads.o")


def _runtime_dir(command: list[str]) -> Path:
    """Where the run-time objects of builds with ``command``'s flags and this Verilator
    are kept."""
    root = toolenv.verilator_root()
    key = "\0".join([str(root), (root / "include" / "verilated.mk").read_text(),
                      *(c for c in command if c.startswith("-"))])
    return BUILD / "runtime" / hashlib.sha256(key.encode()).hexdigest()[:16]


def _seed_runtime(runtime: Path, obj: Path) -> None:
    """Copy the kept run-time objects into ``obj``, newer than the Makefile Verilator just
    wrote (the objects depend on it), so that ``make`` links them instead of compiling."""
    if not all((runtime / o).is_file() for o in _RUNTIME_OBJECTS):
        return
    for o in _RUNTIME_OBJECTS:
        (obj / o).write_bytes((runtime / o).read_bytes())
        os.utime(obj / o)


def _keep_runtime(obj: Path, runtime: Path) -> None:
    """Keep ``obj``'s run-time objects for the next builds (atomically, once)."""
    if all((runtime / o).is_file() for o in _RUNTIME_OBJECTS):
        return
    runtime.mkdir(parents=True, exist_ok=True)
    for o in _RUNTIME_OBJECTS:
        part = runtime / f"{o}.{uuid.uuid4().hex[:8]}"
        part.write_bytes((obj / o).read_bytes())
        os.replace(part, runtime / o)


def run_rtl(unit: str, a: np.ndarray, b: np.ndarray | None = None, *,
            params: dict | None = None, seed: int = 1, valid_pct: int = 100,
            ready_pct: int = 100) -> tuple[np.ndarray, dict]:
    """Stream operands through the unit; returns (result bits, statistics)."""
    spec = _spec(unit)
    exe = build(unit, params)
    words = np.asarray(a, dtype=np.uint64) & ((1 << spec.in_bits) - 1)
    if spec.arity == 2:
        words |= np.asarray(b, dtype=np.uint64) << np.uint64(32)
    run_id = uuid.uuid4().hex[:12]
    vin = exe.parent.parent / f"vectors-{run_id}.bin"
    vout = exe.parent.parent / f"results-{run_id}.bin"
    try:
        words.astype("<u8").tofile(vin)
        result = subprocess.run(
            [str(exe), str(vin), str(vout), str(seed), str(valid_pct), str(ready_pct)],
            capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{unit} harness failed (exit {result.returncode}): "
                               f"{result.stderr.strip()}")
        got = np.fromfile(vout, dtype="<u4").astype(U32)
    finally:
        vin.unlink(missing_ok=True)
        vout.unlink(missing_ok=True)
    stats = dict(item.split("=") for item in result.stdout.split())
    return got, {k: int(v) for k, v in stats.items()}


@dataclass
class CheckResult:
    unit: str
    params: dict
    seed: int
    random: int             # random vectors checked
    directed: int           # directed vectors checked
    mismatches: int
    examples: list[tuple[str, ...]]   # (a, b, expected, got) of the first mismatches
    cycles: int
    seconds: float          # vector generation, simulation and comparison
    build_seconds: float    # elaboration and Verilator build (~0 when up to date)

    @property
    def vectors(self) -> int:
        return self.random + self.directed

    def summary(self) -> str:
        return (f"{self.unit} {_tag(self.unit, self.params)} seed={self.seed}: "
                f"{self.vectors} vectors ({self.random} random + {self.directed} directed), "
                f"{self.mismatches} mismatches, {self.cycles} cycles, {self.seconds:.1f} s "
                f"(+ {self.build_seconds:.1f} s build)")


def check(unit: str, count: int, *, seed: int, params: dict | None = None,
          valid_pct: int = 90, ready_pct: int = 90, directed: bool = True) -> CheckResult:
    """Check ``count`` random vectors (plus the directed set) of ``unit`` on the RTL.

    The stream runs with ``100 - valid_pct`` % idle input cycles and
    ``100 - ready_pct`` % backpressure cycles, drawn from ``seed`` as well.
    """
    params = _params(unit, params)
    started = time.monotonic()
    build(unit, params)
    built = time.monotonic()
    a, b = random_vectors(unit, count, seed)
    n_directed = 0
    if directed:
        da, db = directed_vectors(unit)
        n_directed = len(da)
        a = np.concatenate([da, a])
        b = None if b is None else np.concatenate([db, b])
    got, stats = run_rtl(unit, a, b, params=params, seed=seed, valid_pct=valid_pct,
                         ready_pct=ready_pct)
    bad = mismatches(unit, a, b, got)
    expected = reference(unit, a, b)
    examples = [
        (f"{a[i]:#010x}", f"{b[i]:#010x}" if b is not None else "", f"{expected[i]:#010x}",
         f"{got[i]:#010x}")
        for i in np.flatnonzero(bad)[:10]
    ]
    return CheckResult(unit, params, seed, count, n_directed, int(bad.sum()), examples,
                       stats["cycles"], time.monotonic() - built, built - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.fpcheck",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--unit", action="append", choices=list(UNITS),
                        help="unit to check (repeatable; default: all)")
    parser.add_argument("--count", type=int, default=1_000_000, help="random vectors per unit")
    parser.add_argument("--seed", type=int, default=None,
                        help="random seed (default: $SEED, else a fresh one, printed)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="unit parameter, e.g. stages=2 (repeatable)")
    parser.add_argument("--valid", type=int, default=90, help="input valid probability, %%")
    parser.add_argument("--ready", type=int, default=90, help="output ready probability, %%")
    parser.add_argument("--json", action="store_true", help="print results as JSON lines")
    args = parser.parse_args(argv)
    seed = args.seed
    if seed is None:
        seed = int(os.environ.get("SEED") or int.from_bytes(os.urandom(4), "little"))
    params = {k: int(v) for k, v in (p.split("=", 1) for p in args.param)}
    failed = False
    for unit in args.unit or list(UNITS):
        unit_params = {k: v for k, v in params.items() if k in _spec(unit).defaults}
        result = check(unit, args.count, seed=seed, params=unit_params,
                       valid_pct=args.valid, ready_pct=args.ready)
        print(json.dumps(result.__dict__) if args.json else result.summary(), flush=True)
        for example in result.examples:
            print("  a={} b={} expected={} got={}".format(*example))
        failed |= result.mismatches > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
