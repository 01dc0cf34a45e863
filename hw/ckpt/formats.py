"""On-media formats of ``docs/checkpoint.md``: superblock, commit word, undo-log record
header, MLP slot header, and the ``sum64`` checksum in hardware.

The layouts serve the RTL, the golden model (``sim/ckpt.py``) and the test benches
(pack / unpack through :class:`~hw.cxl.messages.Codec`), so each field is defined once.
"""

from __future__ import annotations

import operator
from functools import reduce

from amaranth.hdl import C, Cat, Module, Signal, Value
from amaranth.lib import data

from hw.config import LINE_BITS
from hw.cxl.messages import Codec

__all__ = [
    "COMMIT_MAGIC", "COMMIT_WORD", "COMMIT_WORD_ADDR", "HEADER", "HEADER_CODEC",
    "LINE_BITS", "LOG_MAGIC", "MLP_HEADER", "MLP_HEADER_CODEC", "MLP_MAGIC",
    "SB_MAGIC", "SB_VERSION", "SUM64_KEY", "SUPERBLOCK", "SUPERBLOCK_CODEC", "line_sum",
    "sum64_finish",
]

#: Byte address of the commit word (superblock line 1, bytes 0..7).
COMMIT_WORD_ADDR = 64

SB_MAGIC = 0x3130_4253_4C58_4354       # "TCXLSB01" as little-endian bytes
SB_VERSION = 1
COMMIT_MAGIC = 0xC0DE
LOG_MAGIC = 0x474F_4C55                # "ULOG"
MLP_MAGIC = 0x4350_4C4D                # "MLPC"
#: XOR-ed into every checksum so that an all-zero line never checks.
SUM64_KEY = 0x9E37_79B9_7F4A_7C15

#: Superblock line 0 (written by the driver).
SUPERBLOCK = data.StructLayout({
    "magic": 64,
    "version": 32,
    "log_slots": 32,
    "log_base": 64,
    "slot_lines": 32,
    "rsvd0": 32,
    "mlp_slot0": 64,
    "mlp_slot1": 64,
    "mlp_slot_bytes": 64,
    "check": 64,            # sum64 of the seven words above
})

#: The commit word (superblock line 1, bytes 0..7; written by the device).
COMMIT_WORD = data.StructLayout({
    "committed": 32,
    "epoch": 16,
    "magic": 16,            # COMMIT_MAGIC
})

#: Undo-log record header line.
HEADER = data.StructLayout({
    "magic": 32,
    "epoch": 16,
    "n": 8,                 # payload lines
    "rsvd0": 8,
    "batch_id": 32,
    "seq": 32,
    "table_id": 16,
    "rsvd1": 16,
    "row": 32,
    "addr": 64,             # device address of the row's first line
    "rsvd2": 192,
    "check": 64,            # sum64 of header words 0..6 and every payload word
})

#: MLP checkpoint slot header line (after the payload).
MLP_HEADER = data.StructLayout({
    "magic": 32,
    "rsvd0": 32,
    "batch_id": 32,
    "rsvd1": 32,
    "length": 64,           # payload bytes
    "check": 64,            # sum64 of the three words above and every payload word
    "rsvd2": 256,
})

SUPERBLOCK_CODEC = Codec(SUPERBLOCK)
HEADER_CODEC = Codec(HEADER)
MLP_HEADER_CODEC = Codec(MLP_HEADER)


def line_sum(m: Module, line: Value, *, words: int = 8, name: str = "line_sum") -> Signal:
    """The sum modulo 2**64 of the first ``words`` 64-bit words of a 512-bit ``line``
    (an adder tree, combinational)."""
    parts = [line[64 * i:64 * i + 64] for i in range(words)]
    out = Signal(64, name=name)
    m.d.comb += out.eq(reduce(operator.add, parts))     # truncated to 64 bits
    return out


def sum64_finish(total: Value) -> Value:
    """``rotl(total, 1) ^ SUM64_KEY``: the checksum from the running word sum."""
    return Cat(total[63], total[:63]) ^ C(SUM64_KEY, 64)
