"""The coalesced UPDATE's golden model (``sim.embedding.update``) against its
contract in ``docs/embedding.md``, "Coalesced update": one fp32 sum and one rounding
per distinct row, and seeded stochastic rounding to bf16. The references here are
scalar loops written from that page."""

from __future__ import annotations

import numpy as np
import pytest

from sim import embedding as emb

F32, BF16 = emb.FP32, emb.BF16
M32 = 0xFFFFFFFF


def mix32(h: int) -> int:
    """MurmurHash3's finalizer, in Python integers, as the page gives it."""
    h ^= h >> 16
    h = h * 0x85EBCA6B & M32
    h ^= h >> 13
    h = h * 0xC2B2AE35 & M32
    return h ^ h >> 16


def sr_reference(x: float, row: int, elem: int, seed: int) -> int:
    """The bf16 bit pattern stochastic rounding gives fp32 ``x`` (finite) at
    ``(row, elem)``."""
    u = int(np.float32(x).view(np.uint32))
    h = mix32(seed ^ mix32((row * 0x9E3779B9 + elem) & M32))
    return (u + (h & 0xFFFF)) >> 16 & 0xFFFF


def contract(table, indices, offsets, grads, weights=None, store=None):
    """Scalar loop from the page: per row, its contributions in index order."""
    new = table.copy()
    offs = [*offsets, len(indices)]
    contributions: dict[int, list] = {}
    for b in range(len(offsets)):
        for k in range(offs[b], offs[b + 1]):
            c = [np.float32(g) if weights is None else np.float32(weights[k]) * np.float32(g)
                 for g in grads[b]]
            contributions.setdefault(int(indices[k]), []).append(c)
    for r, cs in contributions.items():
        total = list(cs[0])
        for c in cs[1:]:
            total = [np.float32(a + x) for a, x in zip(total, c, strict=True)]
        x = [np.float32(np.float32(v) + t) for v, t in zip(new[r], total, strict=True)]
        new[r] = [store(r, e, v) if store else v for e, v in enumerate(x)]
    return new


def bits(a) -> bytes:
    return emb.pack_rows(np.asarray(a))


@pytest.mark.parametrize("weighted", [False, True])
def test_rows_named_once_take_one_add(seed, weighted):
    """A row named by one index: row = store(fl32(row + fl32(w * g))), nothing else."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((64, 7)).astype(F32)
    table[3] = -0.0                                     # signed zeros survive
    idx = rng.permutation(64)[:20].astype(np.int32)
    off = np.array([0, 3, 3, 9, 15], np.int32)
    bag = np.searchsorted(off, np.arange(20), side="right") - 1
    grads = rng.standard_normal((5, 7)).astype(F32)
    grads[0] = -0.0
    w = rng.standard_normal(20).astype(F32) if weighted else None
    for dtype in (F32, BF16):
        t = table.astype(dtype)
        want = t.copy()
        for k, r in enumerate(idx):
            c = grads[bag[k]] if w is None else w[k] * grads[bag[k]]
            want[r] = (t[r].astype(F32) + c).astype(dtype)
        assert bits(emb.update(t, idx, off, grads, weights=w)) == bits(want)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_repeated_rows_follow_the_contract(seed, dtype):
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((16, 5)).astype(dtype)
    idx, off = emb.random_bags(rng, 12, 16, pooling=4, zipf_alpha=1.2, padding_fraction=0)
    grads = (rng.standard_normal((12, 5)) * 10.0 ** rng.integers(-6, 3, (12, 1))).astype(F32)
    w = rng.standard_normal(len(idx)).astype(F32)
    want = contract(table, idx, off, grads, w, store=lambda r, e, v: np.array(v).astype(dtype))
    got = emb.update(table, idx, off, grads, weights=w)
    assert bits(got) == bits(want)
    assert len(set(idx.tolist())) < len(idx), "the draw repeats no row"


def test_bf16_hot_row_keeps_its_small_updates():
    """64 contributions of 2^-10 to a bf16 row of 1.0: each alone is below half a bf16
    unit at 1 (2^-8) and rounds away; summed first they make 1 + 2^-4."""
    table = np.ones((2, 4), BF16)
    idx = np.zeros(64, np.int32)
    off = np.arange(64, dtype=np.int32)
    grads = np.full((64, 4), 2.0 ** -10, F32)
    assert (np.float32(1) + np.float32(2.0 ** -10)).astype(BF16) == 1.0
    assert np.all(emb.update(table, idx, off, grads)[0] == 1.0625)
    assert np.all(emb.update(table, idx, off, grads)[1] == 1.0)


def test_stochastic_rounding_is_the_documented_formula(seed):
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(40) * 10.0 ** rng.integers(-30, 30, 40)).astype(F32)
    values[:3] = [0.0, -0.0, 2.0 ** -140]
    s = int(rng.integers(1 << 32))
    for row in (0, 7, 123456):
        got = emb.stochastic_bf16(values, row, s).view(np.uint16)
        want = [sr_reference(float(v), row, e, s) for e, v in enumerate(values)]
        assert got.tolist() == want


def test_stochastic_rounding_picks_a_neighbour_and_is_unbiased():
    """x = 1 + 2^-9 lies a quarter of the way from bf16 1 to 1 + 2^-7: over 8,192 rows
    it rounds to one of the two, up about a quarter of the time."""
    x = np.full(8, 1 + 2.0 ** -9, F32)
    ups = 0
    for row in range(1024):
        r = emb.stochastic_bf16(x, row, 12345).astype(F32)
        assert set(r.tolist()) <= {1.0, 1 + 2.0 ** -7}
        ups += int((r > 1).sum())
    print(f"rounded up {ups} of 8192")
    assert abs(ups / 8192 - 0.25) < 0.02                  # about 4 standard errors
    other = [emb.stochastic_bf16(x, row, 54321) for row in range(64)]
    assert any(not np.array_equal(o, emb.stochastic_bf16(x, row, 12345))
               for row, o in enumerate(other)), "the seed changes nothing"


def test_stochastic_update_specials():
    table = np.array([[1.0, np.inf, -np.inf, 3.0]], BF16)
    grads = np.array([[np.nan, 1.0, 1.0, 2.0 ** -10]], F32)
    got = emb.update(table, [0], [0], grads, rounding="stochastic", seed=9)
    assert bits(got[:, :1]) == bits(emb.canonical_nans(np.array([[np.nan]], BF16)))
    assert got[0, 1] == np.inf and got[0, 2] == -np.inf
    assert got[0, 3] in (3.0, 3.0 + 2.0 ** -6)
    again = emb.update(table, [0], [0], grads, rounding="stochastic", seed=9)
    assert bits(got) == bits(again)


def test_bad_arguments():
    t32 = np.zeros((4, 2), F32)
    g = np.zeros((1, 2), F32)
    with pytest.raises(ValueError, match="rounding must be one of nearest, stochastic, "
                                         "not 'up'"):
        emb.update(t32, [0], [0], g, rounding="up")
    with pytest.raises(ValueError, match="stochastic rounding needs a bf16 table"):
        emb.update(t32, [0], [0], g, rounding="stochastic")
    with pytest.raises(ValueError, match="grads must be float32"):
        emb.update(t32, [0], [0], np.zeros((2, 2), F32))
    with pytest.raises(ValueError, match="index 4 out of range for 4 rows"):
        emb.update(t32, [4], [0], g)
