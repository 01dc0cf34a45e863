"""``make sim``'s report (``sim/train.py``): the workload it trains learns, and the
helpers of its text and plots."""

from __future__ import annotations

import numpy as np
import pytest

from sim.dlrm import DLRM, evaluate, init_tables
from sim.train import SIM_OVERRIDES, _loss_line, reference_train, smooth
from sim.workloads import SyntheticClicks, get_workload

MAKE_SIM = get_workload("default").with_overrides(**SIM_OVERRIDES["default"])


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_make_sim_workload_learns(seed):
    """The run ``make sim`` simulates (the ``default`` preset with ``SIM_OVERRIDES``)
    lowers the held-out loss by at least 0.1 whatever the seed: the golden run the
    device is checked against bit for bit, measured as the test bench measures it."""
    held = SyntheticClicks(MAKE_SIM, seed).held_out(512)
    before = evaluate(DLRM(MAKE_SIM, seed), init_tables(MAKE_SIM, seed), held)
    run = reference_train(MAKE_SIM, seed, partials=4)
    model = DLRM(MAKE_SIM, seed)
    model.load_params(run.params)
    after = evaluate(model, run.tables, held)
    print(f"seed {seed}: held-out loss {before:.3f} -> {after:.3f}")
    assert after < before - 0.1


def test_smooth_is_a_trailing_mean():
    got = smooth([4.0, 2.0, 6.0, 0.0, 8.0], 2)
    assert np.array_equal(got, [4.0, 3.0, 4.0, 3.0, 4.0])
    assert np.array_equal(smooth([1.0, 3.0], 5), [1.0, 2.0])
    assert np.array_equal(smooth([1.0, 3.0], 1), [1.0, 3.0])


def test_loss_line_elides_the_middle():
    short = {str(b): b / 10 for b in range(1, 4)}
    assert _loss_line(short) == "0.1000 0.2000 0.3000"
    long = {str(b): b / 100 for b in range(1, 31)}
    assert _loss_line(long, most=4) == "0.0100 0.0200 ... 0.2900 0.3000"
