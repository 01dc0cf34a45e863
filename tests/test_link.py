"""The link model of the test benches (``tb/link.py``) against its documented contract:
a message put on a direction in cycle ``t`` leaves after the messages before it,
occupies the direction ``bytes / bytes_per_cycle`` cycles and arrives ``latency``
cycles after its last byte left, rounded up to a whole cycle. The host agent and CSR
manager's use of it is tested on the device (``tb/test_device.py``,
``test_link_flight_time``)."""

from __future__ import annotations

import math
import random

import pytest

from sim.platform import get_platform
from tb.link import DATA_BYTES, HEADER_BYTES, Link, LinkDirection


def reference(messages: list[tuple[int, int]], bpc: float, latency: int) -> list[int]:
    """Arrival cycles of (cycle, bytes) messages in the order they were put on."""
    free, out = 0.0, []
    for cycle, nbytes in messages:
        free = max(free, cycle) + nbytes / bpc
        out.append(math.ceil(free - 1e-9) + latency)
    return out


def test_isolated_and_back_to_back():
    d = LinkDirection(8.0, 20)
    assert d.send(100, HEADER_BYTES) == 100 + 2 + 20
    # The next message queues behind the first, which leaves in cycle 102.
    assert d.send(100, HEADER_BYTES + DATA_BYTES) == 102 + 10 + 20
    # After an idle gap the link starts afresh.
    assert d.send(500, HEADER_BYTES) == 500 + 2 + 20
    assert d.bytes_sent == 2 * HEADER_BYTES + HEADER_BYTES + DATA_BYTES


def test_fractional_bandwidth_rounds_up_once():
    d = LinkDirection(252.0, 25)
    # Four lines in one cycle take 320 / 252 = 1.27 cycles: the last arrives 2 + 25 on.
    got = [d.send(10, HEADER_BYTES + DATA_BYTES) for _ in range(4)]
    assert got == [11 + 25, 11 + 25, 11 + 25, 12 + 25]


def test_unbounded_bandwidth_is_latency_only():
    d = LinkDirection(math.inf, 7)
    assert [d.send(c, 80) for c in (3, 3, 4)] == [10, 10, 11]


def test_random_against_reference(seed):
    rng = random.Random(seed)
    print(f"seed {seed}")
    for _ in range(20):
        bpc, latency = rng.choice([1.0, 3.5, 8.0, 64.0, 252.0]), rng.randint(0, 50)
        msgs, cycle = [], 0
        for _ in range(200):
            cycle += rng.choice([0, 0, 1, 2, rng.randint(0, 40)])
            msgs.append((cycle, rng.choice([HEADER_BYTES, HEADER_BYTES + DATA_BYTES])))
        d = LinkDirection(bpc, latency)
        got = [d.send(c, n) for c, n in msgs]
        assert got == reference(msgs, bpc, latency), (bpc, latency)
        assert all(a >= c + latency for a, (c, _) in zip(got, msgs, strict=True))


def test_reset_forgets_what_is_in_flight():
    d = LinkDirection(1.0, 5)
    d.send(0, 1000)
    d.reset()
    assert d.send(10, 16) == 10 + 16 + 5


def test_from_platform():
    assert Link.from_platform(get_platform("ideal-1ch")) is None
    p = get_platform("paper-like")
    link = Link.from_platform(p)
    assert link.down.bytes_per_cycle == pytest.approx(p.link_bytes_per_s / p.device_clock_hz)
    assert link.up.bytes_per_cycle == link.down.bytes_per_cycle
    assert link.down.latency == link.up.latency == p.link_cycles == 25
    assert link.io_round_trip == p.cxl_io_cycles == 200


@pytest.mark.parametrize("kw, match", [
    ({"bytes_per_cycle": 0.0, "latency": 1, "io_round_trip": 0}, "bytes_per_cycle"),
    ({"bytes_per_cycle": -1.0, "latency": 1, "io_round_trip": 0}, "bytes_per_cycle"),
    ({"bytes_per_cycle": 8.0, "latency": -1, "io_round_trip": 0}, "latency"),
    ({"bytes_per_cycle": 8.0, "latency": 1.5, "io_round_trip": 0}, "latency"),
    ({"bytes_per_cycle": 8.0, "latency": 1, "io_round_trip": -2}, "io_round_trip"),
])
def test_bad_parameters(kw, match):
    with pytest.raises(ValueError, match=match):
        Link(**kw)
