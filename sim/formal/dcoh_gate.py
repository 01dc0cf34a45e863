"""Proof of the DCOH gate adapter (:class:`~hw.cxl.dcoh_gate.DcohGate`)."""

from __future__ import annotations

from amaranth.asserts import AnyConst
from amaranth.hdl import Assume, Module, Signal

from hw.cxl.dcoh_gate import DcohGate

from . import axi
from .harness import Harness, decode
from .rules import stream_rule, tally, width_for

__all__ = ["DcohGateProof"]


class DcohGateProof(Harness):
    """A gate of ``entries=2`` per direction, bursts of up to ``max_burst_lines=2`` lines,
    2-bit handles, 1-bit IDs and 8-bit addresses.

    Assumes: ``enable`` is high (with it low the gate is wires from ``up`` to ``down``,
    which this proof leaves out); the manager (AR, AW, W on ``up``) and the subordinate
    (R, B on ``down``) obey the stream rule; an AR / AW asks for at most
    ``max_burst_lines`` beats; the subordinate answers only IDs in flight on ``down``,
    and a write only once all its W data is taken (W bursts belong to the AWs in AW
    order); the DCOH grants only a tag the gate asked for on ``o_acc`` in an earlier
    cycle and that has not been granted since, sets ``denied`` only with ``error``,
    and does not hand out a handle that is in use (from its grant without ``error``
    to its done; assumed for the one handle watched, below).

    Asserts, by group: ``stream``: ``down``'s AR, AW and W, ``o_acc``, ``o_done`` and
    ``up``'s R and B obey the stream rule. ``tags``: ``o_acc`` never asks for a tag
    still waiting for its grant (no tag twice in flight). ``handles``: ``o_done``
    returns a handle only while it is in use (so each once, and none not granted);
    proved for one handle the solver chooses (``AnyConst``), so for every handle.
    ``bursts``: per ID, the bursts taken from ``up`` and not yet issued on ``down``
    are at most ``entries`` in all and ``down`` carries only bursts the manager sent;
    the bursts in flight at ``up`` are those inside the gate plus those in flight on
    ``down`` (R and B pass unchanged), so ``up`` sees an R beat / a B only for an ID
    it has a burst in flight with; a W beat goes down only while an AW issued there
    still owes its data, and at most ``entries`` such AWs owe it.

    The gate moves W and R data and W strobes without looking at them: 8 data bits and
    one strobe bit of the manager's W and of the subordinate's R are free inputs, the
    others zero (:meth:`~sim.formal.harness.Harness.narrow`).
    """

    GROUPS = ("stream", "tags", "handles", "bursts")
    ENTRIES = 2
    MAX_BURST_LINES = 2
    HANDLE_BITS = 2

    def __init__(self, *, depth: int, group: str | None = None, mutation: str | None = None):
        super().__init__(DcohGate(addr_width=8, id_width=1, handle_bits=self.HANDLE_BITS,
                                  entries=self.ENTRIES, max_burst_lines=self.MAX_BURST_LINES),
                         group=group, mutation=mutation)
        self._width = width_for(depth)
        for port in (self.dut.up.wdata, self.dut.down.rdata):
            self.narrow(port, 8)
        self.narrow(self.dut.up.wstrb, 1)

    def check(self, m: Module) -> None:
        gate = self.dut
        stream = self.asserts("stream")
        m.d.comb += Assume(gate.enable, "enable: the gate on")
        axi.stream_rules(m, "up", gate.up, requests=Assume, responses=stream)
        axi.stream_rules(m, "down", gate.down, requests=stream, responses=Assume)
        for ch in ("ar", "aw"):
            m.d.comb += Assume(~getattr(gate.up, f"{ch}valid") |
                               (getattr(gate.up, f"{ch}len") < self.MAX_BURST_LINES),
                               f"up_{ch}: a burst longer than max_burst_lines")
        stream_rule(m, stream, "o_acc", gate.o_acc.valid, gate.o_acc.ready, [gate.o_acc.p])
        stream_rule(m, stream, "o_done", gate.o_done.valid, gate.o_done.ready,
                    [gate.o_done.p])
        self._tags(m)
        self._handles(m)
        for write in (False, True):
            self._bursts(m, write)
        self._w_bursts(m)

    def _tags(self, m: Module) -> None:
        """``o_acc`` asks for a tag only while it is not waiting for its grant; the DCOH
        (assumed) grants only tags that are."""
        gate, acc, grant = self.dut, self.dut.o_acc, self.dut.i_grant
        n = max(2, gate.max_burst_lines) * gate.entries * 2    # tags: k, entry, direction
        waiting = Signal(n, name="tags_waiting")
        asked, granted = decode(acc.p.tag, n), decode(grant.p.tag, n)
        m.d.sync += waiting.eq((waiting & ~(granted & grant.valid.replicate(n)))
                               | (asked & (acc.valid & acc.ready).replicate(n)))
        m.d.comb += [
            Assume(~grant.valid | (waiting & granted).any(), "i_grant: a tag not asked for"),
            self.asserts("tags")(~acc.valid | (asked.any() & ~(waiting & asked).any()),
                                 "o_acc: a tag still waiting for its grant"),
        ]

    def _handles(self, m: Module) -> None:
        """``o_done`` returns the watched handle only while it is in use; the DCOH
        (assumed) hands it out only while it is not. Other handles are left free: the
        gate stores and returns handles without comparing them."""
        grant, done = self.dut.i_grant, self.dut.o_done
        watched = AnyConst(self.HANDLE_BITS)
        in_use = Signal(name="watched_in_use")
        given = grant.valid & ~grant.p.error & (grant.p.handle == watched)
        returned = done.valid & (done.p == watched)
        with m.If(given):
            m.d.sync += in_use.eq(1)
        with m.Elif(returned & done.ready):
            m.d.sync += in_use.eq(0)
        m.d.comb += [
            Assume(~(given & in_use), "i_grant: the watched handle while in use"),
            Assume(~grant.p.denied | grant.p.error, "i_grant: denied without error"),
            self.asserts("handles")(~returned | in_use, "o_done: a handle not in use"),
        ]

    def _bursts(self, m: Module, write: bool) -> None:
        """Per ID: the bursts taken from ``up`` and not yet issued on ``down``, those in
        flight on ``down`` (the subordinate answers only those, assumed) and those in
        flight at ``up``, the sum of the two."""
        up, down, bursts = self.dut.up, self.dut.down, self.asserts("bursts")
        req, resp = ("aw", "b") if write else ("ar", "r")
        ids = 1 << self.dut.id_width
        inside = [tally(m, f"{req}_inside{j}", self._width,
                        axi.accepted(up, req) & (getattr(up, f"{req}id") == j),
                        axi.accepted(down, req) & (getattr(down, f"{req}id") == j))
                  for j in range(ids)]
        on_down = axi.in_flight(m, "down", down, write, self._width)
        at_up = axi.in_flight(m, "up", up, write, self._width)
        answerable = (axi.written(m, "down", down, self.ENTRIES, self._width, bursts)
                      if write else on_down)
        valid = lambda p: getattr(p, f"{resp}valid")
        rid = lambda p: getattr(p, f"{resp}id")
        m.d.comb += [
            Assume(~valid(down) | axi.pending(answerable, rid(down)),
                   f"down_{resp}: an ID not in flight"),
            bursts(sum(inside) <= self.ENTRIES, f"{req}: more bursts inside than entries"),
            bursts(~getattr(down, f"{req}valid") |
                   axi.pending(inside, getattr(down, f"{req}id")),
                   f"down_{req}: a burst the manager did not send"),
            *[bursts(at_up[j] == inside[j] + on_down[j],
                     f"up_{resp}: bursts in flight with ID {j} not conserved")
              for j in range(ids)],
            bursts(~valid(up) | axi.pending(at_up, rid(up)),
                   f"up_{resp}: a response without a request"),
        ]

    def _w_bursts(self, m: Module) -> None:
        """A W beat goes down only while an AW issued on ``down`` still owes its data."""
        down = self.dut.down
        owed = tally(m, "w_owed", self._width, axi.accepted(down, "aw"),
                     axi.accepted(down, "w") & down.wlast)
        m.d.comb += self.asserts("bursts")(~down.wvalid | owed.any(),
                                           "down_w: a beat no AW issued owes")
