# amaranth: UnusedElaboratable=no
"""BiasTable (hw/cxl/bias_table.py) in the Amaranth simulator.

Random reads on the three ports and random write requests (the check's host-bias
writes, the flip's writes of either bias) against a model of the contract: after the
reset sweep (``max(pages, 2)`` cycles of ``o_sweeping``, no write granted) every page
is in host bias; each read shows the page's bias a cycle later, including a write of
the same cycle; the sweep comes before the check's write and that before the flip's;
a reset in the middle sweeps again. Random tests print their seed; ``SEED=<n>``
replays one.
"""

from __future__ import annotations

import random

import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from hw.cxl.bias_table import BiasTable

from .conftest import assert_lints_clean


@pytest.mark.parametrize("pages", [1, 5, 64])
def test_random_reads_and_writes(pages, seed):
    rng = random.Random(seed)
    pb = max(1, (pages - 1).bit_length())
    dut = BiasTable(pages=pages, page_bits=pb)
    stats = {"chk": 0, "flip": 0, "both": 0}

    async def bench(ctx):
        table = [rng.random() < 0.5 for _ in range(pages)]     # contents before the sweep
        for phase in range(2):
            if phase:
                ctx.set(cd.rst, 1)
                await ctx.tick()
                ctx.set(cd.rst, 0)
            sweep = max(pages, 2)
            shown = {}
            for t in range(600):
                page = {p: rng.randrange(pages) for p in ("acc", "chk", "flip")}
                chk_en = rng.random() < 0.7
                chk_wr = rng.random() < 0.3
                flip_wr, flip_val = rng.random() < 0.3, rng.random() < 0.6
                chk_wr_page = rng.randrange(pages)
                for name, value in (("i_acc_page", page["acc"]), ("i_chk_page", page["chk"]),
                                    ("i_chk_en", chk_en), ("i_flip_page", page["flip"]),
                                    ("i_chk_wr", chk_wr), ("i_chk_wr_page", chk_wr_page),
                                    ("i_flip_wr", flip_wr), ("i_flip_wr_dev", flip_val)):
                    ctx.set(getattr(dut, name), value)
                *_, sweeping, acc, chk, flip, chk_go, flip_go = await ctx.tick().sample(
                    dut.o_sweeping, dut.o_acc_dev, dut.o_chk_dev, dut.o_flip_dev,
                    dut.o_chk_wr_go, dut.o_flip_wr_go)
                where = f"phase {phase}, cycle {t}, seed {seed}"
                assert sweeping == (t < sweep), f"o_sweeping {sweeping} ({where})"
                for name, value in (("acc", acc), ("chk", chk), ("flip", flip)):
                    if name in shown:
                        assert value == shown[name], f"o_{name}_dev {value} ({where})"
                assert chk_go == (chk_wr and not sweeping), where
                assert flip_go == (flip_wr and not chk_wr and not sweeping), where
                stats["chk"] += chk_go
                stats["flip"] += flip_go
                stats["both"] += chk_wr and flip_wr and not sweeping
                # The edge: the write, then the reads that see it.
                if sweeping:
                    if t < pages:
                        table[t] = False
                elif chk_go:
                    table[chk_wr_page] = False
                elif flip_go:
                    table[page["flip"]] = flip_val
                if t >= sweep:
                    shown = {"acc": table[page["acc"]], "flip": table[page["flip"]],
                             **({"chk": table[page["chk"]]} if chk_en
                                else {"chk": shown["chk"]} if "chk" in shown else {})}

    top = Module()
    top.domains.sync = cd = ClockDomain("sync")
    top.submodules.dut = dut
    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert stats["chk"] and stats["flip"] and stats["both"], stats


@pytest.mark.parametrize("kwargs, message", [
    (dict(pages=0), "pages must be an integer from 1 to 16777216, not 0"),
    (dict(pages=1 << 25), "pages must be an integer from 1 to 16777216, not 33554432"),
    (dict(page_bits=2), "page_bits must be an integer of at least 3 for 5 pages, not 2"),
    (dict(page_bits=3.0), "page_bits must be an integer of at least 3 for 5 pages, not 3.0"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BiasTable(**{"pages": 5, "page_bits": 3, **kwargs})


def test_parameters_are_read_only_properties():
    dut = BiasTable(pages=5, page_bits=3)
    assert (dut.pages, dut.page_bits) == (5, 3)
    with pytest.raises(AttributeError):
        dut.pages = 6


@pytest.mark.parametrize("pages", [1, 5])
def test_verilog_lints_clean(pages, tmp_path):
    assert_lints_clean(BiasTable(pages=pages, page_bits=max(1, (pages - 1).bit_length())),
                       f"bias_table_{pages}", tmp_path)
