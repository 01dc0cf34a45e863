"""Slow tier: coherence in the whole device (``tb/test_coherence.py``): the GPU's cache of
device lines against the DCOH, GPU memory through the CXL.cache agent, bias flips, bad
coherence input; on Verilator and Icarus (``small``; ``CONFIG=default`` for the default
device, which CI leaves out for its build time, see ``tests/test_device_cocotb.py``).

Each group is one simulator run. Icarus (with fewer descriptors and GPU operations) and
the ``default`` device run the noisy variant of each data-moving test only, to stay
inside the CI budget (about 120 s per simulator for the whole file on ``small``, with
two groups running at once on two cores).
``SEED=<n>`` replays a run.
"""

from __future__ import annotations

import pytest

from .conftest import run_cocotb_group, sim_configs

#: ``CONFIG=<preset or .toml>`` runs one config on every simulator.
CASES = sim_configs({"verilator": ("small",), "icarus": ("small",)})

#: LOOKUP doorbells and background GPU cache operations per test.
PARAMS = {"verilator": {"n_desc": 3, "n_gpu": 150},
          "icarus": {"n_desc": 2, "n_gpu": 60}}


def _variants(test: str, sim: str, config: str, **extra: list) -> list[str]:
    # Icarus, and the default device (a 16 K-cycle bias-table sweep per test), run the
    # noisy variant only.
    noise = (True,) if sim == "icarus" or config == "default" else (False, True)
    names = [f"{test}/noise={n}" for n in noise]
    for key, values in extra.items():
        names = [f"{name}/{key}={v}" for name in names for v in values]
    return names


def groups(sim: str, config: str) -> dict[str, list[str]]:
    return {
        "lookup": _variants("test_lookup_through_host_cache", sim, config, bias=["host", "device"]),
        "update": _variants("test_update_through_host_cache", sim, config, bias=["host", "device"]),
        "flips": [*_variants("test_flips_under_traffic", sim, config),
                  *_variants("test_host_claim_flips_page_back", sim, config),
                  *_variants("test_reset_in_coherent_traffic", sim, config)],
        "gpu_memory": [*_variants("test_mlp_snapshot_from_gpu", sim, config),
                       *_variants("test_mlp_snapshot_while_gpu_writes", sim, config),
                       *_variants("test_completions_in_gpu_memory", sim, config),
                       "test_bad_coherence_input"],
        "protocol": [*_variants("test_host_bias_writes_mem_rd_fwd", sim, config),
                     *_variants("test_flip_claims_mem_rd_fwd_or_go_e", sim, config),
                     *_variants("test_dcoh_host_errors", sim, config),
                     "test_dcoh_unexpected_h2d"],
    }


@pytest.mark.slow
@pytest.mark.parametrize("group", ["lookup", "update", "flips", "gpu_memory", "protocol"])
@pytest.mark.parametrize("sim, config", CASES)
def test_coherence(sim: str, config: str, group: str) -> None:
    run_cocotb_group("tb.test_coherence", config, sim, group, groups(sim, config)[group],
                     PARAMS[sim])
