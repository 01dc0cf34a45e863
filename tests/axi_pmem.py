"""Serving a DUT's AXI4 manager port from :class:`tb.pmem.PmemModel` in the Amaranth
simulator, with random backpressure and idle cycles and the stream rule checked on
AR, AW and W (the cocotb benches use :mod:`tb.device_tb` instead), and optionally
read errors injected on chosen lines (:class:`ReadErrors`)."""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hw.bus.axi import AxiResp
from tb.pmem import PmemModel

from .stream_rule import StreamRule

__all__ = ["ROUGH", "SMOOTH", "AxiPmemPort", "ReadErrors", "Traffic"]

LINE = 64


@dataclass(frozen=True)
class Traffic:
    """Probabilities, per cycle, of a low ready on AR/AW/W and of an idle R/B cycle."""

    ar_bp: float = 0.0
    aw_bp: float = 0.0
    w_bp: float = 0.0
    r_idle: float = 0.0
    b_idle: float = 0.0


SMOOTH = Traffic()
ROUGH = Traffic(ar_bp=0.3, aw_bp=0.3, w_bp=0.3, r_idle=0.3, b_idle=0.3)


@dataclass
class ReadErrors:
    """Read errors injected between a :class:`tb.pmem.PmemModel` and a DUT's R channel.

    ``fail(line, n)`` is asked once per beat of every read accepted (:meth:`accept_ar`),
    with the beat's 64-byte line address and how many beats of that line were accepted
    before it; it returns the ``rresp`` to answer the beat with (0, OKAY: the model's
    own beat) or a bool (True: ``resp``). A failed beat carries ``data(line, n,
    model_data)`` (default: the model's data, so only ``rresp`` differs). The model's
    beats of one ID come in request order, so the bench calls :meth:`beat` on each beat
    the model presents (once per beat) to get the beat to drive. ``reads`` counts the
    beats accepted per line, ``failed`` lists ``(line, n)`` of each beat failed.
    """

    fail: Callable[[int, int], int | bool]
    data: Callable[[int, int, int], int] | None = None
    resp: int = AxiResp.SLVERR
    reads: Counter = field(default_factory=Counter)
    failed: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self):
        self._pending: dict[int, deque] = {}

    def accept_ar(self, rid: int, addr: int, length: int) -> None:
        """An AR transfer (``length``: ``arlen``) of 64-byte beats."""
        q = self._pending.setdefault(rid, deque())
        for k in range(length + 1):
            line = (addr & ~(LINE - 1)) + LINE * k
            n = self.reads[line]
            self.reads[line] += 1
            q.append((line, n))

    def beat(self, beat: tuple | None) -> tuple | None:
        """The model's beat ``(id, data, resp, last)`` as the DUT is to see it."""
        if beat is None:
            return None
        rid, data, _, last = beat
        line, n = self._pending[rid].popleft()
        code = self.fail(line, n)
        if code is True:
            code = self.resp
        if not code:
            return beat
        self.failed.append((line, n))
        if self.data is not None:
            data = self.data(line, n, data)
        return (rid, data, int(code), last)


@dataclass
class AxiPmemPort:
    """One AXI4 port (``port``: the DUT's ``AXI4Signature`` member) served by ``model``.

    Call :meth:`drive` before and :meth:`observe` after each clock edge (or use
    :meth:`tick`). Single-beat, 64-byte aligned transfers are required. ``aws`` lists
    the address of every write accepted; ``errors`` the stream-rule violations.
    """

    port: object
    model: PmemModel
    rng: random.Random
    traffic: Traffic = SMOOTH
    aws: list[int] = field(default_factory=list)
    cycle: int = 0
    read_errors: ReadErrors | None = None

    def __post_init__(self):
        self._rules = {n: StreamRule(n) for n in ("AR", "AW", "W")}
        self._beat = None
        self._b = None

    @property
    def errors(self) -> list[str]:
        return [e for r in self._rules.values() for e in r.errors]

    def drive(self, ctx) -> None:
        p, t, rng, model = self.port, self.traffic, self.rng, self.model
        ctx.set(p.arready, not rng.random() < t.ar_bp)
        ctx.set(p.awready, not rng.random() < t.aw_bp)
        ctx.set(p.wready, not rng.random() < t.w_bp)
        if self._beat is None and not rng.random() < t.r_idle:
            self._beat = model.r_beat(self.cycle)
            if self.read_errors is not None:
                self._beat = self.read_errors.beat(self._beat)
            if self._beat is not None:
                rid, rdata, rresp, rlast = self._beat
                ctx.set(p.rid, rid)
                ctx.set(p.rdata, rdata)
                ctx.set(p.rresp, rresp)
                ctx.set(p.rlast, int(rlast))
        ctx.set(p.rvalid, self._beat is not None)
        if self._b is None and not rng.random() < t.b_idle:
            self._b = model.b_resp(self.cycle)
            if self._b is not None:
                ctx.set(p.bid, self._b[0])
                ctx.set(p.bresp, self._b[1])
        ctx.set(p.bvalid, self._b is not None)

    def signals(self) -> tuple:
        p = self.port
        return (p.arvalid, p.arready, p.awvalid, p.awready, p.wvalid, p.wready, p.wdata,
                p.wstrb, p.wlast, p.rready, p.bready, p.arid, p.araddr, p.arlen, p.arsize,
                p.arburst, p.awid, p.awaddr, p.awlen, p.awsize, p.awburst)

    def observe(self, values: tuple) -> None:
        """Record the handshakes of one clock edge (``values``: :meth:`signals` sampled)."""
        (arvalid, arready, awvalid, awready, wvalid, wready, wdata, wstrb, wlast, rready,
         bready, *addr) = values
        ar, aw = tuple(addr[:5]), tuple(addr[5:])
        cycle, model = self.cycle, self.model
        self._rules["AR"].observe(cycle, arvalid, arready, ar)
        self._rules["AW"].observe(cycle, awvalid, awready, aw)
        self._rules["W"].observe(cycle, wvalid, wready, (wdata, wstrb, wlast))
        if arvalid and arready:
            assert ar[2] == 0 and ar[1] % LINE == 0, f"AR {ar}"
            model.accept_ar(ar[0], ar[1], ar[2], cycle, size=ar[3], burst=ar[4])
            if self.read_errors is not None:
                self.read_errors.accept_ar(ar[0], ar[1], ar[2])
        if awvalid and awready:
            assert aw[2] == 0 and aw[1] % LINE == 0, f"AW {aw}"
            self.aws.append(aw[1])
            model.accept_aw(aw[0], aw[1], aw[2], cycle, size=aw[3], burst=aw[4])
        if wvalid and wready:
            model.accept_w(wdata, wstrb, bool(wlast), cycle)
        if self._beat is not None and rready:
            model.r_accept(cycle)
            self._beat = None
        if self._b is not None and bready:
            model.b_accept(cycle)
            self._b = None
        self.cycle += 1

    async def tick(self, ctx, *extra) -> tuple:
        """:meth:`drive`, one clock edge, :meth:`observe`; returns ``extra`` sampled."""
        self.drive(ctx)
        values = (await ctx.tick().sample(*self.signals(), *extra))[2:]   # after clk, rst
        n = len(values) - len(extra)
        self.observe(values[:n])
        return values[n:]
