"""Mutations: a block with one of its lines dropped, to show that a proof can fail.

:class:`DropAssignments` removes every assignment to one named signal from a block's
elaborated design (its ``m.d.sync += s.eq(...)`` or ``m.d.comb += s.eq(...)`` lines,
inside ``If`` / ``Switch`` too): a register keeps its initial value, a combinational
signal its ``init``. It edits Amaranth's fragment tree, so it relies on the statement
classes of Amaranth 0.5 (``amaranth.hdl._ast``).
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Fragment
from amaranth.hdl._ast import Assign, Switch, _StatementList

__all__ = ["DropAssignments"]


class DropAssignments(Elaboratable):
    """``dut`` with every assignment to its one signal named ``signal`` removed.

    Raises :class:`ValueError` at elaboration unless exactly one signal of that name is
    assigned in ``dut`` (a renamed signal must not turn the mutation into a no-op)."""

    def __init__(self, dut, signal: str):
        self._dut = dut
        self._signal = signal

    def elaborate(self, platform):
        fragment = Fragment.get(self._dut, platform)
        hits = {}
        _drop_in_fragment(fragment, self._signal, hits)
        if len(hits) != 1:
            raise ValueError(f"mutation: {len(hits)} signals named {self._signal!r} are "
                             f"assigned in {self._dut!r}, not exactly one")
        return fragment


def _drop_in_fragment(fragment: Fragment, name: str, hits: dict) -> None:
    for domain, statements in fragment.statements.items():
        fragment.statements[domain] = _StatementList(_drop(statements, name, hits))
    for sub, _name, _src_loc in fragment.subfragments:
        _drop_in_fragment(sub, name, hits)


def _drop(statements, name: str, hits: dict) -> list:
    kept = []
    for stmt in statements:
        if isinstance(stmt, Assign):
            targets = [s for s in stmt._lhs_signals() if s.name == name]
            if targets:
                hits.update((id(s), s) for s in targets)
                continue
        elif isinstance(stmt, Switch):
            stmt = Switch(stmt.test, [(patterns, _drop(body, name, hits), src_loc)
                                      for patterns, body, src_loc in stmt.cases],
                          src_loc=stmt.src_loc)
        kept.append(stmt)
    return kept
