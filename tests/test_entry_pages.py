# amaranth: UnusedElaboratable=no
"""EntryPages (hw/cxl/entry_pages.py) in the Amaranth simulator.

Random allocations (page and line), forward permissions, tracked and cleared vectors,
check lines and flip pages, against a model of the contract: a check waits for the
tracked, not cleared entries of its page, those permitted by a forward only on its own
line; a flip for the tracked, not cleared entries of its page. Random tests print their
seed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.cxl.entry_pages import EntryPages

from .amaranth_sim import simulate
from .conftest import assert_lints_clean


@pytest.mark.parametrize("pages, lpp, entries", [(1, 1, 2), (5, 4, 8), (16, 64, 32)])
def test_random_matches(pages, lpp, entries, seed):
    rng = random.Random(seed)
    dut = EntryPages(pages=pages, lines_per_page=lpp, entries=entries, line_bits=46)
    page = [0] * entries
    line = [0] * entries
    by_fwd = [False] * entries
    hits = {"chk": 0, "flip": 0}

    async def bench(ctx):
        for t in range(800):
            e = rng.randrange(entries)
            alloc = 1 << e if rng.random() < 0.5 else 0
            new_line = rng.randrange(pages * lpp)
            fwd = rng.getrandbits(entries) & rng.getrandbits(entries)
            tracked, cleared = rng.getrandbits(entries), rng.getrandbits(entries) & \
                rng.getrandbits(entries)
            chk_line = rng.randrange(pages * lpp)
            flip_page = rng.randrange(pages)
            for name, v in (("i_alloc", alloc), ("i_by_forward", fwd),
                            ("i_page", new_line // lpp), ("i_line", new_line),
                            ("i_tracked", tracked), ("i_cleared", cleared),
                            ("i_chk_line", chk_line), ("i_flip_page", flip_page)):
                ctx.set(getattr(dut, name), v)
            *_, chk_wait, flip_wait = await ctx.tick().sample(dut.o_chk_wait, dut.o_flip_wait)
            live = [tracked >> i & 1 and not cleared >> i & 1 for i in range(entries)]
            want_chk = sum(1 << i for i in range(entries)
                           if live[i] and page[i] == chk_line // lpp
                           and (not by_fwd[i] or line[i] == chk_line % lpp))
            want_flip = sum(1 << i for i in range(entries) if live[i] and page[i] == flip_page)
            assert (chk_wait, flip_wait) == (want_chk, want_flip), f"cycle {t}, seed {seed}"
            hits["chk"] += chk_wait != 0
            hits["flip"] += flip_wait != 0
            for i in range(entries):
                if alloc >> i & 1:
                    page[i], line[i], by_fwd[i] = new_line // lpp, new_line % lpp, False
                by_fwd[i] = by_fwd[i] or bool(fwd >> i & 1)

    simulate(dut, bench)
    assert hits["chk"] and hits["flip"], hits


@pytest.mark.parametrize("kwargs, message", [
    (dict(pages=0), "pages must be an integer from 1 to 16777216, not 0"),
    (dict(lines_per_page=6), "lines_per_page must be a power of two from 1 to 32768, not 6"),
    (dict(entries=0), "entries must be an integer from 1 to 256, not 0"),
    (dict(line_bits=4), "line_bits must be an integer of at least 5, not 4"),
])
def test_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EntryPages(**{"pages": 5, "lines_per_page": 4, "entries": 8, "line_bits": 46,
                      **kwargs})


def test_parameters_are_read_only_properties():
    dut = EntryPages(pages=5, lines_per_page=4, entries=8, line_bits=46)
    assert (dut.pages, dut.lines_per_page, dut.entries, dut.line_bits) == (5, 4, 8, 46)
    with pytest.raises(AttributeError):
        dut.pages = 6


@pytest.mark.parametrize("pages, lpp", [(1, 1), (5, 4)])
def test_verilog_lints_clean(pages, lpp, tmp_path):
    assert_lints_clean(EntryPages(pages=pages, lines_per_page=lpp, entries=8, line_bits=46),
                       f"entry_pages_{pages}", tmp_path)
