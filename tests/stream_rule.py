"""A passive stream-rule checker for Amaranth-simulator test benches (the cocotb
benches use :class:`tb.stream.StreamChecker`)."""

from __future__ import annotations

__all__ = ["StreamRule"]


class StreamRule:
    """Once ``valid`` is high, it and the payload must hold until the transfer.

    Feed it every cycle with :meth:`observe`. Violations are collected in ``errors``;
    with ``strict`` the first one raises :class:`AssertionError` at once.
    """

    def __init__(self, name: str, *, strict: bool = False):
        self.name = name
        self.strict = strict
        self.held: tuple | None = None
        self.errors: list[str] = []

    def observe(self, cycle: int, valid, ready, payload=()) -> None:
        if self.held is not None and (not valid or payload != self.held):
            what = "valid dropped" if not valid else "payload changed"
            message = f"{self.name}: {what} before the transfer (cycle {cycle})"
            if self.strict:
                raise AssertionError(message)
            self.errors.append(message)
        self.held = payload if valid and not ready else None
