"""DCOH of the Type-2 device for its own memory (HDM-D): the per-page bias table, the
gate through which device blocks access device memory, host-bias forwarding over
CXL.cache, bias flips and the check of host accesses.

See :class:`Dcoh` and ``docs/dcoh.md``.
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.csr.error_log import ErrorLog
from hw.cxl.bias_flip import FLIP_STATUS, BiasFlip, flip_layout
from hw.cxl.cache_agent import TAG_BITS
from hw.cxl.dcoh_answers import ANSWER_INFO, DcohAnswers
from hw.cxl.host_check import HostCheck
from hw.cxl.messages import D2HReq, D2HReqOpcode, H2DData, H2DRsp, M2SReq
from hw.widths import is_int as _is_int
from hw.widths import is_pow2 as _is_pow2
from hw.widths import lowest_set, lt_const, named, onehot
from hw.widths import select_bit as _bit

__all__ = ["DcohRef"]

#: Width of a line address, device (offset in the HDM) or host (Addr[51:6]).
LINE_BITS = 46

#: Width of a CQID (CXL 2.0 §3.2.3; ``docs/cxl-encodings.md``).
_CQID_BITS = 12

#: Bytes per line: a page holds ``page_bytes // 64`` lines.
_LINE_BYTES = 64

#: A device access asking for permission: ``line`` is the device line address (the line's
#: offset from the start of device memory, in lines), ``write`` the access kind, ``tag``
#: the user's, returned with the grant.
ACC_REQ = data.StructLayout({"line": LINE_BITS, "write": 1, "tag": TAG_BITS})

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


def grant_layout(handle_bits: int) -> data.StructLayout:
    """``o_grant`` payload for handles of ``handle_bits`` bits: ``tag``, ``handle``,
    ``error``, ``host_bias``, ``denied`` (shared with the users' grant inputs).
    ``denied`` (always with ``error``): the host refused the line (GO-Err), so the access
    must not touch memory; ``error`` without ``denied``: the line is beyond device
    memory."""
    return data.StructLayout({"tag": TAG_BITS, "handle": handle_bits, "error": 1,
                              "host_bias": 1, "denied": 1})


#: Entry info, written when a CQID / handle is allocated.
_INFO = data.StructLayout({"host_line": LINE_BITS, "tag": TAG_BITS, "claim": 1,
                           "host_bias": 1, "error": 1})




class DcohRef(wiring.Component):
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
    i_host_chk : ``In(stream.Signature(46))``
        Device line address of a host access.
    o_host_chk : ``Out(stream.Signature(CHK_RSP))``
        Check answers, in check order.
    hdm_base : ``In(46)``
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
        if not _is_pow2(page_bytes) or not _LINE_BYTES <= page_bytes <= 1 << 21:
            raise ValueError(f"page_bytes must be a power of two from {_LINE_BYTES} to "
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
            "i_host_chk": In(stream.Signature(LINE_BITS)),
            "o_host_chk": Out(stream.Signature(CHK_RSP)),
            "hdm_base": In(LINE_BITS),
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
        return self._page_bytes // _LINE_BYTES

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
        k = n.bit_length() - 1                          # handle / entry index bits
        shift = self.lines_per_page.bit_length() - 1    # log2(lines per page)
        pb = self._flip_layout["first_page"].width     # page number bits
        depth = max(self._pages, 2)     # a depth-1 memory would have a zero-width address
        total_lines = self._pages << shift

        def page_of(line):
            return line[shift:shift + pb]

        # --- the parts: answers from the host, host checks, flip command, error log -------
        m.submodules.answers = ans = DcohAnswers(cqids=n, cqid_base=self._cqid_base)
        m.submodules.check = chk = HostCheck(
            total_lines=total_lines, lines_per_page=self.lines_per_page, page_bits=pb,
            entries=n, chk_layout=CHK_RSP, line_bits=LINE_BITS)
        m.submodules.flip = flip = BiasFlip(pages=self._pages,
                                            lines_per_page=self.lines_per_page, entries=n)
        m.submodules.errors = log = ErrorLog(kinds=DcohError.COUNT, info=ANSWER_INFO)
        for port in ("i_fwd", "i_h2d_rsp", "i_h2d_data"):
            wiring.connect(m, wiring.flipped(getattr(self, port)), getattr(ans, port))
        wiring.connect(m, wiring.flipped(self.i_host_chk), chk.i_chk)
        wiring.connect(m, chk.o_chk, wiring.flipped(self.o_host_chk))
        m.d.comb += [
            flip.i_start.eq(self.i_flip_start), flip.i_cmd.eq(self.i_flip),
            self.o_flip.eq(flip.o_status),
            log.i_clear.eq(self.i_err_clear), self.o_err_set.eq(log.o_set),
            self.o_err_status.eq(log.o_status), self.o_err_first.eq(log.o_first),
        ]

        # --- bias table ------------------------------------------------------------------
        m.submodules.bias = bias = Memory(shape=1, depth=depth, init=[])
        bias_wr = bias.write_port()
        # Transparent: a decision taken in cycle d uses the value read in d - 1, which
        # includes a write in d - 1. The race arguments in docs/dcoh.md rely on it.
        bias_acc = bias.read_port(transparent_for=(bias_wr,))
        bias_chk = bias.read_port(transparent_for=(bias_wr,))
        bias_flip = bias.read_port(transparent_for=(bias_wr,))
        clearing = Signal(init=1)       # reset sweep: write host bias everywhere
        clr_addr = Signal(range(depth))
        m.d.comb += [
            bias_chk.addr.eq(chk.o_bias_addr), bias_chk.en.eq(chk.o_bias_en),
            chk.i_bias_dev.eq(bias_chk.data[0]), chk.i_sweeping.eq(clearing),
            bias_flip.addr.eq(flip.o_page), flip.i_bias_dev.eq(bias_flip.data[0]),
            flip.i_sweeping.eq(clearing),
        ]
        # Writes: the reset sweep, then the check, then the flip.
        with m.If(clearing):
            m.d.comb += [bias_wr.en.eq(1), bias_wr.addr.eq(clr_addr), bias_wr.data.eq(0)]
            m.d.sync += clr_addr.eq(clr_addr + 1)
            with m.If(clr_addr == depth - 1):
                m.d.sync += clearing.eq(0)
        with m.Elif(chk.o_wr_req):
            m.d.comb += [bias_wr.en.eq(1), bias_wr.addr.eq(chk.o_page), bias_wr.data.eq(0),
                         chk.i_wr_go.eq(1)]
        with m.Elif(flip.o_wr_req):
            m.d.comb += [bias_wr.en.eq(1), bias_wr.addr.eq(flip.o_page),
                         bias_wr.data.eq(flip.o_wr_val), flip.i_wr_go.eq(1)]

        # --- entries: CQIDs and grant handles ---------------------------------------------
        s_wait = Signal(n)      # access sent to the host, waiting for its forward
        s_claim = Signal(n)     # RdOwnNoData of a flip, waiting for its answer
        s_ready = Signal(n)     # permitted, grant waiting to be picked
        s_out = Signal(n)       # permitted, grant in the output register
        s_granted = Signal(n)   # grant delivered, done expected
        s_errg = Signal(n)      # error grant waiting to be picked
        s_eout = Signal(n)      # error grant in the output register
        e_page = [Signal(pb, name=f"e_page{i}") for i in range(n)]
        # Line within the page, and "permitted by a forward" (host bias): a host check
        # waits for such an access only when it is to the same line (see "Host check").
        lo_bits = max(1, shift)
        e_lo = [Signal(lo_bits, name=f"e_lo{i}") for i in range(n)]
        e_fwd = Signal(n)
        e_write = Signal(n)     # the access is a write (RdOwn)
        e_denied = Signal(n)    # the host answered GO-Err: the grant is ``denied``
        m.submodules.info = info_mem = Memory(shape=_INFO, depth=n, init=[])
        info_wr = info_mem.write_port()
        # The forward check reads an entry in the cycle its forward is taken; an entry
        # allocated in that very cycle must be seen with its new contents.
        info_f = info_mem.read_port(transparent_for=(info_wr,))
        # The grant reads an entry at least one cycle after it was written.
        info_g = info_mem.read_port(transparent_for=())
        free = Signal(n)
        tracked = Signal(n)     # permitted and not done: what the drains wait for
        m.d.comb += [
            free.eq(~(s_wait | s_claim | s_ready | s_out | s_granted | s_errg | s_eout)),
            tracked.eq(s_ready | s_out | s_granted),
            ans.i_wait.eq(s_wait), ans.i_claim.eq(s_claim), ans.i_write.eq(e_write),
            info_f.addr.eq(ans.o_info_addr), ans.i_info_line.eq(info_f.data.host_line),
        ]
        have_free = Signal()
        alloc_idx = Signal(k)           # the lowest free entry
        free_any, free_idx = lowest_set(m, free, "free")
        m.d.comb += [have_free.eq(free_any), alloc_idx.eq(free_idx)]
        alloc_oh = onehot(m, alloc_idx, n, "alloc_oh")

        def page_match(page, name: str) -> Signal:
            match = Signal(n, name=name)
            m.d.comb += match.eq(Cat(*(e == page for e in e_page)))
            return match

        # Per-cycle state changes, applied together at the end.
        set_wait, set_claim, set_ready, set_errg = Signal(n), Signal(n), Signal(n), Signal(n)
        clr_granted = Signal(n)
        picked_ok, picked_err = Signal(n), Signal(n)        # entries picked for o_grant
        delivered_ok, delivered_err = Signal(n), Signal(n)  # grants transferred
        clr_wait = named(m, ans.o_permitted | ans.o_denied, "clr_wait")

        # --- stage B: the access's bias decision --------------------------------------------
        acc = self.i_acc
        ogr = self.o_grant
        req = self.o_d2h_req
        b_valid = Signal()
        b = Signal(ACC_REQ)
        b_go = Signal()
        b_page = page_of(b.line)
        b_in = named(m, b.line < total_lines, "b_in")
        b_dev = bias_acc.data[0]
        m.d.comb += [
            acc.ready.eq(~clearing & (~b_valid | b_go)),
            # A stalled decision re-reads its page, so it never acts on a stale bias.
            bias_acc.addr.eq(Mux(b_valid & ~b_go, b_page, page_of(acc.p.line))),
        ]
        with m.If(acc.ready):
            m.d.sync += b_valid.eq(acc.valid)
            with m.If(acc.valid):
                m.d.sync += b.eq(acc.payload)

        # Every access takes an entry, even one granted with error, so that no decision
        # waits for the grant output: the grant picker delivers them.
        b_err_acc = b_valid & ~b_in
        b_dev_acc = b_valid & b_in & b_dev
        b_host_acc = b_valid & b_in & ~b_dev
        req_free = ~req.valid | req.ready
        b_res = Signal()
        m.d.comb += b_res.eq(b_valid & have_free & (~b_host_acc | req_free))

        # Claims of the flip compete with stage B for the allocator and the D2H register.
        c_res = Signal()
        c_go = Signal()
        m.d.comb += c_res.eq(flip.o_claim_want & have_free & req_free)

        prefer_claim = Signal()         # round robin between accesses and claims
        m.d.comb += [
            b_go.eq(b_res & ~(c_res & prefer_claim)),
            c_go.eq(c_res & ~b_go),
            flip.i_claim_go.eq(c_go),
        ]
        alloc_any = named(m, b_go | c_go, "alloc_any")
        with m.If(c_go):
            m.d.sync += prefer_claim.eq(0)
        with m.Elif(b_go):
            m.d.sync += prefer_claim.eq(1)

        # Allocation (one per cycle) and the D2H Req register.
        c_dev_line = flip.o_claim_line              # the line being claimed
        b_host_line = Signal(LINE_BITS)
        c_host_line = Signal(LINE_BITS)
        cqid = Const(self._cqid_base, _CQID_BITS) | alloc_idx
        m.d.comb += [
            b_host_line.eq(self.hdm_base + b.line),
            c_host_line.eq(self.hdm_base + c_dev_line),
            info_wr.en.eq(alloc_any),
            info_wr.addr.eq(alloc_idx),
            # An error grant keeps the requested (device) line for the error record.
            info_wr.data.host_line.eq(Mux(c_go, c_host_line,
                                          Mux(b_err_acc, b.line, b_host_line))),
            info_wr.data.tag.eq(b.tag),
            info_wr.data.claim.eq(c_go),
            info_wr.data.host_bias.eq(b_host_acc & ~c_go),
            info_wr.data.error.eq(b_err_acc & ~c_go),
            set_wait.eq(Mux(b_go & b_host_acc, alloc_oh, 0)),
            set_claim.eq(Mux(c_go, alloc_oh, 0)),
            set_errg.eq(Mux(b_go & b_err_acc, alloc_oh, 0) | ans.o_denied),
        ]
        new_page = named(m, Mux(c_go, flip.o_page, b_page), "new_page")
        for i, e in enumerate(e_page):
            with m.If(alloc_any & alloc_oh[i]):
                m.d.sync += [e.eq(new_page), e_write[i].eq(b.write & ~c_go)]
                if shift:
                    m.d.sync += e_lo[i].eq(b.line[:shift])
        rd_op = self._read_opcode.value
        with m.If(b_go & b_host_acc):
            m.d.sync += [
                req.valid.eq(1),
                req.p.opcode.eq(Mux(b.write, D2HReqOpcode.RdOwn.value, rd_op)),
                req.p.cqid.eq(cqid),
                req.p.address.eq(b_host_line),
            ]
        with m.Elif(c_go):
            m.d.sync += [
                req.valid.eq(1),
                req.p.opcode.eq(D2HReqOpcode.RdOwnNoData.value),
                req.p.cqid.eq(cqid),
                req.p.address.eq(c_host_line),
            ]
        with m.Elif(req.ready):
            m.d.sync += req.valid.eq(0)

        # --- grants: a round-robin pick among the entries waiting, into o_grant ---------
        m.d.comb += set_ready.eq(Mux(b_go & b_dev_acc, alloc_oh, 0) | ans.o_permitted)
        cand = named(m, s_ready | s_errg, "cand")
        g_ptr = Signal(k)               # the entry after the last one picked
        g_idx = Signal(k)               # the entry whose grant is in o_grant
        # lt_const folds the last bit's comparison, constant for a log2(n)-bit g_ptr
        # (Verilator's CMPCONST otherwise).
        above = named(m, Cat(*(lt_const(g_ptr, i + 1) for i in range(n))), "above")
        pick_any, pick_wide = lowest_set(m, Cat(cand & above, cand), "pick")
        pick_idx = pick_wide[:k]
        pick_oh = onehot(m, pick_idx, n, "pick_oh")
        g_load = ~ogr.valid | ogr.ready
        g_denied = named(m, _bit(m, e_denied, g_idx, "grant_den"), "grant_denied")
        pick = g_load & pick_any
        m.d.comb += [
            info_g.addr.eq(pick_idx),
            info_g.en.eq(g_load),
            # The payload is the read port's data, which holds while ``en`` is low.
            ogr.p.tag.eq(info_g.data.tag),
            ogr.p.error.eq(info_g.data.error | g_denied),
            ogr.p.host_bias.eq(info_g.data.host_bias),
            ogr.p.denied.eq(g_denied),
            ogr.p.handle.eq(g_idx),
            picked_ok.eq(Mux(pick, pick_oh & s_ready, 0)),
            picked_err.eq(Mux(pick, pick_oh & s_errg, 0)),
        ]
        with m.If(g_load):
            m.d.sync += ogr.valid.eq(pick_any)
        with m.If(pick):
            m.d.sync += [g_idx.eq(pick_idx), g_ptr.eq(pick_idx + 1)]
        g_oh = onehot(m, g_idx, n, "grant_oh")
        g_hs = ogr.valid & ogr.ready
        m.d.comb += [
            delivered_ok.eq(Mux(g_hs, g_oh & s_out, 0)),
            delivered_err.eq(Mux(g_hs, g_oh & s_eout, 0)),
        ]

        # --- dones --------------------------------------------------------------------------
        dn = self.i_done
        d_oh = onehot(m, dn.payload, n, "done_oh")
        d_hit = Signal()
        m.d.comb += [
            dn.ready.eq(1),
            d_hit.eq(dn.valid & _bit(m, s_granted, dn.payload, "done_granted")),
            clr_granted.eq(Mux(d_hit, d_oh, 0)),
        ]

        m.d.sync += [
            s_wait.eq((s_wait & ~clr_wait) | set_wait),
            e_fwd.eq((e_fwd & ~Mux(alloc_any, alloc_oh, 0)) | ans.o_permitted),
            e_denied.eq((e_denied & ~Mux(alloc_any, alloc_oh, 0)) | ans.o_denied),
            s_claim.eq((s_claim & ~ans.o_claims_done) | set_claim),
            s_ready.eq((s_ready & ~picked_ok) | set_ready),
            s_out.eq((s_out & ~delivered_ok) | picked_ok),
            s_granted.eq((s_granted & ~clr_granted) | delivered_ok),
            s_errg.eq((s_errg & ~picked_err) | set_errg),
            s_eout.eq((s_eout & ~delivered_err) | picked_err),
        ]
        used = self.o_inflight
        freed = Signal(3)
        m.d.comb += freed.eq(ans.o_claims_back + d_hit + delivered_err.any())
        m.d.sync += used.eq(used + alloc_any - freed)

        # --- what the check and the flip wait for -------------------------------------------
        # A check waits for the accesses to its page permitted before it (without this
        # cycle's done: its entry leaves ``tracked`` only at the next edge), where an
        # access permitted by its forward (host bias) counts only for its own line: the
        # host ordered it with its forward, and waiting for it on other lines would
        # deadlock a user that holds a granted line until another line of the same page
        # is granted after a write-back the check is holding.
        k_lo = chk.o_line[:shift] if shift else C(0, 1)
        same_line = Cat(*(lo == k_lo for lo in e_lo)) if shift else C((1 << n) - 1, n)
        m.d.comb += [
            chk.i_snap.eq(page_match(chk.o_page, "chk_match") & tracked & ~clr_granted
                          & (~e_fwd | same_line)),
            chk.i_cleared.eq(clr_granted),
            flip.i_page_tracked.eq(page_match(flip.o_page, "flip_match") & tracked
                                   & ~clr_granted),
            flip.i_cleared.eq(clr_granted),
            flip.i_claims_back.eq(ans.o_claims_back),
            flip.i_claim_denied.eq(ans.o_claim_denied),
            # A check of the page a flip is claiming spoils that page's flip.
            flip.i_touch.eq(chk.o_active & flip.o_claiming & (chk.o_page == flip.o_page)),
        ]

        # --- errors ---------------------------------------------------------------------------
        # One signal per kind, joined by one assignment: a bit assigned on its own becomes
        # a one-line ``always @*`` in the Verilog, which Icarus runs only once its inputs
        # change, so a kind never raised stayed X there.
        raised = {
            DcohError.FWD_NOT_IN_FLIGHT: (ans.o_err.fwd_not_in_flight, ans.o_fwd_info),
            DcohError.FWD_OPCODE: (ans.o_err.fwd_opcode, ans.o_fwd_info),
            DcohError.FWD_ADDRESS: (ans.o_err.fwd_address, ans.o_fwd_info),
            DcohError.ACC_RANGE: (delivered_err.any() & ~g_denied,
                                  (0, ogr.p.tag, info_g.data.host_line)),
            DcohError.DONE_UNEXPECTED: (dn.valid & ~d_hit, (0, dn.payload, 0)),
            DcohError.CHK_RANGE: (chk.o_err_range, (0, 0, chk.o_line)),
            DcohError.FLIP_RANGE: (flip.o_err_range, (0, 0, self.i_flip.first_page)),
            DcohError.FLIP_BUSY: (flip.o_err_busy, (0, 0, self.i_flip.first_page)),
            DcohError.FLIP_CONTENDED: (flip.o_err_contended, (0, 0, flip.o_page)),
            DcohError.HOST_ERROR: (ans.o_err.host_error, ans.o_host_error_info),
            DcohError.RSP_UNEXPECTED: (ans.o_err.rsp_unexpected, ans.o_unexpected_info),
        }
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
        m.d.comb += log.i_raise.eq(Cat(*kinds))

        m.d.comb += self.o_busy.eq(~free.all() | b_valid | ans.o_busy | ogr.valid | req.valid |
                                   chk.o_busy | flip.o_busy | clearing)
        return m
