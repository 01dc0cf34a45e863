"""PMEM model: an AXI4 subordinate with media timing, persistence and power failure.

Two layers (``docs/architecture.md``; the formulas are in ``docs/pmem-model.md``):

* :class:`PmemModel`, plain Python with no simulator import: the AXI4 transaction
  semantics, the media timing model, the sparse persistent image, durability at the B
  response and power-failure injection. It is stepped by cycle numbers that its caller
  passes in, so unit tests and benchmarks drive it directly.
* :class:`PmemAxi`, the cocotb adapter: an agent of the bench's
  :class:`~tb.cycle.CycleLoop` that maps the model onto the ``pmem__*`` signals
  (names from :class:`hw.bus.axi.AXI4Signature`), with random backpressure and idle
  cycles and a protocol checker on all five channels.

The cocotb import is deferred to :class:`PmemAxi`, so ``import tb.pmem`` works without a
simulator.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction

from hw.bus.axi import AxiBurst, AxiResp

__all__ = [
    "LINE_BYTES", "AxiProtocolError", "PmemAxi", "PmemModel", "PmemStats", "PmemTiming",
    "PowerFailReport", "WriteFate", "strb_mask",
]

LINE_BYTES = 64
#: AXI ``size`` code of a 64-byte beat (2**6 bytes), the only beat size supported.
SIZE_LINE = 6
_FULL_STRB = (1 << LINE_BYTES) - 1
#: 8 strobe bits -> 64-bit byte mask.
_STRB8 = [sum(0xFF << (8 * i) for i in range(8) if s >> i & 1) for s in range(256)]
_READ, _WRITE = 0, 1


def strb_mask(strb: int) -> int:
    """The 512-bit data mask of 64 byte strobes."""
    if strb == _FULL_STRB:
        return (1 << 512) - 1
    mask = 0
    for j in range(8):
        byte = strb >> (8 * j) & 0xFF
        if byte:
            mask |= _STRB8[byte] << (64 * j)
    return mask


class AxiProtocolError(Exception):
    """The manager broke an AXI4 rule, or used a feature the model does not support."""


@dataclass(frozen=True, kw_only=True)
class PmemTiming:
    """Timing parameters of the PMEM model (cycles of the device clock).

    Parameters
    ----------
    read_latency:
        Cycles from the start of a media read to the first R beat being valid.
    write_latency:
        Cycles from the start of a media write to the B response being valid.
    peak_lines_per_cycle:
        Aggregate media bandwidth in 64-byte lines per cycle (the AXI port itself moves
        at most one line per cycle per direction).
    channels:
        Media channels, interleaved on ``media_bytes`` blocks.
    media_bytes:
        Media access granularity (a power of two, 64 to 4096 bytes).
    jitter:
        Random extra latency, 0 to ``jitter`` cycles, drawn per request.
    write_bandwidth_ratio:
        Media write bandwidth as a fraction of the read bandwidth
        ``peak_lines_per_cycle`` (1.0: symmetric; persistent media write several times
        slower than they read, ``docs/platform.md``): a block write occupies its channel
        ``1 / write_bandwidth_ratio`` times as long as a block read.
    """

    read_latency: int = 120
    write_latency: int = 40
    peak_lines_per_cycle: float = 1.0
    channels: int = 1
    media_bytes: int = 256
    jitter: int = 0
    write_bandwidth_ratio: float = 1.0

    def __post_init__(self) -> None:
        for name in ("read_latency", "write_latency", "channels", "media_bytes", "jitter"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, not {value!r}")
        if self.read_latency < 1:
            raise ValueError(f"read_latency must be at least 1, not {self.read_latency}")
        if self.write_latency < 1:
            raise ValueError(f"write_latency must be at least 1, not {self.write_latency}")
        peak = self.peak_lines_per_cycle
        if isinstance(peak, bool) or not isinstance(peak, int | float | Fraction) or not peak > 0:
            raise ValueError(f"peak_lines_per_cycle must be a positive number, not {peak!r}")
        if self.channels < 1:
            raise ValueError(f"channels must be at least 1, not {self.channels}")
        mb = self.media_bytes
        if mb < LINE_BYTES or mb > 4096 or mb & (mb - 1):
            raise ValueError(f"media_bytes must be a power of two from 64 to 4096, not {mb}")
        if self.jitter < 0:
            raise ValueError(f"jitter must be non-negative, not {self.jitter}")
        ratio = self.write_bandwidth_ratio
        if (isinstance(ratio, bool) or not isinstance(ratio, int | float | Fraction)
                or not 0 < ratio <= 1):
            raise ValueError(f"write_bandwidth_ratio must be a number in (0, 1], not {ratio!r}")

    @property
    def block_cycles(self) -> Fraction:
        """Media time of one block access on its channel:
        ``media_bytes / 64 * channels / peak_lines_per_cycle``."""
        peak = Fraction(self.peak_lines_per_cycle).limit_denominator(1 << 20)
        return Fraction(self.media_bytes // LINE_BYTES * self.channels) / peak

    @classmethod
    def from_platform(cls, platform, *, jitter: int = 0) -> PmemTiming:
        """The media timing of a :class:`sim.platform.Platform` in its device cycles."""
        return cls(read_latency=platform.pmem_read_cycles,
                   write_latency=platform.pmem_write_cycles,
                   peak_lines_per_cycle=platform.pmem_read_lines_per_cycle,
                   channels=platform.pmem_channels, media_bytes=platform.pmem_media_bytes,
                   jitter=jitter,
                   write_bandwidth_ratio=(platform.pmem_write_bytes_per_s
                                          / platform.pmem_read_bytes_per_s))

    @property
    def write_block_cycles(self) -> Fraction:
        """Media time of one block write: ``block_cycles / write_bandwidth_ratio``."""
        ratio = Fraction(self.write_bandwidth_ratio).limit_denominator(1 << 20)
        return self.block_cycles / ratio


@dataclass
class PmemStats:
    """Counters for benchmarks (cycles are the caller's cycle numbers).

    Members
    -------
    reads, writes:
        Requests accepted (AR, AW).
    lines_read, lines_written:
        Beats answered OKAY (R beats presented; lines of writes made durable).
    media_accesses, buffer_hits:
        Line accesses that took a media slot, and those served by a channel's buffer.
    media_reads, media_writes:
        ``media_accesses`` split by direction (reads + writes == media_accesses).
    media_busy:
        Media busy cycles per channel.
    read_latency:
        Per read burst: AR accepted -> first R beat valid.
    write_latency:
        Per write burst: later of AW accepted and last W beat -> B valid.
    decerr:
        Requests answered DECERR.
    """

    reads: int = 0
    writes: int = 0
    lines_read: int = 0
    lines_written: int = 0
    media_accesses: int = 0
    buffer_hits: int = 0
    media_reads: int = 0
    media_writes: int = 0
    decerr: int = 0
    media_busy: list[float] = field(default_factory=list)
    read_latency: list[int] = field(default_factory=list)
    write_latency: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """Totals and latency mean/max, for reports."""
        def mean(xs):
            return sum(xs) / len(xs) if xs else 0.0
        return {
            "reads": self.reads, "writes": self.writes, "lines_read": self.lines_read,
            "lines_written": self.lines_written, "media_accesses": self.media_accesses,
            "buffer_hits": self.buffer_hits, "decerr": self.decerr,
            "media_reads": self.media_reads, "media_writes": self.media_writes,
            "media_busy": float(sum(self.media_busy)),
            "read_latency_mean": mean(self.read_latency),
            "read_latency_max": max(self.read_latency, default=0),
            "write_latency_mean": mean(self.write_latency),
            "write_latency_max": max(self.write_latency, default=0),
        }


@dataclass(frozen=True)
class WriteFate:
    """What a power failure did to one accepted-but-unacknowledged write.

    ``outcome`` is ``"dropped"``, ``"applied"`` or ``"torn"``. ``words`` lists the byte
    addresses of the 8-byte words a torn write applied (under its strobes);
    ``candidate_words`` counts the words it had strobes in. ``beats_received`` may be
    fewer than ``beats`` when W data was still arriving.
    """

    id: int
    addr: int
    beats: int
    beats_received: int
    outcome: str
    words: tuple[int, ...] = ()
    candidate_words: int = 0


@dataclass(frozen=True)
class PowerFailReport:
    """Returned by :meth:`PmemModel.power_fail` and :meth:`PmemModel.reset`."""

    cycle: int | None
    writes: tuple[WriteFate, ...]
    reads_lost: int
    orphan_w_beats: int

    def count(self, outcome: str) -> int:
        return sum(1 for w in self.writes if w.outcome == outcome)


class _Read:
    __slots__ = ("accepted", "addr", "beat", "beats", "id", "next", "resp", "seq", "start")

    def __init__(self, seq, rid, addr, beats, accepted):
        self.seq, self.id, self.addr, self.beats, self.accepted = seq, rid, addr, beats, accepted
        self.start = 0
        self.next = 0          # next beat to present
        self.beat = None       # the presented beat (id, data, resp, last)
        self.resp: list[int] = []


class _Write:
    __slots__ = ("addr", "aw_cycle", "beats", "complete", "data", "id", "ready", "resp", "seq")

    def __init__(self, seq, wid, addr, beats, aw_cycle):
        self.seq, self.id, self.addr, self.beats, self.aw_cycle = seq, wid, addr, beats, aw_cycle
        self.data: list[tuple[int, int]] = []
        self.complete: int | None = None   # cycle of the later of AW and last W
        self.ready = 0
        self.resp = AxiResp.OKAY


class PmemModel:
    """Persistent memory behind an AXI4 subordinate port, 64-byte beats.

    **Timing.** Each media channel serves block accesses (``media_bytes``, interleaved
    over channels: ``channel = (addr // media_bytes) % channels``). One block access
    occupies its channel for ``T = media_bytes/64 * channels / peak_lines_per_cycle``
    cycles (a block write ``T / write_bandwidth_ratio``); accesses queue first come,
    first served (``start = max(arrival,
    channel_free)``), reads and writes sharing the channel. A line whose block equals
    the channel's most recent block access in the same direction, arriving before that
    access's slot ends (``arrival < start + T``), is a buffer hit: no media time, and
    it completes with that access. So sequential whole-block traffic reaches
    ``peak_lines_per_cycle`` while random single-line reads reach a quarter of it (with
    256-byte blocks). A read line is ready at ``start + read_latency``; the first beat
    of a read burst is valid at ``max_k(ready_k - k) + jitter``, so its beats then
    stream without gaps. A write starts its media accesses when AW and the last W beat
    are both in; B is valid at ``max_k(ready_k) + jitter`` with ready = ``start +
    write_latency``. An isolated one-block access therefore takes exactly
    ``read_latency`` (AR accepted -> first R valid) or ``write_latency`` (last of
    AW/W -> B valid). Bursts reaching beyond ``size`` take no media time and answer
    DECERR one cycle after acceptance (R data zero; a DECERR write writes nothing).

    **Ordering.** Responses of one ID leave in request order; responses of different
    IDs leave by ready time (ties in request order), so jitter reorders them. R beats
    of one burst are presented back to back, bursts never interleave, and at most one
    R beat and one B are presented per cycle.

    **Persistence.** The image holds exactly the durable state. A write is applied when
    its B response is first presented (:meth:`b_resp`), before the manager can see
    it. Reads return the image at the cycle each beat is presented, so a read accepted
    after a B sees that write.

    **Power failure.** :meth:`power_fail` drops, applies or tears (per 8-byte word,
    under the strobes) every accepted write not yet acknowledged, loses every read,
    and stops the model until :meth:`power_on`. :meth:`reset` (a manager reset without
    power loss) loses reads and applies pending writes without responses.

    **Read faults** (opt-in, for tests of a manager's error handling): every R beat of a
    line whose number (``addr // 64``) is in :attr:`read_error_lines` when the beat is
    first presented answers SLVERR with zero data, taking its media time as usual. The
    set is empty by default and the tests own it (power failure and reset leave it).

    Parameters
    ----------
    size:
        Bytes of memory; beats at or above it answer DECERR (multiple of 64).
    timing:
        A :class:`PmemTiming`.
    rng:
        Seeded random generator for jitter and the default power-failure choices.
    check_4k:
        Reject bursts crossing a 4 KiB boundary (an AXI4 rule for the manager).

    Raises
    ------
    AxiProtocolError:
        From the ``accept_*`` methods on a burst type other than INCR, a beat size
        other than 64 bytes, a 4 KiB crossing, or ``wlast`` on the wrong beat.
    """

    def __init__(self, *, size: int, timing: PmemTiming | None = None,
                 rng: random.Random | None = None, check_4k: bool = True):
        if not isinstance(size, int) or size <= 0 or size % LINE_BYTES:
            raise ValueError(f"size must be a positive multiple of 64 bytes, not {size!r}")
        self.size = size
        self.timing = timing if timing is not None else PmemTiming()
        self.rng = rng if rng is not None else random.Random(0)
        self.check_4k = check_4k
        t = self.timing
        # Media time of a block access per direction (read, write); integer arithmetic
        # in the common case, Fractions only for odd bandwidths.
        self._block_cycles = tuple(int(b) if b.denominator == 1 else b
                                   for b in (t.block_cycles, t.write_block_cycles))
        self._latency = (t.read_latency, t.write_latency)
        self._blk_shift = t.media_bytes.bit_length() - 1
        self._channels = t.channels
        self._storage: dict[int, int] = {}
        self.stats = PmemStats(media_busy=[0] * t.channels)
        self._free = [0] * t.channels
        self.powered = True
        #: Lines (``addr // 64``) whose reads answer SLVERR ("Read faults"); empty: none.
        self.read_error_lines: set[int] = set()
        self._seq = 0
        self._clear_transactions()

    def _clear_transactions(self) -> None:
        channels = self._channels
        # Per direction and channel: (block, slot end, ready) of the latest access.
        self._last: list[list[tuple | None]] = [[None] * channels, [None] * channels]
        self._reads: dict[int, deque[_Read]] = {}
        self._r_heap: list[tuple[int, int, _Read]] = []
        self._r_cur: _Read | None = None
        self._writes: dict[int, deque[_Write]] = {}
        self._b_heap: list[tuple[int, int, _Write]] = []
        self._b_cur: _Write | None = None
        self._aw_waiting: deque[_Write] = deque()
        self._w_orphans: deque[tuple[int, int, bool, int]] = deque()

    # --- media timing -------------------------------------------------------------
    def _media(self, addr: int, arrival: int, direction: int) -> int:
        """Schedule one line access; returns the cycle its data (or B) is ready."""
        block = addr >> self._blk_shift
        ch = block % self._channels
        last = self._last[direction][ch]
        if last is not None and last[0] == block and arrival < last[1]:
            self.stats.buffer_hits += 1
            return max(last[2], arrival + 1)
        free = self._free[ch]
        start = arrival if arrival >= free else free
        busy = self._block_cycles[direction]
        end = start + busy
        self._free[ch] = end
        self.stats.media_busy[ch] += busy
        self.stats.media_accesses += 1
        if direction == _READ:
            self.stats.media_reads += 1
        else:
            self.stats.media_writes += 1
        ready = math.ceil(start) + self._latency[direction]
        self._last[direction][ch] = (block, end, ready)
        return ready

    def _jitter(self) -> int:
        return self.rng.randint(0, self.timing.jitter) if self.timing.jitter else 0

    def _check_burst(self, ch: str, rid: int, addr: int, length: int, size: int, burst: int):
        if not self.powered:
            raise RuntimeError("PMEM model is powered off; call power_on() first")
        if size != SIZE_LINE:
            raise AxiProtocolError(f"{ch}size must be {SIZE_LINE} (64-byte beats), not {size}")
        if burst != AxiBurst.INCR:
            raise AxiProtocolError(f"{ch}burst must be INCR ({AxiBurst.INCR}), not {burst}")
        if not 0 <= length <= 255:
            raise AxiProtocolError(f"{ch}len must be 0..255, not {length}")
        base = addr & ~(LINE_BYTES - 1)
        if self.check_4k and (addr >> 12) != ((base + LINE_BYTES * length) >> 12):
            raise AxiProtocolError(
                f"{ch.upper()} burst id {rid} addr {addr:#x} len {length} crosses a 4 KiB "
                f"boundary")
        return base

    # --- AXI request side ---------------------------------------------------------
    def accept_ar(self, rid: int, addr: int, length: int, cycle: int, *,
                  size: int = SIZE_LINE, burst: int = AxiBurst.INCR) -> None:
        """An AR transfer in ``cycle``: ``length`` is ``arlen`` (beats - 1)."""
        base = self._check_burst("ar", rid, addr, length, size, burst)
        beats = length + 1
        r = _Read(self._seq, rid, base, beats, cycle)
        self._seq += 1
        self.stats.reads += 1
        if base + LINE_BYTES * beats > self.size:
            self.stats.decerr += 1
            r.resp = [AxiResp.OKAY if base + LINE_BYTES * k < self.size else AxiResp.DECERR
                      for k in range(beats)]
            # No media time for a bad address: the burst answers one cycle later.
            r.start = cycle + 1
        else:
            first = 0
            for k in range(beats):
                ready = self._media(base + LINE_BYTES * k, cycle, _READ) - k
                if ready > first:
                    first = ready
            r.start = first + self._jitter()
        q = self._reads.get(rid)
        if q is None:
            q = self._reads[rid] = deque()
        q.append(r)
        if len(q) == 1:
            heapq.heappush(self._r_heap, (r.start, r.seq, r))

    def accept_aw(self, wid: int, addr: int, length: int, cycle: int, *,
                  size: int = SIZE_LINE, burst: int = AxiBurst.INCR) -> None:
        """An AW transfer in ``cycle``. W beats may come before or after it."""
        base = self._check_burst("aw", wid, addr, length, size, burst)
        w = _Write(self._seq, wid, base, length + 1, cycle)
        self._seq += 1
        self.stats.writes += 1
        q = self._writes.get(wid)
        if q is None:
            q = self._writes[wid] = deque()
        q.append(w)
        self._aw_waiting.append(w)
        while self._w_orphans and self._aw_waiting:
            self._take_beat(*self._w_orphans.popleft())

    def accept_w(self, data: int, strb: int, last: bool, cycle: int) -> None:
        """A W transfer in ``cycle``; beats belong to AWs in AW order."""
        if not self.powered:
            raise RuntimeError("PMEM model is powered off; call power_on() first")
        if self._aw_waiting:
            self._take_beat(data, strb, last, cycle)
        else:
            self._w_orphans.append((data, strb, bool(last), cycle))

    def _take_beat(self, data: int, strb: int, last: bool, cycle: int) -> None:
        w = self._aw_waiting[0]
        w.data.append((data, strb))
        n = len(w.data)
        if bool(last) != (n == w.beats):
            raise AxiProtocolError(
                f"wlast={int(bool(last))} on beat {n} of a {w.beats}-beat write burst "
                f"(id {w.id}, addr {w.addr:#x})")
        if n < w.beats:
            return
        self._aw_waiting.popleft()
        w.complete = complete = max(w.aw_cycle, cycle)
        if w.addr + LINE_BYTES * w.beats > self.size:
            self.stats.decerr += 1
            w.resp = AxiResp.DECERR
            w.ready = complete + 1
        else:
            ready = 0
            for k in range(w.beats):
                ready = max(ready, self._media(w.addr + LINE_BYTES * k, complete, _WRITE))
            w.ready = ready + self._jitter()
        if self._writes[w.id][0] is w:
            heapq.heappush(self._b_heap, (w.ready, w.seq, w))

    # --- AXI response side --------------------------------------------------------
    @property
    def r_in_burst(self) -> bool:
        """A read burst has presented some but not all of its beats."""
        return self._r_cur is not None

    def r_beat(self, cycle: int) -> tuple[int, int, int, bool] | None:
        """The R beat to present in ``cycle`` as ``(id, data, resp, last)``, or None.

        Returns the same beat until :meth:`r_accept`; data is read from the image when
        a beat is first presented.
        """
        r = self._r_cur
        if r is None:
            heap = self._r_heap
            if not heap or heap[0][0] > cycle or not self.powered:
                return None
            r = self._r_cur = heapq.heappop(heap)[2]
            self.stats.read_latency.append(cycle - r.accepted)
        if r.beat is None:
            k = r.next
            addr = r.addr + LINE_BYTES * k
            if r.resp and r.resp[k] != AxiResp.OKAY:
                r.beat = (r.id, 0, r.resp[k], k == r.beats - 1)
            elif self.read_error_lines and addr >> 6 in self.read_error_lines:
                r.beat = (r.id, 0, AxiResp.SLVERR, k == r.beats - 1)
            else:
                self.stats.lines_read += 1
                r.beat = (r.id, self._storage.get(addr >> 6, 0), AxiResp.OKAY,
                          k == r.beats - 1)
        return r.beat

    def r_accept(self, cycle: int) -> None:
        """The presented R beat transferred in ``cycle``."""
        r = self._r_cur
        if r is None or r.beat is None:
            raise RuntimeError("r_accept() without a presented R beat")
        r.beat = None
        r.next += 1
        if r.next == r.beats:
            self._r_cur = None
            q = self._reads[r.id]
            q.popleft()
            if q:
                nxt = q[0]
                heapq.heappush(self._r_heap, (nxt.start, nxt.seq, nxt))

    def b_resp(self, cycle: int) -> tuple[int, int] | None:
        """The B response to present in ``cycle`` as ``(id, resp)``, or None.

        The write becomes durable (is applied to the image) when its B is first
        returned here. Returns the same response until :meth:`b_accept`.
        """
        w = self._b_cur
        if w is None:
            heap = self._b_heap
            if not heap or heap[0][0] > cycle or not self.powered:
                return None
            w = self._b_cur = heapq.heappop(heap)[2]
            if w.resp == AxiResp.OKAY:
                self._apply(w)
                self.stats.lines_written += w.beats
            self.stats.write_latency.append(cycle - w.complete)
        return (w.id, w.resp)

    def b_accept(self, cycle: int) -> None:
        """The presented B transferred in ``cycle``."""
        w = self._b_cur
        if w is None:
            raise RuntimeError("b_accept() without a presented B")
        self._b_cur = None
        q = self._writes[w.id]
        q.popleft()
        if q and q[0].complete is not None:
            nxt = q[0]
            heapq.heappush(self._b_heap, (nxt.ready, nxt.seq, nxt))

    @property
    def outstanding(self) -> tuple[int, int]:
        """(reads, writes) accepted and not yet fully answered."""
        return (sum(len(q) for q in self._reads.values()),
                sum(len(q) for q in self._writes.values()))

    # --- persistence --------------------------------------------------------------
    def _apply(self, w: _Write) -> None:
        for k, (data, strb) in enumerate(w.data):
            self._merge((w.addr >> 6) + k, data, strb)

    def _merge(self, line: int, data: int, strb: int) -> None:
        if strb == _FULL_STRB:
            self._storage[line] = data
        elif strb:
            mask = strb_mask(strb)
            self._storage[line] = (self._storage.get(line, 0) & ~mask) | (data & mask)

    def pending_write_addrs(self) -> list[int]:
        """Start addresses of the accepted writes whose B has not been presented."""
        return [w.addr for w in self._pending_writes()]

    def _pending_writes(self) -> list[_Write]:
        """Accepted writes whose B has not been presented, in acceptance order."""
        pending = [w for q in self._writes.values() for w in q if w is not self._b_cur]
        return sorted(pending, key=lambda w: w.seq)

    def _writable(self, w: _Write) -> bool:
        """Not a DECERR write (decided early for writes whose W data is incomplete)."""
        return w.resp == AxiResp.OKAY and w.addr + LINE_BYTES * w.beats <= self.size

    def power_fail(self, rng: random.Random | None = None, *, cycle: int | None = None,
                   weights: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> PowerFailReport:
        """Cut power: decide the fate of every unacknowledged write, lose the rest.

        Each write accepted (AW) but whose B was not yet presented is, independently
        and in acceptance order, ``dropped``, ``applied`` (its received beats) or
        ``torn`` with relative ``weights``; a torn write applies each 8-byte word that
        has strobes with probability 1/2, only the strobed bytes of it. Writes whose B
        was presented are durable already. Reads in flight and W beats without an AW
        vanish. The model answers nothing until :meth:`power_on`.
        """
        if not self.powered:
            raise RuntimeError("PMEM model is already powered off")
        if len(weights) != 3 or min(weights) < 0 or not sum(weights) > 0:
            raise ValueError(f"weights must be three non-negative numbers, not {weights!r}")
        rng = rng if rng is not None else self.rng
        fates = []
        for w in self._pending_writes():
            outcome = rng.choices(("dropped", "applied", "torn"), weights)[0]
            words: list[int] = []
            candidates = 0
            if not self._writable(w) or not w.data:
                outcome = "dropped"
            elif outcome == "applied":
                self._apply(w)
            elif outcome == "torn":
                for k, (data, strb) in enumerate(w.data):
                    keep = 0
                    for j in range(8):
                        if strb >> (8 * j) & 0xFF:
                            candidates += 1
                            if rng.random() < 0.5:
                                keep |= (strb >> (8 * j) & 0xFF) << (8 * j)
                                words.append(w.addr + LINE_BYTES * k + 8 * j)
                    self._merge((w.addr >> 6) + k, data, keep)
            fates.append(WriteFate(w.id, w.addr, w.beats, len(w.data), outcome,
                                   tuple(words), candidates))
        reads_lost = sum(len(q) for q in self._reads.values())
        report = PowerFailReport(cycle, tuple(fates), reads_lost, len(self._w_orphans))
        self._clear_transactions()
        self.powered = False
        return report

    def power_on(self) -> None:
        """Power returns: the image is as the failure left it; nothing is in flight."""
        self._clear_transactions()
        self.powered = True

    def reset(self, *, cycle: int | None = None) -> PowerFailReport:
        """Manager reset without power loss: reads are lost, pending writes (their
        received beats) are applied in acceptance order, no response is given.

        Returns a report in the form of :meth:`power_fail`'s (outcomes ``applied``, or
        ``dropped`` for DECERR writes and writes without data).
        """
        fates = []
        for w in self._pending_writes():
            applied = self._writable(w) and bool(w.data)
            if applied:
                self._apply(w)
            fates.append(WriteFate(w.id, w.addr, w.beats, len(w.data),
                                   "applied" if applied else "dropped"))
        report = PowerFailReport(cycle, tuple(fates), sum(len(q) for q in self._reads.values()),
                                 len(self._w_orphans))
        self._clear_transactions()
        return report

    # --- backdoor -----------------------------------------------------------------
    def read_line(self, addr: int) -> int:
        """The 64-byte line holding ``addr`` as an int (byte 0 in bits 7:0)."""
        return self._storage.get(addr >> 6, 0)

    def write_line(self, addr: int, data: int, strb: int = _FULL_STRB) -> None:
        """Write the line holding ``addr`` under ``strb`` (durable at once)."""
        self._merge(addr >> 6, data, strb)

    def read(self, addr: int, nbytes: int) -> bytes:
        """Durable bytes ``[addr, addr + nbytes)``."""
        if addr < 0 or nbytes < 0:
            raise ValueError(f"addr and nbytes must be non-negative, not {addr}, {nbytes}")
        out = bytearray()
        first, last = addr >> 6, (addr + nbytes - 1) >> 6
        for line in range(first, last + 1):
            out += self._storage.get(line, 0).to_bytes(LINE_BYTES, "little")
        off = addr & (LINE_BYTES - 1)
        return bytes(out[off:off + nbytes])

    def write(self, addr: int, data: bytes) -> None:
        """Make ``data`` durable at ``addr`` (any alignment)."""
        if addr < 0:
            raise ValueError(f"addr must be non-negative, not {addr}")
        pos = 0
        while pos < len(data):
            a = addr + pos
            off = a & (LINE_BYTES - 1)
            n = min(LINE_BYTES - off, len(data) - pos)
            chunk = int.from_bytes(data[pos:pos + n], "little") << (8 * off)
            self._merge(a >> 6, chunk, ((1 << n) - 1) << off)
            pos += n

    def load_image(self, image: dict[int, bytes]) -> None:
        """Write every ``{addr: bytes}`` entry (as :meth:`write`)."""
        for addr, data in image.items():
            self.write(addr, data)

    def restore(self, image: dict[int, bytes]) -> None:
        """Make the durable image exactly ``image`` (a :meth:`snapshot`): its lines, and
        zero everywhere else."""
        self._storage.clear()
        self.load_image(image)

    def snapshot(self) -> dict[int, bytes]:
        """The durable image as ``{line address: 64 bytes}``, non-zero lines only."""
        return {line << 6: value.to_bytes(LINE_BYTES, "little")
                for line, value in sorted(self._storage.items()) if value}


class _Driven:
    """An output signal and the value last written to it (written only on change)."""

    __slots__ = ("handle", "value")

    def __init__(self, handle):
        self.handle = handle
        self.value = 0
        handle.value = 0

    def set(self, value: int) -> None:
        if value != self.value:
            self.handle.value = value
            self.value = value


class PmemAxi:
    """cocotb adapter: :class:`PmemModel` as the AXI4 subordinate on ``<prefix>__*``.

    An agent of the bench's :class:`~tb.cycle.CycleLoop`. In ``drive()`` it sets the
    three ``*ready`` signals (each low with its backpressure probability, never
    depending on ``valid``) and presents at most one R beat and one B; in ``sample()``
    it takes AR/AW/W transfers into the model and retires R/B transfers. Before a new
    R burst or B it inserts an idle cycle with probability ``r_idle`` / ``b_idle``;
    ``r_gap`` is the probability of a gap between beats of one burst (0: beats are
    back to back). A :class:`~tb.stream.StreamChecker` watches each of the five
    channels (``lock``/``cache``/``prot`` are not checked); :meth:`check` raises
    their violations. While the model is powered off every ``valid``/``ready`` it
    drives is low and nothing is sampled.

    Parameters
    ----------
    dut, prefix:
        The DUT and the AXI port's name (``pmem`` -> ``pmem__awvalid`` ...).
    loop:
        The bench's cycle loop; the adapter adds itself.
    model:
        The :class:`PmemModel`.
    rng:
        Seeded random generator for backpressure and idle cycles.
    """

    def __init__(self, dut, prefix: str, loop, model: PmemModel, *, rng: random.Random,
                 ar_backpressure: float = 0.0, aw_backpressure: float = 0.0,
                 w_backpressure: float = 0.0, r_idle: float = 0.0, b_idle: float = 0.0,
                 r_gap: float = 0.0):
        from .stream import StreamChecker, reader

        for name, p in (("ar_backpressure", ar_backpressure), ("aw_backpressure", aw_backpressure),
                        ("w_backpressure", w_backpressure), ("r_idle", r_idle),
                        ("b_idle", b_idle), ("r_gap", r_gap)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1), not {p}")
        self.loop = loop
        self.model = model
        self.rng = rng
        self.ar_backpressure = ar_backpressure
        self.aw_backpressure = aw_backpressure
        self.w_backpressure = w_backpressure
        self.r_idle = r_idle
        self.b_idle = b_idle
        self.r_gap = r_gap

        def sig(n):
            return getattr(dut, f"{prefix}__{n}")

        def checker(ch, valid, ready, payload):
            return StreamChecker(dut, f"{prefix} {ch}", None, valid=sig(valid),
                                 ready=sig(ready), payload_names=[sig(n) for n in payload])

        addr = ("id", "addr", "len", "size", "burst")
        self.checkers = {
            "ar": checker("AR", "arvalid", "arready", [f"ar{n}" for n in addr]),
            "aw": checker("AW", "awvalid", "awready", [f"aw{n}" for n in addr]),
            "w": checker("W", "wvalid", "wready", ["wdata", "wstrb", "wlast"]),
            "r": checker("R", "rvalid", "rready", ["rid", "rdata", "rresp", "rlast"]),
            "b": checker("B", "bvalid", "bready", ["bid", "bresp"]),
        }
        self._read_ar = [reader(sig(f"ar{n}")) for n in addr]
        self._read_aw = [reader(sig(f"aw{n}")) for n in addr]
        self._read_w = [reader(sig(n)) for n in ("wdata", "wstrb", "wlast")]
        self._arvalid, self._awvalid, self._wvalid, self._rready, self._bready = (
            reader(sig(n)) for n in ("arvalid", "awvalid", "wvalid", "rready", "bready"))
        (self._arready, self._awready, self._wready, self._rvalid, self._rid, self._rdata,
         self._rresp, self._rlast, self._bvalid, self._bid, self._bresp) = (
            _Driven(sig(n)) for n in ("arready", "awready", "wready", "rvalid", "rid",
                                      "rdata", "rresp", "rlast", "bvalid", "bid", "bresp"))
        self._r_beat: tuple | None = None
        self._b: tuple | None = None
        loop.add(self)

    def _ready(self, p: float) -> int:
        return int(not (p and self.rng.random() < p))

    def drive(self) -> None:
        m = self.model
        if not m.powered:
            self._all_low()
            return
        cycle = self.loop.cycle
        rng = self.rng
        self._arready.set(self._ready(self.ar_backpressure))
        self._awready.set(self._ready(self.aw_backpressure))
        self._wready.set(self._ready(self.w_backpressure))

        if self._r_beat is None:
            gap = self.r_gap if m.r_in_burst else self.r_idle
            beat = None if gap and rng.random() < gap else m.r_beat(cycle)
            if beat is not None:
                rid, data, resp, last = beat
                self._rid.set(rid)
                self._rdata.set(data)
                self._rresp.set(resp)
                self._rlast.set(int(last))
                self._rvalid.set(1)
                self._r_beat = beat
            else:
                self._rvalid.set(0)

        if self._b is None:
            b = None if self.b_idle and rng.random() < self.b_idle else m.b_resp(cycle)
            if b is not None:
                self._bid.set(b[0])
                self._bresp.set(b[1])
                self._bvalid.set(1)
                self._b = b
            else:
                self._bvalid.set(0)

    def _all_low(self) -> None:
        for d in (self._arready, self._awready, self._wready, self._rvalid, self._bvalid):
            d.set(0)

    def sample(self) -> None:
        m = self.model
        if not m.powered:
            return
        cycle = self.loop.cycle
        chk = self.checkers

        if self._arvalid():
            p = tuple(read() for read in self._read_ar)
            ready = self._arready.value
            chk["ar"].observe(True, ready, p, cycle)
            if ready:
                m.accept_ar(p[0], p[1], p[2], cycle, size=p[3], burst=p[4])
        else:
            chk["ar"].observe(False, False, (), cycle)

        if self._awvalid():
            p = tuple(read() for read in self._read_aw)
            ready = self._awready.value
            chk["aw"].observe(True, ready, p, cycle)
            if ready:
                m.accept_aw(p[0], p[1], p[2], cycle, size=p[3], burst=p[4])
        else:
            chk["aw"].observe(False, False, (), cycle)

        if self._wvalid():
            p = tuple(read() for read in self._read_w)
            ready = self._wready.value
            chk["w"].observe(True, ready, p, cycle)
            if ready:
                m.accept_w(p[0], p[1], p[2], cycle)
        else:
            chk["w"].observe(False, False, (), cycle)

        beat = self._r_beat
        if beat is not None:
            taken = self._rready()
            chk["r"].observe(True, taken, (beat[0], beat[1], beat[2], int(beat[3])), cycle)
            if taken:
                m.r_accept(cycle)
                self._r_beat = None
        else:
            chk["r"].observe(False, False, (), cycle)

        b = self._b
        if b is not None:
            taken = self._bready()
            chk["b"].observe(True, taken, b, cycle)
            if taken:
                m.b_accept(cycle)
                self._b = None
        else:
            chk["b"].observe(False, False, (), cycle)

    def _drop_port_state(self) -> None:
        self._r_beat = None
        self._b = None
        for c in self.checkers.values():
            c.clear()
        if self.loop.in_drive_phase:
            self._all_low()

    def power_fail(self, rng: random.Random | None = None, *,
                   weights: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> PowerFailReport:
        """:meth:`PmemModel.power_fail` at the loop's cycle; the port goes quiet."""
        report = self.model.power_fail(rng, cycle=self.loop.cycle, weights=weights)
        self._drop_port_state()
        return report

    def power_on(self) -> None:
        self.model.power_on()
        self._drop_port_state()

    def reset(self) -> PowerFailReport:
        """Manager reset: :meth:`PmemModel.reset` and forget the presented R/B."""
        report = self.model.reset(cycle=self.loop.cycle)
        self._drop_port_state()
        return report

    def check(self) -> None:
        """Raise :class:`AssertionError` with every channel's protocol violations."""
        errors = []
        for c in self.checkers.values():
            try:
                c.check()
            except AssertionError as exc:
                errors.append(str(exc))
        if errors:
            raise AssertionError("\n".join(errors))
