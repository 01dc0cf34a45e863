"""Slow tier: the whole device (``tb/test_device.py``) on Verilator and Icarus.

Parametrized over (simulator, config) pairs (``small`` on Verilator, ``odd`` on Icarus,
so both simulators run every group; ``SIM`` / ``CONFIG`` restrict, and ``CONFIG=default``
runs the default device, whose build alone takes about ten minutes of the 30-minute CI
budget since the DCOH and the CXL.cache agent joined it; ``make sim`` and ``make bench``
run it) x groups of cocotb tests, each group one simulator run in its own
test directory (one build per config and simulator, shared through the runner's lock,
and with the engine and checkpoint tests), so ``pytest -n auto`` spreads the groups over
the workers.

The long random-traffic test runs ``N_TXN[sim][config]`` requests in each of its four
idle/backpressure variants, plus the random traffic inside the directed tests. ``SEED=<n>``
replays a run; otherwise a fresh seed is drawn and printed.
"""

from __future__ import annotations

import itertools

import pytest

from .conftest import run_cocotb_group, sim_configs

#: Presets per simulator (the default device with ``CONFIG=default``, see above);
#: ``CONFIG=<preset or .toml>`` runs one config on every simulator.
CASES = sim_configs({"verilator": ("small",), "icarus": ("odd",)})

#: Random requests per idle/backpressure variant of test_random_traffic (x4 variants).
#: Icarus runs about 5x slower per cycle than Verilator.
N_TXN = {
    "verilator": {"default": 5000, "small": 2500, "odd": 2500},
    "icarus": {"default": 2500, "small": 1000, "odd": 1000},
}
#: ``n_txn`` of the other groups (reset and power-failure tests run a fraction of it).
N_DIRECTED = {"verilator": 2000, "icarus": 1000}


def _variants(test: str, *more: str) -> list[str]:
    """cocotb names of a test parametrized over idle x backpressure (x ``more``:
    further ``"/name=value"`` choices of one more parameter)."""
    return [f"{test}/idle={i}/backpressure={b}{m}"
            for i, b in itertools.product((False, True), repeat=2) for m in (more or [""])]


GROUPS: dict[str, list[str]] = {
    "random": _variants("test_random_traffic"),
    "ordering": [*_variants("test_partial_writes"),
                 *_variants("test_same_line_hazards", "/slow=reads", "/slow=writes"),
                 "test_all_tags_in_flight", "test_opcode_responses",
                 "test_write_forward_progress"],
    "reset": [*_variants("test_reset_mid_traffic"), *_variants("test_power_failure"),
              "test_power_failure_after_device_write"],
    "bad_input": ["test_bad_out_of_range_read", "test_bad_out_of_range_write",
                  "test_bad_reserved_req_opcode", "test_bad_reserved_rwd_opcode",
                  "test_bad_poisoned_write", "test_bad_empty_partial_write",
                  "test_bad_unexpected_fwd", "test_bad_pmem_response"],
    "rate": ["test_endpoint_latency_and_rate"],
    "csr": ["test_csr_identification", "test_hdm_reprogramming", "test_dev_load",
            "test_perf_counters"],
}


@pytest.mark.slow
@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("sim, config", CASES)
def test_device(sim: str, config: str, group: str) -> None:
    n_txn = N_TXN[sim].get(config, N_TXN[sim]["small"]) if group == "random" else N_DIRECTED[sim]
    run_cocotb_group("tb.test_device", config, sim, group, GROUPS[group], {"n_txn": n_txn})
