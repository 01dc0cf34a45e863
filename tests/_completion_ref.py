"""The completion stage as it was before it was split into components: a test-only
reference that ``tests/test_completion_equivalence.py`` runs side by side with
:class:`hw.engine.completion.Completion` (not shipped under ``hw/``)."""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.arith.fp32 import at_least
from hw.bus.axi import AXI4Signature, AxiBurst
from hw.cxl.cache_agent import WR_REQ, WR_RSP
from hw.engine.bag_sequencer import STATUS
from hw.engine.desc_fetch import RING_ORDER_MAX, slot_mask
from hw.engine.descriptor import ADDR_BITS
from hw.engine.pool_reduce import POOLED
from hw.engine.scatter_update import DONE

__all__ = ["CompletionRef"]

_LINE_BITS = 512
_LINE_SHIFT = 6

#: What the completion stage keeps of a dispatched descriptor (in ring order).
INFO = data.StructLayout({
    "seq": 32,
    "kind": 8,
    "table_id": 16,
    "batch_id": 32,
    "cookie": 64,
    "pre_status": 8,        # the status when ``via_seq`` is 0
    "via_seq": 1,           # checked (and executed) through the bag sequencer
    "lookup": 1,
    "update": 1,
    "num_bags": 32,
    "data_addr": ADDR_BITS,  # LOOKUP: pooled output
    "dim": 13,
    "bf16": 1,
    "commit": 1,            # COMMIT with checkpointing on: write ``commit_word`` first
    "commit_word": 64,      # docs/checkpoint.md: {committed, epoch, 0xC0DE}
})

#: The 64-byte completion record (``docs/embedding.md``).
RECORD = data.StructLayout({
    "status": 8,
    "kind": 8,
    "rsvd0": 16,
    "seq": 32,
    "batch_id": 32,
    "table_id": 16,
    "rsvd1": 16,
    "cookie": 64,
    "bags": 32,
    "rows_written": 32,
    "updates": 32,
    "rsvd2": _LINE_BITS - 288,
})


#: Width of the write / B counters (modular; far more than the writes in flight).
_COUNT_BITS = 16
#: Descriptors whose record is written but whose B has not arrived yet.
_DONE_DEPTH = 8
_DONE = data.StructLayout({"target": _COUNT_BITS, "host_target": _COUNT_BITS, "status": 8,
                           "seq": 32, "kind": 8})

#: Byte address of the checkpoint commit word (superblock line 1, bytes 0..7).
_COMMIT_WORD_ADDR = 64


class CompletionRef(wiring.Component):
    """Completes dispatched descriptors strictly in order.

    For each ``i_info`` entry (pushed at dispatch):

    * a descriptor not executed by the bag sequencer (``via_seq`` = 0) completes with
      ``pre_status``;
    * otherwise the bag sequencer's status (``i_status``, one per such descriptor, in
      order) decides: a non-zero status completes it at once (the sequencer checks
      everything before it emits a row, so no pooled line and no update exists for it);
    * a LOOKUP that passed writes ``num_bags`` pooled vectors from ``i_pooled`` to
      ``data_addr`` onwards, one line per single-beat write, the bytes at or past
      ``dim`` elements zeroed, and completes once every vector is written;
    * an UPDATE that passed pulses ``upd_finish`` (its rows have all been handed on)
      and completes when ``i_done`` reports the scatter's write-back.

    Pooled lines are drained as they come, before the status (which the sequencer sends
    after its last row): holding them would stall the gather behind the status. They
    belong to the entry at the head: a later LOOKUP's lines cannot arrive before this
    one's status, since the later one is dispatched to the sequencer only after that
    status has left it, and its rows then take a PMEM read before they pool.

    A COMMIT with ``commit`` set first writes ``commit_word`` to the superblock's commit
    word (bytes 64..71, ``wstrb`` on those eight bytes only; ``docs/checkpoint.md``).

    Then the completion record (:data:`RECORD`) is written to ``cq_base + (seq mod
    2**order) * 64`` and the next descriptor starts at once. Every write uses AXI ID 0,
    so B responses arrive in write order: once the B count reaches the record's write,
    every write of the descriptor and the record are durable, the head advances and
    ``complete`` pulses with the status, seq and kind (up to ``_DONE_DEPTH``
    descriptors wait for their record's B this way). B responses other than OKAY pulse
    ``resp_error``.

    With ``cq_host`` (``COH_CTRL.CQ_HOST``) the record goes instead to GPU memory, line
    ``cq_host_line + slot``, as a write request on ``o_rec`` (the CXL.cache agent's
    ItoMWr, answered on ``i_rec`` in request order). The descriptor then completes once
    the B count has reached its last PMEM write *and* the answer count has reached its
    record: the two paths answer independently, so each has its own count. A record
    answered with ``error`` completes the descriptor all the same (the agent flags
    WRITE_ERROR). ``cq_host`` may change only while the stage is idle.
    """

    def __init__(self, *, addr_width: int, id_width: int):
        self._addr_width = addr_width
        super().__init__({
            "i_info": In(stream.Signature(INFO)),
            "i_status": In(stream.Signature(STATUS)),
            "i_pooled": In(stream.Signature(POOLED)),
            "i_done": In(stream.Signature(DONE)),
            "cq_base": In(addr_width),
            "cq_host": In(1),
            "cq_host_line": In(46),
            "o_rec": Out(stream.Signature(WR_REQ)),
            "i_rec": In(stream.Signature(WR_RSP)),
            "ring_order": In(5),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=_LINE_BITS,
                                      id_width=id_width)),
            "upd_finish": Out(1),
            "head": Out(32),
            "complete": Out(1),
            "status": Out(8),       # with ``complete``
            "seq": Out(32),         # with ``complete``
            "kind": Out(8),         # with ``complete``
            "bag_written": Out(1),
            "busy": Out(1),
            "resp_error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        axi = self.pmem
        info = Signal(INFO)
        got = Signal()                  # the sequencer's status is in ``status``
        status = Signal(8)
        bags = Signal(32)
        rows_written = Signal(32)
        updates = Signal(32)
        out_addr = Signal(aw)
        w_count = Signal(_COUNT_BITS)   # writes loaded (modulo 2**_COUNT_BITS)
        b_count = Signal(_COUNT_BITS)   # B responses received
        m.submodules.done_q = done_q = SyncFIFOBuffered(width=_DONE.size, depth=_DONE_DEPTH)
        aw_pend, w_pend = Signal(), Signal()
        awaddr = Signal(aw)
        wdata = Signal(_LINE_BITS)
        wstrb = Signal(_LINE_BITS // 8)

        can_load = Signal()
        load = Signal()                 # a write goes into the AW/W registers
        m.d.comb += [
            can_load.eq((~aw_pend | axi.awready) & (~w_pend | axi.wready)),
            axi.awvalid.eq(aw_pend),
            axi.awaddr.eq(awaddr),
            axi.awid.eq(0),
            axi.awlen.eq(0),
            axi.awsize.eq(_LINE_SHIFT),
            axi.awburst.eq(AxiBurst.INCR),
            axi.wvalid.eq(w_pend),
            axi.wdata.eq(wdata),
            axi.wstrb.eq(wstrb),
            axi.wlast.eq(1),
            axi.bready.eq(1),
            axi.rready.eq(1),
            self.resp_error.eq(axi.bvalid & axi.bresp.any()),   # not OKAY
        ]
        with m.If(axi.awready):
            m.d.sync += aw_pend.eq(0)
        with m.If(axi.wready):
            m.d.sync += w_pend.eq(0)
        with m.If(load):
            m.d.sync += [aw_pend.eq(1), w_pend.eq(1)]
        with m.If(load):
            m.d.sync += w_count.eq(w_count + 1)
        with m.If(axi.bvalid):
            m.d.sync += b_count.eq(b_count + 1)
        # Records written into GPU memory (cq_host) and their answers.
        hw_count = Signal(_COUNT_BITS)
        hb_count = Signal(_COUNT_BITS)
        rec = self.o_rec
        m.d.comb += self.i_rec.ready.eq(1)
        with m.If(rec.ready):
            m.d.sync += rec.valid.eq(0)
        with m.If(self.i_rec.valid):
            m.d.sync += hb_count.eq(hb_count + 1)

        # --- a pooled line, its padding bytes zeroed: byte k of vector line j is kept
        # iff 64 * j + k < dim * element bytes, i.e. j < full, or j == full and k < part.
        pooled = self.i_pooled
        full = Signal(8)                # whole lines of a pooled vector
        part = Signal(_LINE_SHIFT)      # bytes of its last, partial line
        line = pooled.p.line
        # at_least folds ``part > 63``, constant for 6 bits (Verilator's CMPCONST).
        keep = [(line < full) | ((line == full) & at_least(part, k + 1))
                for k in range(_LINE_BITS // 8)]
        masked = Cat(*[pooled.p.data[8 * k:8 * k + 8] & keep[k].replicate(8)
                       for k in range(_LINE_BITS // 8)])

        # --- the completion record
        record = Signal(RECORD)
        m.d.comb += [
            record.status.eq(status),
            record.kind.eq(info.kind),
            record.seq.eq(info.seq),
            record.batch_id.eq(info.batch_id),
            record.table_id.eq(info.table_id),
            record.cookie.eq(info.cookie),
            record.bags.eq(bags),
            record.rows_written.eq(rows_written),
            record.updates.eq(updates),
        ]
        mask = slot_mask(m, self.ring_order, "cq_mask")
        slot = Signal(RING_ORDER_MAX)
        m.d.comb += slot.eq(info.seq[:RING_ORDER_MAX] & mask)
        rec_addr = Signal(aw)
        m.d.comb += rec_addr.eq((self.cq_base & ~C(0x3F, aw)) + (slot << _LINE_SHIFT))

        st = self.i_status
        error_now = st.valid & ~got & st.p.status.any()
        ok_now = st.valid & ~got & ~st.p.status.any()
        passed = got & ~status.any()
        head_r = Signal(32)
        entry = _DONE(done_q.w_data)
        m.d.comb += [
            self.head.eq(head_r),
            entry.target.eq(Mux(self.cq_host, w_count,     # B count once every write's
                                w_count + 1)),              # B (the record's, in PMEM)
            entry.host_target.eq(Mux(self.cq_host, hw_count + 1, hw_count)),
            entry.status.eq(status),
            entry.seq.eq(info.seq),
            entry.kind.eq(info.kind),
        ]

        new = self.i_info.payload
        vec_bytes = Signal(15)          # bytes of a pooled vector: dim * 2 or dim * 4
        m.d.comb += vec_bytes.eq(Mux(new.bf16, Cat(C(0, 1), new.dim, C(0, 1)),
                                     Cat(C(0, 2), new.dim)))

        with m.FSM(init="IDLE") as fsm:
            with m.State("IDLE"):
                m.d.comb += self.i_info.ready.eq(1)
                with m.If(self.i_info.valid):
                    m.d.sync += [
                        info.eq(self.i_info.payload),
                        got.eq(0),
                        status.eq(self.i_info.payload.pre_status),
                        bags.eq(0),
                        rows_written.eq(0),
                        updates.eq(0),
                        out_addr.eq(self.i_info.payload.data_addr[:aw]),
                        full.eq(vec_bytes[_LINE_SHIFT:_LINE_SHIFT + 8]),
                        part.eq(vec_bytes[:_LINE_SHIFT]),
                    ]
                    m.next = "WAIT"
            with m.State("WAIT"):
                with m.If(~info.via_seq & info.commit):
                    m.next = "COMMIT"
                with m.Elif(~info.via_seq):
                    m.next = "REC"
                with m.Elif(error_now):
                    m.d.comb += st.ready.eq(1)
                    m.d.sync += [got.eq(1), status.eq(st.p.status)]
                    m.next = "REC"
                with m.Else():
                    with m.If(ok_now):
                        m.d.comb += st.ready.eq(1)
                        m.d.sync += [got.eq(1), status.eq(0)]
                        m.d.comb += self.upd_finish.eq(info.update)
                    with m.If(info.lookup):
                        more = bags != info.num_bags
                        with m.If(passed & ~more):
                            m.next = "REC"
                        with m.Elif(more & can_load):
                            m.d.comb += [pooled.ready.eq(1), load.eq(pooled.valid)]
                            with m.If(pooled.valid):
                                m.d.sync += [
                                    awaddr.eq(out_addr),
                                    wdata.eq(masked),
                                    wstrb.eq(C((1 << (_LINE_BITS // 8)) - 1, _LINE_BITS // 8)),
                                    out_addr.eq(out_addr + (1 << _LINE_SHIFT)),
                                ]
                                with m.If(pooled.p.last):
                                    m.d.comb += self.bag_written.eq(1)
                                    m.d.sync += bags.eq(bags + 1)
                    with m.If(info.update & passed):
                        m.d.comb += self.i_done.ready.eq(1)
                        with m.If(self.i_done.valid):
                            m.d.sync += [
                                rows_written.eq(self.i_done.p.rows_written),
                                updates.eq(self.i_done.p.updates),
                            ]
                            m.next = "REC"
            with m.State("COMMIT"), m.If(can_load):
                m.d.comb += load.eq(1)
                m.d.sync += [awaddr.eq(_COMMIT_WORD_ADDR), wdata.eq(info.commit_word),
                             wstrb.eq(C(0xFF, _LINE_BITS // 8))]
                m.next = "REC"
            with m.State("REC"):
                with m.If(self.cq_host & (~rec.valid | rec.ready) & done_q.w_rdy):
                    m.d.comb += done_q.w_en.eq(1)
                    m.d.sync += [rec.valid.eq(1),
                                 rec.p.address.eq(self.cq_host_line + slot),
                                 rec.p.data.eq(record),
                                 rec.p.tag.eq(0),
                                 hw_count.eq(hw_count + 1)]
                    m.next = "IDLE"
                with m.Elif(~self.cq_host & can_load & done_q.w_rdy):
                    # The record is the descriptor's last write; all writes use one AXI
                    # ID, so its B arrives after every earlier one: the descriptor is
                    # complete when the B count reaches it. Meanwhile the next
                    # descriptor proceeds.
                    m.d.comb += [load.eq(1), done_q.w_en.eq(1)]
                    m.d.sync += [awaddr.eq(rec_addr), wdata.eq(record),
                                 wstrb.eq(C((1 << (_LINE_BITS // 8)) - 1, _LINE_BITS // 8))]
                    m.next = "IDLE"

        # --- completion in order, when the record's B has arrived -------------------------
        head_entry = _DONE(done_q.r_data)
        reached = Signal()
        # Reached when the counts' difference, modulo 2**_COUNT_BITS, is not negative.
        m.d.comb += reached.eq(~(b_count - head_entry.target)[_COUNT_BITS - 1]
                               & ~(hb_count - head_entry.host_target)[_COUNT_BITS - 1])
        m.d.comb += [
            done_q.r_en.eq(reached),
            self.complete.eq(done_q.r_rdy & reached),
            self.status.eq(head_entry.status),
            self.seq.eq(head_entry.seq),
            self.kind.eq(head_entry.kind),
        ]
        with m.If(self.complete):
            m.d.sync += head_r.eq(head_r + 1)

        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | done_q.r_rdy | (w_count != b_count)
                                 | (hw_count != hb_count))
        return m
