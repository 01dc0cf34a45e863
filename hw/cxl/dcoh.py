"""DCOH of the Type-2 device for its own memory (HDM-D): the per-page bias table, the
gate through which device blocks access device memory, host-bias forwarding over
CXL.cache, bias flips and the check of host accesses.

See :class:`Dcoh` and ``docs/dcoh.md``.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..config import LINE_BYTES
from ..csr.error_log import ErrorLog
from ..widths import is_int as _is_int
from ..widths import is_pow2 as _is_pow2
from ..widths import named
from .bias_flip import FLIP_STATUS, BiasFlip, flip_layout
from .bias_table import BiasTable
from .dcoh_answers import ANSWER_INFO, DcohAnswers
from .dcoh_grants import DcohGrants, grant_layout
from .entry_allocator import ACC_REQ, ENTRY_INFO, EntryAllocator
from .entry_pages import EntryPages
from .host_check import HostCheck
from .messages import LINE_ADDR_BITS, D2HReq, D2HReqOpcode, H2DData, H2DRsp, M2SReq

__all__ = [
    "ACC_REQ",
    "CHK_RSP",
    "ERR_INFO",
    "LINE_ADDR_BITS",
    "Dcoh",
    "DcohError",
    "grant_layout",
]

#: Width of a CQID (CXL 2.0 §3.2.3; ``docs/cxl-encodings.md``).
_CQID_BITS = 12

#: The answer to a host check: ``flipped`` the page was in device bias and has been
#: flipped back to host bias; ``error`` the line was beyond device memory (nothing done).
CHK_RSP = data.StructLayout({"flipped": 1, "error": 1})

#: Details of an error (:attr:`Dcoh.o_err_first`). ``opcode`` is the M2S opcode of a
#: forward, the H2D Rsp opcode of an H2D Rsp (zero for H2D Data and the other kinds);
#: ``id`` the forward's Tag, the H2D message's CQID, the access's tag or the handle of a
#: done (zero for the check and flip kinds); ``address`` the forward's or the request's
#: line address, the page number for the flip kinds, zero for the H2D kinds.
ERR_INFO = data.StructLayout({"code": 4, **ANSWER_INFO.members})


class DcohError:
    """Error kinds: bit positions of ``o_err_set`` / ``o_err_status`` and values of
    ``ERR_INFO.code``."""
    FWD_NOT_IN_FLIGHT = 0   # forward's Tag names no CQID of the pool waiting for a forward
    FWD_OPCODE = 1          # not the forward the request waits for (or not a forward)
    FWD_ADDRESS = 2         # forward's address differs from the request's
    ACC_RANGE = 3           # device access beyond device memory: granted with error
    DONE_UNEXPECTED = 4     # done naming a handle without an undone grant
    CHK_RANGE = 5           # host check beyond device memory: answered with error
    FLIP_RANGE = 6          # flip command beyond the bias table: done with error
    FLIP_BUSY = 7           # flip start while a flip (or the reset sweep) runs: ignored
    FLIP_CONTENDED = 8      # host touched a page while the flip claimed it: page not flipped
    HOST_ERROR = 9          # the host answered a request with GO-Err (H2D Rsp or H2D Data)
    RSP_UNEXPECTED = 10     # H2D Rsp / Data for a DCOH CQID that does not wait for it
    COUNT = 11


def _raise_errors(m: Module, log: ErrorLog, raised: dict) -> None:
    """Wires ``raised`` (kind: ``(flag, details)``, the details an ``ANSWER_INFO`` value
    or an ``(opcode, id, address)`` tuple) into the error log's inputs."""
    names = {v: k.lower() for k, v in vars(DcohError).items() if k.isupper() and k != "COUNT"}
    kinds = []
    for kind in range(DcohError.COUNT):
        flag, details = raised[kind]
        kinds.append(named(m, flag, f"err_{names[kind]}"))
        slot = log.i_info[kind]
        if isinstance(details, tuple):
            m.d.comb += [slot.opcode.eq(details[0]), slot.id.eq(details[1]),
                         slot.address.eq(details[2])]
        else:
            m.d.comb += slot.eq(details)
    # One signal per kind, joined by one assignment: a bit assigned on its own becomes a
    # one-line ``always @*`` in the Verilog, which Icarus runs only once its inputs
    # change, so a kind never raised stayed X there.
    m.d.comb += log.i_raise.eq(Cat(*kinds))


class Dcoh(wiring.Component):
    """Device coherency engine for device memory in the bias model of CXL 2.0
    (CXL 2.0 §2.2.1, "Bias Based Coherency Model"; ``docs/dcoh.md``).

    **Bias table.** One bit per page of device memory (``pages`` pages of
    ``page_bytes``): host bias (0) or device bias (1). It is a
    :class:`~amaranth.lib.memory.Memory` with synchronous, write-transparent read ports
    (one each for the access gate, the host check and the flip command) and one write
    port. A memory's contents survive a reset, so after reset the DCOH writes host bias
    into every page, one per cycle (``max(pages, 2)`` cycles), while ``i_acc`` and
    ``i_host_chk`` are not ready and flip starts are ignored (FLIP_BUSY): every page is in
    host bias after reset.

    **Access gate.** A device block asks on ``i_acc`` before it reads or writes a line of
    device memory (device line address, write flag, tag), and gets a grant on ``o_grant``
    with its tag and a ``handle``. The handle is an entry of a pool of ``cqids`` entries,
    which are also the DCOH's CQIDs ``cqid_base .. cqid_base + cqids - 1``. A page in
    device bias is granted at once (``host_bias = 0``). For a page in host bias the DCOH
    sends a D2H Req for the line's host address (``hdm_base + line``) with the entry's
    CQID: ``read_opcode`` (RdCurr or RdShared) for a read, RdOwn for a write; the grant
    (``host_bias = 1``) follows the M2S MemRdFwd whose Tag is that CQID and whose address
    is that line (CXL 1.1 Table 17 and CXL 3.1 Table 3-24 answer every one of these
    requests with MemRdFwd; MemWrFwd answers only the weakly ordered writes, which the
    DCOH does not send). No completion goes back to the host. Once the user's memory
    access has finished (AXI R or B), it returns the handle on ``i_done``; the entry is
    free again. A line beyond device memory is granted at once with ``error`` set (its
    handle needs no done; the entry is free once the grant has left) and flagged
    ACC_RANGE. Every access takes an entry at its decision, so no decision waits for the
    grant output: entries that are permitted wait for a round-robin pick into the
    ``o_grant`` register. Grants therefore leave **out of order** (device-bias grants do
    not wait behind host-bias ones); the user matches them by tag. No entry waits longer
    than ``cqids`` picks.

    **Forwards** (``i_fwd``, the M2S Req messages the endpoint routes here) are always
    accepted. A forward whose Tag names no entry waiting for a forward, whose opcode is
    not MemRdFwd, or whose address differs from the request's, is dropped and flagged
    (FWD_NOT_IN_FLIGHT, FWD_OPCODE, FWD_ADDRESS); the request keeps waiting for its
    forward, so a bad forward never grants anything.

    **H2D Rsp and H2D Data** naming the pool's CQIDs (the device routes them here;
    ``i_h2d_rsp`` and ``i_h2d_data`` are always ready) are the host's other answers. A GO
    with state Exclusive (GO-E) completes a claim (RdOwnNoData) as its MemRdFwd would (CXL
    3.1 §3.2.4.2.13). A GO with state Error (GO-Err), for any request waiting, and an H2D
    Data with GO-Err, for a read waiting, end the request with HOST_ERROR: an access is
    granted with ``error`` and ``denied`` (the user must not touch the line; the entry is
    free once the grant has left, no done); a claim ends, and its page stays in host bias
    and the flip command ends with ``error``. Any other H2D Rsp or Data (for a CQID that
    waits for nothing, outside the pool, a GO-E for an access, H2D Data without GO-Err or
    for a write or claim, other opcodes) is dropped and flagged RSP_UNEXPECTED; the
    request keeps waiting. In one cycle a forward is taken before an H2D Rsp, and an H2D
    Rsp before an H2D Data, so an entry completes once.

    **Flip command.** ``i_flip_start`` with ``i_flip`` (``first_page``, ``pages``,
    ``to_host``) walks the pages in order. To device bias: a page already in device
    bias is skipped; otherwise each of its lines is claimed with D2H RdOwnNoData (many
    in flight, from the same CQID pool), and the page turns to device bias once every
    claim's MemRdFwd has arrived. If a host check of the page is in progress at any time
    between its first claim and the bias write, the page stays in host bias and the
    command ends with ``error`` (FLIP_CONTENDED): the host may hold a line that was
    already claimed. To host bias: a page in device bias is set to host bias, then the
    flip waits until every access of the page granted before that has been done; a page
    already in host bias is only drained the same way (a host check may have flipped it
    back and still be waiting), so ``done`` means that no access granted in device bias
    before the command is still running in any page of the range. ``o_flip.busy`` is
    high while the command runs (and during the reset sweep); ``done`` and ``error`` are
    levels, cleared by an accepted start and set when the command ends. A range beyond
    the table ends it at once with ``error`` (FLIP_RANGE); ``pages = 0`` ends it at once
    without; a start while busy is ignored (FLIP_BUSY).

    **Host check.** The endpoint presents the device line address of each host request
    on ``i_host_chk`` and serves the request only after the answer on ``o_host_chk``.
    The DCOH answers once no access to the page that was granted before the check (or
    whose forward was accepted at least one cycle before the check's handshake) is still
    undone, where an access permitted in host bias (by its forward) counts only for a
    check of its own line: the host ordered it with its forward, and a user that holds a
    granted line until another line of the page is granted (a burst) would otherwise
    deadlock against the host's write-back of that other line; a page in device bias is
    first set to host bias (``flipped = 1``), so the host may then cache its lines. A
    line beyond device memory is answered at once with ``error`` (CHK_RANGE). Checks are
    answered in order. Waiting needs only the device's own accesses to finish, never a
    CXL message, so holding the host's request channel for the answer cannot deadlock as
    long as no user makes a done wait for another grant (``docs/dcoh.md``, "Rules for
    users").

    **Latency** (idle DCOH, outputs ready): an ``i_acc`` handshake in cycle 0 puts a
    host-bias D2H Req valid in cycle 2 and a device-bias (or error) grant valid in cycle
    3; a forward taken in cycle *t* puts its grant valid in cycle *t* + 3, and so does a
    GO-Err taken in cycle *t* (an error grant). A check taken
    in cycle *t* is answered in cycle *t* + 2 (host bias, nothing to drain) or *t* + 3
    (device bias, nothing to drain). A flip works one page at a time: 3 cycles for a
    skipped page; to device bias, the claims of the page's lines (one per cycle at
    best), the host's answer to the last one and 5 cycles; to host bias, 5 or 6 cycles
    plus the drain.

    **Throughput.** One access decision per cycle, one grant per cycle, one D2H Req per
    cycle (accesses and claims take turns when both wait), one forward and one done per
    cycle (always ready), one check per cycle when nothing is drained. An entry is held
    from the decision to the done, so accesses sustain ``min(1, cqids / T)`` per cycle
    for an entry lifetime of ``T`` cycles (Little's law: host round trip plus memory
    access in host bias, memory access alone in device bias).

    **Backpressure.** ``i_fwd`` and ``i_done`` are always ready. ``i_acc.ready`` is low
    while the decision stage holds an access that cannot go (no free entry; for host
    bias, the D2H Req register full or taken by a claim), so it depends combinationally
    on ``o_d2h_req.ready``; a full ``o_grant`` never blocks a decision.
    ``i_host_chk.ready`` is low while a check is being answered; both are low during the
    reset sweep. Every output stream is
    a register that obeys the stream rules (valid does not wait for ready; valid and
    payload hold until the transfer).

    **Reset** (synchronous ``rst``) frees every entry and drops every request, grant,
    check and flip in flight, then sweeps the bias table to host bias. The host side
    and the users must be reset with it.

    Parameters
    ----------
    pages : int
        Pages of device memory, 1 to 2**24 (default 256); any number, not only powers
        of two.
    page_bytes : int
        Bytes per page, a power of two from 64 to 2 MiB (default 4096).
    cqids : int
        Entries of the pool: CQIDs and grant handles, a power of two from 2 to 256
        (default 64).
    cqid_base : int
        First CQID of the pool, a multiple of ``cqids`` with ``cqid_base + cqids <=
        4096`` (default 0); chosen so the pool does not overlap the cache agent's CQIDs.
    read_opcode : D2HReqOpcode
        ``D2HReqOpcode.RdCurr`` (default) or ``D2HReqOpcode.RdShared``: the D2H Req of a
        read of a host-bias page.

    Members
    -------
    i_acc : ``In(stream.Signature(ACC_REQ))``
        Device accesses asking for permission.
    o_grant : ``Out(stream.Signature(grant_layout))``
        Grants: ``tag``, ``handle``, ``error``, ``host_bias``; out of order.
    i_done : ``In(stream.Signature(unsigned(log2(cqids))))``
        Handle of a granted access whose memory access has finished (always ready).
    o_d2h_req : ``Out(stream.Signature(D2HReq))``
        RdCurr / RdShared / RdOwn / RdOwnNoData with the pool's CQIDs; NT and reserved
        fields zero.
    i_fwd : ``In(stream.Signature(M2SReq))``
        MemRdFwd (and, as bad input, any other opcode), Tag = CQID (always ready).
    i_h2d_rsp : ``In(stream.Signature(H2DRsp))``
        H2D Rsp naming the pool's CQIDs (always ready).
    i_h2d_data : ``In(stream.Signature(H2DData))``
        H2D Data naming the pool's CQIDs; only its header is used (always ready).
    i_host_chk : ``In(stream.Signature(LINE_ADDR_BITS))``
        Device line address of a host access.
    o_host_chk : ``Out(stream.Signature(CHK_RSP))``
        Check answers, in check order.
    hdm_base : ``In(LINE_ADDR_BITS)``
        Host line address of device line 0 (the endpoint's HDM base). May change only
        while the DCOH is idle.
    i_flip_start : ``In(1)``
        Starts the flip command in ``i_flip`` (one-cycle pulse).
    i_flip : ``In(flip_layout)``
        ``first_page``, ``pages``, ``to_host``.
    o_flip : ``Out(FLIP_STATUS)``
        ``busy``, ``done``, ``error``.
    o_err_set : ``Out(DcohError.COUNT)``
        One-cycle pulse per error kind, registered: two cycles after a bad forward's, a
        GO-Err's or an unexpected H2D message's handshake, one cycle after a bad done's
        or flip start's handshake or an error grant's transfer, with the error answer of
        a check becoming valid, one cycle after a contended page is given up.
    o_err_status : ``Out(DcohError.COUNT)``
        Sticky ``o_err_set``; bits written in ``i_err_clear`` clear, a new error wins
        over a clear in the same cycle.
    i_err_clear : ``In(DcohError.COUNT)``
        Write-1-to-clear for ``o_err_status``.
    o_err_first : ``Out(ERR_INFO)``
        The first error since ``o_err_status`` was last all zero (the lowest kind when
        several come at once); meaningful while ``o_err_status`` is non-zero.
    o_inflight : ``Out(range(cqids + 1))``
        Entries in use.
    o_busy : ``Out(1)``
        Anything in flight anywhere in the DCOH, the reset sweep included.

    Raises
    ------
    ValueError
        If a parameter is out of its range or of the wrong type.
    """

    #: ``o_flip`` layout.
    FLIP_STATUS = FLIP_STATUS

    def __init__(self, *, pages: int = 256, page_bytes: int = 4096, cqids: int = 64,
                 cqid_base: int = 0, read_opcode: D2HReqOpcode = D2HReqOpcode.RdCurr):
        if not _is_int(pages) or not 1 <= pages <= 1 << 24:
            raise ValueError(f"pages must be an integer from 1 to {1 << 24}, not {pages!r}")
        if not _is_pow2(page_bytes) or not LINE_BYTES <= page_bytes <= 1 << 21:
            raise ValueError(f"page_bytes must be a power of two from {LINE_BYTES} to "
                             f"{1 << 21}, not {page_bytes!r}")
        if not _is_pow2(cqids) or not 2 <= cqids <= 256:
            raise ValueError(f"cqids must be a power of two from 2 to 256, not {cqids!r}")
        top = (1 << _CQID_BITS) - cqids
        if not _is_int(cqid_base) or not 0 <= cqid_base <= top or cqid_base % cqids:
            raise ValueError(f"cqid_base must be a multiple of cqids ({cqids}) from 0 to "
                             f"{top}, not {cqid_base!r}")
        if read_opcode not in (D2HReqOpcode.RdCurr, D2HReqOpcode.RdShared):
            raise ValueError(f"read_opcode must be D2HReqOpcode.RdCurr or "
                             f"D2HReqOpcode.RdShared, not {read_opcode!r}")
        self._pages = pages
        self._page_bytes = page_bytes
        self._cqids = cqids
        self._cqid_base = cqid_base
        self._read_opcode = read_opcode
        self._grant_layout = grant_layout(cqids.bit_length() - 1)
        self._flip_layout = flip_layout(pages)
        super().__init__({
            "i_acc": In(stream.Signature(ACC_REQ)),
            "o_grant": Out(stream.Signature(self._grant_layout)),
            "i_done": In(stream.Signature(unsigned(cqids.bit_length() - 1))),
            "o_d2h_req": Out(stream.Signature(D2HReq)),
            "i_fwd": In(stream.Signature(M2SReq)),
            "i_h2d_rsp": In(stream.Signature(H2DRsp)),
            "i_h2d_data": In(stream.Signature(H2DData)),
            "i_host_chk": In(stream.Signature(LINE_ADDR_BITS)),
            "o_host_chk": Out(stream.Signature(CHK_RSP)),
            "hdm_base": In(LINE_ADDR_BITS),
            "i_flip_start": In(1),
            "i_flip": In(self._flip_layout),
            "o_flip": Out(self.FLIP_STATUS),
            "o_err_set": Out(DcohError.COUNT),
            "o_err_status": Out(DcohError.COUNT),
            "i_err_clear": In(DcohError.COUNT),
            "o_err_first": Out(ERR_INFO),
            "o_inflight": Out(range(cqids + 1)),
            "o_busy": Out(1),
        })

    @property
    def pages(self) -> int:
        return self._pages

    @property
    def page_bytes(self) -> int:
        return self._page_bytes

    @property
    def lines_per_page(self) -> int:
        return self._page_bytes // LINE_BYTES

    @property
    def cqids(self) -> int:
        return self._cqids

    @property
    def cqid_base(self) -> int:
        return self._cqid_base

    @property
    def read_opcode(self) -> D2HReqOpcode:
        return self._read_opcode

    @property
    def grant_layout(self) -> data.StructLayout:
        """``o_grant`` payload: ``tag``, ``handle`` (``log2(cqids)`` bits), ``error``,
        ``host_bias``."""
        return self._grant_layout

    @property
    def flip_layout(self) -> data.StructLayout:
        """``i_flip``: ``first_page`` (``max(1, ceil(log2(pages)))`` bits), ``pages``
        (wide enough for ``pages``), ``to_host``."""
        return self._flip_layout

    def elaborate(self, platform):
        m = Module()
        n = self._cqids
        lpp = self.lines_per_page
        pb = self._flip_layout["first_page"].width     # page number bits

        # --- the parts ----------------------------------------------------------------------
        m.submodules.bias_table = table = BiasTable(pages=self._pages, page_bits=pb)
        m.submodules.allocator = alloc = EntryAllocator(
            pages=self._pages, lines_per_page=lpp, entries=n, cqid_base=self._cqid_base,
            read_opcode=self._read_opcode)
        m.submodules.answers = ans = DcohAnswers(cqids=n, cqid_base=self._cqid_base)
        m.submodules.grants = grants = DcohGrants(entries=n)
        m.submodules.entry_pages = pages = EntryPages(
            pages=self._pages, lines_per_page=lpp, entries=n, line_bits=LINE_ADDR_BITS)
        m.submodules.check = chk = HostCheck(
            total_lines=self._pages * lpp, lines_per_page=lpp, page_bits=pb,
            entries=n, chk_layout=CHK_RSP, line_bits=LINE_ADDR_BITS)
        m.submodules.flip = flip = BiasFlip(pages=self._pages, lines_per_page=lpp, entries=n)
        m.submodules.errors = log = ErrorLog(kinds=DcohError.COUNT, info=ANSWER_INFO)
        for port in ("i_fwd", "i_h2d_rsp", "i_h2d_data"):
            wiring.connect(m, wiring.flipped(getattr(self, port)), getattr(ans, port))
        wiring.connect(m, wiring.flipped(self.i_acc), alloc.i_acc)
        wiring.connect(m, alloc.o_d2h_req, wiring.flipped(self.o_d2h_req))
        wiring.connect(m, grants.o_grant, wiring.flipped(self.o_grant))
        wiring.connect(m, wiring.flipped(self.i_done), grants.i_done)
        wiring.connect(m, wiring.flipped(self.i_host_chk), chk.i_chk)
        wiring.connect(m, chk.o_chk, wiring.flipped(self.o_host_chk))

        # The entry memory: what each entry was allocated for. The forward check reads an
        # entry in the cycle its forward is taken, so an entry allocated in that very
        # cycle must be seen with its new contents; the grant reads an entry at least one
        # cycle after it was written.
        m.submodules.info = info = Memory(shape=ENTRY_INFO, depth=n, init=[])
        info_wr = info.write_port()
        info_fwd = info.read_port(transparent_for=(info_wr,))
        info_grant = info.read_port(transparent_for=())
        waiting = Signal(n)     # access sent to the host, waiting for its forward
        claiming = Signal(n)    # RdOwnNoData of a flip, waiting for its answer
        free = Signal(n)
        m.d.comb += [
            free.eq(~(waiting | claiming | grants.o_held)),
            # The bias table: the sweep first, then the check's write, then the flip's.
            table.i_acc_page.eq(alloc.o_bias_page), alloc.i_bias_dev.eq(table.o_acc_dev),
            table.i_chk_page.eq(chk.o_bias_addr), table.i_chk_en.eq(chk.o_bias_en),
            chk.i_bias_dev.eq(table.o_chk_dev),
            table.i_chk_wr.eq(chk.o_wr_req), table.i_chk_wr_page.eq(chk.o_page),
            chk.i_wr_go.eq(table.o_chk_wr_go),
            table.i_flip_page.eq(flip.o_page), flip.i_bias_dev.eq(table.o_flip_dev),
            table.i_flip_wr.eq(flip.o_wr_req), table.i_flip_wr_dev.eq(flip.o_wr_val),
            flip.i_wr_go.eq(table.o_flip_wr_go),
            alloc.i_sweeping.eq(table.o_sweeping), chk.i_sweeping.eq(table.o_sweeping),
            flip.i_sweeping.eq(table.o_sweeping),
            # Allocation.
            alloc.i_free.eq(free), alloc.i_hdm_base.eq(self.hdm_base),
            alloc.i_claim_want.eq(flip.o_claim_want), alloc.i_claim_line.eq(flip.o_claim_line),
            alloc.i_claim_page.eq(flip.o_page), flip.i_claim_go.eq(alloc.o_claim_go),
            info_wr.en.eq(alloc.o_info_en), info_wr.addr.eq(alloc.o_info_addr),
            info_wr.data.eq(alloc.o_info),
            # The host's answers.
            ans.i_wait.eq(waiting), ans.i_claim.eq(claiming), ans.i_write.eq(alloc.o_writes),
            info_fwd.addr.eq(ans.o_info_addr), ans.i_info_line.eq(info_fwd.data.host_line),
            # Grants and dones.
            grants.i_alloc.eq(alloc.o_alloc), grants.i_permit.eq(alloc.o_permit | ans.o_permitted),
            grants.i_range_error.eq(alloc.o_range_error), grants.i_denied.eq(ans.o_denied),
            info_grant.addr.eq(grants.o_info_addr), info_grant.en.eq(grants.o_info_en),
            grants.i_tag.eq(info_grant.data.tag), grants.i_error.eq(info_grant.data.error),
            grants.i_host_bias.eq(info_grant.data.host_bias),
            # What the check and the flip wait for.
            pages.i_alloc.eq(alloc.o_alloc), pages.i_by_forward.eq(ans.o_permitted),
            pages.i_page.eq(alloc.o_page), pages.i_line.eq(alloc.o_line),
            pages.i_tracked.eq(grants.o_tracked), pages.i_cleared.eq(grants.o_done_hit),
            pages.i_chk_line.eq(chk.o_line), pages.i_flip_page.eq(flip.o_page),
            chk.i_snap.eq(pages.o_chk_wait), chk.i_cleared.eq(grants.o_done_hit),
            flip.i_page_tracked.eq(pages.o_flip_wait), flip.i_cleared.eq(grants.o_done_hit),
            flip.i_claims_back.eq(ans.o_claims_back),
            flip.i_claim_denied.eq(ans.o_claim_denied),
            # A check of the page a flip is claiming spoils that page's flip.
            flip.i_touch.eq(chk.o_active & flip.o_claiming & (chk.o_page == flip.o_page)),
            flip.i_start.eq(self.i_flip_start), flip.i_cmd.eq(self.i_flip),
            self.o_flip.eq(flip.o_status),
        ]
        m.d.sync += [
            waiting.eq((waiting & ~(ans.o_permitted | ans.o_denied)) | alloc.o_wait),
            claiming.eq((claiming & ~ans.o_claims_done) | alloc.o_claim),
        ]
        freed = Signal(3)
        m.d.comb += freed.eq(ans.o_claims_back + grants.o_freed)
        m.d.sync += self.o_inflight.eq(self.o_inflight + alloc.o_info_en - freed)

        # --- errors: each kind's flag and details -----------------------------------------
        done = self.i_done
        _raise_errors(m, log, {
            DcohError.FWD_NOT_IN_FLIGHT: (ans.o_err.fwd_not_in_flight, ans.o_fwd_info),
            DcohError.FWD_OPCODE: (ans.o_err.fwd_opcode, ans.o_fwd_info),
            DcohError.FWD_ADDRESS: (ans.o_err.fwd_address, ans.o_fwd_info),
            DcohError.ACC_RANGE: (grants.o_range_error_left,
                                  (0, self.o_grant.p.tag, info_grant.data.host_line)),
            DcohError.DONE_UNEXPECTED: (grants.o_done_bad, (0, done.payload, 0)),
            DcohError.CHK_RANGE: (chk.o_err_range, (0, 0, chk.o_line)),
            DcohError.FLIP_RANGE: (flip.o_err_range, (0, 0, self.i_flip.first_page)),
            DcohError.FLIP_BUSY: (flip.o_err_busy, (0, 0, self.i_flip.first_page)),
            DcohError.FLIP_CONTENDED: (flip.o_err_contended, (0, 0, flip.o_page)),
            DcohError.HOST_ERROR: (ans.o_err.host_error, ans.o_host_error_info),
            DcohError.RSP_UNEXPECTED: (ans.o_err.rsp_unexpected, ans.o_unexpected_info),
        })
        m.d.comb += [
            log.i_clear.eq(self.i_err_clear),
            self.o_err_set.eq(log.o_set), self.o_err_status.eq(log.o_status),
            self.o_err_first.eq(log.o_first),
            self.o_busy.eq(~free.all() | alloc.o_busy | ans.o_busy | self.o_grant.valid |
                           self.o_d2h_req.valid | chk.o_busy | flip.o_busy |
                           table.o_sweeping),
        ]
        return m
