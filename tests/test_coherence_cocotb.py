"""Slow tier: coherence in the whole device (``tb/test_coherence.py``): the GPU's cache of
device lines against the DCOH, GPU memory through the CXL.cache agent, bias flips, bad
coherence input; on Verilator (every group) and Icarus (the groups of
:data:`ICARUS_SAMPLE` when both simulators run, every group with ``SIM=icarus``), both
with ``small`` (``CONFIG=default`` for the default device, see
``tests/test_device_cocotb.py``), and the CXL.cache fuzzer (group ``fuzz``: 6,000 fuzzed
H2D messages on Verilator, 400 on Icarus with ``SIM=icarus``).

Each group is one simulator run. Icarus (with fewer descriptors, GPU operations and
fuzzed messages) and the ``default`` device run the noisy variant of each data-moving
test only, to stay inside the CI budget.
``SEED=<n>`` replays a run.
"""

from __future__ import annotations

import pytest

from tb.groups import groups, noisiest

from .conftest import cocotb_items, run_cocotb_group, sim_configs

#: ``CONFIG=<preset or .toml>`` runs one config on every simulator.
CASES = sim_configs({"verilator": ("small",), "icarus": ("small",)})

#: LOOKUP doorbells and background GPU cache operations per test, and the fuzzed H2D
#: messages of the CXL.cache fuzzer (``test_cxl_cache_fuzz``; ``make fuzz`` runs more).
PARAMS = {"verilator": {"n_desc": 3, "n_gpu": 150, "n_msgs": 6000},
          "icarus": {"n_desc": 2, "n_gpu": 60, "n_msgs": 400}}


#: ``{group: [cocotb test names]}``, from the ``@group`` tags in ``tb/test_coherence.py``.
GROUPS = groups("tb.test_coherence")
#: The groups Icarus runs when both simulators do: bias flips and the CXL.cache protocol
#: (the training run on Icarus keeps its scratch buffers in GPU memory, so every LOOKUP
#: and UPDATE there goes through the CXL.cache agent).
ICARUS_SAMPLE = ("flips", "protocol")


def variants(sim: str, config: str) -> dict[str, list[str]]:
    """The variants each group runs on ``sim`` and ``config``: all of them on Verilator
    ``small``; the noisy ones only on Icarus and on the default device (a 16 K-cycle
    bias-table sweep per test)."""
    noisy_only = sim == "icarus" or config == "default"
    return {g: noisiest(names) if noisy_only else names for g, names in GROUPS.items()}


@pytest.mark.slow
@pytest.mark.parametrize("sim, config, group", cocotb_items(CASES, GROUPS, ICARUS_SAMPLE))
def test_coherence(sim: str, config: str, group: str) -> None:
    run_cocotb_group("tb.test_coherence", config, sim, group, variants(sim, config)[group],
                     PARAMS[sim])
