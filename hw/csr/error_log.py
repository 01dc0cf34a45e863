"""Sticky error flags with a record of the first error: the error block behind a block's
``*_ERR`` / ``*_ERR_INFO`` registers.

See :class:`ErrorLog`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..widths import is_int as _is_int

__all__ = ["ErrorLog"]


class ErrorLog(wiring.Component):
    """Error kinds raised by a block, latched for software.

    Each cycle the block raises any number of its ``kinds`` error kinds on ``i_raise``
    (combinational, one bit per kind) and gives each raised kind's details on
    ``i_info[kind]``. The log registers them:

    * ``o_set`` is ``i_raise`` one cycle later (a pulse per kind, for counters and
      interrupts);
    * ``o_status`` is sticky: a raised kind sets its bit, bits written in ``i_clear``
      (write-1-to-clear) clear, and a kind raised in the cycle of its clear stays set;
    * ``o_first`` records the first error since ``o_status`` was last all zero: its
      ``code`` (the kind) and its details. When several kinds are raised in that cycle,
      the lowest kind is recorded.

    Parameters
    ----------
    kinds : int
        Number of error kinds, 1 to 32.
    info : data.StructLayout
        The details of an error, without its code (for example opcode, ID, address).

    Members
    -------
    i_raise : ``In(kinds)``
        This cycle's errors.
    i_info : ``In(data.ArrayLayout(info, kinds))``
        Details of each kind raised this cycle (ignored for the others).
    i_clear : ``In(kinds)``
        Write-1-to-clear for ``o_status``.
    o_set : ``Out(kinds)``
        ``i_raise``, registered.
    o_status : ``Out(kinds)``
        Sticky flags.
    o_first : ``Out(record_layout)``
        ``code`` and the fields of ``info``; meaningful while ``o_status`` is non-zero.

    Raises
    ------
    ValueError
        If ``kinds`` is out of range or ``info`` is not a struct layout.
    """

    def __init__(self, *, kinds: int, info: data.StructLayout):
        if not _is_int(kinds) or not 1 <= kinds <= 32:
            raise ValueError(f"kinds must be an integer from 1 to 32, not {kinds!r}")
        if not isinstance(info, data.StructLayout) or "code" in info.members:
            raise ValueError(f"info must be a StructLayout without a 'code' field, not "
                             f"{info!r}")
        self._kinds = kinds
        self._info = info
        self._record = data.StructLayout({"code": (kinds - 1).bit_length() or 1,
                                          **info.members})
        super().__init__({
            "i_raise": In(kinds),
            "i_info": In(data.ArrayLayout(info, kinds)),
            "i_clear": In(kinds),
            "o_set": Out(kinds),
            "o_status": Out(kinds),
            "o_first": Out(self._record),
        })

    @property
    def kinds(self) -> int:
        return self._kinds

    @property
    def record_layout(self) -> data.StructLayout:
        """``o_first``: ``code`` (wide enough for ``kinds - 1``) and ``info``'s fields."""
        return self._record

    def elaborate(self, platform):
        m = Module()
        raised = self.i_raise
        # The lowest kind raised names the record.
        code, details = 0, self.i_info[0]
        for kind in reversed(range(self._kinds)):
            code = Mux(raised[kind], kind, code)
            details = Mux(raised[kind], self.i_info[kind], details)
        kept = self.o_status & ~self.i_clear
        m.d.sync += [self.o_set.eq(raised), self.o_status.eq(kept | raised)]
        with m.If(~kept.any() & raised.any()):
            m.d.sync += [self.o_first.code.eq(code),
                         self.o_first.as_value()[len(self.o_first.code):].eq(details)]
        return m
