"""The CXL.mem endpoint's per-line Meta0-State. See :class:`MetaStateStore`."""

from __future__ import annotations

from amaranth.hdl import Module, Mux
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..widths import is_int
from .messages import MetaValue

__all__ = ["MetaStateStore"]


class MetaStateStore(wiring.Component):
    """The Meta0-State of every line of device memory: 2 bits per line, Any at power-on,
    kept over a reset (``docs/mem-endpoint.md``, "Meta state").

    ``o_state`` is the state of line ``i_line`` in the same cycle (an asynchronous read,
    so distributed RAM on an FPGA): the endpoint reads and updates a line in the cycle
    it accepts a request, so that back-to-back requests of one line see each other's
    updates. With ``i_store`` high the line's state becomes, at the clock edge,
    ``i_value``, or with ``i_promote`` also high Any if it was Invalid and unchanged
    otherwise (MemRdData). No backpressure, one update per cycle; reset clears nothing.

    Parameters
    ----------
    lines:
        Lines of device memory (a positive int).

    Members
    -------
    i_line: ``In(range(lines))``
        The line read (and updated with ``i_store``).
    i_store: ``In(1)``
        Update the line at the clock edge.
    i_promote: ``In(1)``
        The update moves Invalid to Any and keeps every other state (``i_value``
        unused).
    i_value: ``In(2)``
        The new state (a MetaValue) when ``i_promote`` is low.
    o_state: ``Out(2)``
        The line's state before the update.

    Raises
    ------
    ValueError
        If ``lines`` is not a positive int.
    """

    def __init__(self, *, lines: int):
        if not is_int(lines) or lines < 1:
            raise ValueError(f"lines must be a positive int, not {lines!r}")
        self._lines = lines
        super().__init__({
            "i_line": In(range(lines)),
            "i_store": In(1),
            "i_promote": In(1),
            "i_value": In(2),
            "o_state": Out(2),
        })

    @property
    def lines(self) -> int:
        return self._lines

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = memory = Memory(shape=2, depth=self._lines,
                                              init=[MetaValue.Any.value] * self._lines)
        read = memory.read_port(domain="comb")
        write = memory.write_port()
        promoted = Mux(read.data == MetaValue.Invalid.value, MetaValue.Any.value, read.data)
        m.d.comb += [
            read.addr.eq(self.i_line),
            write.addr.eq(self.i_line),
            write.en.eq(self.i_store),
            write.data.eq(Mux(self.i_promote, promoted, self.i_value)),
            self.o_state.eq(read.data),
        ]
        return m
