"""Golden persistence model of the checkpoint logger and recovery, from ``docs/checkpoint.md``.

Everything here is written from that page (the contract), not from the RTL:

* :func:`sum64` and the byte helpers: the contract's checksum.
* Encoders / decoders of the on-media formats (field layouts from
  :mod:`hw.ckpt.formats`): superblock line 0, the commit word, undo-log records and MLP
  checkpoint slots.
* :class:`Image`: sparse line memory (default zero). Every function here takes any
  object with ``read(addr, n) -> bytes`` and ``write(addr, data)`` (duck typing), so it
  runs on an :class:`Image` or directly on a :class:`tb.pmem.PmemModel`.
* :func:`recover` / :func:`recover_steps` / :func:`recover_with_crash`: recovery steps
  1-5; the generator yields every PMEM write in order so that tests can cut power after
  any number of them (and tear the writes in flight at 8-byte granularity).
* :class:`Logger`: the device's logging rules (dedup filter, space / overflow, COMMIT,
  UPDATE admission).
* :class:`TrainingOracle`: golden tables after every batch, for crash tests.

Readings of the contract chosen here (each the one that keeps recovery safe)
----------------------------------------------------------------------------
1. **Pass-1 header-only validity.** The record check covers the payload, so pass 1 (which
   reads header lines only) cannot use it. A header is *pass-1 valid* when ``magic ==
   LOG_MAGIC``, ``epoch == E`` and ``1 <= n <= slot_lines - 1``; it is a pass-1 candidate
   when also ``batch_id > C``. The newest live record is the candidate with the largest
   ``seq`` (ties: the lowest slot). Pass 2 then applies the *full* test (the same three
   fields plus ``check``) to every slot, so pass 1 only chooses where the reverse walk
   starts: every fully valid live record also passes pass 1, and nothing is restored on
   the strength of a header alone. Reserved header fields are not checked (they are
   covered by ``check``). :attr:`RecoveryReport.order_ok` says whether the restores came
   out in strictly decreasing ``seq`` (see "Known contract problems" below).
2. **Superblock.** Recovery accepts line 0 only if ``check`` matches *and* ``magic`` and
   ``version`` are the contract's *and* the geometry is usable (``log_slots`` a power of
   two, ``slot_lines >= 2``, ``log_base`` 64-byte aligned); anything else, and a commit
   word whose magic is not ``0xC0DE``, is ``NO_SUPERBLOCK`` with no write at all.
3. **Formatting** (:func:`format_device`) also zeroes every log slot's header line and
   both MLP slot headers: the contract's formatting writes ``committed = 0, epoch = 0``,
   which would make records left by an earlier format (epoch 0, ``batch_id > 0``) valid
   and live again.
4. **Epoch** is 16 bits; recovery writes ``(E + 1) mod 2**16``.
5. **Restore writes** are one 64-byte write per payload line (the finest granularity a
   burst can be cut at); the commit word is one 8-byte write at ``COMMIT_WORD_ADDR``
   that is issued only after every restore write is durable (a fence).
6. **MLP slots.** The header sits at ``mlp_slot[i] + mlp_slot_bytes``. ``check`` covers
   header words 0..2 and the ``ceil(length / 8)`` payload words as stored; a slot is
   valid when ``magic`` matches, ``length <= mlp_slot_bytes`` and ``check`` matches. The
   encoder zero-pads the payload to whole lines. The newest valid slot is the one with
   the larger ``batch_id`` (ties: slot 0), as the contract says, even when that batch is
   newer than ``C``; :attr:`RecoveryReport.mlp_ahead` flags that case.
7. **Logger.** ``oldest`` is the first ``seq`` of the oldest batch that has records and
   is not committed (``write_seq`` when there is none); every capture, whatever its
   batch, is refused when ``write_seq - oldest == log_slots`` (the slot would hold a
   live record): the capture's batch overflows (sticky for that batch, ``log_full``
   sticky for the logger). Filter hits are checked first and cost no slot. UPDATE
   admission reports the lowest-numbered failing status (the project's rule for
   descriptor statuses), so an overflowed batch gets ``LOG_FULL`` (7) before
   ``BAD_BATCH`` (8); both touch no row. Before any capturing LOOKUP since the logger
   started, every UPDATE is ``BAD_BATCH``.
8. The RTL's filter indexing is not part of the contract: :class:`Logger` takes the
   index function as a parameter, and ``filter_rows = 0`` (no filter: every capture is
   logged; a duplicate record is harmless) is the default.

Known contract problems (the model reproduces the contract; tests document them)
---------------------------------------------------------------------------------
* Pass 1's header-only test can accept a torn header whose word 1 (``batch_id``,
  ``seq``) is stale from an older epoch (word 0 carries the new epoch), so the walk may
  start at a wrong slot. Harmless with one uncommitted batch (all records of a row hold
  the same bytes), wrong when LOOKUPs of ``b + 1`` precede COMMIT(``b``) and a row is in
  both batches (``test_contract_hazard_pass1_start_with_two_live_batches``).
* The 16-bit epoch wraps: records 65536 recoveries old become valid again.
* ``seq`` is 32 bits; "largest seq" breaks if it wraps within an epoch.
* The newest valid MLP checkpoint may be newer than ``C`` (written before a COMMIT that
  did not complete); :attr:`RecoveryReport.mlp_ahead`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import pairwise
from typing import Protocol

import numpy as np

from hw.ckpt.formats import (
    COMMIT_MAGIC,
    COMMIT_WORD,
    COMMIT_WORD_ADDR,
    HEADER_CODEC,
    LOG_MAGIC,
    MLP_HEADER_CODEC,
    MLP_MAGIC,
    SB_MAGIC,
    SB_VERSION,
    SUM64_KEY,
    SUPERBLOCK_CODEC,
)
from hw.cxl.messages import Codec

__all__ = [
    "COMMIT_CODEC", "LINE_BYTES", "SUPERBLOCK_BYTES", "CkStatus", "Image", "Logger", "Memory",
    "MlpSlot", "PmemWrite", "RecoveryReport", "RecoveryStatus", "Superblock",
    "TrainingOracle", "bytes_sum64", "commit_word", "encode_mlp_slot", "encode_record",
    "format_device", "format_superblock", "header_valid", "mlp_check", "mlp_slot_valid",
    "parse_commit_word", "parse_header", "parse_mlp_header", "parse_superblock",
    "read_commit_word", "read_mlp_slot", "read_superblock", "record_check", "record_valid",
    "recover", "recover_steps", "recover_with_crash", "sum64", "superblock_valid", "tear",
    "words",
]

LINE_BYTES = 64
WORD_BYTES = 8
MASK64 = (1 << 64) - 1
#: The superblock: line 0 (driver) and line 1 (commit word + reserved).
SUPERBLOCK_BYTES = 2 * LINE_BYTES
COMMIT_CODEC = Codec(COMMIT_WORD)
EPOCH_MASK = 0xFFFF


class Memory(Protocol):
    """What the model needs of a memory: durable byte reads and writes."""

    def read(self, addr: int, n: int) -> bytes: ...

    def write(self, addr: int, data: bytes) -> None: ...


class CkStatus(IntEnum):
    """Descriptor completion statuses the checkpoint contract adds (``docs/checkpoint.md``)."""

    OK = 0
    LOG_FULL = 7
    BAD_BATCH = 8


class RecoveryStatus(IntEnum):
    """Outcome of recovery (``CK_STATUS`` error code; numbering model-local until
    ``docs/registers.md`` defines it)."""

    DONE = 0
    NO_SUPERBLOCK = 1


# --- Checksum ------------------------------------------------------------------------

def sum64(words_: Iterable[int]) -> int:
    """The contract's checksum: the sum of 64-bit words modulo 2**64, rotated left by one
    bit, XOR ``SUM64_KEY``."""
    total = 0
    for w in words_:
        total += int(w) & MASK64
    total &= MASK64
    return (((total << 1) | (total >> 63)) & MASK64) ^ SUM64_KEY


def words(data: bytes) -> list[int]:
    """The little-endian 64-bit words of ``data`` (a multiple of 8 bytes)."""
    if len(data) % WORD_BYTES:
        raise ValueError(f"data must be a multiple of 8 bytes, not {len(data)}")
    return [int.from_bytes(data[i:i + WORD_BYTES], "little")
            for i in range(0, len(data), WORD_BYTES)]


def bytes_sum64(*chunks: bytes) -> int:
    """:func:`sum64` over the words of every chunk, in order."""
    return sum64(w for c in chunks for w in words(c))


def _line(value: int) -> bytes:
    return value.to_bytes(LINE_BYTES, "little")


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


# --- Superblock and commit word ------------------------------------------------------

@dataclass(frozen=True)
class Superblock:
    """The geometry in superblock line 0."""

    log_base: int
    log_slots: int
    slot_lines: int
    mlp_slot0: int
    mlp_slot1: int
    mlp_slot_bytes: int

    @property
    def max_payload_lines(self) -> int:
        return self.slot_lines - 1

    @property
    def mlp_slots(self) -> tuple[int, int]:
        return (self.mlp_slot0, self.mlp_slot1)

    @property
    def log_bytes(self) -> int:
        return self.log_slots * self.slot_lines * LINE_BYTES

    def slot_addr(self, slot: int) -> int:
        """Address of the header line of log slot ``slot``."""
        return self.log_base + (slot % self.log_slots) * self.slot_lines * LINE_BYTES

    def mlp_header_addr(self, slot: int) -> int:
        return self.mlp_slots[slot] + self.mlp_slot_bytes


def _check_geometry(log_base: int, log_slots: int, slot_lines: int) -> str | None:
    if not _is_pow2(log_slots):
        return f"log_slots must be a power of two, not {log_slots}"
    if slot_lines < 2 or slot_lines > 256:
        return f"slot_lines must be 2..256, not {slot_lines}"
    if log_base % LINE_BYTES:
        return f"log_base must be 64-byte aligned, not {log_base:#x}"
    return None


def format_superblock(log_base: int, log_slots: int, slot_lines: int, mlp_slot0: int,
                      mlp_slot1: int, mlp_slot_bytes: int) -> bytes:
    """Superblock line 0 (64 bytes) with a correct ``check``."""
    problem = _check_geometry(log_base, log_slots, slot_lines)
    if problem:
        raise ValueError(problem)
    fields = dict(magic=SB_MAGIC, version=SB_VERSION, log_slots=log_slots, log_base=log_base,
                  slot_lines=slot_lines, rsvd0=0, mlp_slot0=mlp_slot0, mlp_slot1=mlp_slot1,
                  mlp_slot_bytes=mlp_slot_bytes)
    line = _line(SUPERBLOCK_CODEC.pack(**fields))
    check = bytes_sum64(line[:56])
    return _line(SUPERBLOCK_CODEC.pack(**fields, check=check))


def parse_superblock(line: bytes) -> dict[str, int]:
    """The fields of superblock line 0."""
    return SUPERBLOCK_CODEC.unpack(int.from_bytes(line[:LINE_BYTES], "little"))


def superblock_valid(line: bytes) -> bool:
    """Line 0 passes recovery step 1 (see reading 2 in the module docstring)."""
    if len(line) != LINE_BYTES:
        return False
    f = parse_superblock(line)
    return (f["check"] == bytes_sum64(line[:56]) and f["magic"] == SB_MAGIC
            and f["version"] == SB_VERSION
            and _check_geometry(f["log_base"], f["log_slots"], f["slot_lines"]) is None)


def read_superblock(mem: Memory) -> Superblock | None:
    """The superblock geometry, or ``None`` when line 0 is not valid."""
    line = mem.read(0, LINE_BYTES)
    if not superblock_valid(line):
        return None
    f = parse_superblock(line)
    return Superblock(f["log_base"], f["log_slots"], f["slot_lines"], f["mlp_slot0"],
                      f["mlp_slot1"], f["mlp_slot_bytes"])


def commit_word(committed: int, epoch: int) -> bytes:
    """The 8-byte commit word ``{committed, epoch, 0xC0DE}``."""
    return COMMIT_CODEC.pack(committed=committed, epoch=epoch, magic=COMMIT_MAGIC).to_bytes(
        WORD_BYTES, "little")


def parse_commit_word(data: bytes) -> dict[str, int]:
    """``committed``, ``epoch`` and ``magic`` of an 8-byte commit word."""
    return COMMIT_CODEC.unpack(int.from_bytes(data[:WORD_BYTES], "little"))


def read_commit_word(mem: Memory) -> tuple[int, int] | None:
    """``(committed, epoch)``, or ``None`` when the commit word's magic is wrong."""
    f = parse_commit_word(mem.read(COMMIT_WORD_ADDR, WORD_BYTES))
    if f["magic"] != COMMIT_MAGIC:
        return None
    return f["committed"], f["epoch"]


def format_device(mem: Memory, *, log_base: int, log_slots: int, slot_lines: int,
                  mlp_slot0: int, mlp_slot1: int, mlp_slot_bytes: int) -> Superblock:
    """What the driver writes to format a device: line 0, line 1 (commit word ``{0, 0}``,
    rest zero), a zero header line in every log slot and zero MLP slot headers
    (reading 3)."""
    mem.write(0, format_superblock(log_base, log_slots, slot_lines, mlp_slot0, mlp_slot1,
                                   mlp_slot_bytes))
    mem.write(LINE_BYTES, commit_word(0, 0) + bytes(LINE_BYTES - WORD_BYTES))
    sb = Superblock(log_base, log_slots, slot_lines, mlp_slot0, mlp_slot1, mlp_slot_bytes)
    zero = bytes(LINE_BYTES)
    for s in range(log_slots):
        mem.write(sb.slot_addr(s), zero)
    for i in (0, 1):
        mem.write(sb.mlp_header_addr(i), zero)
    return sb


# --- Undo-log records ------------------------------------------------------------------

def _check_payload(payload: bytes) -> int:
    if len(payload) == 0 or len(payload) % LINE_BYTES:
        raise ValueError(f"payload must be whole lines, not {len(payload)} bytes")
    n = len(payload) // LINE_BYTES
    if n > 255:
        raise ValueError(f"payload of {n} lines does not fit the 8-bit n field")
    return n


def record_check(header_line: bytes, payload: bytes) -> int:
    """``sum64`` of header words 0..6 and every payload word."""
    return bytes_sum64(header_line[:56], payload)


def encode_record(epoch: int, batch_id: int, seq: int, table_id: int, row: int, addr: int,
                  payload: bytes) -> bytes:
    """Header line followed by the payload lines (``n = len(payload) / 64``)."""
    n = _check_payload(payload)
    fields = dict(magic=LOG_MAGIC, epoch=epoch, n=n, batch_id=batch_id, seq=seq,
                  table_id=table_id, row=row, addr=addr)
    header = _line(HEADER_CODEC.pack(**fields))
    header = _line(HEADER_CODEC.pack(**fields, check=record_check(header, payload)))
    return header + bytes(payload)


def parse_header(line: bytes) -> dict[str, int]:
    """The fields of a record header line."""
    return HEADER_CODEC.unpack(int.from_bytes(line[:LINE_BYTES], "little"))


def header_valid(header_line: bytes, epoch: int, slot_lines: int | None = None) -> bool:
    """Pass-1 (header words only) validity: magic, epoch and ``n`` range (reading 1).
    ``slot_lines=None`` only requires ``n >= 1``."""
    f = parse_header(header_line)
    n_max = 255 if slot_lines is None else slot_lines - 1
    return f["magic"] == LOG_MAGIC and f["epoch"] == epoch and 1 <= f["n"] <= n_max


def record_valid(header_line: bytes, payload: bytes, epoch: int,
                 slot_lines: int | None = None) -> bool:
    """Full validity: :func:`header_valid`, ``payload`` holds (at least) the ``n`` lines,
    and ``check`` matches over the header and the first ``n`` payload lines."""
    if not header_valid(header_line, epoch, slot_lines):
        return False
    f = parse_header(header_line)
    nbytes = f["n"] * LINE_BYTES
    if len(payload) < nbytes:
        return False
    return f["check"] == record_check(header_line, payload[:nbytes])


# --- MLP checkpoint slots --------------------------------------------------------------

def _mlp_words(length: int) -> int:
    return -(-length // WORD_BYTES)


def mlp_check(header_line: bytes, payload: bytes) -> int:
    """``sum64`` of MLP header words 0..2 and the ``ceil(length / 8)`` payload words."""
    length = parse_mlp_header(header_line)["length"]
    stored = payload[:_mlp_words(length) * WORD_BYTES]
    stored = stored + bytes(_mlp_words(length) * WORD_BYTES - len(stored))
    return bytes_sum64(header_line[:24], stored)


def encode_mlp_slot(batch_id: int, payload: bytes) -> tuple[bytes, bytes]:
    """``(payload zero-padded to whole lines, header line)`` of an MLP checkpoint."""
    length = len(payload)
    padded = bytes(payload) + bytes(-length % LINE_BYTES)
    fields = dict(magic=MLP_MAGIC, batch_id=batch_id, length=length)
    header = _line(MLP_HEADER_CODEC.pack(**fields))
    header = _line(MLP_HEADER_CODEC.pack(**fields, check=mlp_check(header, padded)))
    return padded, header


def parse_mlp_header(line: bytes) -> dict[str, int]:
    return MLP_HEADER_CODEC.unpack(int.from_bytes(line[:LINE_BYTES], "little"))


def mlp_slot_valid(header_line: bytes, payload: bytes, slot_bytes: int | None = None) -> bool:
    """Magic, ``length <= slot_bytes`` (when given) and ``check`` (reading 6).
    ``payload`` is the slot's stored payload region (at least ``length`` bytes)."""
    f = parse_mlp_header(header_line)
    if f["magic"] != MLP_MAGIC:
        return False
    if slot_bytes is not None and f["length"] > slot_bytes:
        return False
    if len(payload) < f["length"]:
        return False
    return f["check"] == mlp_check(header_line, payload)


@dataclass(frozen=True)
class MlpSlot:
    slot: int
    valid: bool
    batch_id: int
    length: int

    def payload(self, mem: Memory, sb: Superblock) -> bytes:
        return mem.read(sb.mlp_slots[self.slot], self.length)


def read_mlp_slot(mem: Memory, sb: Superblock, slot: int) -> MlpSlot:
    """Read and validate MLP slot ``slot`` (header first, then the payload it names)."""
    header = mem.read(sb.mlp_header_addr(slot), LINE_BYTES)
    f = parse_mlp_header(header)
    valid = False
    if f["magic"] == MLP_MAGIC and f["length"] <= sb.mlp_slot_bytes:
        payload = mem.read(sb.mlp_slots[slot], _mlp_words(f["length"]) * WORD_BYTES)
        valid = mlp_slot_valid(header, payload, sb.mlp_slot_bytes)
    return MlpSlot(slot, valid, f["batch_id"], f["length"])


def newest_mlp(slots: Iterable[MlpSlot], committed: int | None = None) -> MlpSlot | None:
    """The valid slot with the largest ``batch_id`` (ties: the lower slot); with
    ``committed``, only slots whose batch is not after it (a checkpoint of a batch that
    never committed would be ahead of the tables)."""
    best = None
    for s in slots:
        if not s.valid or (committed is not None and s.batch_id > committed):
            continue
        if best is None or s.batch_id > best.batch_id:
            best = s
    return best


# --- Memory image ------------------------------------------------------------------------

class Image:
    """Sparse byte-addressed memory of 64-byte lines, zero where never written.

    ``lines`` maps line addresses (byte address of the line, a multiple of 64, as in
    :meth:`tb.pmem.PmemModel.snapshot`) to 64 bytes.
    """

    def __init__(self, lines: Mapping[int, bytes] | None = None):
        self.lines: dict[int, bytes] = {}
        for addr, data in (lines or {}).items():
            self.write(addr, data)

    @classmethod
    def from_snapshot(cls, snapshot: Mapping[int, bytes]) -> Image:
        return cls(snapshot)

    def read(self, addr: int, n: int) -> bytes:
        if addr < 0 or n < 0:
            raise ValueError(f"addr and n must be non-negative, not {addr}, {n}")
        if n == 0:
            return b""
        first = addr & ~(LINE_BYTES - 1)
        out = bytearray()
        zero = bytes(LINE_BYTES)
        for line in range(first, addr + n, LINE_BYTES):
            out += self.lines.get(line, zero)
        off = addr - first
        return bytes(out[off:off + n])

    def write(self, addr: int, data: bytes) -> None:
        if addr < 0:
            raise ValueError(f"addr must be non-negative, not {addr}")
        pos = 0
        data = bytes(data)
        while pos < len(data):
            a = addr + pos
            line = a & ~(LINE_BYTES - 1)
            off = a - line
            k = min(LINE_BYTES - off, len(data) - pos)
            if off == 0 and k == LINE_BYTES:
                new = data[pos:pos + LINE_BYTES]
            else:
                old = self.lines.get(line, bytes(LINE_BYTES))
                new = old[:off] + data[pos:pos + k] + old[off + k:]
            self.lines[line] = new
            pos += k

    def snapshot(self) -> dict[int, bytes]:
        """Non-zero lines, sorted (comparable with ``PmemModel.snapshot()``)."""
        zero = bytes(LINE_BYTES)
        return {a: d for a, d in sorted(self.lines.items()) if d != zero}

    def copy(self) -> Image:
        img = Image()
        img.lines = dict(self.lines)
        return img

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Image):
            return NotImplemented
        return self.snapshot() == other.snapshot()

    __hash__ = None  # type: ignore[assignment]


def tear(old: bytes, new: bytes, rng: random.Random, p_new: float = 0.5) -> bytes:
    """A write of ``new`` over ``old`` torn at 8-byte granularity: each word is new with
    probability ``p_new``, independently (as ``PmemModel.power_fail``)."""
    if len(old) != len(new) or len(new) % WORD_BYTES:
        raise ValueError("old and new must be equal multiples of 8 bytes")
    out = bytearray(old)
    for i in range(0, len(new), WORD_BYTES):
        if rng.random() < p_new:
            out[i:i + WORD_BYTES] = new[i:i + WORD_BYTES]
    return bytes(out)


# --- Recovery ----------------------------------------------------------------------------

@dataclass(frozen=True)
class PmemWrite:
    """One PMEM write recovery makes. ``fence``: issued only once every earlier write is
    durable (the commit word)."""

    addr: int
    data: bytes
    kind: str           # "restore" or "commit"
    fence: bool = False


@dataclass
class RecoveryReport:
    """What recovery reports (the ``CK_*`` CSRs) and how it got there.

    Members
    -------
    status, committed:
        ``CK_STATUS`` code and ``CK_COMMITTED`` (C).
    epoch:
        The epoch recovery wrote (``E + 1``); the old epoch for ``NO_SUPERBLOCK``.
    mlp_slot, mlp_batch:
        ``CK_MLP_SLOT`` (0, 1 or ``None``) and ``CK_MLP_BATCH`` (0 with no slot).
    rolled_back:
        ``CK_ROLLED_BACK``: valid live records whose payload was written back.
    newest_seq, start_slot:
        Pass 1's result (``None`` when no header was live).
    restored:
        ``(slot, seq, batch_id, table_id, row, addr)`` of every restored record in
        restore order.
    writes:
        PMEM writes made (restore lines + the commit word).
    """

    status: RecoveryStatus
    committed: int = 0
    epoch: int = 0
    mlp_slot: int | None = None
    mlp_batch: int = 0
    rolled_back: int = 0
    newest_seq: int | None = None
    start_slot: int | None = None
    restored: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)
    writes: int = 0

    @property
    def order_ok(self) -> bool:
        """Restores came out in strictly decreasing ``seq`` (true reverse log order)."""
        seqs = [r[1] for r in self.restored]
        return all(a > b for a, b in pairwise(seqs))

    @property
    def mlp_ahead(self) -> bool:
        """The reported MLP checkpoint is of a batch newer than the committed one."""
        return self.mlp_slot is not None and self.mlp_batch > self.committed

    @property
    def csrs(self) -> dict[str, int | None]:
        return {"CK_COMMITTED": self.committed, "CK_MLP_SLOT": self.mlp_slot,
                "CK_MLP_BATCH": self.mlp_batch, "CK_ROLLED_BACK": self.rolled_back,
                "CK_STATUS": int(self.status)}


def recover_steps(mem: Memory) -> Generator[PmemWrite, None, RecoveryReport]:
    """Recovery steps 1-5 as a generator of the PMEM writes it makes, in order.

    The caller must make each yielded write (or stop, to model a power cut) before
    resuming; the generator's return value (``StopIteration.value``) is the
    :class:`RecoveryReport`. :func:`recover` drives it to the end.
    """
    # Step 1: superblock and commit word.
    sb = read_superblock(mem)
    cw = read_commit_word(mem) if sb is not None else None
    if sb is None or cw is None:
        return RecoveryReport(RecoveryStatus.NO_SUPERBLOCK)
    committed, epoch = cw
    report = RecoveryReport(RecoveryStatus.DONE, committed=committed)

    # Step 2, pass 1: whole records (a header torn between an old and a new record
    # could pass a header-only check with a stale seq).
    best: tuple[int, int] | None = None          # (seq, slot)
    for slot in range(sb.log_slots):
        base = sb.slot_addr(slot)
        header = mem.read(base, LINE_BYTES)
        if not header_valid(header, epoch, sb.slot_lines):
            continue
        f = parse_header(header)
        payload = mem.read(base + LINE_BYTES, f["n"] * LINE_BYTES)
        if not record_valid(header, payload, epoch, sb.slot_lines):
            continue
        if f["batch_id"] > committed and (best is None or f["seq"] > best[0]):
            best = (f["seq"], slot)

    # Step 3, pass 2: every slot backwards from the newest live one, whole records.
    if best is not None:
        report.newest_seq, report.start_slot = best
        for i in range(sb.log_slots):
            slot = (best[1] - i) % sb.log_slots
            base = sb.slot_addr(slot)
            header = mem.read(base, LINE_BYTES)
            if not header_valid(header, epoch, sb.slot_lines):
                continue
            f = parse_header(header)
            payload = mem.read(base + LINE_BYTES, f["n"] * LINE_BYTES)
            if f["batch_id"] <= committed or not record_valid(header, payload, epoch,
                                                              sb.slot_lines):
                continue
            for k in range(f["n"]):
                yield PmemWrite(f["addr"] + k * LINE_BYTES,
                                payload[k * LINE_BYTES:(k + 1) * LINE_BYTES], "restore")
                report.writes += 1
            report.rolled_back += 1
            report.restored.append((slot, f["seq"], f["batch_id"], f["table_id"], f["row"],
                                    f["addr"]))

    # Step 4: the commit word with the next epoch, after every restore is durable.
    report.epoch = (epoch + 1) & EPOCH_MASK
    yield PmemWrite(COMMIT_WORD_ADDR, commit_word(committed, report.epoch), "commit",
                    fence=True)
    report.writes += 1

    # Step 5: MLP slots.
    mlp = newest_mlp((read_mlp_slot(mem, sb, i) for i in (0, 1)), committed)
    if mlp is not None:
        report.mlp_slot, report.mlp_batch = mlp.slot, mlp.batch_id
    return report


def recover(mem: Memory) -> RecoveryReport:
    """Run recovery to completion on ``mem``."""
    steps = recover_steps(mem)
    try:
        while True:
            w = next(steps)
            mem.write(w.addr, w.data)
    except StopIteration as stop:
        return stop.value


def recover_with_crash(mem: Memory, cut: int, rng: random.Random | None = None, *,
                       inflight: int = 1,
                       weights: tuple[float, float, float] = (1.0, 1.0, 1.0),
                       ) -> RecoveryReport | None:
    """Recovery with a power failure after its first ``cut`` writes are durable.

    The next ``inflight`` writes (never past a fence: the commit word is not issued while
    restores are pending) were in flight: with ``rng`` each is dropped, applied or torn
    at 8-byte granularity with relative ``weights`` (as ``PmemModel.power_fail``);
    without ``rng`` they are dropped. Returns ``None`` when power failed, else the report
    of a recovery that finished within ``cut`` writes.
    """
    steps = recover_steps(mem)
    done = 0
    pending: list[PmemWrite] = []
    try:
        while True:
            w = next(steps)
            if done < cut:
                mem.write(w.addr, w.data)
                done += 1
                continue
            if pending and w.fence:
                break
            pending.append(w)
            if len(pending) >= inflight:
                break
    except StopIteration as stop:
        if not pending:
            return stop.value
    for w in pending:
        if rng is None:
            continue
        outcome = rng.choices(("dropped", "applied", "torn"), weights)[0]
        if outcome == "applied":
            mem.write(w.addr, w.data)
        elif outcome == "torn":
            mem.write(w.addr, tear(mem.read(w.addr, len(w.data)), w.data, rng))
    return None


# --- Logger ------------------------------------------------------------------------------

def default_filter_index(batch_id: int, table_id: int, row: int, entries: int) -> int:
    """A direct-mapped index (not the RTL's: the contract leaves it open)."""
    return (row ^ (table_id * 0x9E3779B1) ^ (batch_id << 7)) % entries


@dataclass(frozen=True)
class LoggedRecord:
    seq: int
    slot: int
    batch_id: int
    table_id: int
    row: int
    addr: int
    data: bytes         # header + payload lines as written


class Logger:
    """The device's undo logger as ``docs/checkpoint.md`` states it ("Logging").

    Starts on a formatted or recovered ``mem`` (reads the superblock and the commit word;
    ``seq`` counts from 0). Records are written to ``mem`` at once (``write=False``
    only builds them, for tests that place or tear them by hand).

    Parameters
    ----------
    filter_rows:
        Entries of the direct-mapped dedup filter keyed on ``(batch, table, row)``; 0
        disables it (every capture is logged).
    filter_index:
        ``(batch, table, row, entries) -> index``; the RTL's indexing is not part of the
        contract.
    """

    def __init__(self, mem: Memory, *, filter_rows: int = 0,
                 filter_index: Callable[[int, int, int, int], int] = default_filter_index,
                 write: bool = True):
        sb = read_superblock(mem)
        cw = read_commit_word(mem)
        if sb is None or cw is None:
            raise ValueError("memory holds no valid superblock / commit word")
        if filter_rows < 0:
            raise ValueError(f"filter_rows must be non-negative, not {filter_rows}")
        self.mem = mem
        self.sb = sb
        self.committed, self.epoch = cw
        self.write_seq = 0
        self.filter_rows = filter_rows
        self.filter_index = filter_index
        self._filter: list[tuple[int, int, int] | None] = [None] * filter_rows
        self._write = write
        #: First seq of every batch with records that is not committed.
        self.batch_first: dict[int, int] = {}
        self.overflowed: set[int] = set()
        self.log_full = False           # CK_STATUS.LOG_FULL, sticky
        self.last_lookup_batch = 0
        self.records: list[LoggedRecord] = []
        self.filtered = 0
        self.discarded = 0

    @property
    def oldest(self) -> int:
        """First seq of the oldest batch not yet committed (``write_seq`` if none)."""
        return min(self.batch_first.values(), default=self.write_seq)

    @property
    def full(self) -> bool:
        return self.write_seq - self.oldest >= self.sb.log_slots

    def lookup(self, batch_id: int) -> None:
        """A capturing LOOKUP of ``batch_id`` starts (even if it captures nothing new)."""
        self.last_lookup_batch = batch_id

    def capture(self, batch_id: int, table_id: int, row: int, addr: int,
                old_row_bytes: bytes) -> LoggedRecord | None:
        """One captured row. Returns the record written, or ``None`` when the filter
        skipped it or the batch overflowed."""
        n = _check_payload(old_row_bytes)
        if n > self.sb.max_payload_lines:
            raise ValueError(f"row of {n} lines does not fit a slot of "
                             f"{self.sb.slot_lines} lines")
        self.last_lookup_batch = batch_id
        key = (batch_id, table_id, row)
        idx = self.filter_index(batch_id, table_id, row, self.filter_rows) \
            if self.filter_rows else None
        if idx is not None and self._filter[idx] == key:
            self.filtered += 1
            return None
        if batch_id in self.overflowed:
            self.discarded += 1
            return None
        if self.full:
            self.overflowed.add(batch_id)
            self.log_full = True
            self.discarded += 1
            return None
        seq = self.write_seq
        slot = seq % self.sb.log_slots
        data = encode_record(self.epoch, batch_id, seq, table_id, row, addr, old_row_bytes)
        if self._write:
            self.mem.write(self.sb.slot_addr(slot), data)
        self.write_seq += 1
        if batch_id > self.committed:
            self.batch_first.setdefault(batch_id, seq)
        if idx is not None:
            self._filter[idx] = key
        rec = LoggedRecord(seq, slot, batch_id, table_id, row, addr, data)
        self.records.append(rec)
        return rec

    def update_allowed(self, batch_id: int) -> CkStatus:
        """Status of an UPDATE of ``batch_id`` ("Space" and "Ordering" bullets; BAD_BATCH
        is checked first)."""
        if batch_id <= self.committed or batch_id != self.last_lookup_batch:
            return CkStatus.BAD_BATCH
        if batch_id in self.overflowed:
            return CkStatus.LOG_FULL
        return CkStatus.OK

    def commit(self, batch_id: int) -> CkStatus:
        """COMMIT(``batch_id``): writes the commit word and frees the batches' records."""
        if batch_id <= self.committed:
            return CkStatus.BAD_BATCH
        if self._write:
            self.mem.write(COMMIT_WORD_ADDR, commit_word(batch_id, self.epoch))
        self.committed = batch_id
        for b in [b for b in self.batch_first if b <= batch_id]:
            del self.batch_first[b]
        return CkStatus.OK

    def write_mlp(self, slot: int, batch_id: int, payload: bytes) -> None:
        """An MLP_CHECKPOINT into ``slot``: payload first, header last."""
        if len(payload) > self.sb.mlp_slot_bytes:
            raise ValueError("payload exceeds mlp_slot_bytes")
        data, header = encode_mlp_slot(batch_id, payload)
        self.mem.write(self.sb.mlp_slots[slot], data[:self.sb.mlp_slot_bytes])
        self.mem.write(self.sb.mlp_header_addr(slot), header)

    def mlp_target(self) -> int:
        """The slot that does not hold the newest valid checkpoint."""
        newest = newest_mlp(read_mlp_slot(self.mem, self.sb, i) for i in (0, 1))
        return 0 if newest is None else 1 - newest.slot


# --- Training oracle ---------------------------------------------------------------------

def _as_bytes(table) -> bytes:
    if isinstance(table, np.ndarray):
        return np.ascontiguousarray(table).tobytes()
    return bytes(table)


class TrainingOracle:
    """Golden tables after every batch, for crash tests (``docs/architecture.md`` invariants).

    ``tables`` maps ``table_id -> (addr, initial contents)`` (bytes or a numpy array,
    laid out as in device memory). Call :meth:`after_batch` with the tables as they are
    once a batch's updates are done (only the changed tables are needed),
    :meth:`commit_issued` when a COMMIT enters the ring and :meth:`commit_completed` when
    it completes; after a crash and recovery :meth:`check` asserts the invariants.
    """

    def __init__(self, tables: Mapping[int, tuple[int, object]]):
        self.addrs = {t: a for t, (a, _) in tables.items()}
        self.states: dict[int, dict[int, bytes]] = {
            0: {t: _as_bytes(v) for t, (_, v) in tables.items()}}
        self.issued = 0
        self.completed = 0

    def after_batch(self, batch_id: int, tables: Mapping[int, object]) -> None:
        if batch_id <= max(self.states):
            raise ValueError(f"batch {batch_id} is not newer than {max(self.states)}")
        state = dict(self.expected(batch_id))
        for t, v in tables.items():
            if t not in self.addrs:
                raise KeyError(f"unknown table {t}")
            state[t] = _as_bytes(v)
        self.states[batch_id] = state

    def commit_issued(self, batch_id: int) -> None:
        self.issued = max(self.issued, batch_id)

    def commit_completed(self, batch_id: int) -> None:
        self.issued = max(self.issued, batch_id)
        self.completed = max(self.completed, batch_id)

    def expected(self, batch_id: int) -> dict[int, bytes]:
        """The tables after exactly batch ``batch_id`` (the newest recorded state at or
        before it)."""
        return self.states[max(b for b in self.states if b <= batch_id)]

    def check(self, mem: Memory, report: RecoveryReport) -> None:
        """Assert: recovery succeeded, every completed COMMIT is still committed, nothing
        beyond the last issued COMMIT is, and the tables equal the golden model after
        exactly the committed batch, bit for bit."""
        assert report.status == RecoveryStatus.DONE, f"recovery failed: {report.status!r}"
        c = report.committed
        assert c >= self.completed, f"committed {c} < completed COMMIT {self.completed}"
        assert c <= self.issued, f"committed {c} > last issued COMMIT {self.issued}"
        for t, want in self.expected(c).items():
            got = mem.read(self.addrs[t], len(want))
            if got != want:
                bad = next(i for i in range(len(want)) if got[i] != want[i])
                raise AssertionError(
                    f"table {t} differs from the golden state after batch {c} at byte "
                    f"{bad} (address {self.addrs[t] + bad:#x}); rolled back "
                    f"{report.rolled_back}")
