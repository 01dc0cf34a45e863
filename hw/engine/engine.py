"""The embedding engine: descriptor ring in, LOOKUP gather-reduce and UPDATE scatter
next to PMEM, completion records and head out (``docs/embedding.md``)."""

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.arith.fp32 import add, at_least, sub
from hw.bus.axi import AXI4Signature
from hw.bus.axi_arbiter import AxiArbiter
from hw.bus.axi_to_cache import AxiToCache
from hw.config import DeviceConfig

from ..ckpt.formats import COMMIT_MAGIC
from ..ckpt.logger import UndoLogger
from ..ckpt.mlp_copy import MlpCopier
from ..ckpt.recovery import Recovery
from ..cxl.cache_agent import RD_REQ, RD_RSP, WR_REQ, WR_RSP
from ..widths import eq_const, lt_const, zext
from .bag_sequencer import STATUS, BagSequencer
from .ckpt_control import CheckpointControl
from .completion import INFO, Completion
from .desc_fetch import RING_ORDER_MAX, DescFetch
from .descriptor import DescKind, Descriptor, Status
from .grad_feed import GradFeed
from .pool_reduce import PoolReduce
from .row_gather import ROW, RowGather
from .scatter_update import ScatterUpdate

__all__ = ["Engine"]

_LINE_BITS = 512
#: Managers behind the engine's PMEM arbiter, in arbiter order, and their priority
#: classes (0 first): undo-log writes and MLP checkpoint copies share the last port
#: (a second arbiter) and run in the background.
_MANAGERS = ("gather", "sequencer", "completion", "fetch", "grad", "scatter", "recovery",
             "background")
_PRIORITY = {"background": 1}
#: Descriptors dispatched and not yet completed that the completion queue holds.
_QUEUE = 8
#: Rows an UPDATE's gradient feed may lag the gather by (its input FIFO).
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


def _ceil_div_pow2(value, shift: int, width: int):
    """``ceil(value / 2**shift)`` as ``width`` bits."""
    return add(value[shift:], value[:shift].any(), width)


class Engine(wiring.Component):
    """Executes the descriptors of the ring (``docs/embedding.md``).

    **Structure.** :class:`~.desc_fetch.DescFetch` reads descriptors ahead; the
    dispatcher here sends LOOKUP and UPDATE to :class:`~.bag_sequencer.BagSequencer`
    (every check, then the row stream), whose rows go to
    :class:`~.row_gather.RowGather` and :class:`~.pool_reduce.PoolReduce` for a LOOKUP;
    for an UPDATE they go both to :class:`~.grad_feed.GradFeed`, whose gradient items
    feed :class:`~.scatter_update.ScatterUpdate`, and to the gather, which reads the
    rows ahead into the update's cache (counted rows only, never captured);
    :class:`~.completion.Completion` writes the pooled vectors and the completion
    records in ring order and advances the head. One
    :class:`~hw.bus.axi_arbiter.AxiArbiter` (round-robin, one class) shares the PMEM
    port between the eight managers; each gets ``axi_id_width - 3`` ID bits (the
    logger and the copier ``axi_id_width - 4`` each, behind their own arbiter).

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
    merge only once the scatter has reported the UPDATE (its writes are durable), and
    the gradient feed and the scatter take their settings from an UPDATE as its rows
    start. COMMIT and FENCE wait until every earlier descriptor has completed, and
    nothing is dispatched after them until they have completed.

    Members
    -------
    pmem : ``Out(AXI4Signature(addr_width=pmem_addr_width, data_width=512,
    id_width=axi_id_width))``
    ring_base, cq_base : ``In(pmem_addr_width)``
        Byte addresses of the ring and the completion-record array.
    ring_order, tail : ``In``
        Ring size ``2**min(ring_order, 16)`` and the doorbell count.
    cq_host, cq_host_line : ``In(1)``, ``In(46)``
        ``COH_CTRL.CQ_HOST`` and the host line address of the completion-record array in
        GPU memory: records go out on ``o_cache_wr`` (answered on ``i_cache_wr``).
    mlp_src_host : ``In(1)``
        ``COH_CTRL.MLP_SRC_HOST``: MLP_CHECKPOINT's ``data_addr`` is a GPU-memory byte
        address; the copier's reads go out on ``o_cache_rd`` (answered in order on
        ``i_cache_rd``) instead of PMEM.
    o_cache_rd, i_cache_rd, o_cache_wr, i_cache_wr : streams of the CXL.cache agent's
        ``RD_REQ`` / ``RD_RSP`` / ``WR_REQ`` / ``WR_RSP``.
    head : ``Out(32)``
        Descriptors completed.
    o_undo : ``Out(stream.Signature(UNDO))``
        LOOKUP's undo capture (:class:`~.row_gather.RowGather`).
    busy, in_flight, serial, undo_stall : ``Out``
        ``ENG_STATUS`` fields (``serial``: a COMMIT or FENCE is outstanding).
    err_desc, err_seq, err_info, err_overrun, err_pmem : ``Out``
        ``ENG_ERR`` sets and the capture values.
    ev_desc_done, ev_line_gathered, ev_bag_pooled, ev_upd_line_written,
    ev_upd_item, ev_busy : ``Out(1)``
        Counter increments.
    """

    def __init__(self, *, config: DeviceConfig):
        self._config = config
        aw = config.pmem_addr_width
        super().__init__({
            "pmem": Out(AXI4Signature(addr_width=aw, data_width=_LINE_BITS,
                                      id_width=config.axi_id_width)),
            "ring_base": In(aw),
            "ring_order": In(5),
            "cq_base": In(aw),
            "tail": In(32),
            "cq_host": In(1),
            "cq_host_line": In(46),
            "mlp_src_host": In(1),
            "o_cache_rd": Out(stream.Signature(RD_REQ)),
            "i_cache_rd": In(stream.Signature(RD_RSP)),
            "o_cache_wr": Out(stream.Signature(WR_REQ)),
            "i_cache_wr": In(stream.Signature(WR_RSP)),
            "head": Out(32),
            "busy": Out(1),
            "in_flight": Out(8),
            "serial": Out(1),
            "undo_stall": Out(1),
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

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        aw = cfg.pmem_addr_width
        mid = cfg.axi_id_width - (len(_MANAGERS) - 1).bit_length()
        max_lines = cfg.engine_max_lines

        m.submodules.fetch = fetch = DescFetch(addr_width=aw, id_width=mid)
        # The bag sequencers, behind their own arbiter when there are several.
        n_seq = cfg.engine_sequencers
        seq_bits = (n_seq - 1).bit_length()
        seqs = [BagSequencer(addr_width=aw, id_width=mid - seq_bits) for _ in range(n_seq)]
        for k, s in enumerate(seqs):
            m.submodules[f"sequencer{k}"] = s
        if n_seq > 1:
            m.submodules.seq_arb = seq_arb = AxiArbiter(
                addr_width=aw, data_width=_LINE_BITS, id_width=mid - seq_bits,
                priorities=[0] * n_seq)
            for k, s in enumerate(seqs):
                wiring.connect(m, s.pmem, getattr(seq_arb, f"m{k}"))
            seq_port = seq_arb.sub
        else:
            seq_port = seqs[0].pmem
        m.submodules.gather = gather = RowGather(
            addr_width=aw, id_width=mid, rob_lines=cfg.gather_rob_lines,
            max_lines_per_row=max_lines)
        m.submodules.pool = pool = PoolReduce(
            lanes=cfg.engine_lanes, partials=cfg.reduce_partials, max_lines_per_row=max_lines)
        m.submodules.grad = grad = GradFeed(addr_width=aw, id_width=mid, max_glines=max_lines)
        m.submodules.scatter = scatter = ScatterUpdate(
            addr_width=aw, id_width=mid, cache_rows=cfg.update_cache_rows,
            max_lines_per_row=max_lines)
        m.submodules.completion = comp = Completion(addr_width=aw, id_width=mid)
        m.submodules.logger = logger = UndoLogger(
            addr_width=aw, id_width=mid - 1, max_slot_lines=cfg.log_slot_lines,
            filter_rows=cfg.ckpt_filter_rows, fifo_lines=cfg.ckpt_fifo_lines)
        m.submodules.recovery = recovery = Recovery(
            addr_width=aw, id_width=mid, max_slot_lines=cfg.log_slot_lines)
        # The copier keeps as many reads in flight as the CXL.cache agent has read
        # CQIDs, so a snapshot of GPU memory streams at the link's rate (at least 16).
        m.submodules.copier = copier = MlpCopier(addr_width=aw, id_width=mid - 1,
                                                 buffer_lines=max(16, cfg.cache_cqids))
        m.submodules.ckpt = ckpt = CheckpointControl(addr_width=aw)
        _tie(m, ckpt.copier, copier)
        _tie(m, ckpt.recovery, recovery)
        _tie(m, ckpt.logger, logger)
        m.d.comb += [
            ckpt.recover.eq(self.ck_recover),
            ckpt.mlp_k.eq(self.ck_mlp_k),
            ckpt.mlp_src_host.eq(self.mlp_src_host),
        ]
        m.submodules.background = bg = AxiArbiter(
            addr_width=aw, data_width=_LINE_BITS, id_width=mid - 1, priorities=[0, 0])
        wiring.connect(m, logger.pmem, bg.m0)
        # MLP_SRC_HOST: the copier's reads become CXL.cache reads of GPU memory at
        # the copy's source line + the offset; its writes stay.
        m.submodules.copy_src = copy_src = AxiToCache(addr_width=aw, id_width=mid - 1)
        wiring.connect(m, copier.pmem, copy_src.sub)
        wiring.connect(m, copy_src.pmem, bg.m1)
        wiring.connect(m, copy_src.o_rd, wiring.flipped(self.o_cache_rd))
        wiring.connect(m, wiring.flipped(self.i_cache_rd), copy_src.i_rd)
        m.d.comb += [copy_src.host.eq(self.mlp_src_host), copy_src.base_line.eq(ckpt.src_line)]
        m.submodules.arbiter = arb = AxiArbiter(
            addr_width=aw, data_width=_LINE_BITS, id_width=mid,
            priorities=[_PRIORITY.get(name, 0) for name in _MANAGERS])
        m.submodules.info_q = info_q = SyncFIFOBuffered(width=INFO.size, depth=_QUEUE)
        m.submodules.status_q = status_q = SyncFIFOBuffered(width=STATUS.size, depth=_QUEUE)

        ports = {"gather": gather.pmem, "sequencer": seq_port, "completion": comp.pmem,
                 "fetch": fetch.pmem, "grad": grad.pmem, "scatter": scatter.pmem,
                 "recovery": recovery.pmem, "background": bg.sub}
        for i, name in enumerate(_MANAGERS):
            port = ports[name]
            wiring.connect(m, port, getattr(arb, f"m{i}"))
        wiring.connect(m, arb.sub, wiring.flipped(self.pmem))
        wiring.connect(m, comp.o_rec, wiring.flipped(self.o_cache_wr))
        wiring.connect(m, wiring.flipped(self.i_cache_wr), comp.i_rec)

        m.d.comb += [
            fetch.ring_base.eq(self.ring_base),
            fetch.ring_order.eq(self.ring_order),
            fetch.tail.eq(self.tail),
            comp.cq_base.eq(self.cq_base),
            comp.ring_order.eq(self.ring_order),
            comp.cq_host.eq(self.cq_host),
            comp.cq_host_line.eq(self.cq_host_line),
        ]

        # --- dispatch -------------------------------------------------------------------
        f = fetch.o_desc
        d = f.p.desc
        kind = d.kind
        is_lookup = eq_const(kind, DescKind.LOOKUP.value)
        is_update = eq_const(kind, DescKind.UPDATE.value)
        known = lt_const(kind, max(k.value for k in DescKind) + 1)
        too_big = at_least(d.dim, cfg.engine_max_dim + 1)
        executes = (is_lookup | is_update) & ~too_big
        serialising = eq_const(kind, DescKind.COMMIT.value) | eq_const(kind, DescKind.FENCE.value)
        ck_on = ckpt.log_on
        m.d.comb += [ckpt.desc.eq(d), ckpt.desc_valid.eq(f.valid)]

        pre = Signal(8)
        with m.If(~known):
            m.d.comb += pre.eq(Status.BAD_KIND.value)
        with m.Elif(ckpt.pre != Status.OK):
            m.d.comb += pre.eq(ckpt.pre)
        with m.Elif(too_big & (is_lookup | is_update)):
            m.d.comb += pre.eq(Status.UNSUPPORTED.value)
        executes = executes & ~pre.any()
        m.d.comb += ckpt.status.eq(pre)

        outstanding = Signal(8)         # dispatched, not completed
        lookups_out = Signal(8)         # LOOKUPs among them
        serial = Signal()               # a COMMIT or FENCE is outstanding
        # Undo records of earlier LOOKUPs durable: nothing in the gather's undo FIFO,
        # nothing in the logger.
        undo_drained = logger.drained & ~gather.o_undo.valid
        # The sequencer the next executed descriptor goes to (round-robin), and the one
        # whose rows and status go on next (the same order).
        disp = Signal(max(1, seq_bits))
        turn = Signal(max(1, seq_bits))
        seq_ready = Signal()
        for k, s in enumerate(seqs):
            with m.If(eq_const(disp, k)):
                m.d.comb += seq_ready.eq(s.i_desc.ready)
        go = Signal()
        m.d.comb += go.eq(f.valid & info_q.w_rdy & ~recovery.busy
                          & Mux(serialising, ~outstanding.any(), ~serial)
                          & (~is_update | ~lookups_out.any())
                          & (~executes | seq_ready)
                          & (~(is_update & executes & ck_on) | undo_drained)
                          & ~ckpt.hold)
        info = INFO(info_q.w_data)
        m.d.comb += [
            f.ready.eq(go),
            info_q.w_en.eq(go),
            info.seq.eq(f.p.seq),
            info.kind.eq(kind),
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
            info.commit.eq(ckpt.commit),
            info.commit_word.eq(Cat(d.batch_id, ckpt.epoch, C(COMMIT_MAGIC, 16))),
        ]
        # Per sequencer: its descriptor. It holds one from the dispatch until its status
        # has gone on, exactly while it is not idle (``i_desc.ready`` low).
        s_desc = [Signal(Descriptor, name=f"s{k}_desc") for k in range(n_seq)]
        for k, s in enumerate(seqs):
            sel = go & executes & eq_const(disp, k)
            m.d.comb += [s.i_desc.valid.eq(sel), s.i_desc.payload.eq(d)]
            with m.If(sel):
                m.d.sync += s_desc[k].eq(d)
        with m.If(go & executes):
            m.d.sync += disp.eq(Mux(eq_const(disp, n_seq - 1), 0, add(disp, 1, len(disp))))
        done = comp.complete
        with m.If(go & ~done):
            m.d.sync += outstanding.eq(add(outstanding, 1, 8))
        with m.Elif(~go & done):
            m.d.sync += outstanding.eq(sub(outstanding, 1, 8))
        lookup_in = go & is_lookup
        lookup_done = done & eq_const(comp.kind, DescKind.LOOKUP.value)
        with m.If(lookup_in & ~lookup_done):
            m.d.sync += lookups_out.eq(add(lookups_out, 1, 8))
        with m.Elif(~lookup_in & lookup_done):
            m.d.sync += lookups_out.eq(sub(lookups_out, 1, 8))

        # --- the merge: the sequencers' rows and statuses in dispatch order. The rows
        # of whatever follows an UPDATE wait until the UPDATE's writes are durable (the
        # scatter has reported, or its status failed): later descriptors read what it
        # wrote. An UPDATE is dispatched only once no earlier LOOKUP is outstanding, so
        # it writes its table after their pooled vectors are durable. The checks and
        # index reads of the descriptors after an UPDATE run before that.
        cur = Signal(Descriptor)        # the descriptor of the turn's sequencer
        cur_update = Signal()
        t_held = Signal()
        t_rows = stream.Signature(ROW).create()
        t_status = stream.Signature(STATUS).create()
        opened = Signal()               # the turn's rows and status may go on
        upd_running = Signal()          # an UPDATE's rows went on; its writes not durable
        for k, s in enumerate(seqs):
            with m.If(eq_const(turn, k)):
                m.d.comb += [
                    cur.eq(s_desc[k]), t_held.eq(~s.i_desc.ready),
                    t_rows.valid.eq(s.o_rows.valid & opened),
                    t_rows.payload.eq(s.o_rows.payload),
                    s.o_rows.ready.eq(t_rows.ready & opened),
                    t_status.valid.eq(s.o_status.valid & opened),
                    t_status.payload.eq(s.o_status.payload),
                    s.o_status.ready.eq(t_status.ready & opened),
                ]
        m.d.comb += cur_update.eq(eq_const(cur.kind, DescKind.UPDATE.value))
        upd = Signal(Descriptor)        # the UPDATE whose items the scatter applies
        route_update = Signal()         # the gather's lines go to the scatter
        start_grad = Signal()
        m.d.sync += start_grad.eq(0)
        with m.If(t_held & ~opened & ~upd_running):
            m.d.sync += [opened.eq(1), route_update.eq(cur_update)]
            with m.If(cur_update):
                m.d.sync += [upd.eq(cur), start_grad.eq(1), upd_running.eq(1)]
        # An UPDATE that failed its checks has no rows, so the scatter never reports.
        with m.If((scatter.o_done.valid & scatter.o_done.ready)
                  | (t_status.valid & t_status.ready & cur_update
                     & t_status.payload.status.any())):
            m.d.sync += upd_running.eq(0)
        with m.If(t_status.valid & t_status.ready):
            m.d.sync += [opened.eq(0),
                         turn.eq(Mux(eq_const(turn, n_seq - 1), 0, add(turn, 1, len(turn))))]
        with m.If(go & serialising):
            m.d.sync += serial.eq(1)
        with m.Elif(done & eq_const(outstanding, 1) & ~go):
            m.d.sync += serial.eq(0)

        m.d.comb += [
            ckpt.accept.eq(go),
            ckpt.complete.eq(done),
            ckpt.quiet.eq(~outstanding.any() & ~fetch.busy & undo_drained & ~f.valid),
            logger.log_base.eq(recovery.log_base),
            logger.log_slots_log2.eq(recovery.log_slots_log2),
            logger.slot_lines.eq(recovery.slot_lines),
        ]
        wiring.connect(m, gather.o_undo, logger.i_undo)

        # --- the sequencer's rows: to the gather (LOOKUP), or to the gather (counted
        # rows only: it reads them ahead for the update) and the gradient feed (UPDATE),
        # each side taking an item once.
        # The feed's side goes through a FIFO, so that the gather reads rows ahead of the
        # update by up to _GRAD_ROWS rows rather than by the one the fork holds.
        rows = t_rows
        m.submodules.grad_rows = grad_rows = SyncFIFOBuffered(width=ROW.size,
                                                              depth=_GRAD_ROWS)
        took_g = Signal()
        took_f = Signal()
        skip_g = cur_update & rows.p.empty_bag
        g_ok = took_g | skip_g | gather.i_rows.ready
        f_ok = took_f | grad_rows.w_rdy
        m.d.comb += [
            gather.i_rows.payload.eq(rows.payload),
            grad_rows.w_data.eq(rows.payload),
            gather.i_rows.valid.eq(rows.valid & ~took_g & ~skip_g),
            grad_rows.w_en.eq(rows.valid & cur_update & ~took_f),
            rows.ready.eq(Mux(cur_update, g_ok & f_ok, gather.i_rows.ready)),
            grad.i_rows.payload.eq(grad_rows.r_data),
            grad.i_rows.valid.eq(grad_rows.r_rdy),
            grad_rows.r_en.eq(grad.i_rows.ready),
        ]
        # The feed learns that the UPDATE's rows are over once the FIFO has handed it
        # the last one (the status that ends them comes after the last row's transfer).
        grad_fin = Signal()
        with m.If(comp.upd_finish):
            m.d.sync += grad_fin.eq(1)
        with m.Elif(~grad_rows.level.any()):
            m.d.sync += grad_fin.eq(0)
        with m.If(rows.valid & cur_update):
            with m.If(g_ok & f_ok):
                m.d.sync += [took_g.eq(0), took_f.eq(0)]
            with m.Else():
                m.d.sync += [took_g.eq(g_ok), took_f.eq(f_ok)]
        def lines_per_row(desc, name):
            """Table lines per row, and fp32 / bf16 lines per vector, of ``desc``."""
            fp32 = Signal(9, name=f"{name}_lpr_fp32")
            bf16 = Signal(9, name=f"{name}_lpr_bf16")
            table = Signal(9, name=f"{name}_lpr")
            m.d.comb += [fp32.eq(_ceil_div_pow2(desc.dim, 4, 9)),
                         bf16.eq(_ceil_div_pow2(desc.dim, 5, 9)),
                         table.eq(Mux(desc.bf16, bf16, fp32))]
            return table, fp32, bf16

        lpr, _, _ = lines_per_row(cur, "cur")
        upd_lpr, upd_fp32, upd_bf16 = lines_per_row(upd, "upd")
        gc = gather.i_ctrl
        m.d.comb += [
            gc.table_base.eq(cur.table_base[:aw]),
            gc.lines_per_row.eq(lpr),
            gc.batch_id.eq(cur.batch_id),
            gc.table_id.eq(cur.table_id),
            gc.capture.eq(cur.capture_undo & ~cur_update),
            gc.pool.mode.eq(cur.mode),
            gc.pool.weighted.eq(cur.weighted),
            gc.pool.bf16.eq(cur.bf16),
            gc.pool.lines_per_row.eq(lpr),
        ]
        lines = gather.o_lines
        m.d.comb += [
            pool.i_lines.payload.eq(lines.payload),
            pool.i_lines.valid.eq(lines.valid & ~route_update),
            scatter.i_lines.payload.data.eq(lines.payload.data),
            scatter.i_lines.valid.eq(lines.valid & route_update),
            lines.ready.eq(Mux(route_update, scatter.i_lines.ready, pool.i_lines.ready)),
            pool.i_ctrl.eq(lines.payload.ctrl),
        ]
        wiring.connect(m, pool.o_pooled, comp.i_pooled)

        sc = scatter.i_ctrl
        m.d.comb += [
            grad.start.eq(start_grad),
            grad.data_addr.eq(upd.data_addr[:aw]),
            grad.num_bags.eq(upd.num_bags),
            grad.glines.eq(upd_fp32),
            grad.items.eq(Mux(upd.bf16, Cat(C(0, 1), upd_bf16), upd_fp32)),
            grad.finish.eq(grad_fin & (~grad_rows.level.any())),
            sc.table_base.eq(upd.table_base[:aw]),
            sc.lines_per_row.eq(upd_lpr),
            sc.bf16.eq(upd.bf16),
            sc.weighted.eq(upd.weighted),
            sc.dim.eq(upd.dim),
        ]
        wiring.connect(m, grad.o_items, scatter.i_items)
        wiring.connect(m, scatter.o_done, comp.i_done)

        # --- statuses and completion ------------------------------------------------------
        m.d.comb += [
            status_q.w_en.eq(t_status.valid),
            status_q.w_data.eq(t_status.payload),
            t_status.ready.eq(status_q.w_rdy),
            comp.i_status.valid.eq(status_q.r_rdy),
            comp.i_status.payload.eq(status_q.r_data),
            status_q.r_en.eq(comp.i_status.ready),
            comp.i_info.valid.eq(info_q.r_rdy),
            comp.i_info.payload.eq(info_q.r_data),
            info_q.r_en.eq(comp.i_info.ready),
            self.head.eq(comp.head),
        ]

        # --- status, errors, events -------------------------------------------------------
        axi = self.pmem
        size = Signal(RING_ORDER_MAX + 1)
        m.d.comb += size.eq(Cat(*[eq_const(self.ring_order, i) for i in range(RING_ORDER_MAX)],
                                at_least(self.ring_order, RING_ORDER_MAX)))
        pending = Signal(32)
        m.d.comb += pending.eq(sub(self.tail, comp.head, 32))
        m.d.comb += [
            self.busy.eq(fetch.busy | outstanding.any()),
            self.in_flight.eq(outstanding),
            self.serial.eq(serial),
            self.undo_stall.eq(gather.undo_stall),
            self.err_desc.eq(done & comp.status.any()),
            self.err_seq.eq(comp.seq),
            self.err_info.eq(Cat(comp.status, comp.kind)),
            self.err_overrun.eq(pending > zext(size, 32)),
            self.err_pmem.eq((axi.rvalid & axi.rready & axi.rresp.any())
                             | (axi.bvalid & axi.bready & axi.bresp.any())),
            self.ev_desc_done.eq(done),
            self.ev_line_gathered.eq(gather.o_lines.valid & gather.o_lines.ready
                                     & ~gather.o_lines.payload.empty_bag & ~route_update),
            self.ev_bag_pooled.eq(comp.bag_written),
            self.ev_upd_line_written.eq(scatter.pmem.awvalid & scatter.pmem.awready),
            self.ev_upd_item.eq(grad.o_items.valid & grad.o_items.ready
                                & ~grad.o_items.payload.nop),
            self.ev_busy.eq(outstanding.any()),
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
        return m
