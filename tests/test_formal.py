"""Bounded proofs of the bus rules (``sim/formal``, ``make formal``): every block's proof
passes, and every mutation of a block makes its proof find a counterexample.

Needs the ``formal`` extra (``pip install ".[formal]"``, which ``make formal`` does);
without it the proofs are skipped. The first run compiles Yosys's WebAssembly (about
two minutes, cached afterwards)."""

from __future__ import annotations

import pytest

from sim.formal import PROOFS, missing_tools, run_mutation, run_proof
from sim.formal.axi_arbiter import AxiArbiterProof
from sim.formal.flow import prove
from sim.formal.tag_table import SlotTrackerProof

pytestmark = pytest.mark.formal

needs_tools = pytest.mark.skipif(
    bool(missing_tools()),
    reason=f"formal tools not installed ({', '.join(missing_tools())}): "
           f"pip install '.[formal]' or make formal")


@needs_tools
@pytest.mark.parametrize("proof", PROOFS, ids=lambda p: p.name)
def test_proof_passes(proof, tmp_path):
    result = run_proof(proof, tmp_path)
    failed = {g: r for g, r in result["groups"].items() if r["result"] != "pass"}
    assert not failed, f"{proof.name} fails at depth {proof.depth}: {failed}"


MUTATIONS = [(p, mu) for p in PROOFS for mu in p.mutations]


@needs_tools
@pytest.mark.parametrize("proof, mutation", MUTATIONS,
                         ids=[f"{p.name}-{mu.signal}" for p, mu in MUTATIONS])
def test_mutation_is_caught(proof, mutation, tmp_path):
    result = run_mutation(proof, mutation, tmp_path)
    assert result["result"] == "fail", (
        f"{proof.name} without {mutation.signal!r} ({mutation.breaks}) still passes "
        f"group {mutation.group!r}")


@needs_tools
def test_arbiter_bound_is_tight(tmp_path):
    """With a grant bound one cycle shorter than the one proved, the solver finds the
    class-1 manager refused behind the class-0 grants it must wait for."""
    class Tighter(AxiArbiterProof):
        BOUND = AxiArbiterProof.BOUND - 1

    outcome = prove(Tighter(depth=16, group="fairness"), name="tighter", depth=16,
                    workdir=tmp_path)
    assert outcome.result == "fail"
    assert any("m2 refused" in f for f in outcome.failed), outcome.failed


@needs_tools
def test_depth_bounds_the_check(tmp_path):
    """The mutation that hands out slot 0 twice fails at step 1, so a depth of 1 cannot
    see it: the depth given is the depth checked."""
    mutant = SlotTrackerProof(depth=1, group="slots", mutation="fresh")
    assert prove(mutant, name="shallow", depth=1, workdir=tmp_path).result == "pass"


def test_mutation_names_one_signal(tmp_path):
    """A mutation whose signal the block does not assign is refused, not run as a
    no-op."""
    harness = SlotTrackerProof(depth=4, group="slots", mutation="no_such_signal")
    with pytest.raises(ValueError, match="0 signals named 'no_such_signal'"):
        prove(harness, name="bad", depth=4, workdir=tmp_path)
