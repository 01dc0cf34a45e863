"""Slow tier: the embedding engine in the whole device (``tb/test_engine.py``) on
Verilator and Icarus.

Parametrized over (simulator, config) pairs (``small`` on Verilator, ``odd`` on Icarus;
``CONFIG=default`` for the default device, see ``tests/test_device_cocotb.py``) x groups
of cocotb tests, each group one simulator run sharing the device build of
``tests/test_device_cocotb.py``. Verilator runs every idle/backpressure variant, Icarus
each test's variant with both on (``tb.groups.noisiest``, as in the device tests).
``SEED=<n>`` replays a run; otherwise a fresh seed is drawn and printed. """

from __future__ import annotations

import pytest

from tb.groups import groups, noisiest

from .conftest import run_cocotb_group, sim_configs

#: Presets per simulator; ``CONFIG=<preset or .toml>`` runs one config on every simulator.
CASES = sim_configs({"verilator": ("small",), "icarus": ("odd",)})

#: Descriptors per idle/backpressure variant of the random tests (four variants on
#: Verilator, one on Icarus).
N_DESC = {"verilator": 12, "icarus": 6}
#: Descriptors of the descriptor fuzzer (``test_descriptor_fuzz``; ``make fuzz`` runs
#: 10,000).
N_FUZZ = {"verilator": 300, "icarus": 60}
#: LOOKUPs of ``test_lookup_long_buffers_round_robin``: one per bag sequencer of
#: ``small`` on Verilator, one on Icarus (each takes about 12 s there).
N_ROUND_ROBIN = {"verilator": 2, "icarus": 1}


#: ``{group: [cocotb test names]}``, from the ``@group`` tags in ``tb/test_engine.py``.
GROUPS = groups("tb.test_engine")


@pytest.mark.slow
@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("sim, config", CASES)
def test_engine(sim: str, config: str, group: str) -> None:
    names = GROUPS[group] if sim == "verilator" else noisiest(GROUPS[group])
    run_cocotb_group("tb.test_engine", config, sim, group, names,
                     {"n_desc": N_DESC[sim], "n_txn": 600, "n_fuzz": N_FUZZ[sim],
                      "n_round_robin": N_ROUND_ROBIN[sim]})

