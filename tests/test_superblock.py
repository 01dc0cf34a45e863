# amaranth: UnusedElaboratable=no
"""Superblock (hw/ckpt/superblock.py) in the Amaranth simulator.

Random superblocks (valid geometries and, one field at a time, every way the layout
check can fail, at and around its limits; wrong magic, check or commit-word magic) and
commit words arrive on ``i_line`` with random idle cycles in between; every output must
match a Python model of the class docstring, and ``clear`` must zero them. Seeds are
printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.ckpt.formats import COMMIT_MAGIC, SB_MAGIC, SB_VERSION, SUPERBLOCK_CODEC
from hw.ckpt.superblock import Superblock
from sim.ckpt import bytes_sum64, commit_word

from .amaranth_sim import simulate

LINE = 64


def line0(f: dict, *, check: int | None = None) -> bytes:
    raw = SUPERBLOCK_CODEC.pack(**f).to_bytes(LINE, "little")
    if check is None:
        check = bytes_sum64(raw[:56])
    return SUPERBLOCK_CODEC.pack(**f, check=check).to_bytes(LINE, "little")


def random_fields(rng: random.Random, aw: int, max_lines: int) -> dict:
    slots = 1 << rng.randrange(8)
    lines = rng.randint(2, max_lines)
    ring = slots * lines * LINE
    space = 1 << aw
    sbytes = LINE * rng.randint(0, 64)
    f = dict(magic=SB_MAGIC, version=SB_VERSION, log_slots=slots,
             log_base=LINE * rng.randrange((space - ring) // LINE), slot_lines=lines,
             rsvd0=rng.getrandbits(32),
             mlp_slot0=LINE * rng.randrange((space - sbytes - LINE) // LINE + 1),
             mlp_slot1=LINE * rng.randrange((space - sbytes - LINE) // LINE + 1),
             mlp_slot_bytes=sbytes)
    bad = rng.choice([None] * 6 + [
        ("version", rng.choice([0, 2, 1 << 31])),
        ("log_slots", rng.choice([0, 3, 12, 1 << 31 | 1])),
        ("log_slots", 1 << rng.randrange(32)),
        ("slot_lines", rng.choice([0, 1, max_lines + 1])),
        ("slot_lines", 1 << 16 | lines),
        ("log_base", f["log_base"] | rng.choice([8, 32])),
        ("log_base", space - ring + LINE * rng.randint(0, 2)),
        ("log_base", 1 << rng.randrange(aw, 64)),
        ("mlp_slot0", f["mlp_slot0"] | 4),
        ("mlp_slot1", space - sbytes - LINE * rng.randint(0, 2)),
        ("mlp_slot_bytes", 1 << 32 | sbytes),
        ("mlp_slot_bytes", sbytes | 16),
        ("magic", SB_MAGIC ^ 1 << rng.randrange(64))])
    if bad:
        f[bad[0]] = bad[1]
    return f


def model(f: dict, check_ok: bool, cw: dict, aw: int, max_lines: int) -> dict:
    slots, lines, sbytes = f["log_slots"], f["slot_lines"], f["mlp_slot_bytes"]
    space = 1 << aw
    ring_lines = ((slots & -slots).bit_length() - 1 if slots else 0)
    ring_lines = (lines & 0xFF) << ring_lines
    ring_end = f["log_base"] + ring_lines * LINE
    layout_ok = (f["version"] == SB_VERSION and slots > 0 and slots & (slots - 1) == 0
                 and 2 <= lines <= max_lines and f["log_base"] % LINE == 0 and ring_end < space
                 and sbytes < 1 << 32 and sbytes % LINE == 0
                 and all(b % LINE == 0 and b + sbytes + LINE < space
                         for b in (f["mlp_slot0"], f["mlp_slot1"])))
    mask = space - 1
    out = {"present": int(f["magic"] == SB_MAGIC and check_ok and cw["magic"] == COMMIT_MAGIC),
           "layout_ok": int(layout_ok), "committed": cw["committed"], "epoch": cw["epoch"],
           "log_base": f["log_base"] & mask, "log_slots": slots,
           "slot_lines": lines & 0xFF, "last_slot": (slots - 1) & 0xFFFF_FFFF,
           "mlp_slot0": f["mlp_slot0"] & mask, "mlp_slot1": f["mlp_slot1"] & mask,
           "mlp_slot_bytes": sbytes & 0xFFFF_FFFF}
    if slots and slots & (slots - 1) == 0:      # the derived values (power-of-two rings)
        out |= {"log_slots_log2": slots.bit_length() - 1, "ring_lines": ring_lines,
                "last_addr": (ring_end - (lines & 0xFF) * LINE) & mask}
    return out


@pytest.mark.parametrize(("aw", "max_lines"), [(20, 5), (16, 2), (48, 255)])
def test_decode(aw, max_lines, seed):
    rng = random.Random(seed)
    dut = Superblock(addr_width=aw, max_slot_lines=max_lines)
    counts = {"present": 0, "layout_ok": 0}

    async def bench(ctx):
        for _ in range(150):
            f = random_fields(rng, aw, max_lines)
            check_ok = rng.random() < 0.9
            line = line0(f, check=None if check_ok else rng.getrandbits(64))
            cw = {"committed": rng.getrandbits(32), "epoch": rng.getrandbits(16),
                  "magic": COMMIT_MAGIC if rng.random() < 0.9 else rng.getrandbits(16)}
            word = commit_word(cw["committed"], cw["epoch"])
            if cw["magic"] != COMMIT_MAGIC:
                word = word[:6] + cw["magic"].to_bytes(2, "little")
            ctx.set(dut.clear, 1)
            await ctx.tick()
            ctx.set(dut.clear, 0)
            assert ctx.get(dut.present) == 0 and ctx.get(dut.log_base) == 0, "clear"
            for data in (line, word + rng.randbytes(LINE - 8)):
                while rng.random() < 0.4:
                    await ctx.tick()
                ctx.set(dut.i_line.valid, 1)
                ctx.set(dut.i_line.payload, int.from_bytes(data, "little"))
                await ctx.tick()
                ctx.set(dut.i_line.valid, 0)
            for name, value in model(f, check_ok, cw, aw, max_lines).items():
                assert ctx.get(getattr(dut, name)) == value, (name, f)
                if name in counts:
                    counts[name] += value
        print(counts)
        assert counts["present"] and counts["layout_ok"]

    simulate(dut, bench)


@pytest.mark.parametrize("bad", [1, 256])
def test_rejects_bad_parameters(bad):
    with pytest.raises(ValueError,
                       match=f"^max_slot_lines must be an integer from 2 to 255, not {bad!r}$"):
        Superblock(addr_width=20, max_slot_lines=bad)
