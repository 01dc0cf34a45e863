"""Bounded proofs of the bus rules (``make formal``, ``docs/verification.md``, "Bounded
proofs of the bus rules").

Each block is checked by a harness (:mod:`sim.formal.axi_arbiter`,
:mod:`sim.formal.dcoh_gate`, :mod:`sim.formal.tag_table`) that assumes the rules of its
environment on the block's inputs and asserts the rules of its outputs; yosys-smtbmc
then checks every assertion in each of the first ``depth`` cycles from reset
(:mod:`sim.formal.flow`). Each harness's assertions are in groups, each group proved in
a run of its own. A :class:`Mutation` drops one line of the block and must make its
group fail: it shows the proof can fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .axi_arbiter import AxiArbiterProof
from .dcoh_gate import DcohGateProof
from .flow import Outcome, missing_tools, prove
from .harness import Harness
from .tag_table import SlotTrackerProof

__all__ = ["PROOFS", "Mutation", "Proof", "missing_tools", "run_mutation", "run_proof"]


@dataclass(frozen=True)
class Mutation:
    """Every assignment to the block's signal ``signal`` dropped: the assertions of
    ``group`` must then fail (``breaks`` says how)."""

    signal: str
    group: str
    breaks: str


@dataclass(frozen=True)
class Proof:
    """A block's proof: ``harness(depth=, group=, mutation=, **options)`` checked for
    ``depth`` cycles (``why`` that depth)."""

    name: str
    harness: type[Harness]
    depth: int
    why: str
    options: dict = field(default_factory=dict)
    mutations: tuple[Mutation, ...] = ()

    def build(self, *, group: str, mutation: str | None = None) -> Harness:
        return self.harness(depth=self.depth, group=group, mutation=mutation, **self.options)


_ARBITER_DEPTH = ("3 managers x the 3-cycle grant bound (a full round of every "
                  "arbiter: the starvation counter saturates after 2 grants), 2 more to "
                  "fill the W-order FIFO, 5 for the registers and the responses")

PROOFS = (
    Proof("axi_arbiter", AxiArbiterProof, 16, _ARBITER_DEPTH,
          {"register_responses": True},
          (Mutation("ar_rr0", "fairness",
                    "AR round robin of class 0 never advances: m1 starves behind m0"),
           Mutation("r_id", "responses",
                    "the R output register never loads the ID: a manager sees RID 0 "
                    "for its ID-1 read"))),
    Proof("axi_arbiter_unregistered", AxiArbiterProof, 16, _ARBITER_DEPTH,
          {"register_responses": False}),
    Proof("dcoh_gate", DcohGateProof, 12,
          "an entry can go through its whole life (AR, two line requests, grants, issue, "
          "response, dones, free) and be taken again within 8 cycles: 12 cover the reuse "
          "of the ring's entries with margin",
          mutations=(
              Mutation("hold", "stream", "the o_acc arbiter does not hold its choice: the "
                       "payload changes while o_acc waits"),
              Mutation("rd_alloc", "tags", "read entries are never marked taken: an entry "
                       "still waiting for grants is reused and asks for its tags again"),
              Mutation("rd_issued", "bursts", "read entries are never marked issued: an "
                       "entry's burst goes down twice"),
              Mutation("slot", "handles", "the done walker does not step through an "
                       "entry's slots: it returns one handle twice"))),
    Proof("slot_tracker", SlotTrackerProof, 24,
          "3 fresh slots, then every slot round the 3-entry free list more than five "
          "times (a round trip takes 3 cycles at the fastest)",
          mutations=(Mutation("fresh", "slots", "the fresh-slot counter never advances: "
                              "slot 0 is handed out again while in flight"),)),
)


def run_proof(proof: Proof, workdir: Path) -> dict:
    """Prove every group of ``proof``; the block passes if every group does."""
    groups = {g: prove(proof.build(group=g), name=f"{proof.name}.{g}", depth=proof.depth,
                       workdir=workdir)
              for g in proof.harness.GROUPS}
    return {"depth": proof.depth, "depth_covers": proof.why,
            "result": "pass" if all(o.result == "pass" for o in groups.values()) else "fail",
            "seconds": round(sum(o.seconds for o in groups.values()), 1),
            "groups": {g: _report(o) for g, o in groups.items()}}


def run_mutation(proof: Proof, mutation: Mutation, workdir: Path) -> dict:
    """Check ``mutation``'s group on the mutated block: ``result`` is ``"fail"`` (a
    counterexample, as it must be) or ``"pass"``."""
    outcome = prove(proof.build(group=mutation.group, mutation=mutation.signal),
                    name=f"{proof.name}.{mutation.group}.{mutation.signal}",
                    depth=proof.depth, workdir=workdir)
    return {"block": proof.name, "signal": mutation.signal, "group": mutation.group,
            "breaks": mutation.breaks, **_report(outcome)}


def _report(outcome: Outcome) -> dict:
    report = {"result": outcome.result, "seconds": outcome.seconds}
    if outcome.result == "fail":
        report.update(failed_step=outcome.failed_step, failed=list(outcome.failed),
                      trace=str(outcome.trace) if outcome.trace else None)
    return report
