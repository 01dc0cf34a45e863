"""Home agent for GPU memory on CXL.cache, and a coherence checker (plain Python, no
simulator import, so Amaranth-simulator and cocotb benches can both drive it).

:class:`CacheHome` answers the device's D2H requests the way ``docs/cxl-cache.md``
describes (CXL 2.0 §3.2; ``docs/cxl-encodings.md``):

* **RdCurr**: H2D Data with the line and no GO (CXL 1.1 §3.2.4.1.6, CXL 3.x
  §3.2.4.2.6); a failed read is H2D Data with GO-Err set and all-ones data. The line
  is sampled when the request is accepted: that is the read's place in the home's
  order.
* **ItoMWr**: GO_WritePull, or (with probability ``split_writes``) WritePull followed by
  a GO once the data has arrived. RspData of a pull carries a UQID from the home's pool;
  the device's D2H Data must name it. The line is written when the data arrives, which
  is the write's place in the home's order.
* **Snoops** (:meth:`CacheHome.snoop`): H2D Req with a fresh UQID; every D2H Rsp must
  name an outstanding snoop.

The answers come from the protocol table (:mod:`tb.cxl_protocol`, CXL 1.1 Table 16,
CXL 3.1 Table 3-23): a fault names the table's error flow it takes (``poison``,
``go_err``, ``go_err_writepull``, ``drop``, ``go_error``), a good write picks
GO_WritePull or WritePull + GO at random (``split_writes``), and every request, every
answer of the table and every D2H Data and D2H Rsp of the device goes through
:attr:`CacheHome.protocol`, so the device's side of each flow (the pull's UQID, one
D2H Data per pull, snoop answers the snoop allows) is held to the table. The extra
messages of the structural faults are outside the table and not shown to it.

Each message gets a due cycle (latency plus ``0 .. jitter``); per channel the oldest due
message goes first, or a random due one with ``reorder``. Faults (poisoned data, GO-Err,
GO with state Error, stray GOs, pulls of the wrong kind, ...) are chosen per request by
a ``faults`` callable; :data:`READ_FAULTS` and :data:`WRITE_FAULTS` list them. Any
protocol violation by the device raises :class:`HomeProtocolError` at once.

The bench drives the model once per cycle ``t`` with plain method calls: ``d2h(...)``
for each D2H transfer of the cycle, ``offer(channel, t)`` for what to present on an H2D
channel (the same message until :meth:`CacheHome.take`), ``take(channel, t)`` for each
H2D transfer.

:class:`CoherenceChecker` checks what a device without a cache can get wrong, in the
terms of the user of the agent: a read returns a value that the line held in the home's
order at or after the newest write of that line completed before the read was issued,
and a write is in the home when the device reports it complete.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hw.cxl.messages import (
    D2HReqOpcode,
    D2HRspOpcode,
    GoState,
    H2DReqOpcode,
    H2DRspOpcode,
)
from tb.cxl_protocol import ProtocolChecker, row
from tb.due_queue import DueQueue, Scheduled

__all__ = [
    "CHANNELS",
    "ERROR_FAULTS",
    "READ_FAULTS",
    "READ_FUZZ_FAULTS",
    "UQIDS",
    "WRITE_FAULTS",
    "WRITE_FUZZ_FAULTS",
    "CacheHome",
    "CoherenceChecker",
    "HomeProtocolError",
    "HomeTiming",
    "Txn",
    "background_line",
]

#: UQIDs the home hands out (12 bits).
UQIDS = 1 << 12

#: H2D channels, as :meth:`CacheHome.offer` names them.
CHANNELS = ("req", "rsp", "data")

#: Read faults: ``poison``: H2D Data with Poison set; ``go_err``: H2D Data with GO-Err
#: set and all-ones data (how a host reports a failed RdCurr); and at most one of the
#: structural ones, whose extra message the home orders before the data (the data
#: completes a RdCurr): ``dup_go``: a stray GO naming the read; ``write_pull``: a
#: WritePull naming the read.
READ_FAULTS = ("poison", "go_err", "dup_go", "write_pull")

#: Write faults, at most one per write: ``go_err_writepull``: GO_ERR_WritePull (the data
#: is pulled and dropped); ``drop``: GO_WritePull_Drop (no data); ``go_error``:
#: WritePull, then GO with state Error after the data; ``dup_pull``: WritePull twice,
#: then GO after the data and the second pull; ``ext_cmp``: an ExtCmp before the
#: GO_WritePull.
WRITE_FAULTS = ("go_err_writepull", "drop", "go_error", "dup_pull", "ext_cmp")

#: Structural faults for fuzzers (not in the lists above, which the block tests run
#: through), at most one per request like the others: ``stray_rsp`` (a read or a
#: write): an H2D Rsp naming the request, with the fields :attr:`CacheHome.stray`
#: gives (an ExtCmp by default), ordered before the read's data or the write's first
#: answer; ``dup_data`` (a read): a second H2D Data naming the read, ordered after the
#: first (:attr:`CacheHome.dup_fill` may change it when it is first offered).
READ_FUZZ_FAULTS = ("stray_rsp", "dup_data")
WRITE_FUZZ_FAULTS = ("stray_rsp",)

#: Faults after which the device must report the request with its error flag.
ERROR_FAULTS = frozenset({"poison", "go_err", "go_error", "go_err_writepull", "drop"})

_LINE_MASK = (1 << 512) - 1
_READ_STRUCTURAL = ("dup_go", "write_pull", "stray_rsp", "dup_data")
#: The table's flow for a fault (the others: a good flow plus an extra message).
_FAULT_FLOW = {"poison": "data_poison", "go_err": "data_go_err",
               "go_err_writepull": "go_err_writepull", "drop": "drop",
               "go_error": "writepull_go_err", "dup_pull": "writepull_go",
               "ext_cmp": "go_writepull"}


class HomeProtocolError(Exception):
    """The device broke a CXL.cache rule that the home checks."""


def background_line(line: int) -> int:
    """The value of a line never written: a fixed pseudo-random function of its address."""
    x = (line * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & ((1 << 64) - 1)
    value = 0
    for _ in range(8):
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & ((1 << 64) - 1)
        x ^= x >> 31
        value = (value << 64) | x
    return value


@dataclass(frozen=True, kw_only=True)
class HomeTiming:
    """Timing and flow choices of :class:`CacheHome` (cycles of the device clock).

    Parameters
    ----------
    read_latency:
        RdCurr accepted to its H2D Data due.
    write_latency:
        ItoMWr accepted to its pull due.
    go_after_data:
        WritePull flow: D2H Data received to the GO due.
    jitter:
        Extra 0 .. ``jitter`` cycles drawn per message.
    reorder:
        Among due messages of a channel, pick a random one (else the oldest due).
    split_writes:
        Probability of WritePull + GO instead of GO_WritePull.
    """

    read_latency: int = 100
    write_latency: int = 20
    go_after_data: int = 2
    jitter: int = 0
    reorder: bool = False
    split_writes: float = 0.0

    def __post_init__(self) -> None:
        for name in ("read_latency", "write_latency", "go_after_data", "jitter"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
        if not 0.0 <= self.split_writes <= 1.0:
            raise ValueError(f"split_writes must be a probability, not {self.split_writes!r}")


@dataclass
class Txn:
    """One D2H request as the home saw it."""

    kind: str                   # "read" / "write"
    seq: int                    # index among requests of its kind, in acceptance order
    cqid: int
    line: int
    t_req: int
    faults: frozenset[str]
    value: int | None = None    # read: the line sent; write: the line received
    uqid: int | None = None     # write: the UQID of its pull
    t_data: int | None = None   # read: data taken; write: D2H Data received
    t_go: int | None = None     # the GO (or the GO part of GO_*WritePull) taken
    t_pull: int | None = None   # write: its pull (WritePull or GO_*WritePull) taken
    open_msgs: int = 0          # messages of this request not yet taken
    wants_data: bool = False    # write: D2H Data still expected
    split: bool = False         # write: WritePull, then GO after the data
    gate: _Msg | None = None    # write: the message its GO waits for
    go_state: GoState = GoState.I   # write, split: the state its GO grants
    done: bool = False

    @property
    def expect_error(self) -> bool:
        """The device must complete this request with its error flag set."""
        return bool(self.faults & ERROR_FAULTS)


@dataclass(eq=False)
class _Msg(Scheduled):
    channel: str = ""
    txn: Txn | None = None
    role: str = ""              # "data", "go", "pull", "snoop", "extra", "raw", "answer"
    checked: bool = False       # a message of the protocol table: shown to the checker
    #: ``fill(msg, t) -> fields``: called when the message is first offered (cycle
    #: ``t``); its fields are updated with the result.
    fill: Callable[[_Msg, int], dict] | None = None
    tag: object = None          # the sender's note (bad-input tests)


@dataclass
class CacheHome:
    """Home agent for GPU memory: see the module docstring.

    ``faults(txn)`` returns the fault names for a new request (default: none); it may
    look at ``txn.kind``, ``txn.seq``, ``txn.cqid`` and ``txn.line``. ``protocol`` is
    the link's :class:`~tb.cxl_protocol.ProtocolChecker` (a bench shares one between
    its CXL.mem and CXL.cache models).

    Hooks for bad-input tests: ``stray(txn) -> fields`` gives the H2D Rsp of a
    ``stray_rsp`` fault (``cqid`` is the request's); ``dup_fill(msg, t) -> fields``
    changes the second H2D Data of a ``dup_data`` fault when it is first offered (that
    message is not the read's: ``msg.tag`` is the read's :class:`Txn`, ``msg.txn`` None);
    ``on_take(channel, msg, t)`` sees every H2D transfer. :attr:`snoop_wait_max` is the
    longest wait, in cycles, from a snoop's transfer to its answer's.
    """

    timing: HomeTiming = field(default_factory=HomeTiming)
    rng: random.Random = field(default_factory=random.Random)
    faults: Callable[[Txn], frozenset[str] | set[str]] | None = None
    protocol: ProtocolChecker = field(default_factory=ProtocolChecker)
    stray: Callable[[Txn], dict] | None = None
    dup_fill: Callable[[_Msg, int], dict] | None = None
    on_take: Callable[[str, _Msg, int], None] | None = None

    def __post_init__(self) -> None:
        self.mem: dict[int, int] = {}
        #: Per line: ``(cycle, value)`` in the home's order; the first entry (cycle -1)
        #: is the line's value before any write.
        self.history: dict[int, list[tuple[int, int]]] = {}
        self.reads: list[Txn] = []
        self.writes: list[Txn] = []
        #: Every transfer on the six channels: ``(cycle, channel, fields)``.
        self.log: list[tuple[int, str, dict]] = []
        #: Snoops sent (those lost to a reset not counted) and answered.
        self.snoops_sent = 0
        self.snoops_answered = 0
        self.snoop_wait_max = 0
        self._snoops: dict[int, tuple[int, int]] = {}   # UQID -> (cycle, opcode)
        self._snoop_taken: dict[int, int] = {}          # UQID -> cycle of its transfer
        self.reset()

    # --- state --------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything in flight (memory and history stay): the device was reset."""
        self._open: dict[int, Txn] = {}                 # CQID -> request in flight
        self._pulls: dict[int, Txn] = {}                # UQID -> write awaiting its data
        self.snoops_sent -= len(self._snoops)
        self._snoops = {}
        self._snoop_taken = {}
        self._free_uqids = deque(range(UQIDS))
        self._queues = {c: DueQueue(self.rng, reorder=self.timing.reorder)
                        for c in CHANNELS}
        self._checked_snoops: set[int] = set()
        self.protocol.reset(("cqid", "uqid"))

    def read_line(self, line: int) -> int:
        if line not in self.mem:
            self.mem[line] = background_line(line)
            self.history[line] = [(-1, self.mem[line])]
        return self.mem[line]

    def idle(self) -> bool:
        """Nothing in flight: no open request, no message to send, no snoop unanswered."""
        return (not self._open and not self._snoops and not self._pulls
                and not any(self._queues.values()))

    def open_requests(self) -> list[Txn]:
        """The requests in flight (not every message taken, or a write's data not yet
        received), oldest first."""
        return sorted(self._open.values(), key=lambda x: (x.kind, x.seq))

    def outstanding(self) -> str:
        """What keeps the home from being idle, for hang messages."""
        parts = [f"{t.kind} cqid {t.cqid} (seq {t.seq}, open msgs {t.open_msgs}, wants data "
                 f"{t.wants_data})" for t in list(self._open.values())[:5]]
        parts += [f"{c}: {len(q)} pending" for c, q in self._queues.items() if q]
        if self._snoops:
            parts.append(f"{len(self._snoops)} snoops unanswered")
        return "; ".join(parts) or "nothing"

    # --- scheduling -----------------------------------------------------------------------
    def _delay(self, base: int) -> int:
        return base + (self.rng.randint(0, self.timing.jitter) if self.timing.jitter else 0)

    def _send(self, channel: str, fields: dict, due: int, *, txn: Txn | None = None,
              role: str = "", after: _Msg | None = None, checked: bool = False,
              fill: Callable[[_Msg, int], dict] | None = None, tag: object = None) -> _Msg:
        msg = self._queues[channel].push(_Msg(fields, due, after, channel=channel, txn=txn,
                                              role=role, checked=checked, fill=fill,
                                              tag=tag))
        if txn is not None:
            txn.open_msgs += 1
        return msg

    def _uqid(self) -> int:
        if not self._free_uqids:
            raise HomeProtocolError("home ran out of UQIDs")
        return self._free_uqids.popleft()

    def offer(self, channel: str, t: int) -> dict | None:
        """The message to present on H2D ``channel`` in cycle ``t``, or None. Once a
        message is returned it is returned again until :meth:`take`; it must then be
        presented every cycle (stream rule)."""
        msg = self._queues[channel].offer(t)
        if msg is None:
            return None
        if msg.fill is not None:
            fill, msg.fill = msg.fill, None
            msg.fields.update(fill(msg, t))
        return msg.fields

    def take(self, channel: str, t: int) -> None:
        """The message offered on ``channel`` was transferred at cycle ``t``."""
        msg = self._queues[channel].take(t)
        if msg is None:
            raise HomeProtocolError(f"H2D {channel}: transfer with nothing offered")
        self.log.append((t, f"h2d_{channel}", msg.fields))
        if msg.checked:
            self.protocol.see(f"h2d_{channel}", msg.fields, t)
        if msg.role == "snoop":
            self._snoop_taken[msg.fields["uqid"]] = t
        if self.on_take is not None:
            self.on_take(channel, msg, t)
        txn = msg.txn
        if txn is None:
            return
        if msg.role == "data" and txn.t_data is None:
            txn.t_data = t
        if msg.role == "go" and txn.t_go is None:
            txn.t_go = t
        if msg.role in ("go", "pull") and txn.kind == "write" and txn.t_pull is None:
            txn.t_pull = t
        if msg.role == "drop":
            txn.t_go = t
            self._free_uqids.append(msg.fields["rsp_data"])
        txn.open_msgs -= 1
        self._maybe_close(txn)

    def _maybe_close(self, txn: Txn) -> None:
        if txn.open_msgs == 0 and not txn.wants_data and not txn.done:
            txn.done = True
            del self._open[txn.cqid]

    # --- D2H: the device's transfers --------------------------------------------------------
    def d2h(self, channel: str, t: int, fields: dict) -> None:
        """A transfer on D2H ``channel`` ("req", "rsp", "data") at cycle ``t``."""
        self.log.append((t, f"d2h_{channel}", fields))
        getattr(self, f"_d2h_{channel}")(t, fields)

    def _d2h_req(self, t: int, f: dict) -> None:
        cqid, line, op = f["cqid"], f["address"], f["opcode"]
        if f.get("nt", 0) or f.get("rsvd0", 0) or f.get("rsvd1", 0):
            raise HomeProtocolError(f"D2H Req at {t}: NT or reserved bits set: {f}")
        if cqid in self._open:
            old = self._open[cqid]
            raise HomeProtocolError(f"D2H Req at {t}: CQID {cqid} reused while {old.kind} "
                                    f"seq {old.seq} is in flight")
        if op not in (D2HReqOpcode.RdCurr.value, D2HReqOpcode.ItoMWr.value):
            raise HomeProtocolError(f"D2H Req at {t}: opcode {op:#07b} not expected from this "
                                    f"agent")
        self.protocol.request("d2h_req", f, t, target="host")
        kind = "read" if op == D2HReqOpcode.RdCurr.value else "write"
        txns = self.reads if kind == "read" else self.writes
        txn = Txn(kind, len(txns), cqid, line, t, frozenset())
        txn.faults = frozenset(self.faults(txn)) if self.faults else frozenset()
        self._check_faults(txn, READ_FAULTS + READ_FUZZ_FAULTS if kind == "read"
                           else WRITE_FAULTS + WRITE_FUZZ_FAULTS)
        txns.append(txn)
        self._open[cqid] = txn
        if kind == "read":
            self._read(txn, t)
        else:
            self._write(txn, t, self.timing)

    def _check_faults(self, txn: Txn, allowed: tuple[str, ...]) -> None:
        bad = txn.faults - set(allowed)
        if bad:
            raise ValueError(f"faults {sorted(bad)} do not apply to a {txn.kind} here")
        kinds = set(_READ_STRUCTURAL if txn.kind == "read"
                    else WRITE_FAULTS + WRITE_FUZZ_FAULTS)
        if len(txn.faults & kinds) > 1:
            raise ValueError(f"at most one of {sorted(kinds)} per {txn.kind}, not "
                             f"{sorted(txn.faults)}")

    def _read(self, txn: Txn, t: int) -> None:
        """The data, and no GO. A structural fault's extra message is ordered before the
        data, so that the device takes it while the read is still in flight."""
        faults = txn.faults
        failed = "go_err" in faults
        line = self.read_line(txn.line)
        txn.value = _LINE_MASK if failed else line      # the line sent
        data = {"cqid": txn.cqid, "data": txn.value, "poison": int("poison" in faults),
                "go_err": int(failed)}
        checked = not (failed and "poison" in faults)   # (both at once: no table flow)
        if checked:
            flow = self._flow(txn, "data")
            assert flow.msgs[0].mismatch(data, {"cqid": txn.cqid}) is None, flow
        else:
            self.protocol.forget(("cqid", txn.cqid))
        t_data = t + self._delay(self.timing.read_latency)
        extra = None
        if "write_pull" in faults:
            extra = {"opcode": H2DRspOpcode.WritePull.value, "cqid": txn.cqid,
                     "rsp_data": self.rng.randrange(UQIDS)}
        elif "dup_go" in faults:
            extra = {"opcode": H2DRspOpcode.GO.value, "cqid": txn.cqid,
                     "rsp_data": GoState.I.value}
        elif "stray_rsp" in faults:
            extra = self._stray(txn)
        before = None
        if extra is not None:
            before = self._send("rsp", extra, t_data, txn=txn, role="extra")
        first = self._send("data", data, t_data, txn=txn, role="data", after=before,
                           checked=checked)
        if "dup_data" in faults:
            # Not one of the read's messages: the read is done with its first data (the
            # device may free and reuse its CQID then); ``tag`` names the read.
            self._send("data", dict(data), t_data, role="extra", after=first,
                       fill=self.dup_fill, tag=txn)

    def _stray(self, txn: Txn) -> dict:
        fields = (self.stray(txn) if self.stray is not None
                  else {"opcode": H2DRspOpcode.ExtCmp.value, "rsp_data": 0})
        return {**fields, "cqid": txn.cqid}

    def _write(self, txn: Txn, t: int, timing: HomeTiming) -> None:
        faults = txn.faults
        due = t + self._delay(timing.write_latency)
        flow = self._flow(txn, "go_writepull",
                          {"writepull_go": timing.split_writes,
                           "go_writepull": 1.0 - timing.split_writes})
        first = flow.msgs[0]        # the pull (or GO_WritePull_Drop)

        def send(opcode, role, after=None, uqid=None, checked=False):
            return self._send("rsp", {"opcode": opcode.value, "cqid": txn.cqid,
                                      "rsp_data": 0 if uqid is None else uqid},
                              due, txn=txn, role=role, after=after, checked=checked)

        stray = (self._send("rsp", self._stray(txn), due, txn=txn, role="extra")
                 if "stray_rsp" in faults else None)
        if flow.name == "drop":
            send(H2DRspOpcode(min(first.opcodes)), "drop", stray, uqid=self._uqid(),
                 checked=True)
            return
        txn.uqid = self._uqid()
        txn.wants_data = True
        self._pulls[txn.uqid] = txn
        txn.split = flow.name.startswith("writepull")
        if txn.split:       # the GO (flow.msgs[1]) follows the data (_d2h_data)
            txn.go_state = GoState(flow.msgs[1].fields["rsp_data"])
            pull = send(H2DRspOpcode(min(first.opcodes)), "pull", stray, uqid=txn.uqid,
                        checked=True)
            if "dup_pull" in faults:
                txn.gate = send(H2DRspOpcode.WritePull, "extra", pull, uqid=txn.uqid)
            return
        before = send(H2DRspOpcode.ExtCmp, "extra") if "ext_cmp" in faults else stray
        send(H2DRspOpcode(min(first.opcodes)), "go", before, uqid=txn.uqid, checked=True)

    def _flow(self, txn: Txn, good: str, weights: dict[str, float] | None = None):
        """The table's flow for ``txn``: the one its fault names, else a random good one
        (``weights``), else ``good``."""
        r = row("d2h_req", (D2HReqOpcode.RdCurr if txn.kind == "read"
                            else D2HReqOpcode.ItoMWr).value, "host")
        named = [_FAULT_FLOW[x] for x in sorted(txn.faults) if x in _FAULT_FLOW]
        if named:
            return r.flow(named[0])
        if weights:
            names = list(weights)
            return r.flow(self.rng.choices(names, weights=[weights[n] for n in names])[0])
        return r.flow(good)

    def _d2h_data(self, t: int, f: dict) -> None:
        uqid = f["uqid"]
        if f.get("chunk_valid", 0) or f.get("bogus", 0) or f.get("poison", 0) or f.get("rsvd", 0):
            raise HomeProtocolError(f"D2H Data at {t}: ChunkValid/Bogus/Poison/RSVD set: "
                                    f"uqid {uqid}")
        txn = self._pulls.pop(uqid, None)
        if txn is None:
            raise HomeProtocolError(f"D2H Data at {t}: UQID {uqid} names no pull in flight")
        self.protocol.see("d2h_data", f, t)
        txn.value, txn.t_data, txn.wants_data = f["data"], t, False
        self._free_uqids.append(uqid)
        if "go_err_writepull" not in txn.faults:       # else the host drops the data
            self.read_line(txn.line)
            self.mem[txn.line] = txn.value
            self.history[txn.line].append((t, txn.value))
        if txn.split:
            self._send("rsp", {"opcode": H2DRspOpcode.GO.value, "cqid": txn.cqid,
                               "rsp_data": txn.go_state.value},
                       t + self._delay(self.timing.go_after_data), txn=txn, role="go",
                       after=txn.gate, checked=True)
        self._maybe_close(txn)

    def _d2h_rsp(self, t: int, f: dict) -> None:
        uqid = f["uqid"]
        if uqid not in self._snoops:
            raise HomeProtocolError(f"D2H Rsp at {t}: UQID {uqid} names no snoop in flight")
        if f["opcode"] != D2HRspOpcode.RspIHitI.value or f.get("rsvd", 0):
            raise HomeProtocolError(f"D2H Rsp at {t}: {f} is not RspIHitI (the device holds "
                                    f"no host line)")
        if uqid in self._checked_snoops:
            self._checked_snoops.discard(uqid)
            self.protocol.see("d2h_rsp", f, t)
        taken = self._snoop_taken.pop(uqid, None)
        if taken is None:
            raise HomeProtocolError(f"D2H Rsp at {t}: UQID {uqid} answers a snoop not yet "
                                    f"transferred")
        self.snoop_wait_max = max(self.snoop_wait_max, t - taken)
        del self._snoops[uqid]
        self._free_uqids.append(uqid)
        self.snoops_answered += 1

    # --- stimulus -----------------------------------------------------------------------------
    def snoop(self, t: int, line: int, opcode: int = H2DReqOpcode.SnpInv.value, *,
              uqid: int | None = None, rsvd: int = 0, tag: object = None) -> int:
        """Send a snoop of ``line`` from cycle ``t`` on (any 3-bit ``opcode``, reserved ones
        included; ``rsvd`` in its reserved field); returns its UQID: ``uqid`` when that
        one is free, else the next free one."""
        if uqid is not None and uqid in self._free_uqids:
            self._free_uqids.remove(uqid)
        else:
            uqid = self._uqid()
        self._snoops[uqid] = (t, opcode)
        fields = {"opcode": opcode, "address": line, "uqid": uqid, "rsvd": rsvd}
        if row("h2d_req", opcode, "host") is not None:     # (a reserved one is bad input)
            self.protocol.request("h2d_req", fields, t, target="host")
            self._checked_snoops.add(uqid)
        self._send("req", fields, t, role="snoop", tag=tag)
        self.snoops_sent += 1
        return uqid

    def raw(self, channel: str, t: int, fields: dict, *,
            fill: Callable[[_Msg, int], dict] | None = None, tag: object = None) -> _Msg:
        """Send an arbitrary H2D Rsp or H2D Data from cycle ``t`` on, tied to no request
        (bad-input tests; not shown to the protocol checker); ``fill`` may change its
        fields when it is first offered, ``tag`` is the caller's note."""
        if channel not in ("rsp", "data"):
            raise ValueError(f"raw messages go on 'rsp' or 'data', not {channel!r}")
        return self._send(channel, dict(fields), t, role="raw", fill=fill, tag=tag)

    def answer(self, channel: str, t: int, fields: dict) -> _Msg:
        """Send, from cycle ``t`` on, an H2D Rsp or H2D Data that answers another
        model's request (the DCOH's, answered by the host of device memory): shown to
        the protocol checker when it is taken."""
        if channel not in ("rsp", "data"):
            raise ValueError(f"answers go on 'rsp' or 'data', not {channel!r}")
        return self._send(channel, dict(fields), t, role="answer", checked=True)


class CoherenceChecker:
    """Holds the agent's user-visible results to the home's order (module docstring).

    Call the four methods as the user side of the agent transfers; ``key`` is any
    hashable naming the request. Violations raise :class:`AssertionError`.
    """

    def __init__(self, home: CacheHome):
        self.home = home
        self._floor: dict[int, int] = {}        # line -> history index of newest completed
        self._reads: dict[object, tuple[int, int, int]] = {}
        self._writes: dict[object, tuple[int, int, int]] = {}
        self.reads_checked = 0
        self.writes_checked = 0

    def read_issued(self, key: object, line: int, t: int) -> None:
        self._reads[key] = (line, self._floor.get(line, 0), t)

    def read_delivered(self, key: object, value: int, error: bool, t: int) -> None:
        line, floor, t_issue = self._reads.pop(key)
        if error:
            return      # the value of a read with an error is not held to anything
        history = self.home.history.get(line, [])
        allowed = [v for i, (ta, v) in enumerate(history) if i >= floor and ta < t]
        assert value in allowed, (
            f"read {key!r} of line {line:#x} (issued at {t_issue}, delivered at {t}) returned "
            f"a value the line did not hold since the newest write completed before it "
            f"({len(allowed)} candidates)")
        self.reads_checked += 1

    def write_issued(self, key: object, line: int, value: int, t: int) -> None:
        self._writes[key] = (line, value & _LINE_MASK, t)

    def write_completed(self, key: object, error: bool, t: int) -> None:
        line, value, t_issue = self._writes.pop(key)
        if error:
            return      # the home may have dropped it
        history = self.home.history.get(line, [])
        found = [i for i, (ta, v) in enumerate(history) if v == value and t_issue <= ta < t]
        assert found, (f"write {key!r} of line {line:#x} reported complete at {t} before its "
                       f"data reached the home")
        self._floor[line] = max(self._floor.get(line, 0), found[-1])
        self.writes_checked += 1
