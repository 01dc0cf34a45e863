"""The embedding engine: descriptor ring in, LOOKUP gather-reduce and UPDATE scatter
next to PMEM, completion records and head out (``docs/embedding.md``)."""

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature
from hw.bus.axi_arbiter import AxiArbiter
from hw.bus.axi_to_cache import AxiToCache
from hw.config import DeviceConfig

from ..ckpt.logger import UndoLogger
from ..ckpt.mlp_copy import MlpCopier
from ..ckpt.recovery import Recovery
from ..cxl.cache_agent import RD_REQ, RD_RSP, WR_REQ, WR_RSP
from ..cxl.cache_read_mux import CacheReadMux
from ..cxl.messages import LINE_ADDR_BITS, LINE_BITS
from .bag_sequencer import STATUS
from .ckpt_control import CheckpointControl
from .coalesced_update import CoalescedUpdate
from .completion import Completion
from .desc_fetch import RING_ORDER_MAX, DescFetch
from .dispatcher import Dispatcher
from .grad_feed import GradFeed
from .pool_reduce import PoolReduce
from .row_fork import RowFork
from .row_gather import RowGather
from .row_store import RowStore, StoreReader
from .sequencer_pool import SequencerPool
from .update_passes import UpdatePasses

__all__ = ["Engine"]

#: Managers behind the engine's PMEM arbiter, in arbiter order, and their priority
#: classes (0 first): undo-log writes and MLP checkpoint copies share the last port
#: (a second arbiter) and run in the background.
_MANAGERS = ("gather", "sequencer", "completion", "fetch", "grad", "scatter", "recovery",
             "background")
_PRIORITY = {"background": 1}
#: What each manager's PMEM lines serve, for the per-kind counters (``docs/registers.md``,
#: ENG_PMEM_RD_* / ENG_PMEM_WR_*): a manager's R and W beats are all of one kind. The
#: sequencers (indices, offsets, weights of LOOKUPs and UPDATEs) and the completion
#: (pooled vectors, completion records) serve both kinds of descriptor: "other".
PMEM_KINDS = ("lookup", "update", "ckpt", "other")
#: ``(direction, kind)`` of the per-kind counters: the gather (the only "lookup"
#: manager) never writes.
PMEM_KIND_COUNTERS = tuple((d, kind) for d in ("rd", "wr") for kind in PMEM_KINDS
                           if (d, kind) != ("wr", "lookup"))
#: Their CSRs (ENG_PMEM_RD_LOOKUP, ...), by report key (``"rd_lookup"``, ...).
PMEM_KIND_CSRS = {f"{d}_{kind}": f"ENG_PMEM_{d}_{kind}".upper()
                  for d, kind in PMEM_KIND_COUNTERS}
_MANAGER_KIND = {"gather": "lookup", "sequencer": "other", "completion": "other",
                 "fetch": "other", "grad": "update", "scatter": "update",
                 "recovery": "ckpt", "background": "ckpt"}
#: Descriptors dispatched and not yet completed that the completion queue holds.
_QUEUE = 8
#: Rows an UPDATE's gradient feed may lag the gather by (the fork's FIFO).
_GRAD_ROWS = 16


def _tie(m: Module, iface, block) -> None:
    """Connects ``iface`` (an ``Out`` interface of one submodule) to the members of the
    same names of ``block`` (flat ports of another), each in its direction."""
    for name, member in iface.signature.members.items():
        ours, theirs = getattr(iface, name), getattr(block, name)
        if member.flow == Out:
            m.d.comb += theirs.eq(ours)
        else:
            m.d.comb += ours.eq(theirs)


class Engine(wiring.Component):
    """Executes the descriptors of the ring (``docs/embedding.md``).

    **Structure.** :class:`~.desc_fetch.DescFetch` reads descriptors ahead;
    :class:`~.dispatcher.Dispatcher` checks them (with
    :class:`~.ckpt_control.CheckpointControl` for the checkpoint rules) and sends LOOKUP
    and UPDATE (an UPDATE larger than the accumulator once per pass, through
    :class:`~.update_passes.UpdatePasses`) to :class:`~.sequencer_pool.SequencerPool`,
    whose :class:`~.bag_sequencer.BagSequencer` s check them and emit their rows,
    merged in ring order with each descriptor's settings. :class:`~.row_fork.RowFork` passes the
    rows to :class:`~.row_gather.RowGather` and, for a LOOKUP, its lines to
    :class:`~.pool_reduce.PoolReduce`; for an UPDATE the rows go only to
    :class:`~.grad_feed.GradFeed`, whose gradient items feed
    :class:`~.coalesced_update.CoalescedUpdate` (it sums them per distinct row and
    reads and writes each distinct row once itself);
    :class:`~.completion.Completion` writes the pooled vectors and the completion
    records in ring order and advances the head. The checkpoint control drives the
    :class:`~hw.ckpt.logger.UndoLogger`, :class:`~hw.ckpt.recovery.Recovery` and the
    :class:`~hw.ckpt.mlp_copy.MlpCopier`, whose reads
    :class:`~hw.bus.axi_to_cache.AxiToCache` turns into CXL.cache reads with
    ``mlp_src_host``. One :class:`~hw.bus.axi_arbiter.AxiArbiter` (round-robin, one
    class) shares the PMEM port between the eight managers; each gets
    ``axi_id_width - 3`` ID bits (the logger and the copier ``axi_id_width - 4`` each,
    behind their own arbiter).

    **Order.** The dispatcher pre-checks what the sequencer cannot know: an unknown
    ``kind`` (BAD_KIND), ``dim`` above ``engine_max_dim`` (UNSUPPORTED), the batch
    rules of ``docs/checkpoint.md`` and every check of MLP_CHECKPOINT; such
    descriptors, NOP, COMMIT, FENCE and MLP_CHECKPOINT complete without the sequencer.
    An MLP_CHECKPOINT waits for the previous copy to finish, starts the
    :class:`~hw.ckpt.mlp_copy.MlpCopier` and completes (the copy runs in the
    background); a COMMIT waits while a copy is running and the newest valid MLP
    checkpoint lags its batch by more than ``ck_mlp_k``. LOOKUPs and UPDATEs go to the
    ``engine_sequencers`` bag sequencers in turn, and a merge passes their rows and
    statuses on in dispatch order; LOOKUPs follow each other without waiting (the
    pooling settings travel with the rows). An UPDATE is dispatched once no earlier
    LOOKUP, COMMIT or FENCE is outstanding; the rows of the descriptor after it pass the
    merge only once the scatter has reported the UPDATE (its writes are durable), but
    those of an UPDATE of a table apart from it once the gradient feed has handed the
    scatter the UPDATE's last item (``docs/embedding.md``, "UPDATEs of different tables
    overlap"); the gradient feed and the scatter take their settings from an UPDATE as
    its rows start. COMMIT and FENCE wait until every earlier descriptor has completed,
    and nothing is dispatched after them until they have completed.

    Members
    -------
    pmem : ``Out(AXI4Signature(addr_width=pmem_addr_width, data_width=512,
    id_width=axi_id_width))``
    ring_base, cq_base : ``In(pmem_addr_width)``
        Byte addresses of the ring and the completion-record array.
    ring_order, tail : ``In``
        Ring size ``2**min(ring_order, 16)`` and the doorbell count.
    cq_host, cq_host_line : ``In(1)``, ``In(LINE_ADDR_BITS)``
        ``COH_CTRL.CQ_HOST`` and the host line address of the completion-record array in
        GPU memory: records go out on ``o_cache_wr`` (answered on ``i_cache_wr``).
    mlp_src_host : ``In(1)``
        ``COH_CTRL.MLP_SRC_HOST``: MLP_CHECKPOINT's ``data_addr`` is a GPU-memory byte
        address; the copier's reads go out on ``o_cache_rd`` (answered in order on
        ``i_cache_rd``) instead of PMEM.
    scratch_host, scratch_host_line : ``In(1)``, ``In(LINE_ADDR_BITS)``
        ``COH_CTRL.SCRATCH_HOST`` and the host line address of the scratch window in GPU
        memory: a LOOKUP's / UPDATE's indices, offsets, weights and gradients at byte
        address ``a`` are read from host line ``scratch_host_line + a // 64`` (the
        sequencers' and the gradient feed's reads, each through an
        :class:`~hw.bus.axi_to_cache.AxiToCache`), and a LOOKUP's pooled vectors are
        written there by :class:`~.completion.Completion` on ``o_cache_wr``.
    ring_host : ``In(1)``
        ``COH_CTRL.RING_HOST``: ``ring_base`` is an offset into the same scratch window;
        the descriptor fetch's reads go out on ``o_cache_rd`` through an
        :class:`~hw.bus.axi_to_cache.AxiToCache`, a read error completing the
        descriptor with READ_ERROR (:class:`~.desc_fetch.DescFetch`).
    o_cache_rd, i_cache_rd, o_cache_wr, i_cache_wr : streams of the CXL.cache agent's
        ``RD_REQ`` / ``RD_RSP`` / ``WR_REQ`` / ``WR_RSP``; the copier's, the sequencers',
        the gradient feed's and the descriptor fetch's reads share the read port through a
        :class:`~hw.cxl.cache_read_mux.CacheReadMux`.
    head : ``Out(32)``
        Descriptors completed.
    o_undo : ``Out(stream.Signature(UNDO))``
        LOOKUP's undo capture (:class:`~.row_gather.RowGather`).
    busy, in_flight, serial, undo_stall, init : ``Out``
        ``ENG_STATUS`` fields (``serial``: a COMMIT or FENCE is outstanding; ``init``:
        the coalesced UPDATE clears its hash table after reset).
    err_desc, err_seq, err_info, err_overrun, err_pmem : ``Out``
        ``ENG_ERR`` sets and the capture values.
    ev_desc_done, ev_line_gathered, ev_bag_pooled, ev_upd_line_written,
    ev_upd_item, ev_busy, ev_upd_overlap, ev_pmem_rd_line, ev_pmem_wr_line : ``Out(1)``
        Counter increments.
    ev_pmem_rd_lookup, ev_pmem_rd_update, ev_pmem_rd_ckpt, ev_pmem_rd_other,
    ev_pmem_wr_update, ev_pmem_wr_ckpt, ev_pmem_wr_other : ``Out(1)``
        An R (W) beat taken (given) on the PMEM arbiter's port of a manager of that kind
        (``PMEM_KINDS``): each R / W beat of ``pmem`` is counted in exactly one of them.
    ev_upd_rows : ``Out(32)``
        ``rows_written`` of an UPDATE's (or a pass's) result as the scatter reports it
        (summed over an UPDATE's passes, the record's ``rows_written``: distinct rows
        written), else 0.
    ev_upd_store_line : ``Out(1)``
        A table line the scatter read came from the row store instead of PMEM.
    ev_upd_pass : ``Out(1)``
        An UPDATE, or a pass of a multi-pass UPDATE, goes to the sequencers
        (:class:`~.update_passes.UpdatePasses`).
    store_flush, ext_write : ``In(1)``
        For the row store (``row_store_lines``; ``docs/embedding.md``, "Row store"):
        ``store_flush`` empties it (the device raises it for every request the host
        sends on CXL.mem, which may give the host a line to change or change one);
        ``ext_write`` is high while a write of another manager of the same PMEM (the
        host's, through the CXL.mem endpoint) is in flight, from its AW to its B, so
        that no line whose read it may have passed is kept. The engine's own writes to
        ``pmem`` are watched here: each AW clears the lines it writes from the store
        (a burst of several lines holds the next AW while its lines are looked up),
        and no line is kept while one is in flight.
    """

    def __init__(self, *, config: DeviceConfig):
        self._config = config
        aw = config.pmem_addr_width
        super().__init__({
            "pmem": Out(AXI4Signature(addr_width=aw, data_width=LINE_BITS,
                                      id_width=config.axi_id_width)),
            "ring_base": In(aw),
            "ring_order": In(5),
            "cq_base": In(aw),
            "tail": In(32),
            "cq_host": In(1),
            "cq_host_line": In(LINE_ADDR_BITS),
            "mlp_src_host": In(1),
            "scratch_host": In(1),
            "scratch_host_line": In(LINE_ADDR_BITS),
            "ring_host": In(1),
            "o_cache_rd": Out(stream.Signature(RD_REQ)),
            "i_cache_rd": In(stream.Signature(RD_RSP)),
            "o_cache_wr": Out(stream.Signature(WR_REQ)),
            "i_cache_wr": In(stream.Signature(WR_RSP)),
            "head": Out(32),
            "busy": Out(1),
            "in_flight": Out(8),
            "serial": Out(1),
            "undo_stall": Out(1),
            "init": Out(1),
            "err_desc": Out(1),
            "err_seq": Out(32),
            "err_info": Out(16),
            "err_overrun": Out(1),
            "err_pmem": Out(1),
            "ev_desc_done": Out(1),
            "ev_line_gathered": Out(1),
            "ev_bag_pooled": Out(1),
            "ev_upd_line_written": Out(1),
            "ev_upd_item": Out(1),
            "ev_busy": Out(1),
            "ev_upd_overlap": Out(1),
            "ev_pmem_rd_line": Out(1),
            "ev_pmem_wr_line": Out(1),
            **{f"ev_pmem_{d}_{kind}": Out(1) for d, kind in PMEM_KIND_COUNTERS},
            "ev_upd_rows": Out(32),
            "ev_upd_store_line": Out(1),
            "ev_upd_pass": Out(1),
            "store_flush": In(1),
            "ext_write": In(1),
            # checkpoint (docs/checkpoint.md)
            "ck_recover": In(1),
            "ck_busy": Out(1),
            "ck_done": Out(1),
            "ck_on": Out(1),
            "ck_result": Out(2),
            "ck_log_full": Out(1),
            "ck_overflow": Out(1),
            "ck_rejected": Out(1),
            "ck_log_busy": Out(1),
            "ck_committed": Out(32),
            "ck_epoch": Out(16),
            "ck_rolled_back": Out(32),
            "ck_mlp_slot": Out(2),
            "ck_mlp_batch": Out(32),
            "ck_mlp_k": In(16),
            "ck_mlp_busy": Out(1),
            "ck_mlp_error": Out(1),
            "ck_mlp_lag": Out(1),
            "ev_mlp_line": Out(1),
            "ev_mlp_stall": Out(1),
            "ck_seq": Out(32),
            "ck_overflow_batch": Out(32),
            "ev_record": Out(1),
        })

    #: AXI ID bits the engine's PMEM arbiter adds to name its managers: each manager
    #: gets ``axi_id_width - MANAGER_ID_BITS`` bits (``DeviceConfig`` checks the budget).
    MANAGER_ID_BITS = (len(_MANAGERS) - 1).bit_length()
    #: UPDATEs whose row writes may wait for their Bs at once while the next UPDATE of
    #: another table is applied and the one after it summed (``docs/embedding.md``,
    #: "Execution order").
    UPDATE_TAILS = 4

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        aw = cfg.pmem_addr_width
        id_width = cfg.axi_id_width - self.MANAGER_ID_BITS     # of each manager
        max_lines = cfg.engine_max_lines

        m.submodules.fetch = fetch = DescFetch(addr_width=aw, id_width=id_width)
        m.submodules.dispatch = dispatch = Dispatcher(
            max_dim=cfg.engine_max_dim, queue=_QUEUE,
            update_acc=(cfg.update_acc_rows, cfg.update_acc_lines),
            max_passes=cfg.update_max_passes)
        m.submodules.passes = passes = UpdatePasses(
            acc_rows=cfg.update_acc_rows, acc_lines=cfg.update_acc_lines,
            max_passes=cfg.update_max_passes)
        m.submodules.sequencers = seqs = SequencerPool(
            addr_width=aw, id_width=id_width, sequencers=cfg.engine_sequencers,
            replay_lines=cfg.seq_replay_lines, updates=self.UPDATE_TAILS + 2)
        m.submodules.gather = gather = RowGather(
            addr_width=aw, id_width=id_width, rob_lines=cfg.gather_rob_lines,
            max_lines_per_row=max_lines)
        m.submodules.pool = pool = PoolReduce(
            lanes=cfg.engine_lanes, partials=cfg.reduce_partials, max_lines_per_row=max_lines)
        m.submodules.grad = grad = GradFeed(addr_width=aw, id_width=id_width,
                                            max_glines=max_lines)
        m.submodules.scatter = scatter = CoalescedUpdate(
            addr_width=aw, id_width=id_width, acc_rows=cfg.update_acc_rows,
            max_items=max_lines, acc_lines=cfg.update_acc_lines,
            fetch_lines=cfg.gather_rob_lines, tails=self.UPDATE_TAILS)
        m.submodules.completion = comp = Completion(addr_width=aw, id_width=id_width)
        m.submodules.status_q = status_q = SyncFIFOBuffered(width=STATUS.size, depth=_QUEUE)
        m.submodules.logger = logger = UndoLogger(
            addr_width=aw, id_width=id_width - 1, max_slot_lines=cfg.log_slot_lines,
            filter_rows=cfg.ckpt_filter_rows, fifo_lines=cfg.ckpt_fifo_lines)
        m.submodules.recovery = recovery = Recovery(
            addr_width=aw, id_width=id_width, max_slot_lines=cfg.log_slot_lines)
        # The copier keeps as many reads in flight as the CXL.cache agent has read
        # CQIDs, so a snapshot of GPU memory streams at the link's rate (at least 16).
        m.submodules.copier = copier = MlpCopier(addr_width=aw, id_width=id_width - 1,
                                                 buffer_lines=max(16, cfg.cache_cqids))
        m.submodules.ckpt = ckpt = CheckpointControl(addr_width=aw)
        # MLP_SRC_HOST: the copier's reads become CXL.cache reads of GPU memory at
        # the copy's source line + the offset; its writes stay.
        m.submodules.copy_src = copy_src = AxiToCache(addr_width=aw, id_width=id_width - 1)

        # SCRATCH_HOST: the sequencers' reads (indices, offsets, weights) and the
        # gradient feed's become CXL.cache reads of the GPU-memory scratch window.
        m.submodules.seq_src = seq_src = AxiToCache(addr_width=aw, id_width=id_width)
        m.submodules.grad_src = grad_src = AxiToCache(addr_width=aw, id_width=id_width)
        # RING_HOST: the descriptor fetch's reads too, of the ring in the same window.
        m.submodules.fetch_src = fetch_src = AxiToCache(addr_width=aw, id_width=id_width)
        wiring.connect(m, seqs.pmem, seq_src.sub)
        wiring.connect(m, grad.pmem, grad_src.sub)
        wiring.connect(m, fetch.pmem, fetch_src.sub)
        for src, host in ((seq_src, self.scratch_host), (grad_src, self.scratch_host),
                          (fetch_src, self.ring_host)):
            m.d.comb += [src.host.eq(host), src.base_line.eq(self.scratch_host_line)]

        # --- the row store: the LOOKUPs' lines, the scatter's row reads answered from it
        scatter_pmem, store = scatter.pmem, None
        if cfg.row_store_lines:
            m.submodules.row_store = store = RowStore(addr_width=aw,
                                                      lines=cfg.row_store_lines)
            m.submodules.store_reader = reader = StoreReader(
                addr_width=aw, id_width=id_width, max_burst=max_lines,
                queue=max(16, cfg.gather_rob_lines))
            wiring.connect(m, scatter.pmem, reader.up)
            m.d.comb += [
                store.fill_valid.eq(gather.fill_valid),
                store.fill_addr.eq(gather.fill_addr),
                store.fill_data.eq(gather.fill_data),
                store.probe_valid.eq(reader.probe_valid),
                store.probe_addr.eq(reader.probe_addr),
                reader.probe_ok.eq(store.probe_ok),
                reader.hit.eq(store.hit),
                reader.data.eq(store.data),
                store.flash.eq(self.store_flush),
                self.ev_upd_store_line.eq(reader.store_beat),
            ]
            scatter_pmem = reader.down

        # --- PMEM and CXL.cache ports
        self._share_pmem(m, id_width, {
            "gather": gather.pmem, "sequencer": seq_src.pmem, "completion": comp.pmem,
            "fetch": fetch_src.pmem, "grad": grad_src.pmem, "scatter": scatter_pmem,
            "recovery": recovery.pmem}, logger=logger, copier=copier, copy_src=copy_src,
            store=store, gather=gather)
        m.submodules.cache_rd = cache_rd = CacheReadMux(ports=4)
        for k, src in enumerate((copy_src, seq_src, grad_src, fetch_src)):
            wiring.connect(m, src.o_rd, getattr(cache_rd, f"i_req{k}"))
            wiring.connect(m, getattr(cache_rd, f"o_rsp{k}"), src.i_rd)
        wiring.connect(m, cache_rd.o_rd, wiring.flipped(self.o_cache_rd))
        wiring.connect(m, wiring.flipped(self.i_cache_rd), cache_rd.i_rd)
        wiring.connect(m, comp.o_rec, wiring.flipped(self.o_cache_wr))
        wiring.connect(m, wiring.flipped(self.i_cache_wr), comp.i_rec)

        # --- descriptors: fetch, dispatch, sequencers, completion in ring order
        wiring.connect(m, fetch.o_desc, dispatch.i_desc)
        wiring.connect(m, dispatch.ckpt, ckpt.dispatch)
        # (an UPDATE larger than the accumulator runs as passes: UpdatePasses sends it
        # to the sequencers once per pass and merges the passes' statuses and reports)
        wiring.connect(m, dispatch.o_exec, passes.i_exec)
        wiring.connect(m, passes.o_exec, seqs.i_desc)
        wiring.connect(m, dispatch.o_info, comp.i_info)
        wiring.connect(m, seqs.o_status, status_q.w_stream)
        wiring.connect(m, status_q.r_stream, passes.i_status)
        wiring.connect(m, passes.o_status, comp.i_status)
        done = comp.complete
        # Undo records of earlier LOOKUPs durable: nothing in the gather's undo FIFO,
        # nothing in the logger.
        undo_drained = logger.drained & ~gather.o_undo.valid
        m.d.comb += [
            fetch.ring_base.eq(self.ring_base),
            fetch.ring_order.eq(self.ring_order),
            fetch.tail.eq(self.tail),
            dispatch.complete.eq(done),
            dispatch.complete_kind.eq(comp.kind),
            dispatch.stop.eq(recovery.busy),
            dispatch.undo_drained.eq(undo_drained),
            seqs.i_update_fed.eq(grad.o_items.valid & grad.o_items.ready
                                 & grad.o_items.payload.last),
            seqs.i_update_done.eq(scatter.o_done.valid & scatter.o_done.ready),
            seqs.scratch_host.eq(self.scratch_host),
            passes.quiet.eq(~dispatch.outstanding.any()),
            scatter.pass_level.eq(passes.pass_level),
            scatter.pass_value.eq(passes.pass_value),
            scatter.defer.eq(passes.defer),
            self.ev_upd_pass.eq(passes.ev_pass),
            comp.cq_base.eq(self.cq_base),
            comp.ring_order.eq(self.ring_order),
            comp.cq_host.eq(self.cq_host),
            comp.cq_host_line.eq(self.cq_host_line),
            comp.scratch_host.eq(self.scratch_host),
            comp.scratch_host_line.eq(self.scratch_host_line),
            self.head.eq(comp.head),
        ]

        # --- checkpoint control, undo logger, recovery, MLP copies
        _tie(m, ckpt.copier, copier)
        _tie(m, ckpt.recovery, recovery)
        _tie(m, ckpt.logger, logger)
        m.d.comb += [
            ckpt.complete.eq(done),
            ckpt.quiet.eq(~dispatch.outstanding.any() & ~fetch.busy & undo_drained
                          & ~fetch.o_desc.valid),
            ckpt.recover.eq(self.ck_recover),
            ckpt.mlp_k.eq(self.ck_mlp_k),
            ckpt.mlp_src_host.eq(self.mlp_src_host),
            copy_src.host.eq(self.mlp_src_host),
            copy_src.base_line.eq(ckpt.src_line),
            # Undo records wait while LOOKUPs gather their rows (UndoLogger, "Hold").
            logger.hold.eq(dispatch.lookups),
            logger.log_base.eq(recovery.log_base),
            logger.log_slots_log2.eq(recovery.log_slots_log2),
            logger.slot_lines.eq(recovery.slot_lines),
        ]
        wiring.connect(m, gather.o_undo, logger.i_undo)

        # --- the sequencers' rows: to the gather, and an UPDATE's to the gradient feed
        m.submodules.fork = fork = RowFork(addr_width=aw, grad_rows=_GRAD_ROWS)
        wiring.connect(m, seqs.o_rows, fork.i_rows)
        wiring.connect(m, fork.o_grad, grad.i_rows)
        wiring.connect(m, fork.o_gather, gather.i_rows)
        m.d.comb += [fork.i_finish.eq(seqs.update_finish),
                     grad.seq_error.eq(seqs.update_finish & seqs.update_read_error)]

        # --- the gather's lines (a LOOKUP's: an UPDATE's rows never reach it) are pooled
        wiring.connect(m, gather.o_lines, pool.i_lines)
        wiring.connect(m, pool.o_pooled, comp.i_pooled)
        self._control_update(m, seqs, fork, grad=grad, scatter=scatter)
        wiring.connect(m, grad.o_items, scatter.i_items)
        wiring.connect(m, scatter.o_done, passes.i_done)
        wiring.connect(m, passes.o_done, comp.i_done)

        self._report_status(m, fetch=fetch, dispatch=dispatch, comp=comp, gather=gather,
                            scatter=scatter, grad=grad, seqs=seqs)
        self._report_checkpoint(m, recovery=recovery, ckpt=ckpt, logger=logger,
                                copier=copier, undo_drained=undo_drained)
        return m

    def _share_pmem(self, m: Module, id_width: int, managers: dict, *, logger, copier,
                    copy_src, store, gather) -> None:
        """Shares ``pmem`` between ``managers`` (name in ``_MANAGERS`` -> AXI port with
        ``id_width`` ID bits) and the background: the undo ``logger`` and the MLP
        ``copier`` (its reads through ``copy_src``), ``id_width - 1`` ID bits each,
        take the arbiter's last port through an arbiter of their own. With a row
        ``store``, every AW of ``pmem`` clears its lines from it, and the ``gather``
        keeps no line while a write is in flight."""
        aw = self._config.pmem_addr_width
        m.submodules.background = background = AxiArbiter(
            addr_width=aw, data_width=LINE_BITS, id_width=id_width - 1, priorities=[0, 0])
        m.submodules.arbiter = arbiter = AxiArbiter(
            addr_width=aw, data_width=LINE_BITS, id_width=id_width,
            priorities=[_PRIORITY.get(name, 0) for name in _MANAGERS])
        wiring.connect(m, logger.pmem, background.m0)
        wiring.connect(m, copier.pmem, copy_src.sub)
        wiring.connect(m, copy_src.pmem, background.m1)
        ports = {**managers, "background": background.sub}
        for i, name in enumerate(_MANAGERS):
            wiring.connect(m, ports[name], getattr(arbiter, f"m{i}"))
        if store is None:
            wiring.connect(m, arbiter.sub, wiring.flipped(self.pmem))
        else:
            self._watch_writes(m, arbiter.sub, store, gather)
        # Per-kind line counts: every beat of ``pmem`` passes exactly one manager port.
        beat = {"rd": lambda p: p.rvalid & p.rready, "wr": lambda p: p.wvalid & p.wready}
        for d, kind in PMEM_KIND_COUNTERS:
            beats = [beat[d](getattr(arbiter, f"m{i}")) for i, name in enumerate(_MANAGERS)
                     if _MANAGER_KIND[name] == kind]
            m.d.comb += getattr(self, f"ev_pmem_{d}_{kind}").eq(Cat(*beats).any())

    def _watch_writes(self, m: Module, sub, store, gather) -> None:
        """``sub`` (the arbiter's port) to ``pmem``, each AW passing through the row
        ``store``'s invalidation (held while it has no room), and ``gather.unsafe`` from
        an AW until its B, of the engine's writes and of ``ext_write``."""
        pmem = self.pmem
        for name, member in pmem.signature.members.items():
            if name in ("awvalid", "awready"):
                continue
            if member.flow == Out:
                m.d.comb += getattr(pmem, name).eq(getattr(sub, name))
            else:
                m.d.comb += getattr(sub, name).eq(getattr(pmem, name))
        aw_go = Signal()
        m.d.comb += [
            pmem.awvalid.eq(sub.awvalid & store.inv_room),
            sub.awready.eq(pmem.awready & store.inv_room),
            aw_go.eq(pmem.awvalid & pmem.awready),
            store.inv_valid.eq(aw_go),
            store.inv_addr.eq(pmem.awaddr),
            store.inv_len.eq(pmem.awlen),
        ]
        # Bursts written and not yet answered (B): fewer than 2**16 (IDs bound them).
        pending = Signal(16)
        b_go = Signal()
        m.d.comb += b_go.eq(pmem.bvalid & pmem.bready)
        m.d.sync += pending.eq(pending + aw_go - b_go)
        m.d.comb += gather.unsafe.eq(aw_go | (pending != 0) | self.ext_write
                                     | self.store_flush)

    @staticmethod
    def _control_update(m: Module, seqs, fork, *, grad, scatter) -> None:
        """The gradient feed and the scatter take an UPDATE's settings from the
        sequencers as its rows start; the feed learns from the ``fork`` that they are
        over."""
        update, scatter_ctrl = seqs.update, scatter.i_ctrl
        m.d.comb += [
            grad.start.eq(seqs.update_start),
            grad.checked.eq(seqs.update_checked),
            grad.ahead.eq(seqs.ahead),
            grad.ahead_addr.eq(seqs.ahead_data_addr),
            grad.ahead_bags.eq(seqs.ahead_num_bags),
            grad.ahead_glines.eq(seqs.ahead_glines),
            grad.data_addr.eq(update.data_addr),
            grad.num_bags.eq(update.num_bags),
            grad.glines.eq(update.glines),
            grad.items.eq(update.items),
            grad.finish.eq(fork.finish),
            scatter_ctrl.table_base.eq(update.table_base),
            scatter_ctrl.lines_per_row.eq(update.lines_per_row),
            scatter_ctrl.bf16.eq(update.bf16),
            scatter_ctrl.weighted.eq(update.weighted),
            scatter_ctrl.dim.eq(update.dim),
        ]

    def _report_status(self, m: Module, *, fetch, dispatch, comp, gather, scatter,
                       grad, seqs) -> None:
        """``ENG_STATUS`` and ``ENG_ERR`` fields and the engine's counter increments."""
        lines = gather.o_lines
        axi = self.pmem
        outstanding = dispatch.outstanding
        size = Signal(RING_ORDER_MAX + 1)           # ring size, 2**min(ring_order, MAX)
        m.d.comb += size.eq(C(1, 1) << Mux(self.ring_order >= RING_ORDER_MAX, RING_ORDER_MAX,
                                           self.ring_order))
        pending = Signal(32)
        m.d.comb += pending.eq(self.tail - comp.head)
        m.d.comb += [
            self.busy.eq(fetch.busy | outstanding.any()),
            self.in_flight.eq(outstanding),
            self.serial.eq(dispatch.serial),
            self.undo_stall.eq(gather.undo_stall),
            self.init.eq(scatter.init),
            self.err_desc.eq(comp.complete & comp.status.any()),
            self.err_seq.eq(comp.seq),
            self.err_info.eq(Cat(comp.status, comp.kind)),
            self.err_overrun.eq(pending > size),
            self.err_pmem.eq((axi.rvalid & axi.rready & axi.rresp.any())
                             | (axi.bvalid & axi.bready & axi.bresp.any())),
            self.ev_desc_done.eq(comp.complete),
            self.ev_line_gathered.eq(lines.valid & lines.ready & ~lines.payload.empty_bag),
            self.ev_bag_pooled.eq(comp.bag_written),
            self.ev_upd_line_written.eq(scatter.pmem.awvalid & scatter.pmem.awready),
            self.ev_upd_item.eq(grad.o_items.valid & grad.o_items.ready
                                & ~grad.o_items.payload.nop),
            self.ev_busy.eq(outstanding.any()),
            self.ev_upd_overlap.eq(seqs.update_overlap),
            self.ev_pmem_rd_line.eq(axi.rvalid & axi.rready),
            self.ev_pmem_wr_line.eq(axi.wvalid & axi.wready),
            self.ev_upd_rows.eq(Mux(scatter.o_done.valid & scatter.o_done.ready,
                                    scatter.o_done.payload.rows_written, 0)),
        ]

    def _report_checkpoint(self, m: Module, *, recovery, ckpt, logger, copier,
                           undo_drained) -> None:
        """The checkpoint's status fields and counter increments (``docs/checkpoint.md``)."""
        m.d.comb += [
            self.ck_busy.eq(recovery.busy),
            self.ck_done.eq(recovery.done),
            self.ck_on.eq(ckpt.on),
            self.ck_result.eq(recovery.status.as_value()),
            self.ck_log_full.eq(logger.full),
            self.ck_overflow.eq(logger.overflow),
            self.ck_rejected.eq(ckpt.rejected),
            self.ck_log_busy.eq(~undo_drained),
            self.ck_committed.eq(ckpt.committed),
            self.ck_epoch.eq(ckpt.epoch),
            self.ck_rolled_back.eq(recovery.rolled_back),
            self.ck_mlp_slot.eq(ckpt.mlp_slot),
            self.ck_mlp_batch.eq(ckpt.mlp_batch),
            self.ck_mlp_busy.eq(copier.busy),
            self.ck_mlp_error.eq(ckpt.mlp_error),
            self.ck_mlp_lag.eq(ckpt.mlp_lag),
            self.ev_mlp_line.eq(copier.ev_line),
            self.ev_mlp_stall.eq(ckpt.ev_mlp_stall),
            self.ck_seq.eq(logger.seq),
            self.ck_overflow_batch.eq(logger.overflow_batch),
            self.ev_record.eq(logger.records),
        ]
