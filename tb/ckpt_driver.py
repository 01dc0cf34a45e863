"""The host driver's checkpoint side: formatting the device, running recovery, reading
its results (``docs/checkpoint.md``).

:class:`CkptDriver` is an :class:`~tb.engine_driver.EngineDriver` whose device memory
starts after the superblock and holds an undo-log ring and two MLP checkpoint slots.
Formatting goes through the PMEM backdoor (as the driver's one-off set-up); recovery is
started and observed through the CSRs like a real driver does.

MLP checkpoints: the GPU's parameters go into one of two staging areas (alternating;
one is rewritten only after the copy that read it has finished, which the driver learns
from ``CK_MLP_BATCH``), then an MLP_CHECKPOINT descriptor names it. The driver models
the device's rules (``docs/checkpoint.md``): the status of each MLP_CHECKPOINT, the
slot each copy goes to, and checks the slot bit for bit once the copy is done.
"""

from __future__ import annotations

from dataclasses import dataclass

from hw.engine.descriptor import DescKind, Status
from sim import ckpt
from sim.embedding import LINE_BYTES
from tb.engine_driver import EngineDriver, Expect

__all__ = ["CkptDriver", "RecoveryResult"]

#: The superblock's two lines at device address 0.
SUPERBLOCK_BYTES = 2 * LINE_BYTES


@dataclass
class RecoveryResult:
    status: int             # CK_STATUS.RESULT: 0 OK, 1 NO_SUPERBLOCK, 2 PMEM_ERROR, 3 BAD_LAYOUT
    committed: int
    epoch: int
    rolled_back: int
    mlp_slot: int           # 3: none
    mlp_batch: int
    cycles: int


class CkptDriver(EngineDriver):
    """An engine driver with an undo log of ``log_slots`` slots and MLP slots of
    ``mlp_bytes`` each, laid out after the superblock. ``mlp_src_host``: the device runs
    with ``COH_CTRL.MLP_SRC_HOST`` (MLP_CHECKPOINT copies GPU memory, so its source range
    is not checked against device memory)."""

    def __init__(self, tb, *, log_slots: int, mlp_bytes: int = 1024,
                 mlp_src_host: bool = False, **kw):
        kw.setdefault("heap_start", SUPERBLOCK_BYTES)
        super().__init__(tb, **kw)
        cfg = tb.config
        self.log_slots = log_slots
        self.slot_lines = cfg.log_slot_lines
        self.log_base = self.heap.alloc(log_slots * self.slot_lines * LINE_BYTES)
        self.mlp_bytes = mlp_bytes
        self.mlp_src_host = mlp_src_host
        self.mlp = [self.heap.alloc(mlp_bytes + LINE_BYTES) for _ in range(2)]
        self.staging = [self.heap.alloc(mlp_bytes) for _ in range(2)]
        self.layout_end = self.heap.next
        self.copies: dict[int, tuple[int, bytes | None]] = {}   # batch -> (slot, payload)
        self._reset_mlp()

    def _reset_mlp(self) -> None:
        self.mlp_slot = 3               # the device's newest valid slot (model), 3: none
        self.mlp_batch = 0              # ... and its batch
        self.mlp_req = 0                # newest batch an accepted copy was asked for
        self.mlp_done = 0               # newest copy seen finished (CK_MLP_BATCH)
        self._staging_use = [0, 0]      # batch whose copy last read each staging area
        self._next_staging = 0

    def reset_state(self) -> None:
        """As :meth:`EngineDriver.reset_state`; the copies made so far stay known (a
        recovery may name one of them)."""
        super().reset_state()
        self._reset_mlp()

    def _checkpoint_status(self, kind: int, f: dict) -> Status | None:
        if kind != DescKind.MLP_CHECKPOINT.value or not self.ck_on:
            return super()._checkpoint_status(kind, f)
        batch, src, length = f.get("batch_id", 0), f.get("data_addr", 0), f.get("num_indices", 0)
        if batch > self.committed or batch <= self.mlp_req:
            return Status.BAD_BATCH
        if src % LINE_BYTES or length % LINE_BYTES:
            return Status.MISALIGNED
        if not 0 < length <= self.mlp_bytes or (not self.mlp_src_host
                                                 and src + length > self.cfg.pmem_size):
            return Status.ADDR_RANGE
        self.mlp_req = batch
        return Status.OK

    async def mlp_checkpoint(self, batch_id: int, params: bytes, **override) -> Expect:
        """Stage ``params`` (a multiple of 64 bytes) and queue MLP_CHECKPOINT(``batch_id``)
        (see :meth:`ring`); ``override`` replaces descriptor fields. An accepted copy
        is recorded for :meth:`check_mlp`."""
        area = self._next_staging
        src = self.staging[area]
        fields = dict(kind=DescKind.MLP_CHECKPOINT, batch_id=batch_id, data_addr=src,
                      num_indices=len(params), cookie=self.tail + 0x4D4C) | override
        exp = self.expect(fields)
        if exp.status is Status.OK:
            if self._staging_use[area] > self.mlp_done:     # its last copy may still read it
                await self.ring()
                await self.wait_mlp(self._staging_use[area])
            await self.stage(src, params)
            self._record_copy(batch_id, bytes(params))
            self._staging_use[area] = batch_id
            self._next_staging ^= 1
        await self.queue(fields, exp)
        return exp

    async def stage(self, src: int, params: bytes) -> None:
        """Write the MLP parameters into staging area ``src`` (device memory here)."""
        await self.put(src, params)

    async def mlp_checkpoint_from_host(self, batch_id: int, src: int, length: int,
                                       params: bytes | None) -> Expect:
        """Queue MLP_CHECKPOINT(``batch_id``) of ``length`` bytes at ``src`` in GPU memory
        (``mlp_src_host``; the caller has written them there). An accepted copy is
        recorded for :meth:`check_mlp` with ``params`` (None: the caller checks the
        slot itself, :meth:`wait_mlp` with ``check=False``)."""
        fields = dict(kind=DescKind.MLP_CHECKPOINT, batch_id=batch_id, data_addr=src,
                      num_indices=length, cookie=self.tail + 0x4D4C)
        exp = self.expect(fields)
        if exp.status is Status.OK:
            self._record_copy(batch_id, params)
        await self.queue(fields, exp)
        return exp

    def _record_copy(self, batch_id: int, params: bytes | None) -> None:
        """An accepted copy goes to the slot that does not hold the newest valid one."""
        slot = 1 if self.mlp_slot == 0 else 0
        self.copies[batch_id] = (slot, params)
        self.mlp_slot, self.mlp_batch = slot, batch_id

    async def wait_mlp(self, batch_id: int, *, timeout: int = 200_000,
                       poll: int = 32, check: bool = True) -> None:
        """Wait until the copy of ``batch_id`` is done (``CK_MLP_BATCH`` reaches it and
        ``CK_STATUS.MLP_BUSY`` is low), then (with ``check``) check its slot."""
        csr, loop = self.tb.csr, self.tb.loop
        start = loop.cycle
        while True:
            status = await csr.read_fields("CK_STATUS")
            done = await csr.read("CK_MLP_BATCH")
            if done >= batch_id and not status.mlp_busy:
                break
            assert not status.mlp_error, f"MLP copy failed ({status})"
            if loop.cycle - start > timeout:
                raise TimeoutError(f"MLP copy of batch {batch_id} not done within {timeout} "
                                   f"cycles ({status}, CK_MLP_BATCH {done})")
            await loop.wait_cycles(poll)
        self.mlp_done = max(self.mlp_done, done)
        slot = await csr.read("CK_MLP_SLOT")
        assert (slot, done) == (self.copies[done][0], done), (
            f"CK_MLP_SLOT {slot} / CK_MLP_BATCH {done}; the model's copy of batch {done} "
            f"went to slot {self.copies[done][0]}")
        if check:
            self.check_mlp(slot, done)

    def check_mlp(self, slot: int, batch_id: int) -> None:
        """Slot ``slot`` holds the copy of ``batch_id`` bit for bit: the staged payload and
        the contract's header (``sim.ckpt.encode_mlp_slot``)."""
        want_slot, params = self.copies[batch_id]
        assert slot == want_slot, f"batch {batch_id} is in slot {slot}, expected {want_slot}"
        payload, header = ckpt.encode_mlp_slot(batch_id, params)
        base = self.mlp[slot]
        got = self.image(base, len(payload))
        assert got == payload, f"MLP slot {slot} payload differs from batch {batch_id}'s"
        got = self.image(base + self.mlp_bytes, LINE_BYTES)
        assert got == header, (f"MLP slot {slot} header {got.hex()} differs from the "
                               f"contract's {header.hex()} (batch {batch_id})")

    def format(self) -> None:
        """Write the superblock, zero every slot header and MLP header, commit word
        ``{0, 0}`` (the driver's one-off formatting, through the backdoor)."""
        self.copies.clear()
        ckpt.format_device(self.tb.pmem, log_base=self.log_base, log_slots=self.log_slots,
                           slot_lines=self.slot_lines, mlp_slot0=self.mlp[0],
                           mlp_slot1=self.mlp[1], mlp_slot_bytes=self.mlp_bytes)

    async def start_recovery(self) -> int:
        """Write CK_CMD.RECOVER; returns the cycle it was written in."""
        await self.tb.csr.write_fields("CK_CMD", recover=1)
        return self.tb.loop.cycle

    async def wait_recovery(self, start: int, *, timeout: int = 500_000,
                            poll: int = 32) -> RecoveryResult:
        csr, loop = self.tb.csr, self.tb.loop
        while True:
            status = await csr.read_fields("CK_STATUS")
            if status.done and not status.busy:
                break
            if loop.cycle - start > timeout:
                raise TimeoutError(f"recovery not done within {timeout} cycles ({status})")
            await loop.wait_cycles(poll)
        self.tb.log.debug("recovery done: %s", status)
        res = RecoveryResult(
            status=status.result, committed=await csr.read("CK_COMMITTED"),
            epoch=await csr.read("CK_EPOCH"), rolled_back=await csr.read("CK_ROLLED_BACK"),
            mlp_slot=await csr.read("CK_MLP_SLOT"), mlp_batch=await csr.read("CK_MLP_BATCH"),
            cycles=loop.cycle - start)
        on = bool(status.on)
        assert on == (res.status == 0), (
            f"{status} (CK_STATUS now {await csr.read('CK_STATUS'):#x}, "
            f"{res}): ON disagrees with RESULT")
        if on:
            self.ck_on = True
            self.committed = res.committed
            self.cap_batch = None
            self.overflowed.clear()
            self.mlp_slot, self.mlp_batch = res.mlp_slot, res.mlp_batch
            self.mlp_req = self.mlp_done = res.mlp_batch
        return res

    async def recover(self, **kw) -> RecoveryResult:
        return await self.wait_recovery(await self.start_recovery(), **kw)
