"""Host side of device memory in host bias, and a checker of the bias rules (plain
Python, no simulator import, so Amaranth-simulator and cocotb benches can both use it).

:class:`DcohHost` answers the D2H requests that the DCOH (``hw/cxl/dcoh.py``,
``docs/dcoh.md``) sends for lines of device memory (CXL 2.0 §2.2.1, "Bias Based
Coherency Model"; ``docs/cxl-encodings.md``, "Flows"):

* **RdCurr** / **RdShared** (a device read): the host writes a dirty copy back and keeps
  a clean one, then sends M2S **MemRdFwd**.
* **RdOwn** (a device write): the host writes a dirty copy back and drops its copy, then
  sends **MemRdFwd** (CXL 1.1 Table 17, CXL 3.1 Table 3-24: MemWrFwd answers only
  WOWrInv / WOWrInvF).
* **RdOwnNoData** (a flip's claim): the host writes a dirty copy back and drops its copy,
  then sends **MemRdFwd**.

Instead of the forward, an ``answer`` callable may pick another answer the specification
allows (:data:`ANSWERS`): H2D Rsp GO-E for a claim (CXL 3.1 §3.2.4.2.13), H2D Rsp
GO-Err for any request, H2D Data with GO-Err and all-ones data for a read. GO-E has the
forward's cache effect; after a GO-Err the host keeps its copy and the request has
failed. H2D messages come out of :meth:`DcohHost.offer_h2d` / :meth:`DcohHost.take_h2d`.

The forward carries the CQID in its Tag and the line's address (Addr[51:5], so the line
address shifted left by one). The host's cache effect happens when the forward leaves,
which is the request's place in the host's order. Each forward is due after
``HostTiming.latency`` plus ``0 .. jitter`` cycles; the oldest due one goes first, or a
random due one with ``reorder``. Faults chosen per request by a ``faults`` callable put
a bad forward before the good one (:data:`FWD_FAULTS`). A protocol violation by the
device (a CQID reused while open, an unexpected opcode, reserved bits) raises
:class:`DcohHostError` at once.

The host's own cache of device lines (:attr:`DcohHost.cache`) is filled by
:meth:`DcohHost.touch`, which a bench calls when the DCOH has answered a host check (the
host may then read and cache the line).

The bench drives the model once per cycle ``t``: ``d2h(t, fields)`` for each D2H Req
transfer, ``offer(t)`` for what to present on the forward input (the same message until
:meth:`DcohHost.take`), ``take(t)`` for each forward transfer.

:class:`BiasChecker` holds the DCOH to the bias rules, in the terms of the DCOH's user
and of the host: a device access to a host-bias page is granted only after its forward;
a device-bias grant needs every line of its page claimed since the host last touched it
and no line of the page in the host's cache; a host check is answered only once every
access of its page permitted before the check is done (a host-bias access: of its
line); a flip to device bias that reports success leaves its pages claimed and uncached.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hw.cxl.messages import LINE_BITS, D2HReqOpcode, GoState, H2DRspOpcode, M2SReqOpcode, MetaField
from tb.due_queue import DueQueue, Scheduled

__all__ = [
    "ANSWERS",
    "FWD_FAULTS",
    "BiasChecker",
    "DcohHost",
    "DcohHostError",
    "HostReq",
    "HostTiming",
    "fwd_fields",
]

#: Bad forwards the host can send before the good one: ``wrong_opcode`` the other
#: forward (MemWrFwd, which answers none of the DCOH's requests); ``wrong_address`` the
#: right forward for the next line; ``not_fwd`` a MemRd with the request's Tag and
#: address.
FWD_FAULTS = ("wrong_opcode", "wrong_address", "not_fwd")

#: How the host answers a request: ``fwd`` M2S MemRdFwd (every request), ``go_e`` H2D Rsp
#: GO-E (a claim, RdOwnNoData), ``go_err`` H2D Rsp GO-Err (every request), ``data_err``
#: H2D Data with GO-Err and all-ones data (a read).
ANSWERS = ("fwd", "go_e", "go_err", "data_err")
#: The answers that fail the request.
FAILING = ("go_err", "data_err")

_LINE_MASK = (1 << 46) - 1
_READS = (D2HReqOpcode.RdCurr.value, D2HReqOpcode.RdShared.value)


class DcohHostError(Exception):
    """The device broke a rule that the host checks."""


@dataclass(frozen=True, kw_only=True)
class HostTiming:
    """Timing of :class:`DcohHost` (cycles of the device clock).

    Parameters
    ----------
    latency:
        D2H Req accepted to its forward due.
    jitter:
        Extra 0 .. ``jitter`` cycles drawn per forward.
    reorder:
        Among due forwards, pick a random one (else the oldest due).
    """

    latency: int = 20
    jitter: int = 0
    reorder: bool = False

    def __post_init__(self) -> None:
        for name in ("latency", "jitter"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, not {value!r}")


@dataclass
class HostReq:
    """One D2H Req as the host saw it."""

    seq: int
    cqid: int
    opcode: int                 # D2HReqOpcode value
    line: int                   # host line address
    t_req: int
    faults: frozenset[str]
    t_fwd: int | None = None    # the good forward (or H2D answer) taken
    answer: str = "fwd"         # one of ANSWERS

    @property
    def fwd_opcode(self) -> int:
        """Every request the DCOH sends is answered MemRdFwd."""
        return M2SReqOpcode.MemRdFwd.value


@dataclass(eq=False)
class _Msg(Scheduled):
    req: HostReq | None = None
    good: bool = False
    channel: str = "fwd"        # "fwd" (M2S Req), or H2D "rsp" / "data"


def h2d_answer(answer: str, cqid: int) -> tuple[str, dict]:
    """``(channel, fields)`` of an H2D answer (``go_e``, ``go_err``, ``data_err``)."""
    if answer == "data_err":
        return "data", {"cqid": cqid, "chunk_valid": 0, "poison": 0, "go_err": 1,
                        "rsvd": 0, "data": (1 << LINE_BITS) - 1}
    state = {"go_e": GoState.E, "go_err": GoState.Error}[answer]
    return "rsp", {"opcode": H2DRspOpcode.GO.value, "rsp_data": state.value, "rsp_pre": 0,
                   "cqid": cqid, "rsvd": 0}


def fwd_fields(opcode: int, tag: int, line: int) -> dict:
    """An M2S Req forward (or any opcode) for host line ``line``."""
    return {"opcode": opcode, "snp_type": 0, "meta_field": MetaField.NoOp.value,
            "meta_value": 0, "tag": tag, "address": (line & _LINE_MASK) << 1}


@dataclass
class DcohHost:
    """Host side for device memory in host bias: see the module docstring.

    ``read_opcode`` is the D2H Req the device uses for reads (the DCOH's parameter);
    ``faults(req)`` returns the :data:`FWD_FAULTS` for a new request (default none);
    ``answer(req)`` one of :data:`ANSWERS` allowed for the request (default ``fwd``).
    """

    timing: HostTiming = field(default_factory=HostTiming)
    rng: random.Random = field(default_factory=random.Random)
    read_opcode: D2HReqOpcode = D2HReqOpcode.RdCurr
    faults: Callable[[HostReq], Iterable[str]] | None = None
    answer: Callable[[HostReq], str] | None = None

    def __post_init__(self) -> None:
        #: Host-cached copies of device lines: host line -> "S" (clean) or "M" (dirty).
        self.cache: dict[int, str] = {}
        #: Dirty lines written back to device memory: ``(cycle, host line)``.
        self.writebacks: list[tuple[int, int]] = []
        self.reqs: list[HostReq] = []
        #: Every transfer: ``(cycle, "d2h_req" / "fwd", fields)``.
        self.log: list[tuple[int, str, dict]] = []
        #: Called with ``(req, cycle)`` for each good forward (or GO-E) taken.
        self.listeners: list[Callable[[HostReq, int], None]] = []
        #: Accesses (not claims) failed by a GO-Err taken, by CQID, until the bench
        #: collects them with their denied grant.
        self.failed: dict[int, HostReq] = {}
        self.reset()

    # --- state ----------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything in flight (the cache stays): the device was reset."""
        self._open: dict[int, HostReq] = {}
        self._queue = DueQueue(self.rng, reorder=self.timing.reorder)
        self._h2d = DueQueue(self.rng, reorder=self.timing.reorder)
        self.failed = {}

    def idle(self) -> bool:
        return not self._open and not self._queue and not self._h2d

    def outstanding(self) -> str:
        """What keeps the host from being idle, for hang messages."""
        parts = [f"cqid {r.cqid} opcode {r.opcode} line {r.line:#x} (seq {r.seq})"
                 for r in list(self._open.values())[:5]]
        if self._queue:
            parts.append(f"{len(self._queue)} forwards pending")
        if self._h2d:
            parts.append(f"{len(self._h2d)} H2D messages pending")
        return "; ".join(parts) or "nothing"

    def touch(self, line: int, state: str | None) -> None:
        """The host accessed host line ``line`` after the DCOH answered its check; it
        now caches it in ``state`` ("S", "M") or not at all (None)."""
        if state is None:
            return
        if state not in ("S", "M"):
            raise ValueError(f"state must be 'S', 'M' or None, not {state!r}")
        self.cache[line & _LINE_MASK] = state

    def cached(self, lines: Iterable[int]) -> list[int]:
        """The host lines of ``lines`` the host caches."""
        return [x for x in lines if (x & _LINE_MASK) in self.cache]

    # --- scheduling -------------------------------------------------------------------------
    def _send(self, fields: dict, due: int, *, req: HostReq | None = None,
              good: bool = False, after: _Msg | None = None) -> _Msg:
        return self._queue.push(_Msg(fields, due, after, req=req, good=good))

    def offer(self, t: int) -> dict | None:
        """The forward to present in cycle ``t``, or None; once returned it is returned
        again until :meth:`take`."""
        msg = self._queue.offer(t)
        return None if msg is None else msg.fields

    def take(self, t: int) -> None:
        """The forward offered was transferred in cycle ``t``."""
        msg = self._queue.take(t)
        if msg is None:
            raise DcohHostError(f"forward transfer at {t} with nothing offered")
        self.log.append((t, "fwd", msg.fields))
        if msg.good:
            self._answered(msg.req, t)

    def offer_h2d(self, t: int) -> tuple[str, dict] | None:
        """``("rsp" | "data", fields)`` to present in cycle ``t`` on H2D Rsp or H2D Data,
        or None; once returned it is returned again until :meth:`take_h2d`."""
        msg = self._h2d.offer(t)
        return None if msg is None else (msg.channel, msg.fields)

    def take_h2d(self, t: int) -> None:
        """The H2D message offered was transferred in cycle ``t``."""
        msg = self._h2d.take(t)
        if msg is None:
            raise DcohHostError(f"H2D transfer at {t} with nothing offered")
        self.log.append((t, f"h2d_{msg.channel}", msg.fields))
        if msg.good:
            self._answered(msg.req, t)

    def _answered(self, req: HostReq, t: int) -> None:
        """The good answer of ``req`` left in cycle ``t``: the host's cache effect."""
        req.t_fwd = t
        del self._open[req.cqid]
        if req.answer in FAILING:   # the request failed: the host keeps its copy
            if req.opcode != D2HReqOpcode.RdOwnNoData.value:    # an access: a denied grant
                self.failed[req.cqid] = req
            return
        line = req.line
        if self.cache.get(line) == "M":
            self.writebacks.append((t, line))
        if req.opcode in _READS:
            if line in self.cache:
                self.cache[line] = "S"
        else:                       # RdOwn, RdOwnNoData: the host gives the line up
            self.cache.pop(line, None)
        for listener in self.listeners:
            listener(req, t)

    # --- D2H Req ------------------------------------------------------------------------------
    def d2h(self, t: int, f: dict) -> None:
        """A D2H Req transfer in cycle ``t``."""
        self.log.append((t, "d2h_req", f))
        cqid, op = f["cqid"], f["opcode"]
        if f.get("nt", 0) or f.get("rsvd0", 0) or f.get("rsvd1", 0):
            raise DcohHostError(f"D2H Req at {t}: NT or reserved bits set: {f}")
        allowed = (self.read_opcode.value, D2HReqOpcode.RdOwn.value,
                   D2HReqOpcode.RdOwnNoData.value)
        if op not in allowed:
            raise DcohHostError(f"D2H Req at {t}: opcode {op:#07b} not expected from the "
                                f"DCOH")
        if cqid in self._open:
            raise DcohHostError(f"D2H Req at {t}: CQID {cqid} reused while open")
        req = HostReq(len(self.reqs), cqid, op, f["address"], t, frozenset())
        if self.faults:
            req.faults = frozenset(self.faults(req))
            bad = req.faults - set(FWD_FAULTS)
            if bad:
                raise ValueError(f"unknown forward faults {sorted(bad)}")
        if self.answer:
            req.answer = self.answer(req)
            ok = {"fwd", "go_err"} | ({"go_e"} if op == D2HReqOpcode.RdOwnNoData.value else
                                      {"data_err"} if op in _READS else set())
            if req.answer not in ok:
                raise ValueError(f"answer {req.answer!r} not allowed for opcode {op:#07b}")
        self.reqs.append(req)
        self._open[cqid] = req
        due = t + self.timing.latency + (self.rng.randint(0, self.timing.jitter)
                                         if self.timing.jitter else 0)
        before = None
        for fault in sorted(req.faults):
            if fault == "wrong_opcode":
                bad_fields = fwd_fields(M2SReqOpcode.MemWrFwd.value, cqid, req.line)
            elif fault == "wrong_address":
                bad_fields = fwd_fields(req.fwd_opcode, cqid, req.line + 1)
            else:
                bad_fields = fwd_fields(M2SReqOpcode.MemRd.value, cqid, req.line)
            before = self._send(bad_fields, due, req=req, after=before)
        if req.answer == "fwd":
            self._send(fwd_fields(req.fwd_opcode, cqid, req.line), due, req=req, good=True,
                       after=before)
        else:
            channel, fields = h2d_answer(req.answer, cqid)
            self._h2d.push(_Msg(fields, due, before, req=req, good=True, channel=channel))

    def raw(self, t: int, fields: dict) -> None:
        """Send an arbitrary M2S Req from cycle ``t`` on, tied to no request."""
        self._send(dict(fields), t)

    def raw_h2d(self, t: int, channel: str, fields: dict) -> None:
        """Send an arbitrary H2D Rsp (``channel`` "rsp") or H2D Data ("data") from cycle
        ``t`` on, tied to no request."""
        if channel not in ("rsp", "data"):
            raise ValueError(f"channel must be 'rsp' or 'data', not {channel!r}")
        self._h2d.push(_Msg(dict(fields), t, channel=channel))


@dataclass
class _Grant:
    page: int
    host_bias: bool
    t: int
    t_fwd: int | None
    line: int


class BiasChecker:
    """Checks the bias rules (module docstring) as the bench reports events.

    ``hdm_base`` is the host line address of device line 0. The bench calls
    :meth:`grant`, :meth:`done`, :meth:`check_answered` and :meth:`flip_done`; forwards
    come from the host's listener. Violations raise :class:`AssertionError`.
    """

    def __init__(self, host: DcohHost, *, hdm_base: int, lines_per_page: int):
        self.host = host
        self.hdm_base = hdm_base
        self.lpp = lines_per_page
        host.listeners.append(self._forward)
        self.reset()
        self.grants = {"host": 0, "device": 0}
        self.checks = {"plain": 0, "flipped": 0}

    def reset(self) -> None:
        """The DCOH was reset: every page is in host bias, nothing is in flight."""
        self.claimed: dict[int, set[int]] = {}      # page -> device lines claimed
        self.outstanding: dict[int, _Grant] = {}    # handle -> undone grant
        self.answers: dict[int, list[tuple[int, int]]] = {}  # page -> (t_chk, t_answer)
        self.line_answers: dict[int, list[tuple[int, int]]] = {}  # line -> the same
        self.fwds: dict[int, HostReq] = {}          # CQID -> forward taken, not granted
        self.to_host: dict[int, int] = {}           # page -> end of its last flip to host

    def dev_line(self, host_line: int) -> int:
        return (host_line - self.hdm_base) & _LINE_MASK

    def host_lines(self, page: int) -> range:
        start = self.hdm_base + page * self.lpp
        return range(start, start + self.lpp)

    def _forward(self, req: HostReq, t: int) -> None:
        line = self.dev_line(req.line)
        if req.opcode == D2HReqOpcode.RdOwnNoData.value:
            self.claimed.setdefault(line // self.lpp, set()).add(line)
        else:
            self.fwds[req.cqid] = req

    def grant(self, t: int, *, line: int, write: bool, handle: int, cqid: int,
              host_bias: bool) -> None:
        """A grant (without error) for device line ``line`` left the DCOH in cycle ``t``."""
        page = line // self.lpp
        where = f"grant at {t} of line {line:#x} (page {page}, handle {handle})"
        assert handle not in self.outstanding, f"{where}: handle still held by a grant"
        t_fwd = None
        if host_bias:
            req = self.fwds.pop(cqid, None)
            assert req is not None, f"{where}: host-bias grant before its forward"
            assert req.line == (self.hdm_base + line) & _LINE_MASK, \
                f"{where}: the forward was for host line {req.line:#x}"
            want = D2HReqOpcode.RdOwn.value if write else self.host.read_opcode.value
            assert req.opcode == want, f"{where}: sent as opcode {req.opcode}"
            t_fwd = req.t_fwd
            for t_chk, t_ans in self.line_answers.get(line, ()):
                assert not (t_fwd < t_chk and t_ans < t), (
                    f"{where}: its forward (at {t_fwd}) came before the host check at "
                    f"{t_chk}, which was answered at {t_ans} before the grant")
            self.grants["host"] += 1
        else:
            claimed = self.claimed.get(page, set())
            assert len(claimed) == self.lpp, (
                f"{where}: device-bias grant with {len(claimed)} of {self.lpp} lines claimed "
                f"since the host last touched the page")
            cached = self.host.cached(self.host_lines(page))
            assert not cached, f"{where}: device-bias grant while the host caches {cached}"
            self.grants["device"] += 1
        self.outstanding[handle] = _Grant(page, host_bias, t, t_fwd, line)

    def done(self, t: int, handle: int) -> None:
        assert self.outstanding.pop(handle, None) is not None, \
            f"done at {t} for handle {handle} without a grant"

    def check_answered(self, t_chk: int, t_ans: int, line: int, flipped: bool) -> None:
        """A host check of device line ``line`` taken in cycle ``t_chk`` was answered
        (transferred) in cycle ``t_ans``; the host may touch the page from now on."""
        page = line // self.lpp
        for handle, g in self.outstanding.items():
            # A host-bias access counts only for a check of its own line.
            if g.page != page or (g.host_bias and g.line != line):
                continue
            assert g.host_bias, (f"check of page {page} (taken {t_chk}) answered at {t_ans} "
                                 f"with device-bias handle {handle} (granted {g.t}) undone")
            assert g.t_fwd >= t_chk, (
                f"check of page {page} (taken {t_chk}) answered at {t_ans} with handle "
                f"{handle} undone, whose forward came at {g.t_fwd}")
        if flipped:     # the page was in device bias when the check looked at it
            assert (len(self.claimed.get(page, ())) == self.lpp
                    or self.to_host.get(page, -1) >= t_chk), \
                f"check at {t_chk} flipped back page {page}, which was never flipped"
        self.claimed[page] = set()
        self.answers.setdefault(page, []).append((t_chk, t_ans))
        self.line_answers.setdefault(line, []).append((t_chk, t_ans))
        self.checks["flipped" if flipped else "plain"] += 1

    def flip_done(self, t_start: int, t_end: int, first: int, pages: int, *, to_host: bool,
                  error: bool) -> None:
        """A flip command started in cycle ``t_start`` reported done in cycle ``t_end``."""
        for page in range(first, first + pages):
            if to_host:
                for handle, g in self.outstanding.items():
                    assert g.page != page or g.host_bias, \
                        f"flip to host bias done with device-bias handle {handle} of page {page}"
                self.claimed[page] = set()
                self.to_host[page] = t_end
            elif not error and not any(t_ans >= t_start
                                       for _, t_ans in self.answers.get(page, ())):
                assert len(self.claimed.get(page, ())) == self.lpp, \
                    f"flip reported success with page {page} not claimed"
                cached = self.host.cached(self.host_lines(page))
                assert not cached, f"flip reported success while the host caches {cached}"
