"""The engine's checkpoint control: commit state, the batch rules of the dispatcher,
MLP checkpoint copies and the hand-off to and from recovery (``docs/checkpoint.md``).

See :class:`CheckpointControl`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..ckpt.formats import COMMIT_MAGIC
from ..ckpt.mlp_copy import LINES_WIDTH
from ..ckpt.recovery import MLP_NONE
from ..ckpt.recovery import Status as RecoveryStatus
from ..cxl.messages import LINE_ADDR_BITS
from .descriptor import DescKind, Descriptor, Status

__all__ = ["CheckpointControl", "copier_signature", "dispatch_signature",
           "logger_signature", "recovery_signature"]

_LINE_SHIFT = 6


def dispatch_signature() -> wiring.Signature:
    """Between the dispatcher (its ``Out`` side) and the control, about the descriptor
    at the head of the ring: ``desc`` / ``desc_valid``; ``pre``, the status of the
    checkpoint checks; ``status``, the final status of every check; ``hold``, the
    descriptor must wait; ``accept``, it is dispatched; ``commit``, it is a COMMIT that
    writes ``commit_word``; ``log_on``, undo logging is on."""
    return wiring.Signature({
        "desc": Out(Descriptor), "desc_valid": Out(1), "status": Out(Status),
        "accept": Out(1), "pre": In(Status), "hold": In(1), "commit": In(1),
        "commit_word": In(64), "log_on": In(1),
    })


def copier_signature(addr_width: int) -> wiring.Signature:
    """The control's side of :class:`~hw.ckpt.mlp_copy.MlpCopier`'s ports."""
    return wiring.Signature({
        "start": Out(1), "src": Out(addr_width), "dst": Out(addr_width),
        "header_addr": Out(addr_width), "lines": Out(LINES_WIDTH), "batch_id": Out(32),
        "busy": In(1), "done": In(1), "error": In(1),
    })


def recovery_signature(addr_width: int) -> wiring.Signature:
    """The control's side of the :class:`~hw.ckpt.recovery.Recovery` ports it uses."""
    return wiring.Signature({
        "start": Out(1), "busy": In(1), "status": In(RecoveryStatus),
        "committed": In(32), "epoch": In(16), "mlp_slot": In(2), "mlp_batch": In(32),
        "mlp_slot0": In(addr_width), "mlp_slot1": In(addr_width), "mlp_slot_bytes": In(32),
    })


def logger_signature() -> wiring.Signature:
    """The control's side of the :class:`~hw.ckpt.logger.UndoLogger` ports it uses."""
    return wiring.Signature({
        "enable": Out(1), "epoch": Out(16), "commit": Out(1), "commit_batch": Out(32),
        "restart": Out(1), "overflow": In(1), "overflow_batch": In(32),
    })


class CheckpointControl(wiring.Component):
    """Checkpoint state of the engine and the rules it imposes on dispatch.

    **State.** ``on`` (the last recovery succeeded: undo logging and commits are on;
    off from reset until then), the committed batch and the epoch (loaded from recovery),
    the batch of the last LOOKUP that captured undo records, the newest valid MLP
    checkpoint slot (``MLP_NONE``: none) with its batch, and the newest batch requested
    by an MLP_CHECKPOINT.

    **Dispatch rules.** For the descriptor ``desc`` at the head of the ring, ``pre`` is
    the status of the checkpoint checks (zero when they pass): with logging on, a COMMIT
    whose batch is not after the committed one, an UPDATE whose batch is not after it or
    is not the batch of the last capturing LOOKUP (BAD_BATCH), an UPDATE of a batch whose
    undo log overflowed (LOG_FULL); for an MLP_CHECKPOINT: logging off (UNSUPPORTED), a
    batch after the committed one or not after the last requested (BAD_BATCH), a
    misaligned address or length (MISALIGNED), a zero length, one above the slot size or
    a PMEM range past the address space (ADDR_RANGE). Given the final status of ``desc``
    in ``status``, ``hold`` keeps it from being dispatched while an MLP_CHECKPOINT would
    find a copy running, or a COMMIT finds one running and the newest valid checkpoint
    lags the COMMIT's batch by more than ``mlp_k``. ``commit`` marks a COMMIT that
    writes the commit word. Everything is combinational from ``desc`` and the state.

    **Actions.** When ``accept`` dispatches ``desc``: a COMMIT that writes the commit
    word becomes the pending commit, which takes effect (``committed``, the logger's
    ``commit``) when the next descriptor completes (``complete``: COMMIT waits for
    everything before it, and nothing passes it); an MLP_CHECKPOINT starts the copier
    into the slot not holding the newest checkpoint, and its ``done`` makes that slot the
    newest unless it reports an error. ``recover`` starts recovery when ``quiet`` (the
    engine has nothing in flight) and no copy or recovery runs, and is ``rejected``
    otherwise; logging is off while recovery runs, and a successful recovery turns it on
    with recovery's committed batch and epoch (``on`` rises with recovery's ``done``).

    Members
    -------
    dispatch : ``In(dispatch_signature())``
        From the dispatcher (:func:`dispatch_signature`).
    complete, quiet, recover : ``In(1)``
    mlp_k : ``In(16)``; mlp_src_host : ``In(1)``
        ``CK_MLP_K`` and ``COH_CTRL.MLP_SRC_HOST``.
    src_line : ``Out(LINE_ADDR_BITS)``
        With ``mlp_src_host``, the host line of the running copy's source.
    copier, recovery, logger : ``Out(copier_signature(addr_width))``, ...
        To the blocks (:func:`copier_signature`, :func:`recovery_signature`,
        :func:`logger_signature`).
    on, rejected, committed, epoch, mlp_slot, mlp_batch, mlp_error, mlp_lag : ``Out``
        ``CK_STATUS`` fields; ``on`` is ``dispatch.log_on`` or a recovery succeeding this cycle.
    ev_mlp_stall : ``Out(1)``
        ``desc`` is held by the lag rule.
    """

    def __init__(self, *, addr_width: int):
        if not _LINE_SHIFT < addr_width <= Descriptor["data_addr"].width:
            raise ValueError(f"addr_width must be in {_LINE_SHIFT + 1}.."
                             f"{Descriptor['data_addr'].width}, not {addr_width}")
        self._addr_width = addr_width
        super().__init__({
            "dispatch": In(dispatch_signature()),
            "complete": In(1),
            "quiet": In(1),
            "recover": In(1),
            "mlp_k": In(16),
            "mlp_src_host": In(1),
            "src_line": Out(LINE_ADDR_BITS),
            "copier": Out(copier_signature(addr_width)),
            "recovery": Out(recovery_signature(addr_width)),
            "logger": Out(logger_signature()),
            "on": Out(1),
            "rejected": Out(1),
            "committed": Out(32),
            "epoch": Out(16),
            "mlp_slot": Out(2, init=MLP_NONE),
            "mlp_batch": Out(32),
            "mlp_error": Out(1),
            "mlp_lag": Out(1),
            "ev_mlp_stall": Out(1),
        })

    addr_width = property(lambda self: self._addr_width)

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        dp, cp, rec, log = self.dispatch, self.copier, self.recovery, self.logger
        d = dp.desc
        on, committed, epoch = dp.log_on, self.committed, self.epoch
        mlp_slot, mlp_batch, mlp_error = self.mlp_slot, self.mlp_batch, self.mlp_error
        is_commit = d.kind == DescKind.COMMIT.value
        is_update = d.kind == DescKind.UPDATE.value
        is_lookup = d.kind == DescKind.LOOKUP.value
        is_mlp = d.kind == DescKind.MLP_CHECKPOINT.value
        ok = dp.status == Status.OK

        # --- batch rules of COMMIT and UPDATE
        cap_batch = Signal(32)          # batch of the last capturing LOOKUP
        cap_valid = Signal()
        newer = d.batch_id > committed
        bad_batch = on & ((is_commit & ~newer)
                          | (is_update & (~newer | ~cap_valid | (d.batch_id != cap_batch))))
        log_full = on & is_update & log.overflow & (d.batch_id == log.overflow_batch)

        # --- MLP_CHECKPOINT: ``num_indices`` is the length in bytes
        mlp_req = Signal(32)            # newest batch requested (copied or being copied)
        length = d.num_indices
        mlp_bad_batch = (d.batch_id > committed) | ~(d.batch_id > mlp_req)
        misaligned = d.data_addr[:_LINE_SHIFT].any() | length[:_LINE_SHIFT].any()
        out_of_range = (~length.any() | (length > rec.mlp_slot_bytes)
                        | (~self.mlp_src_host & (d.data_addr + length > 2 ** aw)))
        with m.If(is_mlp):
            with m.If(~on):
                m.d.comb += dp.pre.eq(Status.UNSUPPORTED)
            with m.Elif(mlp_bad_batch):
                m.d.comb += dp.pre.eq(Status.BAD_BATCH)
            with m.Elif(misaligned):
                m.d.comb += dp.pre.eq(Status.MISALIGNED)
            with m.Elif(out_of_range):
                m.d.comb += dp.pre.eq(Status.ADDR_RANGE)
        with m.Elif(bad_batch):
            m.d.comb += dp.pre.eq(Status.BAD_BATCH)
        with m.Elif(log_full):
            m.d.comb += dp.pre.eq(Status.LOG_FULL)

        do_commit = on & is_commit & ok
        do_copy = is_mlp & ok
        # COMMIT(b) waits while a copy runs and the newest valid checkpoint is older
        # than b - K (the copy is what would bring it within K).
        commit_lag = Signal(32)
        m.d.comb += commit_lag.eq(d.batch_id - mlp_batch)
        mlp_wait = do_commit & cp.busy & (commit_lag > self.mlp_k)
        m.d.comb += [
            dp.commit.eq(do_commit),
            dp.commit_word.eq(Cat(d.batch_id, epoch, C(COMMIT_MAGIC, 16))),
            dp.hold.eq((do_copy & cp.busy) | mlp_wait),
            self.ev_mlp_stall.eq(dp.desc_valid & mlp_wait),
        ]

        # --- commits and undo capture
        pend_commit = Signal()          # a COMMIT that writes the commit word is outstanding
        pend_batch = Signal(32)
        with m.If(dp.accept & do_commit):
            m.d.sync += [pend_commit.eq(1), pend_batch.eq(d.batch_id)]
        commit_done = self.complete & pend_commit
        with m.If(commit_done):
            m.d.sync += [pend_commit.eq(0), committed.eq(pend_batch)]
        with m.If(dp.accept & ok & is_lookup & d.capture_undo & on):
            m.d.sync += [cap_batch.eq(d.batch_id), cap_valid.eq(1)]

        # --- MLP checkpoint copies into the slot not holding the newest checkpoint
        target = Signal()               # slot 1 after slot 0, else 0
        cp_slot = Signal()
        cp_batch = Signal(32)
        m.d.comb += target.eq(mlp_slot == 0)
        slot_base = Mux(target, rec.mlp_slot1, rec.mlp_slot0)
        m.d.comb += [
            cp.start.eq(dp.accept & do_copy),
            cp.src.eq(Mux(self.mlp_src_host, 0, d.data_addr[:aw])),
            cp.dst.eq(slot_base),
            cp.header_addr.eq(slot_base + rec.mlp_slot_bytes),
            cp.lines.eq(length[_LINE_SHIFT:]),
            cp.batch_id.eq(d.batch_id),
        ]
        with m.If(dp.accept & do_copy):
            m.d.sync += [mlp_req.eq(d.batch_id), cp_slot.eq(target), cp_batch.eq(d.batch_id),
                         mlp_error.eq(0), self.src_line.eq(d.data_addr[_LINE_SHIFT:])]
        with m.If(cp.done):
            with m.If(cp.error):
                m.d.sync += mlp_error.eq(1)
            with m.Else():
                m.d.sync += [mlp_slot.eq(cp_slot), mlp_batch.eq(cp_batch)]

        # --- recovery: started when nothing runs; its results on as it finishes
        idle = self.quiet & ~rec.busy & ~cp.busy
        rec_start = self.recover & idle
        with m.If(self.recover):
            m.d.sync += self.rejected.eq(~idle)
        with m.If(rec_start):
            m.d.sync += [on.eq(0), cap_valid.eq(0)]
        rec_was_busy = Signal()
        m.d.sync += rec_was_busy.eq(rec.busy)
        rec_finished = rec_was_busy & ~rec.busy
        rec_ok = rec.status == RecoveryStatus.OK
        with m.If(rec_finished & rec_ok):
            m.d.sync += [on.eq(1), committed.eq(rec.committed), epoch.eq(rec.epoch)]
        with m.If(rec_finished):
            none = rec.mlp_slot == MLP_NONE
            m.d.sync += [mlp_slot.eq(rec.mlp_slot), mlp_error.eq(0),
                         mlp_batch.eq(Mux(none, 0, rec.mlp_batch)),
                         mlp_req.eq(Mux(none, 0, rec.mlp_batch))]
        lag = Signal(32)
        m.d.comb += [
            rec.start.eq(rec_start),
            log.enable.eq(on),
            log.epoch.eq(epoch),
            log.commit.eq(commit_done),
            log.commit_batch.eq(pend_batch),
            log.restart.eq(rec_finished & rec_ok),
            self.on.eq(on | (rec_finished & rec_ok)),
            lag.eq(committed - mlp_batch),
            self.mlp_lag.eq(on & (lag > self.mlp_k)),
        ]
        return m
