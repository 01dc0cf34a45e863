"""Messages a per-cycle host model sends after a latency: the one schedule both
:mod:`tb.cache_home` (H2D channels) and :mod:`tb.dcoh_host` (forwards) use. Plain
Python, no simulator import."""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

__all__ = ["DueQueue", "Scheduled"]


@dataclass(eq=False)
class Scheduled:
    """A message ``fields`` due in cycle ``due``; ``after`` names a message it must not
    be offered before (it is offered from the cycle after that one's transfer);
    ``taken`` is the cycle of its own transfer. Models subclass it for their own
    records."""
    fields: dict
    due: int
    after: Scheduled | None = None
    seq: int = 0
    taken: int | None = None


class DueQueue:
    """Pending messages of one channel, in (due, order of sending).

    :meth:`offer` returns the message to present in cycle ``t``: the oldest due one,
    or with ``reorder`` a random due one; once offered, it is offered again until
    :meth:`take`, as the stream rules require.
    """

    def __init__(self, rng: random.Random, *, reorder: bool = False):
        self.rng = rng
        self.reorder = reorder
        self.pending: list[Scheduled] = []
        self.offered: Scheduled | None = None
        self._seq = 0

    def __len__(self) -> int:
        return len(self.pending) + (self.offered is not None)

    def push(self, msg: Scheduled) -> Scheduled:
        """Schedule ``msg`` (after every message already due in the same cycle)."""
        msg.seq = self._seq
        self._seq += 1
        bisect.insort(self.pending, msg, key=lambda m: (m.due, m.seq))
        return msg

    def offer(self, t: int) -> Scheduled | None:
        if self.offered is not None:
            return self.offered
        ready = []
        for msg in self.pending:
            if msg.due > t:
                break
            if msg.after is None or (msg.after.taken is not None and msg.after.taken < t):
                ready.append(msg)
                if not self.reorder:
                    break
        if not ready:
            return None
        msg = self.rng.choice(ready) if self.reorder else ready[0]
        self.pending.remove(msg)
        self.offered = msg
        return msg

    def take(self, t: int) -> Scheduled | None:
        """The offered message was transferred in cycle ``t``; returns it (None if
        nothing was offered)."""
        msg, self.offered = self.offered, None
        if msg is not None:
            msg.taken = t
        return msg
