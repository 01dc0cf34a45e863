"""A stream source for Amaranth-simulator test benches: queued payloads offered with
random idle cycles, each held until taken (the stream rules of a producer)."""

from __future__ import annotations

import random
from collections import deque

__all__ = ["Source"]


class Source:
    """Offers the payloads put in ``items`` on ``port`` (a ``stream.Signature``
    interface), in order; before each idle-or-not decision a payload stays offered
    until taken. Call :meth:`drive` before each clock edge and :meth:`took` with the
    ``ready`` sampled at it."""

    def __init__(self, port, rng: random.Random, idle: float = 0.0):
        self.port = port
        self.rng = rng
        self.idle = idle
        self.items: deque = deque()
        self.current = None
        self.taken = 0

    def drive(self, ctx) -> None:
        if self.current is None and self.items and not self.rng.random() < self.idle:
            self.current = self.items.popleft()
            ctx.set(self.port.payload, self.current)
        ctx.set(self.port.valid, self.current is not None)

    def took(self, ready) -> bool:
        """Whether the offered payload was taken at the edge ``ready`` was sampled at."""
        if self.current is not None and ready:
            self.current = None
            self.taken += 1
            return True
        return False

    @property
    def empty(self) -> bool:
        return self.current is None and not self.items
