"""cocotb benchmarks of the checkpoint path (``make bench`` via ``sim/bench.py``).

Each test writes its figures as JSON to the path in the ``out`` test parameter; nothing
is asserted about speed, but every descriptor is checked bit for bit while measured and
recovery's result is checked against the golden tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
import numpy as np

from hw.engine.descriptor import DescKind, Status
from sim import embedding as emb
from sim.embedding import FP32
from tb import env
from tb.bench_engine import _fixed_bags
from tb.bench_mem import BENCH_TIMING
from tb.ckpt_driver import CkptDriver
from tb.device_tb import DeviceTB
from tb.engine_driver import random_table


def _write(result: dict) -> None:
    out = Path(env.params()["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


async def _setup(dut, name: str, *, logging: bool, rows: int, dim: int, batch: int,
                 pooling: int, mlp_bytes: int = 1024):
    tb = DeviceTB(dut, name, timing=BENCH_TIMING)
    await tb.start()
    drv = CkptDriver(tb, log_slots=1 << (batch * pooling - 1).bit_length(), ring_order=6,
                     heap_end=tb.config.pmem_size, mlp_bytes=mlp_bytes)
    await drv.setup()
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    table = await drv.add_table(random_table(rng, rows, dim, FP32))
    if logging:
        drv.format()
        res = await drv.recover()
        assert res.status == 0, res
    return tb, drv, rng, table


@cocotb.test()
async def bench_iteration(dut):
    """Cycles per training iteration: LOOKUP (capturing when ``logging``), the GPU's
    forward and backward pass modelled as ``gpu_cycles`` idle cycles (during which the
    GPU stages its ``mlp_bytes`` of MLP parameters when ``logging``), UPDATE, COMMIT,
    and with ``logging`` an MLP_CHECKPOINT of the batch (relaxation ``mlp_k``); ``n_iter``
    iterations after one warm-up. With ``logging`` off none of the checkpoint work is
    done (checkpointing off: no recovery, no capture, no commit word, no copy)."""
    p = env.params()
    logging = bool(p["logging"])
    rows, dim, batch, pooling = p["rows"], p["dim"], p["batch"], p["pooling"]
    gpu, n_iter, mlp_bytes = int(p["gpu_cycles"]), int(p["n_iter"]), int(p["mlp_bytes"])
    tb, drv, rng, table = await _setup(dut, f"bench_iter_log{int(logging)}", logging=logging,
                                       rows=rows, dim=dim, batch=batch, pooling=pooling,
                                       mlp_bytes=mlp_bytes)
    await tb.csr.write("CK_MLP_K", int(p["mlp_k"]))
    mark = drv.heap.next
    start = None
    phases = {"lookup": 0, "gpu": 0, "update_commit": 0}
    for b in range(1, n_iter + 2):
        if b == 2:
            start = tb.loop.cycle
            await tb.csr.write("PERF_CTRL", 1)
            phases = dict.fromkeys(phases, 0)
        drv.heap.release(mark)
        bags = _fixed_bags(rng, batch, pooling, rows, 1.05)
        t0 = tb.loop.cycle
        await drv.lookup(table, bags, batch_id=b, capture_undo=logging)
        await drv.run(timeout=5_000_000)
        t1 = tb.loop.cycle
        await tb.loop.wait_cycles(gpu)
        t2 = tb.loop.cycle
        grads = (rng.standard_normal((batch, dim)) * 0.01).astype(np.float32)
        exp = await drv.update(table, bags, grads, batch_id=b)
        assert exp.status is Status.OK
        await drv.plain(DescKind.COMMIT, batch_id=b)
        if logging:
            # The GPU staged its parameters during its compute time (a backdoor write
            # here, so the staging costs the device nothing it would not cost anyway).
            exp = await drv.mlp_checkpoint(b, rng.bytes(mlp_bytes))
            assert exp.status is Status.OK, exp.status
        await drv.run(timeout=5_000_000)
        t3 = tb.loop.cycle
        phases["lookup"] += t1 - t0
        phases["gpu"] += t2 - t1
        phases["update_commit"] += t3 - t2
    cycles = tb.loop.cycle - start
    records = await tb.csr.read64("CK_RECORDS")
    stall = await tb.csr.read64("CK_UNDO_STALL")
    mlp_lines = await tb.csr.read64("CK_MLP_LINES")
    mlp_stall = await tb.csr.read64("CK_MLP_STALL")
    if logging:
        await drv.wait_mlp(n_iter + 1, timeout=5_000_000)       # the last copy, checked
    _write({
        "logging": logging, "iterations": n_iter, "gpu_cycles": gpu, "rows": rows,
        "dim": dim, "batch": batch, "pooling": pooling,
        "cycles_per_iteration": round(cycles / n_iter, 1),
        "phase_cycles_per_iteration": {k: round(v / n_iter, 1) for k, v in phases.items()},
        "undo_records_per_iteration": round(records / n_iter, 1),
        "gather_stall_cycles_per_iteration": round(stall / n_iter, 1),
        "mlp_bytes": mlp_bytes if logging else 0,
        "mlp_lines_copied_per_iteration": round(mlp_lines / n_iter, 1),
        "commit_wait_for_mlp_cycles_per_iteration": round(mlp_stall / n_iter, 1),
        "descriptors_checked": drv.checked,
    })


@cocotb.test()
async def bench_recovery(dut):
    """Recovery cycles for a log holding one uncommitted batch of the workload: LOOKUP
    (capturing) and UPDATE of batch 1 without COMMIT, power failure, reset, recovery;
    the table must be back to its state before batch 1."""
    p = env.params()
    rows, dim, batch, pooling = p["rows"], p["dim"], p["batch"], p["pooling"]
    tb, drv, rng, table = await _setup(dut, "bench_recovery", logging=True, rows=rows,
                                       dim=dim, batch=batch, pooling=pooling)
    before = table.data
    bags = _fixed_bags(rng, batch, pooling, rows, 1.05)
    await drv.lookup(table, bags, batch_id=1, capture_undo=True)
    grads = (rng.standard_normal((batch, dim)) * 0.01).astype(np.float32)
    await drv.update(table, bags, grads, batch_id=1)
    await drv.run(timeout=5_000_000)
    await tb.reset_device(power_fail=True)
    drv.reset_state()
    await drv.setup()
    res = await drv.recover(timeout=10_000_000)
    assert res.status == 0 and res.committed == 0, res
    got = tb.pmem.read(table.base, table.nbytes)
    assert got == emb.pack_rows(before), "recovery did not restore the table"
    _write({
        "rows": rows, "dim": dim, "batch": batch, "pooling": pooling,
        "log_slots": drv.log_slots, "slot_lines": drv.slot_lines,
        "recovery_cycles": res.cycles, "records_rolled_back": res.rolled_back,
        "distinct_rows": emb.coalesce_stats(bags.indices, bags.offsets).distinct_rows,
    })
