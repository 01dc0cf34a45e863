"""The CXL.mem endpoint's ordering table. See :class:`OrderingTable`."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..widths import is_int, is_pow2

__all__ = ["OrderingTable"]


class OrderingTable(wiring.Component):
    """Counts the PMEM reads and writes in flight per ordering bucket, so that the
    endpoint can keep the M2S handshake order as the memory order.

    ``i_issue`` counts one access of kind ``write`` up in bucket ``bucket`` and
    ``i_retire`` one down, both at the clock edge of the cycle they are valid in (an
    issue and a retire of one count in one cycle cancel). ``o_read_busy`` /
    ``o_write_busy`` bit *b* is high while bucket *b* has a read / write in flight,
    from the cycle after the issue to the cycle of the retire that empties it. No
    backpressure: the owner issues at most ``depth`` accesses in flight and retires
    only issued ones. Reset (synchronous) empties every bucket.

    Parameters
    ----------
    buckets:
        Number of buckets (a power of two, at least 2).
    depth:
        Most accesses in flight (a positive int; sizes the counters).

    Members
    -------
    i_issue, i_retire: ``In(stream.Signature({"bucket", "write"}, always_ready=True))``
        An access entering / leaving the table.
    o_read_busy, o_write_busy: ``Out(buckets)``
        Buckets with a read / write in flight.

    Raises
    ------
    ValueError
        If ``buckets`` is not a power of two of at least 2, or ``depth`` not a positive
        int.
    """

    def __init__(self, *, buckets: int, depth: int):
        if not is_pow2(buckets) or buckets < 2:
            raise ValueError(f"buckets must be a power of two of at least 2, not {buckets!r}")
        if not is_int(depth) or depth < 1:
            raise ValueError(f"depth must be a positive int, not {depth!r}")
        self._buckets = buckets
        self._depth = depth
        event = data.StructLayout({"bucket": buckets.bit_length() - 1, "write": 1})
        super().__init__({
            "i_issue": In(stream.Signature(event, always_ready=True)),
            "i_retire": In(stream.Signature(event, always_ready=True)),
            "o_read_busy": Out(buckets),
            "o_write_busy": Out(buckets),
        })

    @property
    def buckets(self) -> int:
        return self._buckets

    @property
    def depth(self) -> int:
        return self._depth

    def elaborate(self, platform):
        m = Module()
        issue, retire = self.i_issue, self.i_retire
        busy = {False: [], True: []}
        for bucket in range(self._buckets):
            for write, kind in ((False, "rd"), (True, "wr")):
                count = Signal(range(self._depth + 1), name=f"{kind}_count_{bucket}")
                # busy is count != 0, kept in its own flip-flop and computed from the
                # registered count, so that the late issue and retire strobes only
                # select its next value (no OR of the count after them, for timing).
                # A retire finds count >= 1, so count != 1 is count[1:] != 0.
                nonzero = Signal(name=f"{kind}_busy_{bucket}")
                up = issue.valid & (issue.p.write == write) & (issue.p.bucket == bucket)
                down = retire.valid & (retire.p.write == write) & (retire.p.bucket == bucket)
                with m.If(up & ~down):
                    m.d.sync += [count.eq(count + 1), nonzero.eq(1)]
                with m.Elif(down & ~up):
                    m.d.sync += [count.eq(count - 1), nonzero.eq(count[1:].any())]
                busy[write].append(nonzero)
        m.d.comb += [self.o_read_busy.eq(Cat(busy[False])),
                     self.o_write_busy.eq(Cat(busy[True]))]
        return m
