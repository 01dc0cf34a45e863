"""Completion: writes LOOKUP's pooled vectors, then every descriptor's completion
record, in ring order, and advances the completion head once both are durable."""

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.arith.fp32 import add, at_least, sub
from hw.bus.axi import AXI4Signature, AxiBurst

from .bag_sequencer import STATUS
from .desc_fetch import RING_ORDER_MAX, slot_mask
from .descriptor import ADDR_BITS
from .pool_reduce import POOLED
from .scatter_update import DONE

__all__ = ["INFO", "RECORD", "Completion"]

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

(_IDLE, _WAIT, _REC, _REC_B) = range(4)


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
    * an UPDATE that passed pulses ``upd_finish`` (its rows have all been handed on)
      and completes when ``i_done`` reports the scatter's write-back.

    Pooled lines are drained as they come, before the status (which the sequencer sends
    after its last row): holding them would stall the gather behind the status. They
    belong to the entry at the head: a later LOOKUP's lines cannot arrive before this
    one's status, since the later one is dispatched to the sequencer only after that
    status has left it, and its rows then take a PMEM read before they pool.

    Then the completion record (:data:`RECORD`) is written to ``cq_base + (seq mod
    2**order) * 64``; once every write of the descriptor and the record has its B, the
    head advances and ``complete`` pulses with the status. B responses other than OKAY
    pulse ``resp_error``.
    """

    def __init__(self, *, addr_width: int, id_width: int):
        self._addr_width = addr_width
        super().__init__({
            "i_info": In(stream.Signature(INFO)),
            "i_status": In(stream.Signature(STATUS)),
            "i_pooled": In(stream.Signature(POOLED)),
            "i_done": In(stream.Signature(DONE)),
            "cq_base": In(addr_width),
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
        state = Signal(range(_REC_B + 1))
        got = Signal()                  # the sequencer's status is in ``status``
        status = Signal(8)
        bags = Signal(32)
        rows_written = Signal(32)
        updates = Signal(32)
        out_addr = Signal(aw)
        b_out = Signal(16)              # writes without their B yet
        aw_pend, w_pend = Signal(), Signal()
        awaddr = Signal(aw)
        wdata = Signal(_LINE_BITS)

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
            axi.wstrb.eq((1 << (_LINE_BITS // 8)) - 1),
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
        with m.If(load & ~axi.bvalid):
            m.d.sync += b_out.eq(add(b_out, 1, 16))
        with m.Elif(~load & axi.bvalid):
            m.d.sync += b_out.eq(sub(b_out, 1, 16))

        # --- a pooled line, its padding bytes zeroed: byte k of vector line j is kept
        # iff 64 * j + k < dim * element bytes, i.e. j < full, or j == full and k < part.
        pooled = self.i_pooled
        full = Signal(8)                # whole lines of a pooled vector
        part = Signal(_LINE_SHIFT)      # bytes of its last, partial line
        line = pooled.p.line
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
        m.d.comb += rec_addr.eq(add(self.cq_base & ~C(0x3F, aw),
                                    Cat(C(0, _LINE_SHIFT), slot)[:aw], aw))

        st = self.i_status
        error_now = st.valid & ~got & st.p.status.any()
        ok_now = st.valid & ~got & ~st.p.status.any()
        passed = got & ~status.any()
        head_r = Signal(32)
        m.d.comb += [
            self.head.eq(head_r),
            self.status.eq(status),
            self.seq.eq(info.seq),
            self.kind.eq(info.kind),
        ]

        new = self.i_info.payload
        vec_bytes = Signal(15)          # bytes of a pooled vector: dim * 2 or dim * 4
        m.d.comb += vec_bytes.eq(Mux(new.bf16, Cat(C(0, 1), new.dim, C(0, 1)),
                                     Cat(C(0, 2), new.dim)))

        with m.Switch(state):
            with m.Case(_IDLE):
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
                        state.eq(_WAIT),
                    ]
            with m.Case(_WAIT):
                with m.If(~info.via_seq):
                    m.d.sync += state.eq(_REC)
                with m.Elif(error_now):
                    m.d.comb += st.ready.eq(1)
                    m.d.sync += [got.eq(1), status.eq(st.p.status), state.eq(_REC)]
                with m.Else():
                    with m.If(ok_now):
                        m.d.comb += st.ready.eq(1)
                        m.d.sync += [got.eq(1), status.eq(0)]
                        m.d.comb += self.upd_finish.eq(info.update)
                    with m.If(info.lookup):
                        more = bags != info.num_bags
                        with m.If(passed & ~more):
                            m.d.sync += state.eq(_REC)
                        with m.Elif(more & can_load):
                            m.d.comb += [pooled.ready.eq(1), load.eq(pooled.valid)]
                            with m.If(pooled.valid):
                                m.d.sync += [
                                    awaddr.eq(out_addr),
                                    wdata.eq(masked),
                                    out_addr.eq(add(out_addr, 1 << _LINE_SHIFT, aw)),
                                ]
                                with m.If(pooled.p.last):
                                    m.d.comb += self.bag_written.eq(1)
                                    m.d.sync += bags.eq(add(bags, 1, 32))
                    with m.If(info.update & passed):
                        m.d.comb += self.i_done.ready.eq(1)
                        with m.If(self.i_done.valid):
                            m.d.sync += [
                                rows_written.eq(self.i_done.p.rows_written),
                                updates.eq(self.i_done.p.updates),
                                state.eq(_REC),
                            ]
            with m.Case(_REC), m.If(can_load):
                m.d.comb += load.eq(1)
                m.d.sync += [awaddr.eq(rec_addr), wdata.eq(record), state.eq(_REC_B)]
            with m.Case(_REC_B), m.If(~b_out.any() & ~aw_pend & ~w_pend):
                m.d.comb += self.complete.eq(1)
                m.d.sync += [head_r.eq(add(head_r, 1, 32)), state.eq(_IDLE)]

        m.d.comb += self.busy.eq(state.any() | b_out.any())
        return m
