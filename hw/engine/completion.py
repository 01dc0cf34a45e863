"""Completion: writes LOOKUP's pooled vectors, then every descriptor's completion
record, in ring order, and advances the completion head once both are durable."""

from amaranth.hdl import C, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature
from hw.config import LINE_BITS
from hw.cxl.cache_agent import WR_REQ, WR_RSP
from hw.cxl.messages import LINE_ADDR_BITS

from .bag_sequencer import STATUS
from .desc_fetch import RING_ORDER_MAX, slot_mask
from .descriptor import ADDR_BITS, Status
from .done_queue import DONE_DEPTH, DoneQueue
from .line_writer import COUNT_BITS, LineWriter
from .pool_reduce import POOLED
from .pooled_mask import PooledMask
from .update_layouts import DONE

__all__ = ["INFO", "RECORD", "Completion"]

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
    "rsvd2": LINE_BITS - 288,
})


#: The bits of :data:`RECORD` below ``rsvd2`` (the rest is zero), as records wait for
#: their turn to go into GPU memory.
_RECORD_BITS = RECORD["rsvd2"].offset

#: Byte address of the checkpoint commit word (superblock line 1, bytes 0..7).
_COMMIT_WORD_ADDR = 64


class Completion(wiring.Component):
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
    * an UPDATE that passed completes when ``i_done`` reports the scatter's
      write-back;
    * a LOOKUP or UPDATE that passed but whose status has ``read_error`` (a read of its
      buffers failed in pass 2), or whose ``i_done`` has it (the scatter wrote nothing),
      runs as above and completes with ``READ_ERROR``.

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
    ``complete`` pulses with the status, seq and kind (up to ``DONE_DEPTH``
    descriptors wait for their record's B this way). B responses other than OKAY pulse
    ``resp_error``.

    With ``scratch_host`` (``COH_CTRL.SCRATCH_HOST``) the pooled lines go instead to GPU
    memory, line ``scratch_host_line + data_addr // 64`` onwards, as write requests on
    ``o_rec`` counted as the host-side records are (below).

    With ``cq_host`` (``COH_CTRL.CQ_HOST``) the record goes instead to GPU memory, line
    ``cq_host_line + slot``, as a write request on ``o_rec`` (the CXL.cache agent's
    ItoMWr, answered on ``i_rec`` in request order), and only once the descriptor's
    writes are done: the B count has reached its last PMEM write (durable) and the
    answer count its last pooled line in GPU memory. A record in GPU memory is therefore
    a completion, and the GPU may poll its own memory for it instead of ``ENG_HEAD``
    (its data follows the pooled lines' data on the same channel, so the GPU sees them
    first). The descriptor completes (``head``, ``complete``) once the record's own
    write is answered. The two paths answer independently, so each has its own count.
    Records are written in ring order; the record of a later descriptor waits for an
    earlier one's. A record or pooled line answered with ``error`` completes the
    descriptor all the same (the agent flags WRITE_ERROR). ``cq_host`` and
    ``scratch_host`` may change only while the stage is idle.

    **Structure.** An FSM (``IDLE``, ``WAIT``, ``COMMIT``, ``REC``) takes the entries
    and builds the records; :class:`~.pooled_mask.PooledMask` zeroes the pooled lines'
    padding, :class:`~.line_writer.LineWriter` makes and counts every PMEM write, and
    :class:`~.done_queue.DoneQueue` completes the descriptors in order. With
    ``cq_host`` a record waits in a FIFO beside its ``DoneQueue`` entry until the entry's
    writes are done, is then written into GPU memory (before any pooled line waiting in
    the same cycle), and its entry moves to a second ``DoneQueue`` that completes it
    when the record's answer arrives; up to ``DONE_DEPTH`` descriptors wait in each.
    """

    def __init__(self, *, addr_width: int, id_width: int):
        self._addr_width = addr_width
        self._id_width = id_width
        super().__init__({
            "i_info": In(stream.Signature(INFO)),
            "i_status": In(stream.Signature(STATUS)),
            "i_pooled": In(stream.Signature(POOLED)),
            "i_done": In(stream.Signature(DONE)),
            "cq_base": In(addr_width),
            "cq_host": In(1),
            "cq_host_line": In(LINE_ADDR_BITS),
            "scratch_host": In(1),
            "scratch_host_line": In(LINE_ADDR_BITS),
            "o_rec": Out(stream.Signature(WR_REQ)),
            "i_rec": In(stream.Signature(WR_RSP)),
            "ring_order": In(5),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
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
        m.submodules.mask = mask = PooledMask()
        m.submodules.writer = writer = LineWriter(addr_width=aw, id_width=self._id_width)
        m.submodules.done_q = done_q = DoneQueue()
        # cq_host: records waiting for their descriptor's writes, then for their answer.
        m.submodules.rec_q = rec_q = SyncFIFOBuffered(width=_RECORD_BITS, depth=DONE_DEPTH)
        m.submodules.answer_q = answer_q = DoneQueue()
        wiring.connect(m, wiring.flipped(self.i_pooled), mask.i_line)
        wiring.connect(m, writer.pmem, wiring.flipped(self.pmem))
        info = Signal(INFO)
        got = Signal()                  # the sequencer's status is in ``status``
        status = Signal(8)
        read_err = Signal()             # a read of its buffers failed after the checks
        final = Signal(8)               # the status completed with
        m.d.comb += final.eq(Mux(read_err & ~status.any(), Status.READ_ERROR.value, status))
        bags = Signal(32)
        rows_written = Signal(32)
        updates = Signal(32)
        out_addr = Signal(aw)
        # Records written into GPU memory (cq_host) and their answers.
        hw_count = Signal(COUNT_BITS)
        hb_count = Signal(COUNT_BITS)
        rec = self.o_rec
        m.d.comb += self.i_rec.ready.eq(1)
        with m.If(rec.ready):
            m.d.sync += rec.valid.eq(0)
        with m.If(self.i_rec.valid):
            m.d.sync += hb_count.eq(hb_count + 1)

        # --- the completion record and where it goes
        record = Signal(RECORD)
        m.d.comb += [
            record.status.eq(final),
            record.kind.eq(info.kind),
            record.seq.eq(info.seq),
            record.batch_id.eq(info.batch_id),
            record.table_id.eq(info.table_id),
            record.cookie.eq(info.cookie),
            record.bags.eq(bags),
            record.rows_written.eq(rows_written),
            record.updates.eq(updates),
        ]
        slots = slot_mask(m, self.ring_order, "cq_mask")
        slot = Signal(RING_ORDER_MAX)
        m.d.comb += slot.eq(info.seq[:RING_ORDER_MAX] & slots)
        rec_addr = Signal(aw)
        m.d.comb += rec_addr.eq((self.cq_base & ~C(0x3F, aw)) + (slot << _LINE_SHIFT))
        entry = done_q.i_entry.p
        m.d.comb += [
            done_q.b_count.eq(writer.b_count),
            done_q.hb_count.eq(hb_count),
            entry.target.eq(Mux(self.cq_host, writer.w_count,   # B count once every
                                writer.w_count + 1)),           # write's B (the record's)
            entry.host_target.eq(hw_count),
            entry.status.eq(final),
            entry.seq.eq(info.seq),
            entry.kind.eq(info.kind),
        ]

        wr = writer.i_write

        def write(addr, line, strb):
            m.d.comb += [wr.valid.eq(1), wr.p.addr.eq(addr), wr.p.data.eq(line),
                         wr.p.strb.eq(strb)]

        # cq_host: once a descriptor's writes are done, its record goes into GPU memory
        # (taking o_rec from the pooled lines for the cycle) and its entry waits for the
        # record's answer in answer_q.
        queued = Signal(RECORD)
        m.d.comb += queued.eq(rec_q.r_data)
        rec_go = Signal()
        m.d.comb += [
            rec_go.eq(self.cq_host & done_q.reached & rec_q.r_rdy & answer_q.i_entry.ready
                      & (~rec.valid | rec.ready)),
            done_q.advance.eq(~self.cq_host | rec_go),
            rec_q.r_en.eq(rec_go),
            answer_q.b_count.eq(writer.b_count),
            answer_q.hb_count.eq(hb_count),
            answer_q.i_entry.valid.eq(rec_go),
            answer_q.i_entry.p.target.eq(writer.b_count),           # reached already
            answer_q.i_entry.p.host_target.eq(hw_count + 1),        # the record's answer
            answer_q.i_entry.p.status.eq(done_q.status),
            answer_q.i_entry.p.seq.eq(done_q.seq),
            answer_q.i_entry.p.kind.eq(done_q.kind),
        ]
        with m.If(rec_go):
            m.d.sync += [rec.valid.eq(1),
                         rec.p.address.eq(self.cq_host_line
                                          + (queued.seq[:RING_ORDER_MAX] & slots)),
                         rec.p.data.eq(queued), rec.p.tag.eq(0),
                         hw_count.eq(hw_count + 1)]

        ones = (1 << (LINE_BITS // 8)) - 1
        st, pooled, new = self.i_status, mask.o_line, self.i_info.payload
        error_now = st.valid & ~got & st.p.status.any()
        ok_now = st.valid & ~got & ~st.p.status.any()
        passed = got & ~status.any()
        m.d.comb += [mask.dim.eq(new.dim), mask.bf16.eq(new.bf16)]
        with m.FSM(init="IDLE") as fsm:
            with m.State("IDLE"):
                m.d.comb += [self.i_info.ready.eq(1), mask.load.eq(self.i_info.valid)]
                with m.If(self.i_info.valid):
                    m.d.sync += [info.eq(new), got.eq(0), status.eq(new.pre_status),
                                 read_err.eq(0),
                                 bags.eq(0), rows_written.eq(0), updates.eq(0),
                                 out_addr.eq(new.data_addr[:aw])]
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
                        m.d.sync += [got.eq(1), status.eq(0), read_err.eq(st.p.read_error)]
                    with m.If(info.lookup):
                        more = bags != info.num_bags
                        with m.If(passed & ~more):
                            m.next = "REC"
                        with m.Elif(more & self.scratch_host):
                            # into GPU memory: a write request on o_rec, counted there
                            m.d.comb += pooled.ready.eq((~rec.valid | rec.ready) & ~rec_go)
                            with m.If(pooled.valid & pooled.ready):
                                m.d.sync += [
                                    rec.valid.eq(1),
                                    rec.p.address.eq(self.scratch_host_line
                                                     + out_addr[_LINE_SHIFT:]),
                                    rec.p.data.eq(pooled.p.data), rec.p.tag.eq(0),
                                    hw_count.eq(hw_count + 1)]
                        with m.Elif(more):
                            m.d.comb += pooled.ready.eq(wr.ready)
                            with m.If(pooled.valid):
                                write(out_addr, pooled.p.data, ones)
                        with m.If(more & pooled.valid & pooled.ready):
                            m.d.sync += out_addr.eq(out_addr + (1 << _LINE_SHIFT))
                            with m.If(pooled.p.last):
                                m.d.comb += self.bag_written.eq(1)
                                m.d.sync += bags.eq(bags + 1)
                    with m.If(info.update & passed):
                        m.d.comb += self.i_done.ready.eq(1)
                        with m.If(self.i_done.valid):
                            m.d.sync += [rows_written.eq(self.i_done.p.rows_written),
                                         updates.eq(self.i_done.p.updates),
                                         read_err.eq(read_err | self.i_done.p.read_error)]
                            m.next = "REC"
            with m.State("COMMIT"):
                write(_COMMIT_WORD_ADDR, info.commit_word, 0xFF)
                with m.If(wr.ready):
                    m.next = "REC"
            with m.State("REC"):
                with m.If(self.cq_host):
                    # The record waits beside its entry until the writes are done.
                    m.d.comb += [done_q.i_entry.valid.eq(rec_q.w_rdy),
                                 rec_q.w_en.eq(done_q.i_entry.ready),
                                 rec_q.w_data.eq(record.as_value()[:_RECORD_BITS])]
                    with m.If(done_q.i_entry.valid & done_q.i_entry.ready):
                        m.next = "IDLE"
                with m.Else():
                    # The record is the descriptor's last write; all writes use one AXI
                    # ID, so its B arrives after every earlier one: the descriptor is
                    # complete when the B count reaches it. Meanwhile the next
                    # descriptor proceeds.
                    m.d.comb += done_q.i_entry.valid.eq(wr.ready)
                    with m.If(done_q.i_entry.ready):
                        write(rec_addr, record, ones)
                    with m.If(done_q.i_entry.valid & done_q.i_entry.ready):
                        m.next = "IDLE"

        m.d.comb += [
            self.complete.eq(Mux(self.cq_host, answer_q.complete, done_q.complete)),
            self.status.eq(Mux(self.cq_host, answer_q.status, done_q.status)),
            self.seq.eq(Mux(self.cq_host, answer_q.seq, done_q.seq)),
            self.kind.eq(Mux(self.cq_host, answer_q.kind, done_q.kind)),
            self.resp_error.eq(writer.resp_error),
            self.busy.eq(~fsm.ongoing("IDLE") | done_q.pending | answer_q.pending
                         | (writer.w_count != writer.b_count) | (hw_count != hb_count)),
        ]
        with m.If(self.complete):
            m.d.sync += self.head.eq(self.head + 1)
        return m
