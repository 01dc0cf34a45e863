"""The arithmetic of the LOOKUP gather-reduce: P partial accumulators per bag, their
left-to-right combination, mean division and bf16 rounding."""

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.arith import Fp32ToBf16, FpAdd, FpDiv, FpMax, FpMul
from hw.arith.fp32 import lzc, shift_left
from hw.config import LINE_BITS

from .descriptor import PoolMode

__all__ = ["CTRL", "LINE", "POOLED", "PoolReduce"]

#: fp32 elements of a line.
LINE_ELEMS = LINE_BITS // 32

#: Per-descriptor settings, sampled with every ``i_lines`` transfer.
CTRL = data.StructLayout({
    "mode": 2,              # PoolMode: 0 sum, 1 mean, 2 max
    "weighted": 1,          # multiply every row by its weight (sum only)
    "bf16": 1,              # the table (and the pooled output) is bf16
    "lines_per_row": 9,     # table lines per row, 1..max_lines_per_row
})

#: One line of one counted row of a bag, or an empty bag.
LINE = data.StructLayout({
    "data": LINE_BITS,
    "line": 8,              # line of the row, 0..lines_per_row-1, in order
    "row_k": 16,            # index of the row among the bag's counted rows
    "last_row": 1,          # row_k == count - 1
    "weight": 32,           # fp32, used when weighted
    "empty_bag": 1,         # a lone item standing for a bag with no counted row
    "count": 16,            # the bag's counted rows n (for mean)
    "ctrl": CTRL,           # the descriptor's settings (a bag's are those of its last line)
    "update": 1,            # an UPDATE's line (for the scatter, not pooled; not read here)
})

#: One line of a pooled vector.
POOLED = data.StructLayout({
    "data": LINE_BITS,
    "line": 8,
    "last": 1,              # the bag's final line
})

_FP32_ONE = 0x3F80_0000


class PoolReduce(wiring.Component):
    """Pools the counted rows of bags into one vector per bag (sum, mean or max).

    Rows arrive line by line in index order (``i_lines``); the pooled vector of each
    bag leaves line by line, bags in input order (``o_pooled``). The result is bit for
    bit the contract of ``docs/embedding.md`` ("Pooling: the accumulation order"):
    row ``k`` goes to partial ``p = k mod P``, which starts at +0.0 (sum, mean) or -inf
    (max) when ``k < P`` and becomes ``fl(s_p + x_k)`` / ``maximum(m_p, x_k)``, with
    ``x_k = fl(w_k * row_k)`` when weighted; at the end of the bag the partials are
    combined left to right, the mean is divided by ``n`` (:class:`~hw.arith.FpDiv`,
    correctly rounded), and a bf16 table's result is rounded to bf16
    (:class:`~hw.arith.Fp32ToBf16`). A bag with no counted row pools to +0.0. NaN
    results are the canonical quiet NaN (``docs/numerics.md``).

    **Datapath.** A line is ``16 / lanes`` *beats* of ``lanes`` fp32 elements. A bf16
    line holds 32 elements, i.e. two fp32 lines' worth: it is widened (exactly: 16 zero
    bits appended to each element) and processed as ``2 * 16 / lanes`` beats, elements
    in order, so bf16 table line ``j`` occupies accumulator lines ``2j`` (elements
    0..15) and ``2j + 1`` (elements 16..31). Every beat is an operation through a
    fixed, never-stalling pipeline: :class:`~hw.arith.FpMul` (by the weight, or by 1.0
    when unweighted: ``fl(1 * x)`` is ``x`` bit for bit except that a NaN becomes the
    canonical NaN, which no later step can tell apart, since a NaN operand makes every
    add, maximum and division the canonical NaN), then the partial's accumulator line is
    read from
    its memory (one :class:`~amaranth.lib.memory.Memory` per partial, ``lanes * 32``
    bits wide, ``max_lines_per_row * 16 / lanes`` deep, synchronous read, read data
    registered before the arithmetic), :class:`~hw.arith.FpAdd` or
    :class:`~hw.arith.FpMax`, and written back. A partial that is fresh (``row_k < P``)
    is not read: the operation starts from +0.0 / -inf, so memories are never cleared.

    At the end of the bag (after the last beat of the row with ``last_row``), input
    stalls while the same pipeline combines the partials: with ``Q = min(n, P)``,
    rounds ``r = 1 .. Q-1`` compute ``acc_0 = op(acc_0, acc_r)`` over every beat of the
    row, the last round sending its results to the output instead of memory (with
    ``Q <= 1`` one round sends ``op(acc_0, identity)``, which is ``acc_0``; an empty bag
    sends ``op(+0, identity) = +0``). Partials ``p >= n`` are skipped, which is exact:
    a sum partial that was never -0 plus +0, or the maximum with -inf, is the other
    operand bit for bit. The outputs pass an output FIFO, the dividers (mean:
    ``lanes`` :class:`~hw.arith.FpDiv`, in lockstep, by ``float(n)``; other modes bypass
    them, in order), the bf16 rounding (``lanes`` :class:`~hw.arith.Fp32ToBf16`; fp32
    results are carried past unchanged) and a packer that assembles output lines.

    **Throughput and latency** (``B = 16 / lanes`` beats per fp32 line, ``S = B`` for
    fp32 and ``2B`` for bf16 tables, ``A = 3`` the adder latency). Accumulation takes
    one beat per cycle (one line per cycle at ``lanes = 16`` for fp32) whenever
    ``P * lines_per_row * S >= A = 3``: an operation reads its accumulator line two
    cycles before its operands meet the adder, and the results of the operations issued
    3 to 5 cycles before it, whose write-backs that read misses, are forwarded to it
    from the adder's output and two registers behind it; a beat whose line was updated
    by one of the two operations just before it waits (a read-after-write stall), so
    e.g. one-line rows with ``P = 2`` run at 2 lines per 3 cycles. Per bag, input then
    stalls for the combination: ``max(Q - 1, 1)`` rounds of ``lines_per_row * S``
    cycles each, a round waiting for the previous round's result of the same line when
    ``lines_per_row * S < 3`` (so at least 3 cycles a round): a bag of 8 one-line fp32
    rows with ``P = 4`` takes 15 cycles from its first row to the next bag's. The last
    round issues one beat per cycle while the output keeps up (a 10-entry output FIFO,
    reserved at issue); for mean the dividers take one beat
    every ``ceil(25 / div_bits_per_cycle) + 1`` cycles (6 at the default), which paces
    that round once the FIFO is full. From the issue of a final-round beat to its output
    line: 10 cycles (6 of pipeline, 2 in the output FIFO, 1 of bf16 rounding, the output
    register), plus the divider latency ``ceil(25/k) + 3`` for mean. Measured at
    ``lanes = 16``, fp32, P = 4, ready sink: a bag of 8 rows of 10 lines takes 80 cycles
    of input, then input stalls 30 cycles; its first output line leaves 32 cycles and its
    last 41 cycles after its last input line (mean: 40 and 94). Results do not depend on
    input idle cycles or output backpressure: every stall only delays operations, whose
    order is fixed.

    **Streams and reset.** ``o_pooled.valid`` and its payload are registers that hold
    until the transfer; ``i_lines.ready`` depends combinationally on internal state
    only (never on ``o_pooled.ready``). Synchronous reset drops every bag in progress.

    **Control.** Each line carries its descriptor's settings in ``ctrl``; a bag's
    settings are those of its last line. The input
    contract: each bag's counted rows arrive in order ``row_k = 0 .. count-1``, each
    as lines ``0 .. lines_per_row-1``, ``last_row`` on the row ``count - 1``, ``count``
    the same on every item of the bag; an empty bag is a single item with
    ``empty_bag = 1`` (its other fields but ``ctrl`` are ignored). Weighted pooling is
    legal with sum only (as in the contract; the block multiplies regardless).
    ``lines_per_row`` must be at most ``max_lines_per_row`` for fp32 tables and
    ``max_lines_per_row // 2`` for bf16 tables: both are ``dim <= 16 *
    max_lines_per_row`` elements. The output's padding elements (past ``dim``) hold the
    pooled padding of the input rows; the writer masks them.

    Parameters
    ----------
    lanes : int
        fp32 elements processed per cycle: 4, 8 or 16 (default 16, one line per cycle).
    partials : int
        ``P``, partial accumulators per element, 1 to 8 (default 4); must equal the
        descriptor contract's ``reduce_partials``.
    max_lines_per_row : int
        1 to 256 (default 64): sizes the accumulators, ``P x max_lines_per_row`` fp32
        lines of 512 bits.
    div_bits_per_cycle : int
        Quotient bits per cycle of the mean dividers (``FpDiv``'s ``k``), 1 to 25
        (default 5).

    Members
    -------
    i_lines : ``In(stream.Signature(LINE))``
        Lines of counted rows, in index order, or empty bags, each with its
        descriptor's ``mode``, ``weighted``, ``bf16``, ``lines_per_row`` in ``ctrl``.
    o_pooled : ``Out(stream.Signature(POOLED))``
        Pooled vectors in the table's dtype and line layout; ``line`` counts from 0 in
        each bag, ``last`` marks a bag's final line.

    Raises
    ------
    ValueError
        If a parameter is not an integer in its range.
    """

    i_lines: In(stream.Signature(LINE))
    o_pooled: Out(stream.Signature(POOLED))

    def __init__(self, *, lanes: int = 16, partials: int = 4, max_lines_per_row: int = 64,
                 div_bits_per_cycle: int = 5):
        def is_int(value):
            return isinstance(value, int) and not isinstance(value, bool)

        if not is_int(lanes) or lanes not in (4, 8, 16):
            raise ValueError(f"lanes must be 4, 8 or 16, not {lanes!r}")
        if not is_int(partials) or not 1 <= partials <= 8:
            raise ValueError(f"partials must be an integer from 1 to 8, not {partials!r}")
        if not is_int(max_lines_per_row) or not 1 <= max_lines_per_row <= 256:
            raise ValueError(f"max_lines_per_row must be an integer from 1 to 256, "
                             f"not {max_lines_per_row!r}")
        if not is_int(div_bits_per_cycle) or not 1 <= div_bits_per_cycle <= 25:
            raise ValueError(f"div_bits_per_cycle must be an integer from 1 to 25, "
                             f"not {div_bits_per_cycle!r}")
        self._lanes = lanes
        self._partials = partials
        self._max_lines_per_row = max_lines_per_row
        self._div_bits_per_cycle = div_bits_per_cycle
        super().__init__()

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def partials(self) -> int:
        return self._partials

    @property
    def max_lines_per_row(self) -> int:
        return self._max_lines_per_row

    @property
    def div_bits_per_cycle(self) -> int:
        return self._div_bits_per_cycle

    @property
    def beats_per_line(self) -> int:
        """Cycles one fp32 line takes (a bf16 line takes twice as many)."""
        return LINE_ELEMS // self._lanes

    def elaborate(self, platform):
        m = Module()
        lanes, parts = self._lanes, self._partials
        beats = self.beats_per_line
        width = 32 * lanes
        depth = self._max_lines_per_row * beats
        addr_bits = max(1, (depth - 1).bit_length())
        beat_bits = (beats - 1).bit_length()            # log2(B): fp32 beat index
        mem_bits = max(1, (parts - 1).bit_length())

        muls = [FpMul() for _ in range(lanes)]
        adds = [FpAdd() for _ in range(lanes)]
        maxs = [FpMax() for _ in range(lanes)]
        divs = [FpDiv(bits_per_cycle=self._div_bits_per_cycle) for _ in range(lanes)]
        rnds = [Fp32ToBf16() for _ in range(lanes)]
        for name, units in (("mul", muls), ("add", adds), ("max", maxs), ("div", divs),
                            ("bf16", rnds)):
            for lane, unit in enumerate(units):
                m.submodules[f"{name}{lane}"] = unit

        # --- the operation pipeline: stage j holds an operation issued j + 1 cycles ago
        mul_lat, add_lat, max_lat = muls[0].latency, adds[0].latency, maxs[0].latency
        # The accumulator read is issued from stage mul_lat - 3 so that its registered
        # data meets the product at the adder's input (stage mul_lat - 1).
        assert mul_lat >= 3 and max_lat <= add_lat
        read_at, operand_at = mul_lat - 3, mul_lat - 1
        result_at = operand_at + add_lat
        # An operation's result reaches the adder's input of operations issued add_lat
        # cycles after it or later (by the write-back, or forwarded below): anything
        # issued closer to it may not use what it writes.
        window = result_at - operand_at - 1

        op_layout = data.StructLayout({
            "valid": 1,
            "addr": addr_bits,
            # Operand a (the running value): accumulator a_mem, else +0 (a_zero) or the
            # identity; operand b (the term): accumulator b_mem, the identity, or the product.
            "a_read": 1, "a_zero": 1, "a_mem": mem_bits,
            "b_read": 1, "b_identity": 1, "b_mem": mem_bits,
            "max": 1,
            "write": 1, "w_mem": mem_bits,
            # Final-round operations: their result goes to the output.
            "final": 1, "last": 1, "line_end": 1, "mean": 1, "bf16": 1, "n": 32,
        })
        ops = [Signal(op_layout, name=f"op{j}") for j in range(result_at + 1)]
        issue_op = Signal(op_layout)
        issue = Signal()
        m.d.sync += ops[0].eq(issue_op)
        for j in range(1, len(ops)):
            m.d.sync += ops[j].eq(ops[j - 1])

        # Accumulators: one memory per partial, addressed by beat of the row.
        mems = [Memory(shape=width, depth=depth, init=[]) for _ in range(parts)]
        reads, writes = [], []
        for p, mem in enumerate(mems):
            m.submodules[f"acc{p}"] = mem
            reads.append(mem.read_port())
            writes.append(mem.write_port())

        for rp in reads:
            m.d.comb += rp.addr.eq(ops[read_at].addr)
        rd = ops[read_at + 1]
        # Read data registered before the arithmetic (block RAM timing).
        a_data = Signal(width, reset_less=True)
        b_data = Signal(width, reset_less=True)
        m.d.sync += [a_data.eq(reads[0].data), b_data.eq(reads[0].data)]
        for p in range(1, parts):
            with m.If(rd.a_mem == p):
                m.d.sync += a_data.eq(reads[p].data)
            with m.If(rd.b_mem == p):
                m.d.sync += b_data.eq(reads[p].data)

        opd = ops[operand_at]
        identity = Cat(C(0, 23), opd.max.replicate(9))        # -inf or +0
        results = Signal(width)
        res = ops[result_at]

        # Forwarding. An operation reads its accumulator lines ``operand_at - read_at``
        # (two) cycles before they meet the adder, so it misses the write-backs of the
        # operations issued add_lat (3) to add_lat + 2 cycles before it: their results
        # are taken instead as they leave the adder, or from one of as many registers as
        # that read-ahead that keep them for the cycles after (the newest result of a
        # line wins). Only the operations issued closer than add_lat before it are still
        # in the adder when it needs them (``hazard`` below).
        fwd_layout = data.StructLayout({"valid": 1, "addr": addr_bits, "w_mem": mem_bits})
        now = Signal(fwd_layout, name="fwd0")
        m.d.comb += [now.valid.eq(res.valid & res.write), now.addr.eq(res.addr),
                     now.w_mem.eq(res.w_mem)]
        fwd = [(now, results)]
        for k in range(1, operand_at - read_at + 1):
            meta_k = Signal(fwd_layout, name=f"fwd{k}")
            data_k = Signal(width, name=f"fwd{k}_data", reset_less=True)
            m.d.sync += [meta_k.eq(fwd[-1][0]), data_k.eq(fwd[-1][1])]
            fwd.append((meta_k, data_k))

        def forwarded(mem_sel, stored, name):
            """``stored`` (the memory's line for partial ``mem_sel``) or the newest
            result for it not yet visible there."""
            value = stored
            for meta_k, data_k in reversed(fwd):          # the oldest first, newest last
                hit = meta_k.valid & (meta_k.addr == opd.addr) & (meta_k.w_mem == mem_sel)
                value = Mux(hit, data_k, value)
            out = Signal(width, name=name)
            m.d.comb += out.eq(value)
            return out
        a_line = forwarded(opd.a_mem, a_data, "a_line")
        b_line = forwarded(opd.b_mem, b_data, "b_line")
        for lane in range(lanes):
            part = slice(32 * lane, 32 * lane + 32)
            a = Mux(opd.a_read, a_line[part], Mux(opd.a_zero, C(0, 32), identity))
            b = Mux(opd.b_read, b_line[part],
                    Mux(opd.b_identity, identity, muls[lane].o_result.payload))
            max_out = maxs[lane].o_result.payload
            for k in range(add_lat - max_lat):
                delayed = Signal(32, name=f"max{lane}_delay{k}", reset_less=True)
                m.d.sync += delayed.eq(max_out)
                max_out = delayed
            # Only the unit of the bag's mode sees the operands (operand isolation: the
            # other one does not toggle).
            for unit, use in ((adds[lane], ~opd.max), (maxs[lane], opd.max)):
                m.d.comb += [
                    unit.i_operands.valid.eq(opd.valid & use),
                    unit.o_result.ready.eq(1),
                ]
                with m.If(opd.valid & use):
                    m.d.comb += [unit.i_operands.p.a.eq(a), unit.i_operands.p.b.eq(b)]
            m.d.comb += [
                muls[lane].o_result.ready.eq(1),
                results[part].eq(Mux(res.max, max_out, adds[lane].o_result.payload)),
            ]

        for p, wp in enumerate(writes):
            m.d.comb += [
                wp.addr.eq(res.addr),
                wp.data.eq(results),
                wp.en.eq(res.valid & res.write & (res.w_mem == p)),
            ]

        # --- output side: FIFO (space reserved at issue), dividers, bf16, packer
        fifo_depth = result_at + 5
        entry = data.StructLayout({"data": width, "last": 1, "line_end": 1, "mean": 1,
                                   "bf16": 1, "n": 32})
        fifo = m.submodules.fifo = SyncFIFOBuffered(width=entry.size, depth=fifo_depth)
        m.d.comb += [
            fifo.w_en.eq(res.valid & res.final),
            fifo.w_data.eq(Cat(results, res.last, res.line_end, res.mean, res.bf16, res.n)),
        ]
        head = data.View(entry, fifo.r_data)
        reserved = Signal(range(fifo_depth + 1))
        pop = Signal()
        with m.If((issue & issue_op.final) & ~pop):
            m.d.sync += reserved.eq(reserved + 1)
        with m.Elif(pop & ~(issue & issue_op.final)):
            m.d.sync += reserved.eq(reserved - 1)

        self._elaborate_input(m, issue=issue, issue_op=issue_op, ops=ops, window=window,
                              credit=reserved != fifo_depth, muls=muls,
                              addr_bits=addr_bits, beat_bits=beat_bits, mem_bits=mem_bits)
        self._elaborate_output(m, fifo=fifo, head=head, pop=pop, divs=divs, rnds=rnds)
        return m

    def _elaborate_input(self, m, *, issue, issue_op, ops, window, credit, muls,
                         addr_bits, beat_bits, mem_bits):
        """The input register, the combination sequencer and the issue decision."""
        lanes, parts, beats = self._lanes, self._partials, self.beats_per_line
        width = 32 * lanes
        i = self.i_lines

        # Input register: one item, consumed beat by beat.
        cur = Signal(LINE, reset_less=True)
        ctrl = Signal(CTRL, reset_less=True)
        cur_valid = Signal()
        beat = Signal(beat_bits + 1)                     # 0 .. S-1
        part = Signal(mem_bits)                          # row_k mod P
        # Partial of the next row: counted along the rows (row_k = 0, 1, 2, ...).
        next_part = Mux(part == parts - 1, 0, part + 1) if parts > 1 else 0

        # The bag being combined.
        combining = Signal()
        bag_max = Signal()
        bag_mean = Signal()
        bag_bf16 = Signal()
        bag_empty = Signal()
        bag_multi = Signal()                             # Q >= 2: partials to combine
        bag_rounds = Signal(mem_bits)                    # max(Q - 1, 1)
        bag_last = Signal(addr_bits)                     # lines_per_row * S - 1
        bag_n = Signal(32)                               # float(n), 1.0 for an empty bag
        round_ = Signal(mem_bits)
        addr = Signal(addr_bits)

        is_max = ctrl.mode == PoolMode.MAX.value
        beat_last = Mux(ctrl.bf16, beat == 2 * beats - 1, beat == beats - 1)
        row_done = cur.line + 1 == ctrl.lines_per_row
        bag_done = cur.last_row & row_done & beat_last
        fresh = cur.row_k < parts

        # Elements of this beat, widened to fp32.
        terms = Signal(width)
        with m.Switch(beat):
            for s in range(2 * beats):
                with m.Case(s):
                    bf16 = cur.data[16 * lanes * s:16 * lanes * (s + 1)]
                    wide = Cat(*(Cat(C(0, 16), bf16[16 * e:16 * e + 16]) for e in range(lanes)))
                    fp32 = cur.data[width * s:width * (s + 1)] if s < beats else C(0, width)
                    m.d.comb += terms.eq(Mux(ctrl.bf16, wide, fp32))
        weight = Mux(ctrl.weighted, cur.weight, _FP32_ONE)
        for lane, mul in enumerate(muls):
            m.d.comb += [
                mul.i_operands.valid.eq(issue),
                mul.i_operands.p.a.eq(terms[32 * lane:32 * lane + 32]),
                mul.i_operands.p.b.eq(weight),
            ]

        def join(low: int, low_bits: int, high):
            return Cat(C(low, low_bits), high) if low_bits else high

        # The candidate operation.
        cand_valid = Signal()
        need_a = issue_op.a_read
        need_b = issue_op.b_read
        with m.If(combining):
            final = round_ == bag_rounds
            line_end = Mux(bag_bf16, addr[:beat_bits + 1].all(),
                           addr[:beat_bits].all() if beat_bits else C(1, 1))
            m.d.comb += [
                cand_valid.eq(1),
                issue_op.addr.eq(addr),
                issue_op.a_read.eq(~bag_empty),
                issue_op.a_zero.eq(bag_empty),
                issue_op.a_mem.eq(0),
                issue_op.b_read.eq(bag_multi),
                issue_op.b_identity.eq(~bag_multi),
                issue_op.b_mem.eq(round_),
                issue_op.max.eq(bag_max),
                issue_op.write.eq(~final),
                issue_op.w_mem.eq(0),
                issue_op.final.eq(final),
                issue_op.last.eq(final & (addr == bag_last)),
                issue_op.line_end.eq(line_end),
                issue_op.mean.eq(bag_mean),
                issue_op.bf16.eq(bag_bf16),
                issue_op.n.eq(bag_n),
            ]
        with m.Else():
            acc_addr = Mux(ctrl.bf16, Cat(beat[:beat_bits + 1], cur.line),
                           Cat(beat[:beat_bits], cur.line))
            m.d.comb += [
                cand_valid.eq(cur_valid & ~cur.empty_bag),
                issue_op.addr.eq(acc_addr[:addr_bits]),
                issue_op.a_read.eq(~fresh),
                issue_op.a_mem.eq(part),
                issue_op.max.eq(is_max),
                issue_op.write.eq(1),
                issue_op.w_mem.eq(part),
            ]

        # Read-after-write: wait while a younger operation writes what this one reads.
        hazard = Signal()
        conflicts = []
        for op in ops[:window]:
            conflicts.append(op.valid & op.write & (op.addr == issue_op.addr)
                             & ((need_a & (op.w_mem == issue_op.a_mem))
                                | (need_b & (op.w_mem == issue_op.b_mem))))
        m.d.comb += [
            hazard.eq(Cat(*conflicts).any()),
            issue.eq(cand_valid & ~hazard & (~issue_op.final | credit)),
            issue_op.valid.eq(issue),
        ]

        # Bag settings: captured with every accumulate operation and with an empty bag.
        take_empty = ~combining & cur_valid & cur.empty_bag
        consume = take_empty | (~combining & issue & beat_last)
        count = cur.count
        lz = lzc(m, count, "n_lz")
        norm = shift_left(m, count, lz, "n_norm")
        exp = (~lz[:4] + 127)[:8]                        # 127 + msb; n >= 1
        multi = count >= 2 if parts > 1 else C(0, 1)
        rounds = Mux(count >= parts, parts - 1,
                     Mux(multi, (count[:mem_bits] - 1)[:mem_bits], 1)) if parts > 1 else 1
        lines_less_one = (ctrl.lines_per_row - 1)[:8]
        with m.If(take_empty | (~combining & issue)):
            m.d.sync += [
                bag_max.eq(is_max),
                bag_mean.eq(ctrl.mode == PoolMode.MEAN.value),
                bag_bf16.eq(ctrl.bf16),
                bag_empty.eq(cur.empty_bag),
                bag_multi.eq(multi & ~cur.empty_bag),
                bag_rounds.eq(Mux(cur.empty_bag, 1, rounds)),
                bag_last.eq(Mux(ctrl.bf16, join(2 * beats - 1, beat_bits + 1, lines_less_one),
                                join(beats - 1, beat_bits, lines_less_one))[:len(bag_last)]),
                bag_n.eq(Mux(cur.empty_bag, _FP32_ONE,
                             Cat(C(0, 8), norm[:15], exp, C(0, 1)))),
            ]

        with m.If(take_empty | (~combining & issue & bag_done)):
            m.d.sync += [combining.eq(1), round_.eq(1), addr.eq(0)]
        with m.Elif(combining & issue):
            with m.If(addr == bag_last):
                m.d.sync += addr.eq(0)
                with m.If(issue_op.final):
                    m.d.sync += combining.eq(0)
                with m.Else():
                    m.d.sync += round_.eq(round_ + 1)
            with m.Else():
                m.d.sync += addr.eq(addr + 1)

        m.d.comb += i.ready.eq(~cur_valid | consume)
        with m.If(i.valid & i.ready):
            m.d.sync += [cur_valid.eq(1), cur.eq(i.payload), ctrl.eq(i.p.ctrl), beat.eq(0)]
            with m.If(~i.p.empty_bag):
                with m.If(~i.p.row_k.any()):
                    m.d.sync += part.eq(0)
                with m.Elif(~i.p.line.any()):
                    m.d.sync += part.eq(next_part)
        with m.Elif(consume):
            m.d.sync += cur_valid.eq(0)
        with m.Elif(~combining & issue):
            m.d.sync += beat.eq(beat + 1)

    def _elaborate_output(self, m, *, fifo, head, pop, divs, rnds):
        """Mean division (in order with the bypassing modes), bf16 rounding, packing."""
        lanes, beats = self._lanes, self.beats_per_line
        width = 32 * lanes
        o = self.o_pooled

        # Dividers: a mean entry enters them; any other passes them by, but only when
        # they are empty, so that entries stay in order.
        flags = data.StructLayout({"last": 1, "line_end": 1, "bf16": 1})
        side = m.submodules.div_flags = SyncFIFO(width=flags.size, depth=4)
        in_div = Signal(range(5))
        from_div = in_div != 0
        side_head = data.View(flags, side.r_data)

        entry = data.StructLayout({"data": width, "last": 1, "line_end": 1, "bf16": 1})
        stage = Signal(entry)
        stage_valid = Signal()
        stage_ready = rnds[0].i_operands.ready
        div_in = fifo.r_rdy & head.mean & side.w_rdy
        div_take = div_in & divs[0].i_operands.ready
        div_out = from_div & stage_ready & divs[0].o_result.valid
        bypass = ~from_div & fifo.r_rdy & ~head.mean & stage_ready
        for lane, div in enumerate(divs):
            part = slice(32 * lane, 32 * lane + 32)
            m.d.comb += [
                div.i_operands.valid.eq(div_in),
                div.i_operands.p.a.eq(head.data[part]),
                div.i_operands.p.b.eq(head.n),
                div.o_result.ready.eq(from_div & stage_ready),
            ]
        m.d.comb += [
            side.w_en.eq(div_take),
            side.w_data.eq(Cat(head.last, head.line_end, head.bf16)),
            side.r_en.eq(div_out),
            pop.eq(div_take | bypass),
            fifo.r_en.eq(div_take | bypass),
        ]
        with m.If(div_take & ~div_out):
            m.d.sync += in_div.eq(in_div + 1)
        with m.Elif(div_out & ~div_take):
            m.d.sync += in_div.eq(in_div - 1)
        with m.If(from_div):
            m.d.comb += [
                stage_valid.eq(divs[0].o_result.valid),
                stage.data.eq(Cat(*(div.o_result.payload for div in divs))),
                stage.last.eq(side_head.last),
                stage.line_end.eq(side_head.line_end),
                stage.bf16.eq(side_head.bf16),
            ]
        with m.Else():
            m.d.comb += [
                stage_valid.eq(fifo.r_rdy & ~head.mean),
                stage.data.eq(head.data),
                stage.last.eq(head.last),
                stage.line_end.eq(head.line_end),
                stage.bf16.eq(head.bf16),
            ]

        # bf16 rounding: the units' one register stage, mirrored for the fp32 values and
        # the flags (it loads exactly when the units' output registers do).
        beat = Signal(entry, reset_less=True)
        with m.If(stage_ready):
            m.d.sync += beat.eq(stage)
        beat_valid = rnds[0].o_result.valid
        for lane, rnd in enumerate(rnds):
            m.d.comb += [
                rnd.i_operands.valid.eq(stage_valid),
                rnd.i_operands.p.a.eq(stage.data[32 * lane:32 * lane + 32]),
            ]
        narrow = Cat(*(rnd.o_result.payload for rnd in rnds))

        # Packer: a line is B fp32 beats or 2B bf16 beats of 16 * lanes bits each.
        chunk = 16 * lanes
        buf = Signal(LINE_BITS, reset_less=True)
        pos = Signal(range(2 * beats))
        out_line = Signal(8)
        merged = Signal(LINE_BITS)
        for c in range(2 * beats):
            here = Mux(beat.bf16, pos == c, pos == c // 2)
            value = Mux(beat.bf16, narrow, beat.data[chunk * (c % 2):chunk * (c % 2 + 1)])
            m.d.comb += merged[chunk * c:chunk * (c + 1)].eq(
                Mux(here, value, buf[chunk * c:chunk * (c + 1)]))
        beat_ready = ~beat.line_end | ~o.valid | o.ready
        for rnd in rnds:
            m.d.comb += rnd.o_result.ready.eq(beat_ready)
        with m.If(beat_valid & beat_ready):
            m.d.sync += [buf.eq(merged), pos.eq(Mux(beat.line_end, 0, pos + 1))]
            with m.If(beat.line_end):
                m.d.sync += [
                    o.valid.eq(1),
                    o.p.data.eq(merged),
                    o.p.line.eq(out_line),
                    o.p.last.eq(beat.last),
                    out_line.eq(Mux(beat.last, 0, out_line + 1)),
                ]
            with m.Elif(o.ready):
                m.d.sync += o.valid.eq(0)
        with m.Elif(o.ready):
            m.d.sync += o.valid.eq(0)
