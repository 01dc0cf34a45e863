"""Test bench of the whole device: CXL.mem host agent, PMEM model, CSRs, checkers."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable

import cocotb

from hw.csr.registers import register_map
from tb import env
from tb.csr import Csr
from tb.cxl_mem import CxlMemBfm
from tb.cycle import CycleLoop, start_clock_and_reset
from tb.host_agent import ErrBit, HostAgent
from tb.link import Link
from tb.pmem import LINE_BYTES, PmemAxi, PmemModel, PmemTiming, PowerFailReport

__all__ = ["NOISE", "DeviceTB"]

#: Probability of an idle cycle / a ready-low cycle when idle / backpressure is on.
NOISE = 0.3

#: The regression seed: cocotb.RANDOM_SEED holds it while test modules are imported;
#: each test then runs with a seed derived from it and the test's name.
_REGRESSION_SEED: int | None = getattr(cocotb, "RANDOM_SEED", None)


class DeviceTB:
    """Owns the clock, reset, cycle loop and every model around ``tcxl_device_<config>``.

    * :attr:`bfm` -- CXL.mem sources, sinks and stream checkers (:class:`CxlMemBfm`);
    * :attr:`agent` -- the GPU/host :class:`HostAgent` with the golden-memory scoreboard;
    * :attr:`pmem` / :attr:`pmem_axi` -- :class:`PmemModel` and its AXI4 adapter (with a
      checker on each AXI channel); timing from the test parameters;
    * :attr:`csr` -- AXI4-Lite access by register name (with the same idle and
      backpressure on its channels).

    The random generator is seeded from ``cocotb.RANDOM_SEED`` (:attr:`test_seed`,
    which cocotb derives from the regression seed and the test's name), so a failing
    test replays with ``SEED=<regression seed>`` (:attr:`seed`, printed at the start).

    Parameters
    ----------
    dut:
        The device top.
    name:
        Short test name for the log.
    idle, backpressure:
        Random idle cycles on every source (CXL M2S, PMEM R and B, CSR AW/W/AR) and
        random ``ready``-low cycles on every sink (CXL S2M, PMEM AR, AW, W, CSR B/R);
        True means :data:`NOISE`, a float gives the probability.
    timing:
        PMEM timing; default from the ``pmem_*`` test parameters.
    link:
        The :class:`~tb.link.Link` between the host agent / CSR manager and the device
        (``Link.from_platform``); None: no flight time.
    """

    def __init__(self, dut, name: str, *, idle: bool | float = False,
                 backpressure: bool | float = False, timing: PmemTiming | None = None,
                 max_outstanding: int | None = None, link: Link | None = None):
        self.dut = dut
        self.name = name
        self.config = env.config()
        self.params = env.params()
        self.log = logging.getLogger(f"cocotb.tb.{name}")
        self.test_seed = cocotb.RANDOM_SEED
        self.rng = random.Random(self.test_seed)
        self.seed = _REGRESSION_SEED if _REGRESSION_SEED is not None else self.test_seed
        sim = os.environ.get("SIM", "")
        self.log.info("config %s, test seed %d (replay the run: SEED=%d%s)", self.config.name,
                      self.test_seed, self.seed, f" SIM={sim}" if sim else "")
        self.idle = NOISE if idle is True else float(idle)
        self.backpressure = NOISE if backpressure is True else float(backpressure)

        self.loop = CycleLoop(dut.clk)
        self.tie_off_cxl_cache()
        self.bfm = CxlMemBfm(dut, self.loop, rng=self.rng, idle=self.idle,
                             backpressure=self.backpressure)
        self.timing = timing or self.timing_from_params(self.params, self.rng)
        self.link = link
        self.log.info("PMEM timing: %s; link: %s", self.timing, link)
        self.pmem = PmemModel(size=self.config.pmem_size, timing=self.timing,
                              rng=random.Random(self.rng.getrandbits(64)))
        bp, idle_p = self.backpressure, self.idle
        self.pmem_axi = PmemAxi(dut, "pmem", self.loop, self.pmem, rng=self.rng,
                                ar_backpressure=bp, aw_backpressure=bp, w_backpressure=bp,
                                r_idle=idle_p, b_idle=idle_p)
        self.csr = Csr(dut, self.config, loop=self.loop, rng=self.rng, idle=self.idle,
                       backpressure=self.backpressure,
                       io_round_trip=self.link.io_round_trip if self.link else 0)
        self.regs = register_map(self.config)
        self.agent = HostAgent(self.config, self.bfm, self.loop, rng=self.rng,
                               pmem_line=self.pmem_line, log=self.log,
                               max_outstanding=max_outstanding, link=self.link)
        #: Called once the device is in reset (:meth:`reset_device`), for the models a
        #: bench adds around it.
        self.reset_hooks: list[Callable[[], None]] = []

    def tie_off_cxl_cache(self) -> None:
        """CXL.cache channels idle: no H2D message, no D2H message taken. A bench that
        uses CXL.cache drives them with its own models instead (tb/coherent_host.py);
        without one, a D2H request the device sends stays pending, never dropped."""
        for name in ("i_h2d_req", "i_h2d_rsp", "i_h2d_data"):
            getattr(self.dut, f"{name}__valid").value = 0
            getattr(self.dut, f"{name}__payload").value = 0
        for name in ("o_d2h_req", "o_d2h_rsp", "o_d2h_data"):
            getattr(self.dut, f"{name}__ready").value = 0

    @staticmethod
    def timing_from_params(params: dict, rng: random.Random) -> PmemTiming:
        """PMEM timing from ``pmem_read_latency``, ``pmem_write_latency``,
        ``pmem_jitter``, ``pmem_channels``, ``pmem_peak`` and ``pmem_media_bytes``.

        Latencies and jitter not given are drawn from ``rng`` (reads 8..40 cycles,
        writes 8..60, jitter 0..24), shorter than real PMEM (~120 cycles) to keep
        simulations quick. Drawing them makes reads sometimes faster and sometimes
        slower than writes, so that a read overtaking an older write of its line
        would return stale data; jitter makes responses return out of order.
        """
        return PmemTiming(read_latency=params.get("pmem_read_latency", rng.randint(8, 40)),
                          write_latency=params.get("pmem_write_latency", rng.randint(8, 60)),
                          jitter=params.get("pmem_jitter", rng.randint(0, 24)),
                          channels=params.get("pmem_channels", 2),
                          peak_lines_per_cycle=params.get("pmem_peak", 1.0),
                          media_bytes=params.get("pmem_media_bytes", 256))

    # --- life cycle -------------------------------------------------------------------
    async def start(self) -> None:
        """Start the clock, hold reset for 5 cycles, start the cycle loop."""
        await start_clock_and_reset(self.dut, 5)
        self.loop.start()
        await self.loop.wait_cycles(2)

    def pmem_line(self, dev_line: int) -> bytes:
        """The PMEM model's durable 64 bytes of device line ``dev_line``."""
        return self.pmem.read_line(dev_line * LINE_BYTES).to_bytes(LINE_BYTES, "little")

    def check_protocol(self) -> None:
        """Raise if any stream or AXI channel checker saw a violation."""
        problems = self.bfm.violations()
        try:
            self.pmem_axi.check()
        except AssertionError as exc:
            problems.append(str(exc))
        assert not problems, "protocol violations:\n" + "\n".join(problems)

    async def finish(self, *, settle: int = 50) -> None:
        """Final checks: everything completes, nothing more arrives for ``settle``
        cycles, every checker is silent, the PMEM image equals the golden model on
        every line a write addressed."""
        await self.agent.wait_idle()
        await self.loop.wait_cycles(settle)
        self.agent.check_idle()
        self.check_protocol()
        lines = self.agent.check_memory()
        self.log.info("final image: %d addressed lines match the golden model; %d "
                      "responses checked", lines, self.agent.checked)
        self.log.info("traffic statistics:\n%s", self.agent.stats.report())
        self.loop.stop()

    def set_noise(self, *, idle: float | None = None, backpressure: float | None = None):
        """Change idle / backpressure probabilities on every channel."""
        if idle is not None:
            self.idle = idle
            self.bfm.set_idle(idle)
            self.pmem_axi.r_idle = self.pmem_axi.b_idle = idle
            self.csr.idle = idle
        if backpressure is not None:
            self.backpressure = backpressure
            self.bfm.set_backpressure(backpressure)
            a = self.pmem_axi
            a.ar_backpressure = a.aw_backpressure = a.w_backpressure = backpressure
            self.csr.backpressure = backpressure

    # --- reset and power failure ------------------------------------------------------
    async def reset_device(self, cycles: int = 5, *, power_fail: bool = False,
                           fates: tuple[float, float, float] = (1.0, 1.0, 1.0)
                           ) -> tuple[list, PowerFailReport | None]:
        """Synchronous reset of the device in the middle of whatever is going on.

        With ``power_fail`` the PMEM model loses power first (unacknowledged writes
        dropped, applied or torn), the device keeps running a few cycles with no
        answers, then reset is asserted and power returns. Without it, the PMEM
        subordinate is reset with the device (pending writes land, reads are lost).
        ``fates`` weighs dropped, applied and torn for each write the power failure
        catches (:meth:`PmemModel.power_fail`).
        Lines with lost writes are then checked against what the contract allows
        (whole-line old or new after a reset; per 8-byte word after a power failure)
        and taken as the golden value. Returns the lost writes and the report.
        """
        report = None
        if power_fail:
            report = self.pmem_axi.power_fail(self.rng, weights=fates)
            self.log.info("power failure at cycle %d: %d writes dropped, %d applied, %d torn; "
                          "%d reads lost", self.loop.cycle, report.count("dropped"),
                          report.count("applied"), report.count("torn"), report.reads_lost)
            await self.loop.wait_cycles(self.rng.randint(1, 8))
        self.agent.begin_reset()
        self.dut.rst.value = 1
        await self.loop.wait_cycles(1)   # the device's registers are now in reset
        lost = self.agent.abandon()
        for hook in self.reset_hooks:
            hook()
        if power_fail:
            self.pmem_axi.power_on()
        else:
            self.pmem_axi.reset()
        await self.loop.wait_cycles(max(1, cycles - 1))
        self.dut.rst.value = 0
        await self.loop.wait_cycles(1)
        self.agent.end_reset()
        self.agent.set_hdm(self.config.hdm_base, self.config.hdm_size)
        self.agent.err_status = 0
        self.agent.first_error = None
        if report is not None:
            self._check_report(report, lost)
        self.agent.resolve_unknown(torn_words=power_fail)
        return lost, report

    def _check_report(self, report: PowerFailReport, lost: list) -> None:
        """Every write of the memory endpoint the model saw pending must be one the host
        had not seen acked. The top AXI ID bit tells the endpoint's writes (0) from the
        engine's (1), which the engine's own tests check against its contracts."""
        lost_lines = {t.dev_line for t in lost}
        engine_bit = 1 << self.config.axi_id_width
        for fate in report.writes:
            if fate.id & engine_bit:
                continue
            line = fate.addr // LINE_BYTES
            assert line in lost_lines, (
                f"PMEM write to line {line:#x} ({fate.outcome}) was pending at the power "
                f"failure but the host holds no unacknowledged write of that line")

    async def reset_mid_traffic(self, n: int, *, after: int | None = None,
                                power_fail: bool = False) -> list:
        """Run ``n`` random requests and reset the device (or fail power) ``after``
        cycles into them (default: random, while traffic flows); the lines of lost
        writes are checked, then rewritten through CXL.mem. Returns the lost writes."""
        after = after if after is not None else self.rng.randint(20, 40 + 2 * n)
        task = cocotb.start_soon(self.agent.run_random(n, wait=False))
        await self.loop.wait_cycles(after)
        in_flight = self.agent.outstanding
        lost, _ = await self.reset_device(power_fail=power_fail)
        await task
        self.log.info("%s at cycle %d with %d requests in flight: %d unacknowledged writes",
                      "power failure" if power_fail else "reset", self.loop.cycle, in_flight,
                      len(lost))
        for txn in lost:
            self.agent.unknown.add(txn.dev_line)
        await self.agent.rewrite_unknown()
        return lost

    # --- CSR helpers ------------------------------------------------------------------
    async def set_hdm(self, base: int, size: int) -> None:
        """Program HDM_BASE / HDM_SIZE (bytes) and tell the agent."""
        await self.csr.write64("HDM_BASE", base)
        await self.csr.write64("HDM_SIZE", size)
        await self.loop.wait_cycles(2)
        self.agent.set_hdm(base, size)

    async def check_errors(self, *, clear: bool = True) -> int:
        """ERR_STATUS, ERR_ADDR and ERR_INFO must hold what the agent predicted; then
        (``clear``) write 1s to clear and check ERR_STATUS reads zero. Returns the
        status read."""
        await self.loop.wait_cycles(8)   # error pulses are registered twice
        a = self.agent
        status = await self.csr.read("ERR_STATUS")
        assert status == a.err_status, (
            f"ERR_STATUS {status:#04x}, expected {a.err_status:#04x}"
            + (f" (first error: {a.first_error.describe()})" if a.first_error else ""))
        if status:
            t = a.first_error
            addr = await self.csr.read("ERR_ADDR_LO") | await self.csr.read("ERR_ADDR_HI") << 32
            info = await self.csr.read("ERR_INFO")
            if t.err_bits == 1 << ErrBit.PMEM_RESP:
                # PMEM error: PMEM R (2) or B (3) channel and the device line address.
                channel, line = (2 if t.channel == "req" else 3), t.dev_line
            else:
                channel, line = (0 if t.channel == "req" else 1), t.line
            assert addr == line, (f"ERR_ADDR {addr:#x}, expected line {line:#x} of "
                                  f"{t.describe()}")
            assert info & 0x3 == channel and (info >> 4) & 0xF == t.opcode, (
                f"ERR_INFO {info:#04x}, expected channel {channel} opcode {t.opcode:#x} "
                f"of {t.describe()}")
            if clear:
                await self.csr.write("ERR_STATUS", status)
                after = await self.csr.read("ERR_STATUS")
                assert after == 0, f"ERR_STATUS {after:#x} after writing {status:#x} to clear"
                a.err_status = 0
                a.first_error = None
        return status
