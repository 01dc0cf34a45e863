"""DLRM-shaped training workloads: named presets and a synthetic click data set.

A :class:`Workload` fixes everything a training run needs besides its seed: the
embedding tables (rows per table, ``dim``, fp32 or bf16), how bags are drawn (bag size
distribution and Zipf skew of the rows), the dense features, the MLPs, the batch size
and count, the learning rate, the MLP checkpoint interval ``K`` and the GPU throughput
that turns the MLPs' FLOPs into device cycles (``docs/training.md``). :data:`PRESETS` holds
the named ones; :meth:`Workload.with_overrides` derives variants.

:class:`SyntheticClicks` is a deterministic click log with a learnable signal, so that
the loss of a DLRM trained on it falls within a preset's batches: a hidden "teacher"
scores every sample from its dense features and its rows, and the label is a Bernoulli
draw of the sigmoid of that score.

GPU throughput assumption
-------------------------
The device runs at :data:`DEVICE_CLOCK_HZ` (250 MHz). The GPU is taken to sustain
:data:`GPU_FLOPS` = 1 TFLOP/s of fp32 on DLRM's MLPs: about 5 % of an A100's 19.5 TFLOP/s
fp32 peak. Batches of 8 to 64 samples through layers no wider than 1,024 make GEMMs of a
few MFLOP that fill a handful of SMs for a few microseconds each, so small-batch DLRM
training runs at a few percent of peak; 1 TFLOP/s is the order of magnitude, not a
measurement. Hence ``gpu_flops_per_cycle = 1e12 / 250e6 = 4,000``. A fixed per-batch
launch overhead is added in :meth:`sim.dlrm.DLRM.gpu_cycles`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .embedding import BF16, FP32, power_law_rows
from .platform import DEFAULT_PLATFORM, get_platform

__all__ = [
    "DEVICE_CLOCK_HZ",
    "GPU_FLOPS",
    "GPU_FLOPS_PER_CYCLE",
    "KAGGLE_CARDINALITIES",
    "MLPERF_DLRMV2_CARDINALITIES",
    "MLPERF_DLRMV2_MULTI_HOT",
    "POOLING_KINDS",
    "PRESETS",
    "ROW_CAP",
    "ClickBatch",
    "SyntheticClicks",
    "Workload",
    "get_workload",
    "parse_override",
]

#: The platform the training flow runs on (``sim/platform.py``, ``docs/platform.md``).
_PLATFORM = get_platform(DEFAULT_PLATFORM)
#: Device clock the cycle counts refer to.
DEVICE_CLOCK_HZ = _PLATFORM.device_clock_hz
#: Effective GPU fp32 throughput on small-batch DLRM MLPs (see the module docstring).
GPU_FLOPS = _PLATFORM.gpu_flops
GPU_FLOPS_PER_CYCLE = _PLATFORM.gpu_flops_per_cycle

#: How the number of indices of a bag is drawn (see :class:`Workload`).
POOLING_KINDS = ("fixed", "poisson", "multi-hot")

#: Largest table of the Criteo-shaped presets: 4,096 rows of ``dim`` 16 fp32 are 256 KiB
#: per table, 6.5 MiB for 26 tables, small enough to lay out and initialise quickly in a
#: simulated PMEM while Zipf-skewed draws still repeat rows as real tables do.
ROW_CAP = 4096

#: Criteo Kaggle Display Advertising: distinct values of the 26 categorical features
#: (the table sizes of the reference DLRM's Kaggle run, facebookresearch/dlrm).
KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)

#: MLPerf Training DLRM-DCNv2 (Criteo 1TB, synthetic multi-hot): table sizes and the
#: per-table multi-hot sizes, both as passed to ``materialize_synthetic_multihot_dataset.py``
#: (``--num_embeddings_per_feature``, ``--multi_hot_sizes``) in the MLPerf reference
#: (mlcommons/training, recommendation_v2/torchrec_dlrm) and TorchRec's DLRM example.
MLPERF_DLRMV2_CARDINALITIES = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36)
MLPERF_DLRMV2_MULTI_HOT = (
    3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)


def _capped(cardinalities: tuple[int, ...], cap: int = ROW_CAP) -> tuple[int, ...]:
    return tuple(min(c, cap) for c in cardinalities)


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One DLRM training run's shape (all fields keyword-only, validated on creation).

    Bags
    ----
    ``pooling`` names how many indices each bag (one sample's lookup in one table) has,
    always at least 1 and at most ``pooling_max``:

    * ``"fixed"``: every bag has ``round(pooling_mean)`` indices (``1`` is one-hot, as
      in Criteo Kaggle);
    * ``"poisson"``: ``1 + Poisson(pooling_mean - 1)``, clipped to ``pooling_max``
      (mean ``pooling_mean`` unless the clip bites);
    * ``"multi-hot"``: every bag of table ``t`` has ``multi_hot_sizes[t]`` indices, as in
      MLPerf DLRMv2's synthetic multi-hot Criteo (``pooling_mean`` is not used).

    Rows are drawn with :func:`sim.embedding.power_law_rows` of exponent ``zipf_alpha``.

    Model
    -----
    ``bottom_mlp`` are the bottom MLP's layer sizes (the last is ``dim``, since its output
    meets the pooled vectors in the dot interaction); ``top_mlp`` the top MLP's hidden
    sizes, followed by an implied 1-unit output layer. ``lr`` is plain SGD's learning rate
    for the MLPs and the tables alike; ``mlp_ckpt_every`` is ``K``, the batches between
    MLP checkpoints. ``gpu_flops_per_cycle`` is the GPU's throughput per device clock
    (module docstring).

    Raises
    ------
    ValueError
        Any field out of range; the message names it and its value.
    """

    name: str
    table_rows: tuple[int, ...]
    dim: int
    dense_features: int
    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    batch: int
    batches: int
    pooling: str
    pooling_mean: float
    pooling_max: int
    multi_hot_sizes: tuple[int, ...] = ()
    zipf_alpha: float = 1.05
    lr: float = 0.1
    mlp_ckpt_every: int = 4
    gpu_flops_per_cycle: float = GPU_FLOPS_PER_CYCLE
    bf16: bool = False

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")

        if not self.table_rows or min(self.table_rows) < 1:
            raise ValueError(f"table_rows must be one or more positive sizes, "
                             f"not {self.table_rows}")
        for name in ("dim", "dense_features", "batch", "batches", "pooling_max",
                     "zipf_alpha", "lr", "mlp_ckpt_every", "gpu_flops_per_cycle"):
            positive(name)
        if not self.bottom_mlp or self.bottom_mlp[-1] != self.dim:
            raise ValueError(f"bottom_mlp must end with dim {self.dim}, not {self.bottom_mlp}")
        if min(self.bottom_mlp + self.top_mlp) < 1:
            raise ValueError(f"MLP layer sizes must be positive, not {self.bottom_mlp} / "
                             f"{self.top_mlp}")
        if self.pooling not in POOLING_KINDS:
            raise ValueError(f"pooling must be one of {', '.join(POOLING_KINDS)}, "
                             f"not {self.pooling!r}")
        if self.pooling == "multi-hot":
            if (len(self.multi_hot_sizes) != len(self.table_rows)
                    or not all(1 <= n <= self.pooling_max for n in self.multi_hot_sizes)):
                raise ValueError(f"multi_hot_sizes must give each of the "
                                 f"{len(self.table_rows)} tables a size in 1..pooling_max "
                                 f"({self.pooling_max}), not {self.multi_hot_sizes}")
        elif not 1 <= self.pooling_mean <= self.pooling_max:
            raise ValueError(f"pooling_mean must be in 1..pooling_max ({self.pooling_max}), "
                             f"not {self.pooling_mean}")

    @property
    def num_tables(self) -> int:
        return len(self.table_rows)

    @property
    def dtype(self) -> np.dtype:
        """The tables' element type: :data:`sim.embedding.BF16` or ``FP32``."""
        return BF16 if self.bf16 else FP32

    def with_overrides(self, **changes) -> Workload:
        """A copy with ``changes`` applied (``dataclasses.replace``; validated again).
        Lists become tuples, so overrides that went through JSON apply unchanged."""
        return replace(self, **{k: tuple(v) if isinstance(v, list) else v
                                for k, v in changes.items()})


def parse_override(text: str) -> tuple[str, object]:
    """``"field=value"`` as ``(field, value)`` for :meth:`Workload.with_overrides`. The
    value is a Python literal: ``lr=0.2``, ``table_rows=(65536, 65536, 65536, 65536)``
    (an expression such as ``(65536,) * 4`` is not one). ValueError names what is
    wrong."""
    import ast
    from dataclasses import fields

    key, eq, value = text.partition("=")
    names = [f.name for f in fields(Workload) if f.name != "name"]
    if not eq or key not in names:
        raise ValueError(f"{text!r} is not <field>=<value> with a field of {', '.join(names)}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise ValueError(f"{key}: {value!r} is not a Python literal") from None


PRESETS: dict[str, Workload] = {w.name: w for w in (
    # CI on slow RTL simulators (Icarus): a few hundred lookups in all.
    Workload(name="tiny", table_rows=(64, 61), dim=16, dense_features=4,
             bottom_mlp=(16, 16), top_mlp=(16,), batch=8, batches=6,
             pooling="poisson", pooling_mean=3, pooling_max=8, mlp_ckpt_every=2),
    # What ``make sim`` runs: about 5,000 indices per table over the run, sized (not yet
    # measured) to simulate in under 5 minutes.
    Workload(name="default", table_rows=(2048, 1999, 2500, 1500), dim=16, dense_features=13,
             bottom_mlp=(64, 32, 16), top_mlp=(64, 32), batch=32, batches=20,
             pooling="poisson", pooling_mean=8, pooling_max=32),
    # Criteo Kaggle with the reference DLRM's Kaggle architecture
    # (--arch-sparse-feature-size=16 --arch-mlp-bot=13-512-256-64-16 --arch-mlp-top=512-256-1),
    # one-hot by default; pooling_max leaves room for multi-hot overrides.
    Workload(name="kaggle-like", table_rows=_capped(KAGGLE_CARDINALITIES), dim=16,
             dense_features=13, bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256), batch=64,
             batches=8, pooling="fixed", pooling_mean=1, pooling_max=64),
    # MLPerf DLRMv2 table sizes and multi-hot sizes; its MLPs (bottom 512-256-128, top
    # 1024-1024-512-256-1) with dim 16 instead of 128: the engine's cost per row scales
    # with lines per row, 16 fp32 are one line, and what this preset stresses is the
    # pooling factor (214 indices per sample), not row width. DLRMv2's DCN interaction is
    # replaced by the dot interaction of sim.dlrm.
    Workload(name="multi-hot", table_rows=_capped(MLPERF_DLRMV2_CARDINALITIES), dim=16,
             dense_features=13, bottom_mlp=(512, 256, 16), top_mlp=(1024, 1024, 512, 256),
             batch=32, batches=4, pooling="multi-hot", pooling_mean=1, pooling_max=100,
             multi_hot_sizes=MLPERF_DLRMV2_MULTI_HOT),
)}


def get_workload(name: str) -> Workload:
    """The preset called ``name``; ValueError listing the presets for an unknown one."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; presets: {', '.join(PRESETS)}") from None


@dataclass(frozen=True)
class ClickBatch:
    """One training batch: ``dense`` float32 ``[B, dense_features]``; ``sparse`` one
    ``(indices, offsets)`` pair of int32 arrays per table in PyTorch ``EmbeddingBag``
    form (``B`` offsets, the first 0, non-decreasing, no trailing offset); ``labels``
    float32 ``[B]`` of 0 / 1."""

    dense: np.ndarray
    sparse: tuple[tuple[np.ndarray, np.ndarray], ...]
    labels: np.ndarray


class SyntheticClicks:
    """A deterministic synthetic click log for ``workload``, random-access by batch.

    The teacher, drawn once from ``seed`` (generator ``(seed, 0)``): a unit vector ``v``
    over the dense features and a scalar ``h_t[r] ~ N(0, 1)`` per row of every table. A
    sample's score is ``BIAS + DENSE_GAIN * (dense . v) + SPARSE_GAIN * sum_t
    mean(h_t[bag_t]) / sqrt(T)`` and its label is ``Bernoulli(sigmoid(score))``; dense
    features are ``N(0, 1)``, so ``dense . v`` is ``N(0, 1)``. ``BIAS`` gives about a third
    of the samples a click (Criteo Kaggle has a quarter): learning it is the first, quick
    fall of the loss. The gains make labels mostly predictable (the best achievable loss
    is about 0.27), so that the dense part, which the MLPs learn alone, keeps the loss
    falling over tens of batches; the sparse part rewards learning the rows.

    ``batch(i)`` draws from a generator seeded by ``(seed, 1, i)`` only, so the same seed
    and ``i`` give the same batch in any order, as a replay after a crash needs.

    Note that :func:`sim.embedding.power_law_rows` draws its rank-to-row scatter on every
    call, so the hottest rows differ between tables and batches; within a bag and batch,
    rows repeat with the Zipf skew of ``workload.zipf_alpha``.
    """

    BIAS = -1.5
    DENSE_GAIN = 4.0
    SPARSE_GAIN = 2.0

    def __init__(self, workload: Workload, seed: int) -> None:
        self._w = workload
        self._seed = seed
        rng = np.random.default_rng((seed, 0))
        v = rng.standard_normal(workload.dense_features)
        self._v = v / np.linalg.norm(v)
        self._h = tuple(rng.standard_normal(rows) for rows in workload.table_rows)

    @property
    def workload(self) -> Workload:
        return self._w

    @property
    def teacher_dense(self) -> np.ndarray:
        """The teacher's unit vector ``v`` over the dense features."""
        return self._v

    @property
    def teacher_rows(self) -> tuple[np.ndarray, ...]:
        """The teacher's hidden scalar ``h_t[r]`` of every row, one array per table."""
        return self._h

    def _bag_sizes(self, rng: np.random.Generator, table: int, n: int) -> np.ndarray:
        w = self._w
        if w.pooling == "multi-hot":
            return np.full(n, w.multi_hot_sizes[table], np.int64)
        if w.pooling == "fixed":
            return np.full(n, round(w.pooling_mean), np.int64)
        return np.minimum(1 + rng.poisson(w.pooling_mean - 1, n), w.pooling_max)

    def batch(self, i: int) -> ClickBatch:
        """Batch ``i`` (``i >= 0``) of the log."""
        if i < 0:
            raise ValueError(f"batch index must be non-negative, not {i}")
        return self._draw(np.random.default_rng((self._seed, 1, i)), self._w.batch)

    def held_out(self, samples: int) -> ClickBatch:
        """``samples`` samples drawn like the training batches, with the same teacher,
        from a generator of their own (``(seed, 2)``), so no training batch contains
        them: the set the held-out loss of a run is measured on."""
        if samples < 1:
            raise ValueError(f"samples must be positive, not {samples}")
        return self._draw(np.random.default_rng((self._seed, 2)), samples)

    def _draw(self, rng: np.random.Generator, samples: int) -> ClickBatch:
        w, n = self._w, samples
        dense = rng.standard_normal((n, w.dense_features))
        score = self.BIAS + self.DENSE_GAIN * (dense @ self._v)
        sparse = []
        for t, rows in enumerate(w.table_rows):
            sizes = self._bag_sizes(rng, t, n)
            indices = power_law_rows(rng, int(sizes.sum()), rows, w.zipf_alpha)
            offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            bag_of = np.repeat(np.arange(n), sizes)
            bag_mean = np.bincount(bag_of, self._h[t][indices], n) / sizes
            score += self.SPARSE_GAIN * bag_mean / np.sqrt(w.num_tables)
            sparse.append((indices.astype(np.int32), offsets.astype(np.int32)))
        labels = rng.random(n) < 1 / (1 + np.exp(-score))
        return ClickBatch(dense.astype(np.float32), tuple(sparse), labels.astype(np.float32))
