"""``make coverage`` (``sim/coverage.py``): the parser and merge of Verilator's
``coverage.dat`` on records in its format, the per-block tally, and the map from every
Verilog module of the ``small`` device to the block under ``hw/`` that owns it."""

from __future__ import annotations

import re

from hw.config import load_config
from sim import coverage as cov
from sim.runner import emit_shared


def _record(page: str, line: int, comment: str, count: int, lines: str = "") -> str:
    kind = page.partition("/")[0].removeprefix("v_")
    fields = [("f", "d.v"), ("l", str(line)), ("n", "3"), ("t", kind), ("page", page),
              ("o", comment), *([("S", lines)] if lines else []), ("h", "top")]
    return "C '" + "".join(f"\x01{k}\x02{v}" for k, v in fields) + f"' {count}\n"


def _dat(tmp_path, name: str, records: list[str]):
    path = tmp_path / name
    path.write_text("# SystemC::Coverage-3\n" + "".join(records))
    return path


def test_parse_keeps_line_and_toggle_points_only(tmp_path):
    path = _dat(tmp_path, "a.dat", [
        _record("v_line/top.a", 10, "if", 3, "10-11"),
        _record("v_toggle/top.a", 12, "x:0->1", 0),
        _record("v_toggle/top.a", 13, "__024auto__024verilog_backend__02ecc:0->1", 0),
        _record("v_branch/top.a", 14, "else", 1),
    ])
    points = cov.parse(path)
    assert sorted((p.kind, p.module, p.line, p.comment, p.lines, n) for p, n in points.items()) == [
        ("line", "top.a", 10, "if", "10-11", 3), ("toggle", "top.a", 12, "x:0->1", "", 0)]


def test_merge_sums_the_counts_of_a_point_over_runs(tmp_path):
    a = _dat(tmp_path, "a.dat", [_record("v_line/top.a", 10, "if", 0),
                                 _record("v_line/top.a", 20, "else", 2)])
    b = _dat(tmp_path, "b.dat", [_record("v_line/top.a", 10, "if", 5),
                                 _record("v_line/top.b", 30, "case", 0)])
    merged = {(p.module, p.line): n for p, n in cov.merge([a, b]).items()}
    assert merged == {("top.a", 10): 5, ("top.a", 20): 2, ("top.b", 30): 0}


def test_summarise_tallies_per_block_and_lists_the_unhit_lines(tmp_path):
    a = _dat(tmp_path, "a.dat", [
        _record("v_line/top.a", 1, "if", 1), _record("v_line/top.a", 2, "else", 0),
        _record("v_line/top.a.fifo", 3, "block", 4),
        _record("v_line/top.b$7", 4, "case", 0),
        _record("v_toggle/top.b$7", 4, "y:1->0", 9)])
    owners = {"top.a": "hw.x.A", "top.a.fifo": "hw.x.A", "top.b": "hw.y.B"}
    verilog = ["if (go)", "  else", "  x <= 1;", "  4'h3:"]
    blocks = cov.summarise(cov.merge([a]), owners, verilog)
    assert sorted(blocks) == ["hw.x.A", "hw.y.B"]
    a_line = blocks["hw.x.A"]["line"]
    assert (a_line.points, a_line.hit, a_line.fraction) == (3, 2, 2 / 3)
    assert [(u["line"], u["verilog"]) for u in a_line.unhit] == [(2, "else")]
    b = blocks["hw.y.B"]
    assert (b["line"].hit, b["line"].points, b["toggle"].hit, b["toggle"].points) == (0, 1, 1, 1)
    assert blocks["hw.x.A"]["toggle"].fraction is None     # no toggle point: no figure


def test_every_module_of_the_small_device_belongs_to_a_block_in_hw():
    path, _ = emit_shared("device", load_config("small"))
    modules = re.findall(r"^module \\?([^\s(]+)", path.read_text(), re.MULTILINE)
    owners = cov.block_of_modules("small")
    unowned = [m for m in modules
               if not (cov.owner(owners, m) or "").startswith("hw.")]
    assert len(modules) > 100 and unowned == []
