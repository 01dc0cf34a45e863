# amaranth: UnusedElaboratable=no
"""CacheAgent split into components (hw/cxl/cache_agent.py) against the single-block
agent it replaced (tests/_cache_agent_ref.py), cycle by cycle.

Every bench of ``tests/test_cxl_cache_agent.py`` (random traffic smooth and rough, random
faults, fill to full with the sink paused, snoops at full rate, unknown CQIDs, every
directed read and write fault, RdCurr without GO, a GO for a read, duplicate data,
reset in traffic, idle latency, D2H Req fields, RdCurr throughput) runs, with its own
assertions, on a :class:`tests.equivalence.Pair` of the two: the bench drives the
reference's ports, the split agent sees the same inputs, and every output port of the
two must be equal at every clock edge. Each bench runs with ``RUNS`` seeds derived from
the printed ``seed`` (``SEED=<n>`` replays one).
"""

from __future__ import annotations

import pytest

from hw.cxl.cache_agent import CacheAgent
from tb.cache_home import READ_FAULTS, WRITE_FAULTS

from . import test_cxl_cache_agent as block
from ._cache_agent_ref import CacheAgentRef
from .equivalence import Pair

RUNS = 3
CYCLES = {"compared": 0}


@pytest.fixture(autouse=True)
def paired(monkeypatch):
    """Every ``TB`` of the block tests builds a pair instead of the agent alone."""
    def pair(**kwargs):
        return Pair(CacheAgentRef(**kwargs), CacheAgent(**kwargs))
    monkeypatch.setattr(block, "CacheAgent", pair)
    run = block.TB.run

    def counted(self, **kwargs):
        out = run(self, **kwargs)
        CYCLES["compared"] += self.cycles
        return out
    monkeypatch.setattr(block.TB, "run", counted)
    yield
    print(f"cycles compared so far: {CYCLES['compared']}")


def seeds(seed: int) -> list[int]:
    return [(seed + 7919 * i) % (1 << 32) for i in range(RUNS)]


@pytest.mark.parametrize("traffic", ["smooth", "rough"])
@pytest.mark.parametrize("config", list(block.CONFIGS))
def test_random_traffic(config, traffic, seed):
    for s in seeds(seed):
        block.test_random_traffic(config, traffic, s)


@pytest.mark.parametrize("config", list(block.CONFIGS))
def test_random_faults(config, seed):
    for s in seeds(seed):
        block.test_random_faults(config, s)


@pytest.mark.parametrize("kind", ["rd", "wr"])
def test_fill_to_full_with_sink_paused(kind, seed):
    for s in seeds(seed):
        block.test_fill_to_full_with_sink_paused(kind, s)


@pytest.mark.parametrize("fault", list(READ_FAULTS))
def test_read_fault_directed(fault, seed):
    for s in seeds(seed):
        block.test_read_fault_directed(fault, s)


@pytest.mark.parametrize("fault", list(WRITE_FAULTS))
def test_write_fault_directed(fault, seed):
    for s in seeds(seed):
        block.test_write_fault_directed(fault, s)


@pytest.mark.parametrize("name", [
    "test_snoops_full_rate", "test_unknown_cqids_dropped",
    "test_rdcurr_completes_on_data_without_go", "test_go_for_a_read_is_unexpected",
    "test_duplicate_read_data", "test_reset_in_traffic", "test_d2h_req_fields"])
def test_directed(name, seed):
    for s in seeds(seed):
        getattr(block, name)(s)


def test_idle_latency():
    block.test_idle_latency()


@pytest.mark.parametrize("cqids", [64])
def test_rdcurr_throughput(cqids):
    block.test_rdcurr_throughput(cqids)
