"""The DCOH's allocator: each device access gets its bias decision and an entry of the
pool, each claim of a flip an entry, and the host-bias accesses and the claims their D2H
Req.

See :class:`EntryAllocator`; it is built into :class:`hw.cxl.dcoh.Dcoh` (``docs/dcoh.md``,
"Entries: CQIDs and handles").
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..widths import is_int as _is_int
from ..widths import is_pow2 as _is_pow2
from ..widths import lowest_set, named, onehot
from .cache_agent import TAG_BITS
from .messages import LINE_ADDR_BITS, D2HReq, D2HReqOpcode

__all__ = ["ACC_REQ", "ENTRY_INFO", "LINE_ADDR_BITS", "EntryAllocator"]

#: Width of a CQID (CXL 2.0 §3.2.3; ``docs/cxl-encodings.md``).
_CQID_BITS = 12

#: A device access asking for permission: ``line`` is the device line address (the line's
#: offset from the start of device memory, in lines), ``write`` the access kind, ``tag``
#: the user's, returned with the grant.
ACC_REQ = data.StructLayout({"line": LINE_ADDR_BITS, "write": 1, "tag": TAG_BITS})

#: What an entry was allocated for: the host line of its D2H Req (the device line of an
#: access beyond device memory, for the error record), the access's tag, a claim or an
#: access, and the access's ``host_bias`` and ``error``.
ENTRY_INFO = data.StructLayout({"host_line": LINE_ADDR_BITS, "tag": TAG_BITS, "claim": 1,
                                "host_bias": 1, "error": 1})


class EntryAllocator(wiring.Component):
    """Takes accesses and claims into free entries, one a cycle, and sends their D2H Reqs.

    **Decision.** An access taken from ``i_acc`` in cycle *d* - 1 is decided in cycle
    *d* with the bias of its page read in *d* - 1 (``o_bias_page``, ``i_bias_dev``). A
    line beyond device memory (``pages * lines_per_page`` lines) takes an entry for its
    error grant (``o_range_error``); a page in device bias takes one for an immediate
    grant (``o_permit``); a page in host bias takes one and sends the D2H Req for
    ``i_hdm_base + line`` (``read_opcode`` for a read, RdOwn for a write, CQID
    ``cqid_base`` + entry; ``o_wait``). A decision that cannot go (no free entry; for
    host bias, the D2H Req register full or taken by a claim) stalls and re-reads its
    page every cycle, so it never acts on a stale bias.

    **Claims.** ``i_claim_want`` asks for a RdOwnNoData of ``i_claim_line`` (device line,
    of page ``i_claim_page``); it goes (``o_claim_go``, ``o_claim``) when an entry is
    free and the D2H Req register is free. Accesses and claims take turns when both can
    go.

    **Entries.** The lowest free entry of ``i_free`` is allocated; ``o_alloc`` is its
    one-hot (zero when none is), with ``o_info`` (written to the DCOH's entry memory at
    ``o_info_addr`` while ``o_info_en``), ``o_page`` and ``o_line``; ``o_writes`` holds
    which entries an access that writes holds.

    **Latency, throughput, backpressure.** An ``i_acc`` handshake in cycle 0 is decided
    in cycle 1 and puts its D2H Req valid in cycle 2. One allocation per cycle.
    ``i_acc.ready`` is low while a decision stalls and while ``i_sweeping``; it depends
    combinationally on ``o_d2h_req.ready``. ``o_d2h_req`` is a register that obeys the
    stream rules. Reset (synchronous) drops the access being decided and the D2H Req.

    Parameters
    ----------
    pages : int
        Pages of device memory, 1 to 2**24.
    lines_per_page : int
        A power of two from 1 to 2**15.
    entries : int
        Entries of the pool, a power of two from 2 to 256.
    cqid_base : int
        CQID of entry 0, a multiple of ``entries`` with ``cqid_base + entries <= 4096``.
    read_opcode : D2HReqOpcode
        ``D2HReqOpcode.RdCurr`` or ``D2HReqOpcode.RdShared``: the D2H Req of a read.

    Members
    -------
    i_acc : ``In(stream.Signature(ACC_REQ))``
        Device accesses.
    o_d2h_req : ``Out(stream.Signature(D2HReq))``
        D2H Reqs of host-bias accesses and claims.
    i_sweeping : ``In(1)``
        The bias table's reset sweep runs: no access is taken. High only from a reset
        on, while no access is being decided.
    o_bias_page : ``Out(page bits)``; i_bias_dev : ``In(1)``
        The bias read port.
    i_free : ``In(entries)``
        Entries free for allocation.
    i_hdm_base : ``In(LINE_ADDR_BITS)``
        Host line address of device line 0.
    i_claim_want : ``In(1)``; i_claim_line : ``In(LINE_ADDR_BITS)``
        The flip's next claim, of a line of ``i_claim_page`` (``In(page bits)``); it
        goes with ``o_claim_go`` (``Out(1)``).
    o_alloc, o_wait, o_claim, o_permit, o_range_error : ``Out(entries)``
        The entry allocated this cycle (one-hot), if it is for a host-bias access, a
        claim, a device-bias access or an access beyond device memory.
    o_page : ``Out(page bits)``; o_line : ``Out(LINE_ADDR_BITS)``
        The allocated entry's page, and the access's device line.
    o_info_en : ``Out(1)``; o_info_addr : ``Out(range(entries))``
        Write the allocated entry's ``o_info`` (``Out(ENTRY_INFO)``).
    o_writes : ``Out(entries)``
        Entries allocated to a write.
    o_busy : ``Out(1)``
        An access is being decided.

    Raises
    ------
    ValueError
        If a parameter is out of its range or of the wrong type.
    """

    def __init__(self, *, pages: int, lines_per_page: int, entries: int, cqid_base: int,
                 read_opcode: D2HReqOpcode):
        if not _is_int(pages) or not 1 <= pages <= 1 << 24:
            raise ValueError(f"pages must be an integer from 1 to {1 << 24}, not {pages!r}")
        if not _is_pow2(lines_per_page) or not lines_per_page <= 1 << 15:
            raise ValueError(f"lines_per_page must be a power of two from 1 to {1 << 15}, "
                             f"not {lines_per_page!r}")
        if not _is_pow2(entries) or not 2 <= entries <= 256:
            raise ValueError(f"entries must be a power of two from 2 to 256, not {entries!r}")
        top = (1 << _CQID_BITS) - entries
        if not _is_int(cqid_base) or not 0 <= cqid_base <= top or cqid_base % entries:
            raise ValueError(f"cqid_base must be a multiple of entries ({entries}) from 0 "
                             f"to {top}, not {cqid_base!r}")
        if read_opcode not in (D2HReqOpcode.RdCurr, D2HReqOpcode.RdShared):
            raise ValueError(f"read_opcode must be D2HReqOpcode.RdCurr or "
                             f"D2HReqOpcode.RdShared, not {read_opcode!r}")
        self._pages = pages
        self._lines_per_page = lines_per_page
        self._entries = entries
        self._cqid_base = cqid_base
        self._read_opcode = read_opcode
        pb = max(1, (pages - 1).bit_length())
        super().__init__({
            "i_acc": In(stream.Signature(ACC_REQ)),
            "o_d2h_req": Out(stream.Signature(D2HReq)),
            "i_sweeping": In(1),
            "o_bias_page": Out(pb),
            "i_bias_dev": In(1),
            "i_free": In(entries),
            "i_hdm_base": In(LINE_ADDR_BITS),
            "i_claim_want": In(1),
            "i_claim_line": In(LINE_ADDR_BITS),
            "i_claim_page": In(pb),
            "o_claim_go": Out(1),
            "o_alloc": Out(entries),
            "o_wait": Out(entries),
            "o_claim": Out(entries),
            "o_permit": Out(entries),
            "o_range_error": Out(entries),
            "o_page": Out(pb),
            "o_line": Out(LINE_ADDR_BITS),
            "o_info_en": Out(1),
            "o_info_addr": Out(range(entries)),
            "o_info": Out(ENTRY_INFO),
            "o_writes": Out(entries),
            "o_busy": Out(1),
        })

    @property
    def pages(self) -> int:
        return self._pages

    @property
    def lines_per_page(self) -> int:
        return self._lines_per_page

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def cqid_base(self) -> int:
        return self._cqid_base

    @property
    def read_opcode(self) -> D2HReqOpcode:
        return self._read_opcode

    def elaborate(self, platform):
        m = Module()
        n = self._entries
        shift = self._lines_per_page.bit_length() - 1
        pb = len(self.o_page)
        acc, req, info = self.i_acc, self.o_d2h_req, self.o_info

        def page_of(line):
            return line[shift:shift + pb]

        any_free, free_idx = lowest_set(m, self.i_free, "free")
        free_oh = onehot(m, free_idx, n, "free_oh")

        # --- the access being decided -----------------------------------------------------
        deciding = Signal()
        access = Signal(ACC_REQ)
        access_allocated = Signal()
        page = page_of(access.line)
        inside = named(m, access.line < self._pages << shift, "inside")
        m.d.comb += [
            acc.ready.eq(~self.i_sweeping & (~deciding | access_allocated)),
            self.o_bias_page.eq(Mux(deciding & ~access_allocated, page, page_of(acc.p.line))),
        ]
        with m.If(acc.ready):
            m.d.sync += deciding.eq(acc.valid)
            with m.If(acc.valid):
                m.d.sync += access.eq(acc.payload)
        # Every access takes an entry, even one granted with error, so that no decision
        # waits for the grant output.
        beyond = deciding & ~inside
        device_bias = deciding & inside & self.i_bias_dev
        host_bias = deciding & inside & ~self.i_bias_dev

        # --- accesses and claims take turns for the entry and the D2H Req register -------
        req_free = ~req.valid | req.ready
        access_can = deciding & any_free & (~host_bias | req_free)
        claim_can = self.i_claim_want & any_free & req_free
        prefer_claim = Signal()
        claim_allocated = self.o_claim_go
        m.d.comb += [
            access_allocated.eq(access_can & ~(claim_can & prefer_claim)),
            claim_allocated.eq(claim_can & ~access_allocated),
        ]
        with m.If(claim_allocated):
            m.d.sync += prefer_claim.eq(0)
        with m.Elif(access_allocated):
            m.d.sync += prefer_claim.eq(1)

        # --- the allocation ----------------------------------------------------------------
        alloc = named(m, access_allocated | claim_allocated, "allocating")
        access_host_line = Signal(LINE_ADDR_BITS)
        claim_host_line = Signal(LINE_ADDR_BITS)
        cqid = Const(self._cqid_base, _CQID_BITS) | free_idx
        m.d.comb += [
            access_host_line.eq(self.i_hdm_base + access.line),
            claim_host_line.eq(self.i_hdm_base + self.i_claim_line),
            self.o_alloc.eq(Mux(alloc, free_oh, 0)),
            self.o_wait.eq(Mux(access_allocated & host_bias, free_oh, 0)),
            self.o_claim.eq(Mux(claim_allocated, free_oh, 0)),
            self.o_permit.eq(Mux(access_allocated & device_bias, free_oh, 0)),
            self.o_range_error.eq(Mux(access_allocated & beyond, free_oh, 0)),
            self.o_page.eq(Mux(claim_allocated, self.i_claim_page, page)),
            self.o_line.eq(access.line),
            self.o_info_en.eq(alloc),
            self.o_info_addr.eq(free_idx),
            # An error grant keeps the requested (device) line for the error record.
            info.host_line.eq(Mux(claim_allocated, claim_host_line,
                                  Mux(beyond, access.line, access_host_line))),
            info.tag.eq(access.tag),
            info.claim.eq(claim_allocated),
            info.host_bias.eq(host_bias & ~claim_allocated),
            info.error.eq(beyond & ~claim_allocated),
            self.o_busy.eq(deciding),
        ]
        with m.If(alloc):
            m.d.sync += self.o_writes.eq(Mux(access.write & ~claim_allocated,
                                             self.o_writes | free_oh,
                                             self.o_writes & ~free_oh))

        # --- the D2H Req register ----------------------------------------------------------
        with m.If(access_allocated & host_bias):
            m.d.sync += [
                req.valid.eq(1),
                req.p.opcode.eq(Mux(access.write, D2HReqOpcode.RdOwn.value,
                                    self._read_opcode.value)),
                req.p.cqid.eq(cqid),
                req.p.address.eq(access_host_line),
            ]
        with m.Elif(claim_allocated):
            m.d.sync += [
                req.valid.eq(1),
                req.p.opcode.eq(D2HReqOpcode.RdOwnNoData.value),
                req.p.cqid.eq(cqid),
                req.p.address.eq(claim_host_line),
            ]
        with m.Elif(req.ready):
            m.d.sync += req.valid.eq(0)
        return m
