"""Slow tier: the checkpoint logger and recovery in the whole device
(``tb/test_ckpt.py``): the crash campaign on Verilator and Icarus.

Items as in ``tests/test_device_cocotb.py`` (:func:`tests.conftest.cocotb_items`):
every group on Verilator with ``small``, the campaign on Icarus with ``odd`` (every
group with ``SIM=icarus``). Each campaign test runs power failures at random cycles,
in the campaign and in the power-failure-during-recovery variant: ``N_POINTS`` each on
Verilator (95 + 95), ``SAMPLE_POINTS[sim]`` on Icarus (3), 193 per CI run; with the 4
of ``tests/test_campaign.py``'s run of ``make campaign``'s driver on a Dask cluster, CI
tries 197. The breadth runs on the faster simulator (a crash point costs about four
times as many CPU seconds on Icarus). Points chain (each trains on from the state the
previous recovery left). The points of the Verilator campaign tests are spread over
``PARTS`` pytest items (one simulator run each, which formats the device and measures
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

#: Crash points per campaign test on the first (simulator, preset) pair, and the pytest
#: items they are spread over.
N_POINTS = 95
PARTS = 5
#: Crash points per campaign test on the other (simulator, preset) pairs (one item each).
SAMPLE_POINTS = {"verilator": 10, "icarus": 3}

#: The crash point of each pair's first campaign item whose tables the bench changes
#: after recovery: that point must be the one counted lost (the campaign checks that its
#: survival count follows the checks' outcomes).
INJECT_FAULT_AT = 1

#: ``{group: [cocotb test names]}``, from the ``@group`` tags in ``tb/test_ckpt.py``.
GROUPS = groups("tb.test_ckpt")
#: The groups of campaign tests, which take the ``part`` / ``parts`` parameters.
CAMPAIGNS = ("campaign", "recovery")
#: The groups Icarus runs when both simulators do.
ICARUS_SAMPLE = ("campaign",)


def _parts(sim: str, config: str) -> int:
    return PARTS if (sim, config) == CASES[0] else 1


ITEMS = [pytest.param(sim, config, group, part,
                      id=f"{sim}-{config}-{group}" + (f"-{part}" if group in CAMPAIGNS else ""))
         for sim, config, group in cocotb_items(CASES, GROUPS, ICARUS_SAMPLE)
         for part in range(_parts(sim, config) if group in CAMPAIGNS else 1)]


@pytest.mark.slow
@pytest.mark.parametrize("sim, config, group, part", ITEMS)
def test_ckpt(sim: str, config: str, group: str, part: int) -> None:
    first = (sim, config) == CASES[0]
    params = {"n_points": N_POINTS if first else SAMPLE_POINTS[sim]}
    label = group
    if group in CAMPAIGNS:
        params |= {"part": part, "parts": _parts(sim, config)}
        label = f"{group}-{part}"
    if group == "campaign" and part == 0:
        params["inject_fault"] = INJECT_FAULT_AT
    run_cocotb_group("tb.test_ckpt", config, sim, label, GROUPS[group], params)
