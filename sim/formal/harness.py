"""The common frame of the proof harnesses: a block, optionally mutated, whose ports are
the harness's top-level ports (its inputs free, constrained by the assumptions)."""

from __future__ import annotations

from amaranth.hdl import Assert, Cat, Elaboratable, Module, Signal, Value

from .mutate import DropAssignments

__all__ = ["Harness", "decode"]


def decode(index, n: int) -> Value:
    """``n`` bits with bit ``index`` set (none if ``index >= n``)."""
    return Cat(*[index == i for i in range(n)])


def _left_out(test, message=None) -> list:
    return []


class Harness(Elaboratable):
    """Base of the harnesses: ``check(m)`` adds the assumptions and assertions about
    ``self.dut`` to ``m``.

    A harness sorts its assertions into :attr:`GROUPS`; with ``group`` it keeps only
    that group's (each group is proved in a run of its own, which is faster than one
    run for all: the solver then refutes one kind of failure at a time). The
    assumptions are the same in every run. With ``mutation`` (a signal name), the
    block's assignments to that signal are dropped
    (:class:`~sim.formal.mutate.DropAssignments`).
    """

    #: Names of the groups of assertions.
    GROUPS: tuple[str, ...] = ()

    def __init__(self, dut, *, group: str | None = None, mutation: str | None = None):
        if group is not None and group not in self.GROUPS:
            raise ValueError(f"group must be one of {self.GROUPS}, not {group!r}")
        self.dut = dut
        self.group = group
        self.mutation = mutation
        self._narrowed: list[tuple[Signal, Signal]] = []

    def asserts(self, group: str):
        """``Assert`` for an assertion of ``group`` if that group is checked, else a
        statement-maker that adds nothing."""
        if group not in self.GROUPS:
            raise ValueError(f"group must be one of {self.GROUPS}, not {group!r}")
        return Assert if self.group in (None, group) else _left_out

    def narrow(self, port: Signal, bits: int) -> None:
        """Drive the block's input ``port`` from a free input of ``bits`` bits (the
        rest zero), for data the block only moves: it treats every bit alike, so a
        few stand for all, and the solver does not carry the others."""
        self._narrowed.append((port, Signal(bits, name=f"{port.name}_narrow")))

    def ports(self) -> list[Signal]:
        """The top-level ports of the harness: the block's ports (but constants, such as
        an always-high ``ready``, and narrowed inputs) and the narrowed inputs' free
        bits."""
        values = (Value.cast(v) for _path, _member, v in self.dut.signature.flatten(self.dut))
        narrowed = [id(port) for port, _free in self._narrowed]
        return ([v for v in values if isinstance(v, Signal) and id(v) not in narrowed]
                + [free for _port, free in self._narrowed])

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = (DropAssignments(self.dut, self.mutation) if self.mutation
                            else self.dut)
        m.d.comb += [port.eq(free) for port, free in self._narrowed]
        self.check(m)
        return m

    def check(self, m: Module) -> None:
        raise NotImplementedError
