"""The ``make sim`` demonstration (for now): an emulated GPU drives CXL.mem traffic
through the generated device into the PMEM model.

Phases: identify the device over CSRs; stream writes; read them back; random mixed
traffic with random idle cycles and backpressure on every channel; one bad request.
Every response is checked against the golden memory by the host agent while the
phase's transactions, bandwidth and latency are recorded. The figures go as JSON to
the ``out`` test parameter; ``sim/demo.py`` prints them.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb

from tb import env
from tb.device_tb import DeviceTB
from tb.host_agent import Txn
from tb.pmem import PmemTiming

_NDR = {0: "Cmp", 1: "Cmp-S", 2: "Cmp-E", 4: "BI-ConflictAck"}
_DRS = {0: "MemData", 1: "MemData-NXM"}


def describe(txn: Txn) -> str:
    responses = []
    if txn.drs is not None:
        responses.append(_DRS.get(txn.drs["opcode"], "?"))
    if txn.ndr is not None:
        responses.append(_NDR.get(txn.ndr["opcode"], "?"))
    latency = f"{txn.latency:4d} cycles" if txn.latency is not None else "no response"
    return (f"cycle {txn.accepted:>7}  {txn.name:<11} tag {txn.tag:#06x}  line {txn.line:#013x}"
            f"  -> {' + '.join(responses) or '(none, by contract)':<17} {latency}")


def summarize(name: str, txns: list[Txn], *, samples: int = 5) -> dict:
    done = [t for t in txns if t.completed is not None]
    first = min(t.accepted for t in txns)
    last = max(t.completed for t in done)
    cycles = last - first + 1
    # Requests the contract leaves unanswered (MemSpecRd) have no latency.
    lat = sorted(t.latency for t in done if not t.silent)
    kinds: dict[str, int] = {}
    for t in txns:
        kinds[t.name] = kinds.get(t.name, 0) + 1
    lines_read = sum(1 for t in done if t.drs is not None and t.drs["opcode"] == 0)
    lines_written = sum(1 for t in done if t.writes_memory)
    return {
        "name": name, "transactions": len(txns), "answered": len(done), "cycles": cycles,
        "lines_read": lines_read, "lines_written": lines_written,
        "lines_per_cycle": round((lines_read + lines_written) / cycles, 3),
        "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        "latency": {"min": lat[0], "mean": round(sum(lat) / len(lat), 1),
                    "p50": lat[len(lat) // 2], "p99": lat[min(len(lat) - 1, 99 * len(lat) // 100)],
                    "max": lat[-1]} if lat else {},
        "sample": [describe(t) for t in sorted(txns, key=lambda t: t.accepted)[:samples]],
    }


@cocotb.test()
async def demo(dut):
    p = env.params()
    timing = PmemTiming(read_latency=p.get("pmem_read_latency", 120),
                        write_latency=p.get("pmem_write_latency", 40),
                        peak_lines_per_cycle=1.0, channels=2, jitter=p.get("pmem_jitter", 16))
    tb = DeviceTB(dut, "demo", timing=timing)
    await tb.start()
    agent = tb.agent
    n = min(int(p.get("lines", 2048)), agent.window_lines)   # stay inside the HDM window
    report: dict = {"config": tb.config.name, "seed": tb.seed, "phases": []}

    report["csr"] = {
        "ID": f"{await tb.csr.read('ID'):#010x}",
        "CAP_MAX_TAGS": await tb.csr.read("CAP_MAX_TAGS"),
        "HDM window": f"{tb.config.hdm_base:#x} + {tb.config.hdm_size:#x}",
    }

    writes = [agent.write(agent.host_line(i), i.to_bytes(8, "little") * 8) for i in range(n)]
    await agent.wait_all(writes, timeout=100 * n)
    report["phases"].append(summarize("stream of MemWr", writes))

    reads = [agent.read(agent.host_line(i)) for i in range(n)]
    await agent.wait_all(reads, timeout=100 * n)
    report["phases"].append(summarize("stream of MemRd (checked)", reads))

    tb.set_noise(idle=0.3, backpressure=0.3)
    mixed = await agent.run_random(int(p.get("n_txn", 3000)), lines=n)
    report["phases"].append(summarize("random mix, idle + backpressure", mixed, samples=8))
    tb.set_noise(idle=0.0, backpressure=0.0)

    bad = agent.read(agent.host_line(tb.agent.window_lines))  # one line past the window
    await bad
    report["phases"].append(summarize("read outside the HDM window", [bad], samples=1))
    report["csr"]["ERR_STATUS"] = f"{await tb.csr.read('ERR_STATUS'):#x}"
    err_addr = await tb.csr.read("ERR_ADDR_HI") << 32 | await tb.csr.read("ERR_ADDR_LO")
    report["csr"]["ERR_ADDR"] = f"{err_addr:#x}"
    report["csr"]["PERF_READS"] = await tb.csr.read64("PERF_READS")
    report["csr"]["PERF_WRITES"] = await tb.csr.read64("PERF_WRITES")
    report["csr"]["PERF_BUSY"] = await tb.csr.read64("PERF_BUSY")
    report["csr"]["PERF_CYCLES"] = await tb.csr.read64("PERF_CYCLES")
    await tb.check_errors()

    await tb.finish()
    report["responses_checked"] = agent.checked
    report["cycles"] = tb.loop.cycle
    out = Path(p["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
