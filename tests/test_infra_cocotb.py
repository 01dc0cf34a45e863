"""Slow tier: the bench infrastructure (tb/cycle.py, tb/stream.py, tb/pmem.py) on
generated Verilog of the test-only ``AxiLoop`` design, on Verilator and Icarus.

Prints the cocotb seed (replay with ``SEED=<n>``) and the simulation speed of the
random-traffic tests in cycles per second.
"""

from __future__ import annotations

import json
import random

import pytest

from hw.config import load_config
from sim import runner
from tb.designs.axi_loop import AxiLoop

from .conftest import env_seed, require_simulator, simulators

#: Operations per traffic phase; Icarus runs fewer (about 1.5x slower per cycle).
OPS = {"verilator": 1500, "icarus": 600}


@pytest.mark.slow
@pytest.mark.parametrize("sim", simulators())
def test_infra(sim: str) -> None:
    require_simulator(sim)
    seed = env_seed()
    if seed is None:
        seed = random.randrange(1 << 31)
    print(f"{sim}: SEED={seed}")
    result = runner.run("tb.test_infra", "test_axi_loop", load_config("small"), sim,
                        seed=seed, params={"ops": OPS[sim]}, quiet=True,
                        factory=lambda config: AxiLoop(config=config))
    for path in sorted(result.test_dir.glob("speed-*.json")):
        speed = json.loads(path.read_text())
        print(f"{sim} {path.stem}: {speed['cycles']} cycles, "
              f"{speed['cycles'] / speed['seconds']:.0f} cycles/s wall, "
              f"{speed['cycles'] / speed['cpu_seconds']:.0f} per CPU second")
    if not result.ok:
        tail = result.log.read_text().splitlines()[-60:] if result.log.exists() else []
        pytest.fail(f"{result.failed} cocotb test(s) failed on {sim} (SEED={seed}); "
                    f"log {result.log}\n" + "\n".join(tail))
