"""``make campaign`` (``sim/campaign.py``): chunking, summary, merge, the local process
pool and, in the slow tier, a real campaign on a local Dask cluster in which one point is
made to fail (its tables are changed behind the device after its recovery) and must be
the one point the summary counts lost, with the command that replays it."""

from __future__ import annotations

import importlib.util
from dataclasses import asdict

import pytest

from sim import campaign as cp


def test_chunks_cover_the_points_with_consecutive_seeds():
    work = cp.chunks(7, 3, 40, ["campaign", "recovery"], "small", "verilator")
    assert [c.points for c in work] == [3, 3, 1]
    assert [c.seed for c in work] == [40, 41, 42]
    assert [c.variant for c in work] == ["campaign", "recovery", "campaign"]
    assert "--seed 41" in work[1].replay() and "--variants recovery" in work[1].replay()


@pytest.mark.parametrize("points, chunk, variants", [(0, 3, ["campaign"]),
                                                     (5, 0, ["campaign"]),
                                                     (5, 3, ["crash"])])
def test_chunks_reject_bad_arguments(points, chunk, variants):
    with pytest.raises(ValueError):
        cp.chunks(points, chunk, 1, variants, "small", "verilator")


def _result(c: cp.Chunk, survived: int | None, failures=(), passed=None, tenths=None):
    """A chunk's result as ``run_chunk`` returns it (``survived`` None: no figures)."""
    figures = None if survived is None else {
        "crash_points_tried": c.points, "crash_points_survived": survived,
        "failures": list(failures), "phases": {"idle": c.points},
        "recovery_crashes": tenths}
    if passed is None:
        passed = survived == c.points
    return {"chunk": asdict(c), "passed": passed, "figures": figures, "log": "sim.log",
            "seconds": 1.0}


def test_summary_counts_hangs_corruptions_and_broken_runs():
    a, b, c, d = cp.chunks(12, 3, 5, ["campaign", "recovery"], "small", "verilator")
    tenths = {"per_tenth": [1, 2, 0, 0, 0, 0, 0, 0, 0, 0],
              "busy_per_tenth": [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]}
    fails = [{"point": 1, "at": 9, "seed": 5, "kind": "TimeoutError", "error": "hung"},
             {"point": 2, "at": 4, "seed": 5, "kind": "AssertionError", "error": "table"}]
    s = cp.summarise([_result(a, 1, fails), _result(b, 3, tenths=tenths),
                      _result(c, None), _result(d, 3, passed=False)])
    assert s["crash_points_tried"] == 12
    assert s["crash_points_survived"] == 7
    assert (s["hangs"], s["corruptions"]) == (2, 1)       # the chunk without figures hangs
    assert s["phases"] == {"idle": 9}
    assert s["recovery_crashes"]["per_tenth"][:2] == [1, 2]
    assert [f["point"] for f in s["failures"]] == [1, 2]
    assert all("--seed 5 " in f["replay"] for f in s["failures"])
    assert sorted(r["seed"] for r in s["runs_failed"]) == [7, 8]


def test_merge_adds_disjoint_campaigns_and_rejects_overlap():
    first = cp.chunks(4, 2, 1, ["campaign"], "small", "verilator")
    second = cp.chunks(2, 2, 3, ["campaign"], "small", "verilator")
    s1 = cp.summarise(r := [_result(c, 2) for c in first]) | {"results": r}
    s2 = cp.summarise(r := [_result(c, 1, [{"point": 0, "at": 1, "seed": 3,
                                             "kind": "AssertionError", "error": "x"}])
                            for c in second]) | {"results": r}
    merged = cp.merge([s1, s2])
    assert (merged["crash_points_tried"], merged["crash_points_survived"]) == (6, 5)
    assert len(merged["chunks"]) == 3
    with pytest.raises(ValueError, match="overlap"):
        cp.merge([s1, s1])


def _fake_run(c: cp.Chunk) -> dict:
    """Every point survives, except in the chunk with seed 11 (for the pool test)."""
    return _result(c, c.points - (c.seed == 11))


def test_local_pool_runs_every_chunk():
    work = cp.chunks(9, 2, 10, ["campaign", "recovery"], "small", "verilator")
    s = cp.campaign(work, jobs=2, fn=_fake_run)
    assert [c["seed"] for c in s["chunks"]] == list(range(10, 15))
    assert (s["crash_points_tried"], s["crash_points_survived"]) == (9, 8)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                    reason="Dask distributed not installed (.venv/bin/pip install '.[cluster]')")
def test_campaign_on_a_local_dask_cluster():
    """Two chunks of two crash points each on a two-worker local Dask cluster; in the
    first, point 1's tables are changed behind the device after its recovery: the
    summary must count exactly that point lost, as a corruption, with its replay."""
    a, b = cp.chunks(4, 2, 7, ["campaign", "recovery"], "small", "verilator")
    a = cp.Chunk(**{**asdict(a), "inject_fault": 1})
    s = cp.campaign([a, b], jobs=2, dask="local")
    assert s["crash_points_tried"] == 4
    assert s["crash_points_survived"] == 3, s["failures"]
    assert (s["hangs"], s["corruptions"]) == (0, 1)
    assert [(f["point"], f["seed"]) for f in s["failures"]] == [(1, 7)]
    assert s["runs_failed"] == [], s["runs_failed"]
    assert sum(s["recovery_crashes"]["per_tenth"]) == 2      # the recovery variant's points
    assert sum(s["phases"].values()) == 4
