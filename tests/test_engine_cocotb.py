"""Slow tier: the embedding engine in the whole device (``tb/test_engine.py``) on
Verilator and Icarus.

Parametrized over (simulator, config, group) items as in ``tests/test_device_cocotb.py``
(:func:`tests.conftest.cocotb_items`): every group on Verilator with ``small`` (every
idle/backpressure variant), the groups of :data:`ICARUS_SAMPLE` on Icarus with ``odd``
(the noisiest variant of each test; every group with ``SIM=icarus``);
``CONFIG=default`` for the default device. Each group is one simulator run sharing the
device build of ``tests/test_device_cocotb.py``. ``SEED=<n>`` replays a run; otherwise
a fresh seed is drawn and printed. """

from __future__ import annotations

import pytest

from tb.groups import groups, noisiest

from .conftest import cocotb_items, every_variant, run_cocotb_group, sim_configs

#: Presets per simulator; ``CONFIG=<preset or .toml>`` runs one config on every simulator.
CASES = sim_configs({"verilator": ("small",), "icarus": ("odd",)})

#: Descriptors per idle/backpressure variant of the random tests.
N_DESC = {"verilator": 12, "icarus": 6}
#: Descriptors of the descriptor fuzzer (``test_descriptor_fuzz``; ``make fuzz`` runs
#: 10,000).
N_FUZZ = {"verilator": 300, "icarus": 60}
#: LOOKUPs of ``test_lookup_long_buffers_round_robin``: one per bag sequencer of
#: ``small`` on Verilator, one on Icarus (each takes about 12 s there).
N_ROUND_ROBIN = {"verilator": 2, "icarus": 1}


#: ``{group: [cocotb test names]}``, from the ``@group`` tags in ``tb/test_engine.py``.
GROUPS = groups("tb.test_engine")
#: The groups Icarus runs when both simulators do: the descriptor fuzzer (good and bad
#: descriptors of every kind; the training run covers LOOKUP, UPDATE and COMMIT on
#: Icarus, ``tests/test_train_cocotb.py``).
ICARUS_SAMPLE = ("fuzz",)


@pytest.mark.slow
@pytest.mark.parametrize("sim, config, group", cocotb_items(CASES, GROUPS, ICARUS_SAMPLE))
def test_engine(sim: str, config: str, group: str) -> None:
    names = GROUPS[group] if every_variant(sim, config, CASES) else noisiest(GROUPS[group])
    run_cocotb_group("tb.test_engine", config, sim, group, names,
                     {"n_desc": N_DESC[sim], "n_txn": 600, "n_fuzz": N_FUZZ[sim],
                      "n_round_robin": N_ROUND_ROBIN[sim]})

