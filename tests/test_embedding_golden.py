"""Embedding engine contract (docs/embedding.md): the descriptor layout and the golden
models of ``sim/embedding.py`` (fast tier, pure Python).

The models are checked against the page itself: hand-computed values for crafted bags
where the accumulation order decides the bits, an independent scalar implementation of
the page's rules, exact rational arithmetic for mean, and a float64 reference within the
stated error bound. Every random test prints its seed; ``SEED=<n>`` replays it.
"""

from __future__ import annotations

import random
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from hw.engine import descriptor as d
from hw.engine.descriptor import DescKind, PoolMode, Status
from sim import embedding as emb

F32 = np.float32
BF16 = emb.BF16
U = 2.0 ** -24          # half an ulp of 1.0 in fp32



def bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint16)


def same(a, b) -> bool:
    """Bit-identical, NaNs matched by class (docs/numerics.md rule 3)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    fa, fb = a.astype(np.float32), b.astype(np.float32)
    nan = np.isnan(fa)
    return bool(np.array_equal(nan, np.isnan(fb))
                and np.array_equal(bits(a)[~nan], bits(b)[~nan]))


def column(values, dtype=F32) -> np.ndarray:
    """A table of one-element rows."""
    return np.array(values, dtype=np.float32).astype(dtype).reshape(-1, 1)


def pool1(values, mode="sum", partials=4, **kw):
    """Pool a single bag holding every row of a one-element table, as a Python float."""
    table = column(values)
    return float(emb.pool(table, np.arange(len(values)), [0], mode=mode,
                          partials=partials, **kw)[0, 0])


# --- Descriptor ------------------------------------------------------------------------

# The table of docs/embedding.md: field -> (high bit, low bit).
DOC_FIELDS = {
    "kind": (7, 0), "mode": (9, 8), "weighted": (10, 10), "has_padding_idx": (11, 11),
    "include_last_offset": (12, 12), "capture_undo": (13, 13), "bf16": (14, 14),
    "rsvd_flag": (15, 15), "table_id": (31, 16), "batch_id": (63, 32),
    "table_base": (111, 64), "dim": (127, 112), "rows": (159, 128),
    "padding_idx": (191, 160), "num_bags": (223, 192), "num_indices": (255, 224),
    "indices_addr": (303, 256), "offsets_addr": (351, 304), "weights_addr": (399, 352),
    "data_addr": (447, 400), "cookie": (511, 448),
}


def test_descriptor_layout_matches_doc():
    assert d.Descriptor.size == 512 == d.DESC_BYTES * 8
    layout = {name: (f.offset + f.width - 1, f.offset) for name, f in d.Descriptor}
    assert layout == DOC_FIELDS
    assert list(layout) == list(DOC_FIELDS)          # LSB-first order, no gaps
    assert d.MAX_DIM == 4096


@pytest.mark.parametrize("name", list(DOC_FIELDS))
def test_descriptor_field_all_ones(name):
    hi, lo = DOC_FIELDS[name]
    raw = d.pack_descriptor(**{name: (1 << (hi - lo + 1)) - 1})
    assert len(raw) == 64
    assert int.from_bytes(raw, "little") == ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)
    changed = [i for i, byte in enumerate(raw) if byte]
    assert changed == list(range(lo // 8, hi // 8 + 1))
    fields = d.unpack_descriptor(raw)
    assert fields[name] == (1 << (hi - lo + 1)) - 1
    assert all(v == 0 for k, v in fields.items() if k != name)


def test_descriptor_round_trip(seed):
    rng = random.Random(seed)
    for _ in range(200):
        fields = {name: rng.getrandbits(hi - lo + 1) for name, (hi, lo) in DOC_FIELDS.items()}
        assert d.unpack_descriptor(d.pack_descriptor(**fields)) == fields
    raw = bytes(rng.getrandbits(8) for _ in range(64))
    assert d.pack_descriptor(**d.unpack_descriptor(raw)) == raw


def test_descriptor_little_endian_and_enums():
    raw = d.pack_descriptor(kind=DescKind.UPDATE, mode=PoolMode.MEAN, dim=0x1234,
                            cookie=0x0102030405060708)
    assert raw[0] == 2 and raw[1] == 0b01
    assert raw[14:16] == b"\x34\x12"
    assert raw[56:64] == bytes([8, 7, 6, 5, 4, 3, 2, 1])


def test_descriptor_errors():
    with pytest.raises(ValueError, match="'dims' is not a field"):
        d.pack_descriptor(dims=1)
    with pytest.raises(ValueError, match="does not fit field 'mode'"):
        d.pack_descriptor(mode=4)
    with pytest.raises(ValueError, match="a descriptor is 64 bytes, not 63"):
        d.unpack_descriptor(bytes(63))


def test_enums_match_doc():
    assert {m.name: m.value for m in DescKind} == {
        "NOP": 0, "LOOKUP": 1, "UPDATE": 2, "COMMIT": 3, "MLP_CHECKPOINT": 4, "FENCE": 5}
    assert {m.name: m.value for m in PoolMode} == {"SUM": 0, "MEAN": 1, "MAX": 2}
    assert {m.name: m.value for m in Status} == {
        "OK": 0, "BAD_KIND": 1, "UNSUPPORTED": 2, "MISALIGNED": 3, "ADDR_RANGE": 4,
        "BAD_OFFSETS": 5, "INDEX_RANGE": 6, "LOG_FULL": 7, "BAD_BATCH": 8, "READ_ERROR": 9}
    assert DescKind.as_shape().width == 8
    assert PoolMode.as_shape().width == 2
    assert Status.as_shape().width == 8


def test_hw_imports_no_numpy_sim_or_tb():
    code = ("import sys, hw.engine.descriptor; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('numpy', 'sim', 'tb', 'ml_dtypes')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"


# --- Row layout ------------------------------------------------------------------------

@pytest.mark.parametrize(("dim", "dtype", "lines"), [
    (1, F32, 1), (16, F32, 1), (17, F32, 2), (4096, F32, 256),
    (1, BF16, 1), (32, BF16, 1), (33, BF16, 2), (4096, BF16, 128)])
def test_lines_per_row(dim, dtype, lines):
    assert emb.lines_per_row(dim, dtype) == lines


def test_lines_per_row_errors():
    with pytest.raises(ValueError, match="dim must be at least 1, not 0"):
        emb.lines_per_row(0, F32)
    with pytest.raises(ValueError, match="dtype must be float32 or bfloat16, not float64"):
        emb.lines_per_row(1, np.float64)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dim", [1, 7, 16, 33, 100])
def test_pack_unpack_rows(dtype, dim, seed):
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((5, dim)).astype(np.float32).astype(dtype)
    stride = emb.lines_per_row(dim, dtype) * 64
    image = emb.pack_rows(table)
    assert len(image) == 5 * stride
    assert same(emb.unpack_rows(image, 5, dim, dtype), table)
    row_bytes = dim * np.dtype(dtype).itemsize
    for r in range(5):
        assert image[r * stride + row_bytes:(r + 1) * stride] == bytes(stride - row_bytes)
    # Padding keeps the bytes of a base image.
    base = bytes(rng.integers(0, 256, 5 * stride, dtype=np.uint8))
    image = emb.pack_rows(table, base)
    for r in range(5):
        assert image[r * stride + row_bytes:(r + 1) * stride] == \
            base[r * stride + row_bytes:(r + 1) * stride]
    assert same(emb.unpack_rows(image, 5, dim, dtype), table)


def test_pack_rows_little_endian():
    image = emb.pack_rows(np.array([[1.0, -2.0]], np.float32))
    assert image[:8] == bytes([0, 0, 0x80, 0x3F, 0, 0, 0, 0xC0])
    image = emb.pack_rows(np.array([[1.0, -2.0]], np.float32).astype(BF16))
    assert image[:4] == bytes([0x80, 0x3F, 0, 0xC0])


# --- Bags ------------------------------------------------------------------------------

def test_bags_offsets_forms():
    idx = [5, 6, 7, 8, 9]
    assert emb.bags(idx, [0, 2, 2, 4]) == [[5, 6], [], [7, 8], [9]]
    assert emb.bags(idx, [0, 2, 2, 4, 5], include_last_offset=True) == \
        [[5, 6], [], [7, 8], [9]]
    assert emb.bags(idx, [0, 2, 2, 4, 4], include_last_offset=True, num_indices=4) == \
        [[5, 6], [], [7, 8], []]
    assert emb.bags(idx, [0, 5]) == [[5, 6, 7, 8, 9], []]
    assert emb.bags([], []) == []
    assert emb.bags([], [0], include_last_offset=True) == []


def test_bags_padding():
    idx = [3, -1, 3, 4, 0xFFFFFFFF, 3]
    assert emb.bags(idx, [0, 3], padding_idx=3) == [[-1], [4, -1]]
    assert emb.bags(idx, [0, 3], padding_idx=-1) == [[3, 3], [4, 3]]
    assert emb.bags(idx, [0, 3], padding_idx=0xFFFFFFFF) == [[3, 3], [4, 3]]
    assert emb.bags(idx, [0, 3]) == [[3, -1, 3], [4, -1, 3]]


@pytest.mark.parametrize(("offsets", "ilo"), [
    ([1, 2], False), ([0, 3, 2], False), ([0, 6], False), ([0, 2, 4], True),
    ([0, -1], False)])
def test_bags_reject_bad_offsets(offsets, ilo):
    with pytest.raises(ValueError, match="offsets are not valid"):
        emb.bags([0] * 5, offsets, include_last_offset=ilo)


# --- Pooling: semantics ----------------------------------------------------------------

TABLE = np.array([[1, 2], [3, -4], [0.5, 8], [-2, 0.25]], np.float32)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
def test_pool_basic_modes(dtype):
    table = TABLE.astype(dtype)
    idx, off = [0, 1, 2, 3, 1], [0, 3, 3]
    out = emb.pool(table, idx, off, mode="sum")
    assert out.dtype == np.dtype(dtype)
    expect = np.array([[4.5, 6], [0, 0], [1, -3.75]], np.float32).astype(dtype)
    assert same(out, expect)
    assert same(emb.pool(table, idx, off, mode=PoolMode.MEAN),
                np.array([[1.5, 2], [0, 0], [0.5, -1.875]], np.float32).astype(dtype))
    assert same(emb.pool(table, idx, off, mode=2),
                np.array([[3, 8], [0, 0], [3, 0.25]], np.float32).astype(dtype))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_pool_include_last_offset_same(mode):
    idx = [0, 1, 2, 3, 1, 2]
    a = emb.pool(TABLE, idx, [0, 2, 2, 5], mode=mode)
    b = emb.pool(TABLE, idx, [0, 2, 2, 5, 6], mode=mode, include_last_offset=True)
    assert same(a, b)


def test_pool_padding_skipped_and_not_counted():
    out = emb.pool(TABLE, [2, 0, 2, 1], [0], mode="mean", padding_idx=2)
    assert same(out, np.array([[2, -1]], np.float32))
    out = emb.pool(TABLE, [2, 0, 2, 1], [0], mode="mean")
    assert same(out, np.array([[1.25, 3.5]], np.float32))
    # A padding index outside the table is fine (it is never read); other indices are not.
    with pytest.raises(ValueError, match="index 99 out of range for 4 rows"):
        emb.pool(TABLE, [-1, 0, 99], [0, 1], mode="max", padding_idx=-1)
    out = emb.pool(TABLE, [-1, 0, 1], [0, 1], mode="max", padding_idx=-1)
    assert same(out, np.array([[0, 0], [3, 2]], np.float32))


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_pool_empty_bags_are_positive_zero(mode, dtype):
    table = -TABLE.astype(dtype)
    # Bags: empty, only padding, empty (last bag ends at num_indices).
    out = emb.pool(table, [3, 3], [0, 0, 2], mode=mode, padding_idx=3)
    assert out.shape == (3, 2)
    assert not bits(out).any()


def test_pool_sum_starts_at_positive_zero():
    assert not np.signbit(pool1([-0.0]))
    assert not np.signbit(pool1([-0.0, -0.0], partials=1))


def test_pool_weights_sum_only():
    w = np.array([0.5, -2, 3], np.float32)
    out = emb.pool(TABLE, [0, 1, 3], [0, 2], mode="sum", weights=w)
    assert same(out, np.array([[-5.5, 9], [-6, 0.75]], np.float32))
    for mode in ("mean", "max"):
        with pytest.raises(ValueError, match="weights are legal with sum only"):
            emb.pool(TABLE, [0, 1, 3], [0, 2], mode=mode, weights=w)
    with pytest.raises(ValueError, match="2 weights for 3 indices"):
        emb.pool(TABLE, [0, 1, 3], [0, 2], mode="sum", weights=w[:2])


def test_pool_weighted_product_rounded_once_no_fma():
    # x = fl32(w * r), then fl32(s + x): w * r = (1 + 2^-23)^2 = 1 + 2^-22 + 2^-46 rounds
    # to 1 + 2^-22, which cancels s exactly; a fused multiply-add would leave 2^-46.
    r = F32(1 + 2.0 ** -23)
    table = column([-(1 + 2.0 ** -22), r])
    out = emb.pool(table, [0, 1], [0], mode="sum", weights=[1.0, r], partials=1)
    assert bits(out[0, 0]) == 0


def test_pool_argument_errors():
    with pytest.raises(ValueError, match="mode must be sum, mean or max, not 'min'"):
        emb.pool(TABLE, [0], [0], mode="min")
    with pytest.raises(ValueError, match="partials must be at least 1, not 0"):
        emb.pool(TABLE, [0], [0], mode="sum", partials=0)
    with pytest.raises(ValueError, match="index -2 out of range"):
        emb.pool(TABLE, [-2], [0], mode="sum")


# --- Pooling: the accumulation order ---------------------------------------------------

def naive_pool(table, bag_rows, weights, mode, partials):
    """The page's rules, one np.float32 scalar operation at a time."""
    dim = table.shape[1]
    out = np.zeros((len(bag_rows), dim), np.float32)
    with np.errstate(all="ignore"):
        for b, (rows, ws) in enumerate(zip(bag_rows, weights, strict=True)):
            if not rows:
                continue
            for e in range(dim):
                xs = [F32(table[r, e]) for r in rows]
                if ws is not None:
                    xs = [F32(F32(w) * x) for w, x in zip(ws, xs, strict=True)]
                if mode == "max":
                    acc = [F32(-np.inf)] * partials
                    for k, x in enumerate(xs):
                        acc[k % partials] = np.maximum(acc[k % partials], x)
                    res = acc[0]
                    for p in acc[1:]:
                        res = np.maximum(res, p)
                else:
                    acc = [F32(0.0)] * partials
                    for k, x in enumerate(xs):
                        acc[k % partials] = F32(acc[k % partials] + x)
                    res = acc[0]
                    for p in acc[1:]:
                        res = F32(res + p)
                    if mode == "mean":
                        res = F32(res / F32(len(xs)))
                out[b, e] = res
    return out.astype(table.dtype)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("partials", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("mode", ["sum", "wsum", "mean", "max"])
def test_pool_matches_naive_scalar_loop(mode, partials, dtype, seed):
    rng = np.random.default_rng(seed)
    rows, dim = 40, 5
    # Wide dynamic range, repeated values and signed zeros, so that order shows.
    table = (rng.standard_normal((rows, dim)) * 2.0 ** rng.integers(-30, 30, (rows, dim)))
    table[rng.random((rows, dim)) < 0.1] = 0.0
    table[rng.random((rows, dim)) < 0.1] = -0.0
    table = table.astype(np.float32).astype(dtype)
    idx, off = emb.random_bags(rng, 12, rows, pooling=6, padding_idx=7, empty_fraction=0.1,
                               max_len=30)
    weights = (rng.standard_normal(idx.size).astype(np.float32) if mode == "wsum" else None)
    kind = "sum" if mode == "wsum" else mode
    got = emb.pool(table, idx, off, mode=kind, weights=weights, padding_idx=7,
                   partials=partials)
    positions = [[k for k in range(s, e) if idx[k] != 7]
                 for s, e in zip(off, [*off[1:], idx.size], strict=True)]
    bag_rows = [[int(idx[k]) for k in pos] for pos in positions]
    bag_w = [None if weights is None else [weights[k] for k in pos] for pos in positions]
    assert same(got, naive_pool(table, bag_rows, bag_w, kind, partials))


def test_pool_partials_order_crafted():
    tiny = U                                  # 2^-24: half an ulp of 1.0
    x = [tiny, tiny, tiny, tiny, 1.0]
    # P=1: the tiny terms add exactly to 2^-22 first, then 1 + 2^-22 is exact.
    assert pool1(x, partials=1) == 1 + 2.0 ** -22
    # P=2: s0 = fl(2^-23 + 1) = 1 + 2^-23 (exact), s1 = 2^-23; S = 1 + 2^-22.
    assert pool1(x, partials=2) == 1 + 2.0 ** -22
    # P=4: s0 = fl(2^-24 + 1) = 1 (tie to even), s1 = s2 = s3 = 2^-24; each combine is
    # again 1 + 2^-24, a tie, so S = 1.
    assert pool1(x, partials=4) == 1.0
    # mean by 5 of each.
    assert pool1(x, mode="mean", partials=1) == float(F32(F32(1 + 2.0 ** -22) / F32(5)))
    assert pool1(x, mode="mean", partials=4) == float(F32(F32(1.0) / F32(5)))


def test_pool_partials_combined_left_to_right():
    # P=4, four terms: S = ((x0 + x1) + x2) + x3.
    x = [1.0, U, U, 2 * U]
    assert pool1(x) == 1 + 2.0 ** -23       # 1, 1, then 1 + 2^-23 exactly
    # Other orders round differently: pairwise and right to left give 1 + 2^-22.
    assert float(F32(F32(F32(1.0) + F32(U)) + F32(F32(U) + F32(2 * U)))) == 1 + 2.0 ** -22
    assert float(F32(F32(F32(F32(2 * U) + F32(U)) + F32(U)) + F32(1.0))) == 1 + 2.0 ** -22


def test_pool_padding_takes_no_partial_slot():
    # Rows 0..3 = 1, u, 2u, 0; the bag is [3, 0, 1, 0, 2].
    table = column([1.0, U, 2 * U, 0.0])
    idx = [3, 0, 1, 0, 2]
    # Row 3 is padding: x = [1, u, 1, 2u], s_p = x_p, S = ((1 + u) + 1) + 2u:
    # 1 + u = 1 (tie to even), 1 + 1 = 2, 2 + 2^-23 = 2 (tie to even).
    out = emb.pool(table, idx, [0], mode="sum", padding_idx=3)
    assert float(out[0, 0]) == 2.0
    # Row 3 counted (a zero): x = [0, 1, u, 1, 2u], s0 = 0 + 2u, s1 = 1, s2 = u, s3 = 1,
    # S = ((2u + 1) + u) + 1: 1 + 2^-23, then a tie to the even 1 + 2^-22, then 2 + 2^-22.
    out = emb.pool(table, idx, [0], mode="sum")
    assert float(out[0, 0]) == 2 + 2.0 ** -22


def test_pool_max_signed_zero_follows_order():
    for p in (1, 4):
        assert np.signbit(pool1([0.0, -0.0], "max", partials=p))   # maximum(+0, -0) = -0
        assert not np.signbit(pool1([-0.0, 0.0], "max", partials=p))
    # -0 > -inf, so a partial becomes -0, and -inf partials do not change it.
    assert np.signbit(pool1([-0.0], "max", partials=1))
    assert np.signbit(pool1([-0.0], "max", partials=4))
    # [-0, +0, -0, -0, +0]: sequentially the last +0 wins; with P = 4, m0 = max(-0, +0)
    # = +0, m1 = +0, m2 = m3 = -0, and max(max(max(+0, +0), -0), -0) = -0.
    seq = [-0.0, 0.0, -0.0, -0.0, 0.0]
    assert not np.signbit(pool1(seq, "max", partials=1))
    assert np.signbit(pool1(seq, "max", partials=4))


def test_pool_max_nan_and_inf():
    nan = np.nan
    table = np.array([[1, -np.inf, 2], [nan, -np.inf, 3], [5, -np.inf, nan]], np.float32)
    for p in (1, 2, 4):
        out = emb.pool(table, [0, 1, 2, 0], [0, 1], mode="max", partials=p)
        assert same(out, np.array([[1, -np.inf, 2], [nan, -np.inf, nan]], np.float32))


def test_pool_sum_specials():
    assert np.isnan(pool1([np.inf, 1.0, -np.inf]))
    assert pool1([np.inf, 1.0]) == np.inf
    big = float(F32(3e38))
    assert pool1([big, big, -big], partials=1) == np.inf    # overflow is sticky
    assert pool1([big, big, -big], partials=2) == big       # s0 = big - big, s1 = big
    # Subnormals are kept: 2^-149 + 2^-149 = 2^-148.
    assert pool1([2.0 ** -149, 2.0 ** -149]) == 2.0 ** -148


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_nan_results_are_canonical(dtype):
    """Rule 3: numpy gives 0xFFC00000 for inf - inf and keeps a NaN operand's sign and
    payload; the models return the device's canonical NaN for every NaN result, so the
    engine's images compare bit for bit (a sign-flipped NaN once failed a device test)."""
    neg_nan = np.array([0xFFC1_2345], np.uint32).view(np.float32)[0]
    table = np.array([[np.inf, 1, neg_nan], [-np.inf, 2, 3]], np.float32).astype(dtype)
    qnan = 0x7FC0_0000 if dtype == F32 else 0x7FC0
    for mode in ("sum", "mean", "max"):
        out = emb.pool(table, [0, 1], [0], mode=mode)
        want_nan = [mode != "max", False, True]
        assert list(np.isnan(out[0].astype(F32))) == want_nan, mode
        assert all(bits(out)[0][want_nan] == qnan), (mode, bits(out))
    grads = np.array([[-np.inf, 0, 0]], np.float32)
    new = emb.update(table, [0], [0], grads)
    assert bits(new)[0][0] == qnan and bits(new)[0][2] == qnan
    assert bits(new)[1].tolist() == bits(table)[1].tolist()    # untouched row keeps its bits


# --- Mean: correctly rounded division --------------------------------------------------

def round_to_f32(q: Fraction) -> F32:
    """Round an exact rational to the nearest fp32, ties to even (finite range only)."""
    if q == 0:
        return F32(0.0)
    sign, q = (-1 if q < 0 else 1), abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    quantum = Fraction(2) ** (max(e, -126) - 23)
    m, rem = divmod(q, quantum)
    if rem > quantum / 2 or (rem == quantum / 2 and m % 2):
        m += 1
    return F32(sign * float(m * quantum))


def test_mean_is_correctly_rounded(seed):
    """mean = fl32(S / n) exactly, and fl32(fl64(S / n)) is the same value.

    Double rounding is innocuous here: let q = S/n lie in [2^E, 2^(E+1)), E >= -126
    (fp32 midpoints there are odd multiples of 2^(E-24)), or be subnormal (E = -126,
    midpoints odd multiples of 2^-150). S is an fp32 value with S >= q, so S is a multiple
    of 2^(E-24) (2^-149 for subnormals); so is n*m for a midpoint m. Hence either q = m
    exactly (representable in float64, 25 bits) or |q - m| >= 2^(E-24)/n > 2^(E-48) for
    n < 2^24, while float64 rounding moves q by at most 2^-53 * q < 2^(E-52): it cannot
    reach or cross a midpoint, so the second rounding sees the same side of every midpoint.
    """
    rng = np.random.default_rng(seed)
    cases = [(F32(3 * 2.0 ** -149), 2), (F32(2.0 ** -149), 2), (F32(5 * 2.0 ** -149), 2),
             (F32(1.0), 3), (F32(-7.0), 6), (F32(2.0 ** -126), 3), (F32(3.4e38), 7)]
    for _ in range(3000):
        s = F32(rng.standard_normal() * 2.0 ** rng.integers(-149, 120))
        cases.append((s, int(rng.integers(1, 1 << rng.integers(1, 24)))))
    for s, n in cases:
        if s == 0:
            continue
        exact = round_to_f32(Fraction(float(s)) / n)
        via_f64 = F32(np.float64(s) / n)
        # The bag: n - 1 zeros then S, P = 1, so the model's S is s exactly.
        if n <= 8:
            got = F32(pool1([0.0] * (n - 1) + [float(s)], mode="mean", partials=1))
        else:
            got = F32(s) / F32(n)        # the model's operation, fl32(S / n)
        assert bits(exact) == bits(via_f64) == bits(got), (s, n)
    # The subnormal tie 1.5 * 2^-149 rounds to even: 2 * 2^-149.
    assert pool1([3 * 2.0 ** -149, 0.0], mode="mean") == 2.0 ** -148
    assert pool1([5 * 2.0 ** -149, 0.0], mode="mean") == 2.0 ** -148   # 2.5 -> 2
    assert pool1([7 * 2.0 ** -149, 0.0], mode="mean") == 2.0 ** -147   # 3.5 -> 4


def test_mean_of_model_matches_exact_rational(seed):
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((50, 3)).astype(np.float32)
    idx, off = emb.random_bags(rng, 30, 50, pooling=8, empty_fraction=0.1)
    sums = emb.pool(table, idx, off, mode="sum", partials=4)
    means = emb.pool(table, idx, off, mode="mean", partials=4)
    for b, bag in enumerate(emb.bags(idx, off)):
        for e in range(3):
            expect = round_to_f32(Fraction(float(sums[b, e])) / len(bag)) if bag else F32(0)
            assert bits(means[b, e]) == bits(expect)


# --- Pooling against the float64 reference ---------------------------------------------

@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["sum", "wsum", "mean", "max"])
def test_pool_within_bound_of_f64(mode, dtype, seed):
    rng = np.random.default_rng(seed)
    kind = "sum" if mode == "wsum" else mode
    for dim, partials in ((1, 4), (17, 1), (64, 3), (600, 4)):
        rows = 300
        table = rng.standard_normal((rows, dim)).astype(np.float32).astype(dtype)
        idx, off = emb.random_bags(rng, 8, rows, pooling=20, long_fraction=0.25,
                                   empty_fraction=0.125, padding_idx=0, zipf_alpha=1.05)
        w = rng.uniform(-2, 2, idx.size).astype(np.float32) if mode == "wsum" else None
        kw = dict(mode=kind, weights=w, padding_idx=0)
        got = emb.pool(table, idx, off, partials=partials, **kw).astype(np.float64)
        ref = emb.pool_f64(table, idx, off, **kw)
        bound = emb.pool_error_bound(table, idx, off, partials=partials, **kw)
        assert np.diff(np.append(off, idx.size)).max() >= 200
        err = np.abs(got - ref)
        assert np.all(err <= bound), float((err - bound).max())
        if kind == "max":
            assert not bound.any()


def test_bound_is_tight_for_sequential_sum():
    # 1 followed by n-1 terms of 2^-24: every add is a tie that rounds down, so the
    # computed sum stays 1 and the error is (n - 1) * 2^-24, almost gamma_(n-1) * A.
    n = 300
    table = column([1.0] + [U] * (n - 1))
    args = (table, np.arange(n), [0])
    err = abs(float(emb.pool(*args, mode="sum", partials=1)[0, 0])
              - emb.pool_f64(*args, mode="sum")[0, 0])
    bound = emb.pool_error_bound(*args, mode="sum", partials=1)[0, 0]
    assert err == (n - 1) * U
    assert 0.98 * bound < err <= bound


def test_bound_exact_cases():
    # A single term with P=1 is exact: the bound is only the reference slack.
    b = emb.pool_error_bound(TABLE, [1], [0], mode="sum", partials=1)
    assert np.all(b < 1e-12)


# --- Update ----------------------------------------------------------------------------

def naive_update(table, bag_rows, bag_w, grads):
    """The coalesced contract element by element: per distinct row the first
    contribution, then each later one added in index order, then one add and one
    rounding into the row."""
    sums = {}
    with np.errstate(all="ignore"):
        for b, (rows, ws) in enumerate(zip(bag_rows, bag_w, strict=True)):
            for k, r in enumerate(rows):
                c = [grads[b, e] if ws is None else F32(F32(ws[k]) * grads[b, e])
                     for e in range(table.shape[1])]
                sums[r] = c if r not in sums else [F32(a + x)
                                                   for a, x in zip(sums[r], c, strict=True)]
        new = table.copy()
        for r, s in sums.items():
            for e in range(table.shape[1]):
                new[r, e] = np.asarray(F32(F32(table[r, e]) + s[e])).astype(table.dtype)
    return new


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_update_matches_naive_loop(dtype, weighted, seed):
    rng = np.random.default_rng(seed)
    rows, dim = 20, 6
    table = rng.standard_normal((rows, dim)).astype(np.float32).astype(dtype)
    idx, off = emb.random_bags(rng, 10, rows, pooling=5, zipf_alpha=1.2, padding_idx=3,
                               empty_fraction=0.1)
    grads = (rng.standard_normal((10, dim)) * 2.0 ** rng.integers(-12, 2, (10, dim)))
    grads = grads.astype(np.float32)
    w = rng.uniform(-1, 1, idx.size).astype(np.float32) if weighted else None
    before = table.copy()
    got = emb.update(table, idx, off, grads, weights=w, padding_idx=3)
    assert same(table, before)
    positions = [[k for k in range(s, e) if idx[k] != 3]
                 for s, e in zip(off, [*off[1:], idx.size], strict=True)]
    bag_rows = [[int(idx[k]) for k in pos] for pos in positions]
    bag_w = [None if w is None else [w[k] for k in pos] for pos in positions]
    assert same(got, naive_update(table, bag_rows, bag_w, grads))
    assert same(got[3], table[3])                     # the padding row is untouched


def test_update_bf16_rounds_once_per_row():
    table = np.array([[1.0]], np.float32).astype(BF16)
    grads = np.full((3, 1), 2.0 ** -9, np.float32)    # a quarter bf16 ulp of 1.0
    got = emb.update(table, [0, 0, 0], [0, 1, 2], grads)
    # The sum 3 * 2^-9 is added once: 1 + 3 * 2^-9 rounds to 1 + 2^-7 (rounding after
    # every contribution would have kept 1.0).
    assert float(got[0, 0]) == 1 + 2.0 ** -7


def test_update_sums_contributions_first_in_index_order():
    # fp32: the two gradients of the repeated row are summed (2^-23) before the add;
    # adding each to the row would round 1 + 2^-24 back to 1 twice.
    table = column([1.0, 5.0])
    grads = np.full((2, 1), U, np.float32)
    got = emb.update(table, [0, 0], [0, 1], grads)
    assert float(got[0, 0]) == 1 + 2.0 ** -23 and float(got[1, 0]) == 5.0
    got = emb.update(table, [0, 0], [0], grads[:1])   # repeated within a bag: same
    assert float(got[0, 0]) == 1 + 2.0 ** -23
    # Bags in order: +2^24, -2^24, +1 sum to exactly 1, then 1 + 1 = 2 (applying each
    # to the row would give 1: 1 + 2^24 rounds to 2^24).
    grads = np.array([[2.0 ** 24], [-(2.0 ** 24)], [1.0]], np.float32)
    got = emb.update(column([1.0]), [0, 0, 0], [0, 1, 2], grads)
    assert float(got[0, 0]) == 2.0
    # The sum is in index order: 1 + 2^24 - 2^24 = 0 (the tie rounds 2^24 + 1 to 2^24).
    grads = np.array([[1.0], [2.0 ** 24], [-(2.0 ** 24)]], np.float32)
    got = emb.update(column([1.0]), [0, 0, 0], [0, 1, 2], grads)
    assert float(got[0, 0]) == 1.0


def test_update_weights_and_errors():
    table = column([1.0, 2.0])
    grads = np.array([[4.0]], np.float32)
    got = emb.update(table, [0, 1, 0], [0], grads, weights=[0.5, -1, 0.25])
    assert same(got, column([4.0, -2.0]))
    with pytest.raises(ValueError, match=r"grads must be float32 of shape \(1, 1\)"):
        emb.update(table, [0], [0], np.zeros((1, 1)))
    with pytest.raises(ValueError, match="index 2 out of range for 2 rows"):
        emb.update(table, [2], [0], grads)


def test_coalesce_stats():
    s = emb.coalesce_stats([1, 2, 1, 7, 1, 2], [0, 3], padding_idx=7)
    assert (s.updates, s.distinct_rows) == (5, 2)
    assert s.write_saving == pytest.approx(0.6)
    assert emb.coalesce_stats([], []).write_saving == 0.0


# --- validate() ------------------------------------------------------------------------

PMEM = 1 << 20


def lookup(**over) -> dict:
    """A valid LOOKUP: 100 rows x 20 fp32 (2 lines per row), 3 bags over 6 indices."""
    desc = dict(kind=1, mode=0, dim=20, rows=100, table_base=0x1000, num_bags=3,
                num_indices=6, indices_addr=0x40000, offsets_addr=0x40100,
                weights_addr=0x40200, data_addr=0x40300, padding_idx=0xFFFFFFFF)
    desc.update(over)
    return desc


IDX = [0, 5, 99, 5, 7, 1]
OFF = [0, 2, 2]


def check(desc, indices=IDX, offsets=OFF, pmem=PMEM) -> Status:
    status = emb.validate(desc, indices=indices, offsets=offsets, pmem_size=pmem)
    # The same through the 64-byte encoding.
    raw = d.unpack_descriptor(d.pack_descriptor(**desc))
    assert emb.validate(raw, indices=indices, offsets=offsets, pmem_size=pmem) is status
    return status


def test_validate_ok():
    assert check(lookup()) is Status.OK
    assert check(lookup(kind=2)) is Status.OK
    assert check(lookup(weighted=1)) is Status.OK
    assert check(lookup(mode=1, bf16=1, capture_undo=1)) is Status.OK
    assert check(lookup(include_last_offset=1), offsets=[0, 2, 2, 6]) is Status.OK
    assert check(lookup(num_bags=0, num_indices=0), [], []) is Status.OK
    assert check(lookup(dim=4096), pmem=1 << 26) is Status.OK


@pytest.mark.parametrize("kind", [6, 7, 0x80, 0xFF])
def test_validate_bad_kind(kind):
    assert check(lookup(kind=kind)) is Status.BAD_KIND
    # Reported before everything else.
    assert check(lookup(kind=kind, mode=3, dim=0, table_base=1), [-1], [5]) is Status.BAD_KIND


@pytest.mark.parametrize("kind", [0, 3, 5])
def test_validate_other_kinds_check_kind_only(kind):
    assert check(lookup(kind=kind, mode=3, dim=0, table_base=1, rsvd_flag=1), [-1], [5]) \
        is Status.OK


def test_validate_mlp_checkpoint_unsupported_in_this_build():
    assert check(lookup(kind=4, mode=3, dim=0, table_base=1, rsvd_flag=1), [-1], [5]) \
        is Status.UNSUPPORTED


def test_validate_device_max_dim():
    desc = lookup(dim=65)
    assert emb.validate(desc, indices=IDX, offsets=OFF, pmem_size=PMEM, max_dim=64) \
        is Status.UNSUPPORTED
    assert emb.validate(lookup(dim=64), indices=IDX, offsets=OFF, pmem_size=PMEM,
                        max_dim=64) is check(lookup(dim=64))


@pytest.mark.parametrize("fault", [
    dict(rsvd_flag=1), dict(mode=3), dict(dim=0), dict(dim=4097), dict(dim=0xFFFF),
    dict(weighted=1, mode=1), dict(weighted=1, mode=2), dict(kind=2, mode=2),
    dict(kind=2, weighted=1, mode=1)])
def test_validate_unsupported(fault):
    assert check(lookup(**fault)) is Status.UNSUPPORTED
    # Before alignment, range and buffer checks.
    assert check(lookup(table_base=0x1001, rows=1 << 31, **fault), [-1], [5]) \
        is Status.UNSUPPORTED


def test_validate_supported_combinations():
    assert check(lookup(mode=2)) is Status.OK                  # LOOKUP max
    assert check(lookup(kind=2, mode=1)) is Status.OK          # UPDATE mean
    assert check(lookup(kind=2, weighted=1)) is Status.OK      # weighted UPDATE sum


@pytest.mark.parametrize("field", ["table_base", "indices_addr", "offsets_addr",
                                   "data_addr", "weights_addr"])
@pytest.mark.parametrize("delta", [1, 4, 32])
def test_validate_misaligned(field, delta):
    desc = lookup(weighted=1, **{field: lookup()[field] + delta})
    assert check(desc) is Status.MISALIGNED
    # Before range checks and buffer contents.
    assert check(dict(desc, rows=1 << 31), [-1], [5]) is Status.MISALIGNED


def test_validate_weights_addr_ignored_without_weights():
    assert check(lookup(weighted=0, weights_addr=0x3F)) is Status.OK
    assert check(lookup(weighted=0, weights_addr=(1 << 48) - 64)) is Status.OK


def test_validate_addr_range():
    # The last buffer, data: 3 bags x 2 lines at 0x40300; a region may end at the end.
    assert check(lookup(), pmem=0x40300 + 3 * 128) is Status.OK
    assert check(lookup(), pmem=0x40300 + 3 * 128 - 64) is Status.ADDR_RANGE
    # Table: 100 rows x 2 lines.
    assert check(lookup(table_base=PMEM - 100 * 128)) is Status.OK
    assert check(lookup(table_base=PMEM - 100 * 128 + 64)) is Status.ADDR_RANGE
    assert check(lookup(rows=PMEM // 128)) is Status.ADDR_RANGE
    assert check(lookup(table_base=0, rows=PMEM // 128)) is Status.OK
    # Indices (6 x 4 bytes), offsets (3 x 4 bytes), weights when weighted.
    assert check(lookup(indices_addr=PMEM - 64)) is Status.OK
    assert check(lookup(indices_addr=PMEM - 64, num_indices=17), IDX * 3) is Status.ADDR_RANGE
    assert check(lookup(offsets_addr=PMEM)) is Status.ADDR_RANGE
    assert check(lookup(offsets_addr=PMEM, num_bags=0), IDX, []) is Status.OK  # empty, at end
    assert check(lookup(offsets_addr=PMEM + 64, num_bags=0), IDX, []) is Status.ADDR_RANGE
    assert check(lookup(weighted=1, weights_addr=PMEM)) is Status.ADDR_RANGE
    assert check(lookup(weighted=1, weights_addr=PMEM - 64)) is Status.OK
    assert check(lookup(table_base=(1 << 48) - 64)) is Status.ADDR_RANGE


def test_validate_data_buffer_size_depends_on_kind_and_dtype():
    # dim 32: bf16 pooled output 1 line per bag, fp32 gradients 2 lines per bag.
    at = PMEM - 3 * 64
    assert check(lookup(dim=32, bf16=1, data_addr=at)) is Status.OK
    assert check(lookup(dim=32, bf16=0, data_addr=at)) is Status.ADDR_RANGE
    assert check(lookup(dim=32, bf16=1, kind=2, data_addr=at)) is Status.ADDR_RANGE
    assert check(lookup(dim=32, bf16=1, kind=2, data_addr=PMEM - 6 * 64)) is Status.OK


def test_validate_addr_range_before_buffer_contents():
    assert check(lookup(data_addr=PMEM), [-1] * 6, [3, 1, 0]) is Status.ADDR_RANGE


@pytest.mark.parametrize(("offsets", "ilo"), [
    ([1, 2, 2], False), ([0, 3, 2], False), ([0, 2, 7], False), ([0, 2, -1], False),
    ([0, 2, 0x80000000], False), ([0, 2, 2, 5], True), ([0, 2, 2, 7], True),
    ([0, 3, 2, 6], True)])
def test_validate_bad_offsets(offsets, ilo):
    desc = lookup(include_last_offset=int(ilo))
    assert check(desc, IDX, offsets) is Status.BAD_OFFSETS
    # Reported before a bad index.
    assert check(desc, [100] * 6, offsets) is Status.BAD_OFFSETS


def test_validate_offsets_edges():
    assert check(lookup(), IDX, [0, 6, 6]) is Status.OK           # trailing empty bags
    assert check(lookup(), IDX, [0, 0, 0]) is Status.OK
    assert check(lookup(num_bags=1, include_last_offset=1), IDX, [0, 6]) is Status.OK
    assert check(lookup(num_bags=0, include_last_offset=1), IDX, [0]) is Status.BAD_OFFSETS
    assert check(lookup(num_bags=0, num_indices=0, include_last_offset=1), [], [0]) \
        is Status.OK


@pytest.mark.parametrize("bad", [100, 1000, -1, -(1 << 31), 0x7FFFFFFF])
def test_validate_index_range(bad):
    for pos in (0, 3, 5):
        idx = list(IDX)
        idx[pos] = bad
        assert check(lookup(), idx) is Status.INDEX_RANGE
        assert check(lookup(kind=2), idx) is Status.INDEX_RANGE


def test_validate_padding_index_exempt():
    idx = [0, -1, 99, 5, -1, 1]
    assert check(lookup(has_padding_idx=1, padding_idx=0xFFFFFFFF), idx) is Status.OK
    assert check(lookup(has_padding_idx=0, padding_idx=0xFFFFFFFF), idx) is Status.INDEX_RANGE
    idx = [0, 100, 99, 5, 100, 1]
    assert check(lookup(has_padding_idx=1, padding_idx=100), idx) is Status.OK
    assert check(lookup(has_padding_idx=1, padding_idx=101), idx) is Status.INDEX_RANGE


def test_validate_checks_indices_outside_bags():
    # num_bags = 0: the indices belong to no bag but are still checked.
    assert check(lookup(num_bags=0), [0, 1, 2, 3, 4, 100], []) is Status.INDEX_RANGE
    assert check(lookup(num_bags=0), [0, 1, 2, 3, 4, 5], []) is Status.OK


def test_validate_buffer_argument_errors():
    with pytest.raises(ValueError, match="2 offsets given, the descriptor has 3"):
        emb.validate(lookup(), indices=IDX, offsets=[0, 1], pmem_size=PMEM)
    with pytest.raises(ValueError, match="5 indices given, the descriptor has 6"):
        emb.validate(lookup(), indices=IDX[:5], offsets=OFF, pmem_size=PMEM)


# --- Workloads -------------------------------------------------------------------------

def test_random_bags_features(seed):
    rng = np.random.default_rng(seed)
    idx, off = emb.random_bags(rng, 200, 1000, pooling=10, zipf_alpha=1.1, padding_idx=-1,
                               empty_fraction=0.05, long_fraction=0.05)
    assert idx.dtype == off.dtype == np.int32
    assert off.size == 200 and off[0] == 0 and np.all(np.diff(off) >= 0)
    lengths = np.diff(np.append(off, idx.size))
    assert (lengths == 0).sum() >= 10
    assert (lengths == 1).any()
    assert (lengths >= 200).sum() >= 10
    assert (idx == -1).any()
    counted = idx[idx != -1]
    assert counted.min() >= 0 and counted.max() < 1000
    assert np.unique(counted).size < counted.size / 2               # power law repeats
    assert np.bincount(counted).max() > 20 * counted.size / 1000    # a hot row
    bag_lists = emb.bags(idx, off)
    assert any(len(set(b)) < len(b) for b in bag_lists)             # duplicates in a bag


def test_random_bags_options(seed):
    rng = np.random.default_rng(seed)
    idx, off = emb.random_bags(rng, 50, 7, pooling=3, max_len=4, include_last_offset=True)
    assert off.size == 51 and off[-1] == idx.size
    assert np.diff(off).max() <= 4
    assert idx.min() >= 0 and idx.max() < 7
    idx, off = emb.random_bags(rng, 0, 7, pooling=3)
    assert idx.size == off.size == 0
    with pytest.raises(ValueError, match="long bags need max_len >= 200, not 50"):
        emb.random_bags(rng, 10, 7, pooling=3, max_len=50, long_fraction=0.5)
    with pytest.raises(ValueError, match="must not exceed 1"):
        emb.random_bags(rng, 10, 7, pooling=3, empty_fraction=0.6, long_fraction=0.6)
    idx, _ = emb.random_bags(rng, 100, 1 << 31, pooling=4, zipf_alpha=0.8)
    assert idx.min() >= 0


# --- passes of an UPDATE larger than the accumulator --------------------------------------

def test_pass_hash_is_xorshift32():
    """Marsaglia's xorshift32 (13, 17, 5): 270369 after 1, and the documented steps on
    random words; a bijection (no two of many words collide)."""
    assert emb.pass_hash(1) == 270369
    rng = random.Random(5)
    words = rng.sample(range(1 << 32), 20000)
    for x in words[:200]:
        y = x ^ (x << 13) % (1 << 32)
        y ^= y >> 17
        assert emb.pass_hash(x) == y ^ (y << 5) % (1 << 32)
    assert len({emb.pass_hash(x) for x in words}) == len(words)


@pytest.mark.parametrize("acc, glines, n, want", [
    ((256, 1024), 1, 256, 1), ((256, 1024), 1, 257, 2), ((256, 1024), 4, 257, 2),
    ((256, 1024), 8, 129, 2), ((4096, 16384), 16, 1024, 1), ((4096, 16384), 16, 1025, 2),
    ((256, 1024), 1, 0, 1)])
def test_passes_needed(acc, glines, n, want):
    assert emb.passes_needed(n, glines, acc) == want


#: Rows whose pass hash ends in three zero bits.
CROWD = [r for r in range(1 << 14) if emb.pass_hash(r) & 7 == 0]


def test_update_passes_cover_each_row_once(seed):
    """An UPDATE that fits by its size runs one pass, (0, 0); a larger one first tries
    (0, 0), and if that overflows, the passes of level L0 follow, L0 the smallest level
    from 1 at which 2**L0 times the indices before the first row that did not fit
    reach all of them; the passes that did not overflow hold every distinct row
    exactly once and each fits, the overflowed ones do not fit, and an overflowed pass
    is followed by its first half."""
    rng = random.Random(seed)
    acc = (8, 32)
    firsts = splits = 0
    for _ in range(300):
        glines = rng.choice([1, 2, 4])
        rows = rng.sample(range(1 << 20), rng.randint(1, 60))
        if rng.random() < 0.4:      # all in the first pass of each of levels 0 to 3
            rows = CROWD[:rng.randint(9, 60)]
        counted = [rng.choice(rows) for _ in range(rng.randrange(len(rows)))] + rows
        rng.shuffle(counted)
        n = len(counted)
        sched = emb.update_passes(counted, n, glines, acc)
        assert sched[0][:2] == (0, 0)
        if emb.passes_needed(n, glines, acc) == 1:
            assert sched == [(0, 0, False)]
            continue
        fit = max(k for k in range(n + 1)
                  if len(set(counted[:k])) <= acc[0] and len(set(counted[:k])) * glines
                  <= acc[1])
        assert sched[0][2] == (fit < n)
        if fit < n:
            firsts += 1
            level0 = sched[1][0]
            assert fit << level0 >= n and (level0 == 1 or fit << (level0 - 1) < n)
            assert [p[:2] for p in sched[1:] if p[0] == level0] == [
                (level0, v) for v in range(1 << level0)]
        seen = []
        for k, (level, value, over) in enumerate(sched):
            mine = {r for r in rows if emb.pass_hash(r) & ((1 << level) - 1) == value}
            assert over == (len(mine) > acc[0] or len(mine) * glines > acc[1])
            if over and k:
                splits += 1
                assert sched[k + 1][:2] == (level + 1, value)
            elif not over:
                seen += mine
        assert sorted(seen) == sorted(set(rows))
    assert firsts > 10 and splits > 10, (firsts, splits)


def test_validate_update_passes():
    """An UPDATE past the accumulator is OK up to max_passes passes, UNSUPPORTED past."""
    n = 4 * 256 + 1
    fields = lookup(kind=DescKind.UPDATE.value, num_indices=n, dim=16, num_bags=1)
    kw = {"indices": np.zeros(n, np.int32), "offsets": np.array([0], np.int32),
          "pmem_size": PMEM, "update_acc": (256, 1024)}
    assert emb.validate(fields, **kw) is Status.UNSUPPORTED
    assert emb.validate(fields, **kw, max_passes=4) is Status.UNSUPPORTED
    assert emb.validate(fields, **kw, max_passes=8) is Status.OK
    assert emb.validate(dict(fields, num_indices=n - 1), **kw, max_passes=4) is Status.OK
