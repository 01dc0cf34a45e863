"""The DCOH's grants: entries whose access is permitted (or failed) are picked round robin
into the grant output, and dones free them.

See :class:`DcohGrants`; it is built into :class:`hw.cxl.dcoh.Dcoh` (``docs/dcoh.md``,
"Grants and their order").
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..widths import is_pow2 as _is_pow2
from ..widths import named, onehot
from ..widths import select_bit as _bit
from .cache_agent import TAG_BITS
from .round_robin import first_from

__all__ = ["DcohGrants", "grant_layout"]


def grant_layout(handle_bits: int) -> data.StructLayout:
    """``o_grant`` payload for handles of ``handle_bits`` bits: ``tag``, ``handle``,
    ``error``, ``host_bias``, ``denied`` (shared with the users' grant inputs).
    ``denied`` (always with ``error``): the host refused the line (GO-Err), so the access
    must not touch memory; ``error`` without ``denied``: the line is beyond device
    memory."""
    return data.StructLayout({"tag": TAG_BITS, "handle": handle_bits, "error": 1,
                              "host_bias": 1, "denied": 1})


class DcohGrants(wiring.Component):
    """Each entry's way from its permission to its done: a grant picked round robin into
    the ``o_grant`` register, then a done on ``i_done``.

    An entry becomes grantable with ``i_permit`` (the access may go; the grant carries
    the entry's ``host_bias``), ``i_range_error`` (a line beyond device memory: the grant
    has ``error``) or ``i_denied`` (the host answered GO-Err: ``error`` and ``denied``).
    Each cycle the register, when empty or taken, loads the first grantable entry at or
    after the one after its last pick (so no entry waits more than ``entries`` picks), its
    handle being the entry's number; the entry's ``tag``, ``host_bias`` and ``error``
    come from the DCOH's entry memory, whose read port this block drives
    (``o_info_addr``, ``o_info_en``; ``i_tag``, ``i_host_bias``, ``i_error`` a cycle
    later, holding while ``o_info_en`` is low). A permitted entry is granted once its
    grant has left, and waits for its done; a failed one is free once its grant has left
    (``o_error_left``, and ``o_range_error_left`` if it was not denied).

    **Latency, throughput, backpressure, reset.** An entry made grantable in cycle *t*
    (an edge at the end of *t*) can be valid on ``o_grant`` in cycle *t* + 2; one grant
    and one done per cycle. ``i_done`` is always ready; a done naming no granted entry is
    dropped (``o_done_bad``). ``o_grant`` obeys the stream rules. Reset (synchronous)
    forgets every entry.

    Parameters
    ----------
    entries : int
        Entries of the pool, a power of two from 2 to 256.

    Members
    -------
    o_grant : ``Out(stream.Signature(grant_layout(log2(entries))))``
        Grants, out of order.
    i_done : ``In(stream.Signature(unsigned(log2(entries))))``
        Handles of granted accesses that have finished (always ready).
    i_alloc : ``In(entries)``
        The entry allocated this cycle (one-hot or zero).
    i_permit, i_range_error, i_denied : ``In(entries)``
        Entries made grantable this cycle.
    o_info_addr : ``Out(range(entries))``; o_info_en : ``Out(1)``
        The entry memory's read port.
    i_tag : ``In(TAG_BITS)``; i_host_bias, i_error : ``In(1)``
        The entry's info, a cycle after ``o_info_addr``.
    o_held : ``Out(entries)``
        Entries between their permission and their done (or their failed grant's
        transfer).
    o_tracked : ``Out(entries)``
        Permitted entries not yet done (what a drain waits for).
    o_done_hit : ``Out(entries)``
        The entry a done frees this cycle (one-hot or zero).
    o_done_bad, o_error_left, o_range_error_left : ``Out(1)``
        A done naming no granted entry; a failed grant left; one that was not denied.
    o_freed : ``Out(range(3))``
        Entries freed this cycle.

    Raises
    ------
    ValueError
        If ``entries`` is out of its range.
    """

    def __init__(self, *, entries: int):
        if not _is_pow2(entries) or not 2 <= entries <= 256:
            raise ValueError(f"entries must be a power of two from 2 to 256, not {entries!r}")
        self._entries = entries
        handle_bits = entries.bit_length() - 1
        self._grant_layout = grant_layout(handle_bits)
        super().__init__({
            "o_grant": Out(stream.Signature(self._grant_layout)),
            "i_done": In(stream.Signature(unsigned(handle_bits))),
            "i_alloc": In(entries),
            "i_permit": In(entries),
            "i_range_error": In(entries),
            "i_denied": In(entries),
            "o_info_addr": Out(range(entries)),
            "o_info_en": Out(1),
            "i_tag": In(TAG_BITS),
            "i_host_bias": In(1),
            "i_error": In(1),
            "o_held": Out(entries),
            "o_tracked": Out(entries),
            "o_done_hit": Out(entries),
            "o_done_bad": Out(1),
            "o_error_left": Out(1),
            "o_range_error_left": Out(1),
            "o_freed": Out(range(3)),
        })

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def grant_layout(self) -> data.StructLayout:
        return self._grant_layout

    def elaborate(self, platform):
        m = Module()
        n = self._entries
        out, done = self.o_grant, self.i_done
        # The states of an entry: grantable, in the output register, granted (done
        # expected); for a failed access, grantable and in the register.
        permitted = Signal(n)
        in_output = Signal(n)
        granted = Signal(n)
        failed = Signal(n)
        failed_in_output = Signal(n)
        denied = Signal(n)      # the host answered GO-Err: the grant is ``denied``
        last_pick = Signal(range(n))    # the entry whose grant is in the register
        next_pick = Signal(range(n))    # the entry after it: where the next pick starts
        pick_any, pick_idx = first_from(m, permitted | failed, next_pick, "pick")
        pick_oh = onehot(m, pick_idx, n, "pick_oh")
        load = ~out.valid | out.ready
        pick = load & pick_any
        out_denied = named(m, _bit(m, denied, last_pick, "grant_den"), "grant_denied")
        picked_permitted = Signal(n)
        picked_failed = Signal(n)
        m.d.comb += [
            self.o_info_addr.eq(pick_idx),
            self.o_info_en.eq(load),
            # The payload is the read port's data, which holds while ``en`` is low.
            out.p.tag.eq(self.i_tag),
            out.p.error.eq(self.i_error | out_denied),
            out.p.host_bias.eq(self.i_host_bias),
            out.p.denied.eq(out_denied),
            out.p.handle.eq(last_pick),
            picked_permitted.eq(Mux(pick, pick_oh & permitted, 0)),
            picked_failed.eq(Mux(pick, pick_oh & failed, 0)),
        ]
        with m.If(load):
            m.d.sync += out.valid.eq(pick_any)
        with m.If(pick):
            m.d.sync += [last_pick.eq(pick_idx), next_pick.eq(pick_idx + 1)]
        out_oh = onehot(m, last_pick, n, "grant_oh")
        taken = out.valid & out.ready
        delivered = Signal(n)
        failed_left = Signal(n)
        m.d.comb += [
            delivered.eq(Mux(taken, out_oh & in_output, 0)),
            failed_left.eq(Mux(taken, out_oh & failed_in_output, 0)),
            self.o_error_left.eq(failed_left.any()),
            self.o_range_error_left.eq(failed_left.any() & ~out_denied),
        ]

        # --- dones -----------------------------------------------------------------------
        hit = Signal()
        m.d.comb += [
            done.ready.eq(1),
            hit.eq(done.valid & _bit(m, granted, done.payload, "done_granted")),
            self.o_done_hit.eq(Mux(hit, onehot(m, done.payload, n, "done_oh"), 0)),
            self.o_done_bad.eq(done.valid & ~hit),
            self.o_freed.eq(hit + failed_left.any()),
        ]

        m.d.sync += [
            permitted.eq((permitted & ~picked_permitted) | self.i_permit),
            in_output.eq((in_output & ~delivered) | picked_permitted),
            granted.eq((granted & ~self.o_done_hit) | delivered),
            failed.eq((failed & ~picked_failed) | self.i_range_error | self.i_denied),
            failed_in_output.eq((failed_in_output & ~failed_left) | picked_failed),
            denied.eq((denied & ~self.i_alloc) | self.i_denied),
        ]
        m.d.comb += [
            self.o_held.eq(permitted | in_output | granted | failed | failed_in_output),
            self.o_tracked.eq(permitted | in_output | granted),
        ]
        return m
