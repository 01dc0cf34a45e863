"""Test-only Amaranth designs (never imported by ``hw/``)."""
