"""cocotb: train a DLRM through the whole device (``make sim``, ``sim/train.py``).

One test, ``train_dlrm``, in one of three modes (test parameter ``mode``):

* ``"trainingcxl"``: format, recovery (checkpointing on, ``CK_MLP_K`` = the workload's
  MLP checkpoint interval K); per batch ``b`` the GPU writes indices, offsets and a
  capturing LOOKUP per table over CXL.mem, rings, waits, reads the pooled vectors over
  CXL.mem (all lines in flight at once), runs the numpy DLRM and waits its modelled GPU
  time, writes per-bag gradients and an UPDATE per table, COMMIT, and every K batches
  stages its MLP parameters and queues MLP_CHECKPOINT. With ``crash_at`` (cycles into
  training) the power fails once; then reset, recovery, the MLP parameters of the slot
  recovery names are read back over CXL.mem, and training resumes after the last
  committed batch.
* ``"baseline"``: the same device with its engines idle and checkpointing off; the GPU
  reads every distinct row of a batch over CXL.mem (all in flight), pools and updates
  with the golden models (bit-identical to the engine's order), writes undo records in
  the contract's format and waits for them, writes the updated rows, the commit word,
  and every K batches copies its MLP parameters to a slot synchronously.
* ``"trainingcxl-sw-ckpt"`` (an ablation): TrainingCXL's LOOKUP and UPDATE descriptors
  with checkpointing off (no capture, no COMMIT, no MLP_CHECKPOINT) and the baseline's
  software checkpoint: before the UPDATEs the GPU reads the distinct rows' old images
  over CXL.mem and writes their undo records, then the commit word and every K batches
  the MLP copy, each waited for. No power failure.

Checks: every descriptor, pooled vector and table bit for bit (``EngineDriver``), every
CXL.mem response against the host's golden memory, recovery's invariants
(``docs/architecture.md``), and at the end the tables (bit for bit) and the losses against
:func:`sim.train.reference_train` started from the recovered state (tables after the
committed batch C, MLP parameters of the recovered batch M), batches C+1..N.

After every batch (and before the first) the trainer measures the held-out loss: the
GPU's MLP and the tables on :data:`HELDOUT_SAMPLES` samples no batch trains on.

Every count the report uses is measured per batch execution (:class:`Meter`) and written
as JSON to the ``out`` parameter; ``docs/training.md`` says how each is obtained.

Parameters: ``preset``, ``batches`` and ``overrides`` (``Workload.with_overrides``),
``seed`` (default: the regression seed), ``mode``, ``crash_at`` (cycles into training;
``"auto"``: drawn from the seed; None or negative: none), ``noise`` (random idle cycles
and backpressure on every channel and random PMEM timing, for tests; without it the
PMEM has the platform's timing), ``platform`` (a name in ``sim.platform.PLATFORMS``,
default ``DEFAULT_PLATFORM``: its PMEM timing and its link between the GPU and the
device, ``tb/link.py``), ``out``.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import cocotb
import numpy as np

from hw.engine.descriptor import DescKind, Status
from hw.engine.engine import PMEM_KIND_CSRS
from sim import ckpt
from sim import embedding as emb
from sim.dlrm import DLRM, evaluate, init_tables
from sim.embedding import LINE_BYTES
from sim.platform import DEFAULT_PLATFORM, get_platform
from sim.train import reference_train, tables_digest
from sim.workloads import SyntheticClicks, get_workload
from tb import env
from tb.ckpt_driver import CkptDriver
from tb.coherent_host import GpuHome, attach_gpu_memory
from tb.device_tb import DeviceTB
from tb.engine_driver import Batch, HostScratch
from tb.link import Link
from tb.pmem import PmemTiming

#: Cycles between polls while the host waits for the engine (of ENG_HEAD, or of the
#: completion records when they are in GPU memory).
POLL = 64
#: Bytes a 64-byte line costs on the link: the data and a 16-byte header slot for the
#: request and for the response (M2S Req + S2M DRS for a read, M2S RwD + S2M NDR for a
#: write; one 16-byte slot of a 68-byte flit each).
LINK_BYTES_PER_LINE = 64 + 2 * 16
#: Samples of the held-out set (``SyntheticClicks.held_out``) the loss after every batch
#: is measured on.
HELDOUT_SAMPLES = 512
#: The byte the engine driver poisons output buffers with (a test aid, not GPU traffic).
_POISON = 0xA5


class TrainDriver(CkptDriver):
    """A :class:`CkptDriver` whose writes are the GPU's CXL.mem writes (``via_cxl``).

    As a real driver does, it issues every write of buffers and descriptors at once and
    waits for all their completions (durability) only before the doorbell
    (:meth:`ring`), rather than one buffer at a time. The driver's poisoning of output
    buffers is a test aid and goes through the backdoor (it would otherwise count as link
    traffic no real GPU sends). With scratch buffers in GPU memory (``scratch``) the MLP
    parameters are staged there too and copied with ``COH_CTRL.MLP_SRC_HOST``, and the
    completion records go there too (``COH_CTRL.CQ_HOST``), where the driver polls and
    checks them (a GPU-memory read each, no CXL.io round trip); the caller may put the
    descriptor ring there as well (``ring_host``)."""

    def __init__(self, tb, **kw):
        super().__init__(tb, **kw)
        self.inflight: list = []
        if self.scratch is not None:
            # The GPU's parameters are copied from GPU memory (COH_CTRL.MLP_SRC_HOST):
            # two staging areas right above the scratch window, then the completion
            # records (COH_CTRL.CQ_HOST).
            self.mlp_src_host = True
            base = self.scratch.base + self.cfg.pmem_size
            stage = -(-self.mlp_bytes // LINE_BYTES) * LINE_BYTES
            self.staging = [base, base + stage]
            self.cq_host, self.cq_gpu = base + 2 * stage, self.scratch.gpu

    async def setup(self) -> None:
        await super().setup()
        if self.scratch is not None:
            csr = self.tb.csr
            ctrl = await csr.read("COH_CTRL")
            await csr.write("COH_CTRL", ctrl | self.tb.regs["COH_CTRL"].pack(
                mlp_src_host=1, cq_host=1))

    async def stage(self, src: int, params: bytes) -> None:
        """In GPU memory when the scratch buffers are (the GPU's own write, no link)."""
        if self.scratch is None:
            await super().stage(src, params)
            return
        self.scratch.gpu.write_bytes(src, params + bytes(-len(params) % LINE_BYTES))

    async def put(self, addr: int, data: bytes) -> None:
        if not self.via_cxl or data.count(_POISON) == len(data):
            self.via_cxl, via = False, self.via_cxl
            try:
                await super().put(addr, data)
            finally:
                self.via_cxl = via
            return
        assert addr % LINE_BYTES == 0, f"unaligned put at {addr:#x}"
        data = data + bytes(-len(data) % LINE_BYTES)
        agent = self.tb.agent
        self.inflight += [agent.write(agent.host_line(addr // LINE_BYTES + i),
                                      data[i * LINE_BYTES:(i + 1) * LINE_BYTES])
                          for i in range(len(data) // LINE_BYTES)]

    async def ring(self) -> None:
        """Wait until every write issued so far is durable, then ring the doorbell."""
        txns, self.inflight = self.inflight, []
        await self.tb.agent.wait_all(txns, timeout=1_000_000)
        await super().ring()


class Meter:
    """Cumulative counters of the run; :meth:`delta` gives one execution's counts.
    ``gpu``: the :class:`~tb.coherent_host.GpuHome` whose CXL.cache traffic counts as
    link traffic too (None: none)."""

    KEYS = ("cycles", "link_lines", "cache_link_bytes", "cache_lines", "csr_accesses",
            "pmem_read_lines", "pmem_write_lines", "pmem_media_reads", "pmem_media_writes")

    def __init__(self, tb: DeviceTB, gpu: GpuHome | None = None):
        self.tb = tb
        self.gpu = gpu
        self.csr = 0
        csr = tb.csr
        read_raw, write_raw = csr.read_raw, csr.write_raw

        async def counted_read(offset):
            self.csr += 1
            return await read_raw(offset)

        async def counted_write(offset, value):
            self.csr += 1
            return await write_raw(offset, value)

        csr.read_raw, csr.write_raw = counted_read, counted_write

    def snap(self) -> dict:
        a, p = self.tb.agent.stats, self.tb.pmem.stats
        gpu = self.gpu
        return {"cycles": self.tb.loop.cycle, "link_lines": a.lines_read + a.lines_written,
                "cache_link_bytes": gpu.link_bytes if gpu else 0,
                "cache_lines": gpu.data_lines if gpu else 0,
                "csr_accesses": self.csr, "pmem_read_lines": p.lines_read,
                "pmem_write_lines": p.lines_written, "pmem_media_reads": p.media_reads,
                "pmem_media_writes": p.media_writes}

    @staticmethod
    def delta(start: dict, end: dict) -> dict:
        d = {k: end[k] - start[k] for k in Meter.KEYS}
        d["link_payload_bytes"] = LINE_BYTES * (d["link_lines"] + d.pop("cache_lines"))
        # CSR accesses (doorbells, head polls) go over CXL.io, counted apart.
        d["link_bytes"] = LINK_BYTES_PER_LINE * d.pop("link_lines") + d.pop("cache_link_bytes")
        return d


class Trainer:
    """State of one training run (either mode) on one device."""

    def __init__(self, tb: DeviceTB, mode: str, *, gpu: GpuHome | None = None):
        p = tb.params
        self.tb = tb
        self.mode = mode
        self.cfg = tb.config
        w = get_workload(p.get("preset", "tiny"))
        w = w.with_overrides(**p.get("overrides", {}))
        if p.get("batches"):
            w = w.with_overrides(batches=int(p["batches"]))
        self.w = w
        # The data seed: the ``seed`` parameter, else the regression seed (SEED=).
        self.seed = int(p["seed"]) if p.get("seed") is not None else tb.seed
        self.n = w.batches
        self.k = w.mlp_ckpt_every
        clicks = SyntheticClicks(w, self.seed)
        self.data = [clicks.batch(i) for i in range(self.n)]
        self.model = DLRM(w, self.seed)
        self.params0 = self.model.params_bytes()
        self.params_hist: dict[int, bytes] = {0: self.params0}
        self.gpu_cycles = self.model.gpu_cycles(w.batch)
        self.lpr = emb.lines_per_row(w.dim, w.dtype)
        most = max(sum(len(idx) for idx, _ in b.sparse) for b in self.data)
        # The log holds the records of one uncommitted batch: at most one per index.
        self.log_slots = 1 << max(1, (most - 1).bit_length())
        order = max(4, (2 * w.num_tables + 1).bit_length())
        # Scratch buffers and the descriptor ring in GPU memory: a window right above the
        # HDM range.
        cfg = tb.config
        scratch = (HostScratch(gpu, base=cfg.hdm_base + cfg.hdm_size, size=cfg.pmem_size)
                   if gpu is not None else None)
        self.drv = TrainDriver(tb, log_slots=self.log_slots, mlp_bytes=len(self.params0),
                               ring_order=order, scratch=scratch,
                               ring_host=scratch is not None)
        self.meter = Meter(tb, gpu)
        self.tables = []
        self.golden: dict[int, list[np.ndarray]] = {}
        self.losses: dict[int, float] = {}
        # The held-out loss after each batch (0: before training), of the GPU's MLP and
        # the tables as the golden model has them (equal to the device's, checked at
        # the end): docs/training.md, "Held-out loss".
        self.heldout = clicks.held_out(HELDOUT_SAMPLES)
        self.heldout_losses: dict[int, float] = {}
        self.executions: list[dict] = []
        self.current: dict | None = None       # the execution in progress
        self.issued = self.completed = 0
        self.seq = 0                            # baseline: next undo record number
        self.commit_pending = None              # baseline: the last commit, running
        self.starts: dict[int, int] = {}        # batch -> cycle its latest execution began

    # --- set-up ---------------------------------------------------------------------------
    async def setup(self) -> None:
        drv, tb = self.drv, self.tb
        await drv.setup()
        if self.mode == "trainingcxl":
            drv.format()
        for data in init_tables(self.w, self.seed):
            self.tables.append(await drv.add_table(data))
        self.mark = drv.heap.next
        # The scratch window's buffers come after the ring (RING_HOST).
        self.scratch_mark = drv.scratch.heap.next if drv.scratch is not None else None
        self.golden[0] = [t.data for t in self.tables]
        self._evaluate(0)
        if self.mode == "trainingcxl":
            await tb.csr.write("CK_MLP_K", self.k)
            res = await drv.recover()
            assert res.status == 0 and res.committed == 0, res
        drv.via_cxl = True
        tb.log.info("%s: %d tables (%d rows), %d batches of %d, log %d slots, MLP %d bytes, "
                    "GPU %d cycles per batch, device memory used %#x", self.mode,
                    len(self.tables), sum(t.rows for t in self.tables), self.n, self.w.batch,
                    self.log_slots, len(self.params0), self.gpu_cycles, drv.heap.next)

    # --- accounting -------------------------------------------------------------------------
    def _begin(self, b: int) -> None:
        self.starts[b] = self.tb.loop.cycle
        self.current = {"batch": b, "start": self.meter.snap(),
                        "phases": {"lookup": 0, "gpu": 0, "update": 0, "checkpoint": 0},
                        "gpu_flops": 0, "hbm_bytes": 0, "device_fp_adds": 0,
                        "device_sram_lines": 0, "loss": float("nan")}

    def _phase(self, name: str, since: int) -> int:
        now = self.tb.loop.cycle
        self.current["phases"][name] += now - since
        return now

    def _end(self, *, lost: bool = False) -> dict:
        cur, self.current = self.current, None
        rec = {"batch": cur["batch"], "loss": cur["loss"], "phases": cur["phases"],
               **Meter.delta(cur["start"], self.meter.snap()),
               "gpu_flops": cur["gpu_flops"], "hbm_bytes": cur["hbm_bytes"],
               "device_fp_adds": cur["device_fp_adds"], "device_fp_muls": 0,
               "device_sram_lines": cur["device_sram_lines"]}
        rec["gpu_busy_cycles"] = cur["phases"]["gpu"]
        # Staging in GPU memory: every byte received is written once, every byte sent read.
        rec["hbm_bytes"] += rec["link_payload_bytes"]
        if lost:
            rec["lost"] = True
        self.executions.append(rec)
        return rec

    # --- the GPU step (both modes) ---------------------------------------------------------
    async def gpu_step(self, b: int, pooled: list[np.ndarray], extra_flops: int = 0):
        batch = self.data[b - 1]
        loss, cache = self.model.forward(batch.dense, pooled, batch.labels)
        d_pooled = self.model.backward(cache)
        self.model.sgd_step()
        grads = self.model.embedding_grads(d_pooled)
        self.params_hist[b] = self.model.params_bytes()
        flops = self.model.flops_per_batch(self.w.batch) + extra_flops
        cycles = self.gpu_cycles + math.ceil(extra_flops / self.w.gpu_flops_per_cycle)
        self.current["loss"] = loss
        self.current["gpu_flops"] += flops
        t = self.tb.loop.cycle
        await self.tb.loop.wait_cycles(cycles)
        self._phase("gpu", t)
        self.losses[b] = loss
        return grads

    # --- TrainingCXL ---------------------------------------------------------------------
    async def tcxl_train(self, first: int, last: int) -> None:
        """Batches ``first..last``. The first batch's LOOKUPs have a doorbell of their
        own; after that batch ``b``'s UPDATEs, COMMIT(``b``), every K batches its
        MLP_CHECKPOINT, and batch ``b + 1``'s LOOKUPs share one doorbell, which the
        device executes in ring order (docs/training.md, "One doorbell per batch")."""
        pooled, _ = await self._start_batch(first, self.data[first - 1], capture=True)
        for b in range(first, last + 1):
            pooled = await self._tcxl_step(b, pooled, last)

    async def _tcxl_step(self, b: int, pooled: list, last: int) -> list | None:
        """Batch ``b`` from its pooled vectors on: the GPU step, then one doorbell for its
        UPDATEs, COMMIT and MLP_CHECKPOINT and batch ``b + 1``'s LOOKUPs (``b < last``);
        ``b`` ends when its COMMIT (or checkpoint) has completed, ``b + 1`` begins there.
        Returns batch ``b + 1``'s pooled vectors (None after ``last``)."""
        drv = self.drv
        batch = self.data[b - 1]
        distinct = sum(len(np.unique(idx)) for idx, _ in batch.sparse)
        n_idx = sum(len(idx) for idx, _ in batch.sparse)
        # SRAM: each gathered line in and out of the reorder buffer, each update in and
        # out of the row cache, each undo line in and out of the FIFO.
        self.current["device_sram_lines"] += 2 * (2 * n_idx * self.lpr
                                                  + distinct * (1 + self.lpr))
        grads = await self.gpu_step(b, pooled)
        t = self.tb.loop.cycle
        self._release()             # every earlier descriptor has completed
        await self._engine_updates(b, batch, grads)
        self.golden[b] = [tab.data for tab in self.tables]
        await drv.plain(DescKind.COMMIT, batch_id=b)
        self.issued = b
        t = self._phase("update", t)
        if b % self.k == 0:
            exp = await drv.mlp_checkpoint(b, self.params_hist[b])
            assert exp.status is Status.OK, exp.status
            self.current["device_sram_lines"] += 2 * len(self.params0) // LINE_BYTES
            t = self._phase("checkpoint", t)
        upto = drv.tail
        nxt = await self._queue_lookups(b + 1, capture=True) if b < last else None
        await drv.ring()
        await drv.wait(poll=POLL, timeout=5_000_000, upto=upto)
        self._phase("update", t)
        self._finish(b)
        if nxt is None:
            return None
        self._begin(b + 1)
        return await self._lookup_done(b + 1, nxt, self.tb.loop.cycle)

    def _release(self) -> None:
        """Free the buffers of every descriptor so far (all completed)."""
        self.drv.heap.release(self.mark)
        if self.drv.scratch is not None:
            self.drv.scratch.heap.release(self.scratch_mark)

    async def _start_batch(self, b: int, batch, *, capture: bool) -> tuple[list, int]:
        """Batch ``b`` begins in an engine mode with a doorbell of its own for its LOOKUPs
        (``capture``: undo capture on): its execution record, the LOOKUPs, timed as the
        lookup phase. Returns the pooled vectors and the number of counted indices."""
        self._release()
        self._begin(b)
        t = self.tb.loop.cycle
        exps = await self._queue_lookups(b, capture=capture)
        await self.drv.ring()
        pooled = await self._lookup_done(b, exps, t)
        return pooled, sum(len(idx) for idx, _ in batch.sparse)

    async def _lookup_done(self, b: int, exps: list, t: int) -> list[np.ndarray]:
        """Wait for batch ``b``'s LOOKUPs (rung already), take their pooled vectors and
        count the lookup phase from cycle ``t``, and the engine's fp32 adds (one per
        element and counted index in LOOKUP and in UPDATE)."""
        await self.drv.wait(poll=POLL, timeout=5_000_000)
        pooled = await self._pooled(b, exps)
        self._phase("lookup", t)
        n_idx = sum(len(idx) for idx, _ in self.data[b - 1].sparse)
        self.current["device_fp_adds"] += 2 * n_idx * self.w.dim
        return pooled

    def _finish(self, b: int) -> None:
        """Batch ``b`` completed: its execution record, held-out loss and progress line."""
        self.completed = b
        rec = self._end()
        self._evaluate(b)
        self.tb.log.info("batch %d: loss %.4f, held-out %.4f, %d cycles %s", b, rec["loss"],
                         self.heldout_losses[b], rec["cycles"], rec["phases"])

    def _evaluate(self, b: int) -> None:
        self.heldout_losses[b] = evaluate(self.model, [t.data for t in self.tables],
                                          self.heldout, partials=self.cfg.reduce_partials)

    async def _engine_updates(self, b: int, batch, grads) -> None:
        """An UPDATE descriptor per table with the GPU's per-bag gradients (queued; the
        caller rings)."""
        for table, (idx, off), g in zip(self.tables, batch.sparse, grads, strict=True):
            exp = await self.drv.update(table, Batch(idx, off), g, batch_id=b)
            assert exp.status is Status.OK, exp.status

    async def _queue_lookups(self, b: int, *, capture: bool) -> list:
        """A LOOKUP per table of batch ``b`` (capturing undo records with ``capture``),
        queued; the caller rings."""
        return [await self.drv.lookup(table, Batch(idx, off), batch_id=b,
                                      capture_undo=capture)
                for table, (idx, off) in zip(self.tables, self.data[b - 1].sparse,
                                             strict=True)]

    async def _pooled(self, b: int, exps: list) -> list[np.ndarray]:
        """The pooled vectors of completed LOOKUPs ``exps``: from GPU memory where the
        device wrote them, else read over CXL.mem (all in flight); checked."""
        drv, agent = self.drv, self.tb.agent
        if drv.scratch is not None:
            images = [drv.out_image(e.out_addr, len(e.out_image)) for e in exps]
        else:
            txns = [[agent.read(agent.host_line(e.out_addr // LINE_BYTES + i))
                     for i in range(len(e.out_image) // LINE_BYTES)] for e in exps]
            await agent.wait_all([x for tx in txns for x in tx], timeout=1_000_000)
            images = [b"".join(x.read_data for x in tx) for tx in txns]
        pooled = []
        for e, image in zip(exps, images, strict=True):
            assert image == e.out_image, f"batch {b}: pooled vectors read back differ"
            pooled.append(emb.unpack_rows(image, self.w.batch, self.w.dim, self.w.dtype))
        return pooled

    async def crash_and_recover(self, at: int) -> dict:
        """Power failure now; reset, recovery, checks, MLP reload. Returns the crash
        figures for the report."""
        tb, drv = self.tb, self.drv
        in_batch = self.current["batch"] if self.current else None
        crash_cycle = tb.loop.cycle
        await tb.loop.wait_until(lambda: tb.csr.axil.idle(), timeout=1000, what="CSR idle")
        lost = self._end(lost=True) if self.current else None
        t0 = tb.loop.cycle
        m0 = self.meter.snap()
        await tb.reset_device(power_fail=True)
        drv.reset_state()
        drv.inflight = []                       # abandoned by the reset
        drv.via_cxl = False
        await drv.setup()
        await tb.csr.write("CK_MLP_K", self.k)
        res = await drv.recover(timeout=10_000_000)
        tb.log.info("recovery: %s", res)
        assert res.status == 0, f"recovery failed: {res}"
        c, m = res.committed, res.mlp_batch
        assert self.completed <= c <= self.issued, (
            f"committed batch {c} after recovery; COMMITs completed up to {self.completed}, "
            f"issued up to {self.issued}")
        assert c - m <= self.k, f"{res}: the MLP checkpoint lags by more than K={self.k}"
        for table, want in zip(self.tables, self.golden[c], strict=True):
            got = drv.image(table.base, table.nbytes)
            assert got == emb.pack_rows(want, base=table.image0), (
                f"table {table.table_id} after recovery differs from the golden model after "
                f"batch {c}")
            table.data = want
            drv.expect_written(table.base, got)     # the host's view of the restored rows
        # The MLP parameters of the slot recovery names, read back over CXL.mem.
        if res.mlp_slot == 3:
            assert m == 0, res
            params = self.params0
        else:
            drv.check_mlp(res.mlp_slot, m)
            sb = ckpt.read_superblock(tb.pmem)
            slot = ckpt.read_mlp_slot(tb.pmem, sb, res.mlp_slot)
            assert slot.valid and slot.batch_id == m, (slot, res)
            base, nbytes = drv.mlp[res.mlp_slot], len(self.params0)
            drv.expect_written(base, drv.image(base, nbytes))
            agent = tb.agent
            txns = [agent.read(agent.host_line(base // LINE_BYTES + i))
                    for i in range(nbytes // LINE_BYTES)]
            await agent.wait_all(txns, timeout=1_000_000)
            params = b"".join(x.read_data for x in txns)
            assert params == self.params_hist[m], f"MLP slot of batch {m} differs"
        self.model.load_params(params)
        self.issued = self.completed = c
        # A batch whose COMMIT made it before the power failure unseen by the host has
        # its (partial) execution counted as its execution.
        if lost is not None and lost["batch"] <= c:
            lost.pop("lost")
        drv.via_cxl = True
        rec_stats = Meter.delta(m0, self.meter.snap())
        crash = {"at": at, "cycle": crash_cycle, "in_batch": in_batch, "committed": c,
                 "epoch": res.epoch, "mlp_slot": res.mlp_slot, "mlp_batch": m,
                 "rolled_back": res.rolled_back, "device_recovery_cycles": res.cycles,
                 "recovery_cycles": tb.loop.cycle - t0, "recovery_traffic": rec_stats,
                 "lost_cycles": lost["cycles"] if lost and lost.get("lost") else 0}
        tb.log.info("crash at +%d (cycle %d) in batch %s: committed %d, MLP batch %d (slot "
                    "%d), %d records rolled back, recovery %d cycles", at, crash_cycle,
                    in_batch, c, m, res.mlp_slot, res.rolled_back, crash["recovery_cycles"])
        return crash

    # --- baseline ------------------------------------------------------------------------
    async def base_batch(self, b: int) -> None:
        tb, agent = self.tb, self.tb.agent
        batch = self.data[b - 1]
        self._begin(b)
        stride = self.lpr * LINE_BYTES
        t = tb.loop.cycle
        rows, old_images = await self._read_rows(batch)
        local = []
        for table, rs, image in zip(self.tables, rows, old_images, strict=True):
            # The GPU holds only the rows it read; the rest stays zero and unused.
            tab = np.zeros_like(table.data)
            tab[rs] = emb.unpack_rows(image, len(rs), self.w.dim, self.w.dtype)
            assert np.array_equal(tab[rs].view(np.uint8), table.data[rs].view(np.uint8))
            local.append(tab)
        pooled = [emb.pool(tab, idx, off, mode="sum", partials=self.cfg.reduce_partials)
                  for tab, (idx, off) in zip(local, batch.sparse, strict=True)]
        t = self._phase("lookup", t)
        n_idx = sum(len(idx) for idx, _ in batch.sparse)
        row_bytes = self.w.dim * self.w.dtype.itemsize
        # GPU pooling and update: one add per element and index each; HBM: each index's
        # row read to pool, read and written to update, the pooled vectors written.
        extra = 2 * n_idx * self.w.dim
        self.current["hbm_bytes"] += (3 * n_idx * row_bytes
                                      + self.w.batch * self.w.num_tables * row_bytes)
        grads = await self.gpu_step(b, pooled, extra_flops=extra)
        t = tb.loop.cycle
        new = [emb.update(tab, idx, off, g)
               for tab, (idx, off), g in zip(local, batch.sparse, grads, strict=True)]
        # The previous batch's commit is durable before this batch's undo records reuse
        # its log slots (it has had this batch's row reads and GPU step to complete).
        if self.commit_pending is not None:
            await self.commit_pending
            self.commit_pending = None
        await self._write_undo(b, rows, old_images)
        t = self._phase("checkpoint", t)
        writes = []
        for table, rs, image, tab in zip(self.tables, rows, old_images, new, strict=True):
            img = emb.pack_rows(tab[rs], base=image)
            for j, r in enumerate(rs):
                writes += self._write_lines(table.base + int(r) * stride,
                                            img[j * stride:(j + 1) * stride])
            data = table.data.copy()
            data[rs] = tab[rs]
            table.data = data
        await agent.wait_all(writes, timeout=1_000_000)
        t = self._phase("update", t)
        # The commit runs on while the next batch reads its rows (they need this batch's
        # row writes, which are durable), as TrainingCXL's next LOOKUPs share the
        # COMMIT's doorbell. The last batch waits for it.
        self.commit_pending = cocotb.start_soon(self._commit(b))
        if b == self.n:
            await self.commit_pending
            self.commit_pending = None
        self._phase("checkpoint", t)
        self.golden[b] = [tab.data for tab in self.tables]
        self._finish(b)

    # --- software checkpointing (baseline and the sw-ckpt ablation) ------------------------
    async def _read_rows(self, batch) -> tuple[list[np.ndarray], list[bytes]]:
        """Read every distinct row of ``batch`` over CXL.mem, all in flight; returns the
        rows per table and their images."""
        agent, lpr = self.tb.agent, self.lpr
        rows = [np.unique(idx) for idx, _ in batch.sparse]
        reads = [[agent.read(agent.host_line(table.base // LINE_BYTES + int(r) * lpr + k))
                  for r in rs for k in range(lpr)]
                 for table, rs in zip(self.tables, rows, strict=True)]
        await agent.wait_all([x for tx in reads for x in tx], timeout=1_000_000)
        return rows, [b"".join(x.read_data for x in tx) for tx in reads]

    async def _write_undo(self, b: int, rows, old_images) -> None:
        """Undo records (``sim.ckpt.encode_record``) of every row the batch updates,
        written over CXL.mem and waited for: durable before any update."""
        drv, stride = self.drv, self.lpr * LINE_BYTES
        writes = []
        for table, rs, image in zip(self.tables, rows, old_images, strict=True):
            for j, r in enumerate(rs):
                r = int(r)
                rec = ckpt.encode_record(0, b, self.seq, table.table_id, r,
                                         table.base + r * stride,
                                         image[j * stride:(j + 1) * stride])
                slot = self.seq % self.log_slots
                addr = drv.log_base + slot * drv.slot_lines * LINE_BYTES
                writes += self._write_lines(addr, rec)
                self.seq += 1
        self.current["hbm_bytes"] += sum(len(rs) for rs in rows) * LINE_BYTES
        await self.tb.agent.wait_all(writes, timeout=1_000_000)

    async def _commit(self, b: int) -> None:
        """The commit word of batch ``b`` (first word of line 1, ``docs/checkpoint.md``),
        and every K batches the MLP parameters copied to a slot; each waited for."""
        drv, agent = self.drv, self.tb.agent
        line1 = ckpt.commit_word(b, 0) + bytes(LINE_BYTES - ckpt.WORD_BYTES)
        await agent.wait_all(self._write_lines(ckpt.COMMIT_WORD_ADDR, line1))
        if b % self.k == 0:
            slot = (b // self.k) % 2
            payload, header = ckpt.encode_mlp_slot(b, self.params_hist[b])
            await agent.wait_all(self._write_lines(drv.mlp[slot], payload), timeout=1_000_000)
            await agent.wait_all(self._write_lines(drv.mlp[slot] + drv.mlp_bytes, header))

    # --- ablation: the engines with software checkpointing ------------------------------
    async def swckpt_batch(self, b: int) -> None:
        """TrainingCXL's engines (LOOKUP and UPDATE descriptors) with checkpointing off and
        the baseline's software checkpoint: the GPU reads the distinct rows' old images
        over CXL.mem and writes their undo records before the UPDATEs, then the commit
        word and every K batches the MLP copy, each waited for."""
        drv, tb = self.drv, self.tb
        batch = self.data[b - 1]
        pooled, n_idx = await self._start_batch(b, batch, capture=False)
        self.current["device_sram_lines"] += 2 * (2 * n_idx * self.lpr)
        grads = await self.gpu_step(b, pooled)
        t = tb.loop.cycle
        rows, old_images = await self._read_rows(batch)
        await self._write_undo(b, rows, old_images)
        t = self._phase("checkpoint", t)
        await self._engine_updates(b, batch, grads)
        await drv.ring()
        await drv.wait(poll=POLL, timeout=5_000_000)
        t = self._phase("update", t)
        await self._commit(b)
        self._phase("checkpoint", t)
        self.golden[b] = [tab.data for tab in self.tables]
        self._finish(b)

    def _write_lines(self, addr: int, data: bytes) -> list:
        agent = self.tb.agent
        return [agent.write(agent.host_line(addr // LINE_BYTES + i),
                            data[i * LINE_BYTES:(i + 1) * LINE_BYTES])
                for i in range(len(data) // LINE_BYTES)]

    # --- final checks --------------------------------------------------------------------
    def check_final(self, start: int, start_params: bytes) -> str:
        """Tables (PMEM, bit for bit) and losses of batches ``start+1..N`` against the
        reference run from the golden tables after ``start`` and ``start_params``."""
        ref = reference_train(self.w, self.seed, partials=self.cfg.reduce_partials,
                              first=start + 1, tables=self.golden[start], params=start_params)
        for table, want in zip(self.tables, ref.tables, strict=True):
            got = self.drv.image(table.base, table.nbytes)
            assert got == emb.pack_rows(want, base=table.image0), (
                f"table {table.table_id}: final image differs from the reference run")
        for b, loss in ref.losses.items():
            assert self.losses[b] == loss, (f"batch {b}: loss {self.losses[b]!r}, reference "
                                            f"{loss!r}")
        assert self.model.params_bytes() == ref.params, "final MLP parameters differ"
        return (f"tables bit-exact and losses of batches {start + 1}..{self.n} equal to the "
                f"reference run from batch {start}'s tables")


_FOREVER = 1 << 40


def _check_engine_counters(tr: Trainer, counters: dict, first: int) -> None:
    """The engine's counters since the last reset (batches ``first``..N ran after it)
    against the counts the workload gives, from which the energy model's device counts
    are computed: lines gathered and pooled vectors (one per bag) of the LOOKUPs, the
    UPDATEs' distinct rows and, where every UPDATE took one pass, the gradient items
    they applied (a counted row's table lines, twice that for bf16)."""
    items_per_row = tr.lpr * (2 if np.dtype(tr.w.dtype) == emb.BF16 else 1)
    want = {"ENG_LINES_GATHERED": 0, "ENG_BAGS_POOLED": 0, "ENG_UPD_DISTINCT_ROWS": 0,
            "ENG_UPD_ITEMS": 0}
    updates = 0
    for b in range(first, tr.n + 1):
        for idx, off in tr.data[b - 1].sparse:
            want["ENG_LINES_GATHERED"] += len(idx) * tr.lpr
            want["ENG_BAGS_POOLED"] += len(off)
            want["ENG_UPD_DISTINCT_ROWS"] += len(np.unique(idx))
            want["ENG_UPD_ITEMS"] += len(idx) * items_per_row
            updates += 1
    if counters["ENG_UPD_PASSES"] != updates:       # a pass re-feeds every item
        del want["ENG_UPD_ITEMS"]
    got = {name: counters[name] for name in want}
    assert got == want, (f"engine counters of batches {first}..{tr.n} {got}, the workload "
                         f"gives {want}")


async def _auto_crash_point(tr: Trainer, task, start: int) -> int:
    """The crash cycle (offset from ``start``) drawn from the data seed: a batch ``c`` in
    2..N-1 and a fraction ``f``; the power fails ``f`` times the previous batch's length
    into batch ``c`` (so it lands in or just after ``c`` whatever a batch costs)."""
    rng = random.Random(tr.seed)
    c = rng.randint(2, tr.n - 1) if tr.n >= 3 else 1
    f = rng.random()
    await tr.tb.loop.wait_until(lambda: task.done() or c in tr.starts, timeout=_FOREVER,
                                what=f"batch {c}")
    if task.done():
        return -1
    length = tr.starts[c] - tr.starts[c - 1] if c >= 2 else tr.gpu_cycles
    return tr.starts[c] + int(f * length) - start


@cocotb.test()
async def train_dlrm(dut):
    """Train the workload in the mode of the test parameters; crash once (TrainingCXL,
    ``crash_at``); check everything against the golden models; write the figures."""
    p = env.params()
    mode = p.get("mode", "trainingcxl")
    assert mode in ("trainingcxl", "baseline", "trainingcxl-sw-ckpt"), f"unknown mode {mode!r}"
    noise = bool(p.get("noise", False))
    platform = get_platform(p.get("platform", DEFAULT_PLATFORM))
    scratch = p.get("scratch", "gpu")
    assert scratch in ("gpu", "device"), f"unknown scratch placement {scratch!r}"
    tb = DeviceTB(dut, f"train_{mode}", idle=noise, backpressure=noise,
                  timing=None if noise else PmemTiming.from_platform(platform),
                  link=Link.from_platform(platform))
    gpu = (attach_gpu_memory(tb, platform, noise=noise)
           if mode != "baseline" and scratch == "gpu" else None)
    await tb.start()
    tr = Trainer(tb, mode, gpu=gpu)
    tb.log.info("preset %s, %d batches, data seed %d, mode %s", tr.w.name, tr.n, tr.seed, mode)
    await tr.setup()
    crash_at = p.get("crash_at")
    crash = None
    start_batch, start_params = 0, tr.params0
    start = tb.loop.cycle
    if mode in ("baseline", "trainingcxl-sw-ckpt"):
        if crash_at is not None and (crash_at == "auto" or crash_at >= 0):
            tb.log.warning("crash_at ignored: mode %s runs without a power failure", mode)
        step = tr.base_batch if mode == "baseline" else tr.swckpt_batch
        for b in range(1, tr.n + 1):
            await step(b)
    else:
        task = cocotb.start_soon(tr.tcxl_train(1, tr.n))
        wanted = crash_at
        if crash_at == "auto":
            crash_at = await _auto_crash_point(tr, task, start)
            # (-1: the training ended before the batch the crash was drawn in)
            assert crash_at >= 0, (
                f"crash_at=auto: the training of {tr.n} batches ended before the crash "
                f"point drawn from seed {tr.seed}: no power failure")
        if crash_at is not None and crash_at >= 0:
            end = start + int(crash_at)
            await tb.loop.wait_until(lambda: task.done() or tb.loop.cycle >= end,
                                     timeout=_FOREVER, what="crash point")
            if not task.done():
                task.cancel()
                crash = await tr.crash_and_recover(int(crash_at))
                start_batch = crash["committed"]
                start_params = tr.params_hist[crash["mlp_batch"]]
                await tr.tcxl_train(start_batch + 1, tr.n)
            else:
                # A run asked to fail the power must have failed it.
                raise AssertionError(
                    f"crash_at={wanted}: the training ended {tb.loop.cycle - start} "
                    f"cycles after its start, before the crash point +{crash_at}: no power "
                    f"failure (choose a crash point within the run)")
        if crash is None:
            await task
    total = tb.loop.cycle - start
    if mode == "trainingcxl" and tr.drv.mlp_req:
        await tr.drv.wait_mlp(tr.drv.mlp_req, timeout=5_000_000)     # the last copy, checked
    check = tr.check_final(start_batch, start_params)
    tb.log.info("%s: %s", mode, check)
    counters = {}
    # The device's link bytes and PMEM lines per kind in every mode (GPU-direct: the
    # device as memory only), the engine's and the logger's counters in TrainingCXL.
    names = ("LINK_TX_BYTES", "LINK_RX_BYTES", "ENG_PMEM_RD_LINES", "ENG_PMEM_WR_LINES",
             *PMEM_KIND_CSRS.values())
    if mode == "trainingcxl":
        names += ("ENG_LINES_GATHERED", "ENG_BAGS_POOLED", "ENG_UPD_LINES_WRITTEN",
                  "ENG_UPD_ITEMS", "ENG_BUSY", "ENG_UPD_OVERLAPS", "CK_RECORDS",
                  "CK_UNDO_STALL", "CK_MLP_LINES", "CK_MLP_STALL", "ENG_UPD_DISTINCT_ROWS",
                  "ENG_UPD_STORE_LINES", "ENG_UPD_PASSES")
    for name in names:
        counters[name] = await tb.csr.read64(name)
    if mode == "trainingcxl":
        _check_engine_counters(tr, counters, start_batch + 1)
    await tb.agent.wait_idle()
    if crash is None:
        # The bench's own count of the same messages since reset (next to LINK_*_BYTES).
        stats = tb.agent.stats
        counters["bench_link_tx_bytes"] = stats.s2m_bytes + (gpu.d2h_bytes if gpu else 0)
        counters["bench_link_rx_bytes"] = stats.m2s_bytes + (gpu.h2d_bytes if gpu else 0)
    tb.check_protocol()
    counted = [r for r in tr.executions if not r.get("lost")]
    assert sorted(r["batch"] for r in counted) == list(range(1, tr.n + 1)), (
        [r["batch"] for r in counted])
    result = {
        "mode": mode, "preset": tr.w.name, "batches_total": tr.n, "seed": tr.seed,
        "platform": platform.name,
        "cocotb_seed": tb.seed, "config": tb.config.name, "gpu_cycles_per_batch": tr.gpu_cycles,
        "mlp_bytes": len(tr.params0), "log_slots": tr.log_slots,
        "total_cycles": total, "batches": counted, "executions": tr.executions,
        "losses": {str(b): v for b, v in sorted(tr.losses.items())},
        "heldout_samples": HELDOUT_SAMPLES,
        "heldout_losses": {str(b): v for b, v in sorted(tr.heldout_losses.items())},
        "tables_digest": tables_digest([t.data for t in tr.tables]),
        "reference_check": check, "device_counters_after_last_reset": counters,
        "pmem": tb.pmem.stats.summary(), "descriptors_checked": tr.drv.checked,
        "responses_checked": tb.agent.checked,
    }
    if crash is not None:
        result["crash"] = crash
    if "out" in p:
        out = Path(p["out"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=float) + "\n")
