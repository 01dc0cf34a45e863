"""Standard on-chip buses at the device's edges (AXI4 to PMEM, AXI4-Lite for CSRs)."""
