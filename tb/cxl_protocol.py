"""Which responses the CXL specification allows for each request, and a checker that
follows transactions against that table (plain Python, no simulator import).

The table is written from the specification, not from the RTL: each row names the
CXL 1.1 / 2.0 / 3.1 table or section it comes from (the opcode encodings themselves
are those of ``hw/cxl/messages.py``, ``docs/cxl-encodings.md``). A row is one request
kind, keyed by ``(channel, opcode, target)``:

* ``("m2s_req" | "m2s_rwd", opcode, "hdm" | "nxm")``: a host request to the device's
  memory (``"hdm"``: an address the device decodes; ``"nxm"``: no memory there);
* ``("d2h_req", opcode, "device")``: a device request for a line of its own memory in
  host bias (the DCOH's requests, CXL 1.1 Table 17, CXL 3.1 Table 3-24);
* ``("d2h_req", opcode, "host")``: a device request for host memory (the CXL.cache
  agent's, CXL 1.1 Table 16, CXL 3.1 Table 3-23);
* ``("h2d_req", opcode, "host")``: a host snoop (CXL 1.1 Table 19, CXL 3.1 Table 3-26).

A row holds the allowed **flows**; a flow is a set of messages (:class:`Msg`: channel,
allowed opcodes, fixed field values), each with the messages of the flow that must come
before it, so a flow is a partial order: "DRS and NDR in either order", "the D2H Data
after the pull, the GO before or after it". Every message also echoes the request's
identifier (:data:`ECHO`: Tag for CXL.mem, CQID for H2D, Tag = CQID and the line's
address for a forward, the pull's UQID in D2H Data, the snoop's UQID in D2H Rsp).

Features
--------
* :func:`row` / :data:`TABLE`: the rows; :func:`pick` chooses a flow at random (for the
  host models), :meth:`Msg.build` makes its messages' fields.
* :class:`ProtocolChecker`: opens a transaction per request (:meth:`~ProtocolChecker.
  request`), routes every later message to it by its identifier
  (:meth:`~ProtocolChecker.see`), and raises :class:`ProtocolError` at once for a
  request not in the table, a message no flow allows (unexpected opcode or field, wrong
  order, a duplicate, a message after the transaction completed), and at
  :meth:`~ProtocolChecker.finish` for a transaction still missing a response.

Limitations
-----------
* Requests the device never sends or receives are left out (WOWrInv / WOWrInvF with
  MemWrFwd, the cache-state requests of a device cache, CXL 3.x back-invalidate), so
  MemWrFwd answers no row: any MemWrFwd is outside the table.
* MetaValue of CXL.mem responses is not constrained here (with Meta0-State storage it is
  the line's stored state; :class:`tb.host_agent.HostAgent` checks it exactly).
* A transaction is closed by the first flow that completes; no flow of a row is a
  prefix of another (:func:`_validate` checks it), so this is unambiguous.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hw.cxl.messages import (
    D2HReqOpcode,
    D2HRspOpcode,
    DRSOpcode,
    GoState,
    H2DReqOpcode,
    H2DRspOpcode,
    M2SReqOpcode,
    M2SRwDOpcode,
    MetaField,
    MetaValue,
    NDROpcode,
)

__all__ = [
    "ALL_ONES",
    "ECHO",
    "GRANT",
    "TABLE",
    "Flow",
    "Msg",
    "ProtocolChecker",
    "ProtocolError",
    "Row",
    "Transaction",
    "pick",
    "row",
]

#: A 64-byte line of all ones: the data of MemData-NXM and of an H2D Data with GO-Err.
ALL_ONES = (1 << 512) - 1

#: Channels whose messages the host sends (the others the device sends).
HOST_CHANNELS = frozenset({"m2s_req", "m2s_rwd", "h2d_req", "h2d_rsp", "h2d_data"})

#: Per channel of a response: ``(field, request value)`` pairs the message must carry.
#: Request values: ``tag`` / ``ld_id`` of an M2S request, ``cqid`` and ``fwd_address``
#: (the line as Addr[51:5], as an M2S Req carries it) of a D2H Req, ``uqid`` of a snoop,
#: ``pull_uqid`` the RspData of the pull seen before (CXL 2.0 §3.2.3.3, D2H Data UQID).
ECHO: Mapping[str, tuple[tuple[str, str], ...]] = {
    "s2m_ndr": (("tag", "tag"), ("ld_id", "ld_id")),
    "s2m_drs": (("tag", "tag"), ("ld_id", "ld_id")),
    "m2s_req": (("tag", "cqid"), ("address", "fwd_address")),
    "h2d_rsp": (("cqid", "cqid"),),
    "h2d_data": (("cqid", "cqid"),),
    "d2h_data": (("uqid", "pull_uqid"),),
    "d2h_rsp": (("uqid", "uqid"),),
}

#: The NDR that grants what Meta0-State asks for (CXL 1.1 Table 24, CXL 3.1 Table 3-37):
#: MetaValue Shared -> Cmp-S, Any -> Cmp-E, Invalid -> Cmp. With MetaField No-Op (or a
#: reserved MetaField) MetaValue is reserved and ignored (CXL 1.1 Table 23, CXL 3.1
#: Table 3-36): Cmp. The reserved MetaValue 01 is taken as Invalid.
GRANT = {MetaValue.Shared.value: NDROpcode.CmpS.value, MetaValue.Any.value: NDROpcode.CmpE.value}

#: Placeholder opcode of a :class:`Msg`: the NDR that :data:`GRANT` gives the request.
_GRANTED = -1
_PULLS = frozenset(op.value for op in (H2DRspOpcode.WritePull, H2DRspOpcode.GO_WritePull,
                                       H2DRspOpcode.GO_ERR_WritePull))


class ProtocolError(AssertionError):
    """A message or request outside the table, or a transaction left incomplete."""


@dataclass(frozen=True)
class Msg:
    """One message of a flow.

    ``opcodes`` the allowed opcodes (None: a data channel without one); ``fields`` fixed
    values (one allowed value per field); ``after`` the indices, in the flow, of the
    messages that must come first; ``name`` for messages.
    """

    channel: str
    opcodes: frozenset[int] | None
    name: str
    fields: Mapping[str, int] = field(default_factory=dict)
    after: tuple[int, ...] = ()

    @property
    def pull(self) -> bool:
        """An H2D Rsp that pulls the device's data (its RspData is a UQID)."""
        return self.channel == "h2d_rsp" and bool(self.opcodes) and self.opcodes <= _PULLS

    @property
    def host(self) -> bool:
        return self.channel in HOST_CHANNELS

    def opcodes_for(self, values: Mapping[str, int]) -> frozenset[int] | None:
        if self.opcodes is not None and _GRANTED in self.opcodes:
            return frozenset({values["grant"]})
        return self.opcodes

    def build(self, values: Mapping[str, int], **extra: int) -> dict:
        """The fields this message must have for a request with ``values`` (its
        :attr:`Transaction.values`): opcode (the first allowed), fixed fields, echoed
        identifiers; ``extra`` adds or overrides fields (data, UQIDs, ...)."""
        f: dict = {}
        ops = self.opcodes_for(values)
        if ops is not None:
            f["opcode"] = min(ops)
        f.update(self.fields)
        for name, key in ECHO.get(self.channel, ()):
            if key in values:
                f[name] = values[key]
        f.update(extra)
        return f

    def mismatch(self, f: Mapping[str, int], values: Mapping[str, int]) -> str | None:
        """Why message fields ``f`` are not this message (None if they are)."""
        ops = self.opcodes_for(values)
        if ops is not None and f.get("opcode") not in ops:
            return f"opcode {f.get('opcode')} not in {sorted(ops)}"
        for name, want in self.fields.items():
            if f.get(name, 0) != want:
                return f"{name}={f.get(name, 0):#x}, {self.name} has {want:#x}"
        for name, key in ECHO.get(self.channel, ()):
            if key in values and f.get(name) != values[key]:
                return f"{name}={f.get(name)} does not echo the request's {key} {values[key]}"
        return None


@dataclass(frozen=True)
class Flow:
    """One allowed answer to a request: messages in a partial order (:class:`Msg`);
    ``error`` the request completes with an error."""

    name: str
    msgs: tuple[Msg, ...]
    error: bool = False

    def host_msgs(self) -> list[Msg]:
        return [m for m in self.msgs if m.host]


@dataclass(frozen=True)
class Row:
    """A request kind and its allowed flows; ``cite`` the specification's source."""

    channel: str
    opcode: int
    target: str
    name: str
    flows: tuple[Flow, ...]
    cite: str

    def flow(self, name: str) -> Flow:
        for f in self.flows:
            if f.name == name:
                return f
        raise KeyError(f"{self.name} has no flow {name!r}: {[f.name for f in self.flows]}")


# --- message shorthands ---------------------------------------------------------------------

def _ndr(*ops: NDROpcode | int, name: str, after: tuple[int, ...] = ()) -> Msg:
    return Msg("s2m_ndr", frozenset(int(getattr(o, "value", o)) for o in ops), name,
               after=after)


def _drs(op: DRSOpcode, name: str, **fields: int) -> Msg:
    return Msg("s2m_drs", frozenset({op.value}), name, fields)


def _fwd(op: M2SReqOpcode) -> Msg:
    return Msg("m2s_req", frozenset({op.value}), op.name)


def _go(state: GoState, after: tuple[int, ...] = ()) -> Msg:
    return Msg("h2d_rsp", frozenset({H2DRspOpcode.GO.value}), f"GO-{state.name}",
               {"rsp_data": state.value}, after)


def _rsp(op: H2DRspOpcode, after: tuple[int, ...] = ()) -> Msg:
    return Msg("h2d_rsp", frozenset({op.value}), op.name, after=after)


def _h2d_data(name: str, **fields: int) -> Msg:
    return Msg("h2d_data", None, name, fields)


def _d2h_data(after: tuple[int, ...]) -> Msg:
    return Msg("d2h_data", None, "D2H Data", after=after)


_GRANT_NDR = _ndr(_GRANTED, name="NDR granting the MetaValue's state")
_CMP = _ndr(NDROpcode.Cmp, name="NDR Cmp")
_GO_ERR = Flow("go_err", (_go(GoState.Error),), error=True)
_DATA_GO_ERR = Flow("data_go_err", (_h2d_data("H2D Data with GO-Err", go_err=1,
                                              data=ALL_ONES),), error=True)
_MEM_RD_FWD = Flow("mem_rd_fwd", (_fwd(M2SReqOpcode.MemRdFwd),))


def _rows() -> list[Row]:
    rows: list[Row] = []
    rq, rwd, d2h = "m2s_req", "m2s_rwd", "d2h_req"
    read_hdm = ("CXL 1.1 §3.4.1.2 (Figures 26 to 33), CXL 3.1 §3.5.2.2: HDM-D reads get data "
                "and a state grant")
    nxm = ("CXL 3.1 Table 3-53 (MemData-NXM: the single response for a read of no existing "
           "memory, in place of DRS + NDR; all-ones data)")
    for target in ("hdm", "nxm"):
        for op, grant in ((M2SReqOpcode.MemRd, _GRANT_NDR),
                          (M2SReqOpcode.MemRdData, _ndr(NDROpcode.CmpE, name="NDR Cmp-E"))):
            if target == "hdm":
                flow = Flow("data_and_grant", (_drs(DRSOpcode.MemData, "DRS MemData"), grant))
                cite = (f"{read_hdm}; grant: CXL 1.1 Table 24, CXL 3.1 Table 3-37" if op is
                        M2SReqOpcode.MemRd else "CXL 2.0 §3.3, CXL 3.1 §3.3.5 (MemRdData: "
                        "data and Cmp-E, MetaField / MetaValue ignored)")
            else:
                flow = Flow("nxm", (_drs(DRSOpcode.MemDataNXM, "DRS MemData-NXM",
                                         data=ALL_ONES),), error=True)
                cite = nxm
            rows.append(Row(rq, op.value, target, op.name, (flow,), cite))
        for op in (M2SReqOpcode.MemInv, M2SReqOpcode.MemInvNT):
            rows.append(Row(rq, op.value, target, op.name, (Flow("grant", (_GRANT_NDR,)),),
                            "CXL 2.0 §3.3 (MemInv / MemInvNT: NDR, no data); grant: CXL 1.1 "
                            "Table 24, CXL 3.1 Table 3-37"))
        rows.append(Row(rq, M2SReqOpcode.MemSpecRd.value, target, "MemSpecRd",
                        (Flow("none", ()),),
                        "CXL 2.0 §3.3 (MemSpecRd: no completion, may be dropped)"))
        rows.append(Row(rq, M2SReqOpcode.MemClnEvct.value, target, "MemClnEvct",
                        (Flow("cmp", (_CMP,)),),
                        "CXL 3.1 Table 3-35 (MemClnEvct, HDM-DB; completed by Cmp)"))
        for op in (M2SRwDOpcode.MemWr, M2SRwDOpcode.MemWrPtl):
            rows.append(Row(rwd, op.value, target, op.name, (Flow("cmp", (_CMP,)),),
                            "CXL 2.0 §3.3, CXL 1.1 Table 28 / Table 31, CXL 3.1 Table 3-41 / "
                            "Table 3-50 (writes complete with NDR Cmp)"))
        rows.append(Row(rwd, M2SRwDOpcode.BIConflict.value, target, "BIConflict",
                        (Flow("ack", (_ndr(NDROpcode.BIConflictAck, name="BI-ConflictAck"),)),),
                        "CXL 3.1 Table 3-41 / Table 3-50 (BIConflict -> BI-ConflictAck)"))

    # Device-attached memory in host bias (the DCOH). Every read and ownership request
    # is answered by MemRdFwd on CXL.mem; an error comes back on CXL.cache.
    dev = ("CXL 1.1 Table 17, CXL 3.1 Table 3-24 (D2H Request targeting device-attached "
           "memory: MemRdFwd); errors: GO with state Error (CXL 1.1 Table 13, CXL 3.1 Table "
           "3-20)")
    for op in (D2HReqOpcode.RdCurr, D2HReqOpcode.RdShared, D2HReqOpcode.RdAny):
        rows.append(Row(d2h, op.value, "device", op.name, (_MEM_RD_FWD, _GO_ERR, _DATA_GO_ERR),
                        f"{dev}, or H2D Data with GO-Err and all-ones data (CXL 1.1 Table 14, "
                        f"CXL 3.1 Table 3-21; CXL 3.x §3.2.4.2.6)"))
    rows.append(Row(d2h, D2HReqOpcode.RdOwn.value, "device", "RdOwn", (_MEM_RD_FWD, _GO_ERR),
                    dev))
    rows.append(Row(d2h, D2HReqOpcode.RdOwnNoData.value, "device", "RdOwnNoData",
                    (_MEM_RD_FWD, Flow("go_e", (_go(GoState.E),)), _GO_ERR),
                    f"{dev}; GO-E: CXL 3.x §3.2.4.2.13; flip: CXL 1.1 §3.4.1.3 Figure 37"))

    # Host memory (the CXL.cache agent).
    host = ("CXL 1.1 Table 16, CXL 3.1 Table 3-23 (D2H Request targeting non device-attached "
            "memory: supported H2D responses)")
    rows.append(Row(d2h, D2HReqOpcode.RdCurr.value, "host", "RdCurr", (
        Flow("data", (_h2d_data("H2D Data", go_err=0, poison=0),)),
        Flow("data_poison", (_h2d_data("H2D Data with Poison", go_err=0, poison=1),),
             error=True),
        _DATA_GO_ERR),
        f"{host}; no GO: CXL 1.1 §3.2.4.1.6, CXL 3.x §3.2.4.2.6; GO-Err / Poison: CXL 1.1 "
        f"Table 14, CXL 3.1 Table 3-21"))
    rows.append(Row(d2h, D2HReqOpcode.ItoMWr.value, "host", "ItoMWr", (
        Flow("go_writepull", (_rsp(H2DRspOpcode.GO_WritePull), _d2h_data((0,)))),
        Flow("writepull_go", (_rsp(H2DRspOpcode.WritePull), _go(GoState.I),
                              _d2h_data((0,)))),
        Flow("go_err_writepull", (_rsp(H2DRspOpcode.GO_ERR_WritePull), _d2h_data((0,))),
             error=True),
        Flow("writepull_go_err", (_rsp(H2DRspOpcode.WritePull), _go(GoState.Error),
                                  _d2h_data((0,))), error=True),
        Flow("drop", (_rsp(H2DRspOpcode.GO_WritePull_Drop),), error=True)),
        f"{host}; H2D Rsp opcodes: CXL 1.1 Table 20, CXL 3.1 Table 3-27; the pull's RspData "
        f"is the UQID of D2H Data (CXL 2.0 §3.2.3.3, §3.2.3.5)"))

    # Snoops: the D2H Rsp each H2D Req allows; the Fwd answers carry the line on D2H Data.
    rsp = D2HRspOpcode
    snoop_rsps = {H2DReqOpcode.SnpData: (rsp.RspIHitI, rsp.RspIHitSE, rsp.RspSHitSE,
                                         rsp.RspSFwdM, rsp.RspIFwdM),
                  H2DReqOpcode.SnpInv: (rsp.RspIHitI, rsp.RspIHitSE, rsp.RspIFwdM),
                  H2DReqOpcode.SnpCur: (rsp.RspIHitI, rsp.RspVHitV, rsp.RspIHitSE,
                                        rsp.RspSHitSE, rsp.RspIFwdM, rsp.RspVFwdV)}
    fwds = {rsp.RspSFwdM, rsp.RspIFwdM, rsp.RspVFwdV}
    for snp, answers in snoop_rsps.items():
        flows = []
        for a in answers:
            m = Msg("d2h_rsp", frozenset({a.value}), a.name)
            flows.append(Flow(a.name, (m, Msg("d2h_data", None, "D2H Data of the snoop"))
                              if a in fwds else (m,)))
        rows.append(Row("h2d_req", snp.value, "host", snp.name, tuple(flows),
                        "CXL 1.1 Table 18 / Table 19, CXL 3.1 Table 3-25 / Table 3-26 "
                        "(mapping of H2D requests to D2H responses)"))
    return rows


def _validate(rows: Iterable[Row]) -> dict[tuple[str, int, str], Row]:
    table = {}
    for r in rows:
        key = (r.channel, r.opcode, r.target)
        assert key not in table, f"two rows for {key}"
        for f in r.flows:
            for i, m in enumerate(f.msgs):
                assert all(a < i for a in m.after), f"{r.name}/{f.name}: 'after' not earlier"
        names = [f.name for f in r.flows]
        assert len(set(names)) == len(names), f"{r.name}: flow names repeat"
        table[key] = r
    return table


#: ``(channel, opcode, target)`` -> :class:`Row`.
TABLE: dict[tuple[str, int, str], Row] = _validate(_rows())


def row(channel: str, opcode: int, target: str) -> Row | None:
    """The row of a request, or None when the table has none (a request outside it)."""
    return TABLE.get((channel, int(opcode), target))


def pick(rng: random.Random, r: Row, *, error: bool = False,
         channels: Iterable[str] | None = None,
         weights: Mapping[str, float] | None = None) -> Flow:
    """A random flow of ``r`` with ``error`` as given whose host messages use only
    ``channels`` (default any); ``weights`` by flow name (default 1 each)."""
    allowed = set(channels) if channels is not None else None
    flows = [f for f in r.flows if f.error == error
             and (allowed is None or all(m.channel in allowed for m in f.host_msgs()))]
    if not flows:
        raise ValueError(f"{r.name}: no {'error' if error else 'good'} flow on "
                         f"{sorted(allowed or ())}")
    w = [(weights or {}).get(f.name, 1.0) for f in flows]
    return rng.choices(flows, weights=w)[0]


# --- checker ----------------------------------------------------------------------------------

@dataclass
class _State:
    flow: Flow
    seen: frozenset[int] = frozenset()
    pull_uqid: int | None = None

    @property
    def complete(self) -> bool:
        return len(self.seen) == len(self.flow.msgs)


class Transaction:
    """One request followed through its flows (:class:`ProtocolChecker` makes them).

    Members
    -------
    row, key, t_req, values:
        The request's row, its identifier, cycle, and the values its responses echo.
    done, flow:
        Completed, and by which flow (None while open).
    log:
        ``(cycle, channel, fields)`` of every message seen.
    """

    def __init__(self, r: Row, key: tuple, values: dict, t: int):
        self.row, self.key, self.values, self.t_req = r, key, values, t
        self.states = [_State(f) for f in r.flows]
        self.done = False
        self.flow: Flow | None = None
        self.log: list[tuple[int, str, dict]] = []
        if any(s.complete for s in self.states):        # a request that gets nothing
            self._complete(next(s for s in self.states if s.complete))

    def describe(self) -> str:
        return (f"{self.row.name} ({self.row.target}, {self.key[0]} {self.key[1]:#x}, "
                f"cycle {self.t_req})")

    def _complete(self, s: _State) -> None:
        self.done, self.flow = True, s.flow

    def see(self, channel: str, f: Mapping[str, int], t: int) -> None:
        """Message ``f`` on ``channel`` in cycle ``t`` belongs to this transaction."""
        where = f"cycle {t}: {channel} {_short(f)} for {self.describe()}"
        if self.done:
            raise ProtocolError(f"{where}: the transaction completed by {self.flow.name} "
                                f"(duplicate completion or extra message)")
        self.log.append((t, channel, dict(f)))
        nxt, why = [], []
        for s in self.states:
            values = dict(self.values, pull_uqid=s.pull_uqid) if s.pull_uqid is not None \
                else self.values
            for i, m in enumerate(s.flow.msgs):
                if m.channel != channel:
                    continue
                bad = m.mismatch(f, values)
                if bad is not None:
                    why.append(f"{s.flow.name}/{m.name}: {bad}")
                elif i in s.seen:
                    why.append(f"{s.flow.name}/{m.name}: already seen (duplicate)")
                elif not set(m.after) <= s.seen:
                    why.append(f"{s.flow.name}/{m.name}: wrong order, comes after "
                               f"{[s.flow.msgs[a].name for a in m.after]}")
                else:
                    uqid = f.get("rsp_data") if m.pull else s.pull_uqid
                    nxt.append(_State(s.flow, s.seen | {i}, uqid))
                    break
        if not nxt:
            raise ProtocolError(f"{where}: outside the table ({self.row.cite}): "
                                + ("; ".join(why) or "no flow has a message on this channel"))
        self.states = nxt
        for s in nxt:
            if s.complete:
                self._complete(s)
                return

    def missing(self) -> str:
        """What each remaining flow still waits for."""
        return "; ".join(f"{s.flow.name}: " + ", ".join(
            m.name for i, m in enumerate(s.flow.msgs) if i not in s.seen) for s in self.states)


def _short(f: Mapping[str, int]) -> dict:
    return {k: (f"{v:#x}" if isinstance(v, int) and v > 0xFFFF else v) for k, v in f.items()
            if k not in ("data", "byte_enable")}


#: M2S Req opcodes that answer a D2H request (routed by Tag = CQID).
_FWD_OPS = frozenset({M2SReqOpcode.MemRdFwd.value, M2SReqOpcode.MemWrFwd.value})


class ProtocolChecker:
    """Follows every request of one link through :data:`TABLE` (module docstring).

    Requests open transactions: M2S Req / RwD keyed by Tag, D2H Req by CQID, H2D Req
    (snoops) by UQID. :meth:`see` routes a response by its identifier: NDR / DRS by Tag,
    an M2S forward by Tag (= CQID), H2D Rsp / Data by CQID, D2H Data by the UQID of the
    pull it answers (or of a snoop), D2H Rsp by the snoop's UQID. A transaction that
    completes is closed at once; its identifier may then be reused.

    Members
    -------
    open:
        Key -> open :class:`Transaction`.
    closed:
        Key -> the last completed transaction of that key (for messages).
    completed:
        Flow name -> count of completed transactions.
    """

    def __init__(self, table: Mapping[tuple[str, int, str], Row] | None = None):
        self.table = TABLE if table is None else table
        self.completed: dict[str, int] = {}
        self.reset()

    def reset(self, kinds: Iterable[str] | None = None) -> None:
        """Forget every open transaction (the device was reset), or only those keyed by
        ``kinds`` (``"tag"`` CXL.mem, ``"cqid"`` / ``"uqid"`` CXL.cache)."""
        if kinds is None:
            self.open: dict[tuple, Transaction] = {}
            self.closed: dict[tuple, Transaction] = {}
            self._uqids: dict[int, tuple] = {}
            return
        for key in [k for k in self.open if k[0] in set(kinds)]:
            self.forget(key)

    def request(self, channel: str, f: Mapping[str, int], t: int, *, target: str) -> Transaction:
        """A request on ``channel`` (``m2s_req``, ``m2s_rwd``, ``d2h_req``, ``h2d_req``)
        for ``target``; raises :class:`ProtocolError` when the table has no row for it
        or its identifier is still open."""
        r = self.table.get((channel, f["opcode"], target))
        if r is None:
            raise ProtocolError(f"cycle {t}: {channel} opcode {f['opcode']:#x} for {target} "
                                f"memory is not a request of the table: {_short(f)}")
        if channel in ("m2s_req", "m2s_rwd"):
            key = ("tag", f["tag"])
            values = {"tag": f["tag"], "ld_id": f.get("ld_id", 0)}
            if channel == "m2s_req":
                values["grant"] = (GRANT.get(f.get("meta_value", 0), NDROpcode.Cmp.value)
                                   if f.get("meta_field", 0) == MetaField.Meta0State.value
                                   else NDROpcode.Cmp.value)
        elif channel == "d2h_req":
            key = ("cqid", f["cqid"])
            values = {"cqid": f["cqid"], "fwd_address": f["address"] << 1}
        else:
            key = ("uqid", f["uqid"])
            values = {"uqid": f["uqid"]}
        if key in self.open:
            raise ProtocolError(f"cycle {t}: {r.name} reuses {key[0]} {key[1]:#x} while "
                                f"{self.open[key].describe()} is open")
        txn = Transaction(r, key, values, t)
        if channel == "h2d_req":
            self._uqids[f["uqid"]] = key
        if txn.done:
            self._close(txn)
        else:
            self.open[key] = txn
        return txn

    def _key(self, channel: str, f: Mapping[str, int]) -> tuple:
        if channel in ("s2m_ndr", "s2m_drs"):
            return ("tag", f["tag"])
        if channel == "m2s_req":
            return ("cqid", f["tag"])
        if channel in ("h2d_rsp", "h2d_data"):
            return ("cqid", f["cqid"])
        if channel in ("d2h_data", "d2h_rsp"):
            return self._uqids.get(f["uqid"], ("uqid", f["uqid"]))
        raise ValueError(f"{channel} carries no response")

    def see(self, channel: str, f: Mapping[str, int], t: int) -> Transaction:
        """A response on ``channel`` in cycle ``t``; raises :class:`ProtocolError` when no
        open transaction takes it."""
        key = self._key(channel, f)
        txn = self.open.get(key)
        if txn is None:
            last = self.closed.get(key)
            after = (f", after {last.describe()} completed by {last.flow.name}"
                     if last is not None else "")
            raise ProtocolError(f"cycle {t}: {channel} {_short(f)}: no open request has "
                                f"{key[0]} {key[1]:#x}{after}")
        before = {s.pull_uqid for s in txn.states}
        txn.see(channel, f, t)
        if channel == "h2d_rsp":
            for s in txn.states:
                if s.pull_uqid is not None and s.pull_uqid not in before:
                    self._uqids[s.pull_uqid] = key
        if txn.done:
            self._close(txn)
        return txn

    def _close(self, txn: Transaction) -> None:
        self.open.pop(txn.key, None)
        self.closed[txn.key] = txn
        for uqid in [u for u, k in self._uqids.items() if k == txn.key]:
            del self._uqids[uqid]
        self.completed[txn.flow.name] = self.completed.get(txn.flow.name, 0) + 1

    def forget(self, key: tuple) -> None:
        """Drop an open transaction whose request a reset lost."""
        txn = self.open.pop(key, None)
        if txn is not None:
            for uqid in [u for u, k in self._uqids.items() if k == key]:
                del self._uqids[uqid]

    def finish(self) -> None:
        """Raise if a transaction still waits for a response."""
        if self.open:
            lines = [f"{t.describe()} waits for {t.missing()}" for t in
                     list(self.open.values())[:8]]
            raise ProtocolError(f"{len(self.open)} transactions incomplete at the end:\n"
                                + "\n".join(lines))
