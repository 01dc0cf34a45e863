"""AXI4 rules for the proof harnesses: the stream rule on every channel of a port, and
counts of the bursts in flight per ID."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal, Value

from hw.bus.axi import ADDR_FIELDS

from .harness import decode
from .rules import stream_rule, tally

__all__ = ["accepted", "in_flight", "pending", "stream_rules", "written"]

#: Payload members of AR / AW (after the ``ar`` / ``aw`` prefix), W, R and B.
_ADDR_FIELDS = ("id", *ADDR_FIELDS)
_W_FIELDS = ("wdata", "wstrb", "wlast")
_R_FIELDS = ("rid", "rdata", "rresp", "rlast")
_B_FIELDS = ("bid", "bresp")


def _fields(port, names) -> list[Value]:
    return [getattr(port, n) for n in names]


def stream_rules(m: Module, name: str, port, *, requests, responses) -> None:
    """The stream rule (:func:`~sim.formal.rules.stream_rule`) on the five channels of
    the AXI4 ``port``: as ``requests`` (``Assert`` or ``Assume``) on AR, AW and W, as
    ``responses`` on R and B."""
    for ch in ("ar", "aw"):
        stream_rule(m, requests, f"{name}_{ch}", getattr(port, f"{ch}valid"),
                    getattr(port, f"{ch}ready"), _fields(port, [ch + f for f in _ADDR_FIELDS]))
    stream_rule(m, requests, f"{name}_w", port.wvalid, port.wready, _fields(port, _W_FIELDS))
    stream_rule(m, responses, f"{name}_r", port.rvalid, port.rready, _fields(port, _R_FIELDS))
    stream_rule(m, responses, f"{name}_b", port.bvalid, port.bready, _fields(port, _B_FIELDS))


def accepted(port, ch: str) -> Value:
    """The handshake of channel ``ch`` (``"ar"``, ``"aw"``, ``"w"``, ``"r"``, ``"b"``)."""
    return getattr(port, f"{ch}valid") & getattr(port, f"{ch}ready")


def in_flight(m: Module, name: str, port, write: bool, width: int) -> list[Signal]:
    """Per ID value of ``port``: the read bursts accepted on AR and not yet ended by an R
    beat with RLAST (``write`` false), or the write bursts accepted on AW and not yet
    answered on B (``write`` true). Counters of ``width`` bits."""
    req, resp = ("aw", "b") if write else ("ar", "r")
    ends = accepted(port, resp) & (port.rlast if not write else 1)
    rid, qid = getattr(port, f"{req}id"), getattr(port, f"{resp}id")
    return [tally(m, f"{name}_{req}{j}", width, accepted(port, req) & (rid == j),
                  ends & (qid == j))
            for j in range(1 << len(rid))]


def pending(counts: list[Signal], index) -> Value:
    """Whether ``counts[index]`` is above zero (false for an ``index`` out of range)."""
    return (Cat(*[c.any() for c in counts]) & decode(index, len(counts))).any()


def written(m: Module, name: str, port, queue: int, width: int, check) -> list[Signal]:
    """Per ID value of ``port``: the write bursts whose W data has all been taken (W
    beats belong to the AWs in AW order) and that have not been answered on B, the
    ones AXI4 allows a B for. Keeps the IDs of up to ``queue`` AWs still owed their W
    data, and claims with ``check`` (an assertion) that no more are."""
    ids = [Signal(len(port.awid), name=f"{name}_w_order{k}") for k in range(queue)]
    owed = Signal(range(queue + 2), name=f"{name}_w_owed")
    push, pop = accepted(port, "aw"), accepted(port, "w") & port.wlast
    m.d.sync += owed.eq(owed + push - pop)
    for k in range(queue):
        with m.If(push & (owed - pop == k)):
            m.d.sync += ids[k].eq(port.awid)
        if k + 1 < queue:
            with m.Elif(pop):
                m.d.sync += ids[k].eq(ids[k + 1])
    m.d.comb += check(owed <= queue, f"{name}: more than {queue} AWs owed their W data")
    return [tally(m, f"{name}_written{j}", width, pop & (ids[0] == j),
                  accepted(port, "b") & (port.bid == j))
            for j in range(1 << len(port.awid))]
