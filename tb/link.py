"""The CXL link between the GPU/host and the device, as the test benches model it.

Each direction of the link serialises its messages at the platform's bandwidth and
delivers each one a fixed flight time after it has left (``docs/platform.md``, "The
link in the test benches"). A message of ``n`` bytes put on a direction in cycle ``t``
leaves once the messages before it have (``start = max(t, free)``), occupies the
direction for ``n / bytes_per_cycle`` cycles, and arrives ``latency`` cycles after its
last byte left, rounded up to a whole cycle.

Message sizes are the slots of a 68-byte CXL flit: a header slot of 16 bytes for every
request or response, plus 64 bytes for a message that carries a line (M2S RwD, S2M DRS).
A read thus costs 16 bytes towards the device and 80 back, a write 80 and 16.

The host agent (:class:`tb.host_agent.HostAgent`) puts its M2S requests on the down
direction and its S2M responses on the up direction; the CSR manager
(:class:`tb.csr.Csr`) waits the CXL.io round trip around each access. With no link
(``ideal-1ch``) :meth:`Link.from_platform` returns None and nothing is delayed.
"""

from __future__ import annotations

import math

__all__ = ["DATA_BYTES", "HEADER_BYTES", "Link", "LinkDirection"]

#: Bytes of a header slot (one request or response) and of a line's data on the link.
HEADER_BYTES = 16
DATA_BYTES = 64


class LinkDirection:
    """One direction of the link: serialisation at ``bytes_per_cycle`` (``inf``: none)
    and ``latency`` cycles of flight.

    Members
    -------
    bytes_sent:
        Bytes put on this direction since construction (kept across :meth:`reset`).
    """

    def __init__(self, bytes_per_cycle: float, latency: int):
        if not bytes_per_cycle > 0:
            raise ValueError(f"bytes_per_cycle must be positive, not {bytes_per_cycle!r}")
        if not isinstance(latency, int) or latency < 0:
            raise ValueError(f"latency must be a non-negative integer, not {latency!r}")
        self.bytes_per_cycle = bytes_per_cycle
        self.latency = latency
        self.bytes_sent = 0
        self._free = 0.0                    # when the last message put on it has left

    def send(self, cycle: int, nbytes: int) -> int:
        """Put a message of ``nbytes`` on the link in ``cycle``; returns the cycle in
        which it arrives at the other end (``>= cycle``)."""
        start = max(float(cycle), self._free)
        self._free = start + nbytes / self.bytes_per_cycle
        self.bytes_sent += nbytes
        return math.ceil(self._free - 1e-9) + self.latency

    def reset(self) -> None:
        """Forget what is in flight (a power failure or reset takes the link down)."""
        self._free = 0.0


class Link:
    """Both directions of the link and the CXL.io round trip, in device cycles.

    Members
    -------
    down, up:
        GPU/host -> device and device -> GPU/host :class:`LinkDirection`.
    io_round_trip:
        Cycles of one CSR access (read, or a doorbell write and the read that flushes
        it) over CXL.io, request and completion included.
    """

    def __init__(self, *, bytes_per_cycle: float, latency: int, io_round_trip: int):
        if not isinstance(io_round_trip, int) or io_round_trip < 0:
            raise ValueError(f"io_round_trip must be a non-negative integer, "
                             f"not {io_round_trip!r}")
        self.down = LinkDirection(bytes_per_cycle, latency)
        self.up = LinkDirection(bytes_per_cycle, latency)
        self.io_round_trip = io_round_trip

    @classmethod
    def from_platform(cls, platform) -> Link | None:
        """The link of a :class:`sim.platform.Platform`; None when it has none (no
        flight time and unbounded bandwidth)."""
        if platform.link_cycles == 0 and math.isinf(platform.link_bytes_per_s):
            return None
        return cls(bytes_per_cycle=platform.link_bytes_per_s / platform.device_clock_hz,
                   latency=platform.link_cycles, io_round_trip=platform.cxl_io_cycles)

    def reset(self) -> None:
        self.down.reset()
        self.up.reset()

    def __repr__(self) -> str:
        return (f"Link({self.down.bytes_per_cycle:.1f} B/cycle per direction, "
                f"{self.down.latency} cycles one way, CXL.io round trip "
                f"{self.io_round_trip} cycles)")
