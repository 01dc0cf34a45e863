"""The host driver of the embedding engine, and the expectations it checks.

:class:`EngineDriver` lays out device memory, writes tables, buffers and descriptors
(through CXL.mem like a real driver, or through the PMEM model's backdoor to save
simulation time), rings the doorbell, waits for the completion head and checks each
descriptor against the golden models of :mod:`sim.embedding`, which are written from
``docs/embedding.md`` and not from the RTL:

* the completion record, field by field;
* a LOOKUP's pooled vectors, bit for bit, padding bytes included (zero);
* an UPDATE's table, bit for bit, padding included (unchanged); a failed descriptor
  leaves every table byte as it was;
* ``rows_written`` against a model of the documented direct-mapped row cache, and
  ``updates`` against the counted indices.

Every byte the engine writes is also set in the host agent's golden memory when its
descriptor completes, so host reads of pooled vectors and tables stay checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hw.cxl.messages import Codec
from hw.engine.completion import RECORD
from hw.engine.descriptor import DescKind, PoolMode, Status, pack_descriptor
from sim import embedding as emb
from sim.embedding import BF16, LINE_BYTES

__all__ = ["Batch", "DeviceHeap", "EngineDriver", "Expect", "HostScratch", "Table",
           "random_table"]

_RECORD = Codec(RECORD)


class DeviceHeap:
    """Bump allocator of 64-byte aligned regions of device memory ``[start, end)``."""

    def __init__(self, start: int, end: int):
        self.start = self.next = -(-start // LINE_BYTES) * LINE_BYTES
        self.end = end

    def release(self, mark: int) -> None:
        """Free everything allocated after ``mark`` (a former :attr:`next`)."""
        if not self.start <= mark <= self.next:
            raise ValueError(f"mark {mark:#x} outside {self.start:#x}..{self.next:#x}")
        self.next = mark

    def alloc(self, nbytes: int) -> int:
        addr = self.next
        size = max(LINE_BYTES, -(-nbytes // LINE_BYTES) * LINE_BYTES)
        if addr + size > self.end:
            raise MemoryError(f"device memory full: {nbytes} bytes asked at {addr:#x}, "
                              f"end {self.end:#x}")
        self.next = addr + size
        return addr


@dataclass
class Table:
    """An embedding table in device memory and its expected content."""
    base: int
    data: np.ndarray            # rows x dim, float32 or bfloat16: what PMEM must hold
    table_id: int
    image0: bytes = b""         # the first image, its padding random (must never change)

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def dim(self) -> int:
        return self.data.shape[1]

    @property
    def bf16(self) -> bool:
        return self.data.dtype == BF16

    @property
    def nbytes(self) -> int:
        return self.rows * emb.lines_per_row(self.dim, self.data.dtype) * LINE_BYTES


def random_table(rng: np.random.Generator, rows: int, dim: int, dtype, *,
                 specials: bool = False) -> np.ndarray:
    """Random finite values of mixed magnitudes (with ``specials``: also ±0, subnormals,
    ±inf and NaN sprinkled in)."""
    values = (rng.standard_normal((rows, dim)) * np.exp2(rng.integers(-8, 8, (rows, dim))))
    table = values.astype(np.float32)
    if specials:
        pick = rng.random((rows, dim))
        table[pick < 0.01] = np.float32(1e-40)          # subnormal
        table[(pick >= 0.01) & (pick < 0.02)] = -0.0
        table[(pick >= 0.02) & (pick < 0.022)] = np.inf
        table[(pick >= 0.022) & (pick < 0.023)] = np.nan
    return table.astype(dtype)


@dataclass
class Batch:
    """Bags in PyTorch EmbeddingBag form (int32 indices and offsets)."""
    indices: np.ndarray
    offsets: np.ndarray
    include_last_offset: bool = False
    weights: np.ndarray | None = None
    padding_idx: int | None = None

    @property
    def num_bags(self) -> int:
        return len(self.offsets) - int(self.include_last_offset)

    def counted_rows(self) -> list[int]:
        return [i for bag in emb.bags(self.indices, self.offsets, None, self.include_last_offset,
                                      self.padding_idx) for i in bag]


class HostScratch:
    """Scratch buffers in GPU memory (``COH_CTRL.SCRATCH_HOST``): a LOOKUP's / UPDATE's
    indices, offsets, weights, gradients and pooled output live in a window of GPU
    memory at byte address ``base``, and descriptors name them by their offset into it.

    ``gpu`` is the GPU's memory as :class:`tb.coherent_host.GpuHome` keeps it
    (``read_bytes`` / ``write_bytes``): the GPU writes its own buffers there directly,
    with no link traffic, and reads the pooled vectors back the same way. Offsets are
    allocated from ``heap`` (64 bytes up to ``size``; offset 0 stays unused)."""

    def __init__(self, gpu, *, base: int, size: int):
        assert base % LINE_BYTES == 0, f"unaligned scratch window {base:#x}"
        self.gpu = gpu
        self.base = base
        self.heap = DeviceHeap(LINE_BYTES, size)

    def put(self, addr: int, data: bytes) -> None:
        data = data + bytes(-len(data) % LINE_BYTES)
        self.gpu.write_bytes(self.base + addr, data)

    def image(self, addr: int, nbytes: int) -> bytes:
        return self.gpu.read_bytes(self.base + addr, nbytes)


@dataclass
class Expect:
    """What one submitted descriptor must do."""
    seq: int
    fields: dict
    status: Status
    kind: int
    table: Table | None = None
    out_addr: int | None = None
    out_image: bytes | None = None       # LOOKUP: the pooled vectors' exact bytes
    table_after: np.ndarray | None = None   # the model's table after this descriptor
    wrote_table: bool = False               # a successful UPDATE
    bags: int = 0
    rows_written: int = 0
    updates: int = 0
    notes: list = field(default_factory=list)


class EngineDriver:
    """Drives the engine of a :class:`~tb.device_tb.DeviceTB` (``tb``).

    Parameters
    ----------
    tb:
        The device test bench (CSRs, PMEM model, host agent).
    ring_order:
        The ring holds ``2**ring_order`` descriptors.
    via_cxl:
        Write descriptors, buffers and tables with CXL.mem writes (waiting for each
        write's completion before the doorbell, as the driver contract says) instead of
        the PMEM backdoor.
    heap_start:
        First device byte the driver may use (the rest of the HDM window above it).
    scratch:
        A :class:`HostScratch`: LOOKUP / UPDATE buffers go into GPU memory and
        :meth:`setup` turns ``COH_CTRL.SCRATCH_HOST`` on; None: they go into device
        memory like everything else.
    cq_host, cq_gpu:
        The completion records are in GPU memory (``COH_CTRL.CQ_HOST``, which the caller
        turns on) at byte address ``cq_host`` of ``cq_gpu`` (a
        :class:`tb.coherent_host.GpuHome`): :meth:`setup` writes
        ``COH_CQ_HOST_BASE``, the checks read the records there, and :meth:`wait`
        learns of completions by reading them, as a GPU polls its own memory (each read
        takes the GPU home's read latency), instead of polling ``ENG_HEAD``. A record
        there is a completion: the device writes it once the descriptor's writes are
        durable. Each descriptor's record slot is invalidated when it is queued.
    ring_host:
        The descriptor ring is in GPU memory too (``COH_CTRL.RING_HOST``, which
        :meth:`setup` turns on; needs ``scratch``): it is allocated in the scratch
        window, the GPU writes each descriptor there directly (no link traffic) and
        ``ENG_RING_BASE`` holds its offset in the window.
    """

    def __init__(self, tb, *, ring_order: int = 4, via_cxl: bool = False,
                 heap_start: int = 0, heap_end: int | None = None,
                 scratch: HostScratch | None = None, cq_host: int | None = None,
                 cq_gpu=None, ring_host: bool = False):
        assert (cq_host is None) == (cq_gpu is None), "cq_host needs cq_gpu"
        assert scratch is not None or not ring_host, "ring_host needs scratch"
        self.tb = tb
        self.scratch = scratch
        self.cq_host = cq_host
        self.cq_gpu = cq_gpu
        self.cfg = tb.config
        self.order = ring_order
        self.via_cxl = via_cxl
        end = heap_end if heap_end is not None else self.cfg.hdm_size
        self.heap = DeviceHeap(heap_start, end)
        self.ring_host = ring_host
        self.ring_addr = (scratch.heap if ring_host else self.heap).alloc(LINE_BYTES << ring_order)
        self.cq_addr = self.heap.alloc(LINE_BYTES << ring_order)
        self.tail = 0
        self.head = 0
        self.completed = 0          # descriptors waited for and checked
        self.flow_control = True
        # Checkpoint rules (docs/checkpoint.md), as the model executes in ring order.
        self.ck_on = False
        self.committed = 0
        self.cap_batch: int | None = None
        self.overflowed: set[int] = set()
        self.pending: list[Expect] = []
        self.checked = 0
        self._next_table_id = 1

    def reset_state(self) -> None:
        """Forget the engine's counters and the checkpoint rules, as a device reset does
        (tables, heap and ring addresses stay); call :meth:`setup` again afterwards."""
        self.tail = self.head = self.completed = 0
        self.pending.clear()
        self.ck_on = False
        self.committed = 0
        self.cap_batch = None
        self.overflowed.clear()

    # --- memory -------------------------------------------------------------------------
    async def setup(self) -> None:
        csr = self.tb.csr
        await csr.write("ENG_RING_BASE_LO", self.ring_addr & 0xFFFF_FFFF)
        await csr.write("ENG_RING_BASE_HI", self.ring_addr >> 32)
        await csr.write("ENG_CQ_BASE_LO", self.cq_addr & 0xFFFF_FFFF)
        await csr.write("ENG_CQ_BASE_HI", self.cq_addr >> 32)
        await csr.write("ENG_RING_ORDER", self.order)
        if self.scratch is not None:
            await csr.write64("COH_SCRATCH_HOST_BASE", self.scratch.base)
            ctrl = await csr.read("COH_CTRL")
            await csr.write("COH_CTRL", ctrl | self.tb.regs["COH_CTRL"].pack(
                scratch_host=1, ring_host=int(self.ring_host)))
        if self.cq_host is not None:
            await csr.write64("COH_CQ_HOST_BASE", self.cq_host)

    async def put(self, addr: int, data: bytes) -> None:
        """Make ``data`` (whole lines from a 64-byte aligned ``addr``) durable in device
        memory and known to the host agent's golden memory."""
        assert addr % LINE_BYTES == 0, f"unaligned put at {addr:#x}"
        data = data + bytes(-len(data) % LINE_BYTES)
        agent = self.tb.agent
        if self.via_cxl:
            txns = [agent.write(agent.host_line(addr // LINE_BYTES + i),
                                data[i * LINE_BYTES:(i + 1) * LINE_BYTES])
                    for i in range(len(data) // LINE_BYTES)]
            for t in txns:
                await t
        else:
            self.tb.pmem.write(addr, data)
            for i in range(len(data) // LINE_BYTES):
                agent.device_wrote(addr // LINE_BYTES + i,
                                   data[i * LINE_BYTES:(i + 1) * LINE_BYTES])

    def expect_written(self, addr: int, data: bytes) -> None:
        """The engine wrote ``data`` at ``addr``: the host's golden memory follows."""
        for i in range(len(data) // LINE_BYTES):
            self.tb.agent.device_wrote(addr // LINE_BYTES + i,
                                       data[i * LINE_BYTES:(i + 1) * LINE_BYTES])

    def image(self, addr: int, nbytes: int) -> bytes:
        return self.tb.pmem.read(addr, nbytes)

    async def add_table(self, data: np.ndarray, *, rng: np.random.Generator | None = None
                        ) -> Table:
        """Place a table (rows x dim, float32 or bfloat16) in device memory. With ``rng``
        the row padding holds random bytes, which the engine must neither pool (pooled
        padding is zero) nor change."""
        nbytes = data.shape[0] * emb.lines_per_row(data.shape[1], data.dtype) * LINE_BYTES
        noise = rng.bytes(nbytes) if rng is not None else None
        image = emb.pack_rows(data, base=noise)
        table = Table(self.heap.alloc(len(image)), data.copy(), self._next_table_id, image)
        self._next_table_id += 1
        await self.put(table.base, image)
        await self._table_written(table)
        return table

    async def _table_written(self, table: Table) -> None:
        """After a table's image is in place: a backdoor write is not seen by the
        engine's row store, which may hold lines of an earlier table at these addresses
        (the heap is reused), so one host CXL.mem read empties it (``docs/embedding.md``,
        "Row store"), as a write through the device would have."""
        if not self.via_cxl:
            agent = self.tb.agent
            await agent.read(agent.host_line(table.base // LINE_BYTES))

    async def buffer(self, raw: bytes) -> int:
        """A new buffer holding ``raw`` (a LOOKUP's / UPDATE's: in the scratch window of
        GPU memory when there is one)."""
        if self.scratch is not None:
            addr = self.scratch.heap.alloc(len(raw))
            self.scratch.put(addr, raw)
            return addr
        addr = self.heap.alloc(len(raw))
        if raw:
            await self.put(addr, raw)
        return addr

    def out_image(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` of a descriptor's output buffer at ``addr``."""
        if self.scratch is not None:
            return self.scratch.image(addr, nbytes)
        return self.image(addr, nbytes)

    # --- descriptors ----------------------------------------------------------------------
    async def lookup(self, table: Table, batch: Batch, *, mode: PoolMode = PoolMode.SUM,
                     batch_id: int = 0, capture_undo: bool = False, **override) -> Expect:
        """Lay out a LOOKUP's buffers and queue its descriptor (see :meth:`ring`).
        ``override`` replaces descriptor fields (for bad-input tests)."""
        kind = override.pop("kind", DescKind.LOOKUP)
        return await self._bags_descriptor(kind, table, batch, mode=mode,
                                           batch_id=batch_id, capture_undo=capture_undo,
                                           grads=None, **override)

    async def update(self, table: Table, batch: Batch, grads: np.ndarray, *,
                     mode: PoolMode = PoolMode.SUM, batch_id: int = 0, **override) -> Expect:
        """Lay out an UPDATE's buffers (``grads``: num_bags x dim fp32) and queue it."""
        kind = override.pop("kind", DescKind.UPDATE)
        return await self._bags_descriptor(kind, table, batch, mode=mode,
                                           batch_id=batch_id, capture_undo=False,
                                           grads=grads, **override)

    async def _bags_descriptor(self, kind: DescKind, table: Table, batch: Batch, *, mode,
                               batch_id, capture_undo, grads, **override) -> Expect:
        num_bags = batch.num_bags
        idx_addr = await self.buffer(batch.indices.astype("<i4").tobytes())
        off_addr = await self.buffer(batch.offsets.astype("<i4").tobytes())
        w_addr = (await self.buffer(np.asarray(batch.weights).astype("<f4").tobytes())
                  if batch.weights is not None else 0)
        if grads is None:           # laid out as a LOOKUP (whatever ``kind`` says)
            out_bytes = num_bags * emb.lines_per_row(table.dim, table.data.dtype) * LINE_BYTES
            # Poisoned, so that unwritten padding would show.
            data_addr = await self.buffer(bytes([0xA5]) * max(out_bytes, LINE_BYTES))
        else:
            # One fp32 vector per bag, each padded to whole lines.
            data_addr = await self.buffer(emb.pack_rows(np.asarray(grads, np.float32)))
        fields = dict(
            kind=kind, mode=mode, weighted=int(batch.weights is not None),
            has_padding_idx=int(batch.padding_idx is not None),
            include_last_offset=int(batch.include_last_offset),
            capture_undo=int(capture_undo), bf16=int(table.bf16), table_id=table.table_id,
            batch_id=batch_id, table_base=table.base, dim=table.dim, rows=table.rows,
            padding_idx=(batch.padding_idx or 0) & 0xFFFF_FFFF, num_bags=num_bags,
            num_indices=len(batch.indices), indices_addr=idx_addr, offsets_addr=off_addr,
            weights_addr=w_addr, data_addr=data_addr,
            cookie=(self.tail * 0x9E3779B97F4A7C15 + 1) & (2**64 - 1))
        fields.update(override)
        exp = self.expect(fields, batch=batch, table=table, grads=grads)
        await self.queue(fields, exp)
        return exp

    def expect(self, fields: dict, *, batch: Batch | None = None, table: Table | None = None,
               grads=None) -> Expect:
        """The expectation of descriptor ``fields`` from the golden models."""
        kind = int(getattr(fields.get("kind", 0), "value", fields.get("kind", 0)))
        norm = {k: int(getattr(v, "value", v)) for k, v in fields.items()}
        ck = self._checkpoint_status(kind, norm)
        if ck is not None:
            return Expect(seq=self.tail, fields=norm, status=ck, kind=kind & 0xFF, table=table,
                          table_after=table.data if table is not None else None)
        limits = {"pmem_size": self.cfg.pmem_size, "max_dim": self.cfg.engine_max_dim,
                  "update_acc": (self.cfg.update_acc_rows, self.cfg.update_acc_lines),
                  "max_passes": self.cfg.update_max_passes}
        if batch is not None:
            status = emb.validate(norm, indices=batch.indices, offsets=batch.offsets, **limits)
        else:
            status = emb.validate(norm, indices=[], offsets=[], **limits)
        exp = Expect(seq=self.tail, fields=norm, status=status, kind=kind & 0xFF, table=table,
                     table_after=table.data if table is not None else None)
        if status is not Status.OK or batch is None:
            return exp
        mode = PoolMode(norm["mode"])
        if kind == DescKind.LOOKUP.value:
            pooled = emb.pool(table.data, batch.indices, batch.offsets, mode=mode,
                              weights=batch.weights, padding_idx=batch.padding_idx,
                              include_last_offset=batch.include_last_offset,
                              partials=self.cfg.reduce_partials)
            exp.out_addr = norm["data_addr"]
            exp.out_image = emb.pack_rows(pooled)
            exp.bags = batch.num_bags
        elif kind == DescKind.UPDATE.value:
            # The model executes in ring order: later descriptors see the new rows.
            table.data = exp.table_after = emb.update(
                table.data, batch.indices, batch.offsets, np.asarray(grads, np.float32),
                weights=batch.weights, padding_idx=batch.padding_idx,
                include_last_offset=batch.include_last_offset)
            exp.wrote_table = True
            counted = batch.counted_rows()
            exp.updates = len(counted)
            exp.rows_written = len(set(counted))
        return exp

    def _checkpoint_status(self, kind: int, f: dict) -> Status | None:
        """The checkpoint rules' status (BAD_BATCH, LOG_FULL) when they decide, else None;
        updates the model's committed and captured batches as the device does."""
        if not self.ck_on:
            return None
        batch = f.get("batch_id", 0)
        if kind == DescKind.COMMIT.value:
            if batch <= self.committed:
                return Status.BAD_BATCH
            self.committed = batch
            return Status.OK
        if kind == DescKind.UPDATE.value:
            if batch <= self.committed or batch != self.cap_batch:
                return Status.BAD_BATCH
            if batch in self.overflowed:
                return Status.LOG_FULL
        if (kind == DescKind.LOOKUP.value and f.get("capture_undo")
                and f.get("dim", 0) <= self.cfg.engine_max_dim):
            self.cap_batch = batch
        return None

    async def plain(self, kind: int, **fields) -> Expect:
        """Queue a descriptor with no buffers (NOP, FENCE, COMMIT, a bad kind...)."""
        fields = dict(kind=kind, cookie=self.tail + 0x1234, **fields)
        exp = self.expect(fields)
        await self.queue(fields, exp)
        return exp

    async def queue(self, fields: dict, exp: Expect) -> None:
        """Write the descriptor into its ring slot (the doorbell comes with :meth:`ring`).
        With :attr:`flow_control` (default) a full ring is first run and drained, as a
        driver must; without it the ring can be overrun on purpose."""
        if self.flow_control and self.tail - self.completed >= 1 << self.order:
            await self.run()
        slot = self.tail % (1 << self.order)
        if self.cq_host is not None:
            # The GPU invalidates the slot's record (its own write, no link): an old
            # record there cannot be taken for this descriptor's.
            stale = _RECORD.pack(seq=~self.tail & 0xFFFF_FFFF)
            self.cq_gpu.write_bytes(self.cq_host + slot * LINE_BYTES,
                                    stale.to_bytes(LINE_BYTES, "little"))
        desc = pack_descriptor(**fields)
        if self.ring_host:
            self.scratch.put(self.ring_addr + slot * LINE_BYTES, desc)
        else:
            await self.put(self.ring_addr + slot * LINE_BYTES, desc)
        self.pending.append(exp)
        self.tail += 1

    async def ring(self) -> None:
        """Doorbell: every queued descriptor is durable, so publish the tail."""
        await self.tb.csr.write("ENG_TAIL", self.tail & 0xFFFF_FFFF)

    async def wait(self, *, timeout: int = 200_000, poll: int = 64,
                   upto: int | None = None) -> None:
        """Wait until the head reaches ``upto`` (a descriptor count; default the tail),
        then check every descriptor before it; those after it stay pending for a later
        wait. A table is compared after the last descriptor before ``upto`` that uses
        it, so no UPDATE of that table may come after ``upto`` (it may have run)."""
        loop = self.tb.loop
        start = loop.cycle
        target = self.tail if upto is None else upto
        assert self.completed <= target <= self.tail, (self.completed, target, self.tail)
        while True:
            self.head = await self._read_head()
            if (self.head - target) & 0xFFFF_FFFF < 1 << 31:        # head >= target
                break
            if loop.cycle - start > timeout:
                raise TimeoutError(f"engine head {self.head} did not reach {target} "
                                   f"within {timeout} cycles")
            await loop.wait_cycles(poll)
        done = [exp for exp in self.pending if exp.seq < target]
        for i, exp in enumerate(done):
            # A table is compared once per wait, after the last descriptor that uses it.
            last_use = exp.table is not None and all(
                later.table is not exp.table for later in done[i + 1:])
            self.check(exp, table=last_use)
        self.completed = target
        self.pending = self.pending[len(done):]

    async def _read_head(self) -> int:
        """The completion head as the driver learns it: ``ENG_HEAD`` over CXL.io, or
        with the records in GPU memory the number of descriptors up to the first whose
        record is not there yet, read in one GPU-memory access."""
        if self.cq_host is None:
            return await self.tb.csr.read("ENG_HEAD")
        head = self.completed
        while head != self.tail and self.record(head)["seq"] == head & 0xFFFF_FFFF:
            head += 1
        await self.tb.loop.wait_cycles(self.cq_gpu.home.timing.read_latency)
        return head

    async def run(self, *, timeout: int = 200_000) -> None:
        await self.ring()
        await self.wait(timeout=timeout)

    # --- checks ---------------------------------------------------------------------------
    def record(self, seq: int) -> dict:
        return _RECORD.unpack(int.from_bytes(self.record_line(seq % (1 << self.order)),
                                             "little"))

    def record_line(self, slot: int) -> bytes:
        """The completion record in slot ``slot`` as the driver reads it (device memory,
        or GPU memory with ``cq_host``)."""
        if self.cq_host is not None:
            return self.cq_gpu.read_bytes(self.cq_host + slot * LINE_BYTES, LINE_BYTES)
        return self.image(self.cq_addr + slot * LINE_BYTES, LINE_BYTES)

    def check(self, exp: Expect, *, table: bool = True) -> None:
        """Check one completed descriptor; with ``table``, also its table's whole image
        against the model's table after it."""
        rec = self.record(exp.seq)
        f = exp.fields
        want = {"status": exp.status.value, "kind": exp.kind, "seq": exp.seq & 0xFFFF_FFFF,
                "batch_id": f.get("batch_id", 0), "table_id": f.get("table_id", 0),
                "cookie": f.get("cookie", 0), "bags": exp.bags,
                "rows_written": exp.rows_written, "updates": exp.updates}
        got = {k: rec[k] for k in want}
        assert got == want, (f"descriptor {exp.seq} (kind {exp.kind}): completion record "
                             f"{got}, expected {want}")
        assert rec["rsvd0"] == rec["rsvd1"] == rec["rsvd2"] == 0, "reserved record bits set"
        slot = exp.seq % (1 << self.order)
        self.expect_written(self.cq_addr + slot * LINE_BYTES,
                            self.image(self.cq_addr + slot * LINE_BYTES, LINE_BYTES))
        if exp.out_image is not None:
            got_img = self.out_image(exp.out_addr, len(exp.out_image))
            if got_img != exp.out_image:
                raise AssertionError(self._describe_mismatch(exp, got_img))
            if self.scratch is None:
                self.expect_written(exp.out_addr, exp.out_image)
        if table and exp.table is not None:
            t = exp.table
            got_img = self.image(t.base, t.nbytes)
            want_img = emb.pack_rows(exp.table_after, base=t.image0)
            if got_img != want_img:
                raise AssertionError(self._describe_table(exp, got_img, want_img))
            self.expect_written(t.base, want_img)
        self.checked += 1

    def _describe_mismatch(self, exp: Expect, got: bytes) -> str:
        t = exp.table
        stride = emb.lines_per_row(t.dim, t.data.dtype) * LINE_BYTES
        for b in range(len(exp.out_image) // stride):
            g, w = got[b * stride:(b + 1) * stride], exp.out_image[b * stride:(b + 1) * stride]
            if g != w:
                first = next(i for i in range(stride) if g[i] != w[i])
                return (f"descriptor {exp.seq}: pooled vector of bag {b} differs from byte "
                        f"{first} (dim {t.dim}, {'bf16' if t.bf16 else 'fp32'}, mode "
                        f"{exp.fields['mode']}): got {g[first:first + 16].hex()} want "
                        f"{w[first:first + 16].hex()}")
        return f"descriptor {exp.seq}: pooled output differs"

    def _describe_table(self, exp: Expect, got: bytes, want: bytes) -> str:
        t = exp.table
        stride = emb.lines_per_row(t.dim, t.data.dtype) * LINE_BYTES
        bad = [r for r in range(t.rows) if got[r * stride:(r + 1) * stride]
               != want[r * stride:(r + 1) * stride]]
        return (f"descriptor {exp.seq} (kind {exp.kind}, status {exp.status.name}): table "
                f"{t.table_id} differs in {len(bad)} rows, first {bad[:8]}")

