"""The host driver's checkpoint side: formatting the device, running recovery, reading
its results (``docs/checkpoint.md``).

:class:`CkptDriver` is an :class:`~tb.engine_driver.EngineDriver` whose device memory
starts after the superblock and holds an undo-log ring and two MLP checkpoint slots.
Formatting goes through the PMEM backdoor (as the driver's one-off set-up); recovery is
started and observed through the CSRs like a real driver does.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim import ckpt
from sim.embedding import LINE_BYTES
from tb.engine_driver import EngineDriver

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
    ``mlp_bytes`` each, laid out after the superblock."""

    def __init__(self, tb, *, log_slots: int, mlp_bytes: int = 1024, **kw):
        kw.setdefault("heap_start", SUPERBLOCK_BYTES)
        super().__init__(tb, **kw)
        cfg = tb.config
        self.log_slots = log_slots
        self.slot_lines = cfg.log_slot_lines
        self.log_base = self.heap.alloc(log_slots * self.slot_lines * LINE_BYTES)
        self.mlp_bytes = mlp_bytes
        self.mlp = [self.heap.alloc(mlp_bytes + LINE_BYTES) for _ in range(2)]
        self.layout_end = self.heap.next

    def format(self) -> None:
        """Write the superblock, zero every slot header and MLP header, commit word
        ``{0, 0}`` (the driver's one-off formatting, through the backdoor)."""
        ckpt.format_device(self.tb.pmem, log_base=self.log_base, log_slots=self.log_slots,
                           slot_lines=self.slot_lines, mlp_slot0=self.mlp[0],
                           mlp_slot1=self.mlp[1], mlp_slot_bytes=self.mlp_bytes)

    async def start_recovery(self) -> int:
        """Write CK_CMD.RECOVER; returns the cycle it was written in."""
        await self.tb.csr.write("CK_CMD", 1)
        return self.tb.loop.cycle

    async def wait_recovery(self, start: int, *, timeout: int = 500_000,
                            poll: int = 32) -> RecoveryResult:
        csr, loop = self.tb.csr, self.tb.loop
        while True:
            status = await csr.read("CK_STATUS")
            if status & 0b10 and not status & 0b1:
                break
            if loop.cycle - start > timeout:
                raise TimeoutError(f"recovery not done within {timeout} cycles "
                                   f"(CK_STATUS {status:#x})")
            await loop.wait_cycles(poll)
        self.tb.log.debug("recovery done: CK_STATUS %#x", status)
        res = RecoveryResult(
            status=(status >> 4) & 3, committed=await csr.read("CK_COMMITTED"),
            epoch=await csr.read("CK_EPOCH"), rolled_back=await csr.read("CK_ROLLED_BACK"),
            mlp_slot=await csr.read("CK_MLP_SLOT"), mlp_batch=await csr.read("CK_MLP_BATCH"),
            cycles=loop.cycle - start)
        on = bool(status & 0b100)
        assert on == (res.status == 0), (
            f"CK_STATUS {status:#x} (CK_STATUS now {await csr.read('CK_STATUS'):#x}, "
            f"{res}): ON disagrees with RESULT")
        if on:
            self.ck_on = True
            self.committed = res.committed
            self.cap_batch = None
            self.overflowed.clear()
        return res

    async def recover(self, **kw) -> RecoveryResult:
        return await self.wait_recovery(await self.start_recovery(), **kw)
