"""Slow tier: the whole device (``tb/test_device.py``) on Verilator and Icarus.

Parametrized over (simulator, config, group) items (:func:`tests.conftest.cocotb_items`):
every group on Verilator with ``small`` (every idle/backpressure variant), and the
groups of :data:`ICARUS_SAMPLE` on Icarus with ``odd`` (each test's variant with idle
cycles and backpressure both on, ``tb.groups.noisiest``; ``SIM=icarus`` runs every
group there). ``SIM`` / ``CONFIG`` restrict; ``CONFIG=default`` runs the default
device, whose build alone takes about ten minutes of the 30-minute CI budget since the
DCOH and the CXL.cache agent joined it (``make sim`` and ``make bench`` run it). Each
group is one simulator run in its own test directory (one build per config and
simulator, shared through the runner's lock, and with the engine and checkpoint
tests), so ``pytest -n auto`` spreads the groups over the workers.

The long random-traffic test runs ``N_TXN[sim][config]`` requests in each variant,
plus the random traffic inside the directed tests. ``SEED=<n>`` replays a run;
otherwise a fresh seed is drawn and printed.
"""

from __future__ import annotations

import pytest

from tb.groups import groups, noisiest

from .conftest import cocotb_items, every_variant, run_cocotb_group, sim_configs

#: Presets per simulator (the default device with ``CONFIG=default``, see above);
#: ``CONFIG=<preset or .toml>`` runs one config on every simulator.
CASES = sim_configs({"verilator": ("small",), "icarus": ("odd",)})

#: Random requests per idle/backpressure variant of test_random_traffic (Icarus runs
#: several times slower per cycle).
N_TXN = {
    "verilator": {"default": 5000, "small": 2500, "odd": 2500},
    "icarus": {"default": 2500, "small": 2000, "odd": 2000},
}
#: ``n_txn`` of the other groups (reset and power-failure tests run a fraction of it).
N_DIRECTED = {"verilator": 2000, "icarus": 1000}
#: Messages of the CXL.mem fuzzer (``test_cxl_mem_fuzz``; ``make fuzz`` runs 100,000).
N_FUZZ = {"verilator": 1500, "icarus": 300}


#: ``{group: [cocotb test names]}``, from the ``@group`` tags in ``tb/test_device.py``.
GROUPS = groups("tb.test_device")
#: The groups Icarus runs when both simulators do: random traffic with its hazards
#: (reset and power failure run on Icarus in the training run,
#: ``tests/test_train_cocotb.py``).
ICARUS_SAMPLE = ("random",)


@pytest.mark.slow
@pytest.mark.parametrize("sim, config, group", cocotb_items(CASES, GROUPS, ICARUS_SAMPLE))
def test_device(sim: str, config: str, group: str) -> None:
    n_txn = N_TXN[sim].get(config, N_TXN[sim]["small"]) if group == "random" else N_DIRECTED[sim]
    names = GROUPS[group] if every_variant(sim, config, CASES) else noisiest(GROUPS[group])
    run_cocotb_group("tb.test_device", config, sim, group, names,
                     {"n_txn": n_txn, "n_msgs": N_FUZZ[sim]})
