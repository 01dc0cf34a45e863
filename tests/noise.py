"""Random stalls for the block benches: independent per-cycle noise and, now and then,
a long stall burst (a consumer or producer that stops for tens of cycles, as a link
retraining or a memory controller's refresh does), which per-cycle noise alone almost
never produces."""

from __future__ import annotations

import random

__all__ = ["STALL_BURSTS", "Stalls"]

#: Stall bursts of the stress variants: one starts in about 1 % of the cycles and lasts
#: 16 to 96 cycles.
STALL_BURSTS = {"burst_p": 0.01, "burst_len": (16, 96)}


class Stalls:
    """Per-cycle stall decisions for one signal (a ``valid`` held low, a ``ready`` held
    low). ``p``: probability of an independent one-cycle stall; ``burst_p``: probability
    per cycle that a burst of ``burst_len`` (lowest, highest) stalled cycles starts.
    Draws from ``rng`` only for the kinds of stall that are enabled."""

    def __init__(self, rng: random.Random, p: float, *, burst_p: float = 0.0,
                 burst_len: tuple[int, int] = (16, 96)):
        self.rng, self.p, self.burst_p, self.burst_len = rng, p, burst_p, burst_len
        self.left = 0                       # cycles of the current burst after this one
        self.bursts = 0                     # bursts started (for the tests' coverage)

    def __call__(self) -> bool:
        """Whether this cycle stalls (call once per cycle)."""
        if self.left:
            self.left -= 1
            return True
        if self.burst_p and self.rng.random() < self.burst_p:
            self.left = self.rng.randint(*self.burst_len) - 1
            self.bursts += 1
            return True
        return bool(self.p) and self.rng.random() < self.p
