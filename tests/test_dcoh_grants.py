# amaranth: UnusedElaboratable=no
"""DcohGrants (hw/cxl/dcoh_grants.py) in the Amaranth simulator.

The bench allocates free entries (``i_alloc``) with random info (tag, host bias, error)
in an entry memory it models as the DCOH's synchronous read port, makes them grantable
at once or later (``i_permit``, ``i_range_error``, ``i_denied``, several in one cycle),
returns each granted handle on ``i_done`` after a random delay (and sends bad dones);
``o_grant`` has random backpressure. Golden model, from the contract: each time the
register loads, it takes the first grantable entry at or after the one after the last
pick (none: not valid); the grant carries the entry's number, tag and host bias,
``error`` for range errors and denials, ``denied`` for denials; a permitted entry
stays held and tracked until its done, a failed one until its grant has left
(``o_error_left``, ``o_range_error_left``); dones are hit or bad as the entry's state
says; ``o_freed`` counts both. A passive checker holds ``o_grant`` to the stream rules.
Random tests print their seed; ``SEED=<n>`` replays one.
"""

from __future__ import annotations

import random

import pytest

from hw.cxl.dcoh_grants import DcohGrants

from .amaranth_sim import simulate
from .conftest import assert_lints_clean
from .payload import unpack
from .stream_rule import StreamRule


def _run(seed: int, *, entries: int, idle: float, bp: float, cycles: int = 1500) -> dict:
    rng = random.Random(seed)
    dut = DcohGrants(entries=entries)
    layout = dut.grant_layout
    state = ["free"] * entries      # free, waiting, grantable, out, granted
    kind = [""] * entries           # permit, range, denied
    info = [(0, 0, 0)] * entries    # (tag, host_bias, error) as written
    read = (0, 0, 0)                # the read port's data
    dones: list[tuple[int, int]] = []
    rule = StreamRule("o_grant")
    stats = {"grants": 0, "dones": 0, "bad": 0, "denied": 0, "range": 0}

    async def bench(ctx):
        nonlocal read
        ptr = 0
        expect = None               # the entry the register loaded, or None
        # After ``cycles``, no new allocations: run on until every entry is free again
        # (under heavy backpressure the last grants can take long to leave).
        for t in range(cycles + 20000):
            drain = t > cycles - 200
            if t >= cycles and all(s == "free" for s in state):
                break
            alloc = permit = rng_err = denied = 0
            free = [e for e in range(entries) if state[e] == "free"]
            if free and not drain and not rng.random() < idle:
                e = min(free) if rng.random() < 0.5 else rng.choice(free)
                k = rng.choice(["permit", "permit", "range", "denied"])
                alloc = 1 << e
                state[e], kind[e] = "waiting", k
                write = (rng.getrandbits(16), int(k == "denied" or rng.random() < 0.5),
                         int(k == "range"))
                if k != "denied" and rng.random() < 0.5:
                    permit |= alloc if k == "permit" else 0
                    rng_err |= alloc if k == "range" else 0
            else:
                write = None
            for e in range(entries):
                if state[e] == "waiting" and not alloc >> e & 1 and rng.random() < 0.2:
                    bit = 1 << e
                    permit |= bit if kind[e] == "permit" else 0
                    rng_err |= bit if kind[e] == "range" else 0
                    denied |= bit if kind[e] == "denied" else 0
            for name, v in (("i_alloc", alloc), ("i_permit", permit),
                            ("i_range_error", rng_err), ("i_denied", denied)):
                ctx.set(getattr(dut, name), v)
            ctx.set(dut.i_tag, read[0])
            ctx.set(dut.i_host_bias, read[1])
            ctx.set(dut.i_error, read[2])
            done = None
            if dones and dones[0][0] <= t:
                done = dones.pop(0)[1]
            elif rng.random() < 0.03:
                done = rng.choice([e for e in range(entries) if state[e] != "granted"] or [0])
            ctx.set(dut.i_done.valid, done is not None)
            ctx.set(dut.i_done.payload, done or 0)
            ready = not rng.random() < bp
            ctx.set(dut.o_grant.ready, ready)
            *_, valid, payload, addr, en, held, tracked, hit, bad, err_left, range_left, \
                freed = await ctx.tick().sample(
                    dut.o_grant.valid, dut.o_grant.payload.as_value(), dut.o_info_addr,
                    dut.o_info_en, dut.o_held, dut.o_tracked, dut.o_done_hit,
                    dut.o_done_bad, dut.o_error_left, dut.o_range_error_left, dut.o_freed)
            where = f"cycle {t}, seed {seed}"
            rule.observe(t, valid, ready, payload)
            want_held = sum(1 << e for e in range(entries)
                            if state[e] in ("grantable", "out", "granted"))
            want_tracked = sum(1 << e for e in range(entries) if kind[e] == "permit"
                               and state[e] in ("grantable", "out", "granted"))
            assert (held, tracked) == (want_held, want_tracked), f"held / tracked ({where})"
            # Dones.
            good = done is not None and state[done] == "granted"
            assert hit == (1 << done if good else 0), f"o_done_hit {hit:#x} ({where})"
            assert bad == (done is not None and not good), f"o_done_bad {bad} ({where})"
            stats["bad"] += bad
            # The register.
            assert valid == (expect is not None), f"o_grant.valid {valid} ({where})"
            left = 0
            if valid:
                g = unpack(layout, payload)
                e = expect
                tag, host_bias, error = info[e]
                assert g == {"tag": tag, "handle": e, "host_bias": host_bias,
                             "error": int(error or kind[e] == "denied"),
                             "denied": int(kind[e] == "denied")}, f"grant {g} ({where})"
                if ready:
                    stats["grants"] += 1
                    if kind[e] == "permit":
                        state[e] = "granted"
                        dones.append((t + rng.randint(1, 15), e))
                        dones.sort()
                    else:
                        state[e] = "free"
                        left = 1
                        stats[kind[e]] += 1
            assert (err_left, range_left) == (left, left and kind[expect] == "range"), \
                f"error_left {err_left}, range_error_left {range_left} ({where})"
            if not valid or ready:
                grantable = [e for e in range(entries) if state[e] == "grantable"]
                order = [(ptr + i) % entries for i in range(entries)]
                expect = next((e for e in order if e in grantable), None)
                if expect is not None:
                    state[expect] = "out"
                    ptr = (expect + 1) % entries
            assert freed == good + left, f"o_freed {freed} ({where})"
            if good:
                state[done] = "free"
                stats["dones"] += 1
            # Made grantable at this edge; the read port; the memory write.
            for e in range(entries):
                if (permit | rng_err | denied) >> e & 1:
                    state[e] = "grantable"
            if en:
                read = info[addr]
            if write is not None:
                info[alloc.bit_length() - 1] = write
        assert all(s == "free" for s in state), state

    simulate(dut, bench)
    assert not rule.errors, rule.errors[:5]
    return stats


@pytest.mark.parametrize("traffic", ["smooth", "rough"])
@pytest.mark.parametrize("entries", [2, 8, 64])
def test_random_traffic(entries, traffic, seed):
    p = 0.4 if traffic == "rough" else 0.0
    stats = _run(seed, entries=entries, idle=p, bp=p)
    print(stats)
    assert stats["grants"] > 100 and stats["denied"] and stats["range"] and stats["bad"]


def test_sink_paused(seed):
    """Almost no ``ready``: every entry ends up waiting for the register."""
    _run(seed, entries=4, idle=0.0, bp=0.97, cycles=2500)


@pytest.mark.parametrize("entries", [3, 1, 512, True])
def test_rejects_bad_parameters(entries):
    with pytest.raises(ValueError, match=f"entries must be a power of two from 2 to 256, "
                                         f"not {entries!r}"):
        DcohGrants(entries=entries)


def test_parameters_are_read_only_properties():
    dut = DcohGrants(entries=16)
    assert dut.entries == 16 and dut.grant_layout["handle"].width == 4
    with pytest.raises(AttributeError):
        dut.entries = 8


@pytest.mark.parametrize("entries", [2, 256])
def test_verilog_lints_clean(entries, tmp_path):
    assert_lints_clean(DcohGrants(entries=entries), f"dcoh_grants_{entries}", tmp_path)
