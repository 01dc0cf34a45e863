# amaranth: UnusedElaboratable=no
"""Dcoh split into components (hw/cxl/dcoh.py) against the single-block DCOH it replaced
(tests/_dcoh_ref.py), cycle by cycle.

Every simulating block test of ``tests/test_dcoh.py`` (every configuration it uses:
random traffic smooth and rough for each config, bad forwards, the host's other
answers, flips, checks, dones, reset in traffic, ...) runs on
:class:`tests.equivalence.Pair` instead of a Dcoh: the bench drives the reference's
ports, the split DCOH sees the same inputs, and every output port of the two must be
equal at every clock edge; the test's own checks still run on the reference's outputs.
Three seeds per test; seeds are printed, ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import pytest

from hw.cxl.dcoh import Dcoh

from . import test_dcoh
from ._dcoh_ref import DcohRef
from .equivalence import Pair, cases

TESTS = [
    "test_random_traffic", "test_random_bad_forwards", "test_fill_to_full_with_sink_paused",
    "test_flip_to_device_and_back", "test_flip_commands_rejected", "test_flip_contended",
    "test_host_touch_device_page", "test_host_check_waits_for_host_bias_grants",
    "test_check_drain_vs_done_timing", "test_flip_to_host_waits_behind_a_check",
    "test_bad_forwards_directed", "test_stray_forward_aliasing_a_waiting_entry",
    "test_bad_dones", "test_out_of_range", "test_reset_in_traffic", "test_idle_latency",
    "test_random_answers", "test_go_e_completes_claims",
    "test_go_err_denies_accesses_and_claims", "test_unexpected_h2d_messages",
]


def pair(**kwargs) -> Pair:
    return Pair(DcohRef(**kwargs), Dcoh(**kwargs))


@pytest.mark.parametrize("run", range(3))
@pytest.mark.parametrize("name, kwargs", cases(test_dcoh, TESTS))
def test_same_as_reference(name, kwargs, run, seed, monkeypatch):
    monkeypatch.setattr(test_dcoh, "Dcoh", pair)
    getattr(test_dcoh, name)(**kwargs, seed=seed + run)
