"""Serving a DUT's AXI4 manager port from :class:`tb.pmem.PmemModel` in the Amaranth
simulator, with random backpressure and idle cycles and the stream rule checked on
AR, AW and W (the cocotb benches use :mod:`tb.device_tb` instead)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tb.pmem import PmemModel

from .stream_rule import StreamRule

__all__ = ["ROUGH", "SMOOTH", "AxiPmemPort", "Traffic"]

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
