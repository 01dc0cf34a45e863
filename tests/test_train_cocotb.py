"""Slow tier: DLRM training through the whole device (``tb/train_dlrm.py``).

The ``tiny`` preset (6 batches) end to end on config ``small``, on Verilator and Icarus, with random
idle cycles, backpressure and PMEM timing on every channel, and the ``paper-like``
platform's CXL link between the GPU and the device (``tb/link.py``: every CXL.mem
message and CSR access pays its flight time):

* TrainingCXL: a power failure at a cycle drawn from the seed, recovery, MLP reload,
  resume; tables bit for bit and losses equal to the reference run from the recovered
  state;
* baseline (Verilator): software pooling, updates and checkpointing over CXL.mem;
  tables bit for bit and losses equal to the reference run;
* the sw-ckpt ablation (Verilator): the engines' LOOKUP and UPDATE with the baseline's
  software checkpoint; the same checks.

``SEED=<n>`` replays a run (it seeds both the cocotb bench and the data).
"""

from __future__ import annotations

import pytest

from .conftest import run_cocotb_group, sim_configs

CASES = sim_configs({"verilator": ("small",), "icarus": ("small",)})
#: TrainingCXL (the crash and resume) on both simulators (about a minute on Icarus);
#: the baseline, whose RTL path is the CXL.mem endpoint the device tests cover on both,
#: on Verilator only (the CI budget).
MODES = {"verilator": ("trainingcxl", "baseline", "trainingcxl-sw-ckpt"),
         "icarus": ("trainingcxl",)}


@pytest.mark.slow
@pytest.mark.parametrize("sim, config, mode",
                         [(s, c, m) for s, c in CASES for m in MODES[s]])
def test_train(sim: str, config: str, mode: str) -> None:
    run_cocotb_group("tb.train_dlrm", config, sim, f"train-{mode}", ["train_dlrm"],
                     {"preset": "tiny", "mode": mode, "platform": "paper-like",
                      "crash_at": "auto", "noise": True})
