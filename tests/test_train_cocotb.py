"""Slow tier: DLRM training through the whole device (``tb/train_dlrm.py``).

The ``tiny`` preset (6 batches) end to end on config ``small``, on Verilator and Icarus, with random
idle cycles, backpressure and PMEM timing on every channel, and the ``paper-like``
platform's CXL link between the GPU and the device (``tb/link.py``: every CXL.mem
message and CSR access pays its flight time):

* TrainingCXL: a power failure at a cycle drawn from the seed, recovery, MLP reload,
  resume; tables bit for bit and losses equal to the reference run from the recovered
  state; with the scratch buffers in GPU memory (``COH_CTRL.SCRATCH_HOST``, every
  CXL.cache message across the link), and on Verilator also in device memory;
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
#: TrainingCXL (the crash and resume) on both simulators (about a minute on Icarus),
#: with its scratch buffers in GPU memory, and on Verilator in device memory too; the
#: baseline, whose RTL path is the CXL.mem endpoint the device tests cover on both, on
#: Verilator only (the CI budget). ``(mode, scratch)``.
MODES = {"verilator": (("trainingcxl", "gpu"), ("trainingcxl", "device"), ("baseline", "gpu"),
                       ("trainingcxl-sw-ckpt", "gpu")),
         "icarus": (("trainingcxl", "gpu"),)}


@pytest.mark.slow
@pytest.mark.parametrize("sim, config, mode, scratch",
                         [(s, c, m, p) for s, c in CASES for m, p in MODES[s]])
def test_train(sim: str, config: str, mode: str, scratch: str) -> None:
    run_cocotb_group("tb.train_dlrm", config, sim, f"train-{mode}-{scratch}", ["train_dlrm"],
                     {"preset": "tiny", "mode": mode, "platform": "paper-like",
                      "crash_at": "auto", "noise": True, "scratch": scratch})
