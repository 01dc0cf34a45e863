"""The GPU/host side of a coherent TrainingCXL device: CXL.cache BFM, GPU home agent,
a write-back MESI cache of device lines, and a coherence checker (``docs/coherence.md``).

* :class:`CxlCacheBfm` -- sinks for the three D2H streams, sources for the three H2D
  streams, a :class:`~tb.stream.StreamChecker` on each, random idle / backpressure
  (seeded), like :class:`~tb.cxl_mem.CxlMemBfm` for CXL.mem.
* :class:`GpuHome` -- drives :class:`~tb.cache_home.CacheHome` once per cycle for the
  lines **outside** the HDM range (GPU memory): RdCurr gets H2D Data and no GO, ItoMWr
  gets GO_WritePull and its D2H Data; :attr:`GpuHome.gpu_memory` is what the GPU sees.
* :class:`HostCache` -- the GPU's write-back MESI cache of **device** lines. Loads and
  stores hit, or miss with a CXL.mem MemRd (Meta0-State, MetaValue Shared for a load,
  Any for a store; ``docs/cxl-encodings.md``, "CXL.mem") through the
  :class:`CoherentHostAgent`; dirty lines leave with MemWr (eviction, :meth:`flush`,
  or a device request). It also answers the DCOH's D2H requests for device lines
  (``docs/cxl-encodings.md``, "Flows"): RdCurr / RdShared -> write back a
  dirty copy, wait for its NDR, keep a clean copy; RdOwn, RdOwnNoData -> write back,
  drop; then an answer of the protocol table (:mod:`tb.cxl_protocol`, CXL 1.1 Table
  17, CXL 3.1 Table 3-24): MemRdFwd, or for RdOwnNoData MemRdFwd or GO-E at random;
  with error injection GO-Err on H2D Rsp, or for a read H2D Data with GO-Err. Every
  operation on a line is serialised behind the previous one (a per-line lock), as a
  home agent does.
* :class:`CoherenceChecker` -- checks every transfer against the rules of
  ``docs/coherence.md``: one writer or many readers per device line (the host cache's
  state against the accesses the host has forwarded to the device and the pages in
  device bias), and every read returns the last write in coherence order.

Nothing here reads a signal except through the stream models, so the cost per cycle is
that of the ten stream models plus one :meth:`CacheHome.offer` per H2D channel.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable

import cocotb
from cocotb.triggers import Event

from hw.cxl.messages import (
    D2HData,
    D2HReq,
    D2HReqOpcode,
    D2HRsp,
    H2DData,
    H2DReq,
    H2DRsp,
    M2SReqOpcode,
    MetaField,
    MetaValue,
    NDROpcode,
)
from hw.top import DCOH_CQID_BASE
from sim.golden_memory import LINE_BYTES
from tb.cache_home import CacheHome, HomeTiming, background_line
from tb.cxl_protocol import ALL_ONES, Flow, pick, row
from tb.host_agent import HostAgent, Txn
from tb.link import DATA_BYTES, HEADER_BYTES, Link
from tb.stream import StreamChecker, StreamSink, StreamSource

__all__ = ["CoherenceChecker", "CoherentHostAgent", "CxlCacheBfm", "GpuHome", "HostCache",
           "LineLocks", "LostToReset", "attach_gpu_memory"]

_H2D = {"req": ("i_h2d_req", H2DReq), "rsp": ("i_h2d_rsp", H2DRsp),
        "data": ("i_h2d_data", H2DData)}
_D2H = {"req": ("o_d2h_req", D2HReq), "rsp": ("o_d2h_rsp", D2HRsp),
        "data": ("o_d2h_data", D2HData)}
_FWD_OPS = (M2SReqOpcode.MemRdFwd.value, M2SReqOpcode.MemWrFwd.value)
_READS = (D2HReqOpcode.RdCurr.value, D2HReqOpcode.RdShared.value)


def _bytes(value: int) -> bytes:
    return value.to_bytes(LINE_BYTES, "little")


class LostToReset(RuntimeError):
    """A host cache operation whose CXL.mem request the device lost to a reset."""


class CxlCacheBfm:
    """Drivers, responders and protocol checkers of the device's six CXL.cache ports.

    Parameters
    ----------
    dut, loop, rng:
        Device top, cycle loop, seeded generator.
    idle:
        Probability of an idle cycle on each H2D source.
    backpressure:
        Probability of ``ready`` low on each D2H sink.
    on_d2h:
        ``on_d2h(channel, fields, cycle)`` for each D2H transfer (``"req"``, ``"rsp"``,
        ``"data"``).

    Members
    -------
    sources, sinks:
        H2D :class:`StreamSource` and D2H :class:`StreamSink` by channel name.
    checkers:
        Port name -> :class:`StreamChecker`, one on each of the six streams.
    """

    def __init__(self, dut, loop, *, rng: random.Random, idle: float = 0.0,
                 backpressure: float = 0.0,
                 on_d2h: Callable[[str, dict, int], None] | None = None):
        self.on_d2h = on_d2h
        self.sinks = {ch: StreamSink(dut, port, layout, loop, rng=rng, backpressure=backpressure,
                                     callback=self._taker(ch))
                      for ch, (port, layout) in _D2H.items()}
        self.sources = {ch: StreamSource(dut, port, layout, loop, rng=rng, idle=idle)
                        for ch, (port, layout) in _H2D.items()}
        self.checkers = {port: StreamChecker(dut, port, loop) for port, _ in _H2D.values()}
        self.checkers.update({_D2H[ch][0]: sink.checker for ch, sink in self.sinks.items()})

    def _taker(self, channel: str):
        def take(fields, cycle):
            if self.on_d2h is not None:
                self.on_d2h(channel, fields, cycle)
        return take

    def set_idle(self, idle: float) -> None:
        for source in self.sources.values():
            source.idle = idle

    def set_backpressure(self, backpressure: float) -> None:
        for sink in self.sinks.values():
            sink.backpressure = backpressure

    def violations(self) -> list[str]:
        return [f"{name}: {v}" for name, c in self.checkers.items() for v in c.violations]

    def device_reset(self) -> None:
        """The device is in reset: drop the H2D messages presented or queued and forget
        every stalled transfer (a D2H valid may fall now)."""
        for source in self.sources.values():
            source.clear()
        for checker in self.checkers.values():
            checker.clear()


def _message_bytes(channel: str) -> int:
    """Link bytes of a CXL.cache message on ``channel``: a header slot, and a line for
    data."""
    return HEADER_BYTES + (DATA_BYTES if channel == "data" else 0)


class GpuHome:
    """The GPU's home agent for GPU memory on CXL.cache, run once per cycle.

    A loop agent that presents :class:`CacheHome`'s H2D messages on the BFM's sources
    (one per channel at a time, held until its transfer) and hands it the D2H transfers
    :meth:`d2h` routes here. Latency is :class:`HomeTiming`'s (``read_latency=100``
    models a GPU behind a switch). The GPU's own accesses to its memory go through
    :meth:`write` / :meth:`read`, which keep the home's history, so a device read is
    held to the value the line had when the home accepted it.

    With a ``link`` (:class:`tb.link.Link`) every message crosses it: a D2H transfer
    reaches the home when the link's up direction delivers it, and an H2D message the
    home sends is taken from it at once and presented to the device when the down
    direction delivers it (in send order per channel). Without one, the home's messages
    are presented as it offers them.

    Members
    -------
    home:
        The :class:`CacheHome`.
    link_bytes, data_lines:
        Bytes of CXL.cache messages in both directions so far (a 16-byte header slot per
        message, 64 more for a line), with or without a link, and the lines among them
        (H2D and D2H Data).
    d2h_bytes, h2d_bytes:
        ``link_bytes`` split by direction (the device's LINK_TX_BYTES / LINK_RX_BYTES
        share of CXL.cache).
    """

    def __init__(self, bfm: CxlCacheBfm, loop, *, rng: random.Random,
                 timing: HomeTiming | None = None, link: Link | None = None):
        self.loop = loop
        self.bfm = bfm
        self.link = link
        self.link_bytes = self.data_lines = self.d2h_bytes = self.h2d_bytes = 0
        self.home = CacheHome(timing=timing or HomeTiming(read_latency=40, write_latency=20),
                              rng=random.Random(rng.getrandbits(64)))
        self._sources = [(ch, bfm.sources[ch]) for ch in ("req", "rsp", "data")]
        self._flight: dict[str, deque] = {ch: deque() for ch, _ in self._sources}
        for ch, source in self._sources:
            source.on_transfer = self._taker(ch)
        loop.add(self)
        # The home offers before the sources drive: move them behind this agent.
        for _, source in self._sources:
            loop.remove(source)
            loop.add(source)

    def _taker(self, channel: str):
        def take(_payload, cycle):
            if self.link is None:
                self.home.take(channel, cycle)
        return take

    def drive(self) -> None:
        t = self.loop.cycle
        for ch, source in self._sources:
            if self.link is None:
                if not source.pending:
                    msg = self.home.offer(ch, t)
                    if msg is not None:
                        self._count(ch, up=False)
                        source.send(msg)
                continue
            flight = self._flight[ch]
            while (msg := self.home.offer(ch, t)) is not None:
                self.home.take(ch, t)
                self._count(ch, up=False)
                flight.append((self.link.down.send(t, _message_bytes(ch)), msg))
            if not source.pending and flight and flight[0][0] <= t:
                source.send(flight.popleft()[1])

    def _count(self, channel: str, *, up: bool) -> None:
        size = _message_bytes(channel)
        self.link_bytes += size
        if up:
            self.d2h_bytes += size
        else:
            self.h2d_bytes += size
        self.data_lines += channel == "data"

    def d2h(self, channel: str, fields: dict, cycle: int) -> None:
        self._count(channel, up=True)
        if self.link is not None:
            cycle = self.link.up.send(cycle, _message_bytes(channel))
        self.home.d2h(channel, cycle, fields)

    def device_reset(self) -> None:
        """The device is in reset: the home forgets what is in flight, and so does the
        link (its messages are lost)."""
        self.home.reset()
        for flight in self._flight.values():
            flight.clear()

    # --- GPU memory ---------------------------------------------------------------------
    def read(self, line: int) -> bytes:
        """GPU memory line ``line`` (host line address) as 64 bytes."""
        return _bytes(self.home.read_line(line))

    def write(self, line: int, data: bytes) -> None:
        """The GPU writes a whole line of its own memory (now, in the home's order)."""
        value = int.from_bytes(data, "little")
        self.home.read_line(line)
        self.home.mem[line] = value
        self.home.history[line].append((self.loop.cycle, value))

    def read_bytes(self, addr: int, nbytes: int) -> bytes:
        first, last = addr // LINE_BYTES, (addr + nbytes - 1) // LINE_BYTES
        raw = b"".join(self.read(x) for x in range(first, last + 1))
        off = addr - first * LINE_BYTES
        return raw[off:off + nbytes]

    def write_bytes(self, addr: int, data: bytes) -> None:
        assert addr % LINE_BYTES == 0 and len(data) % LINE_BYTES == 0, "whole lines only"
        for i in range(len(data) // LINE_BYTES):
            self.write(addr // LINE_BYTES + i, data[i * LINE_BYTES:(i + 1) * LINE_BYTES])

    @property
    def gpu_memory(self) -> dict[int, int]:
        """Line -> 512-bit value of every GPU line read or written so far."""
        return self.home.mem

    @staticmethod
    def background(line: int) -> bytes:
        return _bytes(background_line(line))


class CoherentHostAgent(HostAgent):
    """:class:`HostAgent` for a device with the DCOH enabled (``COH_CTRL.HDM_D``).

    Differences: tags of the host's own requests stay clear of the 12-bit CQID space
    (a forward's Tag is the DCOH's CQID, reused as soon as the DCOH frees it, so it
    must never collide with a tag in flight); MemRdFwd / MemWrFwd are routed to the
    DCOH and set no ERR_STATUS bit; a forward sent as the answer of a D2H request
    (``answer=True``) goes to the protocol checker at its handshake; the M2S router may
    take a Req and an RwD in one cycle (the two channels are independent; the host
    never has both for one line in flight, see :class:`HostCache`).
    """

    coherent = True

    def _alloc_tag(self) -> int:
        while True:
            tag = self.rng.randrange(1 << 12, 1 << 16)
            if tag not in self._pending and tag not in self._quarantine:
                return tag

    def forward(self, opcode: int, line: int, cqid: int, *, answer: bool = False) -> Txn:
        """Queue an M2S MemRdFwd / MemWrFwd (or any opcode, for bad input) with Tag
        ``cqid`` for host line ``line``; ``answer``: the table's answer to the D2H
        request ``cqid`` (checked by :attr:`protocol` when it is taken)."""
        self._quarantine.pop(cqid, None)
        self._recent.pop(cqid, None)
        txn = self.send_req(opcode, line, tag=cqid, meta_field=MetaField.NoOp,
                            meta_value=MetaValue.Invalid)
        txn.answer = answer
        return txn

    def _expect_req(self, txn: Txn) -> None:
        super()._expect_req(txn)
        if self.coherent and txn.opcode in _FWD_OPS:
            txn.err_bits = 0

    def _accepted(self, queue, tag: int, cycle: int) -> None:
        if self.coherent:
            self._last_accept = -1
        txn = queue[0]
        super()._accepted(queue, tag, cycle)
        if txn.answer:
            self.protocol.see("m2s_req", txn.fields, cycle)


class LineLocks:
    """FIFO lock per line: the host handles one operation per line at a time."""

    def __init__(self):
        self._held: dict[int, deque[Event]] = {}

    def locked(self, line: int) -> bool:
        return line in self._held

    def try_acquire(self, line: int) -> bool:
        if line in self._held:
            return False
        self._held[line] = deque()
        return True

    async def acquire(self, line: int) -> None:
        if self.try_acquire(line):
            return
        ev = Event()
        self._held[line].append(ev)
        await ev.wait()

    def release(self, line: int) -> None:
        waiters = self._held[line]
        if waiters:
            waiters.popleft().set()         # ownership passes to the next waiter
        else:
            del self._held[line]

    def busy(self) -> int:
        return len(self._held)


class CoherenceChecker:
    """Coherence rules for device lines, checked at every transfer the host sees.

    State per device line (PMEM line index): the host cache's MESI state (from
    :class:`HostCache`), the device's permissions the host has granted by forwards
    (``"R"`` after the MemRdFwd of a read, ``"W"`` after the MemRdFwd of a write (RdOwn)
    or of a claim), and per page whether a flip to device bias has completed. A host MemRd
    that completes (its host check drained the device's accesses to the page and
    flipped it back) ends every such permission of the line and its page's device
    bias. The coherent value of a line is the last write in coherence order: a host
    store (into E or M), or a device write (reported by the driver when its descriptor
    completes, :meth:`device_wrote`).

    Rules (each counted in :attr:`checks`):

    1. A forward for a read leaves only while the host holds no dirty copy; one for a
       write or a claim only while it holds no copy (single writer).
    2. A host store happens only in E or M, with no device permission and no device-bias
       page live for the line; a host MemRd completes granting E only when it asked for
       it (MetaValue Any), S or E for a load (single writer / multiple readers).
    3. Every value the host reads (cache hit or MemRd data) equals the coherent value.
    4. A device write was permitted: a write's forward, a claim or device bias for its line
       since the host last took it back.
    5. A flip to device bias that reports success leaves the host holding no line of its
       pages.
    6. At the end, a host copy equals the coherent value and PMEM holds it too unless
       the copy is dirty.

    ``initial(dev_line) -> bytes`` gives a line's value before any write the checker saw.
    """

    def __init__(self, *, lines_per_page: int, initial: Callable[[int], bytes]):
        self.lpp = lines_per_page
        self.initial = initial
        self.value: dict[int, bytes] = {}
        self.state: dict[int, str] = {}         # host MESI state, "I" when absent
        self.perm: dict[int, str] = {}          # "R" / "W" forwarded to the device
        self.device_pages: set[int] = set()     # pages flipped to device bias
        self.acquired: dict[int, int] = {}      # page -> cycle of the last host MemRd
        #: Rule 4 applies (COH_CTRL.HDM_D = 1); without it the driver orders host and
        #: device accesses itself (write-back before the doorbell).
        self.hdm_d = True
        self.checks = 0

    def _fail(self, message: str) -> None:
        raise AssertionError(f"coherence: {message}")

    def coherent(self, line: int) -> bytes:
        v = self.value.get(line)
        if v is None:
            v = self.value[line] = self.initial(line)
        return v

    def device_reset(self) -> None:
        """The device was reset: every permission forwarded to it and every device-bias
        page ends (its bias table comes out of reset in host bias). The host's copies
        and the coherent values stay."""
        self.perm.clear()
        self.device_pages.clear()

    def _device_may_write(self, line: int) -> bool:
        return self.perm.get(line) == "W" or line // self.lpp in self.device_pages

    # --- host side ----------------------------------------------------------------------
    def forward(self, line: int, kind: str, t: int) -> None:
        """The host sends the forward of a D2H request: ``kind`` "read" / "write" /
        "claim"."""
        st = self.state.get(line, "I")
        if kind == "read":
            if st == "M":
                self._fail(f"cycle {t}: MemRdFwd of line {line:#x} while the host holds it M")
            if self.perm.get(line) != "W":
                self.perm[line] = "R"
        else:
            if st != "I":
                self._fail(f"cycle {t}: {kind} forward of line {line:#x} while the host holds "
                           f"it {st}")
            self.perm[line] = "W"
        self.checks += 1

    def host_granted(self, line: int, state: str, want: str, t: int) -> None:
        """A host MemRd (or a MemInv claim) completed, granting ``state`` ("S"/"E");
        ``want`` the MetaValue asked ("S" load, "E" store)."""
        if state not in (("S", "E") if want == "S" else ("E",)):
            self._fail(f"cycle {t}: MemRd of line {line:#x} asking {want} granted {state}")
        self.perm.pop(line, None)
        self.device_pages.discard(line // self.lpp)
        self.acquired[line // self.lpp] = t
        self.state[line] = state
        self.checks += 1

    def host_state(self, line: int, state: str) -> None:
        if state == "I":
            self.state.pop(line, None)
        else:
            self.state[line] = state

    def host_read(self, line: int, data: bytes, how: str, t: int) -> None:
        want = self.coherent(line)
        if data != want:
            diff = next(i for i in range(LINE_BYTES) if data[i] != want[i])
            self._fail(f"cycle {t}: {how} of line {line:#x} returned a value that is not the "
                       f"last write in coherence order (first difference at byte {diff}: "
                       f"got {data[diff:diff + 8].hex()} want {want[diff:diff + 8].hex()})")
        self.checks += 1

    def host_store(self, line: int, data: bytes, t: int) -> None:
        st = self.state.get(line, "I")
        if st not in ("E", "M"):
            self._fail(f"cycle {t}: store to line {line:#x} in state {st}")
        if self.perm.get(line) is not None or line // self.lpp in self.device_pages:
            self._fail(f"cycle {t}: store to line {line:#x} while the device may access it "
                       f"({self.perm.get(line) or 'device bias'})")
        self.state[line] = "M"
        self.value[line] = data
        self.checks += 1

    # --- device side --------------------------------------------------------------------
    def device_wrote(self, line: int, data: bytes, what: str) -> None:
        if self.hdm_d and not self._device_may_write(line):
            self._fail(f"the device wrote line {line:#x} ({what}) without a write forward, a claim "
                       f"or device bias since the host last held it")
        if self.state.get(line, "I") != "I":
            self._fail(f"the device wrote line {line:#x} ({what}) while the host holds it "
                       f"{self.state[line]}")
        self.value[line] = data
        self.checks += 1

    def device_read_checked(self, n: int = 1) -> None:
        """``n`` device reads were checked through their results (LOOKUP outputs, slots)."""
        self.checks += n

    def flip_done(self, first: int, pages: int, *, to_host: bool, ok: bool,
                  t_start: int) -> None:
        """A flip command started in cycle ``t_start`` has reported done. A page the host
        took a line of since then may have been contended or flipped back at once: it
        is not known to be in device bias."""
        for page in range(first, first + pages):
            if to_host:
                self.device_pages.discard(page)
                continue
            if not ok or self.acquired.get(page, -1) >= t_start:
                continue
            held = [x for x in range(page * self.lpp, (page + 1) * self.lpp)
                    if self.state.get(x, "I") != "I"]
            if held:
                self._fail(f"flip of page {page} to device bias succeeded while the host "
                           f"holds lines {[hex(x) for x in held[:4]]}")
            self.device_pages.add(page)
            self.checks += 1


class HostCache:
    """The GPU's write-back MESI cache of device lines, and the host side of the DCOH.

    Loads and stores (whole lines or byte-enabled parts) are coroutines; each waits for
    the line's lock, so operations on a line (the host's own and the DCOH's requests)
    happen one at a time in arrival order. A miss sends MemRd (Meta0-State, MetaValue
    Shared for a load, Any for a store) and installs the line in the state the NDR
    grants (Cmp-S -> S, Cmp-E -> E); a store makes the line M. A whole-line store that
    misses may instead claim the line without its data (probability ``claim_full``):
    MemInv or MemInvNT with Meta0-State Any, completed by Cmp-E; like a read, the claim
    of a line of a device-bias page flips that page back to host bias first (the M2S
    router's host check). Beyond ``capacity``
    lines a random unlocked victim is evicted (dirty: MemWr with MetaValue Invalid;
    clean: dropped silently, which CXL allows).

    The DCOH's D2H requests for device lines (:meth:`d2h_req`) are handled ``latency``
    cycles after their transfer, behind the line's lock: write back a dirty copy and
    wait for its Cmp, downgrade to S (read) or drop the copy (RdOwn, RdOwnNoData), then
    answer with a flow of the request's row in the protocol table
    (:mod:`tb.cxl_protocol`), chosen at random among the good ones: MemRdFwd (queued on
    CXL.mem, so that later host requests of the line stay behind it), or GO-E on H2D
    Rsp for a claim (the line stays locked until the device has taken it). The request
    and the answer go through the agent's :attr:`~tb.host_agent.HostAgent.protocol`
    checker, so a D2H request outside the table fails at once.

    Hooks: ``faults(fields) -> [(M2S opcode, host line), ...]`` puts bad forwards with
    the request's Tag before the answer (each taken before the next), outside the
    table; ``h2d_faults(fields) -> [(channel, H2D fields), ...]`` does the same with H2D
    Rsp / Data messages (on ``h2d``); ``answer(fields) -> flow name | None`` picks the
    answer (``"go_err"``, ``"data_go_err"``, ...) instead of a random one;
    ``error_rate`` is the probability that the random answer is one of the table's
    error answers (GO-Err on H2D Rsp, or for a read H2D Data with GO-Err). The host
    writes back and gives up (or keeps clean) its copy before any answer, so an error
    answer leaves device memory coherent whatever the device then does.
    ``h2d(channel, fields, checked=True) -> message`` queues an H2D Rsp / Data (shown to
    the protocol checker unless ``checked`` is false; the message's ``taken`` is set at
    its transfer); without it only the CXL.mem answers are used.

    Members
    -------
    lines:
        Host line -> ``[state, bytes]`` of each cached line (``state`` "S", "E", "M").
    stats:
        Counters: hits, misses, writebacks, forwards per kind, evictions.
    """

    def __init__(self, agent: CoherentHostAgent, checker: CoherenceChecker, loop, *,
                 rng: random.Random, capacity: int = 512, latency: int = 10,
                 jitter: int = 0, claim_full: float = 0.0,
                 log: logging.Logger | None = None):
        self.agent = agent
        self.checker = checker
        self.loop = loop
        self.rng = rng
        self.capacity = capacity
        self.latency = latency
        self.jitter = jitter
        self.claim_full = claim_full
        self.log = log or logging.getLogger("cocotb.host_cache")
        self.lines: dict[int, list] = {}
        self.locks = LineLocks()
        self.faults: Callable[[dict], list[tuple[int, int]]] | None = None
        self.h2d_faults: Callable[[dict], list[tuple[str, dict]]] | None = None
        self.answer: Callable[[dict], str | None] | None = None
        self.error_rate = 0.0
        self.h2d: Callable[[str, dict], object] | None = None
        self.protocol = agent.protocol
        #: Answers sent, by request and flow of the protocol table ("RdOwn:mem_rd_fwd").
        self.answers: dict[str, int] = {}
        self.stats = dict.fromkeys(("hits", "misses", "claims", "writebacks", "evictions",
                                    "fwd_read", "fwd_write", "fwd_claim"), 0)
        self.open_fwds = 0
        self._tasks = 0
        self._epoch = 0     # device resets so far: a forward is for its own epoch only

    def dev(self, line: int) -> int:
        return self.agent.decode(line)

    # --- host accesses ------------------------------------------------------------------
    async def load(self, line: int) -> bytes:
        """Read host line ``line`` through the cache."""
        await self.locks.acquire(line)
        try:
            entry = self.lines.get(line)
            if entry is not None:
                self.stats["hits"] += 1
                self.checker.host_read(self.dev(line), entry[1], "cache hit", self.loop.cycle)
                return entry[1]
            data = await self._fill(line, "S")
            return data
        finally:
            self.locks.release(line)

    async def store(self, line: int, data: bytes, byte_enable: int | None = None) -> None:
        """Write (part of) host line ``line`` into the cache; it stays dirty."""
        await self.locks.acquire(line)
        try:
            entry = self.lines.get(line)
            if entry is None or entry[0] == "S":
                if self.lines.pop(line, None) is not None:
                    self.checker.host_state(self.dev(line), "I")    # dropped for the fill
                if byte_enable is None and self.rng.random() < self.claim_full:
                    await self.claim(line, nt=self.rng.random() < 0.5)
                else:
                    await self._fill(line, "E")
                entry = self.lines[line]
            else:
                self.stats["hits"] += 1
            if byte_enable is not None:
                old = entry[1]
                data = bytes(data[i] if byte_enable >> i & 1 else old[i]
                             for i in range(LINE_BYTES))
            entry[0], entry[1] = "M", bytes(data)
            self.checker.host_store(self.dev(line), entry[1], self.loop.cycle)
        finally:
            self.locks.release(line)

    async def _fill(self, line: int, want: str) -> bytes:
        self.stats["misses"] += 1
        mv = MetaValue.Shared if want == "S" else MetaValue.Any
        await self._link_up()
        txn = self.agent.read(line, meta_value=mv, meta_field=MetaField.Meta0State)
        await txn
        if txn.abandoned:
            raise LostToReset(f"MemRd of line {line:#x} lost to a reset")
        state = "E" if txn.ndr["opcode"] == NDROpcode.CmpE.value else "S"
        dev = self.dev(line)
        t = self.loop.cycle
        self.checker.host_granted(dev, state, want, t)
        self.checker.host_read(dev, txn.read_data, "MemRd data", t)
        self.lines[line] = [state, txn.read_data]
        self._make_room(line)
        return txn.read_data

    async def claim(self, line: int, *, nt: bool = False) -> None:
        """Take ownership of host line ``line`` without its data (the caller overwrites
        it whole and holds the line's lock): MemInv (MemInvNT with ``nt``) with
        Meta0-State Any, which the device completes with Cmp-E only after any
        device-bias page of the line is back in host bias."""
        self.stats["claims"] += 1
        await self._link_up()
        txn = self.agent.inv(line, meta_value=MetaValue.Any, meta_field=MetaField.Meta0State,
                             nt=nt)
        await txn
        if txn.abandoned:
            raise LostToReset(f"MemInv of line {line:#x} lost to a reset")
        self.checker.host_granted(self.dev(line), "E", "E", self.loop.cycle)
        self.lines[line] = ["E", bytes(LINE_BYTES)]     # no data: the store overwrites it
        self._make_room(line)

    def _make_room(self, keep: int) -> None:
        while len(self.lines) > self.capacity:
            victims = [x for x in self.lines if x != keep and not self.locks.locked(x)]
            if not victims:
                return
            victim = self.rng.choice(victims)
            self.locks.try_acquire(victim)
            self.stats["evictions"] += 1
            self._spawn(self._evict(victim))

    async def _evict(self, line: int) -> None:
        try:
            await self._write_back(line, keep=False)
        except LostToReset:
            pass            # the line stays cached, dirty
        finally:
            self.locks.release(line)

    async def _link_up(self) -> None:
        """A request waits while the device is in reset (the link is down)."""
        if self.agent.in_reset:
            await self.loop.wait_until(lambda: not self.agent.in_reset, timeout=100_000,
                                       what="device out of reset")

    def device_reset(self) -> None:
        """The device is being reset (call before the reset): the DCOH's requests
        received so far get no forward (the DCOH forgets them), whether they are waiting
        for their delay, their line's lock or their write-back. Operations whose
        CXL.mem request the reset loses raise :class:`LostToReset` (a lost fill installs
        nothing; a lost write-back leaves the line cached and dirty)."""
        self._epoch += 1
        self.open_fwds = 0

    async def _write_back(self, line: int, *, keep: bool) -> None:
        """Write a dirty copy back (waiting for its Cmp), then keep it clean as S
        (``keep``) or drop it. The caller holds the line's lock."""
        entry = self.lines.get(line)
        if entry is not None and entry[0] == "M":
            mv = MetaValue.Shared if keep else MetaValue.Invalid
            await self._link_up()
            txn = self.agent.write(line, entry[1], meta_field=MetaField.Meta0State,
                                   meta_value=mv)
            self.stats["writebacks"] += 1
            await txn
            if txn.abandoned:
                raise LostToReset(f"write-back of line {line:#x} lost to a reset")
        dev = self.dev(line)
        if entry is None:
            return
        if keep:
            entry[0] = "S"
            self.checker.host_state(dev, "S")
        else:
            del self.lines[line]
            self.checker.host_state(dev, "I")

    async def flush(self, lines=None) -> None:
        """Write back and drop ``lines`` (default: every cached line)."""
        todo = list(self.lines) if lines is None else [x for x in lines if x in self.lines]
        tasks = []
        for line in todo:
            await self.locks.acquire(line)
            tasks.append(cocotb.start_soon(self._evict(line)))
        for task in tasks:
            await task

    def _spawn(self, coro) -> None:
        self._tasks += 1

        async def run():
            try:
                await coro
            finally:
                self._tasks -= 1
        cocotb.start_soon(run())

    async def idle(self, timeout: int = 200_000) -> None:
        await self.loop.wait_until(lambda: not self._tasks and not self.locks.busy(),
                                   timeout=timeout, what="host cache idle")

    # --- the DCOH's requests --------------------------------------------------------------
    def d2h_req(self, fields: dict, cycle: int) -> None:
        """A D2H Req for a device line (from the DCOH), transferred in ``cycle``."""
        cqid = fields["cqid"]
        if fields["nt"] or fields["rsvd0"] or fields["rsvd1"]:
            raise AssertionError(f"cycle {cycle}: D2H Req with NT or reserved bits: {fields}")
        if cqid < DCOH_CQID_BASE:
            raise AssertionError(f"cycle {cycle}: DCOH request with cache-agent CQID {cqid}")
        if self.agent.in_reset:
            return      # taken at the edge that reset the DCOH: it forgot the request
        self.protocol.request("d2h_req", fields, cycle, target="device")
        self.open_fwds += 1
        self._spawn(self._forward(fields, self._epoch))

    async def _forward(self, f: dict, epoch: int) -> None:
        delay = self.latency + (self.rng.randint(0, self.jitter) if self.jitter else 0)
        if delay:
            await self.loop.wait_cycles(delay)
        line, op, cqid = f["address"], f["opcode"], f["cqid"]
        await self.locks.acquire(line)
        try:
            read = op in _READS
            # A reset since the request (device_reset, before it) ends it: the DCOH
            # forgot it. While the device is in reset no request is current.
            if epoch != self._epoch:
                return
            try:
                await self._write_back(line, keep=read)
            except LostToReset:
                return
            if epoch != self._epoch:
                return
            kind = "read" if read else "write" if op == D2HReqOpcode.RdOwn.value else "claim"
            flow = self._choose(f)
            for bad_op, bad_line in (self.faults(f) if self.faults else ()):
                # A bad forward with the request's Tag, taken before the answer.
                bad = self.agent.forward(bad_op, bad_line, cqid)
                await self.loop.wait_until(lambda b=bad: b.accepted is not None,
                                           timeout=100_000, what="bad forward taken")
            for channel, bad_h2d in (self.h2d_faults(f) if self.h2d_faults else ()):
                bad = self.h2d(channel, bad_h2d, checked=False)
                await self.loop.wait_until(lambda b=bad: b.taken is not None,
                                           timeout=100_000, what="bad H2D message taken")
            self.checker.forward(self.dev(line), kind, self.loop.cycle)
            (msg,) = flow.host_msgs()
            if msg.channel == "m2s_req":
                self.agent.forward(min(msg.opcodes), line, cqid, answer=True)
                sent = None
            else:
                extra = {"data": ALL_ONES, "poison": 0} if msg.channel == "h2d_data" else {}
                sent = self.h2d(msg.channel, msg.build({"cqid": cqid}, **extra))
            self.stats[f"fwd_{kind}"] += 1
            key = f"{D2HReqOpcode(op).name}:{flow.name}"
            self.answers[key] = self.answers.get(key, 0) + 1
            self.open_fwds -= 1
            if sent is not None:
                # Later host requests of the line wait until the device has the answer.
                await self.loop.wait_until(
                    lambda: sent.taken is not None or epoch != self._epoch,
                    timeout=100_000, what=f"{flow.name} for CQID {cqid} taken")
        finally:
            self.locks.release(line)

    def _choose(self, f: dict) -> Flow:
        """The answer to D2H request ``f``: the ``answer`` hook's, else a random error
        flow with probability ``error_rate``, else a random good one."""
        r = row("d2h_req", f["opcode"], "device")
        name = self.answer(f) if self.answer else None
        if name is not None:
            return r.flow(name)
        channels = ("m2s_req", "h2d_rsp", "h2d_data") if self.h2d else ("m2s_req",)
        error = self.h2d is not None and self.rng.random() < self.error_rate
        return pick(self.rng, r, error=error, channels=channels)

    # --- end of test ---------------------------------------------------------------------
    def check_final(self, pmem_line: Callable[[int], bytes]) -> int:
        """Rule 6 for every line the checker knows; returns the number of lines checked."""
        n = 0
        for dev, value in sorted(self.checker.value.items()):
            host = self.agent.host_line(dev)
            entry = self.lines.get(host)
            if entry is not None:
                assert entry[1] == value, f"host copy of device line {dev:#x} is stale"
            if entry is None or entry[0] != "M":
                assert pmem_line(dev) == value, (
                    f"PMEM line {dev:#x} does not hold the last write in coherence order")
            n += 1
        return n


def attach_gpu_memory(tb, platform, *, noise: bool) -> GpuHome:
    """GPU memory on the device's CXL.cache ports, behind the bench's link: the home of
    the scratch buffers (``docs/platform.md``, "GPU memory"). It answers a read after
    the platform's GPU memory latency and pulls a write's data at once; with ``noise``
    it adds jitter, answers in random order and splits some write answers."""
    gpu = None

    def d2h(channel: str, fields: dict, cycle: int) -> None:
        gpu.d2h(channel, fields, cycle)

    bfm = CxlCacheBfm(tb.dut, tb.loop, rng=tb.rng, idle=tb.idle,
                      backpressure=tb.backpressure, on_d2h=d2h)
    timing = HomeTiming(read_latency=platform.gpu_memory_cycles, write_latency=1,
                        jitter=8 if noise else 0, reorder=noise,
                        split_writes=0.3 if noise else 0.0)
    gpu = GpuHome(bfm, tb.loop, rng=tb.rng, timing=timing, link=tb.link)

    def reset() -> None:
        bfm.device_reset()
        gpu.device_reset()

    tb.reset_hooks.append(reset)
    return gpu
