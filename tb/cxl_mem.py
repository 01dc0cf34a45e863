"""Host-side bus functional models of the four CXL.mem channels.

:class:`CxlMemBfm` bundles a :class:`~tb.stream.StreamSource` for each M2S channel, a
:class:`~tb.stream.StreamSink` for each S2M channel and a passive
:class:`~tb.stream.StreamChecker` on all four streams. Payloads are built and parsed
with the layouts of :mod:`hw.cxl.messages` (through its :class:`Codec`), so no field
width is retyped here.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from hw.cxl.messages import (
    S2MDRS,
    S2MNDR,
    Codec,
    M2SReq,
    M2SReqOpcode,
    M2SRwD,
    M2SRwDOpcode,
    MetaField,
    MetaValue,
    SnpType,
)
from sim.golden_memory import FULL_MASK, LINE_BYTES
from tb.stream import StreamChecker, StreamSink, StreamSource

__all__ = [
    "DRS",
    "NDR",
    "REQ",
    "RWD",
    "CxlMemBfm",
    "int_to_line",
    "line_to_int",
    "req_fields",
    "rwd_fields",
]

REQ = Codec(M2SReq)
RWD = Codec(M2SRwD)
NDR = Codec(S2MNDR)
DRS = Codec(S2MDRS)


def line_to_int(data: bytes) -> int:
    """64 bytes -> the 512-bit ``data`` field (byte *i* in bits ``8i+7:8i``)."""
    if len(data) != LINE_BYTES:
        raise ValueError(f"a line is {LINE_BYTES} bytes, not {len(data)}")
    return int.from_bytes(data, "little")


def int_to_line(value: int) -> bytes:
    return value.to_bytes(LINE_BYTES, "little")


def _code(value) -> int:
    return int(value.value) if hasattr(value, "value") else int(value)


def req_fields(opcode: M2SReqOpcode | int, *, tag: int, line: int,
               meta_field: MetaField | int = MetaField.Meta0State,
               meta_value: MetaValue | int = MetaValue.Any,
               snp_type: SnpType | int = SnpType.NoOp, ld_id: int = 0, tc: int = 0,
               addr_bit5: int = 0) -> dict[str, int]:
    """An M2S Req payload for host line address ``line`` (Addr[51:6]).

    The Req carries Addr[51:5]; ``addr_bit5`` sets Addr[5], which a line-granular
    device must ignore. ``opcode`` may be any 4-bit value (reserved ones included).
    """
    return {
        "opcode": _code(opcode), "snp_type": _code(snp_type), "meta_field": _code(meta_field),
        "meta_value": _code(meta_value), "tag": tag, "address": (line << 1) | (addr_bit5 & 1),
        "tc": tc, "ld_id": ld_id,
    }


def rwd_fields(opcode: M2SRwDOpcode | int, *, tag: int, line: int, data: bytes,
               byte_enable: int = FULL_MASK, poison: bool = False,
               meta_field: MetaField | int = MetaField.NoOp,
               meta_value: MetaValue | int = MetaValue.Invalid,
               snp_type: SnpType | int = SnpType.NoOp, ld_id: int = 0,
               tc: int = 0) -> dict[str, int]:
    """An M2S RwD payload for host line address ``line`` with a 64-byte ``data`` line."""
    return {
        "opcode": _code(opcode), "snp_type": _code(snp_type), "meta_field": _code(meta_field),
        "meta_value": _code(meta_value), "tag": tag, "address": line, "poison": int(poison),
        "tc": tc, "ld_id": ld_id, "data": line_to_int(data), "byte_enable": byte_enable,
    }


class CxlMemBfm:
    """Drivers, responders and protocol checkers of the device's CXL.mem ports.

    Parameters
    ----------
    dut:
        Device top with ``i_m2s_req``, ``i_m2s_rwd``, ``o_s2m_ndr``, ``o_s2m_drs``.
    loop:
        The :class:`~tb.cycle.CycleLoop` every agent runs in.
    rng:
        Seeded random generator for idle cycles and backpressure.
    idle:
        Probability of an idle cycle on each M2S source.
    backpressure:
        Probability of ``ready`` low on each S2M sink.
    on_req, on_rwd:
        ``callback(fields, cycle)`` at each M2S handshake.
    on_ndr, on_drs:
        ``callback(fields, cycle)`` at each S2M handshake.

    Members
    -------
    req, rwd:
        The M2S :class:`StreamSource`\\ s.
    ndr, drs:
        The S2M :class:`StreamSink`\\ s.
    checkers:
        Channel name -> :class:`StreamChecker`, one on each of the four streams.
    """

    def __init__(self, dut, loop, *, rng: random.Random, idle: float = 0.0,
                 backpressure: float = 0.0,
                 on_req: Callable | None = None, on_rwd: Callable | None = None,
                 on_ndr: Callable | None = None, on_drs: Callable | None = None):
        self.req = StreamSource(dut, "i_m2s_req", M2SReq, loop, rng=rng, idle=idle,
                                on_transfer=on_req)
        self.rwd = StreamSource(dut, "i_m2s_rwd", M2SRwD, loop, rng=rng, idle=idle,
                                on_transfer=on_rwd)
        self.ndr = StreamSink(dut, "o_s2m_ndr", S2MNDR, loop, rng=rng,
                              backpressure=backpressure, callback=on_ndr)
        self.drs = StreamSink(dut, "o_s2m_drs", S2MDRS, loop, rng=rng,
                              backpressure=backpressure, callback=on_drs)
        self.checkers = {name: StreamChecker(dut, name, loop)
                         for name in ("i_m2s_req", "i_m2s_rwd", "o_s2m_ndr", "o_s2m_drs")}

    @property
    def sources(self):
        return (self.req, self.rwd)

    @property
    def sinks(self):
        return (self.ndr, self.drs)

    def set_idle(self, idle: float) -> None:
        for source in self.sources:
            source.idle = idle

    def set_backpressure(self, backpressure: float) -> None:
        for sink in self.sinks:
            sink.backpressure = backpressure

    def pause_responses(self, paused: bool = True) -> None:
        for sink in self.sinks:
            sink.paused = paused

    def clear(self) -> None:
        """Drop every request not yet handed over (for a reset)."""
        for source in self.sources:
            source.clear()

    def violations(self) -> list[str]:
        out: list[str] = []
        for name, checker in self.checkers.items():
            out.extend(f"{name}: {v}" for v in checker.violations)
        return out
