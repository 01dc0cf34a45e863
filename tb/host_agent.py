"""GPU/host agent: a CXL.mem master that checks every response against a golden memory.

The agent issues M2S requests through :class:`~tb.cxl_mem.CxlMemBfm`, matches the S2M
responses by tag, and checks each one against the contract of ``docs/mem-endpoint.md``
(``docs/architecture.md``) with :class:`~sim.golden_memory.GoldenMemory` as the reference:

* **Memory order is the M2S handshake order.** A write is applied to the golden model
  in the cycle of its handshake; a read's expected data is the golden line in the
  cycle of its handshake. Two M2S handshakes in one cycle are an error.
* **Responses** are matched by tag: an unknown tag, a duplicate or unexpected NDR/DRS,
  a wrong opcode, data or echoed field (Tag, LD-ID, MetaField; MetaValue, or with
  ``meta_state`` the line's stored Meta0-State, :meth:`HostAgent.meta_returned`), a response
  before the request's handshake, or any response to a request that gets none
  (MemSpecRd, MemRdFwd, MemWrFwd) fails the test at once with a message naming the
  request.
* **Tag reuse** (``allow_reuse=True``, ``docs/mem-endpoint.md`` "Tag reuse"): a request
  may carry the Tag of requests still in flight. A response of such a tag goes to the
  one request of the tag it matches in every check above (and, for a write's NDR,
  durability); none fails the test, and of several equal candidates (the host cannot
  tell them apart, nor does the device promise an order) the oldest takes it. Each
  request must still get exactly its responses. A tag with one request in flight is
  matched and checked exactly as without reuse.
* **Durability**: when a write's NDR Cmp arrives, the PMEM model's persistent image of
  the line must equal the golden value after this write or after a later write of the
  same line (``docs/architecture.md``: the device reports a write only once it is durable).
* **Errors**: the agent predicts ERR_STATUS and the first error's address and opcode.
* **Protocol table**: every request the table of :mod:`tb.cxl_protocol` has a row for
  is followed by :attr:`HostAgent.protocol` as well, so a response outside the
  specification's flows fails even where the agent's own expectation would not say so.

Requests are :class:`Txn` objects; ``await txn`` waits for completion. Latency and
bandwidth statistics (:class:`TrafficStats`) are kept for the demo and benchmarks.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cocotb.triggers import Event

from hw.config import DeviceConfig
from hw.cxl.messages import (
    DRSOpcode,
    M2SReqOpcode,
    M2SRwDOpcode,
    MetaField,
    MetaValue,
    NDROpcode,
)
from sim.golden_memory import FULL_MASK, LINE_BYTES, GoldenMemory
from tb.cxl_mem import REQ, RWD, CxlMemBfm, int_to_line, req_fields, rwd_fields
from tb.cxl_protocol import ProtocolChecker, row
from tb.link import DATA_BYTES, HEADER_BYTES, Link

__all__ = ["DEFAULT_MIX", "ErrBit", "HostAgent", "TrafficMix", "TrafficStats", "Txn", "grant_for",
           "random_byte_enable"]

TAG_SPACE = 1 << 16
#: Tags of requests that get no response stay out of use for this many later such
#: requests, so that a late stray response to one cannot be mistaken for another's.
QUARANTINE = 8192

_REQ_OPS = {op.value: op for op in M2SReqOpcode}
_RWD_OPS = {op.value: op for op in M2SRwDOpcode}
_GRANT = {MetaValue.Shared.value: NDROpcode.CmpS.value, MetaValue.Any.value: NDROpcode.CmpE.value}
#: M2S Req opcodes whose Meta0-State the device stores (in range; ``meta_state``).
_META_REQ = frozenset(op.value for op in (
    M2SReqOpcode.MemRd, M2SReqOpcode.MemRdData, M2SReqOpcode.MemInv, M2SReqOpcode.MemInvNT,
    M2SReqOpcode.MemClnEvct))


class ErrBit:
    """ERR_STATUS bit positions (``docs/registers.md``)."""
    HDM_RANGE = 0
    RSVD_OPCODE = 1
    POISON = 2
    EMPTY_PTL = 3
    UNEXPECTED_FWD = 4
    PMEM_RESP = 5


    @staticmethod
    def mask(*bits: int) -> int:
        """ERR_STATUS value with ``bits`` set."""
        return sum(1 << b for b in bits)


def grant_for(meta_value: int, meta_field: int = MetaField.Meta0State.value) -> int:
    """NDR opcode granting the cache state MetaValue asks for (reserved 01 -> Cmp). With
    MetaField No-Op (or a reserved MetaField) MetaValue is reserved and ignored: Cmp."""
    if meta_field != MetaField.Meta0State.value:
        return NDROpcode.Cmp.value
    return _GRANT.get(meta_value, NDROpcode.Cmp.value)


@dataclass(eq=False)
class Txn:
    """One M2S request and what the contract says must come back.

    Members
    -------
    channel:
        ``"req"`` or ``"rwd"``.
    opcode, tag, line:
        As sent; ``line`` is the host line address (Addr[51:6]).
    fields:
        The payload fields as sent.
    data, byte_enable:
        Write data (64 bytes) and byte enables of an RwD.
    issued, accepted, completed:
        Cycle of :meth:`HostAgent` issue, of the M2S handshake, of the last response
        (of its arrival at the host, with a link).
    dev_line:
        PMEM line index when the address decoded in range at the handshake.
    exp_ndr, exp_drs, exp_data, exp_poison:
        Expected NDR / DRS opcode (None: none may come), DRS data and Poison (besides
        ``pmem_error``).
    exp_meta:
        MetaValue the responses must carry (:meth:`HostAgent.meta_returned`); None
        while unknown (the first response sets it).
    writes_memory:
        The request changes memory (an in-range, unpoisoned, non-empty write).
    err_bits:
        ERR_STATUS bits the request must set.
    seq:
        Position in the handshake order.
    ndr, drs:
        Received responses (field dicts) and their cycles ``ndr_cycle`` / ``drs_cycle``.
    abandoned:
        Dropped by a reset or power failure before completing.
    reused:
        Issued (``allow_reuse``) while another request with its Tag was in flight.
    """

    channel: str
    opcode: int
    tag: int
    line: int
    fields: dict
    data: bytes | None = None
    byte_enable: int = FULL_MASK
    issued: int = 0
    accepted: int | None = None
    completed: int | None = None
    dev_line: int | None = None
    exp_ndr: int | None = None
    exp_drs: int | None = None
    exp_data: bytes | None = None
    exp_meta: int | None = None
    exp_poison: bool = False
    writes_memory: bool = False
    tracked: bool = False       # followed by the protocol checker
    answer: bool = False        # a forward answering a D2H request (coherent benches)
    err_bits: int = 0
    seq: int = -1
    ndr: dict | None = None
    drs: dict | None = None
    ndr_cycle: int | None = None
    drs_cycle: int | None = None
    abandoned: bool = False
    reused: bool = False
    #: Set before the handshake when the test makes PMEM answer this request with an
    #: error response: DRS then carries Poison, a write's data is not checked for
    #: durability, and PMEM_RESP is expected with the PMEM line and channel latched.
    pmem_error: bool = False
    #: Cycle the last response so far arrives at the host over the link (``docs/
    #: platform.md``); the response's own cycle without a link.
    arrival: int = 0
    event: Event = field(default_factory=Event, repr=False)

    @property
    def name(self) -> str:
        ops = _REQ_OPS if self.channel == "req" else _RWD_OPS
        op = ops.get(self.opcode)
        return op.name if op is not None else f"{self.channel.upper()}-rsvd{self.opcode:04b}"

    @property
    def silent(self) -> bool:
        return self.exp_ndr is None and self.exp_drs is None

    @property
    def done(self) -> bool:
        return self.completed is not None or self.abandoned

    @property
    def read_data(self) -> bytes | None:
        return None if self.drs is None else int_to_line(self.drs["data"])

    @property
    def latency(self) -> int | None:
        """Handshake to last response, in cycles."""
        if self.completed is None or self.accepted is None:
            return None
        return self.completed - self.accepted

    def describe(self) -> str:
        where = f"line {self.line:#x}"
        if self.dev_line is not None:
            where += f" (PMEM line {self.dev_line:#x})"
        when = f"issued cycle {self.issued}"
        if self.accepted is not None:
            when += f", accepted cycle {self.accepted}"
        return f"{self.name} tag {self.tag:#06x} {where}, {when}"

    def __await__(self):
        return self.event.wait().__await__()


@dataclass(frozen=True)
class TrafficMix:
    """Relative weights of the request kinds the random generator issues."""

    MemRd: float = 25
    MemRdData: float = 8
    MemWr: float = 22
    MemWrPtl: float = 20
    MemInv: float = 4
    MemInvNT: float = 3
    MemClnEvct: float = 5
    MemSpecRd: float = 5
    BIConflict: float = 1
    # Bad input mixed into the traffic (each sets an ERR_STATUS bit, none changes memory):
    #: MemRd / MemWr outside the HDM window.
    OutOfRange: float = 0
    #: Poisoned MemWr / MemWrPtl of an in-range line.
    Poisoned: float = 0
    #: MemWrPtl without byte enables.
    EmptyPtl: float = 0
    #: Req / RwD with a reserved opcode.
    ReservedReq: float = 0
    ReservedRwd: float = 0
    #: MemRdFwd / MemWrFwd with no CXL.cache request of the device outstanding (no
    #: response; only right while the device's CXL.cache side is idle).
    UnexpectedFwd: float = 0
    #: A legal request (MemRd, MemRdData, MemInv, MemClnEvct, MemWr, MemWrPtl) with the
    #: Tag of a request in flight (``allow_reuse``; a fresh tag when none is).
    ReusedTag: float = 0

    def items(self) -> list[tuple[str, float]]:
        return [(k, getattr(self, k)) for k in self.__dataclass_fields__ if getattr(self, k) > 0]


DEFAULT_MIX = TrafficMix()
_RWD_KINDS = frozenset({"MemWr", "MemWrPtl", "BIConflict", "OutOfRangeWr", "Poisoned",
                        "EmptyPtl", "ReservedRwd"})
#: What a ``ReusedTag`` request of the random traffic is (each answered by the device).
_REUSED_KINDS = ("MemRd", "MemRdData", "MemInv", "MemClnEvct", "MemWr", "MemWrPtl")
#: Req opcodes the device never answers: their tags are not reused by the random traffic.
_SILENT_REQ = frozenset(op.value for op in (M2SReqOpcode.MemSpecRd, M2SReqOpcode.MemRdFwd,
                                            M2SReqOpcode.MemWrFwd))
_RESERVED_REQ = tuple(sorted(set(range(16)) - {op.value for op in M2SReqOpcode}))
_RESERVED_RWD = tuple(sorted(set(range(16)) - {op.value for op in M2SRwDOpcode}))


class TrafficStats:
    """Latency and bandwidth of completed requests (cycles of the bench's loop).

    Per request: latency = M2S handshake cycle -> cycle of its last response, and
    queueing = issue cycle -> handshake cycle. Bandwidth is lines moved (DRS MemData
    plus written lines acknowledged) over the window from the first handshake to the
    last completion. ``m2s_bytes`` / ``s2m_bytes``: link bytes of the completed
    requests' messages each way, 16 per message and 64 more for a line of data (M2S
    RwD, S2M DRS), as the device's LINK_RX_BYTES / LINK_TX_BYTES count them.
    """

    def __init__(self):
        self.latency: dict[str, list[int]] = {}
        self.queueing: dict[str, list[int]] = {}
        self.lines_read = 0
        self.lines_written = 0
        self.m2s_bytes = self.s2m_bytes = 0
        self.first_accept: int | None = None
        self.last_complete: int | None = None
        self.completed = 0
        self.dev_load: list[int] = [0, 0, 0, 0]

    def record(self, txn: Txn) -> None:
        self.completed += 1
        self.latency.setdefault(txn.name, []).append(txn.completed - txn.accepted)
        self.queueing.setdefault(txn.name, []).append(txn.accepted - txn.issued)
        if txn.drs is not None and txn.drs["opcode"] == DRSOpcode.MemData.value:
            self.lines_read += 1
        if txn.writes_memory:
            self.lines_written += 1
        self.m2s_bytes += HEADER_BYTES + (DATA_BYTES if txn.channel == "rwd" else 0)
        self.s2m_bytes += ((HEADER_BYTES if txn.ndr is not None else 0)
                           + (HEADER_BYTES + DATA_BYTES if txn.drs is not None else 0))
        if self.last_complete is None or txn.completed > self.last_complete:
            self.last_complete = txn.completed

    def accepted(self, cycle: int) -> None:
        if self.first_accept is None:
            self.first_accept = cycle

    @staticmethod
    def _pct(values: list[int], p: float) -> int:
        s = sorted(values)
        return s[min(len(s) - 1, int(p * len(s)))]

    def summary(self) -> dict:
        """``{kind: {count, min, mean, p50, p90, p99, max}, ..., "bandwidth": {...}}``."""
        out: dict = {}
        for kind, lat in sorted(self.latency.items()):
            out[kind] = {
                "count": len(lat), "min": min(lat), "mean": sum(lat) / len(lat),
                "p50": self._pct(lat, 0.5), "p90": self._pct(lat, 0.9),
                "p99": self._pct(lat, 0.99), "max": max(lat),
                "queue_mean": sum(self.queueing[kind]) / len(lat),
            }
        window = 0
        if self.first_accept is not None and self.last_complete is not None:
            window = self.last_complete - self.first_accept + 1
        out["bandwidth"] = {
            "cycles": window, "completed": self.completed,
            "lines_read": self.lines_read, "lines_written": self.lines_written,
            "lines_per_cycle": (self.lines_read + self.lines_written) / window if window else 0.0,
            "dev_load_histogram": list(self.dev_load),
        }
        return out

    def report(self) -> str:
        s = self.summary()
        bw = s.pop("bandwidth")
        lines = ["latency (handshake -> last response) and queueing (issue -> handshake), "
                 "in cycles",
                 f"{'kind':<12}{'count':>7}{'min':>6}{'mean':>8}{'p50':>6}{'p90':>6}"
                 f"{'p99':>6}{'max':>6}{'queue':>8}"]
        for kind, v in s.items():
            lines.append(f"{kind:<12}{v['count']:>7}{v['min']:>6}{v['mean']:>8.1f}{v['p50']:>6}"
                         f"{v['p90']:>6}{v['p99']:>6}{v['max']:>6}{v['queue_mean']:>8.1f}")
        lines.append(f"{bw['completed']} requests in {bw['cycles']} cycles: "
                     f"{bw['lines_read']} lines read, {bw['lines_written']} written, "
                     f"{bw['lines_per_cycle']:.3f} lines/cycle; DevLoad histogram "
                     f"{bw['dev_load_histogram']}")
        return "\n".join(lines)


class HostAgent:
    """CXL.mem master of the GPU/host side with a golden-memory scoreboard.

    Parameters
    ----------
    config:
        The device's :class:`~hw.config.DeviceConfig`.
    bfm:
        The :class:`~tb.cxl_mem.CxlMemBfm`; the agent installs its callbacks on it.
    loop:
        The bench's :class:`~tb.cycle.CycleLoop`.
    rng:
        Seeded random generator (tags, traffic).
    pmem_line:
        ``pmem_line(dev_line) -> bytes``: the PMEM model's persistent 64 bytes of a line
        (for the durability check); None disables that check.
    max_outstanding:
        Default cap on requests issued and not completed for :meth:`run_random`.
    log:
        Logger.
    link:
        The :class:`~tb.link.Link` between the host and the device, or None (no
        flight time). With a link, a request reaches the device's M2S port no earlier
        than its arrival over the down direction, and a request completes for the host
        (:attr:`Txn.completed`, its event, :meth:`wait_all`) when its last response has
        arrived over the up direction; the checks of each response still run in the
        cycle it leaves the device.

    Members
    -------
    golden:
        The :class:`GoldenMemory`, keyed by PMEM line index.
    stats:
        :class:`TrafficStats` of completed requests.
    err_status, first_error:
        Predicted ERR_STATUS and the request whose error the CSRs must hold.
    unknown:
        PMEM lines whose content is undefined after a reset (unacknowledged writes).
    checked:
        Responses checked so far.
    reuse_matched:
        Of them, responses of a Tag with several requests in flight (:meth:`_match`).
    protocol:
        The :class:`~tb.cxl_protocol.ProtocolChecker` of the link (a coherent bench
        shares it with its CXL.cache models).
    """

    def __init__(self, config: DeviceConfig, bfm: CxlMemBfm, loop, *, rng: random.Random,
                 pmem_line: Callable[[int], bytes] | None = None,
                 max_outstanding: int | None = None, log: logging.Logger | None = None,
                 link: Link | None = None):
        self.config = config
        self.link = link
        self.bfm = bfm
        self.loop = loop
        self.rng = rng
        self.pmem_line = pmem_line
        self.max_outstanding = max_outstanding or 2 * config.max_tags
        self.log = log or logging.getLogger("cocotb.host_agent")
        self.golden = GoldenMemory(config.pmem_lines)
        self.stats = TrafficStats()
        self.errors: list[str] = []
        self.checked = 0
        self.reuse_matched = 0
        self._meta_guess = False                    # see _match
        self.err_status = 0
        self.first_error: Txn | None = None
        self.unknown: set[int] = set()
        self.meta: dict[int, int] = {}              # PMEM line -> stored Meta0-State
        self.protocol = ProtocolChecker()
        self.set_hdm(config.hdm_base, config.hdm_size)

        self._pending: dict[int, list[Txn]] = {}    # tag -> issued, not completed (oldest first)
        self._n_pending = 0
        self._queues = {"req": deque(), "rwd": deque()}  # issued, not yet handed over
        self._quarantine: dict[int, Txn] = {}       # tags of requests with no response
        self._recent: dict[int, Txn] = {}           # recently completed, for messages
        self._seq = 0
        self._last_accept = -1
        # Per PMEM line: [seq, value, acknowledged] from the latest acknowledged version on.
        self._hist: dict[int, list[list]] = {}
        self._watch: set[int] = set()               # PMEM lines any write addressed
        self._in_reset = False
        self._stop = False
        self._arriving: list[tuple[int, int, Txn]] = []   # (cycle, seq, txn) on the link
        if link is not None:
            loop.add(self)

        bfm.req.on_transfer = self._on_req
        bfm.rwd.on_transfer = self._on_rwd
        bfm.ndr.callback = self._on_ndr
        bfm.drs.callback = self._on_drs

    # --- HDM window -----------------------------------------------------------------
    def set_hdm(self, base: int, size: int) -> None:
        """Tell the agent the HDM window (bytes) the device decodes from now on."""
        self.hdm_base = base
        self.hdm_size = size
        self.base_line = base // LINE_BYTES
        self.window_lines = min(size, self.config.pmem_size) // LINE_BYTES

    def decode(self, line: int) -> int | None:
        """PMEM line of host line ``line``, or None outside the HDM window."""
        off = line - self.base_line
        return off if 0 <= off < self.window_lines else None

    def host_line(self, dev_line: int) -> int:
        return self.base_line + dev_line

    # --- failures ---------------------------------------------------------------------
    def fail(self, message: str) -> None:
        """Record and raise: ends the test at once with ``message``."""
        self.errors.append(message)
        self.log.error("%s", message)
        raise AssertionError(message)

    # --- tags -------------------------------------------------------------------------
    def _alloc_tag(self) -> int:
        while True:
            tag = self.rng.randrange(TAG_SPACE)
            if tag not in self._pending and tag not in self._quarantine:
                return tag

    def release_quarantine(self) -> None:
        """Make the tags of past no-response requests usable again (call when idle and
        long enough after them that a stray response would have shown)."""
        self._quarantine.clear()

    @property
    def outstanding(self) -> int:
        """Requests issued and not completed (queued ones included)."""
        return self._n_pending

    def _add_pending(self, txn: Txn) -> None:
        self._pending.setdefault(txn.tag, []).append(txn)
        self._n_pending += 1

    def _drop_pending(self, txn: Txn) -> None:
        txns = self._pending[txn.tag]
        txns.remove(txn)
        if not txns:
            del self._pending[txn.tag]
        self._n_pending -= 1

    def pending_txns(self) -> list[Txn]:
        """Requests issued and not completed, in issue order."""
        return sorted((t for ts in self._pending.values() for t in ts), key=lambda t: t.issued)

    @property
    def queued(self) -> int:
        return len(self._queues["req"]) + len(self._queues["rwd"])

    @property
    def in_reset(self) -> bool:
        """Between :meth:`begin_reset` and :meth:`end_reset`: nothing may be issued."""
        return self._in_reset

    # --- issue ------------------------------------------------------------------------
    def _issue(self, channel: str, fields: dict, *, data: bytes | None = None,
               byte_enable: int = FULL_MASK, allow_reuse: bool = False) -> Txn:
        if self._in_reset:
            raise RuntimeError("cannot issue CXL.mem requests while the device is in reset")
        tag = fields.get("tag")
        reused = False
        if tag is None:
            tag = fields["tag"] = self._alloc_tag()
        elif tag in self._quarantine or (tag in self._pending and not allow_reuse):
            raise ValueError(f"tag {tag:#06x} is in use")
        else:
            reused = tag in self._pending
        self._recent.pop(tag, None)
        line = fields["address"] >> 1 if channel == "req" else fields["address"]
        txn = Txn(channel, fields["opcode"], tag, line, fields, data=data,
                  byte_enable=byte_enable, issued=self.loop.cycle, reused=reused)
        self._add_pending(txn)
        self._queues[channel].append(txn)
        at = 0
        if self.link is not None:
            at = self.link.down.send(txn.issued, HEADER_BYTES + (channel == "rwd") * DATA_BYTES)
        (self.bfm.req if channel == "req" else self.bfm.rwd).send(fields, at=at)
        return txn

    def send_req(self, opcode: M2SReqOpcode | int, line: int, *, tag: int | None = None,
                 allow_reuse: bool = False, **kw) -> Txn:
        """Any M2S Req (reserved opcodes and out-of-range lines included). A ``tag``
        still in flight raises ValueError unless ``allow_reuse`` (module docstring)."""
        return self._issue("req", req_fields(opcode, tag=tag, line=line, **kw),
                           allow_reuse=allow_reuse)

    def send_rwd(self, opcode: M2SRwDOpcode | int, line: int, data: bytes | None = None, *,
                 tag: int | None = None, byte_enable: int = FULL_MASK,
                 allow_reuse: bool = False, **kw) -> Txn:
        """Any M2S RwD (reserved opcodes, poison and empty byte enables included)."""
        data = data if data is not None else self.rng.randbytes(LINE_BYTES)
        return self._issue("rwd", rwd_fields(opcode, tag=tag, line=line, data=data,
                                             byte_enable=byte_enable, **kw),
                           data=data, byte_enable=byte_enable, allow_reuse=allow_reuse)

    def read(self, line: int, *, meta_value: MetaValue | int = MetaValue.Any,
             opcode: M2SReqOpcode = M2SReqOpcode.MemRd, **kw) -> Txn:
        """MemRd (or MemRdData with ``opcode=``) of host line ``line``."""
        return self.send_req(opcode, line, meta_value=meta_value, **kw)

    def write(self, line: int, data: bytes, byte_enable: int | None = None, **kw) -> Txn:
        """MemWr of a whole line, or MemWrPtl when ``byte_enable`` is given."""
        if byte_enable is None:
            return self.send_rwd(M2SRwDOpcode.MemWr, line, data, **kw)
        return self.send_rwd(M2SRwDOpcode.MemWrPtl, line, data, byte_enable=byte_enable, **kw)

    def inv(self, line: int, *, meta_value: MetaValue | int = MetaValue.Invalid,
            nt: bool = False, **kw) -> Txn:
        op = M2SReqOpcode.MemInvNT if nt else M2SReqOpcode.MemInv
        return self.send_req(op, line, meta_value=meta_value, **kw)

    def clean_evict(self, line: int, **kw) -> Txn:
        return self.send_req(M2SReqOpcode.MemClnEvct, line, meta_value=MetaValue.Invalid, **kw)

    def spec_rd(self, line: int, **kw) -> Txn:
        return self.send_req(M2SReqOpcode.MemSpecRd, line, **kw)

    # --- handshakes: the memory order -----------------------------------------------
    def _on_req(self, payload: int, cycle: int) -> None:
        self._accepted(self._queues["req"], REQ.get(payload, "tag"), cycle)

    def _on_rwd(self, payload: int, cycle: int) -> None:
        self._accepted(self._queues["rwd"], RWD.get(payload, "tag"), cycle)

    def _accepted(self, queue: deque, tag: int, cycle: int) -> None:
        txn = queue.popleft()
        if txn.tag != tag:
            self.fail(f"BFM handed over tag {tag:#06x}, expected {txn.describe()}")
        if cycle == self._last_accept:
            self.fail(f"cycle {cycle}: a second M2S request accepted in the same cycle "
                      f"({txn.describe()}); the device takes at most one per cycle")
        self._last_accept = cycle
        txn.accepted = cycle
        txn.seq = self._seq
        self._seq += 1
        self.stats.accepted(cycle)
        if txn.channel == "req":
            self._expect_req(txn)
        else:
            self._expect_rwd(txn)
        txn.exp_meta = self.meta_returned(txn)
        self._track(txn, cycle)
        if txn.pmem_error and txn.dev_line is not None:
            txn.err_bits |= 1 << ErrBit.PMEM_RESP
        if txn.err_bits:
            if self.err_status == 0:
                self.first_error = txn
            self.err_status |= txn.err_bits
        if txn.silent:
            self._drop_pending(txn)
            self._quarantine[txn.tag] = txn
            if len(self._quarantine) > QUARANTINE:
                del self._quarantine[next(iter(self._quarantine))]
            txn.completed = cycle
            txn.event.set()

    def _track(self, txn: Txn, cycle: int) -> None:
        """Open the request's transaction in the protocol checker; a request the table
        has no row for (a reserved opcode, a forward with no D2H request) is the host's
        own bad input, which only the agent's expectation covers; so is a reused Tag
        while the checker has a transaction of that Tag open (it keys them by Tag)."""
        r = row(f"m2s_{txn.channel}", txn.opcode, "hdm" if txn.dev_line is not None else "nxm")
        if r is not None and ("tag", txn.tag) not in self.protocol.open:
            self.protocol.request(f"m2s_{txn.channel}", txn.fields, cycle, target=r.target)
            txn.tracked = True

    def _expect_req(self, txn: Txn) -> None:
        op = txn.opcode
        dev_line = txn.dev_line = self.decode(txn.line)
        mv, mf = txn.fields["meta_value"], txn.fields["meta_field"]
        if op in (M2SReqOpcode.MemRd.value, M2SReqOpcode.MemRdData.value):
            if dev_line is None:
                # MemData-NXM is the single response, in place of DRS + NDR: all-ones
                # data, Poison set (CXL 3.x Table 3-53; the device reports poison).
                txn.exp_drs, txn.exp_data = DRSOpcode.MemDataNXM.value, b"\xff" * LINE_BYTES
                txn.exp_poison = True
                txn.err_bits = 1 << ErrBit.HDM_RANGE
            else:
                txn.exp_drs, txn.exp_data = DRSOpcode.MemData.value, self.golden.read(dev_line)
                txn.exp_ndr = (NDROpcode.CmpE.value if op == M2SReqOpcode.MemRdData.value
                               else grant_for(mv, mf))
        elif op in (M2SReqOpcode.MemInv.value, M2SReqOpcode.MemInvNT.value):
            txn.exp_ndr = grant_for(mv, mf)
            if dev_line is None:
                txn.err_bits = 1 << ErrBit.HDM_RANGE
        elif op == M2SReqOpcode.MemClnEvct.value:
            txn.exp_ndr = NDROpcode.Cmp.value
            if dev_line is None:
                txn.err_bits = 1 << ErrBit.HDM_RANGE
        elif op == M2SReqOpcode.MemSpecRd.value:
            pass
        elif op in (M2SReqOpcode.MemRdFwd.value, M2SReqOpcode.MemWrFwd.value):
            txn.err_bits = 1 << ErrBit.UNEXPECTED_FWD
        else:
            txn.exp_ndr = NDROpcode.Cmp.value
            txn.err_bits = 1 << ErrBit.RSVD_OPCODE

    def _expect_rwd(self, txn: Txn) -> None:
        op = txn.opcode
        if op in (M2SRwDOpcode.MemWr.value, M2SRwDOpcode.MemWrPtl.value):
            txn.exp_ndr = NDROpcode.Cmp.value
            dev_line = txn.dev_line = self.decode(txn.line)
            # Lines a wrong write could have hit are compared with the golden model at
            # the end: the line itself, or where an out-of-range one would wrap to.
            if dev_line is not None:
                self._watch.add(dev_line)
            else:
                lines = self.config.pmem_lines
                self._watch.update(((txn.line - self.base_line) % lines, txn.line % lines))
            ptl = op == M2SRwDOpcode.MemWrPtl.value
            be = txn.byte_enable if ptl else FULL_MASK
            poison = bool(txn.fields["poison"])
            if dev_line is None:
                txn.err_bits |= 1 << ErrBit.HDM_RANGE
            if poison:
                txn.err_bits |= 1 << ErrBit.POISON
            if ptl and be == 0:
                txn.err_bits |= 1 << ErrBit.EMPTY_PTL
            if not txn.err_bits:
                txn.writes_memory = True
                hist = self._hist.get(dev_line)
                if hist is None:
                    hist = self._hist[dev_line] = [[-1, self.golden.read(dev_line), True]]
                new = self.golden.write(dev_line, txn.data, be)
                hist.append([txn.seq, new, False])
        elif op == M2SRwDOpcode.BIConflict.value:
            txn.exp_ndr = NDROpcode.BIConflictAck.value
        else:
            txn.exp_ndr = NDROpcode.Cmp.value
            txn.err_bits = 1 << ErrBit.RSVD_OPCODE

    # --- responses --------------------------------------------------------------------
    def _lookup(self, channel: str, f: dict, cycle: int) -> Txn:
        tag = f["tag"]
        txns = self._pending.get(tag)
        self._meta_guess = False
        txn = None if txns is None else txns[0] if len(txns) == 1 else \
            self._match(channel, txns, f, cycle)
        if txn is None:
            silent = self._quarantine.get(tag)
            if silent is not None:
                self.fail(f"cycle {cycle}: S2M {channel} {f} for tag {tag:#06x}, which "
                          f"belongs to {silent.describe()}: that request gets no response")
            done = self._recent.get(tag)
            if done is not None:
                self.fail(f"cycle {cycle}: S2M {channel} {f} for {done.describe()}, which "
                          f"completed in cycle {done.completed} (duplicate or extra response)")
            self.fail(f"cycle {cycle}: S2M {channel} with unknown tag {tag:#06x}: {f}")
        if txn.accepted is None:
            self.fail(f"cycle {cycle}: S2M {channel} for {txn.describe()} before the "
                      f"request was accepted")
        self.stats.dev_load[f["dev_load"]] += 1
        return txn

    def _match(self, channel: str, txns: list[Txn], f: dict, cycle: int) -> Txn:
        """The request a response of a reused Tag belongs to: the one of ``txns`` (all
        in flight with that Tag) whose every check it passes; of several, one whose
        MetaValue is known, then the oldest. None matching fails the test. When the
        choice is among several whose MetaValue is unknown (lines whose state this agent
        has not stored yet), the response does not fix the chosen one's MetaValue: it
        may be another's."""
        why = [(t, self._mismatch(channel, t, f)) for t in txns]
        ok = [t for t, bad in why if bad is None]
        self.reuse_matched += 1
        if not ok:
            self.fail(f"cycle {cycle}: S2M {channel} {_header(f)} of reused tag {f['tag']:#06x} "
                      f"matches none of its {len(txns)} requests in flight: "
                      + "; ".join(f"{t.describe()}: {bad}" for t, bad in why))
        txn = min(ok, key=lambda t: (t.exp_meta is None, t.seq))
        self._meta_guess = txn.exp_meta is None and len(ok) > 1
        return txn

    def _mismatch(self, channel: str, txn: Txn, f: dict) -> str | None:
        """Why response ``f`` cannot be ``txn``'s (None: it passes every check of
        :meth:`_on_ndr` / :meth:`_on_drs`, a write's durability included)."""
        if txn.accepted is None:
            return "not accepted yet"
        if channel == "NDR":
            if txn.exp_ndr is None:
                return "gets no NDR"
            if txn.ndr is not None:
                return "has its NDR"
            if f["opcode"] != txn.exp_ndr:
                return f"expects NDR {_ndr_name(txn.exp_ndr)}"
            if txn.writes_memory and not txn.pmem_error and not self._durable_ok(txn):
                return "not durable in PMEM"
        else:
            if txn.exp_drs is None:
                return "gets no DRS"
            if txn.drs is not None:
                return "has its DRS"
            if f["opcode"] != txn.exp_drs:
                return f"expects DRS opcode {txn.exp_drs:03b}"
            if f["poison"] != (txn.pmem_error or txn.exp_poison):
                return "other Poison"
            if not txn.pmem_error and int_to_line(f["data"]) != txn.exp_data:
                return "other data"
        for name in ("meta_field", "ld_id"):
            if f[name] != txn.fields[name]:
                return f"sent {name}={txn.fields[name]}"
        if txn.exp_meta is not None and f["meta_value"] != txn.exp_meta:
            return f"expects MetaValue={txn.exp_meta}"
        return None

    def _check_echo(self, channel: str, txn: Txn, f: dict, cycle: int) -> None:
        sent = txn.fields
        for name in ("meta_field", "ld_id"):
            if f[name] != sent[name]:
                self.fail(f"cycle {cycle}: S2M {channel} for {txn.describe()} echoes "
                          f"{name}={f[name]}, the request had {sent[name]}")
        if txn.exp_meta is None:        # the line's state before this agent knew it
            if not self._meta_guess:
                txn.exp_meta = f["meta_value"]
        elif f["meta_value"] != txn.exp_meta:
            self.fail(f"cycle {cycle}: S2M {channel} for {txn.describe()} carries "
                      f"MetaValue={f['meta_value']}, expected {txn.exp_meta} (the line's "
                      f"meta state before it, or the request's own MetaValue)")

    def meta_returned(self, txn: Txn) -> int | None:
        """The MetaValue of the responses to ``txn``, applying its effect on the meta
        state (``docs/mem-endpoint.md``, "Meta state"): with ``meta_state`` an in-range
        request the device serves (MemRd, MemInv, MemInvNT, MemClnEvct; a write that
        writes) with MetaField Meta0-State returns the line's state before it and
        stores its MetaValue; an in-range MemRdData, whatever its MetaField, returns the
        state before it and moves I to A (S and A stay: it ignores MetaField and
        MetaValue). Every other request gets its own MetaValue back.

        The state is kept over resets and over the tests of one simulator run, so a
        line's state is unknown (None: any value is taken) until this agent has stored
        one; from then on it is exact. ``tests/test_mem_endpoint.py`` checks the
        power-on state (Any)."""
        sent = txn.fields
        served = txn.writes_memory if txn.channel == "rwd" else (
            txn.dev_line is not None and txn.opcode in _META_REQ)
        rdd = txn.channel == "req" and txn.opcode == M2SReqOpcode.MemRdData.value
        if not (self.config.meta_state and served
                and (rdd or sent["meta_field"] == MetaField.Meta0State.value)):
            return sent["meta_value"]
        old = self.meta.get(txn.dev_line)
        if not rdd:
            self.meta[txn.dev_line] = sent["meta_value"]
        elif old is not None:       # (an unknown state stays unknown)
            self.meta[txn.dev_line] = (MetaValue.Any.value if old == MetaValue.Invalid.value
                                       else old)
        return old

    def _on_ndr(self, f: dict, cycle: int) -> None:
        txn = self._lookup("NDR", f, cycle)
        if txn.exp_ndr is None:
            self.fail(f"cycle {cycle}: NDR {f} for {txn.describe()}, which gets no NDR")
        if txn.ndr is not None:
            self.fail(f"cycle {cycle}: second NDR for {txn.describe()} (first in cycle "
                      f"{txn.ndr_cycle})")
        if f["opcode"] != txn.exp_ndr:
            self.fail(f"cycle {cycle}: NDR opcode {_ndr_name(f['opcode'])} for "
                      f"{txn.describe()}, expected {_ndr_name(txn.exp_ndr)}")
        self._check_echo("NDR", txn, f, cycle)
        if txn.tracked:
            self.protocol.see("s2m_ndr", f, cycle)
        txn.ndr, txn.ndr_cycle = f, cycle
        self.checked += 1
        if txn.writes_memory:
            self._durable(txn, cycle, check=not txn.pmem_error)
        self._maybe_complete(txn, cycle, HEADER_BYTES)

    def _on_drs(self, f: dict, cycle: int) -> None:
        txn = self._lookup("DRS", f, cycle)
        if txn.exp_drs is None:
            self.fail(f"cycle {cycle}: DRS opcode {f['opcode']} for {txn.describe()}, "
                      f"which gets no DRS")
        if txn.drs is not None:
            self.fail(f"cycle {cycle}: second DRS for {txn.describe()} (first in cycle "
                      f"{txn.drs_cycle})")
        if f["opcode"] != txn.exp_drs:
            self.fail(f"cycle {cycle}: DRS opcode {f['opcode']:03b} for {txn.describe()}, "
                      f"expected {txn.exp_drs:03b}")
        poison = txn.pmem_error or txn.exp_poison
        if f["poison"] != poison:
            self.fail(f"cycle {cycle}: DRS for {txn.describe()} has Poison={f['poison']}, "
                      f"expected {int(poison)}")
        self._check_echo("DRS", txn, f, cycle)
        got = int_to_line(f["data"])
        if not txn.pmem_error and got != txn.exp_data:
            self.fail(f"cycle {cycle}: DRS data mismatch for {txn.describe()}:\n"
                      f"{_line_diff(got, txn.exp_data)}")
        if txn.tracked:
            self.protocol.see("s2m_drs", f, cycle)
        txn.drs, txn.drs_cycle = f, cycle
        self.checked += 1
        self._maybe_complete(txn, cycle, HEADER_BYTES + DATA_BYTES)

    def _maybe_complete(self, txn: Txn, cycle: int, nbytes: int) -> None:
        if self.link is not None:
            txn.arrival = max(txn.arrival, self.link.up.send(cycle, nbytes))
        if (txn.exp_ndr is not None and txn.ndr is None) or \
                (txn.exp_drs is not None and txn.drs is None):
            return
        if txn.arrival > cycle:
            heapq.heappush(self._arriving, (txn.arrival, txn.seq, txn))
            return
        self._complete(txn, cycle)

    def sample(self) -> None:
        """Loop agent (with a link only): complete the requests whose last response
        arrives at the host in this cycle."""
        arriving, cycle = self._arriving, self.loop.cycle
        while arriving and arriving[0][0] <= cycle:
            self._complete(heapq.heappop(arriving)[2], cycle)

    def _complete(self, txn: Txn, cycle: int) -> None:
        txn.completed = cycle
        self._drop_pending(txn)
        self._recent[txn.tag] = txn
        if len(self._recent) > QUARANTINE:
            del self._recent[next(iter(self._recent))]
        self.stats.record(txn)
        txn.event.set()

    def _durable_ok(self, txn: Txn) -> bool:
        """PMEM holds write ``txn`` durably: the line's persistent image is the value
        after it or after a later write of the line (True without a PMEM view)."""
        if self.pmem_line is None:
            return True
        return self.pmem_line(txn.dev_line) in [e[1] for e in self._hist[txn.dev_line]
                                                if e[0] >= txn.seq]

    def _durable(self, txn: Txn, cycle: int, check: bool = True) -> None:
        hist = self._hist[txn.dev_line]
        entry = next(e for e in hist if e[0] == txn.seq)
        entry[2] = True
        if check and self.pmem_line is not None:
            image = self.pmem_line(txn.dev_line)
            allowed = [e[1] for e in hist if e[0] >= txn.seq]
            if image not in allowed:
                self.fail(f"cycle {cycle}: NDR Cmp for {txn.describe()} but PMEM does not "
                          f"hold it durably:\n{_line_diff(image, allowed[0])}")
        # Keep the latest acknowledged version and everything after it.
        while len(hist) > 1 and hist[0][2] and hist[1][2]:
            hist.pop(0)

    # --- waiting ----------------------------------------------------------------------
    async def wait_idle(self, timeout: int = 100_000) -> None:
        """Wait until every issued request has completed."""
        await self._wait(lambda: not self._pending, timeout, "all CXL.mem requests complete")

    async def _wait(self, predicate: Callable[[], bool], timeout: int, what: str) -> None:
        try:
            await self.loop.wait_until(predicate, timeout=timeout, what=what)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc} ({self._describe_pending()})") from None

    def _describe_pending(self) -> str:
        if not self._pending:
            return "none outstanding"
        txns = self.pending_txns()
        head = "; ".join(t.describe() for t in txns[:3])
        return f"{len(txns)} outstanding, oldest: {head}"

    async def wait_all(self, txns: Iterable[Txn], timeout: int = 100_000) -> None:
        left = [t for t in txns if not t.done]

        def done() -> bool:
            while left and left[-1].done:
                left.pop()
            return not left or all(t.done for t in left)

        await self._wait(done, timeout, f"{len(left)} requests complete")

    # --- reset and power failure -----------------------------------------------------
    def begin_reset(self) -> None:
        """The device goes into reset: stop handing over requests (valid falls now)."""
        self._in_reset = True
        self._stop = True
        self.bfm.clear()
        for checker in ("i_m2s_req", "i_m2s_rwd"):
            self.bfm.checkers[checker].clear()

    def abandon(self) -> list[Txn]:
        """Forget every request in flight (the device lost them). Returns the memory
        writes that were accepted and not acknowledged; their lines become
        :attr:`unknown` until :meth:`resolve_unknown` or a rewrite."""
        for checker in ("o_s2m_ndr", "o_s2m_drs"):
            self.bfm.checkers[checker].clear()
        self.bfm.clear()
        lost = []
        for txn in self.pending_txns():
            if txn.dev_line is not None:
                # Its meta update may or may not have happened (it may have been lost
                # between the link and the endpoint, in the M2S router).
                self.meta.pop(txn.dev_line, None)
            txn.abandoned = True
            self.protocol.forget(("tag", txn.tag))
            if txn.accepted is not None and txn.writes_memory and txn.ndr is None:
                lost.append(txn)
                self.unknown.add(txn.dev_line)
            txn.event.set()
        self._pending.clear()
        self._n_pending = 0
        for q in self._queues.values():
            q.clear()
        self._arriving.clear()
        if self.link is not None:
            self.link.reset()
        return lost

    def end_reset(self) -> None:
        self._in_reset = False
        self._stop = False
        self._last_accept = -1

    def device_wrote(self, dev_line: int, data: bytes) -> None:
        """A write that did not come through this agent is durable in PMEM line
        ``dev_line`` (the engine's output, or the driver's backdoor): the golden memory
        follows, and the line's history restarts from it, so that after a power failure
        a lost host write falls back to this value, not to an older host write. Host
        writes still unacknowledged stay in the history."""
        self.golden.set(dev_line, data)
        hist = self._hist.get(dev_line)
        if hist is not None:
            self._hist[dev_line] = [[-1, bytes(data), True]] + [e for e in hist if not e[2]]

    def candidates(self, dev_line: int) -> list[bytes]:
        """Values the line may hold after losing its unacknowledged writes: the latest
        acknowledged version, then each later one."""
        hist = self._hist.get(dev_line)
        if hist is None:
            return [self.golden.read(dev_line)]
        start = max(i for i, e in enumerate(hist) if e[2]) if any(e[2] for e in hist) else 0
        return [e[1] for e in hist[start:]]

    def resolve_unknown(self, *, torn_words: bool = False) -> int:
        """Check each :attr:`unknown` line's PMEM image against its :meth:`candidates`
        (whole lines, or per 8-byte word with ``torn_words``), then take the image as
        the golden value. Returns the number of lines resolved."""
        n = 0
        for dev_line in sorted(self.unknown):
            image = self.pmem_line(dev_line)
            cands = self.candidates(dev_line)
            if torn_words:
                for w in range(0, LINE_BYTES, 8):
                    if image[w:w + 8] not in {c[w:w + 8] for c in cands}:
                        self.fail(f"PMEM line {dev_line:#x}: bytes {w}..{w + 7} = "
                                  f"{image[w:w + 8].hex()} match neither the last acknowledged "
                                  f"value nor a later write's "
                                  f"({', '.join(c[w:w + 8].hex() for c in cands)})")
            elif image not in cands:
                self.fail(f"PMEM line {dev_line:#x} after reset holds neither the last "
                          f"acknowledged value nor a later accepted write:\n"
                          f"{_line_diff(image, cands[-1])}")
            self.golden.set(dev_line, image)
            self._hist[dev_line] = [[-1, image, True]]
            n += 1
        self.unknown.clear()
        return n

    async def rewrite_unknown(self) -> int:
        """Write fresh random data to every :attr:`unknown` line; wait for the acks."""
        txns = [self.write(self.host_line(dl), self.rng.randbytes(LINE_BYTES))
                for dl in sorted(self.unknown)]
        self.unknown.clear()
        await self.wait_all(txns)
        return len(txns)

    # --- final checks -----------------------------------------------------------------
    def check_memory(self, lines: Iterable[int] | None = None) -> int:
        """Compare the PMEM image with the golden model for every line any write
        addressed (or ``lines``); returns the number compared."""
        n = 0
        if lines is None:
            lines = sorted(self._watch.union(self.golden.touched()))
        for dev_line in lines:
            if dev_line in self.unknown:
                continue
            image = self.pmem_line(dev_line)
            want = self.golden.read(dev_line)
            if image != want:
                self.fail(f"final image: PMEM line {dev_line:#x} differs from the golden "
                          f"model:\n{_line_diff(image, want)}")
            n += 1
        return n

    def check_idle(self) -> None:
        if self._pending:
            self.fail(f"requests still outstanding at the end: {self._describe_pending()}")
        self.protocol.finish()
        self.log.info("protocol table flows completed: %s", self.protocol.completed)

    # --- random traffic ---------------------------------------------------------------
    def stop(self) -> None:
        """Make a running :meth:`run_random` return after its current cycle."""
        self._stop = True

    async def run_random(self, n: int, *, mix: TrafficMix = DEFAULT_MIX, hot_lines: int = 8,
                         hot_fraction: float = 0.5, max_outstanding: int | None = None,
                         lines: int | None = None, max_queued: int = 8,
                         wait: bool = True, timeout: int = 200_000) -> list[Txn]:
        """Issue ``n`` random requests, then (``wait``) wait until all complete.

        Addresses come from a hot window of ``hot_lines`` lines (with probability
        ``hot_fraction``; so same-line hazards are frequent) or uniformly from the
        first ``lines`` PMEM lines of the HDM window (default: all of it). At most
        ``max_outstanding`` requests are in flight and ``max_queued`` wait in each
        M2S source. Returns the issued requests. :meth:`stop` ends it early.
        """
        self._stop = False
        limit = max_outstanding or self.max_outstanding
        span = min(lines or self.window_lines, self.window_lines)
        if span <= 0:
            raise ValueError("the HDM window is empty; program HDM_SIZE first")
        rng = self.rng
        # Hot window: a run of neighbours (shared media blocks and ordering buckets).
        start = rng.randrange(max(1, span - hot_lines))
        hot = [start + i for i in range(min(hot_lines, span))]
        kinds, weights = zip(*mix.items(), strict=True)
        txns: list[Txn] = []
        req, rwd = self.bfm.req, self.bfm.rwd

        def pick() -> int:
            while True:
                dl = rng.choice(hot) if rng.random() < hot_fraction else rng.randrange(span)
                if dl not in self.unknown:
                    return dl

        kind = None
        while len(txns) < n and not self._stop:
            # A drawn request waits for room in its channel's queue (it is not redrawn),
            # so the issued mix is the requested one even when one channel stalls.
            while len(txns) < n and self._n_pending < limit and not self._stop:
                if kind is None:
                    kind = rng.choices(kinds, weights)[0]
                    if kind == "OutOfRange":
                        kind = rng.choice(("OutOfRangeRd", "OutOfRangeWr"))
                    elif kind == "ReusedTag":
                        kind = "Reused" + rng.choice(_REUSED_KINDS)
                source = rwd if kind.removeprefix("Reused") in _RWD_KINDS else req
                if source.pending >= max_queued:
                    break
                txns.append(self._random_txn(kind, pick))
                kind = None
            await self.loop.wait_cycles(1)
        if wait and not self._stop:
            await self.wait_all(txns, timeout=timeout)
        return txns

    def _random_txn(self, kind: str, pick: Callable[[], int]) -> Txn:
        rng = self.rng
        common = {"ld_id": rng.randrange(16), "tc": rng.randrange(4)}
        if kind.startswith("Reused"):
            kind = kind.removeprefix("Reused")
            tags = [tag for tag, ts in self._pending.items()
                    if not any(t.channel == "req" and t.opcode in _SILENT_REQ for t in ts)]
            if tags:
                common.update(tag=rng.choice(tags), allow_reuse=True)
        if kind == "OutOfRangeWr":
            return self.write(self._out_of_range_line(), rng.randbytes(LINE_BYTES), **common)
        if kind == "OutOfRangeRd":
            return self.read(self._out_of_range_line(), **common)
        line = self.host_line(pick())
        if kind == "Poisoned":
            be = random_byte_enable(rng) if rng.random() < 0.5 else None
            return self.write(line, rng.randbytes(LINE_BYTES), be, poison=True, **common)
        if kind == "EmptyPtl":
            return self.write(line, rng.randbytes(LINE_BYTES), 0, **common)
        if kind == "ReservedReq":
            return self.send_req(rng.choice(_RESERVED_REQ), line, **common)
        if kind == "ReservedRwd":
            return self.send_rwd(rng.choice(_RESERVED_RWD), line, **common)
        if kind == "UnexpectedFwd":
            return self.send_req(rng.choice((M2SReqOpcode.MemRdFwd, M2SReqOpcode.MemWrFwd)),
                                 line, meta_value=MetaValue.Any, **common)
        meta = {"meta_field": rng.choice((MetaField.Meta0State, MetaField.NoOp)),
                "meta_value": rng.choice((MetaValue.Invalid, MetaValue.Any, MetaValue.Shared))}
        if kind == "MemWr":
            # MemWr ignores the byte-enable field: send garbage there now and then.
            be = rng.getrandbits(LINE_BYTES) if rng.random() < 0.3 else FULL_MASK
            return self.send_rwd(M2SRwDOpcode.MemWr, line, rng.randbytes(LINE_BYTES),
                                 byte_enable=be, **meta, **common)
        if kind == "MemWrPtl":
            return self.write(line, rng.randbytes(LINE_BYTES), random_byte_enable(rng),
                              **meta, **common)
        if kind == "BIConflict":
            return self.send_rwd(M2SRwDOpcode.BIConflict, line, bytes(LINE_BYTES), **common)
        op = M2SReqOpcode[kind]
        return self.send_req(op, line, addr_bit5=rng.randrange(2), **meta, **common)

    def _out_of_range_line(self) -> int:
        """A host line just outside, or far outside, the HDM window."""
        rng = self.rng
        limit = (1 << 46) - 1
        choices = [self.base_line + self.window_lines + rng.randrange(4),
                   rng.randrange(self.base_line + self.window_lines, limit)]
        if self.base_line > 0:
            choices += [self.base_line - 1 - rng.randrange(min(4, self.base_line)),
                        rng.randrange(self.base_line)]
        return min(rng.choice(choices), limit)


def random_byte_enable(rng: random.Random) -> int:
    """Byte enables with structure: single bytes, runs, 8-byte words, random, all."""
    r = rng.random()
    if r < 0.15:
        return 1 << rng.randrange(LINE_BYTES)
    if r < 0.35:
        a = rng.randrange(LINE_BYTES)
        b = rng.randrange(a, LINE_BYTES) + 1
        return ((1 << (b - a)) - 1) << a
    if r < 0.5:
        return sum(0xFF << (8 * w) for w in range(8) if rng.random() < 0.5) or 0xFF
    if r < 0.55:
        return FULL_MASK
    return rng.getrandbits(LINE_BYTES) or 1


def _header(f: dict) -> dict:
    """A response's fields without its data, for messages."""
    return {k: v for k, v in f.items() if k != "data"}


def _ndr_name(code: int) -> str:
    for op in NDROpcode:
        if op.value == code:
            return op.name
    return f"{code:03b}"


def _line_diff(got: bytes, want: bytes) -> str:
    rows = []
    for w in range(0, LINE_BYTES, 8):
        g, e = got[w:w + 8], want[w:w + 8]
        mark = "" if g == e else "   <-- differs"
        rows.append(f"  bytes {w:2}..{w + 7:2}: got {g.hex()} want {e.hex()}{mark}")
    return "\n".join(rows)

