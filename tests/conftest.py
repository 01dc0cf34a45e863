"""pytest set-up shared by every test: simulator environment and the SIM/SEED knobs."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from sim import toolenv

toolenv.setup()


#: Cocotb groups that take longest, run first within their build.
_HEAVY_GROUPS = ("recovery", "campaign", "random", "ordering", "lookup", "reset", "update")


#: The tests that lint generated Verilog with Verilator (marked ``verilog``) say so in
#: their name: ``test_verilog_lints_clean``, ``test_router_lints_clean``, ...
_LINT_NAME = "lints_clean"


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--fast", action="store_true",
        help="the edit-test loop (make test-fast): each Amaranth-simulator test once, with "
             "its first parameter set; no slow, verilog or long test")


def _select_fast(config, items) -> None:
    """``--fast``: keep each test function once (its first parameter set) among the
    tests that are neither ``slow`` nor ``verilog`` nor ``long`` nor ``formal``; deselect
    the rest (``make test`` runs them all)."""
    keep, drop, seen = [], [], set()
    for item in items:
        func = (item.path, getattr(item, "originalname", item.name))
        tiered = any(item.get_closest_marker(m) for m in ("slow", "verilog", "long", "formal"))
        if tiered or func in seen:
            drop.append(item)
        else:
            seen.add(func)
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def pytest_collection_modifyitems(session, config, items) -> None:
    """Mark the Verilator lint tests ``verilog``; with ``--fast`` select the edit-test
    loop (:func:`_select_fast`); then order the slow items so that the two workers of a
    2-core machine stay busy.

    ``make test`` runs xdist's load scheduling with ``--maxschedchunk 1``: each worker
    takes the next item when it is nearly idle, so the items run roughly in this
    order. (Without it, xdist hands each worker a fixed chunk of an eighth of the
    suite first, and one worker can end up with all the cocotb groups.) Each simulator
    build is guarded by a file lock, and an item whose build another worker is still
    compiling waits for it. So the first item of each (simulator, config) build comes
    first (they build in parallel), then the other Icarus items (an Icarus build takes
    seconds, a Verilator build minutes: while one worker compiles Verilator the other
    runs Icarus), then the other Verilator items, the heaviest groups first within a
    build and the builds interleaved; the Amaranth-simulator tests fill the end.
    Long groups are split into several items (``tests/test_ckpt_cocotb.py``), so that
    no single item bounds the wall time.
    """
    for item in items:
        if _LINT_NAME in getattr(item, "originalname", item.name):
            item.add_marker(pytest.mark.verilog)
    if config.getoption("fast"):
        _select_fast(config, items)

    def params(item) -> dict:
        return getattr(getattr(item, "callspec", None), "params", {})

    builds: dict[tuple, list] = {}
    for item in items:
        p = params(item)
        if (item.get_closest_marker("slow") and isinstance(p.get("sim"), str)
                and isinstance(p.get("config"), str)):
            builds.setdefault((p["sim"], p["config"]), []).append(item)

    def weight(item) -> int:
        group = params(item).get("group")
        return _HEAVY_GROUPS.index(group) if group in _HEAVY_GROUPS else len(_HEAVY_GROUPS)

    def interleave(queues: list[list]) -> list:
        out = []
        while any(queues):
            for q in queues:
                if q:
                    out.append(q.pop(0))
        return out

    # Verilator builds first: they take longest.
    queues = {key: sorted(group, key=weight)
              for key, group in sorted(builds.items(), key=lambda kv: kv[0][0] != "verilator")}
    heads = [q.pop(0) for q in queues.values()]
    ordered = heads + interleave([q for (sim, _), q in queues.items() if sim != "verilator"]) \
        + interleave([q for (sim, _), q in queues.items() if sim == "verilator"])
    placed = set(map(id, ordered))
    slow = [i for i in items if id(i) not in placed and i.get_closest_marker("slow")]
    fast = [i for i in items if id(i) not in placed and not i.get_closest_marker("slow")]
    items[:] = ordered + slow + fast


def simulators() -> list[str]:
    """Simulators to run cocotb tests on: ``SIM`` restricts to one, default both."""
    sim = os.environ.get("SIM")
    return [sim] if sim else list(toolenv.SIMULATORS)


def sim_configs(per_sim: dict[str, tuple[str, ...]]) -> list[tuple[str, str]]:
    """(simulator, config) pairs to run: each simulator with its own presets (so CI
    builds the large default device once, on Verilator), restricted by ``SIM`` and
    ``CONFIG`` (a config given by ``CONFIG`` runs on every selected simulator)."""
    config = os.environ.get("CONFIG")
    return [(sim, c) for sim in simulators()
            for c in ([config] if config else per_sim[sim])]


def cocotb_items(cases: list[tuple[str, str]], groups: dict, icarus_sample: tuple[str, ...]
                 ) -> list[tuple[str, str, str]]:
    """(simulator, config, group) items of a cocotb bench module: every group on each
    (simulator, preset) pair of ``cases`` (from :func:`sim_configs`), except that when
    both simulators run (``SIM`` unset, as in CI) Icarus runs only the groups named in
    ``icarus_sample``. ``SIM=icarus`` runs every group on Icarus.

    Icarus is the second simulator: it shows that the Verilog is portable (X handling,
    event order, untriggered processes, ``docs/architecture.md``, "Toolchain") at 5 to 25
    times fewer cycles per second than Verilator on the whole device, so in CI it runs a
    sample of each bench that, with the training run, touches every block of the device
    (``docs/verification.md``, "What CI runs")."""
    both = len({sim for sim, _ in cases}) > 1
    return [(sim, config, g) for sim, config in cases for g in groups
            if sim != "icarus" or not both or g in icarus_sample]


def every_variant(sim: str, config: str, cases: list[tuple[str, str]]) -> bool:
    """Whether (``sim``, ``config``) runs every idle/backpressure variant of a group: only
    Verilator on the first preset of ``cases`` (``small``, or ``CONFIG``'s); the other
    pairs run each test's noisiest variant (``tb.groups.noisiest``)."""
    return sim == "verilator" and (sim, config) == cases[0]


def require_simulator(sim: str) -> None:
    if not toolenv.have_simulator(sim):
        hint = "sudo apt-get install -y iverilog" if sim == "icarus" else "make venv"
        pytest.skip(f"{sim} not installed ({hint})")


def env_seed() -> int | None:
    """The ``SEED`` to replay, if one was given."""
    value = os.environ.get("SEED")
    return int(value) if value else None


def run_cocotb_group(module: str, config: str, sim: str, group: str,
                     testcases: list[str], params: dict) -> None:
    """Run ``testcases`` of cocotb module ``module`` on the device built for ``config``
    in one ``sim`` run; fail with the log's tail and the replay command unless every
    one of them passed. The seed is ``SEED`` or a fresh one, printed."""
    from hw.config import load_config
    from sim import runner

    require_simulator(sim)
    seed = env_seed()
    if seed is None:
        seed = random.randrange(1 << 31)
    short = module.rsplit(".", 1)[-1].removeprefix("test_")
    print(f"{short} {config} on {sim}, group {group}: SEED={seed}")
    result = runner.run(module, "device", load_config(config), sim, testcase=testcases,
                        seed=seed, params=params, name=f"{short}-{group}-{seed}", quiet=True)
    expected = len(testcases)
    if not result.ok or result.passed != expected:
        tail = result.log.read_text().splitlines()[-80:] if result.log.exists() else []
        pytest.fail(f"{result.failed} of {expected} cocotb test(s) failed "
                    f"({result.passed} passed) on {sim}, config {config}; replay with "
                    f"SEED={seed} SIM={sim} CONFIG={config}; log {result.log}\n"
                    + "\n".join(tail))


@pytest.fixture
def seed(request) -> int:
    """A random seed for this test (``SEED`` replays one), printed and recorded."""
    value = env_seed()
    if value is None:
        value = random.randrange(1 << 32)
    print(f"{request.node.name}: SEED={value}")
    request.node.user_properties.append(("seed", value))
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that drew a seed names it in its one-line summary (``-ra``), so a
    CI log that shows only the summary still says how to replay the failure."""
    report = yield
    seeds = [v for k, v in item.user_properties if k == "seed"]
    crash = getattr(report.longrepr, "reprcrash", None)
    if report.failed and seeds and crash is not None:
        crash.message = f"[SEED={seeds[-1]}] {crash.message}"
    return report


@pytest.fixture
def rng(seed: int) -> random.Random:
    return random.Random(seed)


def assert_lints_clean(component, name: str, out_dir: Path) -> None:
    """Elaborate ``component`` to Verilog as module ``name`` and require a Verilator
    ``-Wall`` lint with only the Amaranth waivers (sim/lint.py) to print nothing."""
    from amaranth.back import verilog

    from sim.lint import lint_file

    if not toolenv.have_simulator("verilator"):
        pytest.skip("verilator not installed (make venv)")
    path = out_dir / f"{name}.v"
    path.write_text(verilog.convert(component, name=name, emit_src=False))
    clean, output = lint_file(path, name)
    assert clean, output
