"""Struct payloads as integers for Amaranth-simulator test benches.

Unlike :class:`hw.cxl.messages.Codec`, :func:`pack` masks each value to its field, so
a bench can pass signed values (an int32 index of -1, say) as they are.
"""

from __future__ import annotations

__all__ = ["pack", "unpack"]


def pack(layout, fields: dict | None = None, /, **more) -> int:
    """``fields`` (and keyword fields) packed LSB first, as Amaranth lays them out;
    missing fields are zero."""
    values = {**(fields or {}), **more}
    value = 0
    for name, member in layout:
        value |= (int(values.get(name, 0)) & ((1 << member.width) - 1)) << member.offset
    return value


def unpack(layout, value: int) -> dict[str, int]:
    return {name: (value >> member.offset) & ((1 << member.width) - 1)
            for name, member in layout}
