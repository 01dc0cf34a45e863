"""The GPU side of training: a numpy DLRM and the reference training loop.

:class:`DLRM` is the model of the reference DLRM (facebookresearch/dlrm,
``dlrm_s_pytorch.py``) with the dot interaction, in plain numpy:

* bottom MLP over the dense features, ReLU after every layer, output size ``dim``;
* dot interaction: the ``T + 1`` vectors ``[bottom output, pooled table 0 .. T-1]``,
  their pairwise dot products ``z[i, j]`` for ``i > j`` in the order ``(1, 0), (2, 0),
  (2, 1), (3, 0), ...`` (the reference's ``interact_features`` with ``arch_interaction_op
  = "dot"`` and ``interact_itself = False``), appended to the bottom output;
* top MLP: ReLU hidden layers, then one linear output unit, the logit;
* loss: binary cross-entropy of ``sigmoid(logit)``, mean over the batch, evaluated from
  the logit as ``max(l, 0) - l*y + log1p(exp(-|l|))`` so that no logit overflows it.

Everything is float32 (numpy's float32 operations; BLAS may order its sums in any way, so
the MLPs are deterministic for one machine and numpy build, not bit-exact across them).
The embedding side is bit-exact by construction: :func:`train_reference` pools and updates
the tables with :mod:`sim.embedding`, the device's golden model, with gradients formed as
in :meth:`DLRM.embedding_grads`. Forward and backward follow the dtype of the parameters,
so a float64 copy of a model checks the gradients.

Initialisation follows the reference: weights ``N(0, sqrt(2 / (in + out)))``, biases
``N(0, sqrt(1 / out))``, tables ``U(-1/sqrt(rows), 1/sqrt(rows))``.

Seeds: the model, the tables and :class:`sim.workloads.SyntheticClicks` each derive their
own generator from the one run seed (``(seed, 2)``, ``(seed, 3)`` and ``(seed, 0 | 1)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import embedding
from .embedding import LINE_BYTES
from .platform import DEFAULT_PLATFORM, get_platform
from .workloads import SyntheticClicks, Workload

__all__ = ["DLRM", "GPU_LAUNCH_CYCLES", "TrainResult", "evaluate", "init_tables",
           "train_reference", "train_step"]

#: Fixed GPU cost per training batch in device cycles: the platform's ``gpu_launch_ns``
#: (10 us, 2,500 cycles at 250 MHz), the order of the launch and synchronisation latency
#: of one DLRM step captured as a CUDA graph (about 20 kernels at a few hundred ns each,
#: plus the host round trip that waits for it).
GPU_LAUNCH_CYCLES = get_platform(DEFAULT_PLATFORM).gpu_launch_cycles


@dataclass(frozen=True)
class _Cache:
    """What :meth:`DLRM.backward` needs from a forward pass."""
    bottom_in: list[np.ndarray]      # input of each bottom layer
    bottom_out: list[np.ndarray]     # ReLU output of each bottom layer
    stack: np.ndarray                # [B, T+1, dim]: bottom output and pooled vectors
    top_in: list[np.ndarray]         # input of each top layer (the last is the output)
    logits: np.ndarray               # [B]
    labels: np.ndarray               # [B]


class DLRM:
    """A DLRM's MLPs and dot interaction, trained with plain SGD.

    Parameters
    ----------
    workload:
        The shape (dense features, tables, ``dim``, MLP sizes) and ``lr``.
    seed:
        Initialises the parameters (generator ``(seed, 2)``).

    Members
    -------
    params:
        The parameters in their fixed order: per layer, bottom MLP first then top MLP
        (its output layer last), the weight ``[out, in]`` (``torch.nn.Linear``'s layout)
        then the bias ``[out]``; float32. A model whose ``params`` are replaced by float64
        copies computes in float64.
    grads:
        The gradients of the last :meth:`backward`, in the order of ``params``.
    """

    def __init__(self, workload: Workload, seed: int) -> None:
        self._w = workload
        t = workload.num_tables
        top_in = workload.dim + (t + 1) * t // 2
        self._bottom = tuple(zip((workload.dense_features, *workload.bottom_mlp[:-1]),
                                 workload.bottom_mlp, strict=True))
        self._top = tuple(zip((top_in, *workload.top_mlp), (*workload.top_mlp, 1),
                              strict=True))
        self._li, self._lj = np.tril_indices(t + 1, -1)
        rng = np.random.default_rng((seed, 2))
        self.params: list[np.ndarray] = []
        for n_in, n_out in self._bottom + self._top:
            self.params.append(rng.normal(0, math.sqrt(2 / (n_in + n_out)), (n_out, n_in))
                               .astype(np.float32))
            self.params.append(rng.normal(0, math.sqrt(1 / n_out), n_out).astype(np.float32))
        self.grads: list[np.ndarray] = [np.zeros_like(p) for p in self.params]

    @property
    def workload(self) -> Workload:
        return self._w

    @property
    def param_count(self) -> int:
        """Number of parameters (float32 values in :meth:`params_bytes`)."""
        return sum(p.size for p in self.params)

    # --- Training step -----------------------------------------------------------------

    def forward(self, dense: np.ndarray, pooled: Sequence[np.ndarray],
                labels: np.ndarray) -> tuple[float, _Cache]:
        """The mean BCE loss of a batch and the cache :meth:`backward` takes.

        ``dense`` is ``[B, dense_features]``, ``pooled`` one ``[B, dim]`` array per table
        (fp32 or bf16, converted to the parameters' dtype) and ``labels`` ``[B]`` of 0 / 1.
        """
        w = self._w
        dt = self.params[0].dtype
        x = np.asarray(dense, dt)
        if x.ndim != 2 or x.shape[1] != w.dense_features:
            raise ValueError(f"dense must be [B, {w.dense_features}], not {x.shape}")
        b = x.shape[0]
        if len(pooled) != w.num_tables or any(p.shape != (b, w.dim) for p in pooled):
            raise ValueError(f"pooled must be {w.num_tables} arrays of shape {(b, w.dim)}, "
                             f"not {[p.shape for p in pooled]}")
        y = np.asarray(labels, dt)
        if y.shape != (b,):
            raise ValueError(f"labels must have shape {(b,)}, not {y.shape}")

        nb = len(self._bottom)
        bottom_in, bottom_out = [], []
        for k in range(nb):
            bottom_in.append(x)
            x = np.maximum(x @ self.params[2 * k].T + self.params[2 * k + 1], 0)
            bottom_out.append(x)
        stack = np.stack([x, *(np.asarray(p, dt) for p in pooled)], axis=1)
        z = stack @ stack.transpose(0, 2, 1)
        h = np.concatenate([x, z[:, self._li, self._lj]], axis=1)
        top_in = []
        for k in range(nb, nb + len(self._top)):
            top_in.append(h)
            h = h @ self.params[2 * k].T + self.params[2 * k + 1]
            if k < nb + len(self._top) - 1:
                h = np.maximum(h, 0)
        logits = h[:, 0]
        loss = np.mean(np.maximum(logits, 0) - logits * y + np.log1p(np.exp(-np.abs(logits))))
        return float(loss), _Cache(bottom_in, bottom_out, stack, top_in, logits, y)

    def backward(self, cache: _Cache) -> list[np.ndarray]:
        """Store the parameter gradients in :attr:`grads`; return ``d loss / d pooled``,
        one ``[B, dim]`` array per table (the parameters' dtype)."""
        nb, nt = len(self._bottom), len(self._top)
        b = cache.logits.shape[0]
        e = np.exp(-np.abs(cache.logits))
        sigmoid = np.where(cache.logits >= 0, 1 / (1 + e), e / (1 + e))
        d = ((sigmoid - cache.labels) / b)[:, None]
        for k in reversed(range(nb, nb + nt)):
            a = cache.top_in[k - nb]
            self.grads[2 * k] = d.T @ a
            self.grads[2 * k + 1] = d.sum(axis=0)
            d = d @ self.params[2 * k]
            if k > nb:
                d = d * (a > 0)          # through the ReLU that produced ``a``
        dim = self._w.dim
        n = cache.stack.shape[1]
        dz = np.zeros((b, n, n), d.dtype)
        dz[:, self._li, self._lj] = d[:, dim:]
        d_stack = (dz + dz.transpose(0, 2, 1)) @ cache.stack
        d = d[:, :dim] + d_stack[:, 0]
        for k in reversed(range(nb)):
            d = d * (cache.bottom_out[k] > 0)
            self.grads[2 * k] = d.T @ cache.bottom_in[k]
            self.grads[2 * k + 1] = d.sum(axis=0)
            if k:
                d = d @ self.params[2 * k]
        return [d_stack[:, t + 1] for t in range(self._w.num_tables)]

    def sgd_step(self) -> None:
        """``p -= lr * grad`` for every parameter, in the parameters' dtype."""
        for p, g in zip(self.params, self.grads, strict=True):
            p -= p.dtype.type(self._w.lr) * g

    def embedding_grads(self, d_pooled: Sequence[np.ndarray], mode: str = "sum",
                        bag_sizes: Sequence[np.ndarray] = ()) -> list[np.ndarray]:
        """The per-bag gradients an UPDATE adds to every row of the bag, float32.

        SGD on a row is ``row -= lr * d loss / d row``; with sum pooling a row's gradient
        is the sum of ``d_pooled`` over its occurrences, which is what UPDATE's ``row +=
        g_bag`` per counted index accumulates, so ``g_bag = fl32(-lr * d_pooled[bag])``.
        Mean pooling divides by the bag size: ``g_bag = fl32(fl32(-lr * d_pooled[bag]) /
        n_bag)``; ``bag_sizes`` gives ``n_bag`` per table (required for ``"mean"`` only).
        A bag with no counted index updates no row, whatever its gradient.

        Raises
        ------
        ValueError
            A mode other than ``"sum"`` / ``"mean"``, or mean without one ``[B]`` array of
            bag sizes per table.
        """
        lr = np.float32(-self._w.lr)
        g = [lr * np.asarray(d, np.float32) for d in d_pooled]
        if mode == "sum":
            return g
        if mode != "mean":
            raise ValueError(f"mode must be sum or mean, not {mode!r}")
        if len(bag_sizes) != len(g) or any(np.shape(n) != (gt.shape[0],)
                                           for n, gt in zip(bag_sizes, g, strict=True)):
            raise ValueError(f"mean needs one array of {g[0].shape[0] if g else 0} bag sizes "
                             f"per table ({len(g)})")
        # max(n, 1): an empty bag's gradient stays fl32(-lr * d), which no row receives.
        return [gt / np.maximum(np.asarray(n), 1).astype(np.float32)[:, None]
                for gt, n in zip(g, bag_sizes, strict=True)]

    # --- Parameters as bytes (the MLP checkpoint payload) ------------------------------

    def params_bytes(self) -> bytes:
        """All parameters in :attr:`params` order, little-endian float32, zero-padded to a
        multiple of 64 bytes (whole PMEM lines)."""
        data = b"".join(p.astype("<f4").tobytes() for p in self.params)
        return data + bytes(-len(data) % LINE_BYTES)

    def load_params(self, data: bytes) -> None:
        """Set the parameters from :meth:`params_bytes`' image (exactly its length; the
        padding is ignored). Raises ValueError for any other length."""
        need = 4 * self.param_count
        if len(data) != need + (-need % LINE_BYTES):
            raise ValueError(f"parameter image must be {need + (-need % LINE_BYTES)} bytes, "
                             f"not {len(data)}")
        values = np.frombuffer(data, "<f4", self.param_count).astype(np.float32)
        start = 0
        for k, p in enumerate(self.params):
            self.params[k] = values[start:start + p.size].reshape(p.shape).copy()
            start += p.size

    # --- GPU time ----------------------------------------------------------------------

    def flops_per_batch(self, batch: int) -> int:
        """Forward plus backward FLOPs of the MLPs and the interaction for ``batch``
        samples: ``6 * batch * (sum_layers in*out + (T+1)**2 * dim)``.

        A layer's forward is a GEMM of ``2 * batch * in * out`` FLOPs and its backward two
        (input and weight gradients), twice that; the interaction is the batched GEMM
        ``S S^T`` of ``2 * batch * (T+1)**2 * dim`` FLOPs, its backward again twice that.
        Biases, ReLUs, the loss and SGD are linear in the layer widths and left out.
        """
        w = self._w
        macs = sum(i * o for i, o in self._bottom + self._top)
        macs += (w.num_tables + 1) ** 2 * w.dim
        return 6 * batch * macs

    def gpu_cycles(self, batch: int) -> int:
        """Device cycles the GPU spends on one training step of ``batch`` samples:
        ``ceil(flops / gpu_flops_per_cycle) + GPU_LAUNCH_CYCLES``."""
        return math.ceil(self.flops_per_batch(batch) / self._w.gpu_flops_per_cycle) \
            + GPU_LAUNCH_CYCLES


# --- Reference training run ------------------------------------------------------------

def init_tables(workload: Workload, seed: int) -> list[np.ndarray]:
    """The initial tables: ``U(-1/sqrt(rows), 1/sqrt(rows))`` drawn in float32 from the
    generator ``(seed, 3)``, then rounded to bf16 (RNE) for bf16 workloads."""
    rng = np.random.default_rng((seed, 3))
    tables = []
    for rows in workload.table_rows:
        bound = 1 / math.sqrt(rows)
        table = rng.uniform(-bound, bound, (rows, workload.dim)).astype(np.float32)
        tables.append(table.astype(workload.dtype))
    return tables


@dataclass(frozen=True)
class TrainResult:
    """A reference run: the loss of every batch (before its step), the final tables and
    the final MLP parameters as :meth:`DLRM.params_bytes`."""
    losses: tuple[float, ...]
    tables: tuple[np.ndarray, ...]
    params: bytes


def train_reference(workload: Workload, seed: int, batches: int | None = None,
                    tables: Sequence[np.ndarray] | None = None) -> TrainResult:
    """Train ``workload`` for ``batches`` (default ``workload.batches``) batches of
    :class:`SyntheticClicks` ``(workload, seed)``, starting from ``tables`` (default
    :func:`init_tables`); the golden run of the device's training flow.

    Per batch, per table: ``pooled = embedding.pool(table, indices, offsets, mode="sum")``;
    then forward, backward and SGD on the MLPs; then per table ``table = embedding.update(
    table, indices, offsets, grads)`` with :meth:`DLRM.embedding_grads` (sum).
    """
    n = workload.batches if batches is None else batches
    data = SyntheticClicks(workload, seed)
    model = DLRM(workload, seed)
    current = list(init_tables(workload, seed) if tables is None else tables)
    losses = []
    for i in range(n):
        loss, current = train_step(model, current, data.batch(i))
        losses.append(loss)
    return TrainResult(tuple(losses), tuple(current), model.params_bytes())


def train_step(model: DLRM, tables, batch, *, partials: int = 4) -> tuple[float, list]:
    """One training step of ``model`` and ``tables`` on ``batch`` (a
    :class:`~sim.workloads.ClickBatch`): sum pooling with ``partials`` partial sums,
    forward, backward, SGD, then the tables' update. Returns the loss and the new
    tables."""
    pooled = [embedding.pool(tab, idx, off, mode="sum", partials=partials)
              for tab, (idx, off) in zip(tables, batch.sparse, strict=True)]
    loss, cache = model.forward(batch.dense, pooled, batch.labels)
    d_pooled = model.backward(cache)
    model.sgd_step()
    grads = model.embedding_grads(d_pooled)
    return loss, [embedding.update(tab, idx, off, g)
                  for tab, (idx, off), g in zip(tables, batch.sparse, grads, strict=True)]


def evaluate(model: DLRM, tables, batch, *, partials: int = 4) -> float:
    """The mean BCE loss of ``model`` and ``tables`` on ``batch`` (a
    :class:`~sim.workloads.ClickBatch`, typically :meth:`SyntheticClicks.held_out`), with
    :func:`train_step`'s pooling and forward pass and no update."""
    pooled = [embedding.pool(tab, idx, off, mode="sum", partials=partials)
              for tab, (idx, off) in zip(tables, batch.sparse, strict=True)]
    return model.forward(batch.dense, pooled, batch.labels)[0]
