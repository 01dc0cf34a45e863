"""``make sweep``: TrainingCXL's speedup over its baselines across the platform and the
workload, measured on the RTL.

The grid has seven axes (:data:`AXES`): the link's bandwidth, the pooling factor, the
PMEM channels, the PMEM write:read bandwidth ratio, the rows per table, the MLPs'
width and the MLP checkpoint interval K. Every axis holds the reference point's value
(the ``paper-like`` platform and the ``default`` preset with :data:`BASE_OVERRIDES`),
and the sweep runs the two-axis slices of :data:`GRIDS` through it, every other axis at
its reference value: 4 grids of 3 x 3 points, 31 distinct points, each the two RTL
modes of ``sim/train.py`` (TrainingCXL and gpu-direct, run at once) and the
host-software model (``sim/host_software.py``). A full factorial of seven axes would be
2,187 RTL points; the slices show how each pair of factors moves the speedup around the
reference point. Runs repeat nothing: a point shared by two grids runs once.

Writes ``build/bench/sweep.json`` (every point: cycles per iteration and its phases per
mode, link and PMEM media busy cycles per iteration, both speedups), a PNG heatmap of
each grid's speedup per baseline, and a stacked per-iteration breakdown of the
reference point per mode (``docs/performance.md``, "Sweep").

``--axes`` limits the run to the grids whose two axes are both listed (for a quick
look); ``--values N`` keeps the first ``N`` values of every axis.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .platform import DEFAULT_PLATFORM, Platform, get_platform
from .workloads import get_workload

__all__ = ["AXES", "BASE_OVERRIDES", "GRIDS", "Axis", "Point", "main", "media_busy",
           "sweep"]

PRESET = "default"
#: The reference workload: the ``default`` preset in 8-sample batches, five of them so
#: that K up to 4 checkpoints at least once; no power failure.
BASE_OVERRIDES: dict[str, object] = {"batch": 8, "batches": 5}
GB = 1e9


@dataclass(frozen=True)
class Axis:
    """One factor: its label, its values (the reference value among them), and what a
    value changes: platform fields (``platform``) or workload fields (``workload``)."""

    label: str
    values: tuple
    reference: object
    platform: Callable[[object, Platform], dict] | None = None
    workload: Callable[[object], dict] | None = None


def _mlp_scaled(scale: float) -> dict:
    """The preset's MLPs with every hidden width times ``scale`` (the bottom MLP's last
    layer stays ``dim``)."""
    w = _REF_WORKLOAD
    return {"bottom_mlp": (*(max(1, round(n * scale)) for n in w.bottom_mlp[:-1]),
                           w.bottom_mlp[-1]),
            "top_mlp": tuple(max(1, round(n * scale)) for n in w.top_mlp)}


_REF_PLATFORM = get_platform(DEFAULT_PLATFORM)
_REF_WORKLOAD = get_workload(PRESET)

#: The factors, each with three values around the reference.
AXES: dict[str, Axis] = {
    "link_gbps": Axis(
        "link bandwidth per direction (GB/s)", (16.0, 32.0, 63.0),
        round(_REF_PLATFORM.link_bytes_per_s / GB),
        platform=lambda v, p: {"link_bytes_per_s": v * GB}),
    "pooling": Axis(
        "mean indices per bag", (2, 8, 24), _REF_WORKLOAD.pooling_mean,
        workload=lambda v: {"pooling_mean": v}),
    "pmem_channels": Axis(
        "PMEM channels", (1, 2, 4), _REF_PLATFORM.pmem_channels,
        platform=lambda v, p: {"pmem_channels": v}),
    "write_ratio": Axis(
        "PMEM write:read bandwidth", (round(1 / 6, 4), 0.5, 1.0),
        round(_REF_PLATFORM.pmem_write_bytes_per_s / _REF_PLATFORM.pmem_read_bytes_per_s, 4),
        platform=lambda v, p: {"pmem_write_bytes_per_s": v * p.pmem_read_bytes_per_s}),
    # The preset's own tables (1,500 to 2,500 rows) are the reference, "preset".
    "table_rows": Axis(
        "rows per table", (None, 8192, 32768), None,
        workload=lambda v: {} if v is None else {"table_rows": (v,) * _REF_WORKLOAD.num_tables}),
    "mlp_scale": Axis(
        "MLP hidden widths (x the preset's)", (0.5, 1.0, 4.0), 1.0,
        workload=lambda v: {} if v == 1.0 else _mlp_scaled(v)),
    "mlp_k": Axis(
        "MLP checkpoint interval K", (1, 2, 4), _REF_WORKLOAD.mlp_ckpt_every,
        workload=lambda v: {"mlp_ckpt_every": v}),
}

#: The two-axis slices the sweep runs.
GRIDS: tuple[tuple[str, str], ...] = (
    ("link_gbps", "pooling"),
    ("pmem_channels", "write_ratio"),
    ("table_rows", "pooling"),
    ("mlp_scale", "mlp_k"),
)


@dataclass(frozen=True)
class Point:
    """Values of the axes that differ from the reference."""

    values: tuple[tuple[str, object], ...]

    def platform_spec(self) -> str:
        changes: dict = {}
        for name, v in self.values:
            if AXES[name].platform is not None:
                changes |= AXES[name].platform(v, _REF_PLATFORM)
        if not changes:
            return DEFAULT_PLATFORM
        return DEFAULT_PLATFORM + ":" + ",".join(f"{k}={v!r}" for k, v in sorted(changes.items()))

    def overrides(self) -> dict:
        out = dict(BASE_OVERRIDES)
        for name, v in self.values:
            if AXES[name].workload is not None:
                out |= AXES[name].workload(v)
        return out

    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.values) or "reference"


def point(**values) -> Point:
    """The point with ``values`` (axis name -> value); reference values are dropped."""
    return Point(tuple(sorted((k, v) for k, v in values.items() if v != AXES[k].reference)))


def media_busy(platform: Platform, reads: float, writes: float) -> float:
    """Cycles each PMEM channel is busy for ``reads`` and ``writes`` media accesses
    spread evenly over the channels (``tb/pmem.py``'s occupancy per access)."""
    clock = platform.device_clock_hz
    read = platform.pmem_media_bytes / platform.pmem_read_bytes_per_s * clock
    write = platform.pmem_media_bytes / platform.pmem_write_bytes_per_s * clock
    return (reads * read + writes * write) / platform.pmem_channels


def measure(p: Point, config: str, sim: str, seed: int, out_dir: Path) -> dict:
    """Run point ``p`` on the RTL (both modes) and the host-software model."""
    from .host_software import host_software_run
    from .train import main as train_main

    plat = get_platform(p.platform_spec())
    overrides = p.overrides()
    workload = get_workload(PRESET).with_overrides(**overrides)
    prefix = out_dir / f"sweep-{p.label().replace('=', '_').replace(',', '-')}"
    argv = ["--preset", PRESET, "--config", config, "--sim", sim, "--seed", str(seed),
            "--platform", plat.name, "--crash-at", "-1", "--out", str(prefix)]
    for k, v in overrides.items():
        argv += ["--set", f"{k}={v!r}"]
    if train_main(argv) != 0:
        raise RuntimeError(f"sweep point {p.label()} failed")
    data = json.loads(prefix.with_name(prefix.name + ".json").read_text())
    host = host_software_run(workload, seed, plat)
    modes = {"trainingcxl": data["summary"]["trainingcxl"],
             "gpu-direct": data["summary"]["baseline"]}
    link_per_cycle = plat.link_bytes_per_s / plat.device_clock_hz

    # Link: every byte of both directions at one direction's bandwidth (an upper bound
    # of the busier direction's occupancy); PMEM: media_busy of the accesses.
    def resources(s: dict, link_bytes: float) -> dict:
        n = s["iterations"]
        return {"link_busy": link_bytes / n / link_per_cycle,
                "pmem_media_busy": media_busy(plat, s["pmem_media_reads"] / n,
                                              s["pmem_media_writes"] / n)}

    tc = modes["trainingcxl"]["cycles_per_iteration"]
    return {
        "point": dict(p.values), "platform": plat.name, "overrides": overrides,
        "speedup_vs_gpu_direct": round(modes["gpu-direct"]["cycles_per_iteration"] / tc, 4),
        "speedup_vs_host_software": round(host["cycles_per_iteration"] / tc, 4),
        "cycles_per_iteration": {**{m: round(s["cycles_per_iteration"], 1)
                                    for m, s in modes.items()},
                                 "host-software": round(host["cycles_per_iteration"], 1)},
        "phase_cycles_per_iteration": {
            **{m: {k: round(c, 1) for k, c in s["phase_cycles_per_iteration"].items()}
               for m, s in modes.items()},
            "host-software": {k: round(c, 1)
                              for k, c in host["phase_cycles_per_iteration"].items()}},
        "busy_cycles_per_iteration": {
            **{m: {k: round(v, 1) for k, v in resources(s, s["link_bytes"]).items()}
               for m, s in modes.items()},
            "host-software": {k: round(v, 1) for k, v in resources(
                host, host["pcie_bytes"]).items()}},
        "tables_identical": data.get("tables_identical", False),
    }


def sweep(grids, run: Callable[[Point], dict], values: int | None = None) -> dict:
    """Measure every point of ``grids`` with ``run`` (each distinct point once)."""
    cache: dict[Point, dict] = {}

    def get(p: Point) -> dict:
        if p not in cache:
            print(f"point {len(cache) + 1}: {p.label()}", flush=True)
            cache[p] = run(p)
        return cache[p]

    reference = get(point())
    out = []
    for x, y in grids:
        xs, ys = AXES[x].values[:values], AXES[y].values[:values]
        out.append({"x": x, "y": y, "x_values": list(xs), "y_values": list(ys),
                    "points": [get(point(**{x: vx, y: vy})) for vy in ys for vx in xs]})
    return {"reference": reference, "grids": out, "points_run": len(cache)}


def plot(result: dict, prefix: str) -> list[str]:
    """A heatmap per grid (one panel per baseline) and the reference breakdown; [] when
    matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []

    def tick(v) -> str:
        return "preset" if v is None else f"{v:g}"

    files = []
    for g in result["grids"]:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
        for ax, key in zip(axes, ("speedup_vs_gpu_direct", "speedup_vs_host_software"),
                           strict=True):
            nx, ny = len(g["x_values"]), len(g["y_values"])
            z = np.array([p[key] for p in g["points"]]).reshape(ny, nx)
            im = ax.imshow(z, origin="lower", cmap="RdYlGn", vmin=0, vmax=2)
            for i in range(ny):
                for j in range(nx):
                    ax.text(j, i, f"{z[i, j]:.2f}", ha="center", va="center", fontsize=9)
            ax.set_xticks(range(nx), [tick(v) for v in g["x_values"]])
            ax.set_yticks(range(ny), [tick(v) for v in g["y_values"]])
            ax.set_xlabel(AXES[g["x"]].label)
            ax.set_title(key.replace("_", " "), fontsize=9)
        axes[0].set_ylabel(AXES[g["y"]].label)
        fig.colorbar(im, ax=axes, shrink=0.8)
        files.append(f"{prefix}-{g['x']}-{g['y']}.png")
        fig.savefig(files[-1])
        plt.close(fig)
    ref = result["reference"]
    modes = list(ref["phase_cycles_per_iteration"])
    phases = list(ref["phase_cycles_per_iteration"][modes[0]])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.8))
    bottom = np.zeros(len(modes))
    for phase in phases:
        vals = np.array([ref["phase_cycles_per_iteration"][m].get(phase, 0) for m in modes])
        ax1.bar(modes, vals, bottom=bottom, label=phase)
        bottom += vals
    ax1.set_ylabel("cycles per iteration")
    ax1.set_title("phases (critical path)", fontsize=9)
    ax1.legend(fontsize=7)
    width = 0.38
    x = np.arange(len(modes))
    for k, (res, off) in enumerate((("link_busy", -width / 2), ("pmem_media_busy", width / 2))):
        ax2.bar(x + off, [ref["busy_cycles_per_iteration"][m][res] for m in modes], width,
                label=res.replace("_", " "), color=f"C{5 + k}")
    ax2.set_xticks(x, modes)
    ax2.set_title("busy cycles per iteration: link (all bytes at one direction's "
                  "bandwidth), PMEM (per channel)", fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    files.append(f"{prefix}-breakdown.png")
    fig.savefig(files[-1])
    plt.close(fig)
    return files


def main(argv: list[str] | None = None) -> int:
    from . import toolenv
    from .runner import BUILD

    parser = argparse.ArgumentParser(prog="python -m sim.sweep",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--sim", default="verilator", choices=toolenv.SIMULATORS)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--axes", nargs="+", choices=list(AXES),
                        help="run only the grids whose two axes are both listed")
    parser.add_argument("--values", type=int, help="first N values of every axis")
    parser.add_argument("--out", help="path prefix of the outputs (default: "
                                      "build/bench/sweep)")
    args = parser.parse_args(argv)
    toolenv.setup()
    grids = [g for g in GRIDS if args.axes is None or set(g) <= set(args.axes)]
    prefix = Path(args.out or BUILD / "bench" / "sweep")
    raw = prefix.parent / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    result = sweep(grids, lambda p: measure(p, args.config, args.sim, args.seed, raw),
                   args.values)
    result = {"benchmark": "sweep", "config": args.config, "simulator": args.sim,
              "seed": args.seed, "preset": PRESET, "base_overrides": BASE_OVERRIDES,
              "platform": DEFAULT_PLATFORM,
              "axes": {k: {"label": a.label, "values": list(a.values),
                           "reference": a.reference} for k, a in AXES.items()},
              **result, "wall_seconds": round(time.monotonic() - t0, 1)}
    path = prefix.with_name(prefix.name + ".json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path} ({result['points_run']} points, {result['wall_seconds']} s)")
    for g in result["grids"]:
        print(f"\n{AXES[g['y']].label} (rows) x {AXES[g['x']].label} (columns): "
              "speedup vs gpu-direct / vs host-software")
        n = len(g["x_values"])
        for i, vy in enumerate(g["y_values"]):
            row = g["points"][i * n:(i + 1) * n]
            print(f"  {vy!s:>8}: " + "  ".join(
                f"{p['speedup_vs_gpu_direct']:.2f}/{p['speedup_vs_host_software']:.2f}"
                for p in row))
    for f in plot(result, str(prefix)):
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
