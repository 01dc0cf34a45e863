"""Named platforms (sim/platform.py) and their PMEM timing (fast tier)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from sim.dlrm import GPU_LAUNCH_CYCLES
from sim.platform import DEFAULT_PLATFORM, PLATFORMS, Platform, get_platform
from sim.workloads import DEVICE_CLOCK_HZ, GPU_FLOPS_PER_CYCLE
from tb.bench_mem import BENCH_TIMING
from tb.pmem import PmemTiming


def test_named_platforms():
    assert set(PLATFORMS) == {"ideal-1ch", "paper-like", "optane-6ch"}
    for name, p in PLATFORMS.items():
        assert p.name == name and get_platform(name) is p


def test_unknown_platform_lists_names():
    with pytest.raises(ValueError, match=r"platform 'nope' not found \(platforms: ideal-1ch, "
                                         r"optane-6ch, paper-like\)"):
        get_platform("nope")


def test_ideal_1ch_is_the_old_model():
    """The model the earlier figures were measured on: one channel at one line per cycle
    both ways, 120 / 40 cycles, no link, 250 MHz, 1 TFLOP/s and 2,500 launch cycles."""
    p = get_platform("ideal-1ch")
    assert PmemTiming.from_platform(p) == PmemTiming(
        read_latency=120, write_latency=40, peak_lines_per_cycle=1.0, channels=1,
        media_bytes=256, jitter=0, write_bandwidth_ratio=1.0)
    assert PmemTiming.from_platform(p) == BENCH_TIMING
    assert math.isinf(p.link_lines_per_cycle) and p.link_cycles == 0
    assert DEVICE_CLOCK_HZ == 250e6 and GPU_FLOPS_PER_CYCLE == 4000 and GPU_LAUNCH_CYCLES == 2500


def test_default_platform():
    """The training flow runs on ``paper-like``; every platform has the same device
    clock and GPU, so the modelled GPU time (taken from the default) holds on all."""
    assert DEFAULT_PLATFORM == "paper-like"
    gpu = {(p.device_clock_hz, p.gpu_flops, p.gpu_launch_ns) for p in PLATFORMS.values()}
    assert gpu == {(DEVICE_CLOCK_HZ, GPU_FLOPS_PER_CYCLE * DEVICE_CLOCK_HZ,
                    GPU_LAUNCH_CYCLES * 4.0)}


def test_paper_like_in_cycles():
    """0.6x / 0.1x of a DDR4-3200 channel's bandwidth, 3x / 7x of 80 ns, four channels,
    at 250 MHz (docs/platform.md)."""
    p = get_platform("paper-like")
    t = PmemTiming.from_platform(p)
    assert (t.read_latency, t.write_latency, t.channels, t.media_bytes) == (60, 140, 4, 256)
    assert t.peak_lines_per_cycle == pytest.approx(4 * 0.6 * 25.6e9 / 64 / 250e6)
    assert t.write_bandwidth_ratio == pytest.approx(1 / 6)
    assert p.pmem_write_lines_per_cycle == pytest.approx(0.64)
    assert p.link_lines_per_cycle == pytest.approx(16 * 32e9 / 8 * 128 / 130 / 64 / 250e6)
    assert (p.link_cycles, p.cxl_io_cycles) == (25, 200)


def test_optane_6ch_in_cycles():
    p = get_platform("optane-6ch")
    t = PmemTiming.from_platform(p)
    assert (t.channels, t.read_latency, t.write_latency) == (6, 77, 23)
    assert p.pmem_read_lines_per_cycle * 64 * 250e6 == pytest.approx(39.4e9)
    assert p.pmem_write_lines_per_cycle * 64 * 250e6 == pytest.approx(13.9e9)


def test_cycles_round_up():
    p = get_platform("paper-like")
    assert p.cycles(4.0) == 1 and p.cycles(4.1) == 2 and p.cycles(0) == 0
    assert p.cycles(240.0) == 60        # exact products stay exact


def test_summary_lists_every_constant():
    s = get_platform("optane-6ch").summary()
    assert set(s["constants"]) == {f.name for f in dataclasses.fields(Platform)} - {"name"}
    assert s["cycles"]["pmem_read_latency"] == 77


GOOD = dataclasses.asdict(get_platform("paper-like"))


@pytest.mark.parametrize(("change", "message"), [
    ({"name": ""}, "name must be a non-empty string, not ''"),
    ({"device_clock_hz": 0}, "device_clock_hz must be positive, not 0"),
    ({"device_clock_hz": math.inf}, "device_clock_hz must be finite, not inf"),
    ({"link_one_way_ns": -1.0}, "link_one_way_ns must be non-negative, not -1.0"),
    ({"link_bytes_per_s": "64"}, "link_bytes_per_s must be a number, not '64'"),
    ({"pmem_channels": 2.5}, "pmem_channels must be an integer, not 2.5"),
    ({"pmem_channels": True}, "pmem_channels must be a number, not True"),
    ({"pmem_media_bytes": 100}, "pmem_media_bytes must be a power of two from 64 to 4096, "
                                "not 100"),
    ({"pmem_write_bytes_per_s": 20e9}, r"pmem_write_bytes_per_s \(2e\+10\) above "
                                       r"pmem_read_bytes_per_s \(1.536e\+10\) is not a "
                                       "persistent medium"),
    ({"pmem_read_latency_ns": math.nan}, "pmem_read_latency_ns must be positive, not nan"),
])
def test_validation_names_the_bad_value(change, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        Platform(**{**GOOD, **change})


def test_derived_platform():
    """``<name>:<field>=<value>,...`` changes fields of a named platform, nothing else."""
    base = get_platform("paper-like")
    p = get_platform("paper-like:pmem_channels=2,link_bytes_per_s=16e9")
    assert p.name == "paper-like:pmem_channels=2,link_bytes_per_s=16e9"
    assert p.pmem_channels == 2 and isinstance(p.pmem_channels, int)
    assert p.link_bytes_per_s == 16e9
    assert dataclasses.replace(p, name=base.name, pmem_channels=4,
                               link_bytes_per_s=base.link_bytes_per_s) == base
    for spec, message in (
            ("paper-like:nope=1", "is not <field>=<value>"),
            ("paper-like:name=x", "is not <field>=<value>"),
            ("paper-like:pmem_channels", "is not <field>=<value>"),
            ("paper-like:pmem_channels=two", "pmem_channels must be a number, not 'two'"),
            ("paper-like:pmem_channels=2.5", "pmem_channels must be an integer"),
            ("paper-like:pmem_write_bytes_per_s=1e12", "is not a persistent medium"),
            ("nope:pmem_channels=2", "platform 'nope' not found")):
        with pytest.raises(ValueError, match=message):
            get_platform(spec)
