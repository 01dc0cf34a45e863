"""Fast tests of the energy model (sim/energy.py) and its documentation (docs/energy.md)."""

from __future__ import annotations

import math
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from sim import energy
from sim.energy import (
    DEFAULT,
    SOURCES,
    EnergyConstants,
    EnergyEvents,
    EnergyReport,
    estimate,
    saving,
)
from sim.workloads import DEVICE_CLOCK_HZ, GPU_FLOPS

DOC = Path(__file__).resolve().parents[1] / "docs" / "energy.md"
PJ = 1e-12
STATIC = ("pmem_static_j", "gpu_static_j", "device_static_j")
DYNAMIC = ("pmem_dynamic_j", "link_j", "gpu_dynamic_j", "hbm_j", "device_dynamic_j")

#: Every event at a distinct count (gpu_busy_cycles <= cycles).
SAMPLE = EnergyEvents(
    cycles=10_000, pmem_read_lines=700, pmem_write_lines=300, pmem_media_reads=400,
    pmem_media_writes=90, link_bytes=51_200, gpu_flops=2_000_000, gpu_busy_cycles=600,
    hbm_bytes=4_096, device_fp_adds=5_000, device_fp_muls=1_000, device_sram_lines=800)


def scaled(events: EnergyEvents, k: int, *, cycles: int | None = None) -> EnergyEvents:
    d = {name: v * k for name, v in events.as_dict().items()}
    if cycles is not None:
        d["cycles"] = cycles
        d["gpu_busy_cycles"] = min(d["gpu_busy_cycles"], cycles)
    return EnergyEvents.from_dict(d)


# Constants -------------------------------------------------------------------------------

@pytest.mark.parametrize("f", fields(EnergyConstants), ids=lambda f: f.name)
def test_constant_positive_and_cited(f):
    value = getattr(DEFAULT, f.name)
    assert value > 0 and math.isfinite(value)
    sources = f.metadata["sources"]
    assert sources, f"{f.name} names no source"
    for key in sources:
        assert key in SOURCES, f"{f.name} cites unknown source {key!r}"
    assert f.metadata["unit"]


def test_every_source_is_used_and_nonempty():
    used = {key for f in fields(EnergyConstants) for key in f.metadata["sources"]}
    assert used == set(SOURCES)
    assert all(len(text) > 40 for text in SOURCES.values())


def test_derived_constants_follow_their_inputs():
    """The rounded literals match the arithmetic shown in docs/energy.md."""
    read_bw, write_bw, media_b = 39.4e9 / 6, 13.9e9 / 6, 256   # per module of six
    dyn_w = 15.0 - DEFAULT.pmem_static_w_per_module
    assert DEFAULT.pmem_read_pj_per_access == pytest.approx(
        dyn_w / (read_bw / media_b) / PJ, rel=1e-3)
    assert DEFAULT.pmem_write_pj_per_access == pytest.approx(
        dyn_w / (write_bw / media_b) / PJ, rel=1e-3)
    assert DEFAULT.pmem_read_pj_per_line == DEFAULT.pmem_read_pj_per_access / 4
    assert DEFAULT.pmem_write_pj_per_line == DEFAULT.pmem_write_pj_per_access / 4
    assert DEFAULT.pmem_modules == math.ceil(64 * DEVICE_CLOCK_HZ / read_bw)
    assert DEFAULT.gpu_pj_per_flop == pytest.approx(
        (400.0 - DEFAULT.gpu_static_w) / GPU_FLOPS / PJ)
    assert DEFAULT.device_sram_pj_per_line == 64 // 8 * 10.0


@pytest.mark.parametrize("name, bad", [
    ("link_pj_per_byte", 0.0), ("gpu_static_w", -1.0), ("hbm_pj_per_byte", math.inf),
    ("device_fp_add_pj", math.nan), ("device_static_w", "5"), ("gpu_pj_per_flop", True),
])
def test_constants_reject_bad_values(name, bad):
    with pytest.raises(ValueError, match=rf"^{name} must be finite and positive, not "):
        replace(DEFAULT, **{name: bad})


@pytest.mark.parametrize("bad", [0, 2.0, True])
def test_constants_reject_bad_module_count(bad):
    with pytest.raises(ValueError, match=r"^pmem_modules must be an integer >= 1, not "):
        replace(DEFAULT, pmem_modules=bad)


# Events ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [f.name for f in fields(EnergyEvents)])
def test_negative_count_rejected(name):
    with pytest.raises(ValueError, match=rf"^{name} must be non-negative, not -1$"):
        EnergyEvents(**{name: -1})


def test_non_integer_count_rejected():
    with pytest.raises(ValueError, match=r"^link_bytes must be an integer count, not 1.5$"):
        EnergyEvents(link_bytes=1.5)
    with pytest.raises(ValueError, match=r"^cycles must be an integer count, not True$"):
        EnergyEvents(cycles=True)


def test_busy_cycles_bounded_by_cycles():
    with pytest.raises(ValueError, match=r"^gpu_busy_cycles \(11\) must not exceed cycles "
                                         r"\(10\)$"):
        EnergyEvents(cycles=10, gpu_busy_cycles=11)


def test_estimate_revalidates_mutated_events():
    e = EnergyEvents(cycles=10)
    e.link_bytes = -5
    with pytest.raises(ValueError, match=r"^link_bytes must be non-negative, not -5$"):
        estimate(e)


def test_events_add_and_dict_round_trip():
    total = SAMPLE + SAMPLE
    assert total == scaled(SAMPLE, 2)
    assert EnergyEvents.from_dict(SAMPLE.as_dict()) == SAMPLE
    assert EnergyEvents.from_dict({"cycles": 3}) == EnergyEvents(cycles=3)
    assert list(SAMPLE.as_dict()) == [f.name for f in fields(EnergyEvents)]
    with pytest.raises(ValueError, match=r"^unknown event names \['device_fp_ops'\]$"):
        EnergyEvents.from_dict({"device_fp_ops": 1})


# Estimate --------------------------------------------------------------------------------

def test_zero_events_zero_energy():
    report = estimate(EnergyEvents())
    assert report.total_j == 0.0
    assert all(v == 0.0 for v in report.as_dict().values())


@pytest.mark.parametrize("basis", energy.PMEM_BASES)
def test_linear_in_counts(basis):
    one = estimate(SAMPLE, pmem_basis=basis)
    two = estimate(scaled(SAMPLE, 2), pmem_basis=basis)
    for name, v in one.as_dict().items():
        assert two.as_dict()[name] == pytest.approx(2 * v)
    # Dynamic counts doubled, cycles fixed: only dynamic terms double.
    dyn = estimate(scaled(SAMPLE, 2, cycles=SAMPLE.cycles), pmem_basis=basis)
    for name in DYNAMIC:
        assert getattr(dyn, name) == pytest.approx(2 * getattr(one, name))
    for name in STATIC:
        assert getattr(dyn, name) == pytest.approx(getattr(one, name))
    # Cycles alone: static terms scale with them, dynamic terms do not move.
    longer = estimate(replace(SAMPLE, cycles=3 * SAMPLE.cycles), pmem_basis=basis)
    for name in STATIC:
        assert getattr(longer, name) == pytest.approx(3 * getattr(one, name))
    for name in DYNAMIC:
        assert getattr(longer, name) == getattr(one, name)


def test_pmem_basis_selects_the_counts():
    media = estimate(EnergyEvents(pmem_media_reads=1, pmem_read_lines=4))
    line = estimate(EnergyEvents(pmem_media_reads=1, pmem_read_lines=4), pmem_basis="line")
    assert media.pmem_dynamic_j == pytest.approx(DEFAULT.pmem_read_pj_per_access * PJ)
    assert line.pmem_dynamic_j == pytest.approx(4 * DEFAULT.pmem_read_pj_per_line * PJ)
    # A fully used access costs the same either way.
    assert media.pmem_dynamic_j == pytest.approx(line.pmem_dynamic_j)


def test_hand_computed_example():
    """Round constants, small counts: every term worked out by hand, to the picojoule."""
    c = EnergyConstants(
        pmem_read_pj_per_line=25.0, pmem_write_pj_per_line=75.0,
        pmem_read_pj_per_access=100.0, pmem_write_pj_per_access=300.0,
        pmem_static_w_per_module=2.0, pmem_modules=2, link_pj_per_byte=4.0,
        gpu_pj_per_flop=10.0, gpu_static_w=1.0, hbm_pj_per_byte=3.0,
        device_fp_add_pj=0.5, device_fp_mul_pj=2.0, device_sram_pj_per_line=8.0,
        device_static_w=0.25)
    e = EnergyEvents(
        cycles=1_000, pmem_read_lines=40, pmem_write_lines=8, pmem_media_reads=12,
        pmem_media_writes=2, link_bytes=640, gpu_flops=5_000, gpu_busy_cycles=100,
        hbm_bytes=256, device_fp_adds=64, device_fp_muls=16, device_sram_lines=10)
    r = estimate(e, c, clock_hz=100e6)                       # 1,000 cycles = 10 us
    expected_pj = {
        "pmem_dynamic_j": 12 * 100 + 2 * 300,                # 1,800 pJ
        "pmem_static_j": 2 * 2.0 * 10e-6 / PJ,               # 40,000,000 pJ
        "link_j": 640 * 4,                                   # 2,560 pJ
        "gpu_dynamic_j": 5_000 * 10,                         # 50,000 pJ
        "gpu_static_j": 1.0 * 10e-6 / PJ,                    # 10,000,000 pJ
        "hbm_j": 256 * 3,                                    # 768 pJ
        "device_dynamic_j": 64 * 0.5 + 16 * 2 + 10 * 8,      # 144 pJ
        "device_static_j": 0.25 * 10e-6 / PJ,                # 2,500,000 pJ
    }
    for name, pj in expected_pj.items():
        assert abs(getattr(r, name) - pj * PJ) < 1 * PJ, name
    assert abs(r.total_j - 52_555_272 * PJ) < 1 * PJ
    assert r.seconds == pytest.approx(10e-6)
    line = estimate(e, c, clock_hz=100e6, pmem_basis="line")
    assert abs(line.pmem_dynamic_j - (40 * 25 + 8 * 75) * PJ) < 1 * PJ


def test_default_clock_is_the_device_clock():
    e = EnergyEvents(cycles=250)
    assert estimate(e).seconds == 250 / DEVICE_CLOCK_HZ == 1e-6


@pytest.mark.parametrize("clock", [0.0, -1.0, math.inf, math.nan])
def test_bad_clock_rejected(clock):
    with pytest.raises(ValueError, match=r"^clock_hz must be finite and positive, not "):
        estimate(SAMPLE, clock_hz=clock)


def test_bad_pmem_basis_rejected():
    with pytest.raises(ValueError, match=r"^pmem_basis must be one of \('media', 'line'\), "
                                         r"not 'bytes'$"):
        estimate(SAMPLE, pmem_basis="bytes")  # type: ignore[arg-type]


# Saving ----------------------------------------------------------------------------------

def report(**terms: float) -> EnergyReport:
    base = dict.fromkeys(f.name for f in fields(EnergyReport))
    return EnergyReport(**{k: terms.get(k, 0.0) for k in base})


def test_saving_hand_computed():
    baseline = report(pmem_dynamic_j=2.0, gpu_static_j=1.5, link_j=0.5)     # 4.0 J
    tcxl = report(pmem_dynamic_j=0.6, gpu_static_j=0.3, device_dynamic_j=0.06)  # 0.96 J
    assert baseline.total_j == pytest.approx(4.0)
    assert saving(baseline, tcxl) == pytest.approx(1 - 0.96 / 4.0)          # 0.76
    assert saving(baseline, baseline) == 0.0
    assert saving(tcxl, baseline) == pytest.approx(1 - 4.0 / 0.96)         # negative


def test_saving_needs_positive_baseline():
    with pytest.raises(ValueError, match=r"^baseline total energy must be positive, not 0"):
        saving(report(), report(link_j=1.0))


def test_report_as_dict():
    r = estimate(SAMPLE)
    d = r.as_dict()
    assert d["total_j"] == pytest.approx(sum(v for k, v in d.items()
                                             if k not in ("total_j", "seconds")))
    assert set(d) == {f.name for f in fields(EnergyReport)} | {"total_j"}


# Documentation ---------------------------------------------------------------------------

def doc_constants() -> dict[str, float]:
    """Rows of the constants table in docs/energy.md: first cell a `field`, second a
    number (thousands separated by commas)."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and (m := re.fullmatch(r"`(\w+)`", cells[0])):
            rows[m.group(1)] = float(cells[1].replace(",", ""))
    return rows


def test_doc_lists_every_constant_with_its_value():
    rows = doc_constants()
    assert set(rows) == {f.name for f in fields(EnergyConstants)}
    for name, value in rows.items():
        assert value == getattr(DEFAULT, name), name


def test_doc_cites_every_source_key():
    text = DOC.read_text()
    for key in SOURCES:
        assert f"**{key}**" in text, key
