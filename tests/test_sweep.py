"""``make sweep``'s grid (``sim/sweep.py``): which points run, what each changes, the
media occupancy it reports, and its plots. The RTL runs themselves are ``sim.train``'s
(``tests/test_train_cocotb.py``); here a stand-in measures each point."""

from __future__ import annotations

import math

import pytest

from sim import sweep as sw
from sim.platform import DEFAULT_PLATFORM, get_platform
from sim.workloads import get_workload

REF = get_platform(DEFAULT_PLATFORM)


def fake(p: sw.Point) -> dict:
    """A measurement whose speedups encode the point, so placement can be checked."""
    v = dict(p.values)
    code = float(len(p.values)) + 0.01 * sum(hash(k) % 7 for k in v)
    phases = {"lookup": 1.0, "gpu": 2.0, "update": 3.0, "checkpoint": 4.0}
    return {"point": v, "speedup_vs_gpu_direct": code, "speedup_vs_host_software": -code,
            "phase_cycles_per_iteration": {m: phases for m in ("trainingcxl", "gpu-direct")},
            "busy_cycles_per_iteration": {m: {"link_busy": 1.0, "pmem_media_busy": 2.0}
                                          for m in ("trainingcxl", "gpu-direct")}}


def test_every_axis_holds_its_reference_and_three_values():
    for name, axis in sw.AXES.items():
        assert len(axis.values) == 3 and axis.reference in axis.values, name
    assert all(x in sw.AXES and y in sw.AXES and x != y for x, y in sw.GRIDS)
    assert {a for g in sw.GRIDS for a in g} == set(sw.AXES)


def test_sweep_runs_each_distinct_point_once():
    calls = []
    result = sw.sweep(sw.GRIDS, lambda p: calls.append(p) or fake(p))
    assert len(calls) == len(set(calls)) == result["points_run"]
    # 4 grids of 9 points share the reference point (3 repeats), and the two grids over
    # the pooling factor share its other two values at the reference: 36 - 3 - 2 = 31.
    assert result["points_run"] == 31
    assert calls[0] == sw.point() and result["reference"]["point"] == {}
    for g in result["grids"]:
        assert len(g["points"]) == 9
        for i, vy in enumerate(g["y_values"]):
            for j, vx in enumerate(g["x_values"]):
                got = g["points"][3 * i + j]["point"]
                want = {k: v for k, v in ((g["x"], vx), (g["y"], vy))
                        if v != sw.AXES[k].reference}
                assert got == want


def test_a_point_changes_only_its_axes():
    p = sw.point(link_gbps=16.0, pmem_channels=1, write_ratio=1.0, pooling=24,
                 table_rows=8192, mlp_scale=0.5, mlp_k=1)
    plat = get_platform(p.platform_spec())
    assert plat.link_bytes_per_s == 16e9 and plat.pmem_channels == 1
    assert plat.pmem_write_bytes_per_s == plat.pmem_read_bytes_per_s == REF.pmem_read_bytes_per_s
    assert plat.pmem_read_latency_ns == REF.pmem_read_latency_ns
    w = get_workload(sw.PRESET).with_overrides(**p.overrides())
    base = get_workload(sw.PRESET)
    assert (w.batch, w.batches) == (8, 5)
    assert w.pooling_mean == 24 and w.table_rows == (8192,) * base.num_tables
    assert w.bottom_mlp == (32, 16, 16) and w.top_mlp == (32, 16) and w.mlp_ckpt_every == 1
    assert w.dim == base.dim and w.lr == base.lr
    ref = sw.point(link_gbps=63.0, pooling=8, table_rows=None, mlp_scale=1.0)
    assert ref == sw.point() and ref.platform_spec() == DEFAULT_PLATFORM
    assert get_workload(sw.PRESET).with_overrides(**ref.overrides()) == base.with_overrides(
        batch=8, batches=5)


def test_media_busy_is_channel_occupancy():
    # paper-like: a 256-byte read at 0.6 x 25.6 GB/s per channel is 16.67 ns, 4.17 cycles;
    # a write at 0.1 x is six times as long; spread over 4 channels.
    got = sw.media_busy(REF, 12, 2)
    read = 256 / (0.6 * 25.6e9) * 250e6
    assert math.isclose(got, (12 * read + 2 * 6 * read) / 4)


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    result = sw.sweep(sw.GRIDS[:2], fake)
    files = sw.plot(result, str(tmp_path / "s"))
    assert len(files) == 3
    for f in files:
        with open(f, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
