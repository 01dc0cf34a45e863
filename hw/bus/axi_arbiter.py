"""AXI4 arbiter: several managers share one AXI4 subordinate port (the PMEM port).

See :class:`AxiArbiter`.
"""

from __future__ import annotations

from functools import reduce

from amaranth.hdl import C, Cat, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..widths import named
from .axi import ADDR_FIELDS, AXI4Signature

__all__ = ["AxiArbiter"]

_MAX_MANAGERS = 8


def _any(bits) -> Value:
    return reduce(lambda a, b: a | b, bits, C(0, 1))


def _lowest(bits: list[Value]) -> list[Value]:
    """One-hot of the lowest set bit of ``bits`` (all zero if none is set)."""
    out, seen = [], C(0, 1)
    for b in bits:
        out.append(b & ~seen)
        seen = seen | b
    return out


def _select(onehot: list[Value], values: list[Value]) -> Value:
    """The value whose ``onehot`` bit is set (AND-OR; zero if none is)."""
    return reduce(lambda a, b: a | b,
                  [v & sel.replicate(len(v)) for sel, v in zip(onehot, values, strict=True)])


def _encode(onehot: list[Value], width: int) -> Value:
    """Binary index of a one-hot vector, ``width`` bits."""
    return Cat(*[_any([s for i, s in enumerate(onehot) if i >> b & 1]) for b in range(width)])


def _decode(value: Value, n: int) -> list[Value]:
    """``[value == i for i in range(n)]``."""
    return [value == i for i in range(n)]


class AxiArbiter(wiring.Component):
    """Shares one AXI4 subordinate port between ``len(priorities)`` managers.

    AR and AW are arbitrated independently, each cycle, by priority class (smaller
    ``priorities`` value = more urgent), round-robin among the managers of one class.
    A class with a request waiting counts the consecutive grants given to more urgent
    classes; once it has waited ``starvation_limit`` of them it is served before any
    non-starving class (several starving classes: the least urgent first, since serving
    it delays no more urgent class's count). A waiting class is therefore granted after
    at most ``starvation_limit`` grants to more urgent classes, and a manager in a class
    of *k* members after at most *k* grants to its class. The manager index is put in
    the top ``src_bits`` bits of ARID / AWID, and R / B are routed back by those bits
    with the manager's ID restored, so the subordinate must echo IDs unchanged.

    W beats carry no ID, so W follows the AW grant order: every AW grant pushes its
    manager index into a ``w_fifo_depth``-entry FIFO, and W beats are taken from the
    manager at its head until WLAST, then it is popped; W bursts never interleave. AW
    is not granted while that FIFO is full. While the FIFO is empty, the W beat of the
    manager whose AW is granted in this cycle is taken in the same cycle (a single-beat
    write presented as AW + W together passes in one cycle, so a manager that issues
    them as a pair sustains one write per cycle). A manager may present W before its
    AW is granted; its beats wait (``wready`` low) until its burst reaches the FIFO
    head. So, as AXI4 requires anyway, a manager whose AW was granted must deliver that
    burst's W beats without waiting for any other transfer, or W stalls for every
    manager. R beats are routed one by one by RID, so R bursts of different IDs may
    interleave as AXI4 allows.

    Latency and throughput: AR, AW and W are output registers: a grant (the manager's
    handshake) in cycle *t* puts the request on ``sub`` in cycle *t* + 1. R and B are
    output registers too with ``register_responses`` (a beat taken from ``sub`` in
    cycle *t* is valid on the manager in *t* + 1); without it they are routed
    combinationally (no added cycle; ``sub.rready`` / ``sub.bready`` then follow the
    addressed manager's ``rready`` / ``bready`` in the same cycle). Uncontended, each of
    the five channels moves one transfer per cycle. Backpressure: every ``ready``
    toward a manager and ``sub.rready`` / ``sub.bready`` are combinational (an output
    register loads when it is empty or being emptied), so a manager's ``arready`` /
    ``awready`` / ``wready`` depend on the managers' valids and on ``sub``'s ready,
    and ``sub.rready`` on the addressed manager's ``rready``. Every valid obeys the
    stream rules: it never waits for ready and, once high, holds with its payload until
    the transfer. Reset (synchronous ``rst``) empties every register and the W FIFO and
    restarts arbitration; the subordinate must be reset with the arbiter. With one
    manager the arbiter is a wire (no latency, ID unchanged).

    Parameters
    ----------
    addr_width, data_width:
        Byte-address and data widths (``data_width`` a positive multiple of 8).
    id_width:
        ARID / AWID width of each manager.
    priorities:
        One int per manager, 1 to 8 of them; smaller is more urgent.
    starvation_limit:
        Grants to more urgent classes after which a waiting class is served (>= 1).
    w_fifo_depth:
        AW grants whose W burst has not completed that the W-order FIFO holds (>= 1;
        below the number of bursts in flight it limits AW throughput).
    register_responses:
        ``True``: R and B pass an output register (one cycle, and no combinational path
        from a manager's ``rready`` / ``bready`` to ``sub``); ``False``: they are
        routed combinationally, adding no latency.

    Members
    -------
    m0, m1, ...: ``In(AXI4Signature(addr_width=, data_width=, id_width=id_width))``
        Subordinate ports, one per manager, in ``priorities`` order.
    sub: ``Out(AXI4Signature(addr_width=, data_width=, id_width=id_width + src_bits))``
        Manager port toward the shared subordinate; ``src_bits = ceil(log2(n))``.

    Raises
    ------
    ValueError
        If a parameter is out of range or of the wrong type.
    """

    def __init__(self, *, addr_width: int, data_width: int, id_width: int,
                 priorities, starvation_limit: int = 16, w_fifo_depth: int = 8,
                 register_responses: bool = True):
        def positive(name, value, minimum=1):
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{name} must be an integer of at least {minimum}, "
                                 f"not {value!r}")

        positive("addr_width", addr_width)
        positive("data_width", data_width)
        if data_width % 8:
            raise ValueError(f"data_width must be a multiple of 8, not {data_width}")
        positive("id_width", id_width)
        if not isinstance(priorities, tuple | list):
            raise ValueError(f"priorities must be a tuple of ints, not {priorities!r}")
        if not 1 <= len(priorities) <= _MAX_MANAGERS:
            raise ValueError(f"priorities must have 1 to {_MAX_MANAGERS} entries (one per "
                             f"manager), not {len(priorities)}")
        for p in priorities:
            if not isinstance(p, int) or isinstance(p, bool):
                raise ValueError(f"priorities must be ints, not {p!r} in {priorities!r}")
        positive("starvation_limit", starvation_limit)
        positive("w_fifo_depth", w_fifo_depth)
        if not isinstance(register_responses, bool):
            raise ValueError(f"register_responses must be a bool, not {register_responses!r}")

        self._addr_width = addr_width
        self._data_width = data_width
        self._id_width = id_width
        self._priorities = tuple(priorities)
        self._starvation_limit = starvation_limit
        self._w_fifo_depth = w_fifo_depth
        self._register_responses = register_responses
        n = len(priorities)
        self._src_bits = (n - 1).bit_length()
        sig = AXI4Signature(addr_width=addr_width, data_width=data_width, id_width=id_width)
        super().__init__({
            **{f"m{i}": In(sig) for i in range(n)},
            "sub": Out(AXI4Signature(addr_width=addr_width, data_width=data_width,
                                     id_width=id_width + self._src_bits)),
        })

    addr_width = property(lambda self: self._addr_width)
    data_width = property(lambda self: self._data_width)
    id_width = property(lambda self: self._id_width)
    priorities = property(lambda self: self._priorities)
    starvation_limit = property(lambda self: self._starvation_limit)
    w_fifo_depth = property(lambda self: self._w_fifo_depth)
    register_responses = property(lambda self: self._register_responses)
    n_managers = property(lambda self: len(self._priorities))
    #: Bits of the manager index added on top of the IDs on ``sub``.
    src_bits = property(lambda self: self._src_bits)

    @property
    def managers(self) -> tuple:
        """The manager-facing ports ``m0, m1, ...`` in order."""
        return tuple(getattr(self, f"m{i}") for i in range(self.n_managers))

    def __repr__(self):
        return (f"AxiArbiter(addr_width={self.addr_width}, data_width={self.data_width}, "
                f"id_width={self.id_width}, priorities={self.priorities}, "
                f"starvation_limit={self.starvation_limit}, w_fifo_depth={self.w_fifo_depth}, "
                f"register_responses={self.register_responses})")

    # --- arbitration ------------------------------------------------------------------
    def _arbiter(self, m: Module, name: str, reqs: list[Value], advance: Value) -> list[Value]:
        """One grant per cycle among ``reqs`` while ``advance``; returns the one-hot grant.

        State: per class a round-robin mask (members after the last one granted) and,
        for every class but the most urgent, a starvation counter.
        """
        levels = sorted(set(self._priorities))
        classes = [[i for i, p in enumerate(self._priorities) if p == lv] for lv in levels]
        picks, chosen, any_req = [], [], []
        for c, members in enumerate(classes):
            req = Cat(*[reqs[i] for i in members])
            after = Signal(len(members), name=f"{name}_rr{c}")
            masked = req & after
            pick = Cat(*[a | b for a, b in zip(_lowest(list(masked)),
                                               _lowest([r & ~masked.any() for r in req]),
                                               strict=True)])
            pick_s = named(m, pick, f"{name}_pick{c}")
            picks.append(pick_s)
            any_req.append(named(m, req.any(), f"{name}_any{c}"))
            chosen.append(Signal(name=f"{name}_class{c}"))
            # Next mask: the members after the one granted now.
            with m.If(advance & chosen[c]):
                m.d.sync += after.eq(Cat(C(0, 1), *[pick_s[:k].any()
                                                    for k in range(1, len(members))]))

        starving = [C(0, 1)]
        counters = [None]
        for c in range(1, len(classes)):
            count = Signal(range(self._starvation_limit + 1), name=f"{name}_wait{c}")
            counters.append(count)
            starving.append(named(m, (count == self._starvation_limit) & any_req[c],
                                  f"{name}_starving{c}"))
        any_starving = named(m, _any(starving), f"{name}_any_starving")
        by_starving = list(reversed(_lowest(list(reversed(starving)))))
        by_priority = _lowest(any_req)
        for c in range(len(classes)):
            m.d.comb += chosen[c].eq(by_starving[c] | (~any_starving & by_priority[c]))

        granted_more_urgent = C(0, 1)
        for c in range(len(classes)):
            if c:
                count = counters[c]
                with m.If(~any_req[c] | (advance & chosen[c])):
                    m.d.sync += count.eq(0)
                with m.Elif(advance & granted_more_urgent):
                    m.d.sync += count.eq(count + 1)
            granted_more_urgent = granted_more_urgent | chosen[c]

        grant = [None] * len(reqs)
        for c, members in enumerate(classes):
            for k, i in enumerate(members):
                g = Signal(name=f"{name}_grant{i}")
                m.d.comb += g.eq(advance & chosen[c] & picks[c][k])
                grant[i] = g
        return grant

    def _address_channel(self, m: Module, ch: str, allow: Value | None = None) -> list[Value]:
        """Arbitrated, registered ``ar`` / ``aw`` channel, granting only while ``allow``;
        returns the grant."""
        mgrs, sub = self.managers, self.sub
        sub_valid = getattr(sub, f"{ch}valid")
        advance = named(m, ~sub_valid | getattr(sub, f"{ch}ready"), f"{ch}_advance")
        grant = self._arbiter(m, ch, [getattr(p, f"{ch}valid") for p in mgrs],
                              advance if allow is None else
                              named(m, advance & allow, f"{ch}_may_grant"))
        for g, p in zip(grant, mgrs, strict=True):
            m.d.comb += getattr(p, f"{ch}ready").eq(g)
        any_grant = named(m, _any(grant), f"{ch}_any_grant")
        with m.If(advance):
            m.d.sync += sub_valid.eq(any_grant)
        with m.If(any_grant):
            ids = _select(grant, [getattr(p, f"{ch}id") for p in mgrs])
            m.d.sync += getattr(sub, f"{ch}id").eq(Cat(ids, _encode(grant, self._src_bits)))
            for f in ADDR_FIELDS:
                m.d.sync += getattr(sub, f"{ch}{f}").eq(
                    _select(grant, [getattr(p, f"{ch}{f}") for p in mgrs]))
        return grant

    def _response_channel(self, m: Module, ch: str, fields: tuple[str, ...]) -> None:
        """``r`` / ``b`` channel, routed to the manager named by the ID's top bits
        (through an output register with ``register_responses``); the other payload
        members go to every manager (only one sees valid)."""
        mgrs, sub = self.managers, self.sub
        n = len(mgrs)
        sub_valid, sub_id = getattr(sub, f"{ch}valid"), getattr(sub, f"{ch}id")
        if not self._register_responses:
            dest = named(m, Cat(*_decode(sub_id[self._id_width:], n)), f"{ch}_dest")
            m.d.comb += getattr(sub, f"{ch}ready").eq(
                _any([dest[i] & getattr(p, f"{ch}ready") for i, p in enumerate(mgrs)]))
            for i, p in enumerate(mgrs):
                m.d.comb += [
                    getattr(p, f"{ch}valid").eq(sub_valid & dest[i]),
                    getattr(p, f"{ch}id").eq(sub_id[:self._id_width]),
                    *[getattr(p, f"{ch}{f}").eq(getattr(sub, f"{ch}{f}")) for f in fields],
                ]
            return
        valid = Signal(name=f"{ch}_valid")
        dest = Signal(n, name=f"{ch}_dest")   # one-hot manager of the registered beat
        rid = Signal(self._id_width, name=f"{ch}_id")
        regs = {f: Signal(len(getattr(sub, f"{ch}{f}")), name=f"{ch}_{f}") for f in fields}
        taken = _any([dest[i] & getattr(p, f"{ch}ready") for i, p in enumerate(mgrs)])
        advance = named(m, ~valid | taken, f"{ch}_advance")
        m.d.comb += getattr(sub, f"{ch}ready").eq(advance)
        with m.If(advance):
            m.d.sync += valid.eq(sub_valid)
        with m.If(advance & sub_valid):
            m.d.sync += [
                dest.eq(Cat(*_decode(sub_id[self._id_width:], n))),
                rid.eq(sub_id[:self._id_width]),
                *[regs[f].eq(getattr(sub, f"{ch}{f}")) for f in fields],
            ]
        for i, p in enumerate(mgrs):
            m.d.comb += [
                getattr(p, f"{ch}valid").eq(valid & dest[i]),
                getattr(p, f"{ch}id").eq(rid),
                *[getattr(p, f"{ch}{f}").eq(regs[f]) for f in fields],
            ]

    def elaborate(self, platform):
        m = Module()
        mgrs, sub = self.managers, self.sub
        n = len(mgrs)
        if n == 1:
            wiring.connect(m, wiring.flipped(mgrs[0]), wiring.flipped(sub))
            return m

        # W-order FIFO: a ring of manager indices with one-hot pointers and a valid bit
        # per entry (no counters, so no constant comparisons).
        depth = self._w_fifo_depth
        entries = [Signal(self._src_bits, name=f"w_order{k}") for k in range(depth)]
        occupied = Signal(depth, name="w_order_occupied")
        wr_ptr = Signal(depth, name="w_order_wr", init=1)
        rd_ptr = Signal(depth, name="w_order_rd", init=1)
        full = named(m, (occupied & wr_ptr).any(), "w_order_full")
        head_ok = (occupied & rd_ptr).any()
        head = named(m, _select(list(rd_ptr), entries), "w_order_head")

        self._address_channel(m, "ar")
        aw_grant = self._address_channel(m, "aw", ~full)
        push = named(m, _any(aw_grant), "w_order_push")
        push_index = named(m, _encode(aw_grant, self._src_bits), "w_order_push_index")

        # W: from the manager at the FIFO head (or, while the FIFO is empty, the one
        # whose AW is granted now), into an output register.
        w_advance = named(m, ~sub.wvalid | sub.wready, "w_advance")
        bypass = named(m, ~head_ok & push, "w_bypass")
        w_sel = [named(m, (head_ok & d) | (bypass & g), f"w_sel{i}")
                 for i, (d, g) in enumerate(zip(_decode(head, n), aw_grant, strict=True))]
        for s, p in zip(w_sel, mgrs, strict=True):
            m.d.comb += p.wready.eq(s & w_advance)
        offered = _any([s & p.wvalid for s, p in zip(w_sel, mgrs, strict=True)])
        w_take = named(m, offered & w_advance, "w_take")
        pop = named(m, w_take & _select(w_sel, [p.wlast for p in mgrs]), "w_order_pop")
        with m.If(w_advance):
            m.d.sync += sub.wvalid.eq(w_take)
        with m.If(w_take):
            for f in ("wdata", "wstrb", "wlast"):
                m.d.sync += getattr(sub, f).eq(_select(w_sel, [getattr(p, f) for p in mgrs]))

        # A burst that passes whole in the cycle of its AW grant never enters the FIFO.
        push_entry = named(m, push & ~(bypass & pop), "w_order_push_entry")
        pop_entry = named(m, pop & ~bypass, "w_order_pop_entry")
        rotate = lambda ptr: Cat(ptr[-1], ptr[:-1])
        with m.If(push_entry):
            m.d.sync += wr_ptr.eq(rotate(wr_ptr))
            for k in range(depth):
                with m.If(wr_ptr[k]):
                    m.d.sync += entries[k].eq(push_index)
        with m.If(pop_entry):
            m.d.sync += rd_ptr.eq(rotate(rd_ptr))
        m.d.sync += occupied.eq((occupied & ~(rd_ptr & pop_entry.replicate(depth)))
                                | (wr_ptr & push_entry.replicate(depth)))

        self._response_channel(m, "r", ("data", "resp", "last"))
        self._response_channel(m, "b", ("resp",))
        return m
