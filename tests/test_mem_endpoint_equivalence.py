# amaranth: UnusedElaboratable=no
"""MemEndpoint split into components (hw/cxl/mem_endpoint.py) against the single-block
endpoint it replaced (tests/_mem_endpoint_ref.py), cycle by cycle.

Every simulating test of ``tests/test_mem_endpoint.py`` (every parametrization) runs
with its test bench driving :class:`tests.equivalence.Pair` in place of the endpoint:
the two blocks see the same inputs and every output port must be equal at every clock
edge; the test's own checks still apply to the reference. The random-traffic tests run
on three seeds each (from ``SEED`` / the printed seed, and the two after it).
"""

from __future__ import annotations

import inspect

import pytest

from hw.cxl.mem_endpoint import MemEndpoint

from . import test_mem_endpoint as base
from ._mem_endpoint_ref import MemEndpointRef
from .equivalence import Pair


def _cases():
    for name, func in inspect.getmembers(base, inspect.isfunction):
        if not name.startswith("test_") or "TB(" not in inspect.getsource(func):
            continue
        marks = [m for m in getattr(func, "pytestmark", []) if m.name == "parametrize"]
        combos = [{}]
        for mark in marks:
            names = [n.strip() for n in mark.args[0].split(",")]
            rows = [v if len(names) > 1 else (v,) for v in mark.args[1]]
            combos = [{**c, **dict(zip(names, row, strict=True))} for c in combos for row in rows]
        for kwargs in combos:
            label = "-".join(str(getattr(v, "name", v)) for v in kwargs.values())
            yield pytest.param(func, kwargs, id=f"{name}[{label}]" if label else name)


@pytest.fixture
def paired(monkeypatch):
    monkeypatch.setattr(base, "MemEndpoint", lambda *, config: Pair(
        MemEndpointRef(config=config), MemEndpoint(config=config)))


@pytest.mark.parametrize("func, kwargs", list(_cases()))
def test_same_as_reference(func, kwargs, paired, seed, monkeypatch):
    runs = 3 if func is base.test_random_traffic else 1
    for k in range(runs):
        monkeypatch.setattr(base, "_seed", lambda default, s=(seed + k) % (1 << 32): s)
        func(**kwargs)
