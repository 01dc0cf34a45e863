"""The undo logger's dedup filter: which rows of a batch are already logged.

See :class:`DedupFilter`.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["TAG", "DedupFilter", "filter_index"]

#: What a filter entry remembers of a row.
TAG = data.StructLayout({"batch_id": 32, "table_id": 16, "row": 32})


def filter_index(table_id: int, row: int, filter_rows: int) -> int:
    """The dedup filter entry of ``(table_id, row)`` (the model of the hardware hash):
    ``fold(row) ^ reverse(fold(table_id))``, where ``fold`` XORs the ``k``-bit chunks
    of a value (``k = log2(filter_rows)``) and ``reverse`` reverses the ``k`` bits, so
    low row numbers of different tables land apart."""
    k = filter_rows.bit_length() - 1

    def fold(value: int, width: int) -> int:
        out = 0
        for i in range(0, width, k):
            out ^= (value >> i) & ((1 << k) - 1)
        return out

    t = fold(table_id & 0xFFFF, 16)
    return fold(row & 0xFFFF_FFFF, 32) ^ int(f"{t:0{k}b}"[::-1], 2)


def _fold(value, k: int):
    """Hardware ``fold``: XOR of the ``k``-bit chunks of ``value`` (a partial top chunk
    goes into the low bits), all operands of equal width."""
    acc = value[:k]
    for i in range(k, len(value), k):
        chunk = value[i:i + k]
        if len(chunk) == k:
            acc = acc ^ chunk
        else:
            acc = Cat(acc[:len(chunk)] ^ chunk, acc[len(chunk):])
    return acc


def _index(row, table_id, k: int):
    """Hardware :func:`filter_index`."""
    t = _fold(table_id, k)
    return _fold(row, k) ^ Cat(*[t[k - 1 - i] for i in range(k)])


class DedupFilter(wiring.Component):
    """A direct-mapped filter of ``rows`` entries, each a valid bit and the :data:`TAG`
    of the last row entered there (the entry index is :func:`filter_index`).

    **Use.** The logger looks a row up as it enters its head register (``look`` with
    that row's ``look_tag``), and from the next cycle on ``hit`` tells whether the
    entry holds ``tag`` (the head row's, held while needed; the entry's tag as read at
    ``look``, its valid bit as it is now); ``insert`` then enters ``tag`` at that
    entry. A lookup in the cycle of an insert sees it (the tag memory
    is read transparently to its write). A later row mapping to the same entry evicts
    it. ``clear`` (one cycle) empties the filter (it wins over an insert).

    **Latency.** ``hit`` one cycle after ``look`` (a synchronous read of the tag
    memory); an insert takes effect at the next clock edge.

    Parameters
    ----------
    rows : int
        Entries, a power of two.

    Members
    -------
    look : ``In(1)``; look_tag : ``In(TAG)``
    tag : ``In(TAG)``
    hit : ``Out(1)``
    insert, clear : ``In(1)``
    """

    def __init__(self, *, rows: int):
        if not isinstance(rows, int) or rows < 2 or rows & (rows - 1):
            raise ValueError(f"rows must be a power of two of at least 2, not {rows!r}")
        self._rows = rows
        super().__init__({
            "look": In(1),
            "look_tag": In(TAG),
            "tag": In(TAG),
            "hit": Out(1),
            "insert": In(1),
            "clear": In(1),
        })

    rows = property(lambda self: self._rows)

    def elaborate(self, platform):
        m = Module()
        k = self._rows.bit_length() - 1
        m.submodules.tags = tags = Memory(shape=TAG, depth=self._rows, init=[])
        wp = tags.write_port()
        rp = tags.read_port(transparent_for=(wp,))
        idx = Signal(k)                         # the entry of ``tag``
        valid = Signal(self._rows)
        valid_bit = Signal(self._rows)
        look_idx = _index(self.look_tag.row, self.look_tag.table_id, k)
        m.d.comb += [
            rp.addr.eq(look_idx),
            rp.en.eq(self.look),
            valid_bit.eq(valid >> idx),
            self.hit.eq(valid_bit[0] & (rp.data.as_value() == self.tag.as_value())),
            wp.addr.eq(idx),
            wp.en.eq(self.insert),
            wp.data.eq(self.tag),
        ]
        with m.If(self.look):
            m.d.sync += idx.eq(look_idx)
        with m.If(self.insert):
            m.d.sync += valid.bit_select(idx, 1).eq(1)
        with m.If(self.clear):
            m.d.sync += valid.eq(0)
        return m
