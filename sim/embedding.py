"""Golden models of the embedding engine, written from ``docs/embedding.md``.

Everything here follows that page, not the RTL:

* :func:`lines_per_row`, :func:`pack_rows`, :func:`unpack_rows`: the padded row layout
  of tables, pooled outputs and gradients in device memory.
* :func:`validate`: the status of a LOOKUP / UPDATE descriptor, every check in the
  page's order.
* :func:`bags`, :func:`pool`: PyTorch ``EmbeddingBag`` semantics with
  the page's fixed accumulation order (``P`` partial sums / maxima per element, combined
  left to right), bit exact: each fp32 operation is one numpy float32 operation, so
  IEEE-754 binary32 with round-to-nearest-even and gradual underflow.
* :func:`pool_f64` and :func:`pool_error_bound`: a float64 reference and a proven
  absolute error bound that :func:`pool` is checked against.
* :func:`update` and :func:`stochastic_bf16`: the coalesced UPDATE (one fp32 sum and
  one rounding per distinct row, the semantics of a fused sparse optimizer).
* :func:`coalesce_stats` and :func:`random_bags`: benchmark statistics and workloads.

NaNs: numpy keeps NaN payloads and signs where the device returns its canonical NaN
(``docs/numerics.md`` rule 3), so :func:`pool` and :func:`update` replace every NaN they
compute by the canonical one (:func:`canonical_nans`) and their images compare bit for bit
with the device's.

Indices, offsets and ``padding_idx`` are int32 as on the device; the functions accept
any integers in ``[-2**31, 2**32)`` and read them as 32-bit patterns (so
``0xFFFFFFFF`` and ``-1`` are the same index). Plain numpy and ml_dtypes: no simulator
imports; only the descriptor enums come from ``hw``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import ml_dtypes
import numpy as np

from hw.engine.descriptor import MAX_DIM, DescKind, PoolMode, Status

__all__ = [
    "BF16",
    "FP32",
    "LINE_BYTES",
    "ROUNDINGS",
    "CoalesceStats",
    "bags",
    "canonical_nans",
    "coalesce_stats",
    "grad_lines",
    "in_pass",
    "lines_per_row",
    "overflow_at",
    "pack_rows",
    "pass_hash",
    "passes_needed",
    "pool",
    "pool_error_bound",
    "pool_f64",
    "power_law_rows",
    "random_bags",
    "stochastic_bf16",
    "unpack_rows",
    "update",
    "update_passes",
    "validate",
]

LINE_BYTES = 64
FP32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)

#: Unit roundoffs: fp32, bf16 and float64 (half an ulp of 1).
U32 = 2.0 ** -24
U_BF16 = 2.0 ** -8
U64 = 2.0 ** -53
#: Smallest positive subnormals: fp32 and bf16.
TINY32 = 2.0 ** -149
TINY_BF16 = 2.0 ** -133

IntArray = np.ndarray | Sequence[int]


# --- Layout of rows in device memory -----------------------------------------------

def _elem_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in (FP32, BF16):
        raise ValueError(f"dtype must be float32 or bfloat16, not {dt}")
    return dt


def lines_per_row(dim: int, dtype) -> int:
    """64-byte lines one vector of ``dim`` elements of ``dtype`` occupies (padded)."""
    if dim < 1:
        raise ValueError(f"dim must be at least 1, not {dim}")
    return -(-dim * _elem_dtype(dtype).itemsize // LINE_BYTES)


def _little_endian_bits(array: np.ndarray) -> np.ndarray:
    """The element bit patterns of a float32 / bfloat16 array as little-endian uints."""
    uint = np.uint32 if array.dtype == FP32 else np.uint16
    return array.view(uint).astype(np.dtype(uint).newbyteorder("<"))


def canonical_nans(array: np.ndarray) -> np.ndarray:
    """``array`` (float32 or bfloat16) with every NaN replaced by the device's canonical
    quiet NaN, ``0x7FC00000`` or ``0x7FC0`` (``docs/numerics.md`` rule 3); a new array."""
    uint = np.uint32 if array.dtype == FP32 else np.uint16
    qnan = np.array(0x7FC0_0000 if array.dtype == FP32 else 0x7FC0, uint).view(array.dtype)
    return np.where(np.isnan(array), qnan, array).astype(array.dtype)


def pack_rows(array: np.ndarray, base: bytes | None = None) -> bytes:
    """The device-memory image of ``count`` vectors (a table, pooled outputs or gradients).

    ``array`` is ``count x dim``, float32 or bfloat16; each vector starts on a line and is
    padded to :func:`lines_per_row` lines. Padding bytes are zero (as the engine writes
    them in pooled outputs), or copied from ``base`` (an image of at least the same
    size) where given, as for table rows, whose padding keeps its old value.
    """
    array = np.ascontiguousarray(array)
    if array.ndim != 2:
        raise ValueError(f"expected a 2-D array (vectors x dim), not shape {array.shape}")
    count, dim = array.shape
    stride = lines_per_row(dim, array.dtype) * LINE_BYTES
    if base is None:
        out = np.zeros((count, stride), np.uint8)
    else:
        if len(base) < count * stride:
            raise ValueError(f"base image holds {len(base)} bytes, need {count * stride}")
        out = np.frombuffer(base, np.uint8, count * stride).reshape(count, stride).copy()
    out[:, :dim * array.dtype.itemsize] = (
        _little_endian_bits(array).view(np.uint8).reshape(count, dim * array.dtype.itemsize))
    return out.tobytes()


def unpack_rows(image: bytes, count: int, dim: int, dtype) -> np.ndarray:
    """``count`` vectors of ``dim`` elements read back from a padded image (see
    :func:`pack_rows`); bytes after the last vector are ignored."""
    dt = _elem_dtype(dtype)
    stride = lines_per_row(dim, dt) * LINE_BYTES
    if len(image) < count * stride:
        raise ValueError(f"image holds {len(image)} bytes, {count} vectors need "
                         f"{count * stride}")
    lines = np.frombuffer(image, np.uint8, count * stride).reshape(count, stride)
    little = np.dtype("<u4" if dt == FP32 else "<u2")
    bits = lines[:, :dim * dt.itemsize].copy().view(little).astype(little.newbyteorder("="))
    return bits.view(dt).reshape(count, dim)


# --- Bags ----------------------------------------------------------------------------

def _int32(values: IntArray, name: str) -> np.ndarray:
    """Integers in [-2**31, 2**32) as int32 bit patterns."""
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be integers, not {arr.dtype}")
    arr = arr.astype(np.int64).ravel()
    if arr.size and (arr.min() < -(1 << 31) or arr.max() >= 1 << 32):
        raise ValueError(f"{name} must fit 32 bits")
    return arr.astype(np.uint32).view(np.int32) if arr.size else arr.astype(np.int32)


def _pad32(padding_idx: int | None) -> int | None:
    """``padding_idx`` as a signed int32 value (None stays None)."""
    if padding_idx is None:
        return None
    if not -(1 << 31) <= padding_idx < 1 << 32:
        raise ValueError(f"padding_idx must fit 32 bits, not {padding_idx}")
    return (padding_idx + (1 << 31)) % (1 << 32) - (1 << 31)


def _offsets_ok(offsets: np.ndarray, num_indices: int, include_last_offset: bool) -> bool:
    """The BAD_OFFSETS rule (offsets as int32): starts at 0, non-decreasing, each at most
    ``num_indices``, and with ``include_last_offset`` the last equals ``num_indices``."""
    if offsets.size == 0:
        return True
    o = offsets.astype(np.int64)
    return bool(o[0] == 0 and np.all(np.diff(o) >= 0) and o[-1] <= num_indices
                and (not include_last_offset or o[-1] == num_indices))


def _bag_positions(indices: np.ndarray, offsets: np.ndarray, num_indices: int,
                   include_last_offset: bool, padding_idx: int | None) -> list[np.ndarray]:
    """Positions in ``indices`` of the counted indices of every bag, in index order."""
    if include_last_offset and offsets.size == 0:
        raise ValueError("include_last_offset needs num_bags + 1 >= 1 offsets")
    if num_indices > indices.size:
        raise ValueError(f"num_indices {num_indices} exceeds the {indices.size} indices given")
    if not _offsets_ok(offsets, num_indices, include_last_offset):
        raise ValueError(f"offsets are not valid for {num_indices} indices "
                         f"(include_last_offset={include_last_offset}): {offsets.tolist()}")
    num_bags = offsets.size - int(include_last_offset)
    ends = np.append(offsets[1:], num_indices)[:num_bags] if num_bags else offsets[:0]
    pad = _pad32(padding_idx)
    out = []
    for start, end in zip(offsets[:num_bags].tolist(), ends.tolist(), strict=True):
        pos = np.arange(start, end)
        if pad is not None:
            pos = pos[indices[start:end] != pad]
        out.append(pos)
    return out


def bags(indices: IntArray, offsets: IntArray, num_indices: int | None = None,
         include_last_offset: bool = False, padding_idx: int | None = None) -> list[list[int]]:
    """The counted indices of every bag, in index order (padding indices removed).

    ``num_bags`` is ``len(offsets)``, less one with ``include_last_offset``;
    ``num_indices`` defaults to ``len(indices)``.

    Raises
    ------
    ValueError
        Offsets that the device would answer with ``BAD_OFFSETS``.
    """
    idx = _int32(indices, "indices")
    n = idx.size if num_indices is None else num_indices
    positions = _bag_positions(idx, _int32(offsets, "offsets"), n, include_last_offset,
                               padding_idx)
    return [idx[pos].tolist() for pos in positions]


@dataclass(frozen=True)
class _Batch:
    """Checked inputs of :func:`pool` / :func:`update` / the reference."""
    table: np.ndarray
    indices: np.ndarray
    positions: list[np.ndarray]
    weights: np.ndarray | None


def _batch(table: np.ndarray, indices: IntArray, offsets: IntArray,
           weights: Sequence[float] | np.ndarray | None, padding_idx: int | None,
           include_last_offset: bool) -> _Batch:
    table = np.asarray(table)
    _elem_dtype(table.dtype)
    if table.ndim != 2 or table.shape[1] < 1:
        raise ValueError(f"table must be rows x dim with dim >= 1, not shape {table.shape}")
    idx = _int32(indices, "indices")
    positions = _bag_positions(idx, _int32(offsets, "offsets"), idx.size,
                               include_last_offset, padding_idx)
    for pos in positions:
        bad = idx[pos][(idx[pos] < 0) | (idx[pos] >= table.shape[0])]
        if bad.size:
            raise ValueError(f"index {int(bad[0])} out of range for {table.shape[0]} rows")
    w = None
    if weights is not None:
        w = np.asarray(weights, dtype=np.float32).ravel()
        if w.size != idx.size:
            raise ValueError(f"{w.size} weights for {idx.size} indices")
    return _Batch(table, idx, positions, w)


def _mode(mode: PoolMode | str | int, weights) -> PoolMode:
    """The pooling mode (a PoolMode, its name or value), checked against ``weights``."""
    if not isinstance(mode, PoolMode):
        try:
            mode = PoolMode[mode.upper()] if isinstance(mode, str) else PoolMode(mode)
        except (KeyError, ValueError):
            raise ValueError(f"mode must be sum, mean or max, not {mode!r}") from None
    if weights is not None and mode is not PoolMode.SUM:
        raise ValueError(f"per-sample weights are legal with sum only, not {mode.name}")
    return mode


def _terms(batch: _Batch, pos: np.ndarray) -> np.ndarray:
    """``x_k``: the bag's counted rows widened to fp32, times their weights (one fp32
    rounding each) when weighted."""
    x = batch.table[batch.indices[pos]].astype(np.float32)
    if batch.weights is not None:
        x = batch.weights[pos][:, None] * x
    return x


def _terms_f64(batch: _Batch, pos: np.ndarray) -> np.ndarray:
    """The terms in float64: the products of two fp32 values are exact."""
    x = batch.table[batch.indices[pos]].astype(np.float64)
    if batch.weights is not None:
        x = batch.weights[pos].astype(np.float64)[:, None] * x
    return x


# --- Pooling (LOOKUP) ----------------------------------------------------------------

def pool(table: np.ndarray, indices: IntArray, offsets: IntArray, *,
         mode: PoolMode | str | int, weights: Sequence[float] | np.ndarray | None = None,
         padding_idx: int | None = None, include_last_offset: bool = False,
         partials: int = 4) -> np.ndarray:
    """The pooled vectors of a LOOKUP, bit exact (``num_bags x dim``, the table's dtype).

    ``x_0 .. x_{n-1}`` are a bag's counted rows in index order (widened to fp32; with
    ``weights``, ``fl32(w_k * row_k)``). With ``P = partials``:

    * sum / mean: ``s_p = +0``, then ``s_p = fl32(s_p + x_k)`` for ``k = p (mod P)`` in
      increasing ``k``; ``S = (((s_0 + s_1) + s_2) + ...) + s_{P-1}``, each add rounded;
      mean is ``fl32(S / fl32(n))``, correctly rounded (``fl32(n) = n`` for
      ``n < 2**24``).
    * max: ``m_p = -inf``, then ``m_p = numpy.maximum(m_p, x_k)`` (equal operands give
      the second, NaN wins); the result is ``maximum(...maximum(m_0, m_1)..., m_{P-1})``.
    * a bag with no counted index gives +0.0 in every element and mode.

    bf16 tables: the fp32 result is rounded to bf16 (RNE) once, when stored.

    Raises
    ------
    ValueError
        Weights with mean or max, bad offsets, a counted index outside the table,
        ``partials < 1``.
    """
    mode = _mode(mode, weights)
    if partials < 1:
        raise ValueError(f"partials must be at least 1, not {partials}")
    batch = _batch(table, indices, offsets, weights, padding_idx, include_last_offset)
    dim = batch.table.shape[1]
    out = np.zeros((len(batch.positions), dim), np.float32)
    start = np.float32(-np.inf if mode is PoolMode.MAX else 0.0)
    # inf - inf, overflow and NaN operands are part of the contract, not accidents.
    with np.errstate(all="ignore"):
        for b, pos in enumerate(batch.positions):
            n = pos.size
            if n == 0:
                continue                    # +0.0, all modes
            x = _terms(batch, pos)
            acc = np.full((partials, dim), start, np.float32)
            # Rows P*j .. P*j+P-1 go to partials 0 .. P-1: one fp32 op per element.
            for j in range(0, n, partials):
                block = x[j:j + partials]
                m = block.shape[0]
                if mode is PoolMode.MAX:
                    acc[:m] = np.maximum(acc[:m], block)
                else:
                    acc[:m] = acc[:m] + block
            result = acc[0]
            for p in range(1, partials):
                result = np.maximum(result, acc[p]) if mode is PoolMode.MAX else result + acc[p]
            if mode is PoolMode.MEAN:
                result = result / np.float32(n)
            out[b] = result
        # Rounding NaN to bf16 is part of the contract too; every NaN result is canonical.
        return canonical_nans(out.astype(batch.table.dtype))


def pool_f64(table: np.ndarray, indices: IntArray, offsets: IntArray, *,
             mode: PoolMode | str | int, weights: Sequence[float] | np.ndarray | None = None,
             padding_idx: int | None = None, include_last_offset: bool = False) -> np.ndarray:
    """Float64 reference of :func:`pool` (``num_bags x dim``, float64, never rounded to
    bf16).

    The products ``w_k * row_k`` of fp32 values are exact in float64; the sum is
    numpy's float64 sum, within ``gamma64_(n+1) * A`` of the exact value (``A`` as in
    :func:`pool_error_bound`), a slack that bound includes. max is exact.
    """
    mode = _mode(mode, weights)
    batch = _batch(table, indices, offsets, weights, padding_idx, include_last_offset)
    out = np.zeros((len(batch.positions), batch.table.shape[1]), np.float64)
    with np.errstate(all="ignore"):
        for b, pos in enumerate(batch.positions):
            if pos.size == 0:
                continue
            x = _terms_f64(batch, pos)
            if mode is PoolMode.MAX:
                out[b] = x.max(axis=0)
            else:
                out[b] = x.sum(axis=0) / (pos.size if mode is PoolMode.MEAN else 1)
    return out


def _gamma(k: int, u: float) -> float:
    if k * u >= 1:
        raise ValueError(f"gamma_{k} is undefined for u = {u}")
    return k * u / (1 - k * u)


def pool_error_bound(table: np.ndarray, indices: IntArray, offsets: IntArray, *,
                     mode: PoolMode | str | int,
                     weights: Sequence[float] | np.ndarray | None = None,
                     padding_idx: int | None = None, include_last_offset: bool = False,
                     partials: int = 4) -> np.ndarray:
    """An absolute bound on ``|pool(...) - pool_f64(...)|`` per bag and element (float64).

    Valid when every input is finite, nothing overflows and ``n < 2**24``. It is
    absolute, not in ulps of the result, because cancellation can make the result
    arbitrarily small while the error is not. For a bag of ``n >= 1`` counted terms:

    * ``u = 2**-24``, ``gamma_k = k*u / (1 - k*u)``;
    * ``d = ceil(n/P) + min(n, P) - 2``: the most fp32 additions any term passes
      through (``ceil(n/P) - 1`` in its partial, ``min(n, P) - 1`` combining partials;
      adding the initial +0 or an empty partial is exact);
    * ``r = d + [weighted] + [mean]`` roundings in all;
    * ``A = sum_k |w_k * row_k|`` for sum, ``sum_k |row_k| / n`` for mean.

    fp32 result: ``E32 = gamma_r * A + (n + 1) * 2**-149``, the standard bound for
    recursive summation (Higham, *Accuracy and Stability of Numerical Algorithms*,
    §4.2 and Lemma 3.3) applied to the tree of additions, plus the absolute error of
    the products and the quotient when they underflow (an addition that underflows is
    exact, so an unweighted sum never needs that term).
    bf16 tables add the final rounding: ``E = E32 + 2**-8 * (A + E32) + 2**-134``.
    To compare against :func:`pool_f64` the bound adds that reference's own error,
    ``gamma64_(n+1) * A`` with ``u64 = 2**-53``, and is widened by ``2**-40`` relative to
    cover its own float64 evaluation. max selects an operand, so its bound is 0 (an empty
    bag, +0.0, is exact in every mode).
    """
    mode = _mode(mode, weights)
    if partials < 1:
        raise ValueError(f"partials must be at least 1, not {partials}")
    batch = _batch(table, indices, offsets, weights, padding_idx, include_last_offset)
    out = np.zeros((len(batch.positions), batch.table.shape[1]), np.float64)
    if mode is PoolMode.MAX:
        return out
    bf16 = batch.table.dtype == BF16
    for b, pos in enumerate(batch.positions):
        n = pos.size
        if n == 0:
            continue
        a = np.abs(_terms_f64(batch, pos)).sum(axis=0)
        if mode is PoolMode.MEAN:
            a = a / n
        d = -(-n // partials) + min(n, partials) - 2
        r = d + int(batch.weights is not None) + int(mode is PoolMode.MEAN)
        e = _gamma(r, U32) * a + (n + 1) * TINY32
        if bf16:
            e = e + U_BF16 * (a + e) + TINY_BF16 / 2
        out[b] = (e + _gamma(n + 1, U64) * a) * (1 + 2.0 ** -40)
    return out


# --- Scatter (UPDATE) ----------------------------------------------------------------

#: ``rounding`` values of :func:`update`.
ROUNDINGS = ("nearest", "stochastic")


def _mix32(h: np.ndarray) -> np.ndarray:
    """The MurmurHash3 32-bit finalizer on uint32 arrays (``docs/embedding.md``)."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def stochastic_bf16(values: np.ndarray, row: int, seed: int) -> np.ndarray:
    """fp32 ``values`` (one row's elements) rounded to bf16 stochastically as the
    coalesced UPDATE contract says: element ``e`` becomes the upper 16 bits of
    ``u + (h & 0xFFFF)``, ``u`` its bit pattern and ``h = mix32(seed ^ mix32(row *
    0x9E3779B9 + e))``; NaNs become the canonical NaN."""
    x = np.asarray(values, np.float32)
    e = np.arange(x.size, dtype=np.uint32)
    with np.errstate(over="ignore"):
        key = np.uint32(row * 0x9E3779B9 & 0xFFFFFFFF) + e
        h = _mix32(np.uint32(seed & 0xFFFFFFFF) ^ _mix32(key))
        u = x.view(np.uint32) + (h & np.uint32(0xFFFF))
    out = (u >> np.uint32(16)).astype(np.uint16).view(BF16)
    return canonical_nans(np.where(np.isnan(x), x.astype(BF16), out))


def update(table: np.ndarray, indices: IntArray, offsets: IntArray, grads: np.ndarray, *,
           weights: Sequence[float] | np.ndarray | None = None,
           padding_idx: int | None = None, include_last_offset: bool = False,
           rounding: str = "nearest", seed: int = 0) -> np.ndarray:
    """The table after an UPDATE (a new array; ``table`` is not modified;
    ``docs/embedding.md``, "Coalesced update"). For each distinct counted row ``r``: the
    fp32 sum ``S_r`` of its contributions ``fl32(w_k * g_b(k))``, the first one, then each later
    one added in index order; then ``row[r] = store(fl32(widen(row[r]) + S_r))``, one
    rounding per row. ``store`` rounds bf16 to nearest even, or with ``rounding=
    "stochastic"`` by :func:`stochastic_bf16` with ``seed``.

    Raises
    ------
    ValueError
        Bad offsets, a counted index outside the table, a gradient of the wrong shape
        (``num_bags x dim`` fp32); an unknown ``rounding``; stochastic rounding of an
        fp32 table.
    """
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {', '.join(ROUNDINGS)}, not {rounding!r}")
    batch = _batch(table, indices, offsets, weights, padding_idx, include_last_offset)
    new = batch.table.copy()
    if rounding == "stochastic" and new.dtype != BF16:
        raise ValueError(f"stochastic rounding needs a bf16 table, not {new.dtype}")
    g = np.asarray(grads)
    if g.dtype != FP32 or g.shape != (len(batch.positions), new.shape[1]):
        raise ValueError(f"grads must be float32 of shape {(len(batch.positions), new.shape[1])}"
                         f", not {g.dtype} {g.shape}")
    sums: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for b, pos in enumerate(batch.positions):
            for k in pos.tolist():
                c = g[b] if batch.weights is None else batch.weights[k] * g[b]
                r = int(batch.indices[k])
                sums[r] = c.copy() if r not in sums else sums[r] + c
        for r, total in sums.items():
            x = new[r].astype(np.float32) + total
            new[r] = (stochastic_bf16(x, r, seed) if rounding == "stochastic"
                      else canonical_nans(x.astype(new.dtype)))
    return new


@dataclass(frozen=True)
class CoalesceStats:
    """Row writes of an UPDATE without and with on-chip coalescing of repeated rows."""
    updates: int
    distinct_rows: int

    @property
    def write_saving(self) -> float:
        """Fraction of row writes coalescing saves (0 for an empty batch)."""
        return 1 - self.distinct_rows / self.updates if self.updates else 0.0


def coalesce_stats(indices: IntArray, offsets: IntArray, *, padding_idx: int | None = None,
                   include_last_offset: bool = False) -> CoalesceStats:
    """Counted row updates (one per counted index) and distinct rows they touch: with
    coalescing each distinct row is written once per descriptor."""
    counted = [i for bag in bags(indices, offsets, None, include_last_offset, padding_idx)
               for i in bag]
    return CoalesceStats(len(counted), len(set(counted)))


# --- Passes of an UPDATE larger than the accumulator -----------------------------------

def pass_hash(row: int) -> int:
    """The pass hash of ``row`` (``docs/embedding.md``, "Passes"): xorshift32 of its 32
    bits, ``x ^= x << 13; x ^= x >> 17; x ^= x << 5`` (mod 2**32), a bijection."""
    x = row & 0xFFFF_FFFF
    x ^= (x << 13) & 0xFFFF_FFFF
    x ^= x >> 17
    return x ^ ((x << 5) & 0xFFFF_FFFF)


def grad_lines(dim: int, bf16: bool) -> int:
    """Gradient lines (accumulator lines) per row of an UPDATE: ``dim / 16`` rounded
    up; for bf16 tables twice ``dim / 32`` rounded up."""
    return 2 * lines_per_row(dim, BF16) if bf16 else lines_per_row(dim, FP32)


def passes_needed(num_indices: int, glines: int, acc: tuple[int, int]) -> int:
    """Passes over an accumulator of ``acc = (rows, lines)`` an UPDATE of
    ``num_indices`` indices (padding included) of ``glines`` gradient lines per row
    needs by its size: ``max(1, ceil(n / rows), ceil(n * glines / lines))``."""
    rows, lines = acc
    return max(1, -(-num_indices // rows), -(-num_indices * glines // lines))


def in_pass(row: int, level: int, value: int) -> bool:
    """``row`` belongs to pass ``(level, value)``: the low ``level`` bits of its
    :func:`pass_hash` are ``value``'s (level 0: every row)."""
    return (pass_hash(row) ^ value) & ((1 << level) - 1) == 0


def overflow_at(counted_rows: IntArray, glines: int, acc: tuple[int, int]) -> int | None:
    """Counted indices (rows in index order) before the first whose row no longer fits
    an accumulator of ``acc = (rows, lines)`` (rows of ``glines`` lines each), taking
    the rows in that order; None if they all fit."""
    rows, lines = acc
    fitted: set[int] = set()
    for i, r in enumerate(int(r) for r in counted_rows):
        if r not in fitted:
            if len(fitted) + 1 > rows or (len(fitted) + 1) * glines > lines:
                return i
            fitted.add(r)
    return None


def update_passes(counted_rows: IntArray, num_indices: int, glines: int,
                  acc: tuple[int, int]) -> list[tuple[int, int, bool]]:
    """The passes ``(level, value, overflowed)`` an UPDATE runs, in order: its counted
    rows ``counted_rows`` in index order (padding indices left out), ``num_indices`` and
    ``glines`` as in :func:`passes_needed` (an UPDATE that needs one pass by its size
    runs as one, ``(0, 0)``). Pass ``(L, v)`` holds the rows whose :func:`pass_hash`
    has ``v`` in its low ``L`` bits and overflows when they are more than the
    accumulator's rows, or their lines more than its lines. The first pass is
    ``(0, 0)``, every row; if it overflows, with ``k`` the counted indices before the
    first one whose row no longer fitted (rows taken in index order) and ``u`` all of
    them, the passes of level ``L0`` follow, the smallest ``L0 >= 1`` with
    ``k * 2**L0 >= u``, in turn; a later pass that overflows is replaced by its halves
    ``(L + 1, v)``, ``(L + 1, v + 2**L)``, depth first."""
    rows, lines = acc
    counted = [int(r) for r in counted_rows]
    if passes_needed(num_indices, glines, acc) == 1:
        return [(0, 0, False)]
    k = overflow_at(counted, glines, acc)
    if k is None:
        return [(0, 0, False)]
    level0 = 1
    while k << level0 < len(counted):
        level0 += 1
    distinct_rows = set(counted)
    out: list[tuple[int, int, bool]] = [(0, 0, True)]
    stack = [(level0, v) for v in reversed(range(1 << level0))]
    while stack:
        level, value = stack.pop()
        distinct = sum(1 for r in distinct_rows if in_pass(r, level, value))
        over = distinct > rows or distinct * glines > lines
        out.append((level, value, over))
        if over:
            stack += [(level + 1, value | 1 << level), (level + 1, value)]
    return out


# --- Descriptor validation -----------------------------------------------------------

def _field(value) -> int:
    return int(value.value if isinstance(value, Enum) else value)


def validate(desc: Mapping[str, int], *, indices: IntArray, offsets: IntArray,
             pmem_size: int, max_dim: int = MAX_DIM,
             update_acc: tuple[int, int] | None = None, max_passes: int = 1) -> Status:
    """The status the engine completes a descriptor with (``docs/embedding.md``).

    ``desc`` holds descriptor fields by name (as :func:`hw.engine.descriptor.
    unpack_descriptor` returns them; missing fields are 0); ``indices`` and ``offsets``
    are the contents of its buffers (at least ``num_indices`` and
    ``num_bags + include_last_offset`` entries, read only if the descriptor's own fields
    pass); ``pmem_size`` is the device memory size in bytes and ``max_dim`` the device's
    largest ``dim`` (``CAP_ENGINE_MAX_DIM``; a larger one is UNSUPPORTED);
    ``update_acc`` the UPDATE accumulator's rows and lines (``CAP_UPDATE_ACC_ROWS``,
    ``CAP_UPDATE_ACC_LINES``) and ``max_passes`` (``CAP_UPDATE_MAX_PASSES``): an UPDATE
    that needs more passes over the accumulator (:func:`passes_needed`) is UNSUPPORTED
    (``update_acc`` None: no limit).

    Checks, the first failing one is reported: ``kind``; MLP_CHECKPOINT is UNSUPPORTED
    here, which is its status with checkpointing off (with it on, its checks need the
    checkpoint state: ``tb.ckpt_driver.CkptDriver`` models them from
    ``docs/checkpoint.md``); NOP, COMMIT and FENCE pass; then, for
    LOOKUP and UPDATE: UNSUPPORTED (reserved bit, mode 3, dim 0
    or > 4096, weights with mean/max, UPDATE with max); MISALIGNED (table base and the
    indices, offsets, data and, when weighted, weights addresses); ADDR_RANGE (every such
    region ``[addr, addr + size)`` must end at or below ``pmem_size``, also when empty);
    BAD_OFFSETS; INDEX_RANGE (all ``num_indices`` indices, padding index exempt).
    """
    f = {name: _field(desc.get(name, 0)) for name in (
        "kind", "mode", "weighted", "has_padding_idx", "include_last_offset", "bf16",
        "rsvd_flag", "table_base", "dim", "rows", "padding_idx", "num_bags",
        "num_indices", "indices_addr", "offsets_addr", "weights_addr", "data_addr")}
    if f["kind"] not in {k.value for k in DescKind}:
        return Status.BAD_KIND
    kind = DescKind(f["kind"])
    if kind is DescKind.MLP_CHECKPOINT:
        return Status.UNSUPPORTED
    if kind not in (DescKind.LOOKUP, DescKind.UPDATE):
        return Status.OK
    mode = f["mode"]
    weighted = bool(f["weighted"])
    if (f["rsvd_flag"] or mode not in {m.value for m in PoolMode}
            or not 1 <= f["dim"] <= min(max_dim, MAX_DIM)
            or (weighted and mode != PoolMode.SUM.value)
            or (kind is DescKind.UPDATE and mode == PoolMode.MAX.value)
            or (kind is DescKind.UPDATE and update_acc is not None
                and passes_needed(f["num_indices"], grad_lines(f["dim"], f["bf16"]),
                                  update_acc) > max_passes)):
        return Status.UNSUPPORTED

    table_dtype = BF16 if f["bf16"] else FP32
    data_dtype = table_dtype if kind is DescKind.LOOKUP else FP32
    num_offsets = f["num_bags"] + f["include_last_offset"]
    regions = [  # (address, size in bytes)
        (f["table_base"], f["rows"] * lines_per_row(f["dim"], table_dtype) * LINE_BYTES),
        (f["indices_addr"], 4 * f["num_indices"]),
        (f["offsets_addr"], 4 * num_offsets),
        (f["data_addr"], f["num_bags"] * lines_per_row(f["dim"], data_dtype) * LINE_BYTES),
    ]
    if weighted:
        regions.append((f["weights_addr"], 4 * f["num_indices"]))
    if any(addr % LINE_BYTES for addr, _ in regions):
        return Status.MISALIGNED
    if any(addr + size > pmem_size for addr, size in regions):
        return Status.ADDR_RANGE

    offs = _int32(offsets, "offsets")
    if offs.size < num_offsets:
        raise ValueError(f"{offs.size} offsets given, the descriptor has {num_offsets}")
    if not _offsets_ok(offs[:num_offsets], f["num_indices"], bool(f["include_last_offset"])):
        return Status.BAD_OFFSETS

    idx = _int32(indices, "indices")
    if idx.size < f["num_indices"]:
        raise ValueError(f"{idx.size} indices given, the descriptor has {f['num_indices']}")
    idx = idx[:f["num_indices"]].astype(np.int64)
    bad = (idx < 0) | (idx >= f["rows"])
    if f["has_padding_idx"]:
        bad &= idx != _pad32(f["padding_idx"])
    return Status.INDEX_RANGE if bad.any() else Status.OK


# --- Workloads -----------------------------------------------------------------------

#: Length range of the bags :func:`random_bags` makes long.
LONG_BAG = (200, 300)


def random_bags(rng: np.random.Generator, num_bags: int, rows: int, *, pooling: float,
                zipf_alpha: float | None = None, padding_idx: int | None = None,
                empty_fraction: float = 0.0, max_len: int | None = None,
                long_fraction: float = 0.0, padding_fraction: float = 0.1,
                include_last_offset: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A random batch of bags: ``(indices, offsets)``, both int32.

    Bag lengths are geometric with mean ``pooling`` (so about ``1/pooling`` of the bags
    have length 1), capped at ``max_len``; then exactly ``round(empty_fraction *
    num_bags)`` bags are made empty and ``round(long_fraction * num_bags)`` others get a
    length in ``LONG_BAG`` (200..300, capped at ``max_len``). Indices are uniform over
    the rows, or with ``zipf_alpha`` follow a power law (rank ``r`` drawn with weight
    about ``(r + 1) ** -zipf_alpha``, ranks scattered over the table by a fixed random
    permutation), which gives the repeated rows of real workloads. With ``padding_idx``,
    each index is replaced by it with probability ``padding_fraction``. Offsets have
    ``num_bags`` entries, or ``num_bags + 1`` with ``include_last_offset``.
    """
    if num_bags < 0 or rows < 1 or pooling < 1:
        raise ValueError(f"need num_bags >= 0, rows >= 1, pooling >= 1, not "
                         f"{num_bags}, {rows}, {pooling}")
    n_empty = round(empty_fraction * num_bags)
    n_long = round(long_fraction * num_bags)
    if n_empty + n_long > num_bags:
        raise ValueError("empty_fraction + long_fraction must not exceed 1")
    cap = max_len if max_len is not None else 1 << 30
    if n_long and cap < LONG_BAG[0]:
        raise ValueError(f"long bags need max_len >= {LONG_BAG[0]}, not {max_len}")
    lengths = np.minimum(rng.geometric(1 / pooling, num_bags), cap)
    chosen = rng.permutation(num_bags)
    lengths[chosen[:n_empty]] = 0
    lengths[chosen[n_empty:n_empty + n_long]] = rng.integers(
        LONG_BAG[0], min(LONG_BAG[1], cap) + 1, n_long)
    total = int(lengths.sum())
    if zipf_alpha is None:
        indices = rng.integers(0, rows, total, dtype=np.int64)
    else:
        indices = power_law_rows(rng, total, rows, zipf_alpha)
    if padding_idx is not None:
        pad = _pad32(padding_idx)
        indices = np.where(rng.random(total) < padding_fraction, pad, indices)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    if not include_last_offset:
        offsets = offsets[:-1]
    return _int32(indices, "indices"), _int32(offsets, "offsets")


def power_law_rows(rng: np.random.Generator, count: int, rows: int,
                    alpha: float) -> np.ndarray:
    """Rows whose ranks follow a bounded continuous power law of exponent ``alpha``
    (inverse CDF on ``[1, rows + 1)``), mapped through ``rank * a + c mod rows``."""
    if alpha <= 0:
        raise ValueError(f"zipf_alpha must be positive, not {alpha}")
    u = rng.random(count)
    if abs(alpha - 1) < 1e-9:
        x = (rows + 1.0) ** u
    else:
        e = 1 - alpha
        x = (1 + u * ((rows + 1.0) ** e - 1)) ** (1 / e)
    rank = np.minimum(np.floor(x).astype(np.int64) - 1, rows - 1)
    a = int(rng.integers(1, rows + 1))
    while math.gcd(a, rows) != 1:
        a += 1
    c = int(rng.integers(0, rows))
    return (rank * a + c) % rows
