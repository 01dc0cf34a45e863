"""CXL.cache agent of the Type-2 device: device-initiated reads and writes of host (GPU)
memory, and snoop answers for a device that caches nothing.

See :class:`CacheAgent` and ``docs/cxl-cache.md``.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..csr.error_log import ErrorLog
from ..widths import is_pow2 as _is_pow2
from .cache_layouts import (
    ERR_DETAILS,
    ERR_INFO,
    ERR_REPORT,
    RD_REQ,
    RD_RSP,
    TAG_BITS,
    WR_REQ,
    WR_RSP,
    CacheError,
)
from .cache_read_path import CacheReadPath
from .cache_write_path import CacheWritePath
from .d2h_req_arbiter import D2HReqArbiter
from .messages import D2HData, D2HReq, D2HRsp, H2DData, H2DReq, H2DRsp
from .snoop_responder import SnoopResponder

__all__ = [
    "ERR_INFO",
    "RD_REQ",
    "RD_RSP",
    "TAG_BITS",
    "WR_REQ",
    "WR_RSP",
    "CacheAgent",
    "CacheError",
]


class CacheAgent(wiring.Component):
    """Device side of CXL.cache for a device that caches no host line: RdCurr reads and
    ItoMWr writes of host memory with many requests in flight, and RspIHitI for every
    snoop.

    **Reads.** Each ``i_rd`` request (line address, tag) becomes a D2H Req RdCurr whose
    CQID is the next entry of a ring of ``cqids`` entries, the reorder buffer (ROB): CQID
    ``k`` in ``0 .. cqids - 1`` is ROB entry ``k``, so the ROB is also the read CQID pool
    and a CQID is free again once its line has left on ``o_rd``. H2D Data for the CQID
    is written into the entry (a :class:`~amaranth.lib.memory.Memory` of ``cqids``
    lines) and completes the read: RdCurr gets its data and no GO (CXL 1.1
    §3.2.4.1.6, CXL 3.x §3.2.4.2.6), so any H2D Rsp naming a read CQID is
    ``RSP_UNEXPECTED``. Lines leave on ``o_rd`` strictly in request order with the
    request's tag; ``error`` is set when the data had Poison or GO-Err set (a host
    reports a failed RdCurr by GO-Err in the H2D Data header, with all-ones data).
    RdCurr was chosen because it reads the current value without changing any cache
    state and needs no snoop tracking in the device (``docs/cxl-cache.md``).

    **Writes.** Each ``i_wr`` request (line address, 64 bytes, tag) becomes an ItoMWr
    (a full-line write that needs no data from the host and leaves no copy in the
    device) with a CQID from a second ring, ``cqids .. cqids + write_cqids - 1``; the
    line waits in a buffer of ``write_cqids`` lines. GO_WritePull, or WritePull followed
    by GO, makes the agent send the line on D2H Data with UQID = the H2D Rsp's RspData
    (the host names the data buffer it pulls into there; ``docs/cxl-cache.md`` gives
    this reading of the CXL 2.0 specification). GO_ERR_WritePull is pulled the same way but
    completes with ``error``; GO_WritePull_Drop sends nothing and completes with
    ``error`` (the line was not written). A write completes on ``o_wr`` once its GO has
    arrived and its data has been sent, in request order.

    **Snoops.** Every H2D Req, whatever its opcode, is answered by a D2H Rsp RspIHitI
    with the snoop's UQID, one per cycle.

    **Parts.** :class:`~hw.cxl.cache_read_path.CacheReadPath` (``i_rd`` to RdCurr, H2D
    Data through the ROB to ``o_rd``), :class:`~hw.cxl.cache_write_path.CacheWritePath`
    (``i_wr`` to ItoMWr, H2D Rsp, pulled lines out of its
    :class:`~hw.cxl.write_data_sender.WriteDataSender` on D2H Data, completions to
    ``o_wr``), :class:`~hw.cxl.d2h_req_arbiter.D2HReqArbiter` (the two request streams
    onto D2H Req), :class:`~hw.cxl.snoop_responder.SnoopResponder` and an
    :class:`~hw.csr.error_log.ErrorLog` fed by each part's error report.

    **Bad input** never stalls the agent and never moves a line to another request: an
    H2D Rsp or H2D Data that no request in flight can take is dropped and flagged (the
    :class:`CacheError` kinds). A request the host never answers is never completed;
    since completion is in order, it holds every later one of its ring (no timeout).

    **Latency** (idle agent, sinks ready): ``i_rd`` / ``i_wr`` handshake in cycle 0,
    D2H Req valid in cycle 1. A read's H2D Data, taken in cycle ``t``, puts the line on
    ``o_rd`` in cycle ``t + 3``; a write's pull taken in cycle
    ``t`` puts its D2H Data valid in cycle ``t + 4``; with that line's handshake in
    cycle ``d`` and the GO taken in cycle ``g``, the completion is valid on ``o_wr`` in
    cycle ``max(d + 2, g + 3)``. An H2D Req taken in cycle ``t`` is answered in cycle
    ``t + 1``.

    **Throughput.** One D2H Req per cycle (reads and writes round-robin), one ``o_rd``
    line and one ``o_wr`` completion per cycle, one snoop answer per cycle. A read holds
    its CQID from its ``i_rd`` handshake until its line leaves the ROB head, about
    ``L + 4`` cycles for a host latency ``L`` (D2H Req handshake to its H2D Data),
    so a stream of reads sustains ``min(1, cqids / (L + 4))`` lines per cycle
    (Little's law); ``cqids = 128`` keeps a host latency of 100 cycles at about one line
    per cycle. Writes likewise reach ``write_cqids / (their round trip)``.

    **Backpressure.** ``i_h2d_rsp`` and ``i_h2d_data`` are always ready (CXL lets H2D
    Rsp and Data wait only for link credits; no state of the agent can block them).
    ``i_rd.ready`` / ``i_wr.ready`` are low while the ring is full or the D2H Req
    register is full and not being taken (so they depend combinationally on
    ``o_d2h_req.ready``); ``i_h2d_req.ready`` is ``~o_d2h_rsp.valid | o_d2h_rsp.ready``.
    Every output stream is a register (the line and tag of ``o_rd``, ``o_wr`` and
    ``o_d2h_data`` are the read registers of their memories) that obeys the stream
    rules: valid does not wait for ready, valid and payload hold until the transfer.

    **Ordering.** ``o_rd`` follows ``i_rd`` order and ``o_wr`` follows ``i_wr`` order;
    reads and writes are not ordered with each other. A read requested after a write's
    ``o_wr`` completion returns that write's line or a later one (the write's data
    reached the host before the completion); a read requested while a write of its line
    is in flight may return the old or the new line.

    **Reset** (synchronous ``rst``) frees every CQID and drops every request, line and
    error record in flight; the host side must be reset with the agent.

    Parameters
    ----------
    cqids : int
        Read CQIDs and ROB lines, a power of two from 2 to 2048 (default 128).
    write_cqids : int
        Write CQIDs and write-buffer lines, a power of two from 2 to ``cqids``
        (default 16).

    Members
    -------
    i_rd : ``In(stream.Signature(RD_REQ))``
        Read requests.
    o_rd : ``Out(stream.Signature(RD_RSP))``
        Lines read, in ``i_rd`` order.
    i_wr : ``In(stream.Signature(WR_REQ))``
        Write requests.
    o_wr : ``Out(stream.Signature(WR_RSP))``
        Write completions, in ``i_wr`` order.
    o_d2h_req, o_d2h_rsp, o_d2h_data : ``Out(stream.Signature(D2HReq / D2HRsp / D2HData))``
        D2H channels (``hw.cxl.messages`` layouts). NT, ChunkValid, Bogus, Poison and
        every reserved field are zero.
    i_h2d_req, i_h2d_rsp, i_h2d_data : ``In(stream.Signature(H2DReq / H2DRsp / H2DData))``
        H2D channels.
    o_err_set : ``Out(CacheError.COUNT)``
        One-cycle pulse per error kind, registered: one cycle after the H2D message was
        processed (two after its handshake), the line was delivered or the snoop taken.
    o_err_status : ``Out(CacheError.COUNT)``
        Sticky ``o_err_set`` (rises with it); bits written in ``i_err_clear`` clear,
        a new error wins over a clear in the same cycle.
    i_err_clear : ``In(CacheError.COUNT)``
        Write-1-to-clear for ``o_err_status``.
    o_err_first : ``Out(ERR_INFO)``
        The first error since ``o_err_status`` was last all zero (the lowest kind when
        several come at once); meaningful while ``o_err_status`` is non-zero.
    o_rd_inflight, o_wr_inflight : ``Out(range(cqids + 1))``, ``Out(range(write_cqids + 1))``
        CQIDs of each ring in use.
    o_busy : ``Out(1)``
        A request, message or answer is anywhere in the agent.

    Raises
    ------
    ValueError
        If a parameter is out of its range or of the wrong type.
    """

    def __init__(self, *, cqids: int = 128, write_cqids: int = 16):
        if not _is_pow2(cqids) or not 2 <= cqids <= 2048:
            raise ValueError(f"cqids must be a power of two from 2 to 2048, not {cqids!r}")
        if not _is_pow2(write_cqids) or not 2 <= write_cqids <= cqids:
            raise ValueError(f"write_cqids must be a power of two from 2 to cqids ({cqids}), "
                             f"not {write_cqids!r}")
        self._cqids = cqids
        self._write_cqids = write_cqids
        super().__init__({
            "i_rd": In(stream.Signature(RD_REQ)),
            "o_rd": Out(stream.Signature(RD_RSP)),
            "i_wr": In(stream.Signature(WR_REQ)),
            "o_wr": Out(stream.Signature(WR_RSP)),
            "o_d2h_req": Out(stream.Signature(D2HReq)),
            "o_d2h_rsp": Out(stream.Signature(D2HRsp)),
            "o_d2h_data": Out(stream.Signature(D2HData)),
            "i_h2d_req": In(stream.Signature(H2DReq)),
            "i_h2d_rsp": In(stream.Signature(H2DRsp)),
            "i_h2d_data": In(stream.Signature(H2DData)),
            "o_err_set": Out(CacheError.COUNT),
            "o_err_status": Out(CacheError.COUNT),
            "i_err_clear": In(CacheError.COUNT),
            "o_err_first": Out(ERR_INFO),
            "o_rd_inflight": Out(range(cqids + 1)),
            "o_wr_inflight": Out(range(write_cqids + 1)),
            "o_busy": Out(1),
        })

    @property
    def cqids(self) -> int:
        return self._cqids

    @property
    def write_cqids(self) -> int:
        return self._write_cqids

    @property
    def write_cqid_base(self) -> int:
        """The first write CQID (write ``k`` of the ring uses ``write_cqid_base + k``)."""
        return self._cqids

    def elaborate(self, platform):
        m = Module()
        m.submodules.read = read = CacheReadPath(cqids=self._cqids)
        m.submodules.write = write = CacheWritePath(read_cqids=self._cqids,
                                                    write_cqids=self._write_cqids)
        m.submodules.requests = requests = D2HReqArbiter()
        m.submodules.snoops = snoops = SnoopResponder()
        wiring.connect(m, wiring.flipped(self.i_rd), read.i_req)
        wiring.connect(m, read.o_req, requests.i_rd)
        wiring.connect(m, wiring.flipped(self.i_h2d_data), read.i_data)
        wiring.connect(m, read.o_rsp, wiring.flipped(self.o_rd))
        wiring.connect(m, wiring.flipped(self.i_wr), write.i_req)
        wiring.connect(m, write.o_req, requests.i_wr)
        wiring.connect(m, wiring.flipped(self.i_h2d_rsp), write.i_rsp)
        wiring.connect(m, write.o_data, wiring.flipped(self.o_d2h_data))
        wiring.connect(m, write.o_rsp, wiring.flipped(self.o_wr))
        wiring.connect(m, requests.o_req, wiring.flipped(self.o_d2h_req))
        wiring.connect(m, wiring.flipped(self.i_h2d_req), snoops.i_snoop)
        wiring.connect(m, snoops.o_rsp, wiring.flipped(self.o_d2h_rsp))
        m.d.comb += [
            write.i_read_cqids_in_flight.eq(read.o_cqids_in_flight),
            self.o_rd_inflight.eq(read.o_inflight),
            self.o_wr_inflight.eq(write.o_inflight),
        ]

        # Each kind is raised by one part only, so the reports merge by OR.
        snoop_errors = Signal(ERR_REPORT)
        reserved = snoop_errors.info[CacheError.SNOOP_RESERVED]
        m.d.comb += [
            snoop_errors.raised[CacheError.SNOOP_RESERVED].eq(snoops.o_reserved),
            reserved.opcode.eq(self.i_h2d_req.p.opcode),
            reserved.id.eq(self.i_h2d_req.p.uqid),
        ]
        reports = [read.o_errors, write.o_errors, snoop_errors]
        m.submodules.errors = log = ErrorLog(kinds=CacheError.COUNT, info=ERR_DETAILS)
        m.d.comb += [
            log.i_raise.eq(reports[0].raised | reports[1].raised | reports[2].raised),
            log.i_info.eq(reports[0].info.as_value() | reports[1].info.as_value() |
                          reports[2].info.as_value()),
            log.i_clear.eq(self.i_err_clear),
            self.o_err_set.eq(log.o_set),
            self.o_err_status.eq(log.o_status),
            self.o_err_first.eq(log.o_first),
            self.o_busy.eq(read.o_busy | write.o_busy | requests.o_req.valid | snoops.o_busy),
        ]
        return m
