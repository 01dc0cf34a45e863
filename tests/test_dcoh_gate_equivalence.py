# amaranth: UnusedElaboratable=no
"""DcohGate split into components (hw/cxl/dcoh_gate.py) against the gate it replaced
(tests/_dcoh_gate_ref.py), cycle by cycle.

Every simulating block test of ``tests/test_dcoh_gate.py`` (pass-through, random bursts
in device, host and mixed bias, smooth and rough, the smallest gate, a flip under
traffic, bursts beyond device memory, denied lines, fill to full, idle latency,
throughput) runs with :class:`tests.equivalence.Pair` in place of the gate: the bench
drives the reference's ports, the split gate sees the same inputs, and every output port
of the two must be equal at every clock edge; the test's own checks still run on the
reference's outputs. Two seeds per test (one for the throughput test); seeds are
printed, ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import pytest

from hw.cxl.dcoh_gate import DcohGate

from . import test_dcoh_gate
from ._dcoh_gate_ref import DcohGateRef
from .equivalence import Pair, cases

TESTS = [
    "test_pass_through", "test_random_traffic", "test_smallest_config",
    "test_flip_to_host_under_traffic", "test_out_of_range", "test_denied_lines",
    "test_fill_to_full_with_responses_held", "test_idle_latency",
    "test_throughput_device_bias",
]


def pair(**kwargs) -> Pair:
    return Pair(DcohGateRef(**kwargs), DcohGate(**kwargs))


@pytest.mark.parametrize("run", range(2))
@pytest.mark.parametrize("name, kwargs", cases(test_dcoh_gate, TESTS))
def test_same_as_reference(name, kwargs, run, seed, monkeypatch):
    if run and name == "test_throughput_device_bias":
        pytest.skip("one seed: the longest test")
    monkeypatch.setattr(test_dcoh_gate, "DcohGate", pair)
    getattr(test_dcoh_gate, name)(**kwargs, seed=seed + run)
