# amaranth: UnusedElaboratable=no
"""FieldCheck (hw/engine/field_check.py) in the Amaranth simulator.

Random LOOKUP / UPDATE descriptors (and some of every other kind) with fields near
every limit: modes and weights, ``dim`` around 0 and 4096, unaligned addresses, regions
ending just below, at and above the top of a ``2**addr_width``-byte memory (also empty
ones), fp32 and bf16. One cycle after each is applied, ``o_status`` must be the first
failing field check as ``sim.embedding.validate`` gives it (with buffers that pass; a
kind other than LOOKUP / UPDATE is BAD_KIND here). Seeds are printed; ``SEED=<n>``
replays one. (Its Verilog is linted with the sequencer's, ``tests/test_bag_sequencer.py``.)
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from hw.engine.descriptor import DescKind, Status
from hw.engine.field_check import FieldCheck
from sim.embedding import validate

from .amaranth_sim import simulate

# The statuses a field check can give: each must be drawn and checked in every run.
STATUSES = {s.value for s in (Status.OK, Status.BAD_KIND, Status.UNSUPPORTED,
                              Status.ADDR_RANGE, Status.MISALIGNED)}


def random_fields(rng: random.Random, addr_width: int) -> dict:
    top = 1 << addr_width

    def addr(size: int) -> int:
        shape = rng.random()
        if shape < 0.4:         # the region ends near the top of memory
            base = max(0, top - size + rng.choice([-64, 0, 0, 64]))
        else:
            base = 64 * rng.randrange(top // 128)
        base = min(base, (1 << 48) - 64)      # a 48-bit field
        return base + (rng.choice([1, 4, 32]) if rng.random() < 0.05 else 0)

    kind = rng.choice([DescKind.LOOKUP.value] * 4 + [DescKind.UPDATE.value] * 4
                      + [k.value for k in DescKind] + [7, 255])
    dim = rng.choice([0, 1, 16, 33, 4095, 4096, 4097, rng.randint(1, 300)])
    bf16 = rng.randrange(2)
    rows = rng.choice([1, 10, 1000, 1 << 31, rng.getrandbits(32)])
    num_bags, num_indices = rng.choice([0, 1, 7, 100]), rng.choice([0, 1, 9, 200])
    lpr = (dim * (2 if bf16 else 4) + 63) // 64
    return dict(
        kind=kind, mode=rng.choice([0, 1, 2, 3]), weighted=rng.randrange(2),
        include_last_offset=rng.randrange(2), bf16=bf16,
        rsvd_flag=int(rng.random() < 0.05), dim=dim, rows=rows, num_bags=num_bags,
        num_indices=num_indices, table_base=addr(rows * lpr * 64),
        indices_addr=addr(4 * num_indices), offsets_addr=addr(4 * (num_bags + 1)),
        weights_addr=addr(4 * num_indices), data_addr=addr(num_bags * lpr * 64))


def expected(fields: dict, addr_width: int) -> int:
    if fields["kind"] not in (DescKind.LOOKUP.value, DescKind.UPDATE.value):
        return Status.BAD_KIND.value
    status = validate(fields, indices=np.zeros(fields["num_indices"], np.int64),
                      offsets=np.zeros(fields["num_bags"] + 1, np.int64),
                      pmem_size=1 << addr_width)
    # The buffer checks come after every field check: reaching them, the fields pass.
    return (Status.OK if status in (Status.BAD_OFFSETS, Status.INDEX_RANGE) else status).value


@pytest.mark.parametrize("addr_width", [12, 24, 48])
def test_first_failing_check(seed, addr_width):
    rng = random.Random(seed)
    cases = [random_fields(rng, addr_width) for _ in range(300)]
    # In a 4 KB memory few random tables fit, and some seeds draw no passing case in
    # 300: keep drawing (same seed) and add the first case of each status not yet drawn.
    drawn = {expected(fields, addr_width) for fields in cases}
    for _ in range(100_000):
        if drawn >= STATUSES:
            break
        fields = random_fields(rng, addr_width)
        if (want := expected(fields, addr_width)) not in drawn:
            drawn.add(want)
            cases.append(fields)
    dut = FieldCheck(addr_width=addr_width)
    seen = set()

    async def bench(ctx):
        for fields in cases:
            ctx.set(dut.i_desc, fields)
            await ctx.tick()
            got, want = ctx.get(dut.o_status), expected(fields, addr_width)
            assert got == want, (f"{fields}: {Status(got).name}, expected "
                                 f"{Status(want).name} (seed {seed})")
            seen.add(want)

    simulate(dut, bench)
    assert seen == STATUSES, sorted(Status(s).name for s in seen)


@pytest.mark.parametrize("bad", [11, 49, "30", True])
def test_rejects_bad_addr_width(bad):
    with pytest.raises(ValueError, match=f"^addr_width must be an integer from 12 to 48, "
                                         f"not {bad!r}$"):
        FieldCheck(addr_width=bad)


def test_addr_width_is_a_read_only_property():
    dut = FieldCheck(addr_width=30)
    assert dut.addr_width == 30
    with pytest.raises(AttributeError):
        dut.addr_width = 31

