"""The GPU home of GPU memory (``tb/coherent_host.py``, ``GpuHome``) behind the link
model, against ``docs/platform.md`` ("The link in the test benches"): a D2H message
reaches the home when the link's up direction delivers it, an H2D message is presented
to the device when the down direction delivers it, in order per channel, and every
message is counted in ``link_bytes`` (16 bytes of header, 64 more for a line). The
models are driven cycle by cycle in plain Python: stand-ins for the BFM's sources and
the cycle loop, no simulator. The arrivals expected come from the link's contract
(:func:`tests.test_link.reference`), not from the model's code."""

from __future__ import annotations

import random

from hw.cxl.messages import D2HReqOpcode
from tb.cache_home import HomeTiming
from tb.coherent_host import GpuHome
from tb.link import DATA_BYTES, HEADER_BYTES, Link

from .test_link import reference

BPC, FLIGHT, READ, WRITE = 252.0, 25, 75, 1


class _Source:
    """An H2D source the device takes a message from in the cycle it is presented."""

    def __init__(self, loop):
        self.loop, self.pending, self.on_transfer, self.sent = loop, False, None, []

    def send(self, msg: dict) -> None:
        self.pending = True
        self.sent.append((self.loop.cycle, msg))


class _Loop:
    def __init__(self):
        self.cycle, self.agents = 0, []

    def add(self, agent) -> None:
        self.agents.append(agent)

    def remove(self, agent) -> None:
        if agent in self.agents:
            self.agents.remove(agent)


class _Bfm:
    def __init__(self, loop):
        self.sources = {ch: _Source(loop) for ch in ("req", "rsp", "data")}


def _home(link: Link | None):
    loop = _Loop()
    bfm = _Bfm(loop)
    gpu = GpuHome(bfm, loop, rng=random.Random(1),
                  timing=HomeTiming(read_latency=READ, write_latency=WRITE), link=link)
    return loop, bfm, gpu


def _run(loop, bfm, gpu, until: int, each=None) -> None:
    while loop.cycle < until:
        loop.cycle += 1
        if each is not None:
            each(loop.cycle)
        gpu.drive()
        for source in bfm.sources.values():   # taken in the cycle presented
            if source.pending:
                source.pending = False
                if source.on_transfer is not None:
                    source.on_transfer(source.sent[-1][1], loop.cycle)


def _read(cqid: int, line: int) -> dict:
    return {"opcode": D2HReqOpcode.RdCurr.value, "cqid": cqid, "address": line, "nt": 0}


def test_read_crosses_the_link_both_ways():
    """A RdCurr put on the link in cycle 10 reaches the home after the up direction's
    flight, the home answers after its read latency, and the data reaches the device
    after the down direction's flight; without a link only the read latency remains."""
    link = Link(bytes_per_cycle=BPC, latency=FLIGHT, io_round_trip=0)
    loop, bfm, gpu = _home(link)
    loop.cycle = 10
    gpu.d2h("req", _read(3, 0x1234), 10)
    _run(loop, bfm, gpu, 400)
    at_home = reference([(10, HEADER_BYTES)], BPC, FLIGHT)[0]
    want = reference([(at_home + READ, HEADER_BYTES + DATA_BYTES)], BPC, FLIGHT)[0]
    sent = bfm.sources["data"].sent
    assert [(t, m["cqid"]) for t, m in sent] == [(want, 3)], sent
    assert (gpu.link_bytes, gpu.data_lines) == (2 * HEADER_BYTES + DATA_BYTES, 1)

    loop, bfm, gpu = _home(None)
    loop.cycle = 10
    gpu.d2h("req", _read(3, 0x1234), 10)
    _run(loop, bfm, gpu, 400)
    assert [t for t, _ in bfm.sources["data"].sent] == [10 + READ]
    assert (gpu.link_bytes, gpu.data_lines) == (2 * HEADER_BYTES + DATA_BYTES, 1)


def test_reads_queue_on_a_narrow_link_in_order():
    """Forty reads in one cycle on a link of 40 bytes per cycle: their requests
    serialise on the way up, their data (80 bytes each) on the way down, and the device
    gets the lines in the order the home sent them, each at its contract arrival."""
    bpc = 40.0
    link = Link(bytes_per_cycle=bpc, latency=FLIGHT, io_round_trip=0)
    loop, bfm, gpu = _home(link)
    loop.cycle = 5
    for k in range(40):
        gpu.d2h("req", _read(k, 0x100 + k), 5)
    _run(loop, bfm, gpu, 2000)
    at_home = reference([(5, HEADER_BYTES)] * 40, bpc, FLIGHT)
    want = reference([(t + READ, HEADER_BYTES + DATA_BYTES) for t in at_home], bpc, FLIGHT)
    sent = bfm.sources["data"].sent
    assert [m["cqid"] for _, m in sent] == list(range(40))
    assert [t for t, _ in sent] == want
    assert gpu.link_bytes == 40 * (2 * HEADER_BYTES + DATA_BYTES)


def test_write_is_pulled_across_the_link():
    """An ItoMWr: its GO_WritePull reaches the device after the up flight, the home's
    write latency and the down flight; the line the device then sends crosses the up
    direction before the home has it. 16 + 16 + 80 bytes."""
    link = Link(bytes_per_cycle=BPC, latency=FLIGHT, io_round_trip=0)
    loop, bfm, gpu = _home(link)
    loop.cycle = 20
    gpu.d2h("req", {"opcode": D2HReqOpcode.ItoMWr.value, "cqid": 9, "address": 0x77,
                    "nt": 0}, 20)
    pulled = []

    def device(cycle: int) -> None:
        for t, msg in bfm.sources["rsp"].sent:
            if t == cycle - 1 and not pulled:
                pulled.append(cycle)
                gpu.d2h("data", {"uqid": msg["rsp_data"], "data": 0xABC, "bogus": 0,
                                 "poison": 0}, cycle)

    _run(loop, bfm, gpu, 400, each=device)
    at_home = reference([(20, HEADER_BYTES)], BPC, FLIGHT)[0]
    rsp = bfm.sources["rsp"].sent
    assert [t for t, _ in rsp] == reference([(at_home + WRITE, HEADER_BYTES)], BPC, FLIGHT)
    assert pulled and gpu.read(0x77)[:2] == (0xABC).to_bytes(2, "little")
    assert (gpu.link_bytes, gpu.data_lines) == (3 * HEADER_BYTES + DATA_BYTES, 1)


def test_device_reset_drops_what_is_in_flight():
    """A reset while the data is on the link: the device never gets it, and the home
    takes new requests afterwards (the CQID is free again)."""
    link = Link(bytes_per_cycle=BPC, latency=FLIGHT, io_round_trip=0)
    loop, bfm, gpu = _home(link)
    loop.cycle = 1
    gpu.d2h("req", _read(5, 0x10), 1)
    at_home = reference([(1, HEADER_BYTES)], BPC, FLIGHT)[0]
    _run(loop, bfm, gpu, at_home + READ + 2)        # sent by the home, still in flight
    assert not bfm.sources["data"].sent
    gpu.device_reset()
    link.reset()
    _run(loop, bfm, gpu, at_home + READ + 200)
    assert not bfm.sources["data"].sent
    gpu.d2h("req", _read(5, 0x10), loop.cycle)
    _run(loop, bfm, gpu, loop.cycle + 300)
    assert [m["cqid"] for _, m in bfm.sources["data"].sent] == [5]
