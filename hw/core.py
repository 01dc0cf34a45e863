"""Package one configuration's generated device for FPGA flows: a FuseSoC core and a
plain file list.

Usage (``make verilog`` runs it after ``hw.gen`` and ``hw.csr.docgen``)::

    python -m hw.core --config default --out build/verilog

Next to the Verilog and the register files in ``<out>/<config>/`` it writes

* ``trainingcxl_<config>.core``: a CAPI2 core, ``trainingcxl:device:tcxl_device_<config>:
  <version>``, with the device's Verilog (top ``tcxl_device_<config>``), the register
  header ``tcxl_regs.h`` (an include file) and ``registers.json``; target ``default``
  (every file, for a synthesis or simulation project) and target ``lint`` (Verilator
  ``--lint-only -Wall`` with the project's waivers, ``hw.gen.LINT_WAIVERS``);
* ``tcxl_device_<config>.f``: the Verilog file list for other flows, one path per line,
  relative to the list's own directory (``verilator -F``, or run the tool there).

The generated device is one self-contained Verilog file (every block is a submodule
named after the top), so both list a single source. ``docs/fpga.md`` shows how to use
them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

from hw.config import DeviceConfig, load_config
from hw.csr.docgen import HEADER_NAME, JSON_NAME
from hw.gen import LINT_WAIVERS, module_name

__all__ = ["core_name", "core_text", "file_list_text", "main", "project_version", "write"]

def project_version() -> str:
    """The version in ``pyproject.toml`` (the core's version)."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    return tomllib.loads(pyproject.read_text())["project"]["version"]


def core_name(config: DeviceConfig) -> str:
    """The core's VLNV: vendor ``trainingcxl``, library ``device``, the top module's
    name (a configuration's name is ``[a-z][a-z0-9_]*``, so it is a valid VLNV name)."""
    return f"trainingcxl:device:{module_name('device', config)}:{project_version()}"


def core_text(config: DeviceConfig) -> str:
    """The CAPI2 core of ``config``'s device (YAML; JSON is a subset of it, so the
    strings are written JSON-quoted)."""
    top = module_name("device", config)
    q = json.dumps
    lines = [
        "CAPI=2:",
        f"name: {q(core_name(config))}",
        f"description: {q(f'TrainingCXL device, configuration {config.name}, by hw.gen')}",
        "",
        "filesets:",
        "  rtl:",
        "    file_type: verilogSource",
        "    files:",
        f"      - {q(top + '.v')}",
        "  regs:",
        "    files:",
        f"      - {q(HEADER_NAME)}: {{file_type: cSource, is_include_file: true}}",
        f"      - {q(JSON_NAME)}: {{file_type: user}}",
        "",
        "targets:",
        "  default:",
        "    filesets: [rtl, regs]",
        f"    toplevel: {q(top)}",
        "  lint:",
        "    default_tool: verilator",
        "    filesets: [rtl]",
        f"    toplevel: {q(top)}",
        "    tools:",
        "      verilator:",
        "        mode: lint-only",
        "        verilator_options: [" + ", ".join(q(o) for o in ["-Wall", *LINT_WAIVERS]) + "]",
    ]
    return "\n".join(lines) + "\n"


def file_list_text(config: DeviceConfig) -> str:
    """The plain file list: the device's Verilog, relative to the list's directory."""
    return f"{module_name('device', config)}.v\n"


def write(config: DeviceConfig, out_dir: Path) -> list[Path]:
    """Write the core and the file list into ``out_dir`` (the directory holding the
    Verilog and the register files); returns their paths.

    Raises
    ------
    FileNotFoundError
        If a file the core lists is not there (run ``hw.gen`` and ``hw.csr.docgen``
        first, as ``make verilog`` does).
    """
    top = module_name("device", config)
    missing = [name for name in (f"{top}.v", HEADER_NAME, JSON_NAME)
               if not (out_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{out_dir}: missing {', '.join(missing)} (make verilog CONFIG={config.name} "
            f"writes them)")
    core = out_dir / f"trainingcxl_{config.tag}.core"
    flist = out_dir / f"{top}.f"
    core.write_text(core_text(config))
    flist.write_text(file_list_text(config))
    return [core, flist]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hw.core",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="default",
                        help="preset name (configs/<name>.toml) or path to a TOML file")
    parser.add_argument("--out", type=Path, default=Path("build/verilog"))
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        paths = write(config, args.out / config.tag)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
