"""Golden model of the device memory seen through CXL.mem: sparse 64-byte lines.

Written from the contract (``docs/architecture.md``, ``docs/mem-endpoint.md``), not from
the RTL: memory order is the M2S handshake order, a MemWr replaces a whole line, a
MemWrPtl replaces exactly the bytes whose enable bit is set, and a line nobody wrote
reads as its initial value (zero, like a fresh PMEM model).

Lines are keyed by an integer chosen by the user (the test benches use the PMEM line
index, so that moving the HDM window does not move the data). The model is plain
Python with no simulator imports, so unit tests, the full-device scoreboard and reports
share it.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["FULL_MASK", "LINE_BYTES", "GoldenMemory", "mask_bytes", "merge_line"]

LINE_BYTES = 64
#: Byte-enable mask with every one of the 64 bytes enabled.
FULL_MASK = (1 << LINE_BYTES) - 1


def mask_bytes(byte_enable: int) -> bytes:
    """Expand a 64-bit byte-enable mask to 64 bytes of 0xFF / 0x00 (bit *i* -> byte *i*)."""
    return bytes(0xFF if (byte_enable >> i) & 1 else 0 for i in range(LINE_BYTES))


def merge_line(old: bytes, new: bytes, byte_enable: int = FULL_MASK) -> bytes:
    """``old`` with the bytes of ``new`` whose enable bit is set."""
    if len(old) != LINE_BYTES or len(new) != LINE_BYTES:
        raise ValueError(f"lines are {LINE_BYTES} bytes, not {len(old)} and {len(new)}")
    if byte_enable & ~FULL_MASK:
        raise ValueError(f"byte_enable must fit {LINE_BYTES} bits, not {byte_enable:#x}")
    if byte_enable == FULL_MASK:
        return bytes(new)
    if byte_enable == 0:
        return bytes(old)
    # Integer arithmetic is much faster than a per-byte loop in CPython.
    keep = int.from_bytes(mask_bytes(byte_enable), "little")
    o = int.from_bytes(old, "little")
    n = int.from_bytes(new, "little")
    return ((o & ~keep) | (n & keep)).to_bytes(LINE_BYTES, "little")


class GoldenMemory:
    """Sparse line-granular memory with byte-enable writes.

    Parameters
    ----------
    lines:
        Number of lines (valid keys are ``0 <= line < lines``); ``None`` for unbounded.
    fill:
        Initial value of every line (64 bytes; default all zero).

    Members
    -------
    writes:
        Count of :meth:`write` calls that changed or could have changed a line.
    """

    def __init__(self, lines: int | None = None, *, fill: bytes = bytes(LINE_BYTES)):
        if lines is not None and lines <= 0:
            raise ValueError(f"lines must be positive, not {lines}")
        if len(fill) != LINE_BYTES:
            raise ValueError(f"fill must be {LINE_BYTES} bytes, not {len(fill)}")
        self._lines = lines
        self._fill = bytes(fill)
        self._mem: dict[int, bytes] = {}
        self.writes = 0

    def _check(self, line: int) -> None:
        if line < 0 or (self._lines is not None and line >= self._lines):
            raise IndexError(f"line {line} outside 0..{self._lines}")

    def read(self, line: int) -> bytes:
        """The current 64 bytes of ``line``."""
        self._check(line)
        return self._mem.get(line, self._fill)

    def write(self, line: int, data: bytes, byte_enable: int = FULL_MASK) -> bytes:
        """Write the enabled bytes of ``data`` to ``line``; returns the new line value."""
        self._check(line)
        new = merge_line(self.read(line), data, byte_enable)
        self._mem[line] = new
        self.writes += 1
        return new

    def set(self, line: int, data: bytes) -> None:
        """Backdoor: make ``line`` hold ``data`` (e.g. resynchronise after a crash)."""
        self.write(line, data)
        self.writes -= 1

    def touched(self) -> Iterator[int]:
        """Every line ever written, in ascending order."""
        return iter(sorted(self._mem))

    def __contains__(self, line: int) -> bool:
        return line in self._mem

    def __len__(self) -> int:
        return len(self._mem)

    def clear(self) -> None:
        self._mem.clear()
        self.writes = 0
