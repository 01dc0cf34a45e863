"""Proof of the AXI4 arbiter (:class:`~hw.bus.axi_arbiter.AxiArbiter`)."""

from __future__ import annotations

from amaranth.hdl import Assume, Module, Signal

from hw.bus.axi_arbiter import AxiArbiter

from . import axi
from .harness import Harness
from .rules import tally, width_for

__all__ = ["AxiArbiterProof"]


class AxiArbiterProof(Harness):
    """Three managers with ``priorities=(0, 0, 1)``, ``starvation_limit=2``, a 2-deep
    W-order FIFO, 1-bit IDs, 8-bit addresses and data.

    Assumes: the managers (AR, AW, W) and the subordinate (R, B) obey the stream rule;
    the subordinate answers only IDs in flight on ``sub`` (an R beat only for an ID
    with a read burst accepted on AR and not yet ended by RLAST, a B only for an ID
    with a write burst accepted on AW and not yet answered).

    Asserts, by group: ``stream``: ``sub``'s AR, AW and W and every manager's R and B
    obey the stream rule. ``responses``: a request a manager hands over is on ``sub``
    from the next cycle until taken, with the manager's index above its ID, and
    ``sub`` carries no other; per manager and ID, the bursts in flight at the manager
    are those inside the arbiter, those in flight on ``sub`` and (with
    ``register_responses``) the one whose last response waits in the output register;
    so a manager sees an R beat / a B only for an ID it has a burst in flight with.
    ``fairness``: the W bursts ended (WLAST taken from a manager) never outnumber the
    AWs granted, and the bursts granted and not yet ended never exceed the W-order
    FIFO; and bounded waiting: a manager holding AR (AW) valid is granted within
    :attr:`BOUND` cycles in which the arbiter may grant, that is, in which ``sub``'s
    AR (AW) register is empty or being emptied (and, for AW, the W-order FIFO is not
    full).
    """

    GROUPS = ("stream", "responses", "fairness")
    PRIORITIES = (0, 0, 1)
    STARVATION_LIMIT = 2
    W_FIFO_DEPTH = 2
    #: Grant within 3 cycles in which the arbiter may grant, for every manager: the
    #: class-1 manager waits for at most ``STARVATION_LIMIT`` = 2 grants to class 0
    #: and is then served; a class-0 manager waits for at most one grant to the other
    #: class-0 manager (round robin) and one to the class-1 manager (starving).
    BOUND = 3

    def __init__(self, *, depth: int, register_responses: bool = True,
                 group: str | None = None, mutation: str | None = None):
        super().__init__(AxiArbiter(addr_width=8, data_width=8, id_width=1,
                                    priorities=self.PRIORITIES,
                                    starvation_limit=self.STARVATION_LIMIT,
                                    w_fifo_depth=self.W_FIFO_DEPTH,
                                    register_responses=register_responses),
                         group=group, mutation=mutation)
        self._width = width_for(depth)

    def check(self, m: Module) -> None:
        arb, sub = self.dut, self.dut.sub
        stream = self.asserts("stream")
        axi.stream_rules(m, "sub", sub, requests=stream, responses=Assume)
        for i, p in enumerate(arb.managers):
            axi.stream_rules(m, f"m{i}", p, requests=Assume, responses=stream)
        for write in (False, True):
            self._responses(m, write, self._forwarding(m, "aw" if write else "ar"))
        w_owed = self._w_order(m)
        self._bounded_wait(m, "ar", ~sub.arvalid | sub.arready)
        self._bounded_wait(m, "aw", (~sub.awvalid | sub.awready) &
                           (w_owed != self.W_FIFO_DEPTH))

    def _forwarding(self, m: Module, ch: str) -> dict:
        """Per manager *i* and ID *j*: the requests handed over and not yet taken from
        ``sub`` are 1 while ``sub`` holds a request with ID *i* * 2**id_width + *j*,
        else 0. Returns those counts."""
        arb, sub, responses = self.dut, self.dut.sub, self.asserts("responses")
        inside = {}
        for i, p in enumerate(arb.managers):
            for j in range(1 << arb.id_width):
                on_sub = getattr(sub, f"{ch}id") == (i << arb.id_width | j)
                inside[i, j] = count = tally(
                    m, f"{ch}_inside_{i}_{j}", self._width,
                    axi.accepted(p, ch) & (getattr(p, f"{ch}id") == j),
                    axi.accepted(sub, ch) & on_sub)
                m.d.comb += responses(count == (getattr(sub, f"{ch}valid") & on_sub),
                                      f"sub_{ch}: not the request m{i} handed over with ID {j}")
        return inside

    def _responses(self, m: Module, write: bool, inside: dict) -> None:
        """Per manager and ID, the bursts in flight at the manager are those ``inside``
        the arbiter, those in flight on ``sub`` and the one whose last response waits
        in the output register; a manager sees a response only for a burst in flight."""
        arb, sub, responses = self.dut, self.dut.sub, self.asserts("responses")
        resp = "b" if write else "r"
        valid = lambda p: getattr(p, f"{resp}valid")
        rid = lambda p: getattr(p, f"{resp}id")
        on_sub = axi.in_flight(m, "sub", sub, write, self._width)
        m.d.comb += Assume(~valid(sub) | axi.pending(on_sub, rid(sub)),
                           f"sub_{resp}: an ID not in flight")
        for i, p in enumerate(arb.managers):
            at_manager = axi.in_flight(m, f"m{i}", p, write, self._width)
            last = valid(p) & (1 if write else p.rlast)
            for j, count in enumerate(at_manager):
                waiting = (last & (rid(p) == j)) if arb.register_responses else 0
                m.d.comb += responses(
                    count == inside[i, j] + on_sub[i << arb.id_width | j] + waiting,
                    f"m{i}_{resp}: bursts in flight with ID {j} not conserved")
            m.d.comb += responses(~valid(p) | axi.pending(at_manager, rid(p)),
                                  f"m{i}_{resp}: a response without a request")

    def _w_order(self, m: Module) -> Signal:
        """The write bursts granted on AW whose W burst has not ended (WLAST taken from
        the manager): the W-order FIFO's occupancy."""
        arb, fairness = self.dut, self.asserts("fairness")
        grants = sum(axi.accepted(p, "aw") for p in arb.managers)
        ends = sum(axi.accepted(p, "w") & p.wlast for p in arb.managers)
        owed = Signal(range(self.W_FIFO_DEPTH + 2), name="w_owed")
        m.d.sync += owed.eq(owed + grants - ends)
        m.d.comb += [
            fairness(ends <= owed + grants, "w: a burst ended before its AW"),
            fairness(owed <= self.W_FIFO_DEPTH, "w: bursts owed beyond the W-order FIFO"),
        ]
        return owed

    def _bounded_wait(self, m: Module, ch: str, may_grant) -> None:
        """Each manager holding ``ch`` valid is refused in fewer than :attr:`BOUND`
        cycles in which the arbiter ``may_grant``."""
        fairness = self.asserts("fairness")
        for i, p in enumerate(self.dut.managers):
            valid, ready = getattr(p, f"{ch}valid"), getattr(p, f"{ch}ready")
            waited = Signal(range(self.BOUND + 1), name=f"{ch}_m{i}_waited")
            with m.If(~valid | ready):
                m.d.sync += waited.eq(0)
            with m.Elif(may_grant & (waited != self.BOUND)):
                m.d.sync += waited.eq(waited + 1)
            m.d.comb += fairness(waited < self.BOUND,
                                 f"{ch}: m{i} refused in {self.BOUND} cycles it could be granted")
