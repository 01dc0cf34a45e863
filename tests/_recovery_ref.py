"""The recovery engine as it was before it was split into components: a test-only
reference that ``tests/test_recovery_equivalence.py`` runs side by side with
:class:`hw.ckpt.recovery.Recovery` (not shipped under ``hw/``)."""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, enum, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature, AxiBurst
from hw.ckpt.formats import (
    COMMIT_MAGIC,
    COMMIT_WORD_ADDR,
    HEADER,
    LINE_BITS,
    LOG_MAGIC,
    MLP_HEADER,
    MLP_MAGIC,
    SB_MAGIC,
    SB_VERSION,
    SUPERBLOCK,
    line_sum,
    sum64_finish,
)

__all__ = ["RecoveryRef"]

#: AXI ``size`` of a 64-byte beat.
_SIZE_LINE = 6
#: ``mlp_slot`` when neither MLP slot holds a valid checkpoint.
MLP_NONE = 3


class Status(enum.Enum, shape=2):
    """``status`` of a finished recovery."""
    OK = 0
    NO_SUPERBLOCK = 1
    PMEM_ERROR = 2
    BAD_LAYOUT = 3


class _State(enum.Enum, shape=5):
    """Controller states (a Switch over this enum)."""
    IDLE = 0
    SB = 1
    SB_CHECK = 2
    P1 = 3
    P2 = 4
    RESTORE_WAIT = 5
    COMMIT = 6
    COMMIT_B = 7
    MLP_START = 8
    MLP_HDR = 9
    MLP_CHECK = 10
    MLP_PAY = 11
    MLP_DEC = 12
    FINISH = 13


class _Mode(enum.Enum, shape=2):
    """Address pattern of the read issuer."""
    LINEAR = 0      # consecutive lines (pass 1: the whole ring)
    PASS2 = 2       # every line of every slot, from a slot downwards (wrapping)


class _Wr(enum.Enum, shape=2):
    """Restore writer states."""
    IDLE = 0
    RD = 1
    LOAD = 2
    SEND = 3


def _check_int(name, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer from {lo} to {hi}, not {value!r}")
    return value


class RecoveryRef(wiring.Component):
    """Recovery after reset: steps 1 to 5 of ``docs/checkpoint.md`` ("Recovery").

    A ``start`` pulse (ignored while ``busy``) runs, over the ``pmem`` port:

    1. **Superblock.** Reads line 0 (address 0) and the commit word (address 64). The
       superblock is present when ``magic`` is ``"TCXLSB01"``, ``check`` matches and
       the commit word's magic is ``0xC0DE``; otherwise the status is
       ``NO_SUPERBLOCK`` and nothing is written. Then the layout is checked (below).
    2. **Pass 1** reads every line of every slot (the whole ring, slot 0 upwards, as
       consecutive lines). A record counts when its header has ``magic`` "ULOG",
       ``epoch == E``, ``1 <= n < slot_lines`` and ``batch_id > C`` and its ``check``
       equals ``sum64`` of header words 0..6 and payload lines ``1..n`` (the whole
       record, so a torn header with a stale ``seq`` cannot start pass 2). Of these the
       newest is kept: ``a`` is newer than ``b`` when ``(a.seq - b.seq) mod 2**32`` is
       non-zero and below ``2**31`` (serial-number order: ``seq`` restarts at 0 every
       epoch and the ring holds at most the last ``log_slots`` of them, so this is plain
       ``>`` until ``seq`` wraps, and stays right after). On equal ``seq`` the lower
       slot wins.
    3. **Pass 2** (only if pass 1 found one) reads all ``slot_lines`` lines of every
       slot again, from the newest record's slot downwards, wrapping from slot 0 to
       slot ``log_slots - 1``, ``log_slots`` slots in all. Every record that counts (as
       in pass 1) is restored: its ``n`` payload lines are written to ``addr`` (bits
       ``addr_width`` and up and bits 5..0 ignored), one single-beat write per line, in
       the order the records are read (reverse log order). All writes use ID 0, so a
       later (older) record's write to the same row lands last.
    4. After every restore B, the commit word ``{C, E + 1, 0xC0DE}`` is written with
       one single-beat write to address 64 (``wstrb`` = bytes 0..7 of that line) and
       its B awaited. Without a live record pass 2 is skipped; the epoch is still
       bumped.
    5. **MLP slots.** For ``i`` in 0, 1: reads the header line at ``mlp_slot[i] +
       mlp_slot_bytes``; when ``magic`` is ``"MLPC"`` and ``length <= mlp_slot_bytes``
       reads the ``ceil(length / 64)`` payload lines and checks ``check == sum64(header
       words 0..2, payload words)`` over the ``ceil(length / 8)`` payload words as
       stored (``length / 8`` for the contract's multiples of 64; the words past them in
       the last line are ignored, as in ``sim/ckpt.py``). Of the valid slots whose
       ``batch_id <= C`` the one with the larger ``batch_id`` is reported (slot 0 on a
       tie), ``mlp_slot = 3`` when none.

    **Layout** (``BAD_LAYOUT``, nothing written): ``version == 1``; ``log_slots`` a
    non-zero power of two; ``2 <= slot_lines <= max_slot_lines``; ``log_base``,
    ``mlp_slot[i]`` and ``mlp_slot_bytes`` multiples of 64; ``mlp_slot_bytes < 2**32``;
    the log ring (``log_base + log_slots * slot_lines * 64``) and both MLP slots
    (``mlp_slot[i] + mlp_slot_bytes + 64``) end below ``2**addr_width``. So garbage can
    never make the engine read more than twice the ring and two MLP slots.

    **Errors.** An R or B response other than OKAY stops further reads, lets every
    outstanding transaction finish, and ends the recovery with ``PMEM_ERROR``; the
    commit word is not written if the error came before it (restore writes already
    made stay, which the contract allows: they only rewrite rows to logged values).

    **Throughput.** Reads are single-beat bursts (ID 0, so in order, never crossing
    4 KiB), up to ``max_reads`` in flight, and R beats are taken one per cycle
    (registered, then processed), so the passes stream at up to one line per cycle
    once ``max_reads`` covers the read latency. A valid record's payload is buffered
    on chip in pass 2 (two record buffers of ``max_slot_lines - 1`` lines, ping-pong)
    and written back by a separate writer at one line per two cycles while the next
    record is read; pass 2 stalls only when a second record is ready before the first
    is written. At most 64 restore writes are outstanding. Measured
    (``tests/test_ckpt_recovery.py::test_cycles_64_slots``, :class:`tb.pmem.PmemModel`
    at its default timing: 120-cycle reads, 40-cycle writes, one media channel, no
    backpressure), 64 slots of 5 lines plus a 17-line MLP checkpoint, ``start`` to
    ``done``: 994 cycles with no live record and 1843 with 63 live records (252 lines
    restored) at ``max_reads = 128``; 1804 / 3190 at 32 and 5440 / 10390 at 8.

    **Outputs.** ``busy`` is high from ``start`` until ``done``; ``done`` (a level)
    and the results hold until the next ``start``. The results are valid with ``done``
    and ``status == OK`` (``committed``/``epoch`` and the layout outputs are also set
    after ``PMEM_ERROR`` in pass 1 or later). ``epoch`` is the new epoch ``E + 1``
    (mod 2**16). ``rolled_back`` counts restored records. Layout outputs are truncated
    to their widths (``log_base``, ``mlp_slot0/1`` to ``addr_width``,
    ``mlp_slot_bytes`` to 32 bits, lossless after the layout check).

    Parameters
    ----------
    addr_width : int
        PMEM byte-address width, 16 to 64.
    id_width : int
        AXI ID width, 1 to 16 (ID 0 is used).
    max_slot_lines : int
        Largest ``slot_lines`` accepted, 2 to 255.
    max_reads : int
        Reads in flight, 1 to 256 (default 128; a counter, no buffer).
    """

    def __init__(self, *, addr_width: int, id_width: int, max_slot_lines: int,
                 max_reads: int = 128):
        self._addr_width = _check_int("addr_width", addr_width, 16, 64)
        self._id_width = _check_int("id_width", id_width, 1, 16)
        self._max_slot_lines = _check_int("max_slot_lines", max_slot_lines, 2, 255)
        self._max_reads = _check_int("max_reads", max_reads, 1, 256)
        super().__init__({
            "start": In(1),
            "busy": Out(1),
            "done": Out(1),
            "status": Out(Status),
            "pmem": Out(AXI4Signature(addr_width=addr_width, data_width=LINE_BITS,
                                      id_width=id_width)),
            "committed": Out(32),
            "epoch": Out(16),
            "rolled_back": Out(32),
            "mlp_slot": Out(2),
            "mlp_batch": Out(32),
            "log_base": Out(addr_width),
            "log_slots_log2": Out(5),
            "slot_lines": Out(8),
            "mlp_slot0": Out(addr_width),
            "mlp_slot1": Out(addr_width),
            "mlp_slot_bytes": Out(32),
        })

    addr_width = property(lambda self: self._addr_width)
    id_width = property(lambda self: self._id_width)
    max_slot_lines = property(lambda self: self._max_slot_lines)
    max_reads = property(lambda self: self._max_reads)

    def elaborate(self, platform):
        m = Module()
        aw = self._addr_width
        axi = self.pmem
        depth = self._max_reads
        pbits = max(1, (self._max_slot_lines - 2).bit_length())   # payload line index
        wdepth = 64
        ones = (1 << (LINE_BITS // 8)) - 1

        m.submodules.buf = buf = Memory(shape=LINE_BITS, depth=2 << pbits, init=[])
        rd = buf.read_port(transparent_for=())
        wr = buf.write_port()

        # --- superblock and commit word
        sb = Signal(LINE_BITS, reset_less=True)
        sbv = data.View(SUPERBLOCK, sb)
        sb_sum = Signal(64, reset_less=True)
        cw = Signal(64, reset_less=True)
        cur_c = cw[:32]
        cur_e = cw[32:48]
        sl8 = sbv.slot_lines[:8]
        slot_bytes = Cat(C(0, 6), sl8)          # 14 bits
        log_slots = sbv.log_slots
        last_sidx = Signal(32)
        m.d.comb += last_sidx.eq(log_slots - 1)

        state = Signal(_State)
        status = Signal(Status)
        busy = Signal()
        done = Signal()
        err = Signal()

        # --- read issuer
        mode = Signal(_Mode)
        ar_pend = Signal()
        araddr = Signal(aw)
        ar_next = Signal(aw)
        ar_left = Signal(40)           # lines (LINEAR) or slots (PASS2) to issue
        ar_k = Signal(8)               # PASS2: line within the slot
        ar_sidx = Signal(32)           # PASS2: slot index
        ar_slot = Signal(aw)           # PASS2: slot address
        last_addr = Signal(aw)         # address of slot log_slots - 1
        cbits = depth.bit_length()
        credits = Signal(cbits)        # ARs issued (or pending) whose R is not in

        # --- R stage 1 (registered beat) and stage 2 (processing)
        rb_valid = Signal()
        rb = Signal(LINE_BITS, reset_less=True)
        s2_take = Signal()
        r_hs = Signal()

        # --- write channel (restore lines and the commit word)
        aw_pend = Signal()
        w_pend = Signal()
        awaddr = Signal(aw)
        wdata = Signal(LINE_BITS, reset_less=True)
        wstrb = Signal(LINE_BITS // 8)
        w_out = Signal(8)              # AWs whose B is not in

        m.d.comb += [
            axi.arvalid.eq(ar_pend),
            axi.araddr.eq(araddr),
            axi.awvalid.eq(aw_pend),
            axi.awaddr.eq(awaddr),
            axi.wvalid.eq(w_pend),
            axi.wdata.eq(wdata),
            axi.wstrb.eq(wstrb),
            axi.wlast.eq(1),
            axi.bready.eq(1),
        ]
        for p in ("aw", "ar"):
            m.d.comb += [
                getattr(axi, f"{p}size").eq(_SIZE_LINE),
                getattr(axi, f"{p}burst").eq(AxiBurst.INCR),
            ]

        # --- read issuer: single-beat ARs, up to ``depth`` without their R
        issue = Signal()
        m.d.comb += issue.eq((~ar_pend | axi.arready) & ar_left.any() & ~err
                             & (credits < depth))
        with m.If(axi.arready):
            m.d.sync += ar_pend.eq(0)
        with m.If(issue):
            m.d.sync += [ar_pend.eq(1), araddr.eq(ar_next)]
            with m.Switch(mode):
                with m.Case(_Mode.LINEAR):
                    m.d.sync += [ar_next.eq(ar_next + 64),
                                 ar_left.eq(ar_left - 1)]
                with m.Case(_Mode.PASS2):
                    with m.If((ar_k + 1)[:8] == sl8):
                        m.d.sync += [ar_k.eq(0), ar_left.eq(ar_left - 1)]
                        with m.If(~ar_sidx.any()):
                            m.d.sync += [ar_sidx.eq(last_sidx), ar_slot.eq(last_addr),
                                         ar_next.eq(last_addr)]
                        with m.Else():
                            prev = ar_slot - slot_bytes
                            m.d.sync += [ar_sidx.eq(ar_sidx - 1), ar_slot.eq(prev),
                                         ar_next.eq(prev)]
                    with m.Else():
                        m.d.sync += [ar_k.eq(ar_k + 1),
                                     ar_next.eq(ar_next + 64)]
        with m.If(issue & ~r_hs):
            m.d.sync += credits.eq(credits + 1)
        with m.Elif(~issue & r_hs):
            m.d.sync += credits.eq(credits - 1)

        def start_read(m, mode_value, addr, count):
            m.d.sync += [mode.eq(mode_value), ar_next.eq(addr), ar_left.eq(count)]

        rd_idle = Signal()
        m.d.comb += rd_idle.eq((~ar_left.any() | err) & ~credits.any() & ~rb_valid)

        # --- R stage 1
        m.d.comb += [
            axi.rready.eq(~rb_valid | s2_take),
            r_hs.eq(axi.rvalid & axi.rready),
        ]
        with m.If(r_hs):
            m.d.sync += [rb_valid.eq(1), rb.eq(axi.rdata)]
            with m.If(axi.rresp.any()):
                m.d.sync += err.eq(1)
        with m.Elif(s2_take):
            m.d.sync += rb_valid.eq(0)
        with m.If(axi.bvalid & axi.bresp.any()):
            m.d.sync += err.eq(1)

        # --- the word-sum adder tree, shared by every phase (masked per phase)
        word_mask = Signal(8)
        masked = Signal(LINE_BITS)
        m.d.comb += masked.eq(rb & Cat(*[word_mask[i].replicate(64) for i in range(8)]))
        line_total = line_sum(m, masked, name="line_total")
        acc = Signal(64, reset_less=True)

        # --- header validity (pass 1 and 2)
        hdr = data.View(HEADER, rb)
        hdr_counts = Signal()
        m.d.comb += hdr_counts.eq((hdr.magic == LOG_MAGIC) & (hdr.epoch == cur_e)
                                  & hdr.n.any() & (hdr.n < sl8) & (hdr.batch_id > cur_c))

        # --- pass 1
        found = Signal()
        best_seq = Signal(32)
        best_sidx = Signal(32)
        best_addr = Signal(aw)
        r_sidx = Signal(32)
        r_addr = Signal(aw)
        seq_diff = Signal(32)
        cur_seq = Signal(32)
        cur_sidx = Signal(32)
        cur_slot = Signal(aw)
        m.d.comb += seq_diff.eq(cur_seq - best_seq)

        # --- pass 2
        r_k = Signal(8)
        half = Signal()
        cur_ok = Signal()
        cur_n = Signal(8)
        cur_addr = Signal(aw)
        cur_check = Signal(64)
        dec_pending = Signal()
        dec_sum = Signal(64)
        rolled_back = Signal(32)
        in_payload = Signal()
        m.d.comb += in_payload.eq(r_k.any() & (r_k <= cur_n))

        # --- restore writer
        wr_state = Signal(_Wr)
        wr_half = Signal()
        wr_n = Signal(8)
        wr_k = Signal(8)
        wr_addr = Signal(aw)
        wr_busy = wr_state != _Wr.IDLE
        wr_sending = wr_state == _Wr.SEND

        in_p2 = state == _State.P2
        m.d.comb += s2_take.eq(rb_valid & ~(in_p2 & dec_pending & wr_busy))

        # --- MLP
        mlp_i = Signal()
        mlp_hdr = Signal(256, reset_less=True)
        mh = data.View(MLP_HEADER, Cat(mlp_hdr, C(0, LINE_BITS - 256)))
        mlp_ok = Signal()
        mlp_lines = Signal(32)
        r_cnt = Signal(32)
        mlp_valid = Signal(2)
        mlp_batches = [Signal(32, name=f"mlp_batch{i}") for i in range(2)]
        hdr_addr = [Signal(aw, name=f"mlp_hdr_addr{i}") for i in range(2)]
        len_rem = mh.length[:6]
        last_beat = Signal()
        m.d.comb += last_beat.eq((r_cnt + 1)[:32] == mlp_lines)

        # --- result registers
        res_slot = Signal(2, init=MLP_NONE)
        res_batch = Signal(32)
        m.d.comb += [
            self.busy.eq(busy),
            self.done.eq(done),
            self.status.eq(status),
            self.committed.eq(cur_c),
            self.epoch.eq(cur_e + 1),
            self.rolled_back.eq(rolled_back),
            self.mlp_slot.eq(res_slot),
            self.mlp_batch.eq(res_batch),
            self.log_base.eq(sbv.log_base[:aw]),
            self.slot_lines.eq(sl8),
            self.mlp_slot0.eq(sbv.mlp_slot0[:aw]),
            self.mlp_slot1.eq(sbv.mlp_slot1[:aw]),
            self.mlp_slot_bytes.eq(sbv.mlp_slot_bytes[:32]),
        ]
        lg = [Signal(name=f"lg{j}") for j in range(5)]
        for j in range(5):
            m.d.comb += lg[j].eq(Cat(*[log_slots[i] for i in range(32) if i >> j & 1]).any())
        log2 = Cat(*lg)
        m.d.comb += self.log_slots_log2.eq(log2)

        # --- superblock and layout checks (combinational on the registered lines)
        present = Signal()
        m.d.comb += present.eq((sbv.magic == SB_MAGIC)
                               & (sum64_finish(sb_sum) == sbv.check)
                               & (cw[48:64] == COMMIT_MAGIC))

        def fits(value):
            return ~value[aw:].any() if len(value) > aw else C(1, 1)

        # log_slots * slot_lines: slot_lines shifted by log2 (a barrel shifter of
        # equal-width stages, lint clean unlike a variable ``<<``)
        shifted = sl8
        for j in range(5):
            stage = Signal(8 + (1 << (j + 1)) - 1, name=f"ring_shift{j}")
            m.d.comb += stage.eq(Mux(lg[j], Cat(C(0, 1 << j), shifted),
                                     Cat(shifted, C(0, 1 << j))))
            shifted = stage
        ring_bytes = Cat(C(0, 6), shifted)
        ring_end = sbv.log_base + ring_bytes
        hdr_off = sbv.mlp_slot_bytes[:32]
        hdr_end_off = hdr_off + 64
        layout_ok = Signal()
        slot_ok = [Signal(name=f"mlp_slot_ok{i}") for i in range(2)]
        for i, base in enumerate((sbv.mlp_slot0, sbv.mlp_slot1)):
            m.d.comb += slot_ok[i].eq(~base[:6].any() & fits(base + hdr_end_off))
        m.d.comb += layout_ok.eq(
            (sbv.version == SB_VERSION)
            & log_slots.any() & ~(log_slots & last_sidx).any()
            & (sbv.slot_lines >= 2) & (sbv.slot_lines <= self._max_slot_lines)
            & ~sbv.log_base[:6].any() & fits(ring_end)
            & ~sbv.mlp_slot_bytes[32:].any() & ~sbv.mlp_slot_bytes[:6].any()
            & slot_ok[0] & slot_ok[1])

        # --- restore writer: rd.addr is the line loaded next (k + 1 while sending)
        wr_k1 = (wr_k + 1)[:8]
        m.d.comb += rd.addr.eq(Mux(wr_sending, Cat(wr_k1[:pbits], wr_half),
                                   Cat(wr_k[:pbits], wr_half)))
        with m.If(axi.awready):
            m.d.sync += aw_pend.eq(0)
        with m.If(axi.wready):
            m.d.sync += w_pend.eq(0)
        aw_hs = axi.awvalid & axi.awready
        with m.If(aw_hs & ~axi.bvalid):
            m.d.sync += w_out.eq(w_out + 1)
        with m.Elif(~aw_hs & axi.bvalid):
            m.d.sync += w_out.eq(w_out - 1)
        sent = (~aw_pend | axi.awready) & (~w_pend | axi.wready)
        with m.Switch(wr_state):
            with m.Case(_Wr.RD):
                m.d.sync += wr_state.eq(_Wr.LOAD)
            with m.Case(_Wr.LOAD), m.If(w_out < wdepth):
                m.d.sync += [aw_pend.eq(1), w_pend.eq(1), awaddr.eq(wr_addr),
                             wdata.eq(rd.data), wstrb.eq(ones)]
                m.d.sync += wr_state.eq(_Wr.SEND)
            with m.Case(_Wr.SEND), m.If(sent):
                m.d.sync += [wr_k.eq(wr_k1), wr_addr.eq(wr_addr + 64)]
                with m.If(wr_k1 == wr_n):
                    m.d.sync += wr_state.eq(_Wr.IDLE)
                with m.Else():
                    m.d.sync += wr_state.eq(_Wr.LOAD)

        # --- buffer writes (pass 2 payload lines)
        m.d.comb += [
            wr.addr.eq(Cat((r_k - 1)[:pbits], half)),
            wr.data.eq(rb),
        ]

        def records(m, *, restore):
            """Stage 2 of pass 1 / pass 2: one line of a slot; at the slot's last line
            the record's check sum is latched for the decision (``dec_pending``)."""
            with m.If(r_k.any()):
                m.d.comb += word_mask.eq(0xFF)
            with m.Else():
                m.d.comb += word_mask.eq(0x7F)
            with m.If(s2_take):
                with m.If(~r_k.any()):
                    m.d.sync += [cur_ok.eq(hdr_counts), cur_n.eq(hdr.n), cur_seq.eq(hdr.seq),
                                 cur_addr.eq(Cat(C(0, 6), hdr.addr[6:aw])),
                                 cur_check.eq(hdr.check), acc.eq(line_total),
                                 cur_sidx.eq(r_sidx), cur_slot.eq(r_addr),
                                 r_sidx.eq(r_sidx + 1),
                                 r_addr.eq(r_addr + slot_bytes)]
                with m.Elif(in_payload):
                    if restore:
                        m.d.comb += wr.en.eq(1)
                    m.d.sync += acc.eq(acc + line_total)
                with m.If((r_k + 1)[:8] == sl8):
                    m.d.sync += [r_k.eq(0), dec_pending.eq(1),
                                 dec_sum.eq(Mux(in_payload, acc + line_total, acc))]
                with m.Else():
                    m.d.sync += r_k.eq(r_k + 1)

        record_ok = Signal()
        m.d.comb += record_ok.eq(cur_ok & (sum64_finish(dec_sum) == cur_check) & ~err)

        def finish(m, code):
            m.d.sync += [status.eq(code), state.eq(_State.FINISH)]

        with m.Switch(state):
            with m.Case(_State.IDLE), m.If(self.start):
                m.d.sync += [busy.eq(1), done.eq(0), err.eq(0), r_cnt.eq(0),
                             rolled_back.eq(0), res_slot.eq(MLP_NONE), res_batch.eq(0),
                             mlp_valid.eq(0), sb.eq(0), cw.eq(0)]
                start_read(m, _Mode.LINEAR, 0, 2)
                m.d.sync += state.eq(_State.SB)

            with m.Case(_State.SB):
                m.d.comb += word_mask.eq(0x7F)
                with m.If(s2_take):
                    m.d.sync += r_cnt.eq(r_cnt + 1)
                    with m.If(~r_cnt.any()):
                        m.d.sync += [sb.eq(rb), sb_sum.eq(line_total)]
                    with m.Else():
                        m.d.sync += cw.eq(rb[:64])
                with m.If(rd_idle):
                    with m.If(err):
                        finish(m, Status.PMEM_ERROR)
                    with m.Else():
                        m.d.sync += state.eq(_State.SB_CHECK)

            with m.Case(_State.SB_CHECK):
                with m.If(~present):
                    finish(m, Status.NO_SUPERBLOCK)
                with m.Elif(~layout_ok):
                    finish(m, Status.BAD_LAYOUT)
                with m.Else():
                    m.d.sync += [
                        hdr_addr[0].eq(sbv.mlp_slot0 + hdr_off),
                        hdr_addr[1].eq(sbv.mlp_slot1 + hdr_off),
                        last_addr.eq(ring_end[:aw] - slot_bytes),
                        found.eq(0), best_seq.eq(0), best_sidx.eq(0),
                        r_sidx.eq(0), r_addr.eq(sbv.log_base[:aw]),
                        r_k.eq(0), half.eq(0), dec_pending.eq(0),
                    ]
                    # Pass 1 reads the whole ring, slot 0 upwards: consecutive lines.
                    start_read(m, _Mode.LINEAR, sbv.log_base[:aw], shifted)
                    m.d.sync += state.eq(_State.P1)

            with m.Case(_State.P1):
                records(m, restore=False)
                with m.If(dec_pending):
                    m.d.sync += dec_pending.eq(0)
                    with m.If(record_ok & (~found | (seq_diff.any() & ~seq_diff[31]))):
                        m.d.sync += [found.eq(1), best_seq.eq(cur_seq),
                                     best_sidx.eq(cur_sidx), best_addr.eq(cur_slot)]
                with m.If(rd_idle & ~dec_pending):
                    with m.If(err):
                        finish(m, Status.PMEM_ERROR)
                    with m.Elif(found):
                        start_read(m, _Mode.PASS2, best_addr, log_slots)
                        m.d.sync += [ar_slot.eq(best_addr), ar_sidx.eq(best_sidx),
                                     ar_k.eq(0), r_k.eq(0), half.eq(0)]
                        m.d.sync += state.eq(_State.P2)
                    with m.Else():
                        m.d.sync += state.eq(_State.COMMIT)

            with m.Case(_State.P2):
                records(m, restore=True)
                with m.If(dec_pending & ~wr_busy):
                    m.d.sync += dec_pending.eq(0)
                    with m.If(record_ok):
                        m.d.sync += [wr_state.eq(_Wr.RD), wr_half.eq(half), wr_n.eq(cur_n),
                                     wr_k.eq(0), wr_addr.eq(cur_addr), half.eq(~half),
                                     rolled_back.eq(rolled_back + 1)]
                with m.If(rd_idle & ~dec_pending & ~wr_busy):
                    m.d.sync += state.eq(_State.RESTORE_WAIT)

            with m.Case(_State.RESTORE_WAIT), m.If(~w_out.any() & ~aw_pend & ~w_pend):
                with m.If(err):
                    finish(m, Status.PMEM_ERROR)
                with m.Else():
                    m.d.sync += state.eq(_State.COMMIT)

            with m.Case(_State.COMMIT):
                m.d.sync += [
                    aw_pend.eq(1), w_pend.eq(1), awaddr.eq(COMMIT_WORD_ADDR),
                    wdata.eq(Cat(cur_c, (cur_e + 1)[:16], C(COMMIT_MAGIC, 16),
                                 C(0, LINE_BITS - 64))),
                    wstrb.eq(0xFF),
                ]
                m.d.sync += state.eq(_State.COMMIT_B)

            with m.Case(_State.COMMIT_B), m.If(~w_out.any() & ~aw_pend & ~w_pend):
                with m.If(err):
                    finish(m, Status.PMEM_ERROR)
                with m.Else():
                    m.d.sync += [mlp_i.eq(0), state.eq(_State.MLP_START)]

            with m.Case(_State.MLP_START):
                start_read(m, _Mode.LINEAR, Mux(mlp_i, hdr_addr[1], hdr_addr[0]), 1)
                m.d.sync += state.eq(_State.MLP_HDR)

            with m.Case(_State.MLP_HDR):
                m.d.comb += word_mask.eq(0x07)
                with m.If(s2_take):
                    m.d.sync += [mlp_hdr.eq(rb[:256]), acc.eq(line_total)]
                with m.If(rd_idle):
                    with m.If(err):
                        finish(m, Status.PMEM_ERROR)
                    with m.Else():
                        m.d.sync += state.eq(_State.MLP_CHECK)

            with m.Case(_State.MLP_CHECK):
                lines = (mh.length[:32] + 63)[6:]
                ok = (mh.magic == MLP_MAGIC) & (mh.length <= sbv.mlp_slot_bytes)
                m.d.sync += [mlp_ok.eq(ok), mlp_lines.eq(lines), r_cnt.eq(0)]
                # (``lines`` is 27 bits: ``length < 2**32`` after the layout check)
                with m.If(ok & lines.any()):
                    base = Mux(mlp_i, sbv.mlp_slot1[:aw], sbv.mlp_slot0[:aw])
                    start_read(m, _Mode.LINEAR, base, Cat(lines, C(0, 5)))
                    m.d.sync += state.eq(_State.MLP_PAY)
                with m.Else():
                    m.d.sync += state.eq(_State.MLP_DEC)

            with m.Case(_State.MLP_PAY):
                m.d.comb += word_mask.eq(0xFF)
                with m.If(last_beat & len_rem.any()):
                    # Only the ceil((length mod 64) / 8) first words of the last line.
                    m.d.comb += word_mask.eq(Cat(*[len_rem > 8 * i for i in range(8)]))
                with m.If(s2_take):
                    m.d.sync += [acc.eq(acc + line_total),
                                 r_cnt.eq(r_cnt + 1)]
                with m.If(rd_idle):
                    with m.If(err):
                        finish(m, Status.PMEM_ERROR)
                    with m.Else():
                        m.d.sync += state.eq(_State.MLP_DEC)

            with m.Case(_State.MLP_DEC):
                valid = mlp_ok & (sum64_finish(acc) == mh.check) & (mh.batch_id <= cur_c)
                batch = mh.batch_id
                with m.If(~mlp_i):
                    m.d.sync += [mlp_valid[0].eq(valid), mlp_batches[0].eq(batch),
                                 mlp_i.eq(1), state.eq(_State.MLP_START)]
                with m.Else():
                    v0 = mlp_valid[0]
                    with m.If(valid & (~v0 | (batch > mlp_batches[0]))):
                        m.d.sync += [res_slot.eq(1), res_batch.eq(batch)]
                    with m.Elif(v0):
                        m.d.sync += [res_slot.eq(0), res_batch.eq(mlp_batches[0])]
                    finish(m, Status.OK)

            with m.Case(_State.FINISH):
                m.d.sync += [busy.eq(0), done.eq(1), state.eq(_State.IDLE)]
        return m
