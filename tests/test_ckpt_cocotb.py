"""Slow tier: the checkpoint logger and recovery in the whole device
(``tb/test_ckpt.py``): the crash campaign on Verilator and Icarus.

Items as in ``tests/test_device_cocotb.py`` (:func:`tests.conftest.cocotb_items`):
every group on Verilator with ``small``, the campaign on Icarus with ``odd`` (every
group with ``SIM=icarus``). Each campaign test runs power failures at random cycles,
in the campaign and in the power-failure-during-recovery variant: ``N_POINTS[sim]``
each, 95 + 95 on Verilator and 3 on Icarus (3 + 3 with ``SIM=icarus``), 193 per CI run;
with the 4 of ``tests/test_campaign.py``'s run of ``make campaign``'s driver on a Dask
cluster, CI tries 197. The breadth runs on the faster simulator (a crash point costs
about four times as many CPU seconds on Icarus). Points chain (each trains on from the
state the previous recovery left). The points of each campaign test are spread over
``PARTS[sim]`` pytest items (one simulator run each, which formats the device and measures
the uncrashed window first), so that no single item bounds the wall time of ``pytest
-n auto`` on two cores. In the first campaign item of each simulator one point's tables
are changed behind the device after its recovery, and the item passes only if exactly
that point is counted lost. ``SEED=<n>`` replays an item.
"""

from __future__ import annotations

import pytest

from tb.groups import groups

from .conftest import cocotb_items, run_cocotb_group, sim_configs

#: Presets per simulator (as the device and engine tests); ``CONFIG=<preset or .toml>``
#: runs one config on every simulator.
CASES = sim_configs({"verilator": ("small",), "icarus": ("odd",)})

#: Crash points per campaign test and simulator.
N_POINTS = {"verilator": 95, "icarus": 3}
#: Pytest items each campaign test's points are spread over.
PARTS = {"verilator": 5, "icarus": 1}

#: The crash point of each simulator's first campaign item whose tables the bench changes
#: after recovery: that point must be the one counted lost (the campaign checks that its
#: survival count follows the checks' outcomes).
INJECT_FAULT_AT = 1

#: ``{group: [cocotb test names]}``, from the ``@group`` tags in ``tb/test_ckpt.py``.
GROUPS = groups("tb.test_ckpt")
#: The groups of campaign tests, which take the ``part`` / ``parts`` parameters.
CAMPAIGNS = ("campaign", "recovery")
#: The groups Icarus runs when both simulators do.
ICARUS_SAMPLE = ("campaign",)


ITEMS = [pytest.param(sim, config, group, part,
                      id=f"{sim}-{config}-{group}" + (f"-{part}" if group in CAMPAIGNS else ""))
         for sim, config, group in cocotb_items(CASES, GROUPS, ICARUS_SAMPLE)
         for part in range(PARTS[sim] if group in CAMPAIGNS else 1)]


@pytest.mark.slow
@pytest.mark.parametrize("sim, config, group, part", ITEMS)
def test_ckpt(sim: str, config: str, group: str, part: int) -> None:
    params = {"n_points": N_POINTS[sim]}
    label = group
    if group in CAMPAIGNS:
        params |= {"part": part, "parts": PARTS[sim]}
        label = f"{group}-{part}"
    if group == "campaign" and part == 0:
        params["inject_fault"] = INJECT_FAULT_AT
    run_cocotb_group("tb.test_ckpt", config, sim, label, GROUPS[group], params)
