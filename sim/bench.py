"""Benchmarks: ``make bench`` writes ``build/bench/*.json``.

``mem_endpoint.json``: read/write utilization of the PMEM peak with a 120/40-cycle
PMEM, the latency the endpoint adds to an isolated request, and simulation speed on
each simulator (``tb/bench_mem.py``).

``engine.json``: LOOKUP gather utilization at pooling factors 20 and 1, the row writes
UPDATE's coalescing saves for Zipf indices (``tb/bench_engine.py``), and the operand
vectors the IEEE-754 units were checked on (``sim/fpcheck.py``).

``ckpt.json``: cycles per training iteration with undo logging and commits on ÷ off,
recovery cycles for one uncommitted batch, and a crash campaign's points tried and
survived (``tb/bench_ckpt.py``, ``tb/test_ckpt.py``).

``coherence.json``: cycles of the same LOOKUPs with the table in host bias ÷ in device
bias, lines per cycle of a large RdCurr snapshot of GPU memory, and the transfers the
coherence checker checked meanwhile (``tb/bench_coherence.py``).

``system.json``: DLRM training through the whole device (``sim/train.py``,
``tb/train_dlrm.py``) per workload preset, on one platform (:data:`SYSTEM_PLATFORM` or
``--platform``: PMEM timing and the CXL link), without a power failure: TrainingCXL
against the ``gpu-direct`` baseline (the same device with its engines idle, the GPU
working over CXL.mem; RTL) and the ``host-software`` baseline (CPU threads on
host-attached PMEM, PCIe copies, synchronous undo log; the timing model of
``sim/host_software.py`` on the same batches), and the ablation ``trainingcxl-sw-ckpt``
(the engines with software checkpointing; RTL). Per preset: ``speedup_vs_gpu_direct``,
``speedup_vs_sw_ckpt_ablation``,
``speedup_vs_host_software``, ``energy_saving_vs_gpu_direct``,
``energy_saving_vs_host_software``,
``pmem_media_bytes_ratio_vs_gpu_direct``, ``link_bytes_ratio_vs_gpu_direct`` (TrainingCXL
÷ gpu-direct), cycles per iteration and per phase for each mode, and
``sim_cycles_per_second`` (simulated cycles ÷ the seconds cocotb reports for the
simulation; ``wall_cycles_per_second`` counts the whole run, elaboration and simulator
start included); at the top level ``platform`` and ``sim_cycles_per_second`` over all
presets. The presets run with :data:`SYSTEM_OVERRIDES` (fewer, smaller batches) so that
the benchmark finishes in minutes; the overrides are in the JSON.

``perfmodel.json``: the performance model of ``sim/perfmodel.py`` fitted on RTL runs
of the presets at small batches, its relative error on held-out RTL runs at larger
batches (``max_heldout_error``), and its predictions at :data:`PERFMODEL_PREDICT_BATCH`
samples against both baselines.

Figures are measured by cocotb benches on the generated Verilog; nothing here is
asserted — the tests do that.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

from hw.config import load_config
from hw.engine.engine import PMEM_KIND_CSRS

from . import toolenv
from .platform import DEFAULT_PLATFORM, platform_arg
from .runner import BUILD, run

__all__ = ["SYSTEM_OVERRIDES", "bench_ckpt", "bench_coherence", "bench_engine",
           "bench_mem_endpoint", "bench_perfmodel", "bench_system", "main"]


def _measure(testcase: str, config, sim: str, params: dict, seed: int | None, *,
             module: str = "tb.bench_mem", tag: str = "") -> dict:
    out = BUILD / "bench" / "raw" / f"{testcase}{tag}-{config.tag}-{sim}.json"
    out.unlink(missing_ok=True)
    result = run(module, "device", config, sim, testcase=testcase, seed=seed,
                 params={**params, "out": str(out)}, name=f"bench-{testcase}{tag}", quiet=True)
    if not result.ok or not out.exists():
        raise RuntimeError(f"{testcase} on {sim} failed; log: {result.log}")
    return json.loads(out.read_text())


def bench_mem_endpoint(config_name: str, sim: str, seed: int | None) -> dict:
    config = load_config(config_name)
    t0 = time.monotonic()
    figures = _measure("bench_endpoint", config, sim, {"lines": 4096}, seed)
    speed = {}
    for s in toolenv.SIMULATORS:
        if not toolenv.have_simulator(s):
            print(f"  {s} not installed: no sim_cycles_per_second for it")
            continue
        n = 6000 if s == "verilator" else 2000
        speed[s] = _measure("bench_sim_speed", config, s, {"n_txn": n}, seed)
    result = {
        "benchmark": "mem_endpoint",
        "simulator": sim,
        **figures,
        "sim_cycles_per_second": {s: v["sim_cycles_per_second"] for s, v in speed.items()},
        "sim_speed_runs": speed,
        "targets": {"read_utilization": ">= 0.95", "write_utilization": ">= 0.95",
                    "added_read_latency_cycles": "<= 4", "added_write_latency_cycles": "<= 4"},
        "wall_seconds": round(time.monotonic() - t0, 1),
    }
    return result


#: The engine benchmark's workload: dim 64 fp32, batch 128, 16 lanes, PMEM
#: read latency 120 cycles at one line per cycle (``tb.bench_mem.BENCH_TIMING``).
ENGINE_WORKLOAD = {"dim": 64, "batch": 128, "rows": 20000}
#: Its LOOKUP runs: (pooling, descriptors, where the buffers and the ring are). The
#: headline figures have them in GPU memory, as the training flow runs
#: (``COH_CTRL.SCRATCH_HOST`` / ``RING_HOST``); the device-memory runs are reported
#: beside them.
GATHER_RUNS = ((20, 4, "gpu"), (1, 16, "gpu"), (20, 4, "device"), (1, 16, "device"))
#: Bags of the engine benchmark's UPDATE larger than the accumulator (20 indices each:
#: 10,240 indices of dim 64, three accumulators' worth on the ``default`` device).
MULTIPASS_BATCH = 512


def _device_counters(c: dict) -> dict:
    """A training run's ``device_counters_after_last_reset`` as ``system.json`` reports
    them: link bytes the device counted each way (LINK_TX_BYTES / LINK_RX_BYTES) and the
    bench's count of the same messages, PMEM lines per kind (``docs/embedding.md``)."""
    return {
        "link_tx_bytes": c.get("LINK_TX_BYTES"), "link_rx_bytes": c.get("LINK_RX_BYTES"),
        "bench_link_tx_bytes": c.get("bench_link_tx_bytes"),
        "bench_link_rx_bytes": c.get("bench_link_rx_bytes"),
        "pmem_lines": {k: c.get(name) for k, name in PMEM_KIND_CSRS.items()},
        "pmem_lines_total": {"rd": c.get("ENG_PMEM_RD_LINES"), "wr": c.get("ENG_PMEM_WR_LINES")},
        "upd_distinct_rows": c.get("ENG_UPD_DISTINCT_ROWS"),
        "upd_store_lines": c.get("ENG_UPD_STORE_LINES"),
        "upd_passes": c.get("ENG_UPD_PASSES"),
    }


def bench_engine(config_name: str, sim: str, seed: int | None) -> dict:
    from . import fpcheck

    config = load_config(config_name)
    t0 = time.monotonic()
    gather = {}
    for pooling, n_desc, scratch in GATHER_RUNS:
        print(f"  gather, pooling {pooling}, buffers in {scratch} memory ...")
        key = f"p{pooling}" + ("" if scratch == "gpu" else "-device")
        gather[key] = _measure("bench_gather", config, sim,
                               {**ENGINE_WORKLOAD, "pooling": pooling, "n_desc": n_desc,
                                "scratch": scratch},
                               seed, module="tb.bench_engine", tag=f"-{key}")
    print("  update, Zipf 1.05 ...")
    update = _measure("bench_update", config, sim,
                      {**ENGINE_WORKLOAD, "pooling": 20, "zipf": 1.05}, seed,
                      module="tb.bench_engine")
    multipass = {}
    for name, zipf in (("zipf", 1.05), ("uniform", None)):
        print(f"  update larger than the accumulator, {MULTIPASS_BATCH} bags, {name} ...")
        multipass[name] = _measure("bench_update", config, sim,
                                   {**ENGINE_WORKLOAD, "pooling": 20, "zipf": zipf,
                                    "batch": MULTIPASS_BATCH}, seed,
                                   module="tb.bench_engine", tag=f"-multipass-{name}")
    checks = {}
    if toolenv.have_simulator("verilator"):
        for unit in fpcheck.UNITS:
            print(f"  fpcheck {unit} ...")
            r = fpcheck.check(unit, 1_000_000, seed=seed if seed is not None else 1)
            checks[unit] = {"vectors": r.vectors, "mismatches": r.mismatches}
    return {
        "benchmark": "engine",
        "simulator": sim,
        "config": config.name,
        "gather_utilization_p20": gather["p20"]["utilization"],
        "gather_utilization_p1": gather["p1"]["utilization"],
        # The same with the buffers and the ring in device memory (PMEM).
        "gather_utilization_p20_device_buffers": gather["p20-device"]["utilization"],
        "gather_utilization_p1_device_buffers": gather["p1-device"]["utilization"],
        "update_write_saving_zipf": update["write_saving"],
        "update_cycles_per_gradient_line": update["cycles_per_gradient_line"],
        "update_distinct_rows": update["distinct_rows"],
        # 64-byte lines per kind on the engine's PMEM port (ENG_PMEM_RD_* / _WR_*) and
        # the PMEM model's media bytes, of the p20 LOOKUPs and the Zipf UPDATE.
        "pmem_lines_lookup_p20": gather["p20"].get("pmem_lines"),
        "pmem_media_bytes_lookup_p20": gather["p20"].get("pmem_media_bytes"),
        # One UPDATE of MULTIPASS_BATCH bags: more indices than the accumulator holds,
        # so it may run in passes (docs/embedding.md, "Passes"); Zipf rows (they fit
        # one pass) and uniform ones (they do not).
        **{f"update_multipass_{k}_{key}": run[field] for k, run in multipass.items()
           for key, field in (("passes", "eng_upd_passes"), ("distinct_rows", "distinct_rows"),
                              ("cycles_per_gradient_line", "cycles_per_gradient_line"))},
        "pmem_lines_update_zipf": update.get("pmem_lines"),
        "pmem_media_bytes_update_zipf": update.get("pmem_media_bytes"),
        "fp_vectors_checked": sum(c["vectors"] for c in checks.values()),
        "fp_mismatches": sum(c["mismatches"] for c in checks.values()),
        "gather_runs": gather,
        "update_run": update,
        "update_multipass_runs": multipass,
        "fp_checks": checks,
        "targets": {"gather_utilization_p20": ">= 0.90",
                    "update_cycles_per_gradient_line": "<= 1.5"},
        "wall_seconds": round(time.monotonic() - t0, 1),
    }


#: The checkpoint benchmark's workload: the engine workload, and the GPU's
#: forward and backward pass per batch modelled as 25,000 device cycles (100 us at
#: 250 MHz) during which the engine is idle; 64 KiB of MLP parameters (16,384 fp32)
#: checkpointed after every batch with relaxation K = 4.
CKPT_WORKLOAD = {**ENGINE_WORKLOAD, "pooling": 20, "gpu_cycles": 25_000,
                 "mlp_bytes": 65_536, "mlp_k": 4}


def bench_ckpt(config_name: str, sim: str, seed: int | None) -> dict:
    config = load_config(config_name)
    t0 = time.monotonic()
    runs = {}
    for logging in (0, 1):
        print(f"  training iterations, logging {'on' if logging else 'off'} ...")
        runs[logging] = _measure("bench_iteration", config, sim,
                                 {**CKPT_WORKLOAD, "logging": logging, "n_iter": 1}, seed,
                                 module="tb.bench_ckpt", tag=f"-log{logging}")
    print("  recovery of one uncommitted batch ...")
    rec = _measure("bench_recovery", config, sim, CKPT_WORKLOAD, seed, module="tb.bench_ckpt")
    print("  crash campaign ...")
    small = load_config("small")
    camp = _measure("test_crash_campaign", small, sim, {"n_points": 30}, seed,
                    module="tb.test_ckpt")
    return {
        "benchmark": "ckpt",
        "simulator": sim,
        "config": config.name,
        "critical_path_overhead": round(runs[1]["cycles_per_iteration"]
                                        / runs[0]["cycles_per_iteration"], 4),
        "crash_points_tried": camp["crash_points_tried"],
        "crash_points_survived": camp["crash_points_survived"],
        "recovery_cycles": rec["recovery_cycles"],
        "iteration_runs": {"logging_off": runs[0], "logging_on": runs[1]},
        "recovery_run": rec,
        "campaign_run": camp,
        "targets": {"critical_path_overhead": "<= 1.02"},
        "wall_seconds": round(time.monotonic() - t0, 1),
    }


#: The platform of ``system.json`` unless ``--platform`` names another
#: (``docs/platform.md``); the block benchmarks keep ``ideal-1ch``.
SYSTEM_PLATFORM = DEFAULT_PLATFORM

#: The modes of ``sim.train`` under the baseline names of ``system.json``.
MODE_NAMES = {"trainingcxl": "trainingcxl", "baseline": "gpu-direct",
              "trainingcxl-sw-ckpt": "trainingcxl-sw-ckpt"}

#: Batch size and count per preset for ``system.json`` (tables, dims, pooling and MLPs
#: stay the preset's): each mode of each preset then simulates in a few minutes.
SYSTEM_OVERRIDES: dict[str, dict[str, int]] = {
    "default": {"batch": 8, "batches": 6},
    "kaggle-like": {"batch": 8, "batches": 3},
    "multi-hot": {"batch": 4, "batches": 3},
}


def bench_system(config_name: str, sim: str, seed: int | None,
                 platform: str = SYSTEM_PLATFORM) -> dict:
    from .host_software import host_software_run
    from .platform import get_platform
    from .train import device_bytes, reference_train, tables_digest
    from .train import main as train_main
    from .workloads import get_workload

    config = load_config(config_name)
    plat = get_platform(platform)
    seed = 1 if seed is None else seed
    t0 = time.monotonic()
    presets = {}
    all_cycles, all_sim_s = 0, 0.0
    for preset, overrides in SYSTEM_OVERRIDES.items():
        need = device_bytes(get_workload(preset).with_overrides(**overrides), config)
        if need > config.hdm_size:
            print(f"  preset {preset}: skipped, needs {need} bytes of device memory")
            presets[preset] = {"skipped": f"needs {need} bytes, hdm_size {config.hdm_size}"}
            continue
        print(f"  preset {preset} {overrides} ...")
        prefix = BUILD / "bench" / "raw" / f"system-{preset}-{config_name}-{sim}-{platform}"
        argv = ["--preset", preset, "--config", config_name, "--sim", sim, "--seed", str(seed),
                "--platform", platform,
                "--crash-at", "-1", "--batches", str(overrides["batches"]), "--batch",
                str(overrides["batch"]), "--out", str(prefix)]
        if train_main(argv) != 0:
            raise RuntimeError(f"training preset {preset} failed")
        data = json.loads(prefix.with_name(prefix.name + ".json").read_text())
        ablation = prefix.with_name(prefix.name + "-sw-ckpt")
        if train_main([*argv[:-1], str(ablation), "--mode", "trainingcxl-sw-ckpt"]) != 0:
            raise RuntimeError(f"preset {preset}: the sw-ckpt ablation failed")
        sw = json.loads(ablation.with_name(ablation.name + ".json").read_text())
        data["runs"]["trainingcxl-sw-ckpt"] = sw["runs"]["trainingcxl-sw-ckpt"]
        summary = {**data["summary"], **sw["summary"]}
        cycles = sum(r["total_cycles"] for r in data["runs"].values())
        wall = sum(r["wall_seconds"] for r in data["runs"].values())
        sim_s = [r.get("sim_seconds") for r in data["runs"].values()]
        all_cycles += cycles
        all_sim_s = None if None in sim_s or all_sim_s is None else all_sim_s + sum(sim_s)
        workload = get_workload(preset).with_overrides(**overrides)
        host = host_software_run(workload, seed, plat)
        reference = reference_train(workload, seed, partials=config.reduce_partials)
        tc, gd = summary["trainingcxl"], summary["baseline"]

        def media_bytes(s: dict) -> int:
            return (s["pmem_media_reads"] + s["pmem_media_writes"]) * plat.pmem_media_bytes

        presets[preset] = {
            "overrides": overrides,
            "speedup_vs_gpu_direct": round(data["speedup"], 4),
            "speedup_vs_host_software": round(host["cycles"] / tc["cycles"], 4),
            "energy_saving_vs_gpu_direct": round(data["energy_saving"], 4),
            "energy_saving_vs_host_software": round(
                1 - tc["energy_j"]["total_j"] / host["energy_j"]["total_j"], 4),
            "pmem_media_bytes_ratio_vs_gpu_direct": round(media_bytes(tc) / media_bytes(gd), 4),
            "link_bytes_ratio_vs_gpu_direct": round(tc["link_bytes"] / gd["link_bytes"], 4),
            "speedup_vs_sw_ckpt_ablation": round(
                summary["trainingcxl-sw-ckpt"]["cycles"] / tc["cycles"], 4),
            "sw_ckpt_ablation_tables_identical": (
                sw["runs"]["trainingcxl-sw-ckpt"]["tables_digest"]
                == data["runs"]["trainingcxl"]["tables_digest"]),
            "cycles_per_iteration": {
                **{MODE_NAMES[m]: round(v["cycles_per_iteration"], 1)
                   for m, v in summary.items()},
                "host-software": round(host["cycles_per_iteration"], 1)},
            "phase_cycles_per_iteration": {
                **{MODE_NAMES[m]: {k: round(c, 1) for k, c in
                                   v["phase_cycles_per_iteration"].items()}
                   for m, v in summary.items()},
                "host-software": {k: round(c, 1) for k, c in
                                  host["phase_cycles_per_iteration"].items()}},
            "pmem_media_bytes_per_iteration": {
                MODE_NAMES[m]: media_bytes(v) / v["iterations"] for m, v in summary.items()},
            "link_bytes_per_iteration": {
                **{MODE_NAMES[m]: v["link_bytes"] / v["iterations"]
                   for m, v in summary.items()},
                "host-software (PCIe)": host["pcie_bytes"] / host["iterations"]},
            "energy_j_per_iteration": {
                **{MODE_NAMES[m]: v["energy_j"]["total_j"] / v["iterations"]
                   for m, v in summary.items()},
                "host-software": host["energy_j"]["total_j"] / host["iterations"]},
            # The device's own counters since reset, per mode: link bytes each way next
            # to the bench's count of the same messages (the link figures above count
            # the measured iterations only), and the engine's PMEM lines per kind.
            "device_counters": {
                MODE_NAMES[m]: _device_counters(r.get("device_counters_after_last_reset", {}))
                for m, r in data["runs"].items()},
            "tables_identical": data.get("tables_identical", False),
            "host_software_tables_identical": (
                tables_digest(reference.tables) == data["runs"]["trainingcxl"]["tables_digest"]),
            "host_software_cpu": host["cpu"],
            "sim_cycles_per_second": (round(cycles / sum(sim_s), 1) if None not in sim_s
                                      else None),
            "wall_cycles_per_second": round(cycles / wall, 1),
        }
    return {
        "benchmark": "system",
        "simulator": sim,
        "config": config_name,
        "platform": platform,
        "platform_constants": plat.summary(),
        "seed": seed,
        "sim_cycles_per_second": (round(all_cycles / all_sim_s, 1) if all_sim_s else None),
        "presets": presets,
        "paper_reference": {"speedup_vs_host_software": 5.2, "energy_saving": 0.76},
        "wall_seconds": round(time.monotonic() - t0, 1),
    }


#: Batch size of the performance model's predictions beyond the RTL's reach.
PERFMODEL_PREDICT_BATCH = 2048


def bench_perfmodel(config_name: str, sim: str, seed: int | None,
                    platform: str = SYSTEM_PLATFORM) -> dict:
    """Fit ``sim/perfmodel.py`` on RTL runs, check it on held-out RTL runs, predict the
    presets at :data:`PERFMODEL_PREDICT_BATCH` samples (with the host-software model at
    the same size)."""
    from hw.ckpt.logger import hold_lines

    from . import perfmodel as pm
    from .host_software import host_software_run
    from .platform import get_platform
    from .train import main as train_main

    seed = 1 if seed is None else seed
    plat = get_platform(platform)
    t0 = time.monotonic()
    runs = {}
    for point in (*pm.FIT_POINTS, *pm.HELDOUT_POINTS):
        print(f"  RTL point {point.name} ...")
        prefix = BUILD / "bench" / "raw" / f"perfmodel-{point.name}-{config_name}-{sim}-{platform}"
        argv = ["--preset", point.preset, "--config", config_name, "--sim", sim, "--seed",
                str(seed), "--platform", platform, "--crash-at", "-1", "--batches",
                str(point.batches), "--batch", str(point.batch), "--out", str(prefix)]
        if train_main(argv) != 0:
            raise RuntimeError(f"RTL point {point.name} failed")
        runs[point] = json.loads(prefix.with_name(prefix.name + ".json").read_text())
    fit_runs = {p: runs[p] for p in pm.FIT_POINTS}
    model = pm.fit(fit_runs, seed, hold_lines(load_config(config_name).ckpt_fifo_lines))
    fitted = pm.validate(model, fit_runs, seed)
    heldout = pm.validate(model, {p: runs[p] for p in pm.HELDOUT_POINTS}, seed)
    predictions = {}
    for preset in SYSTEM_OVERRIDES:
        w = pm.Point(preset, PERFMODEL_PREDICT_BATCH).workload()
        tc = pm.predict_run(model, w, seed, "trainingcxl")
        gd = pm.predict_run(model, w, seed, "baseline")
        hs = host_software_run(w, seed, plat)
        predictions[f"{preset}-b{PERFMODEL_PREDICT_BATCH}"] = {
            "cycles_per_iteration": {"trainingcxl": round(tc["cycles_per_iteration"], 1),
                                     "gpu-direct": round(gd["cycles_per_iteration"], 1),
                                     "host-software": round(hs["cycles_per_iteration"], 1)},
            "speedup_vs_gpu_direct": round(gd["cycles_per_iteration"]
                                           / tc["cycles_per_iteration"], 4),
            "speedup_vs_host_software": round(hs["cycles_per_iteration"]
                                              / tc["cycles_per_iteration"], 4),
        }
    return {
        "benchmark": "perfmodel",
        "simulator": sim,
        "config": config_name,
        "platform": platform,
        "seed": seed,
        "fit_points": [p.name for p in pm.FIT_POINTS],
        "heldout_points": [p.name for p in pm.HELDOUT_POINTS],
        "coefficients": model.as_dict(),
        "fit_errors": fitted,
        "heldout_errors": heldout,
        "max_fit_error": max(v["relative_error"] for v in fitted.values()),
        "max_heldout_error": max(v["relative_error"] for v in heldout.values()),
        "predictions": predictions,
        "targets": {"max_heldout_error": "<= 0.10"},
        "wall_seconds": round(time.monotonic() - t0, 1),
    }


#: The coherence benchmark's workloads: PMEM as in the engine benchmark (reads
#: 120 cycles, writes 40, one line per cycle, one channel); the gather's table (4,096 rows
#: of dim 64 fp32, 1 MiB: 16 pages of 64 KiB in ``default``) read by 2 LOOKUPs of 128 bags
#: x 20 rows, the host answering a host-bias RdCurr with its MemRdFwd after
#: 50 cycles; a 512 KiB MLP snapshot of GPU memory with the GPU answering after 100.
COH_PMEM = {"pmem_read_latency": 120, "pmem_write_latency": 40, "pmem_jitter": 0,
            "pmem_channels": 1, "pmem_peak": 1.0}
COH_GATHER = {**COH_PMEM, "dim": 64, "batch": 128, "pooling": 20, "rows": 4096, "n_desc": 2,
              "host_latency": 50, "gpu_latency": 100}
COH_RDCURR = {**COH_PMEM, "mlp_lines": 8192, "gpu_latency": 100, "host_latency": 50}


def bench_coherence(config_name: str, sim: str, seed: int | None) -> dict:
    config = load_config(config_name)
    t0 = time.monotonic()
    print("  gather, table in host bias and in device bias ...")
    gather = _measure("bench_gather_bias", config, sim, COH_GATHER, seed,
                      module="tb.bench_coherence")
    print("  RdCurr snapshot of GPU memory ...")
    rdcurr = _measure("bench_rdcurr", config, sim, COH_RDCURR, seed,
                      module="tb.bench_coherence")
    return {
        "benchmark": "coherence",
        "simulator": sim,
        "config": config.name,
        "device_bias_gather_speedup": gather["device_bias_gather_speedup"],
        "rdcurr_utilization": rdcurr["rdcurr_utilization"],
        "coherence_checks": gather["coherence_checks"] + rdcurr["coherence_checks"],
        "gather_run": gather,
        "rdcurr_run": rdcurr,
        "targets": {"rdcurr_utilization": ">= 0.90"},
        "wall_seconds": round(time.monotonic() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--sim", default="verilator", choices=toolenv.SIMULATORS)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--only", choices=("mem_endpoint", "engine", "ckpt", "coherence",
                                           "system", "perfmodel"),
                        help="run one benchmark (default: all)")
    parser.add_argument("--platform", default=SYSTEM_PLATFORM, type=platform_arg,
                        help="platform of the system benchmark (default: %(default)s; the "
                             "block benchmarks run on ideal-1ch)")
    args = parser.parse_args(argv)
    toolenv.setup()
    out_dir = BUILD / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    benches = {"mem_endpoint": (bench_mem_endpoint, ("sim_speed_runs",)),
               "engine": (bench_engine, ("gather_runs", "update_run", "update_multipass_runs",
                                               "fp_checks")),
               "ckpt": (bench_ckpt, ("iteration_runs", "recovery_run", "campaign_run")),
               "coherence": (bench_coherence, ("gather_run", "rdcurr_run")),
               "system": (functools.partial(bench_system, platform=args.platform), ()),
               "perfmodel": (functools.partial(bench_perfmodel, platform=args.platform),
                             ("fit_errors", "coefficients"))}
    for name, (bench, details) in benches.items():
        if args.only and name != args.only:
            continue
        print(f"{name} benchmark ({args.config}, {args.sim}) ...")
        result = bench(args.config, args.sim, args.seed)
        path = out_dir / f"{name}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k not in details}, indent=2))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
