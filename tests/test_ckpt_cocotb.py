"""Slow tier: the checkpoint logger and recovery in the whole device
(``tb/test_ckpt.py``): the crash campaign on Verilator and Icarus.

Each campaign group runs ``N_POINTS[sim]`` power failures at random cycles (plus the
uncrashed measuring run), in the campaign and in the power-failure-during-recovery
variant: 100 per CI run on Verilator (50 + 50 on ``small``) and 100 on Icarus (25 + 25
on each of ``small`` and ``odd``). Points chain (each trains on from the state the
previous recovery left), which keeps an Icarus point at about 2.5 to 3.5 s;
``SEED=<n>`` replays a run.
"""

from __future__ import annotations

import pytest

from .conftest import run_cocotb_group, sim_configs

#: Presets per simulator: the default device (the largest build) on Verilator only;
#: ``CONFIG=<preset or .toml>`` runs one config on every simulator.
CASES = sim_configs({"verilator": ("small",), "icarus": ("small", "odd")})

#: Crash points per campaign test and simulator.
N_POINTS = {"verilator": 50, "icarus": 25}

GROUPS: dict[str, list[str]] = {
    "campaign": ["test_crash_campaign"],
    "recovery": ["test_crash_during_recovery", "test_commit_just_before_crash"],
    "bad_input": ["test_bad_batches_and_busy_recovery", "test_log_overflow",
                  "test_mlp_checkpoint"],
}


@pytest.mark.slow
@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("sim, config", CASES)
def test_ckpt(sim: str, config: str, group: str) -> None:
    run_cocotb_group("tb.test_ckpt", config, sim, group, GROUPS[group],
                     {"n_points": N_POINTS[sim]})
