"""Which pytest item runs a cocotb test: a group tag on the test itself.

The slow tier runs the cocotb tests of a bench module in groups, one simulator run per
group (``tests/test_*_cocotb.py``). A test names its group where it is defined::

    @group("random")
    @cocotb.test()
    @cocotb.parametrize(idle=[False, True], backpressure=[False, True])
    async def test_random_traffic(dut, idle, backpressure): ...

and :func:`groups` lists every group of a module with the full cocotb names of its
tests, parametrised variants included (``test_random_traffic/idle=False/...``, the
names the runner's test filter needs). Importing a bench module needs no simulator,
so pytest reads the groups at collection time; a new test needs no edit under
``tests/``.
"""

from __future__ import annotations

import importlib

__all__ = ["GROUP_ATTR", "NOISE_PARAMS", "cocotb_tests", "group", "groups", "noisiest"]

#: The attribute :func:`group` sets on the test's coroutine function.
GROUP_ATTR = "cocotb_group"


def group(name: str):
    """Decorator: the cocotb test (above or below ``@cocotb.test()``) runs in pytest
    group ``name`` of its module."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"group name must be an identifier, not {name!r}")

    def tag(obj):
        func = getattr(obj, "func", obj)            # a cocotb TestGenerator or the coroutine
        old = getattr(func, GROUP_ATTR, None)
        if old is not None and old != name:
            raise ValueError(f"{func.__qualname__} is tagged with groups {old!r} and {name!r}")
        setattr(func, GROUP_ATTR, name)
        return obj

    return tag


def cocotb_tests(module: str) -> dict[str, tuple[str | None, list[str]]]:
    """Every cocotb test of ``module`` (an importable name, ``tb.test_device``) as
    ``{function name: (group or None, [full cocotb names])}``, in definition order."""
    mod = importlib.import_module(module)
    out: dict[str, tuple[str | None, list[str]]] = {}
    for name, obj in vars(mod).items():
        generate = getattr(obj, "generate_tests", None)
        if not callable(generate) or getattr(obj, "module", None) != mod.__name__:
            continue            # not a cocotb test, or one imported from elsewhere
        names = [t.name for t in generate()]
        out[name] = (getattr(obj.func, GROUP_ATTR, None), names)
    return out


def groups(module: str) -> dict[str, list[str]]:
    """``{group: [full cocotb test names]}`` of ``module``, groups in the order their
    first test is defined. A test without a group is left out (the pytest check
    ``tests/test_cocotb_groups.py`` reports it)."""
    out: dict[str, list[str]] = {}
    for tag, names in cocotb_tests(module).values():
        if tag is not None:
            out.setdefault(tag, []).extend(names)
    return out


#: The boolean parameters of the benches' variants that add random idle cycles or
#: backpressure (``tb/test_device.py``, ``tb/test_engine.py``: ``idle`` and
#: ``backpressure``; ``tb/test_coherence.py``: ``noise``).
NOISE_PARAMS = ("idle", "backpressure", "noise")


def noisiest(names: list[str]) -> list[str]:
    """The variants of ``names`` (full cocotb names) with every noise parameter on: a
    test without noise parameters stays, a parametrised one keeps the variants whose
    :data:`NOISE_PARAMS` are all ``True`` (its other parameters, all of their values).
    The second simulator runs these (``tests/test_*_cocotb.py``)."""
    off = tuple(f"/{p}=False" for p in NOISE_PARAMS)
    return [n for n in names if not any(f"{o}/" in f"{n}/" for o in off)]
