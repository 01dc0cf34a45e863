# amaranth: UnusedElaboratable=no
"""LogScan (hw/ckpt/log_scan.py) in the Amaranth simulator against ``sim.ckpt``.

Random log slots (valid records; records of another epoch, of a committed batch, with
``n`` of 0 or too large for the slot; torn records with one word changed; garbage) are
offered on ``i_line`` with random idle cycles, ``o_rec`` is taken with random
backpressure. Each slot's record must match ``sim.ckpt.record_valid`` (plus the
``batch_id > committed`` rule) and its header fields, in slot order; with ``restore``
the payload lines must appear on ``o_fill`` with their indices before the record; no
line is taken while a record waits. A stream-rule checker watches ``o_rec``; ``clear``
restarts the slot count. Seeds are printed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.ckpt.log_scan import LogScan
from sim.ckpt import encode_record, parse_header, record_valid

from .amaranth_sim import simulate
from .stream_rule import StreamRule

AW = 20
LINE = 64


def random_slot(rng: random.Random, *, slot_lines: int, epoch: int, committed: int) -> bytes:
    kind = rng.choice(["valid", "valid", "valid", "epoch", "committed", "n0", "nbig",
                       "torn", "garbage"])
    if kind == "garbage":
        return rng.randbytes(slot_lines * LINE)
    n = rng.randint(1, slot_lines - 1)
    batch = committed + rng.randint(1, 5) if kind != "committed" else rng.randint(0, committed)
    rec = bytearray(encode_record(epoch if kind != "epoch" else epoch ^ 1, batch,
                                  rng.getrandbits(32), rng.getrandbits(16), rng.getrandbits(32),
                                  rng.getrandbits(48), rng.randbytes(n * LINE)))
    if kind in ("n0", "nbig"):
        rec[6] = 0 if kind == "n0" else rng.randint(slot_lines, 255)
    if kind == "torn":
        k = rng.randrange(0, len(rec) - 8, 8)
        if k != 56:                 # (the check word itself is torn as well below)
            rec[k] ^= 1 << rng.randrange(8)
        else:
            rec[k + 1] ^= 1
    return bytes(rec) + rng.randbytes(slot_lines * LINE - len(rec))


def expected(slot: bytes, *, slot_lines: int, epoch: int, committed: int, index: int,
             base: int) -> dict:
    h = parse_header(slot)
    ok = (record_valid(slot[:LINE], slot[LINE:], epoch, slot_lines)
          and h["batch_id"] > committed)
    return {"ok": int(ok), "n": h["n"], "seq": h["seq"],
            "addr": h["addr"] & ((1 << AW) - 1) & ~63, "slot": index,
            "slot_addr": (base + index * slot_lines * LINE) & ((1 << AW) - 1)}


def _run(seed: int, *, idle: float, take: float, scans: int = 3, slots: int = 12):
    rng = random.Random(seed)
    dut = LogScan(addr_width=AW, index_width=3)
    rule = StreamRule("o_rec")

    async def bench(ctx):
        for _ in range(scans):
            slot_lines = rng.randint(2, 9)
            epoch, committed = rng.getrandbits(16), rng.getrandbits(31)
            base, restore = LINE * rng.getrandbits(AW - 6), rng.random() < 0.7
            for name, value in (("slot_lines", slot_lines), ("epoch", epoch),
                                ("committed", committed), ("log_base", base),
                                ("restore", restore)):
                ctx.set(getattr(dut, name), value)
            ctx.set(dut.clear, 1)
            await ctx.tick()
            ctx.set(dut.clear, 0)
            image = [random_slot(rng, slot_lines=slot_lines, epoch=epoch, committed=committed)
                     for _ in range(slots)]
            lines = [int.from_bytes(s[i:i + LINE], "little")
                     for s in image for i in range(0, len(s), LINE)]
            want = [expected(s, slot_lines=slot_lines, epoch=epoch, committed=committed,
                             index=i, base=base) for i, s in enumerate(image)]
            got, fills, cycle = [], [], 0
            offered = None
            while len(got) < len(want):
                if offered is None and lines and rng.random() >= idle:
                    offered = lines.pop(0)
                ctx.set(dut.i_line.valid, offered is not None)
                ctx.set(dut.i_line.payload, offered or 0)
                ready = rng.random() < take
                ctx.set(dut.o_rec.ready, ready)
                _, _, l_ready, r_valid, rec, f_valid, fill = await ctx.tick().sample(
                    dut.i_line.ready, dut.o_rec.valid, dut.o_rec.payload, dut.o_fill.valid,
                    dut.o_fill.payload)
                rec = {k: int(getattr(rec, k)) for k in want[0]}
                rule.observe(cycle, r_valid, ready, tuple(rec.values()))
                if r_valid and not ready:
                    assert not l_ready, "a line taken while a record waits"
                if f_valid:
                    fills.append((len(got), int(fill.index), int(fill.data)))
                if r_valid and ready:
                    got.append(rec)
                if offered is not None and l_ready:
                    offered = None
                cycle += 1
                assert cycle < 20_000, "scan hangs"
            ctx.set(dut.i_line.valid, 0)
            assert got == want
            exp_fills = []
            if restore:
                for i, s in enumerate(image):
                    n = min(parse_header(s)["n"], slot_lines - 1)
                    exp_fills += [(i, k, int.from_bytes(s[LINE * (k + 1):LINE * (k + 2)],
                                                        "little")) for k in range(n)]
            assert fills == exp_fills, "payload lines on o_fill"
            print(f"{slots} slots of {slot_lines} lines, {sum(w['ok'] for w in want)} count")
        assert not rule.errors, rule.errors[:5]

    simulate(dut, bench)


@pytest.mark.parametrize(("idle", "take"), [(0.0, 1.0), (0.3, 0.5), (0.0, 0.1), (0.6, 0.9)],
                         ids=["smooth", "rough", "sink_paused", "source_idle"])
def test_records(idle, take, seed):
    _run(seed, idle=idle, take=take)


@pytest.mark.parametrize("bad", [0, 9])
def test_rejects_bad_parameters(bad):
    with pytest.raises(ValueError,
                       match=f"^index_width must be an integer from 1 to 8, not {bad!r}$"):
        LogScan(addr_width=AW, index_width=bad)
