"""cocotb tests of the embedding engine inside the whole device (``tcxl_device_<config>``).

The host side is :class:`~tb.engine_driver.EngineDriver` on top of
:class:`~tb.device_tb.DeviceTB`: descriptors in the ring, doorbell and head over CSRs,
PMEM behind the AXI model with random latency, jitter, idle cycles and backpressure on
every channel. Each completed descriptor is checked against the golden models of
``sim/embedding.py`` bit for bit (pooled vectors with their padding, tables, completion
records); every test ends with the protocol checkers silent and the host agent's golden
memory equal to PMEM on every line the host or the engine wrote.

Test parameters (``tb.env.params()``): ``n_desc`` (descriptors per random test) and
the ``pmem_*`` timing knobs of :meth:`~tb.device_tb.DeviceTB.timing_from_params`.
"""

from __future__ import annotations

import json
from pathlib import Path

import cocotb
import numpy as np

from hw.engine.descriptor import ADDR_BITS, DescKind, PoolMode, Status
from hw.engine.engine import PMEM_KIND_CSRS
from sim import embedding as emb
from sim.embedding import BF16, FP32, LINE_BYTES
from tb.device_tb import DeviceTB
from tb.engine_driver import Batch, EngineDriver, random_table
from tb.groups import group

NOISE = {"idle": [False, True], "backpressure": [False, True]}
#: Embedding dims tried (those above the device's engine_max_dim are skipped): one
#: line, a partial line, several lines, a non-power-of-two line count.
DIMS = (16, 40, 64, 8, 100, 176, 256)


async def _start(dut, name: str, *, idle=False, backpressure=False, ring_order=4,
                 via_cxl=False, heap_start=0, after_reset=None, **kw):
    """A started bench, its engine driver (ring programmed) and a numpy generator;
    ``after_reset(tb)`` (a coroutine function) runs before the driver's first access."""
    tb = DeviceTB(dut, name, idle=idle, backpressure=backpressure, **kw)
    await tb.start()
    if after_reset is not None:
        await after_reset(tb)
    drv = EngineDriver(tb, ring_order=ring_order, via_cxl=via_cxl, heap_start=heap_start)
    await drv.setup()
    rng = np.random.default_rng(tb.rng.getrandbits(64))
    return tb, drv, rng


async def _finish(tb: DeviceTB, drv: EngineDriver) -> None:
    assert not drv.pending, "descriptors queued but never checked"
    err = await tb.csr.read("ENG_ERR")
    tb.log.info("%d descriptors checked; ENG_ERR %#x", drv.checked, err)
    await tb.finish()


def _dims(tb: DeviceTB) -> list[int]:
    return [d for d in DIMS if d <= tb.config.engine_max_dim]


def _random_batch(rng: np.random.Generator, rows: int, num_bags: int, *, pooling: float,
                  weighted=False, padding=False, include_last=False, empty=0.1,
                  long=0.0, zipf=None, max_len=None) -> Batch:
    pad = int(rng.integers(0, rows)) if padding else None
    idx, off = emb.random_bags(rng, num_bags, rows, pooling=pooling, zipf_alpha=zipf,
                               padding_idx=pad, empty_fraction=empty, long_fraction=long,
                               max_len=max_len, include_last_offset=include_last)
    weights = (rng.standard_normal(len(idx)).astype(np.float32) if weighted else None)
    return Batch(idx, off, include_last, weights, pad)


def _table_rows(tb: DeviceTB, dim: int, dtype, budget: int) -> int:
    """Rows so that the table takes about ``budget`` bytes (at least 8)."""
    row_bytes = emb.lines_per_row(dim, dtype) * LINE_BYTES
    return max(8, budget // row_bytes)


def _budget(tb: DeviceTB) -> int:
    """Bytes a test may give one table: a slice of the HDM window."""
    return min(tb.config.hdm_size // 16, 1 << 16)


# --- LOOKUP ------------------------------------------------------------------------------

@group("lookup")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_lookup_random(dut, idle, backpressure):
    """Random LOOKUPs over fp32 and bf16 tables of several dims: every mode, weighted
    sums, padding_idx, include_last_offset, empty, single-row and duplicate-heavy bags;
    several descriptors per doorbell so that LOOKUPs of different tables, modes and
    dtypes follow each other through the pipeline."""
    tb, drv, rng = await _start(dut, "lookup_random", idle=idle, backpressure=backpressure)
    n_desc = tb.params.get("n_desc", 12)
    tables = []
    for dim in _dims(tb)[:4]:
        for dtype in (FP32, BF16):
            rows = _table_rows(tb, dim, dtype, _budget(tb) // 2)
            tables.append(await drv.add_table(random_table(rng, rows, dim, dtype), rng=rng))
    mark = drv.heap.next
    done = 0
    while done < n_desc:
        drv.heap.release(mark)      # the buffers of checked descriptors are reused
        wave = int(rng.integers(1, 5))
        for _ in range(wave):
            table = tables[int(rng.integers(len(tables)))]
            mode = PoolMode(int(rng.integers(3)))
            weighted = mode is PoolMode.SUM and rng.random() < 0.5
            batch = _random_batch(rng, table.rows, int(rng.integers(0, 12)),
                                  pooling=float(rng.choice([1, 3, 8])), weighted=weighted,
                                  padding=rng.random() < 0.3,
                                  include_last=rng.random() < 0.3,
                                  zipf=1.05 if rng.random() < 0.5 else None)
            await drv.lookup(table, batch, mode=mode, batch_id=done)
            done += 1
        await drv.run()
    await _finish(tb, drv)


@group("lookup")
@cocotb.test()
async def test_lookup_long_bags(dut):
    """Bags of 200 to 300 rows (each partial accumulates many rows) and a batch whose
    every bag repeats one row, in sum, mean and max."""
    tb, drv, rng = await _start(dut, "lookup_long_bags", idle=True, backpressure=True)
    dim = _dims(tb)[1]
    table = await drv.add_table(rng=rng, data=random_table(rng, 32, dim, FP32))
    for mode in PoolMode:
        batch = _random_batch(rng, table.rows, 3, pooling=4, long=1.0)
        await drv.lookup(table, batch, mode=mode)
    same = np.full(60, 7, np.int32)
    await drv.lookup(table, Batch(same, np.array([0, 20, 20, 50], np.int32)),
                     mode=PoolMode.MEAN)
    await drv.run()
    await _finish(tb, drv)


@group("lookup")
@cocotb.test()
async def test_lookup_specials(dut):
    """Tables holding ±0, subnormals, ±inf and NaN: results bit exact, NaN canonical."""
    tb, drv, rng = await _start(dut, "lookup_specials", idle=True, backpressure=True)
    for dtype in (FP32, BF16):
        data = random_table(rng, 24, _dims(tb)[0], dtype, specials=True)
        table = await drv.add_table(data, rng=rng)
        for mode in PoolMode:
            batch = _random_batch(rng, table.rows, 6, pooling=4,
                                  weighted=mode is PoolMode.SUM)
            await drv.lookup(table, batch, mode=mode)
    await drv.run()
    await _finish(tb, drv)


#: Lines of a 4 KiB page: no AXI burst crosses one, so a buffer's reader splits its
#: burst there (``hw/engine/buffer_reader.py``).
PAGE_LINES = 4096 // LINE_BYTES


def _to_page_line(drv: EngineDriver, line: int) -> None:
    """Skip heap space so that the next buffer starts at line ``line`` of a 4 KiB page
    (the driver lays out a LOOKUP's indices, offsets, weights and output in that order,
    back to back)."""
    gap = (line - drv.heap.next // LINE_BYTES) % PAGE_LINES
    if gap:
        drv.heap.alloc(gap * LINE_BYTES)


def _words_lines(words: int) -> int:
    return -(-words // 16)


@group("lookup")
@cocotb.test()
async def test_lookup_replay_page_split(dut):
    """LOOKUPs small enough for the bag sequencers' replay store (pass 2 takes their
    offsets and indices from it; ``docs/embedding.md``) whose indices, or offsets,
    straddle a 4 KiB page, so that pass 1 reads, and pass 2 replays, that buffer in two
    bursts: after the first round of the three pass-2 readers (offsets, the emitter's
    and the count scan's indices; round robin on the store) either both indices copies
    ask again and the offsets do not, or the offsets ask again alone. Each shape goes
    to both sequencers (descriptor ``k`` to sequencer ``k mod 2``), the split indices
    first after reset, when the store's round robin starts at the offsets. Pooled
    vectors and records exact against the golden model."""
    tb, drv, rng = await _start(dut, "lookup_replay_split", idle=True, backpressure=True)
    table = await drv.add_table(random_table(rng, 24, _dims(tb)[0], FP32), rng=rng)
    sizes = []
    # (indices, bags, page line of the indices): the indices in lines 63 and 0; then
    # the offsets in lines 63 and 0 (the indices in one line before them).
    for n_idx, n_bags, at in ((20, 4, PAGE_LINES - 1), (12, 18, PAGE_LINES - 2)):
        for _ in range(tb.config.engine_sequencers):
            idx = rng.integers(0, table.rows, n_idx).astype(np.int32)
            off = np.sort(rng.integers(0, n_idx + 1, n_bags)).astype(np.int32)
            off[0] = 0
            weights = rng.standard_normal(n_idx).astype(np.float32)
            _to_page_line(drv, at)
            exp = await drv.lookup(table, Batch(idx, off, weights=weights))
            assert exp.status is Status.OK, exp.status
            f = exp.fields
            sizes.append((_words_lines(f["num_bags"]), _words_lines(f["num_indices"])))
    await drv.run()
    # 3 lines each: replayed by every preset (a config without a replay store reads
    # them again from PMEM, and the test checks only the results).
    tb.log.info("LOOKUPs of (offset lines, index lines) %s; replay store of %d lines",
                sizes, tb.config.seq_replay_lines)
    await _finish(tb, drv)


@group("lookup")
@cocotb.test()
async def test_lookup_long_buffers_round_robin(dut):
    """Weighted LOOKUPs too large for the replay store (of ``small`` and ``odd``),
    shaped so that the four pass-2 buffer readers of a bag sequencer (offsets, indices,
    count-scan indices, weights; round robin on one PMEM read port, each with a 32-line
    buffer) ask in orders the random tests do not produce. 456 bags: the first three
    hold 288, 288 and 432 indices (63 lines), mostly the padding index, the rest are
    empty. The offsets take 29 lines from the last line of a 4 KiB page: five bursts
    that all fit their buffer, so the offsets reader takes the last grant of pass 2's
    first round. The emitter cannot start a bag before the count scan has counted it,
    so the scan's copy of the indices asks next, alone, while the emitter's copy and the
    weights sit on full buffers. Then the emitter streams each bag while the scan
    counts the next, 288 indices (2.25 bursts) ahead; the weights (from page line 28:
    bursts of 8, 8, 8, 8, then 4 to the page end) ask half a burst before the emitter's
    indices, and the scan's copy asks between the two. ``n_round_robin`` such LOOKUPs
    (default 2: one per sequencer of ``small``, descriptor ``k`` going to sequencer
    ``k mod 2``), each in its own doorbell so that its rows are not held behind the
    other's. Pooled vectors and records exact against the golden model."""
    tb, drv, rng = await _start(dut, "lookup_long_round_robin", idle=True, backpressure=True)
    table = await drv.add_table(random_table(rng, 32, _dims(tb)[0], FP32), rng=rng)
    pad = int(rng.integers(0, table.rows))
    lengths, n_bags = (288, 288, 432), 456
    starts = np.cumsum((0, *lengths))
    mark = drv.heap.next
    for _ in range(min(tb.params.get("n_round_robin", 2), tb.config.engine_sequencers)):
        drv.heap.release(mark)
        idx = np.full(starts[-1], pad, np.int32)
        real = rng.random(len(idx)) < 0.08
        idx[real] = rng.integers(0, table.rows, int(real.sum()))
        off = np.full(n_bags, starts[-1], np.int32)
        off[:len(lengths)] = starts[:-1]
        weights = rng.standard_normal(len(idx)).astype(np.float32)
        idx_lines, off_lines = _words_lines(len(idx)), _words_lines(n_bags)
        # Offsets from page line 63 (bursts of 1, 8, 8, 8, 4 lines); the indices end
        # right before them, the weights start right after them, at page line 28
        # (bursts of 8, 8, 8, 8, 4, 8, ...).
        _to_page_line(drv, PAGE_LINES - 1 - idx_lines)
        exp = await drv.lookup(table, Batch(idx, off, weights=weights, padding_idx=pad))
        f = exp.fields
        assert exp.status is Status.OK, exp.status
        assert f["offsets_addr"] // LINE_BYTES % PAGE_LINES == PAGE_LINES - 1
        assert f["weights_addr"] // LINE_BYTES % PAGE_LINES == (off_lines - 1) % PAGE_LINES
        if idx_lines + off_lines <= tb.config.seq_replay_lines:
            # The default device's store holds them: pass 2 reads only the weights.
            tb.log.info("replayed on this device: the readers' orders are not tested")
        await drv.run()
    await _finish(tb, drv)


# --- UPDATE ------------------------------------------------------------------------------

@group("update")
@cocotb.test()
@cocotb.parametrize(**NOISE)
async def test_update_random(dut, idle, backpressure):
    """UPDATEs with repeated rows (Zipf indices), weights, padding_idx and bf16 rounding
    after every update; LOOKUPs of the same table before and after each UPDATE, and
    UPDATEs of the same table back to back, in the same doorbell (read-after-write
    across descriptors, with several bag sequencers checking ahead). Tables compared bit
    for bit, ``rows_written`` against the documented direct-mapped cache."""
    tb, drv, rng = await _start(dut, "update_random", idle=idle, backpressure=backpressure)
    n_desc = tb.params.get("n_desc", 12)
    done = 0
    dims = _dims(tb)
    mark = drv.heap.next
    while done < n_desc:
        drv.heap.release(mark)
        dim = int(rng.choice(dims[:4]))
        dtype = BF16 if rng.random() < 0.5 else FP32
        table = await drv.add_table(rng=rng, data=random_table(rng, 40, dim, dtype))
        for _ in range(2):
            mode = PoolMode(int(rng.integers(2)))          # sum or mean
            batch = _random_batch(rng, table.rows, int(rng.integers(1, 8)), pooling=4,
                                  weighted=rng.random() < 0.5, padding=rng.random() < 0.3,
                                  include_last=rng.random() < 0.3, zipf=1.05)
            grads = (rng.standard_normal((batch.num_bags, dim)) * 0.1).astype(np.float32)
            await drv.lookup(table, batch, mode=mode, batch_id=done)
            await drv.update(table, batch, grads, mode=mode, batch_id=done)
            done += 2
            if rng.random() < 0.5:      # the same rows again, right behind
                await drv.update(table, batch, -grads, mode=mode, batch_id=done)
                done += 1
        await drv.lookup(table, _random_batch(rng, table.rows, 4, pooling=6))
        done += 1
        await drv.run()
    await _finish(tb, drv)


@group("update")
@cocotb.test()
async def test_update_passes(dut):
    """UPDATEs larger than the accumulator run in passes (``docs/embedding.md``,
    "Passes"), each of one index more than the accumulator holds: of as many distinct
    random rows, weighted (the first pass, of every row, overflows; two passes of level
    1 follow); of as many distinct rows all in the first half of level 1 (that pass
    overflows too and is replaced by its two halves); of a few rows repeated (they fit
    the first pass). Then an UPDATE that fits by its size. Tables bit for bit and the
    records' ``rows_written`` / ``updates`` (the driver's checks), ENG_UPD_PASSES the
    passes of the golden schedule (``sim.embedding.update_passes``),
    ENG_UPD_DISTINCT_ROWS the distinct rows, and ENG_PMEM_RD_UPDATE the gradients once
    per pass and every distinct row's lines once: no row is read twice, not even for
    a pass that overflowed."""
    tb, drv, rng = await _start(dut, "update_passes", idle=True, backpressure=True)
    await tb.csr.write("PERF_CTRL", 1)
    cfg = tb.config
    acc = (cfg.update_acc_rows, cfg.update_acc_lines)
    dim = _dims(tb)[0]
    glines = emb.grad_lines(dim, False)
    limit = min(acc[0], acc[1] // glines)
    half = [r for r in range(4 * limit) if emb.pass_hash(r) & 1 == 0][:limit + 1]
    table = await drv.add_table(rng=rng, data=random_table(rng, half[-1] + 1, dim, FP32))
    passes = distinct = grad_reads = 0
    for k, rows in enumerate((rng.permutation(table.rows)[:limit + 1], np.array(half),
                              rng.integers(0, limit // 2, limit + 1),
                              rng.integers(0, table.rows, limit // 2))):
        idx = rng.permutation(rows).astype(np.int32)
        n = len(idx)
        weights = rng.standard_normal(n).astype(np.float32) if k == 0 else None
        batch = Batch(idx, np.array([0, n // 3, n // 2], np.int32), weights=weights)
        grads = (rng.standard_normal((3, dim)) * 0.1).astype(np.float32)
        exp = await drv.update(table, batch, grads)
        assert exp.status is Status.OK, exp.status
        schedule = emb.update_passes(batch.counted_rows(), n, glines, acc)
        tb.log.info("UPDATE of %d indices: passes %s", n, schedule)
        passes += len(schedule)
        distinct += exp.rows_written
        grad_reads += len(schedule) * batch.num_bags * glines
        kinds = {"first": schedule[0][2], "split": any(over and level
                                                       for level, _, over in schedule)}
        assert kinds == [{"first": True, "split": False}, {"first": True, "split": True},
                         {"first": False, "split": False},
                         {"first": False, "split": False}][k], (k, schedule)
    await drv.run()
    names = ("ENG_UPD_PASSES", "ENG_UPD_DISTINCT_ROWS", "ENG_PMEM_RD_UPDATE",
             "ENG_UPD_STORE_LINES")
    got = {name: await tb.csr.read64(name) for name in names}
    lpr = emb.lines_per_row(dim, FP32)
    store = got["ENG_UPD_STORE_LINES"]
    want = dict(zip(names, (passes, distinct, grad_reads + distinct * lpr - store, store),
                    strict=True))
    assert got == want, f"counters {got}, expected {want}"
    await _finish(tb, drv)


# --- ordering kinds, ring, counters --------------------------------------------------------

@group("update")
@cocotb.test()
async def test_fence_commit_nop_and_wrap(dut):
    """NOP, FENCE and COMMIT complete OK in ring order between LOOKUPs and UPDATEs; the
    ring (4 slots) wraps several times."""
    tb, drv, rng = await _start(dut, "fence_commit_nop", idle=True, backpressure=True,
                                ring_order=2)
    table = await drv.add_table(rng=rng, data=random_table(rng, 32, _dims(tb)[0], FP32))
    for round_ in range(4):
        batch = _random_batch(rng, table.rows, 3, pooling=3)
        await drv.lookup(table, batch, batch_id=round_)
        await drv.plain(DescKind.FENCE)
        grads = rng.standard_normal((batch.num_bags, table.dim)).astype(np.float32)
        await drv.update(table, batch, grads, batch_id=round_)
        await drv.run()
        await drv.plain(DescKind.COMMIT, batch_id=round_)
        await drv.plain(DescKind.NOP)
        await drv.run()
    assert drv.tail > 4 * (1 << drv.order)
    await _finish(tb, drv)


@group("control")
@cocotb.test()
async def test_ring_overrun(dut):
    """A doorbell announcing more descriptors than the ring holds: RING_OVERRUN is set,
    the engine executes what the slots hold and completes all of them (no hang)."""
    tb, drv, _ = await _start(dut, "ring_overrun", ring_order=2)
    drv.flow_control = False
    exps = [await drv.plain(DescKind.NOP) for _ in range(6)]
    # Slots 0 and 1 now hold descriptors 4 and 5, which descriptors 0 and 1 execute;
    # their records (slots 0 and 1) are overwritten by those of 4 and 5.
    drv.pending = exps[2:]
    await drv.ring()
    await drv.wait()
    err = await tb.csr.read("ENG_ERR")
    assert err & 0b10, f"ENG_ERR {err:#x}: RING_OVERRUN not set"
    await tb.csr.write("ENG_ERR", 0b10)
    assert await tb.csr.read("ENG_ERR") & 0b10 == 0
    await _finish(tb, drv)


@group("control")
@cocotb.test()
async def test_engine_counters_and_status(dut):
    """ENG_DESC_DONE, ENG_LINES_GATHERED, ENG_BAGS_POOLED, ENG_UPD_ITEMS,
    ENG_UPD_LINES_WRITTEN and ENG_BUSY against the workload; ENG_UPD_OVERLAPS 0 while
    no UPDATE follows an UPDATE, then at most the UPDATEs that follow one of another
    table; ENG_PMEM_RD_LINES and ENG_PMEM_WR_LINES equal to the lines the PMEM model
    served (the driver uses its backdoor, so the engine is the model's only user);
    ENG_UPD_DISTINCT_ROWS the sum of the UPDATEs' rows_written; the per-kind
    ENG_PMEM_RD_* / ENG_PMEM_WR_* against the workload's rows, gradients and distinct
    rows, summing to the totals, the distinct rows' lines read from PMEM and those read
    from the row store (ENG_UPD_STORE_LINES) making every distinct row's lines;
    ENG_STATUS.INIT set until the UPDATE hash table is cleared (2 * update_acc_rows
    cycles after reset: two halves); ENG_STATUS idle at the end."""
    async def init_clears(tb):
        clear = 2 * tb.config.update_acc_rows
        status = await tb.csr.read_fields("ENG_STATUS")
        assert tb.loop.cycle < clear, f"the first CSR read ended at {tb.loop.cycle}: too late"
        assert status.init, f"ENG_STATUS {status} at cycle {tb.loop.cycle}: INIT not set"
        while (await tb.csr.read_fields("ENG_STATUS")).init:
            assert tb.loop.cycle < clear + 500, f"ENG_STATUS.INIT still set at {tb.loop.cycle}"
        assert tb.loop.cycle >= clear, (
            f"ENG_STATUS.INIT clear at cycle {tb.loop.cycle} < {clear}")

    tb, drv, rng = await _start(dut, "engine_counters", idle=True, backpressure=True,
                                after_reset=init_clears)
    await tb.csr.write("PERF_CTRL", 1)
    stats = tb.pmem.stats
    served = (stats.lines_read, stats.lines_written)
    dim = _dims(tb)[2]
    table = await drv.add_table(rng=rng, data=random_table(rng, 48, dim, FP32))
    lpr = emb.lines_per_row(dim, FP32)
    lines = bags = items = written = distinct = glines = 0
    for _ in range(3):
        batch = _random_batch(rng, table.rows, 5, pooling=4, padding=True, zipf=1.05)
        grads = rng.standard_normal((batch.num_bags, dim)).astype(np.float32)
        await drv.lookup(table, batch)
        exp = await drv.update(table, batch, grads)
        counted = len(batch.counted_rows())
        lines += counted * lpr
        bags += batch.num_bags
        items += counted * lpr
        written += exp.rows_written * lpr
        distinct += exp.rows_written
        glines += batch.num_bags * lpr
    await drv.run()
    assert await tb.csr.read64("ENG_UPD_OVERLAPS") == 0, "an UPDATE overlapped a LOOKUP"
    # UPDATEs back to back, of two tables in turn (each may overlap the one before).
    other = await drv.add_table(rng=rng, data=random_table(rng, 40, dim, FP32))
    for t in (table, other, table, other):
        batch = _random_batch(rng, t.rows, 4, pooling=3, padding=True, zipf=1.05)
        grads = rng.standard_normal((batch.num_bags, dim)).astype(np.float32)
        exp = await drv.update(t, batch, grads)
        items += len(batch.counted_rows()) * lpr
        written += exp.rows_written * lpr
        distinct += exp.rows_written
        glines += batch.num_bags * lpr
    await drv.run()
    got = {name: await tb.csr.read64(name) for name in (
        "ENG_DESC_DONE", "ENG_LINES_GATHERED", "ENG_BAGS_POOLED", "ENG_UPD_ITEMS",
        "ENG_UPD_LINES_WRITTEN", "ENG_PMEM_RD_LINES", "ENG_PMEM_WR_LINES",
        "ENG_UPD_DISTINCT_ROWS", "ENG_UPD_STORE_LINES", *PMEM_KIND_CSRS.values())}
    # Less the one host read per table the driver makes after its backdoor write (to
    # empty the row store: EngineDriver._table_written); two tables.
    rd, wr = stats.lines_read - served[0] - 2, stats.lines_written - served[1]
    store = got["ENG_UPD_STORE_LINES"]
    assert store <= written, f"ENG_UPD_STORE_LINES {store} > the {written} lines updated"
    # Per kind: the gather reads the LOOKUPs' rows, the scatter reads (from PMEM or the
    # row store) and writes each distinct row once and the gradient feed reads each
    # bag's gradient lines; no checkpoint here; the rest (descriptors, indices and
    # offsets, pooled vectors, records) is "other", so the kinds sum to the totals the
    # PMEM model served.
    want = {"ENG_DESC_DONE": 10, "ENG_LINES_GATHERED": lines, "ENG_BAGS_POOLED": bags,
            "ENG_UPD_ITEMS": items, "ENG_UPD_LINES_WRITTEN": written,
            "ENG_PMEM_RD_LINES": rd, "ENG_PMEM_WR_LINES": wr,
            "ENG_UPD_DISTINCT_ROWS": distinct, "ENG_UPD_STORE_LINES": store,
            "ENG_PMEM_RD_LOOKUP": lines, "ENG_PMEM_RD_UPDATE": written - store + glines,
            "ENG_PMEM_RD_CKPT": 0,
            "ENG_PMEM_RD_OTHER": rd - lines - (written - store) - glines,
            "ENG_PMEM_WR_UPDATE": written, "ENG_PMEM_WR_CKPT": 0,
            "ENG_PMEM_WR_OTHER": wr - written}
    assert got == want, f"counters {got}, expected {want}"
    overlaps = await tb.csr.read64("ENG_UPD_OVERLAPS")
    tb.log.info("ENG_UPD_OVERLAPS %d of 3 UPDATEs after an UPDATE", overlaps)
    assert overlaps <= 3, f"ENG_UPD_OVERLAPS {overlaps}"
    busy = await tb.csr.read64("ENG_BUSY")
    assert 0 < busy < tb.loop.cycle, f"ENG_BUSY {busy}"
    status = await tb.csr.read_fields("ENG_STATUS")
    assert not (status.busy or status.in_flight or status.undo_stall or status.init), (
        f"{status} after the last completion")
    assert await tb.csr.read("ENG_HEAD") == 10
    await _finish(tb, drv)


# --- driver over CXL.mem and concurrent host traffic -----------------------------------------

@group("control")
@cocotb.test()
async def test_driver_over_cxl_with_host_traffic(dut):
    """The driver writes tables, buffers and descriptors with CXL.mem writes (the
    doorbell only after their completions), and random host traffic on another part of
    the window runs while the engine works; every host read is checked."""
    host_lines = 256
    tb, drv, rng = await _start(dut, "driver_over_cxl", idle=True, backpressure=True,
                                via_cxl=True, heap_start=host_lines * LINE_BYTES)
    dim = _dims(tb)[1]
    table = await drv.add_table(rng=rng, data=random_table(rng, 24, dim, BF16))
    for i in range(3):
        batch = _random_batch(rng, table.rows, 6, pooling=3, weighted=True, zipf=1.05)
        grads = rng.standard_normal((batch.num_bags, dim)).astype(np.float32)
        await drv.lookup(table, batch, batch_id=i)
        await drv.update(table, batch, grads, batch_id=i)
    traffic = cocotb.start_soon(tb.agent.run_random(tb.params.get("n_txn", 600),
                                                    lines=host_lines))
    await drv.run()
    await traffic
    # Host reads of the table the engine updated, checked against the golden memory.
    reads = [tb.agent.read(tb.agent.host_line(table.base // LINE_BYTES + i))
             for i in range(table.nbytes // LINE_BYTES)]
    for t in reads:
        await t
    await _finish(tb, drv)


# --- bad input ------------------------------------------------------------------------------

def _bad_cases(tb: DeviceTB, table, batch: Batch) -> dict[str, dict]:
    """Descriptor field overrides, one per status code (and variants)."""
    size = tb.config.pmem_size
    return {
        "bad_kind": dict(kind=0x17),
        "mlp_checkpoint_unsupported": dict(kind=DescKind.MLP_CHECKPOINT),
        "weights_with_max": dict(mode=PoolMode.MAX, weighted=1, weights_addr=0),
        "mode_3": dict(mode=3),
        "dim_zero": dict(dim=0),
        "dim_above_device_max": dict(dim=tb.config.engine_max_dim + 16),
        "reserved_flag": dict(rsvd_flag=1),
        "misaligned_indices": dict(indices_addr=8),
        "misaligned_table": dict(table_base=table.base + 4),
        "table_past_memory": dict(rows=size // LINE_BYTES),
        "output_past_memory": dict(data_addr=size - LINE_BYTES, num_bags=batch.num_bags),
    }


@group("control")
@cocotb.test()
async def test_bad_descriptors(dut):
    """Every bad input completes its descriptor with its own status code, sets
    ENG_ERR.DESC_ERROR with the first failure's seq and status captured, touches no
    table row and leaves the engine ready: a good LOOKUP follows each one."""
    tb, drv, rng = await _start(dut, "bad_descriptors", idle=True, backpressure=True)
    dim = _dims(tb)[0]
    table = await drv.add_table(rng=rng, data=random_table(rng, 16, dim, FP32))
    good = _random_batch(rng, table.rows, 4, pooling=3, empty=0)
    grads = rng.standard_normal((good.num_bags, dim)).astype(np.float32)
    first_bad = None
    for name, over in _bad_cases(tb, table, good).items():
        for kind in (DescKind.LOOKUP, DescKind.UPDATE):
            if name == "weights_with_max" and kind is DescKind.UPDATE:
                over = dict(over, mode=PoolMode.MEAN)
            exp = await (drv.lookup(table, good, **over) if kind is DescKind.LOOKUP
                         else drv.update(table, good, grads, **over))
            assert exp.status is not Status.OK, f"{name}: the model accepts it"
            tb.log.info("%s (%s): expect %s", name, kind.name, exp.status.name)
            first_bad = exp if first_bad is None else first_bad
            await drv.lookup(table, _random_batch(rng, table.rows, 2, pooling=2))
    # Buffer contents the sequencer must reject: offsets and indices.
    cases = [
        Batch(np.array([0, 1, 2], np.int32), np.array([0, 2, 1], np.int32)),        # decreasing
        Batch(np.array([0, 1, 2], np.int32), np.array([1, 2], np.int32)),           # first != 0
        Batch(np.array([0, 1, 2], np.int32), np.array([0, 4], np.int32)),           # past end
        Batch(np.array([0, 1, 2], np.int32), np.array([0, 1, 2], np.int32), True),  # last != n
        Batch(np.array([0, table.rows, 2], np.int32), np.array([0, 1], np.int32)),  # index
        Batch(np.array([0, -1, 2], np.int32), np.array([0, 1], np.int32)),         # negative
    ]
    for batch in cases:
        g = rng.standard_normal((batch.num_bags, dim)).astype(np.float32)
        for exp in (await drv.lookup(table, batch), await drv.update(table, batch, g)):
            assert exp.status in (Status.BAD_OFFSETS, Status.INDEX_RANGE), exp.status
    # The UPDATE accumulator's limits: as many distinct rows as it has entries (one-line
    # rows) or as fill its lines (rows of the largest dim), OK in one pass; one index
    # more, OK in two passes; one index more than update_max_passes passes hold is
    # UNSUPPORTED for an UPDATE (a LOOKUP may have it).
    cfg = tb.config
    widest = emb.lines_per_row(cfg.engine_max_dim, FP32)
    limits = [(16, cfg.update_acc_rows)]
    if cfg.update_acc_lines // widest < cfg.update_acc_rows:    # the lines bind first
        limits.append((cfg.engine_max_dim, cfg.update_acc_lines // widest))
    most = cfg.update_max_passes
    for d, limit in limits:
        wide = await drv.add_table(rng=rng, data=random_table(rng, limit, d, FP32))
        g = emb.grad_lines(d, False)
        past = min(most * cfg.update_acc_rows, most * cfg.update_acc_lines // g) + 1
        for n, status in ((limit, Status.OK), (limit + 1, Status.OK),
                          (past, Status.UNSUPPORTED)):
            idx = np.resize(rng.permutation(limit).astype(np.int32), n)
            batch = Batch(idx, np.array([0, n // 2], np.int32))
            g = rng.standard_normal((2, d)).astype(np.float32)
            exp = await drv.update(wide, batch, g)
            assert exp.status is status, (d, n, exp.status)
            assert (await drv.lookup(wide, batch)).status is Status.OK
    await drv.run()
    await _check_first_error(tb, first_bad)
    await _finish(tb, drv)


# --- Descriptor fuzzer --------------------------------------------------------------------

#: Descriptors between two runs of the ring in the fuzzer (the ring has 16 slots).
FUZZ_RUN = 8


def _fuzz_field_mutators(tb: DeviceTB, table, batch: Batch) -> dict:
    """Per descriptor field, a function of a generator giving a value for it that the
    golden ``validate`` rejects, or one that leaves the descriptor's meaning unchanged
    (an address the descriptor does not use, a larger ``rows``, an echoed id), so that
    whatever status the golden model gives, its expected tables and output hold."""
    size = tb.config.pmem_size
    top = 1 << ADDR_BITS

    def misaligned(base):
        return lambda r: base + int(r.integers(1, LINE_BYTES))

    def beyond(r):              # aligned, at or past the end of memory, or at the very top
        return int(r.choice([size + LINE_BYTES * int(r.integers(0, 4)),
                             top - LINE_BYTES * int(r.integers(1, 4)),
                             size - LINE_BYTES * int(r.integers(0, 2)) + size]))

    def addr(base):
        return lambda r: misaligned(base)(r) if r.random() < 0.5 else beyond(r)

    def big(r, *more):          # a count whose buffer cannot fit in memory
        return int(r.choice([2**32 - 1, 2**31, size // 4 + 1, *more]))
    bad_kinds = [k for k in range(256) if k not in {d.value for d in DescKind}]
    return {
        "kind": lambda r: int(r.choice(bad_kinds + [DescKind.MLP_CHECKPOINT.value] * 8)),
        "mode": lambda r: int(r.integers(0, 4)),
        "dim": lambda r: int(r.choice([0, tb.config.engine_max_dim + int(r.integers(1, 64)),
                                       4096, 4097, 2**16 - 1])),
        "rsvd_flag": lambda r: 1,
        "capture_undo": lambda r: 1,    # checkpointing is off: no capture, no effect
        "weights_with_mean_or_max": lambda r: {"weighted": 1,
                                               "mode": int(r.choice([1, 2, 3]))},
        "table_base": lambda r: (misaligned(table.base)(r) if r.random() < 0.5
                                 else int(r.choice([size - LINE_BYTES, top - LINE_BYTES]))),
        "rows": lambda r: int(r.choice([0, 1, table.rows + int(r.integers(0, 1000)),
                                        2**32 - 1, max(0, int(batch.indices.max(initial=0)))])),
        "num_bags": lambda r: big(r, size // LINE_BYTES),
        "num_indices": big,
        "indices_addr": addr(0),
        "offsets_addr": addr(0),
        "weights_addr": addr(0),
        "data_addr": addr(0),
        "padding_idx": (lambda r: int(r.integers(0, 2**32)))
                       if batch.padding_idx is None else (lambda r: batch.padding_idx),
        "table_id": lambda r: int(r.integers(0, 2**16)),
        "batch_id": lambda r: int(r.integers(0, 2**32)),
        "cookie": lambda r: int(r.integers(0, 2**63)) * 2 + int(r.integers(0, 2)),
    }


def _fuzz_contents(rng: np.random.Generator, batch: Batch, rows: int) -> Batch:
    """``batch`` with its offsets or indices made bad in one of the ways the sequencer
    checks, for a descriptor of ``rows`` rows (the golden model sees the same buffers, so
    any status stays exact)."""
    idx, off = batch.indices.copy(), batch.offsets.copy()
    what = int(rng.integers(0, 6))
    if what == 0 and len(off) >= 2:
        k = int(rng.integers(0, len(off) - 1))
        off[k], off[k + 1] = off[k + 1] + 1, off[k]             # decreasing
    elif what == 1 and len(off):
        off[0] = int(rng.choice([1, -1, 2**31 - 1]))             # first offset not 0
    elif what == 2 and len(off):
        off[-1] = len(idx) + int(rng.integers(1, 5))             # past the indices
    elif len(idx):
        k = int(rng.integers(0, len(idx)))
        idx[k] = int(rng.choice([-1, -2**31] + [r for r in (rows, rows + 1, 2**31 - 1)
                                                if rows <= r < 2**31]))
    return Batch(idx, off, batch.include_last_offset, batch.weights, batch.padding_idx)


@group("fuzz")
@cocotb.test()
async def test_descriptor_fuzz(dut):
    """Random descriptors (``n_fuzz`` of them): random legal batches of every shape, and
    in most descriptors one to three fields set to a value the golden ``validate``
    rejects or that leaves their meaning unchanged (``_fuzz_field_mutators``) or bad
    offsets or indices, so that several errors combine and the order of the checks is
    tested. Each completes with exactly the golden status and record, its table is as
    the golden model has it (unchanged on an error), a rejected LOOKUP leaves its output
    buffer untouched, ``ENG_ERR`` holds the first error since it was last cleared, and
    the engine keeps working (unchanged descriptors are mixed in throughout)."""
    tb, drv, rng = await _start(dut, "descriptor_fuzz", idle=True, backpressure=True)
    n = tb.params.get("n_fuzz", 200)
    dims = _dims(tb)
    tables = [await drv.add_table(rng=rng, data=random_table(rng, 24, d, dt))
              for d in (dims[0], dims[-1]) for dt in (FP32, BF16)]
    mark = drv.heap.next
    statuses: dict[str, int] = {}
    runs, first_bad, poisoned, fuzzed = 0, None, [], {}
    for i in range(n):
        table = tables[int(rng.integers(0, len(tables)))]
        kind = DescKind.LOOKUP if rng.random() < 0.5 else DescKind.UPDATE
        batch = _random_batch(rng, table.rows, int(rng.integers(0, 7)),
                              pooling=float(rng.uniform(1, 4)),
                              weighted=rng.random() < 0.3, padding=rng.random() < 0.3,
                              include_last=rng.random() < 0.3)
        over: dict = {}
        if rng.random() < 0.75:
            muts = _fuzz_field_mutators(tb, table, batch)
            names = rng.choice(sorted(muts), size=int(rng.integers(1, 4)), replace=False)
            values = {name: muts[name](rng) for name in names}
            # Fields set together (weights with mean or max) go last, so that another
            # mutator's mode cannot make them a meaningful weighted SUM.
            for name, value in sorted(values.items(), key=lambda kv: isinstance(kv[1], dict)):
                over |= value if isinstance(value, dict) else {str(name): value}
            if rng.random() < 0.25:
                # Out of range for the descriptor's rows, fuzzed or not (an index past a
                # fuzzed larger ``rows`` would be legal and read past the table).
                batch = _fuzz_contents(rng, batch, over.get("rows", table.rows))
        mode = PoolMode(int(rng.integers(0, 3)) if kind is DescKind.LOOKUP
                        else int(rng.integers(0, 2)))
        if batch.weights is not None:
            mode = PoolMode.SUM
        mode = over.pop("mode", mode)           # a mutated mode wins
        capture = bool(over.pop("capture_undo", 0))     # a LOOKUP's flag only
        if kind is DescKind.LOOKUP:
            exp = await drv.lookup(table, batch, mode=mode, capture_undo=capture, **over)
        else:
            grads = rng.standard_normal((batch.num_bags, table.dim)).astype(np.float32)
            exp = await drv.update(table, batch, grads, mode=mode, **over)
        statuses[exp.status.name] = statuses.get(exp.status.name, 0) + 1
        if exp.status is not Status.OK:
            first_bad = first_bad or exp
            if exp.kind == DescKind.LOOKUP.value and "data_addr" not in over:
                n_out = batch.num_bags * emb.lines_per_row(table.dim, table.data.dtype)
                poisoned.append((exp.fields["data_addr"], max(n_out, 1) * LINE_BYTES))
        fuzzed[exp.seq] = (kind.name, over, batch)
        if (i + 1) % FUZZ_RUN == 0 or i == n - 1:
            try:
                await drv.run()
            except AssertionError as e:      # name what was fuzzed in this run
                raise AssertionError(f"{e}\nfuzzed in this run (seq: kind, fields, batch): "
                                     f"{fuzzed}") from e
            for addr, nbytes in poisoned:       # a rejected LOOKUP wrote no output
                assert drv.image(addr, nbytes) == bytes([0xA5]) * nbytes, (
                    f"a rejected LOOKUP wrote its output buffer at {addr:#x}")
            await _check_first_error(tb, first_bad)
            runs, first_bad, poisoned, fuzzed = runs + 1, None, [], {}
            drv.heap.release(mark)
    tb.log.info("%d fuzzed descriptors in %d runs; statuses %s", n, runs, statuses)
    # The mix reaches every status a descriptor can earn with checkpointing off.
    want = {s.name for s in Status} - {"LOG_FULL", "BAD_BATCH", "READ_ERROR"}
    if n >= 200:
        assert want <= set(statuses), f"statuses never produced: {want - set(statuses)}"
    if "out" in tb.params:
        Path(tb.params["out"]).write_text(json.dumps(
            {"fuzzed_descriptors": n, "statuses": statuses, "seed": tb.seed}) + "\n")
    await _finish(tb, drv)


async def _check_first_error(tb: DeviceTB, first_bad) -> None:
    """``ENG_ERR.DESC_ERROR`` with the first failing descriptor's seq, status and kind
    since the last clear (or clear); then clear it, and it must read zero."""
    err = await tb.csr.read("ENG_ERR")
    if first_bad is None:
        assert not err & 1, f"ENG_ERR {err:#x} with no descriptor failed"
        return
    assert err & 1, f"ENG_ERR {err:#x}: DESC_ERROR not set"
    seq, info = await tb.csr.read("ENG_ERR_SEQ"), await tb.csr.read("ENG_ERR_INFO")
    assert (seq, info & 0xFF, info >> 8) == (first_bad.seq & 0xFFFF_FFFF,
                                             first_bad.status.value, first_bad.kind), (
        f"ENG_ERR_SEQ {seq}, ENG_ERR_INFO {info:#x}; first failure: seq {first_bad.seq} "
        f"{first_bad.status.name} kind {first_bad.kind}")
    await tb.csr.write("ENG_ERR", 0b111)
    assert await tb.csr.read("ENG_ERR") == 0, "ENG_ERR not cleared by writing ones"
