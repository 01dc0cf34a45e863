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
    0..15) and ``2j + 1`` (elements 16..31). Two pipelines of the same stages do the
    work: the *accumulating* pipeline takes the rows, the *combining* pipeline the
    partials of the bag before, so a bag's combination overlaps the next bag's rows.
    The partials live in two banks (bags alternate between them) of one
    :class:`~amaranth.lib.memory.Memory` per partial (``lanes * 32`` bits wide,
    ``max_lines_per_row * 16 / lanes`` deep, synchronous read, read data registered
    before the arithmetic); a bank's ports serve whichever pipeline works on it (two
    operations issued in the same cycle are always for different banks, and the
    pipelines read and write at the same stages, so the ports never collide).

    Every beat of a row is an operation through the accumulating pipeline, which never
    stalls once issued: :class:`~hw.arith.FpMul` (by the weight, or by 1.0 when
    unweighted: ``fl(1 * x)`` is ``x`` bit for bit except that a NaN becomes the
    canonical NaN, which no later step can tell apart, since a NaN operand makes every
    add, maximum and division the canonical NaN), the partial's accumulator line read
    from its memory, :class:`~hw.arith.FpAdd` or :class:`~hw.arith.FpMax`, and the
    write-back. A partial that is fresh (``row_k < P``) is not read: the operation
    starts from +0.0 / -inf, so memories are never cleared.

    When the last beat of the row with ``last_row`` issues, the bag is handed over to
    the combining pipeline (its own adders and maximum units, no multiplier), which
    combines the partials of that bank: with ``Q = min(n, P)``, rounds ``r = 1 ..
    Q-1`` compute ``acc_0 = op(acc_0, acc_r)`` over every beat of the row, the last
    round sending its results to the output instead of memory (with ``Q <= 1`` one
    round sends ``op(acc_0, identity)``, which is ``acc_0``; an empty bag sends
    ``op(+0, identity) = +0``). Partials ``p >= n`` are skipped, which is exact: a sum
    partial that was never -0 plus +0, or the maximum with -inf, is the other operand
    bit for bit. The hand-over waits while the combining pipeline still has a bag
    (it frees in the cycle it issues that bag's last operation). The outputs pass an
    output FIFO, the dividers (mean: ``lanes`` :class:`~hw.arith.FpDiv`, in lockstep,
    by ``float(n)``; other modes bypass them, in order), the bf16 rounding (``lanes``
    :class:`~hw.arith.Fp32ToBf16`; fp32 results are carried past unchanged) and a
    packer that assembles output lines.

    **Throughput and latency** (``B = 16 / lanes`` beats per fp32 line, ``S = B`` for
    fp32 and ``2B`` for bf16 tables, ``L = lines_per_row``, ``A = 3`` the adder
    latency). Accumulation takes one beat per cycle (one line per cycle at
    ``lanes = 16`` for fp32) whenever ``P * L * S >= A = 3``: an operation reads its
    accumulator line two cycles before its operands meet the adder, and the results of
    the operations issued 3 to 5 cycles before it, whose write-backs that read misses,
    are forwarded to it from the adder's output and two registers behind it (the
    combining pipeline also takes the accumulating pipeline's results, so it can start
    on a bag the cycle after its last row); a beat whose line was updated by one of the
    two operations just before it waits (a read-after-write stall), so e.g. one-line
    rows with ``P = 2`` run at 2 lines per 3 cycles. Combining a bag takes
    ``C = (R - 1) * max(L * S, 3) + L * S`` cycles with ``R = max(Q - 1, 1)`` rounds (a
    round waits for the previous round's result of the same line). A stream of bags
    therefore takes ``max(n * L * S, C)`` cycles per bag: rows arrive at one beat per
    cycle across bag boundaries as long as each bag's rows take at least as long as
    the combination of the bag before (a bag of 20 four-line fp32 rows: 80 cycles
    against 12; 8 one-line rows: 8 against 7; a one-row bag of 4 lines: 4 against 4),
    else the last row of a bag waits for the combining pipeline (4 one-line rows, P = 4:
    7 cycles a bag). The last round issues one beat per cycle while the output keeps up
    (an output FIFO of 10 entries, reserved at issue); for mean the dividers take one
    beat every ``ceil(25 / div_bits_per_cycle) + 1`` cycles (6 at the default), which
    paces that round once the FIFO is full. From the issue of a final-round beat to its
    output line: 10 cycles (6 of pipeline, 2 in the output FIFO, 1 of bf16 rounding,
    the output register), plus the divider latency ``ceil(25/k) + 3`` for mean.
    Results do not depend on input idle cycles or output backpressure: every stall only
    delays operations, whose order is fixed.

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
        1 to 256 (default 64): sizes the accumulators, two banks of
        ``P x max_lines_per_row`` fp32 lines of 512 bits.
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
        divs = [FpDiv(bits_per_cycle=self._div_bits_per_cycle) for _ in range(lanes)]
        rnds = [Fp32ToBf16() for _ in range(lanes)]
        # Each pipeline has an adder and a maximum unit per lane.
        units = {pipe: ([FpAdd() for _ in range(lanes)], [FpMax() for _ in range(lanes)])
                 for pipe in ("acc", "comb")}
        for name, group in (("mul", muls), ("div", divs), ("bf16", rnds),
                            ("add", units["acc"][0]), ("max", units["acc"][1]),
                            ("comb_add", units["comb"][0]), ("comb_max", units["comb"][1])):
            for lane, unit in enumerate(group):
                m.submodules[f"{name}{lane}"] = unit

        # --- the two operation pipelines: stage j holds an operation issued j + 1
        # cycles ago. They have the same stages, so that two operations issued in the
        # same cycle (which always use different banks) read and write in the same cycles.
        add_lat, max_lat = units["acc"][0][0].latency, units["acc"][1][0].latency
        mul_lat = muls[0].latency
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
            "bank": 1,
            "addr": addr_bits,
            # Operand a (the running value): accumulator a_mem of the bank, else +0
            # (a_zero) or the identity; operand b (the term): the product (accumulating),
            # or accumulator b_mem or the identity (combining).
            "a_read": 1, "a_zero": 1, "a_mem": mem_bits,
            "b_read": 1, "b_mem": mem_bits,
            "max": 1,
            "write": 1, "w_mem": mem_bits,
            # Final-round operations: their result goes to the output.
            "final": 1, "last": 1, "line_end": 1, "mean": 1, "bf16": 1, "n": 32,
        })
        ops, issue_ops, issues, results = {}, {}, {}, {}
        for pipe in ("acc", "comb"):
            ops[pipe] = [Signal(op_layout, name=f"{pipe}_op{j}") for j in range(result_at + 1)]
            issue_ops[pipe] = Signal(op_layout, name=f"{pipe}_issue_op")
            issues[pipe] = Signal(name=f"{pipe}_issue")
            results[pipe] = Signal(width, name=f"{pipe}_results")
            m.d.sync += ops[pipe][0].eq(issue_ops[pipe])
            for j in range(1, len(ops[pipe])):
                m.d.sync += ops[pipe][j].eq(ops[pipe][j - 1])

        # Accumulators: two banks of one memory per partial, addressed by beat of the
        # row. A bank's ports serve the accumulating pipeline's operation when it is for
        # that bank, else the combining pipeline's.
        rd_acc, rd_comb = ops["acc"][read_at], ops["comb"][read_at]
        res_acc, res_comb = ops["acc"][result_at], ops["comb"][result_at]
        reads = []
        for bank in range(2):
            reads.append([])
            by_acc_rd = rd_acc.valid & (rd_acc.bank == bank)
            by_acc_wr = res_acc.valid & (res_acc.bank == bank)
            for p in range(parts):
                mem = m.submodules[f"bank{bank}_acc{p}"] = Memory(shape=width, depth=depth,
                                                                  init=[])
                rp, wp = mem.read_port(), mem.write_port()
                reads[bank].append(rp)
                m.d.comb += [
                    rp.addr.eq(Mux(by_acc_rd, rd_acc.addr, rd_comb.addr)),
                    wp.addr.eq(Mux(by_acc_wr, res_acc.addr, res_comb.addr)),
                    wp.data.eq(Mux(by_acc_wr, results["acc"], results["comb"])),
                    wp.en.eq(Mux(by_acc_wr, res_acc.write & (res_acc.w_mem == p),
                                 res_comb.valid & (res_comb.bank == bank) & res_comb.write
                                 & (res_comb.w_mem == p))),
                ]

        # Forwarding. An operation reads its accumulator lines ``operand_at - read_at``
        # (two) cycles before they meet the adder, so it misses the write-backs of the
        # operations issued add_lat (3) to add_lat + 2 cycles before it: their results
        # are taken instead as they leave the adder, or from one of as many registers as
        # that read-ahead that keep them for the cycles after (the newest result of a
        # line wins). Only the operations issued closer than add_lat before it are still
        # in the adder when it needs them (``hazard`` in ``_elaborate_control``).
        fwd_layout = data.StructLayout({"valid": 1, "bank": 1, "addr": addr_bits,
                                        "w_mem": mem_bits})
        chains = {}
        for pipe in ("acc", "comb"):
            res = ops[pipe][result_at]
            now = Signal(fwd_layout, name=f"{pipe}_fwd0")
            m.d.comb += [now.valid.eq(res.valid & res.write), now.bank.eq(res.bank),
                         now.addr.eq(res.addr), now.w_mem.eq(res.w_mem)]
            chain = [(now, results[pipe])]
            for k in range(1, operand_at - read_at + 1):
                meta_k = Signal(fwd_layout, name=f"{pipe}_fwd{k}")
                data_k = Signal(width, name=f"{pipe}_fwd{k}_data", reset_less=True)
                m.d.sync += [meta_k.eq(chain[-1][0]), data_k.eq(chain[-1][1])]
                chain.append((meta_k, data_k))
            chains[pipe] = chain

        products = [mul.o_result.payload for mul in muls]
        for mul in muls:
            m.d.comb += mul.o_result.ready.eq(1)
        # The accumulating pipeline reads only what it wrote itself since it took the
        # bank; the combining pipeline reads what either wrote (the bag's last rows).
        self._elaborate_datapath(m, "acc", ops["acc"], units["acc"], reads, [chains["acc"]],
                                 results["acc"], products=products, read_at=read_at,
                                 operand_at=operand_at, result_at=result_at)
        self._elaborate_datapath(m, "comb", ops["comb"], units["comb"], reads,
                                 [chains["acc"], chains["comb"]], results["comb"],
                                 products=None, read_at=read_at, operand_at=operand_at,
                                 result_at=result_at)

        # --- output side: FIFO (space reserved at issue), dividers, bf16, packer
        res = ops["comb"][result_at]
        fifo_depth = result_at + 5
        entry = data.StructLayout({"data": width, "last": 1, "line_end": 1, "mean": 1,
                                   "bf16": 1, "n": 32})
        fifo = m.submodules.fifo = SyncFIFOBuffered(width=entry.size, depth=fifo_depth)
        m.d.comb += [
            fifo.w_en.eq(res.valid & res.final),
            fifo.w_data.eq(Cat(results["comb"], res.last, res.line_end, res.mean, res.bf16,
                               res.n)),
        ]
        head = data.View(entry, fifo.r_data)
        reserved = Signal(range(fifo_depth + 1))
        pop = Signal()
        reserve = issues["comb"] & issue_ops["comb"].final
        with m.If(reserve & ~pop):
            m.d.sync += reserved.eq(reserved + 1)
        with m.Elif(pop & ~reserve):
            m.d.sync += reserved.eq(reserved - 1)

        self._elaborate_control(m, issues=issues, issue_ops=issue_ops, ops=ops, window=window,
                                credit=reserved != fifo_depth, muls=muls,
                                addr_bits=addr_bits, beat_bits=beat_bits, mem_bits=mem_bits)
        self._elaborate_output(m, fifo=fifo, head=head, pop=pop, divs=divs, rnds=rnds)
        return m

    def _elaborate_datapath(self, m, pipe, ops, units, reads, chains, results, *, products,
                            read_at, operand_at, result_at):
        """One pipeline's operands (memory read data, forwarded results, constants), its
        adders and maximum units, and ``results``. ``products`` are the accumulating
        pipeline's operand b per lane; the combining pipeline (``None``) reads it."""
        lanes, width = self._lanes, 32 * self._lanes
        adds, maxs = units
        add_lat, max_lat = adds[0].latency, maxs[0].latency

        # Read data registered before the arithmetic (block RAM timing).
        rd = ops[read_at + 1]
        a_data = Signal(width, name=f"{pipe}_a_data", reset_less=True)
        b_data = Signal(width, name=f"{pipe}_b_data", reset_less=True)
        for bank, ports in enumerate(reads):
            for p, rp in enumerate(ports):
                with m.If((rd.bank == bank) & (rd.a_mem == p)):
                    m.d.sync += a_data.eq(rp.data)
                if products is None:
                    with m.If((rd.bank == bank) & (rd.b_mem == p)):
                        m.d.sync += b_data.eq(rp.data)

        opd = ops[operand_at]
        identity = Cat(C(0, 23), opd.max.replicate(9))        # -inf or +0
        res = ops[result_at]

        def forwarded(mem_sel, stored, name):
            """``stored`` (the memory's line for partial ``mem_sel``) or the newest
            result for it not yet visible there (at most one pipeline wrote the bank
            in any one cycle)."""
            value = stored
            for k in reversed(range(len(chains[0]))):     # the oldest first, newest last
                for chain in chains:
                    meta_k, data_k = chain[k]
                    hit = (meta_k.valid & (meta_k.bank == opd.bank) & (meta_k.addr == opd.addr)
                           & (meta_k.w_mem == mem_sel))
                    value = Mux(hit, data_k, value)
            out = Signal(width, name=name)
            m.d.comb += out.eq(value)
            return out
        a_line = forwarded(opd.a_mem, a_data, f"{pipe}_a_line")
        b_line = forwarded(opd.b_mem, b_data, f"{pipe}_b_line") if products is None else None
        for lane in range(lanes):
            part = slice(32 * lane, 32 * lane + 32)
            a = Mux(opd.a_read, a_line[part], Mux(opd.a_zero, C(0, 32), identity))
            b = (products[lane] if products is not None
                 else Mux(opd.b_read, b_line[part], identity))
            max_out = maxs[lane].o_result.payload
            for k in range(add_lat - max_lat):
                delayed = Signal(32, name=f"{pipe}_max{lane}_delay{k}", reset_less=True)
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
            m.d.comb += results[part].eq(Mux(res.max, max_out, adds[lane].o_result.payload))

    def _elaborate_control(self, m, *, issues, issue_ops, ops, window, credit, muls,
                           addr_bits, beat_bits, mem_bits):
        """The input register and the accumulating pipeline's issue decision, the
        hand-over of a finished bag, and the combination sequencer."""
        lanes, parts, beats = self._lanes, self._partials, self.beats_per_line
        width = 32 * lanes
        i = self.i_lines
        acc_issue, comb_issue = issues["acc"], issues["comb"]
        # Each pipeline's candidate operation; it issues (``issue_ops``, with ``valid``)
        # when nothing holds it back.
        acc_op = Signal.like(issue_ops["acc"], name="acc_cand")
        comb_op = Signal.like(issue_ops["comb"], name="comb_cand")
        for pipe, cand in (("acc", acc_op), ("comb", comb_op)):
            m.d.comb += [issue_ops[pipe].eq(cand), issue_ops[pipe].valid.eq(issues[pipe])]

        # Input register: one item, consumed beat by beat.
        cur = Signal(LINE, reset_less=True)
        ctrl = Signal(CTRL, reset_less=True)
        cur_valid = Signal()
        beat = Signal(beat_bits + 1)                     # 0 .. S-1
        part = Signal(mem_bits)                          # row_k mod P
        # Partial of the next row: counted along the rows (row_k = 0, 1, 2, ...).
        next_part = Mux(part == parts - 1, 0, part + 1) if parts > 1 else 0
        bank = Signal()                                  # the bank being accumulated

        # The bag handed over to the combining pipeline (``job``) and its settings.
        job = Signal()
        job_bank = Signal()
        job_max = Signal()
        job_mean = Signal()
        job_bf16 = Signal()
        job_empty = Signal()
        job_multi = Signal()                             # Q >= 2: partials to combine
        job_rounds = Signal(mem_bits)                    # max(Q - 1, 1)
        job_last = Signal(addr_bits)                     # lines_per_row * S - 1
        job_n = Signal(32)                               # float(n), 1.0 for an empty bag
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
                mul.i_operands.valid.eq(acc_issue),
                mul.i_operands.p.a.eq(terms[32 * lane:32 * lane + 32]),
                mul.i_operands.p.b.eq(weight),
            ]

        def join(low: int, low_bits: int, high):
            return Cat(C(low, low_bits), high) if low_bits else high

        def hazard(op, pipes):
            """Read-after-write: a younger operation of ``pipes`` writes what ``op``
            reads."""
            conflicts = []
            for older in (o for pipe in pipes for o in ops[pipe][:window]):
                same = older.valid & older.write & (older.bank == op.bank) & (older.addr == op.addr)
                conflicts.append(same & ((op.a_read & (older.w_mem == op.a_mem))
                                         | (op.b_read & (older.w_mem == op.b_mem))))
            return Cat(*conflicts).any()

        # The combining pipeline: with Q = min(n, P), rounds 1 .. max(Q - 1, 1) over
        # every beat of the row, acc_0 = op(acc_0, acc_round); the last round's results
        # go to the output.
        final = round_ == job_rounds
        line_end = Mux(job_bf16, addr[:beat_bits + 1].all(),
                       addr[:beat_bits].all() if beat_bits else C(1, 1))
        m.d.comb += [
            comb_op.bank.eq(job_bank),
            comb_op.addr.eq(addr),
            comb_op.a_read.eq(~job_empty),
            comb_op.a_zero.eq(job_empty),
            comb_op.a_mem.eq(0),
            comb_op.b_read.eq(job_multi),
            comb_op.b_mem.eq(round_),
            comb_op.max.eq(job_max),
            comb_op.write.eq(~final),
            comb_op.w_mem.eq(0),
            comb_op.final.eq(final),
            comb_op.last.eq(final & (addr == job_last)),
            comb_op.line_end.eq(line_end),
            comb_op.mean.eq(job_mean),
            comb_op.bf16.eq(job_bf16),
            comb_op.n.eq(job_n),
            comb_issue.eq(job & ~hazard(comb_op, ("acc", "comb")) & (~final | credit)),
        ]
        # The pipeline takes the next bag in the cycle it issues the current one's last
        # operation.
        job_free = ~job | (comb_issue & comb_op.last)

        # The accumulating pipeline: row k into partial k mod P of the bank. A bag's
        # last operation (and an empty bag) waits until the combining pipeline is free.
        acc_addr = Mux(ctrl.bf16, Cat(beat[:beat_bits + 1], cur.line),
                       Cat(beat[:beat_bits], cur.line))
        m.d.comb += [
            acc_op.bank.eq(bank),
            acc_op.addr.eq(acc_addr[:addr_bits]),
            acc_op.a_read.eq(~fresh),
            acc_op.a_mem.eq(part),
            acc_op.max.eq(is_max),
            acc_op.write.eq(1),
            acc_op.w_mem.eq(part),
            acc_issue.eq(cur_valid & ~cur.empty_bag & ~hazard(acc_op, ("acc",))
                         & (~bag_done | job_free)),
        ]

        # Hand-over: the bag's settings are those of its last item.
        take_empty = cur_valid & cur.empty_bag & job_free
        hand_over = take_empty | (acc_issue & bag_done)
        consume = take_empty | (acc_issue & beat_last)
        count = cur.count
        lz = lzc(m, count, "n_lz")
        norm = shift_left(m, count, lz, "n_norm")
        exp = (~lz[:4] + 127)[:8]                        # 127 + msb; n >= 1
        multi = count >= 2 if parts > 1 else C(0, 1)
        rounds = Mux(count >= parts, parts - 1,
                     Mux(multi, (count[:mem_bits] - 1)[:mem_bits], 1)) if parts > 1 else 1
        lines_less_one = (ctrl.lines_per_row - 1)[:8]
        with m.If(hand_over):
            m.d.sync += [
                job.eq(1),
                job_bank.eq(bank),
                bank.eq(~bank),
                job_max.eq(is_max),
                job_mean.eq(ctrl.mode == PoolMode.MEAN.value),
                job_bf16.eq(ctrl.bf16),
                job_empty.eq(cur.empty_bag),
                job_multi.eq(multi & ~cur.empty_bag),
                job_rounds.eq(Mux(cur.empty_bag, 1, rounds)),
                job_last.eq(Mux(ctrl.bf16, join(2 * beats - 1, beat_bits + 1, lines_less_one),
                                join(beats - 1, beat_bits, lines_less_one))[:len(job_last)]),
                job_n.eq(Mux(cur.empty_bag, _FP32_ONE,
                             Cat(C(0, 8), norm[:15], exp, C(0, 1)))),
                round_.eq(1),
                addr.eq(0),
            ]
        with m.Elif(comb_issue):
            with m.If(addr == job_last):
                m.d.sync += addr.eq(0)
                with m.If(final):
                    m.d.sync += job.eq(0)
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
        with m.Elif(acc_issue):
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
