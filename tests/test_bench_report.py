"""``sim/bench.py``'s report of a training run's device counters (``system.json``)."""

from __future__ import annotations

from hw.engine.engine import PMEM_KIND_CSRS
from sim.bench import _device_counters


def test_device_counters_report():
    """Every per-kind PMEM CSR and both link-byte counters, with the bench's own count
    next to them, reach the report under their keys; a counter the run did not read is
    None (GPU-direct has no engine counters)."""
    run = {"LINK_TX_BYTES": 960, "LINK_RX_BYTES": 480, "bench_link_tx_bytes": 960,
           "bench_link_rx_bytes": 480, "ENG_PMEM_RD_LINES": 28, "ENG_PMEM_WR_LINES": 3,
           **{name: i + 1 for i, name in enumerate(PMEM_KIND_CSRS.values())}}
    got = _device_counters(run)
    assert (got["link_tx_bytes"], got["link_rx_bytes"]) == (960, 480)
    assert (got["bench_link_tx_bytes"], got["bench_link_rx_bytes"]) == (960, 480)
    assert got["pmem_lines"] == {k: run[n] for k, n in PMEM_KIND_CSRS.items()}
    assert set(got["pmem_lines"]) == {"rd_lookup", "rd_update", "rd_ckpt", "rd_other",
                                      "wr_update", "wr_ckpt", "wr_other"}
    assert got["pmem_lines_total"] == {"rd": 28, "wr": 3}
    assert got["upd_distinct_rows"] is None
    assert got["upd_store_lines"] is None
    assert got["upd_passes"] is None
