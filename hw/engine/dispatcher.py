"""The engine's dispatcher: pre-checks, routing and the ordering rules between
descriptors (``docs/embedding.md``, ``docs/checkpoint.md``).

See :class:`Dispatcher`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .ckpt_control import dispatch_signature
from .completion import INFO
from .desc_fetch import FETCHED
from .descriptor import MAX_DIM, DescKind, Descriptor, Status
from .update_passes import passes_needed

__all__ = ["Dispatcher"]

_KIND_MAX = max(k.value for k in DescKind)


class Dispatcher(wiring.Component):
    """Takes the ring's descriptors in order, checks what the bag sequencer cannot, and
    sends LOOKUP and UPDATE on to the sequencers and every descriptor's completion
    information on to the completion queue.

    **Checks.** A descriptor whose ring line could not be read (``error``: it arrives
    as a NOP) completes with READ_ERROR; then an unknown ``kind`` (BAD_KIND); then the
    checkpoint checks of ``ckpt`` (:class:`~.ckpt_control.CheckpointControl`); then a
    LOOKUP or UPDATE with ``dim`` above ``max_dim``, or an UPDATE that would need more
    than ``max_passes`` passes over the accumulator ``update_acc``
    (:func:`~.update_passes.passes_needed`; UNSUPPORTED). A LOOKUP or UPDATE that
    passes *executes*: it goes out on ``o_exec`` (an UPDATE larger than the
    accumulator, to :class:`~.update_passes.UpdatePasses`); every other descriptor
    completes without the sequencers.

    **Order.** The head descriptor is dispatched (taken from ``i_desc``, its ``INFO``
    written into the completion queue and, if it executes, handed over on ``o_exec``)
    once every rule lets it: the queue has room, recovery does not run (``stop``), the
    checkpoint control does not hold it; a COMMIT or FENCE only when nothing is
    outstanding (dispatched and not yet ``complete``), and nothing while a COMMIT or
    FENCE is outstanding (``serial``); an UPDATE only when no LOOKUP is outstanding; an
    executing UPDATE with logging on only once the undo records of earlier LOOKUPs are
    durable (``undo_drained``). ``complete`` pulses for each descriptor completed, in
    dispatch order, with its ``complete_kind``.

    **Latency, throughput, backpressure.** A descriptor is dispatched in the cycle it is
    offered when the rules allow and ``o_exec`` is ready (if it executes): one per
    cycle. ``o_exec.valid`` does not wait for ``o_exec.ready``; ``i_desc.ready`` is the
    dispatch. ``stop`` must not rise while ``i_desc`` is valid (recovery starts only
    when the engine is quiet), nor may ``undo_drained`` fall while an executing UPDATE
    waits, so ``o_exec`` keeps the stream rules.

    Parameters
    ----------
    max_dim : int
        Largest ``dim`` executed, 1..MAX_DIM.
    update_acc : (int, int) or None
        The UPDATE accumulator's rows and lines (powers of two): an UPDATE may have at
        most ``max_passes * rows`` indices and at most ``max_passes * lines`` indices
        times gradient lines per row (``dim / 16`` rounded up; bf16 twice ``dim / 32``
        rounded up); None: no limit.
    max_passes : int
        Passes over the accumulator an UPDATE may take (1: none beyond the first).
    queue : int
        Depth of the completion queue (descriptors dispatched and not yet taken by the
        completion), at least 2.

    Members
    -------
    i_desc : ``In(stream.Signature(FETCHED))``
    o_exec : ``Out(stream.Signature(Descriptor))``
    o_info : ``Out(stream.Signature(INFO))``
        The completion queue's output.
    ckpt : ``Out(dispatch_signature())``
    complete : ``In(1)``; complete_kind : ``In(8)``
    stop, undo_drained : ``In(1)``
    outstanding : ``Out(8)``
        Descriptors dispatched and not yet completed.
    serial : ``Out(1)``
        A COMMIT or FENCE is outstanding.
    lookups : ``Out(1)``
        A LOOKUP is outstanding.
    """

    def __init__(self, *, max_dim: int, queue: int,
                 update_acc: tuple[int, int] | None = None, max_passes: int = 1):
        if not 1 <= max_dim <= MAX_DIM:
            raise ValueError(f"max_dim must be in 1..{MAX_DIM}, not {max_dim}")
        if queue < 2:
            raise ValueError(f"queue must be at least 2, not {queue}")
        if update_acc is not None and min(update_acc) < 1:
            raise ValueError(f"update_acc must be positive, not {update_acc}")
        self._max_dim = max_dim
        self._update_acc = update_acc
        self._max_passes = max_passes
        self._queue = queue
        super().__init__({
            "i_desc": In(stream.Signature(FETCHED)),
            "o_exec": Out(stream.Signature(Descriptor)),
            "o_info": Out(stream.Signature(INFO)),
            "ckpt": Out(dispatch_signature()),
            "complete": In(1),
            "complete_kind": In(8),
            "stop": In(1),
            "undo_drained": In(1),
            "outstanding": Out(8),
            "serial": Out(1),
            "lookups": Out(1),
        })

    max_dim = property(lambda self: self._max_dim)
    queue = property(lambda self: self._queue)

    def elaborate(self, platform):
        m = Module()
        m.submodules.info_q = info_q = SyncFIFOBuffered(width=INFO.size, depth=self._queue)
        wiring.connect(m, info_q.r_stream, wiring.flipped(self.o_info))
        f, ck, outstanding = self.i_desc, self.ckpt, self.outstanding
        d = f.p.desc
        is_lookup = d.kind == DescKind.LOOKUP.value
        is_update = d.kind == DescKind.UPDATE.value
        serialising = (d.kind == DescKind.COMMIT.value) | (d.kind == DescKind.FENCE.value)
        m.d.comb += [ck.desc.eq(d), ck.desc_valid.eq(f.valid)]

        pre = Signal(Status)
        with m.If(f.p.error):
            m.d.comb += pre.eq(Status.READ_ERROR)
        with m.Elif(d.kind > _KIND_MAX):
            m.d.comb += pre.eq(Status.BAD_KIND)
        with m.Elif(ck.pre != Status.OK):
            m.d.comb += pre.eq(ck.pre)
        with m.Elif((d.dim > self._max_dim) & (is_lookup | is_update)):
            m.d.comb += pre.eq(Status.UNSUPPORTED)
        if self._update_acc is not None:
            need = passes_needed(d, *self._update_acc)
            with m.Elif(is_update & (need > self._max_passes)):
                m.d.comb += pre.eq(Status.UNSUPPORTED)
        executes = (is_lookup | is_update) & (pre == Status.OK)

        lookups_out = Signal(8)         # LOOKUPs among the outstanding descriptors
        allowed = (f.valid & info_q.w_rdy & ~self.stop
                   & Mux(serialising, ~outstanding.any(), ~self.serial)
                   & (~is_update | ~lookups_out.any())
                   & (~(is_update & executes & ck.log_on) | self.undo_drained)
                   & ~ck.hold)
        go = Signal()
        m.d.comb += [
            self.o_exec.valid.eq(allowed & executes),
            self.o_exec.payload.eq(d),
            go.eq(allowed & (~executes | self.o_exec.ready)),
            f.ready.eq(go),
            ck.status.eq(pre),
            ck.accept.eq(go),
        ]
        info = INFO(info_q.w_data)
        m.d.comb += [
            info_q.w_en.eq(go),
            info.seq.eq(f.p.seq),
            info.kind.eq(d.kind),
            info.table_id.eq(d.table_id),
            info.batch_id.eq(d.batch_id),
            info.cookie.eq(d.cookie),
            info.pre_status.eq(pre),
            info.via_seq.eq(executes),
            info.lookup.eq(is_lookup),
            info.update.eq(is_update),
            info.num_bags.eq(d.num_bags),
            info.data_addr.eq(d.data_addr),
            info.dim.eq(d.dim),
            info.bf16.eq(d.bf16),
            info.commit.eq(ck.commit),
            info.commit_word.eq(ck.commit_word),
        ]

        done = self.complete
        with m.If(go & ~done):
            m.d.sync += outstanding.eq(outstanding + 1)
        with m.Elif(~go & done):
            m.d.sync += outstanding.eq(outstanding - 1)
        lookup_in = go & is_lookup
        lookup_done = done & (self.complete_kind == DescKind.LOOKUP.value)
        with m.If(lookup_in & ~lookup_done):
            m.d.sync += lookups_out.eq(lookups_out + 1)
        with m.Elif(~lookup_in & lookup_done):
            m.d.sync += lookups_out.eq(lookups_out - 1)
        m.d.comb += self.lookups.eq(lookups_out.any())
        with m.If(go & serialising):
            m.d.sync += self.serial.eq(1)
        with m.Elif(done & (outstanding == 1) & ~go):
            m.d.sync += self.serial.eq(0)
        return m
