"""One clock loop for the whole test bench.

Python work per clock cycle dominates simulation time (``docs/architecture.md``,
"Toolchain"), so a bench does not give every bus functional model its own coroutine.
A single :class:`CycleLoop` awaits one ``RisingEdge`` and one ``ReadOnly`` per cycle
and calls plain methods on every registered agent:

* ``drive()`` right after the rising edge: set the inputs the DUT sees this cycle;
* ``sample()`` in the read-only phase: every signal is stable, so a transfer happened
  this cycle iff ``valid & ready`` reads high here.

Coroutines that wait for a number of cycles or for a condition are woken by the loop
itself (one :class:`~cocotb.triggers.Event` per waiter), never by extra per-cycle
coroutines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import Event, NullTrigger, ReadOnly, RisingEdge

__all__ = ["Agent", "CycleLoop", "start_clock_and_reset"]


class Agent(Protocol):
    """What :meth:`CycleLoop.add` accepts. Either method may be missing."""

    def drive(self) -> None: ...
    def sample(self) -> None: ...


_NEVER = float("inf")


class _Waiter:
    __slots__ = ("deadline", "error", "event", "predicate", "start", "what")

    def __init__(self, start: int, deadline: int, predicate: Callable[[], bool] | None,
                 what: str):
        self.start = start
        self.deadline = deadline
        self.predicate = predicate
        self.what = what
        self.event = Event()
        self.error: BaseException | None = None


class CycleLoop:
    """Drives and samples every agent of a bench once per clock cycle.

    Each cycle: ``await RisingEdge(clk)``; ``cycle += 1``; wake the waiters that are
    due (and let them run, so that what they queue is driven in this same cycle);
    call every agent's ``drive()`` in the order they were added; ``await ReadOnly()``;
    call every agent's ``sample()``; evaluate the ``wait_until`` predicates.

    A waiter whose predicate holds in cycle *n*'s read-only phase resumes right after
    the rising edge of cycle *n + 1*, in a phase where it may write signals. A
    predicate that already holds when :meth:`wait_until` is called returns at once.

    Parameters
    ----------
    clk:
        The clock handle.

    Members
    -------
    cycle:
        Clock cycles since :meth:`start` (the first loop iteration is cycle 1).
    in_drive_phase:
        True between a rising edge and the read-only phase, when signals may be written.
    """

    def __init__(self, clk):
        self.clk = clk
        self.cycle = 0
        self.in_drive_phase = False
        self._agents: list[Agent] = []
        self._drives: list[Callable[[], None]] = []
        self._samples: list[Callable[[], None]] = []
        self._timed: list[_Waiter] = []      # wait_cycles and wait_until deadlines
        self._next_due = _NEVER              # earliest deadline in _timed
        self._conds: list[_Waiter] = []      # wait_until predicates
        self._ready: list[_Waiter] = []      # satisfied, woken at the next rising edge
        self._task = None

    # --- agents -------------------------------------------------------------------
    def add(self, agent):
        """Register ``agent`` (drive/sample are called from the next cycle on)."""
        if agent not in self._agents:
            self._agents.append(agent)
            self._rebind()
        return agent

    def remove(self, agent) -> None:
        if agent in self._agents:
            self._agents.remove(agent)
            self._rebind()

    def _rebind(self) -> None:
        # Bound methods resolved once, not per cycle.
        self._drives = [a.drive for a in self._agents if hasattr(a, "drive")]
        self._samples = [a.sample for a in self._agents if hasattr(a, "sample")]

    # --- running ------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the loop (idempotent)."""
        if not self.running:
            self._task = cocotb.start_soon(self._run())

    def stop(self) -> None:
        """Stop the loop; pending waiters raise :class:`RuntimeError`."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        self.in_drive_phase = False
        for w in {id(w): w for w in (*self._timed, *self._conds, *self._ready)}.values():
            if not w.event.is_set():
                w.error = RuntimeError(f"cycle loop stopped while waiting for {w.what}")
                w.event.set()
        self._set_timed([])
        self._conds.clear()
        self._ready.clear()

    async def _run(self) -> None:
        edge = RisingEdge(self.clk)
        read_only = ReadOnly()
        while True:
            await edge
            self.cycle += 1
            self.in_drive_phase = True
            if (self._ready or self._next_due <= self.cycle) and self._wake():
                # Let the woken coroutines run before drive(), so that what they
                # send (or write) takes effect in this cycle.
                await NullTrigger()
            for drive in self._drives:
                drive()
            self.in_drive_phase = False
            await read_only
            for sample in self._samples:
                sample()
            if self._conds:
                self._check_conditions()

    def _set_timed(self, timed: list[_Waiter]) -> None:
        self._timed = timed
        self._next_due = min((w.deadline for w in timed), default=_NEVER)

    def _wake(self) -> bool:
        woken = False
        if self._ready:
            for w in self._ready:
                w.event.set()
            self._ready.clear()
            woken = True
        cycle = self.cycle
        if self._next_due <= cycle:
            due = [w for w in self._timed if w.deadline <= cycle]
            self._set_timed([w for w in self._timed if w.deadline > cycle])
            for w in due:
                if w.predicate is not None:
                    self._conds.remove(w)
                    w.error = TimeoutError(
                        f"{w.what} not reached within {w.deadline - w.start} cycles")
                w.event.set()
            woken = True
        return woken

    def _check_conditions(self) -> None:
        done = [w for w in self._conds if w.predicate()]
        if done:
            self._conds = [w for w in self._conds if w not in done]
            self._set_timed([w for w in self._timed if w not in done])
            self._ready.extend(done)

    # --- waiting ------------------------------------------------------------------
    def _check_running(self, what: str) -> None:
        if not self.running:
            raise RuntimeError(f"cycle loop is not running (waiting for {what}); call start()")

    async def wait_cycles(self, n: int) -> None:
        """Resume right after the rising edge ``n`` cycles from now (``n >= 0``)."""
        if n < 0:
            raise ValueError(f"n must be non-negative, not {n}")
        if n == 0:
            return
        self._check_running(f"{n} cycles")
        w = _Waiter(self.cycle, self.cycle + n, None, f"{n} cycles")
        self._set_timed([*self._timed, w])
        await w.event.wait()
        if w.error is not None:
            raise w.error

    async def wait_until(self, predicate: Callable[[], bool], *, timeout: int, what: str) -> None:
        """Resume after the cycle in which ``predicate()`` first holds.

        Raises :class:`TimeoutError` ``"{what} not reached within {timeout} cycles"``
        if it does not hold within ``timeout`` cycles, so a test never hangs.
        """
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        if predicate():
            return
        self._check_running(what)
        w = _Waiter(self.cycle, self.cycle + timeout, predicate, what)
        self._conds.append(w)
        self._set_timed([*self._timed, w])
        await w.event.wait()
        if w.error is not None:
            raise w.error


async def start_clock_and_reset(dut, cycles: int = 5, *, period_ns: float = 2) -> None:
    """Start ``dut.clk`` (GPI clock, 2 ns by default) and hold ``dut.rst`` high.

    Reset is synchronous and active high: ``rst`` is high for ``cycles`` rising edges
    and low from the edge after; the coroutine returns right after the last reset edge.
    """
    if cycles < 1:
        raise ValueError(f"cycles must be at least 1, not {cycles}")
    Clock(dut.clk, period_ns, unit="ns", impl="gpi").start(start_high=False)
    dut.rst.value = 1
    edge = RisingEdge(dut.clk)
    for _ in range(cycles):
        await edge
    dut.rst.value = 0
