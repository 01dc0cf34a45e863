"""The recovery engine: replays the undo log after a power failure and bumps the epoch
(``docs/checkpoint.md``, "Recovery").

See :class:`Recovery`.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Signal
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

from hw.bus.axi import AXI4Signature
from hw.widths import check_int

from .formats import COMMIT_MAGIC, COMMIT_WORD_ADDR, LINE_BITS
from .line_reader import LineReader, ReadMode
from .log_scan import LogScan
from .mlp_check import MLP_NONE, MlpCheck
from .restore_writer import RestoreWriter
from .superblock import Superblock

__all__ = ["MLP_NONE", "Recovery", "Status"]


class Status(enum.Enum, shape=2):
    """``status`` of a finished recovery."""
    OK = 0
    NO_SUPERBLOCK = 1
    PMEM_ERROR = 2
    BAD_LAYOUT = 3


def _forward(m, outer, inner, prefixes):
    """Connects the members of AXI port ``outer`` whose names start with ``prefixes``
    (one path's channels) to those of ``inner``."""
    for name, member in outer.signature.members.items():
        if name.startswith(prefixes):
            o, i = getattr(outer, name), getattr(inner, name)
            m.d.comb += o.eq(i) if member.flow == Out else i.eq(o)


class Recovery(wiring.Component):
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

    **Structure.** A controller (an FSM with one state per step) sequences
    :class:`~.line_reader.LineReader` (every read), :class:`~.superblock.Superblock`
    (step 1 and the layout), :class:`~.log_scan.LogScan` (the records of passes 1 and
    2), :class:`~.restore_writer.RestoreWriter` (the restore buffer, every write) and
    :class:`~.mlp_check.MlpCheck` (step 5); the lines read go to the step's block.

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
        self._addr_width = check_int("addr_width", addr_width, 16, 64)
        self._id_width = check_int("id_width", id_width, 1, 16)
        self._max_slot_lines = check_int("max_slot_lines", max_slot_lines, 2, 255)
        self._max_reads = check_int("max_reads", max_reads, 1, 256)
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
        aw, max_lines = self._addr_width, self._max_slot_lines
        index_width = max(1, (max_lines - 2).bit_length())     # payload line index
        m.submodules.reader = reader = LineReader(
            addr_width=aw, id_width=self._id_width, max_reads=self._max_reads)
        m.submodules.superblock = sb = Superblock(addr_width=aw, max_slot_lines=max_lines)
        m.submodules.scan = scan = LogScan(addr_width=aw, index_width=index_width)
        m.submodules.writer = writer = RestoreWriter(
            addr_width=aw, id_width=self._id_width, index_width=index_width)
        m.submodules.mlp = mlp = MlpCheck(addr_width=aw)
        _forward(m, self.pmem, reader.pmem, ("ar", "r"))
        _forward(m, self.pmem, writer.pmem, ("aw", "w", "b"))
        wiring.connect(m, scan.o_fill, writer.i_fill)

        err = Signal()          # an error response: no more reads or restores
        m.d.comb += [reader.stop.eq(err), writer.stop.eq(err)]
        with m.If(reader.r_error | writer.b_error):
            m.d.sync += err.eq(1)

        m.d.comb += [
            scan.slot_lines.eq(sb.slot_lines), scan.epoch.eq(sb.epoch),
            scan.committed.eq(sb.committed), scan.log_base.eq(sb.log_base),
            mlp.slot0.eq(sb.mlp_slot0), mlp.slot1.eq(sb.mlp_slot1),
            mlp.slot_bytes.eq(sb.mlp_slot_bytes), mlp.committed.eq(sb.committed),
        ]
        for name in ("committed", "log_base", "log_slots_log2", "slot_lines", "mlp_slot0",
                     "mlp_slot1", "mlp_slot_bytes"):
            m.d.comb += getattr(self, name).eq(getattr(sb, name))
        m.d.comb += [self.epoch.eq(sb.epoch + 1), self.mlp_slot.eq(mlp.mlp_slot),
                     self.mlp_batch.eq(mlp.mlp_batch)]

        # Pass 1 keeps the newest record that counts (serial-number order of ``seq``).
        found = Signal()
        best_seq = Signal(32)
        best_slot = Signal(32)
        best_addr = Signal(aw)
        rec = scan.o_rec
        seq_diff = Signal(32)
        m.d.comb += seq_diff.eq(rec.p.seq - best_seq)
        newer = ~found | (seq_diff.any() & ~seq_diff[31])

        cmd = reader.i_cmd

        def read(mode, addr, count):
            m.d.comb += [cmd.valid.eq(1), cmd.p.mode.eq(mode), cmd.p.addr.eq(addr),
                         cmd.p.count.eq(count), cmd.p.slot.eq(best_slot),
                         cmd.p.last_slot.eq(sb.last_slot), cmd.p.last_addr.eq(sb.last_addr),
                         cmd.p.slot_lines.eq(sb.slot_lines)]

        # The lines read go to the phase's consumer; only the log scan holds them back.
        line = reader.o_line
        m.d.comb += [sink.payload.eq(line.payload) for sink in (sb.i_line, scan.i_line,
                                                                mlp.i_line)]
        m.d.comb += line.ready.eq(1)

        def take_lines(sink):
            m.d.comb += sink.valid.eq(line.valid)
            if sink is scan.i_line:
                m.d.comb += line.ready.eq(sink.ready)

        def finish(code):
            m.d.sync += self.status.eq(code)
            m.next = "FINISH"

        def after_reads(next_state):
            with m.If(err):
                finish(Status.PMEM_ERROR)
            with m.Else():
                m.next = next_state

        job = writer.i_job
        with m.FSM():
            with m.State("IDLE"), m.If(self.start):
                m.d.sync += [self.busy.eq(1), self.done.eq(0), err.eq(0),
                             self.rolled_back.eq(0)]
                m.d.comb += [sb.clear.eq(1), mlp.clear.eq(1)]
                read(ReadMode.LINEAR, 0, 2)
                m.next = "SB"
            with m.State("SB"):
                take_lines(sb.i_line)
                with m.If(reader.idle):
                    after_reads("SB_CHECK")
            with m.State("SB_CHECK"):
                with m.If(~sb.present):
                    finish(Status.NO_SUPERBLOCK)
                with m.Elif(~sb.layout_ok):
                    finish(Status.BAD_LAYOUT)
                with m.Else():
                    m.d.sync += [found.eq(0), best_seq.eq(0), best_slot.eq(0)]
                    m.d.comb += scan.clear.eq(1)
                    # Pass 1 reads the whole ring, slot 0 upwards: consecutive lines.
                    read(ReadMode.LINEAR, sb.log_base, sb.ring_lines)
                    m.next = "PASS1"
            with m.State("PASS1"):
                take_lines(scan.i_line)
                m.d.comb += rec.ready.eq(1)
                with m.If(rec.valid & rec.p.ok & ~err & newer):
                    m.d.sync += [found.eq(1), best_seq.eq(rec.p.seq),
                                 best_slot.eq(rec.p.slot), best_addr.eq(rec.p.slot_addr)]
                with m.If(reader.idle & ~rec.valid):
                    with m.If(err):
                        finish(Status.PMEM_ERROR)
                    with m.Elif(found):
                        # Pass 2: every slot again, from the newest record's downwards.
                        read(ReadMode.SLOTS, best_addr, sb.log_slots)
                        m.next = "PASS2"
                    with m.Else():
                        m.next = "COMMIT"
            with m.State("PASS2"):
                take_lines(scan.i_line)
                m.d.comb += [scan.restore.eq(1), job.valid.eq(rec.valid & rec.p.ok),
                             job.p.n.eq(rec.p.n), job.p.addr.eq(rec.p.addr),
                             rec.ready.eq(job.ready)]
                with m.If(job.valid & job.ready & ~err):
                    m.d.sync += self.rolled_back.eq(self.rolled_back + 1)
                with m.If(reader.idle & ~rec.valid & ~writer.busy):
                    m.next = "RESTORE_WAIT"
            with m.State("RESTORE_WAIT"), m.If(writer.idle):
                after_reads("COMMIT")
            with m.State("COMMIT"):
                m.d.comb += [job.valid.eq(1), job.p.commit.eq(1),
                             job.p.addr.eq(COMMIT_WORD_ADDR),
                             job.p.word.eq(Cat(sb.committed, (sb.epoch + 1)[:16],
                                               C(COMMIT_MAGIC, 16)))]
                with m.If(job.ready):
                    m.next = "COMMIT_B"
            with m.State("COMMIT_B"), m.If(writer.idle):
                after_reads("MLP_START")
            with m.State("MLP_START"):
                read(ReadMode.LINEAR, mlp.hdr_addr, 1)
                m.next = "MLP_HEADER"
            with m.State("MLP_HEADER"):
                take_lines(mlp.i_line)
                with m.If(reader.idle):
                    after_reads("MLP_CHECK")
            with m.State("MLP_CHECK"):
                with m.If(mlp.pay_lines.any()):
                    read(ReadMode.LINEAR, mlp.pay_addr, mlp.pay_lines)
                    m.next = "MLP_PAYLOAD"
                with m.Else():
                    m.next = "MLP_DECIDE"
            with m.State("MLP_PAYLOAD"):
                take_lines(mlp.i_line)
                with m.If(reader.idle):
                    after_reads("MLP_DECIDE")
            with m.State("MLP_DECIDE"):
                m.d.comb += mlp.decide.eq(1)
                with m.If(mlp.second):
                    finish(Status.OK)
                with m.Else():
                    m.next = "MLP_START"
            with m.State("FINISH"):
                m.d.sync += [self.busy.eq(0), self.done.eq(1)]
                m.next = "IDLE"
        return m
