"""Fast tier: the CXL protocol table (``tb/cxl_protocol.py``) and its checker: legal
sequences pass, each kind of illegal sequence raises."""

from __future__ import annotations

import random

import pytest

from hw.cxl.messages import (
    D2HReqOpcode,
    D2HRspOpcode,
    DRSOpcode,
    GoState,
    H2DReqOpcode,
    H2DRspOpcode,
    M2SReqOpcode,
    M2SRwDOpcode,
    MetaField,
    MetaValue,
    NDROpcode,
)
from tb.cxl_protocol import ALL_ONES, TABLE, ProtocolChecker, ProtocolError, pick, row

GO, E, ERR = H2DRspOpcode.GO.value, GoState.E.value, GoState.Error.value
MEM_RD_FWD = M2SReqOpcode.MemRdFwd.value
DCOH_REQS = (D2HReqOpcode.RdCurr, D2HReqOpcode.RdShared, D2HReqOpcode.RdOwn,
             D2HReqOpcode.RdOwnNoData)


def _d2h(op: D2HReqOpcode, cqid: int = 0x801, line: int = 0x4000) -> dict:
    return {"opcode": op.value, "cqid": cqid, "address": line}


def _fwd(op: int = MEM_RD_FWD, cqid: int = 0x801, line: int = 0x4000) -> dict:
    return {"opcode": op, "tag": cqid, "address": line << 1}


def _mem_rd(tag: int = 7, mv: MetaValue = MetaValue.Shared,
            mf: MetaField = MetaField.Meta0State) -> dict:
    return {"opcode": M2SReqOpcode.MemRd.value, "tag": tag, "meta_field": mf.value,
            "meta_value": mv.value, "ld_id": 0}


def _ndr(op: NDROpcode, tag: int = 7) -> dict:
    return {"opcode": op.value, "tag": tag, "ld_id": 0}


def _drs(tag: int = 7, op: DRSOpcode = DRSOpcode.MemData, data: int = 5) -> dict:
    return {"opcode": op.value, "tag": tag, "ld_id": 0, "data": data}


def test_every_row_cites_the_specification():
    for r in TABLE.values():
        assert "CXL" in r.cite and ("Table" in r.cite or "§" in r.cite), r


def test_dcoh_requests_answered_by_mem_rd_fwd():
    """Every DCOH request allows MemRdFwd and GO-Err; no DCOH request allows MemWrFwd;
    RdOwnNoData also allows GO-E; only the reads allow H2D Data (with GO-Err)."""
    for op in DCOH_REQS:
        r = row("d2h_req", op.value, "device")
        names = {f.name for f in r.flows}
        assert {"mem_rd_fwd", "go_err"} <= names, (op, names)
        assert ("go_e" in names) == (op is D2HReqOpcode.RdOwnNoData)
        assert ("data_go_err" in names) == (op in (D2HReqOpcode.RdCurr, D2HReqOpcode.RdShared))
        opcodes = {o for f in r.flows for m in f.msgs if m.channel == "m2s_req"
                   for o in m.opcodes}
        assert opcodes == {MEM_RD_FWD}, op
    assert row("d2h_req", D2HReqOpcode.ItoMWr.value, "device") is None


def test_legal_dcoh_sequences_pass():
    c = ProtocolChecker()
    for i, op in enumerate(DCOH_REQS):
        c.request("d2h_req", _d2h(op, 0x800 + i, 0x100 + i), 1, target="device")
        c.see("m2s_req", _fwd(cqid=0x800 + i, line=0x100 + i), 5)
    c.request("d2h_req", _d2h(D2HReqOpcode.RdOwnNoData, 0x810), 6, target="device")
    c.see("h2d_rsp", {"opcode": GO, "rsp_data": E, "cqid": 0x810}, 9)
    c.request("d2h_req", _d2h(D2HReqOpcode.RdOwn, 0x811), 6, target="device")
    c.see("h2d_rsp", {"opcode": GO, "rsp_data": ERR, "cqid": 0x811}, 9)
    c.request("d2h_req", _d2h(D2HReqOpcode.RdCurr, 0x812), 6, target="device")
    c.see("h2d_data", {"cqid": 0x812, "go_err": 1, "poison": 0, "data": ALL_ONES}, 9)
    # A completed CQID may be reused.
    c.request("d2h_req", _d2h(D2HReqOpcode.RdCurr, 0x800), 10, target="device")
    c.see("m2s_req", _fwd(cqid=0x800), 12)
    c.finish()
    assert c.completed == {"mem_rd_fwd": 5, "go_e": 1, "go_err": 1, "data_go_err": 1}


@pytest.mark.parametrize("kind", ["mem_wr_fwd_for_rd_own", "wrong_address", "wrong_tag",
                                  "go_e_for_read", "go_s_for_claim", "data_for_rd_own",
                                  "data_without_go_err", "duplicate", "cqid_reused",
                                  "missing", "not_a_dcoh_request", "ito_m_wr_on_device"])
def test_illegal_dcoh_sequences_raise(kind):
    c = ProtocolChecker()
    if kind == "not_a_dcoh_request":
        with pytest.raises(ProtocolError, match="not a request of the table"):
            c.request("d2h_req", _d2h(D2HReqOpcode.CLFlush), 1, target="device")
        return
    if kind == "ito_m_wr_on_device":
        with pytest.raises(ProtocolError, match="not a request of the table"):
            c.request("d2h_req", _d2h(D2HReqOpcode.ItoMWr), 1, target="device")
        return
    op = {"mem_wr_fwd_for_rd_own": D2HReqOpcode.RdOwn, "data_for_rd_own": D2HReqOpcode.RdOwn,
          "go_s_for_claim": D2HReqOpcode.RdOwnNoData}.get(kind, D2HReqOpcode.RdCurr)
    c.request("d2h_req", _d2h(op), 1, target="device")
    msg = {"mem_wr_fwd_for_rd_own": ("m2s_req", _fwd(M2SReqOpcode.MemWrFwd.value)),
           "wrong_address": ("m2s_req", _fwd(line=0x4001)),
           "go_e_for_read": ("h2d_rsp", {"opcode": GO, "rsp_data": E, "cqid": 0x801}),
           "go_s_for_claim": ("h2d_rsp", {"opcode": GO, "rsp_data": GoState.S.value,
                                          "cqid": 0x801}),
           "data_for_rd_own": ("h2d_data", {"cqid": 0x801, "go_err": 1, "data": ALL_ONES}),
           "data_without_go_err": ("h2d_data", {"cqid": 0x801, "go_err": 0, "data": 3})}
    if kind in msg:
        with pytest.raises(ProtocolError, match="outside the table"):
            c.see(*msg[kind], 4)
    elif kind == "wrong_tag":
        with pytest.raises(ProtocolError, match="no open request"):
            c.see("m2s_req", _fwd(cqid=0x802), 4)
    elif kind == "duplicate":
        c.see("m2s_req", _fwd(), 4)
        with pytest.raises(ProtocolError, match=r"after RdCurr .* completed by mem_rd_fwd"):
            c.see("h2d_rsp", {"opcode": GO, "rsp_data": ERR, "cqid": 0x801}, 5)
    elif kind == "cqid_reused":
        with pytest.raises(ProtocolError, match="reuses cqid 0x801"):
            c.request("d2h_req", _d2h(D2HReqOpcode.RdOwn), 2, target="device")
    else:
        with pytest.raises(ProtocolError,
                           match=r"(?s)incomplete at the end.*waits for mem_rd_fwd: MemRdFwd"):
            c.finish()


def test_mem_read_flows():
    """MemRd: DRS and the NDR granting MetaValue's state, in either order; MemRd of no
    memory: MemData-NXM alone; writes: Cmp; MemSpecRd: nothing."""
    c = ProtocolChecker()
    for tag, (mv, mf, grant) in enumerate((
            (MetaValue.Shared, MetaField.Meta0State, NDROpcode.CmpS),
            (MetaValue.Any, MetaField.Meta0State, NDROpcode.CmpE),
            (MetaValue.Invalid, MetaField.Meta0State, NDROpcode.Cmp),
            (MetaValue.Any, MetaField.NoOp, NDROpcode.Cmp))):
        c.request("m2s_req", _mem_rd(tag, mv, mf), 1, target="hdm")
        if tag % 2:
            c.see("s2m_ndr", _ndr(grant, tag), 3)
            c.see("s2m_drs", _drs(tag), 4)
        else:
            c.see("s2m_drs", _drs(tag), 3)
            c.see("s2m_ndr", _ndr(grant, tag), 4)
    c.request("m2s_req", _mem_rd(9), 5, target="nxm")
    c.see("s2m_drs", _drs(9, DRSOpcode.MemDataNXM, ALL_ONES) | {"poison": 1}, 7)
    c.request("m2s_rwd", {"opcode": M2SRwDOpcode.MemWr.value, "tag": 10}, 5, target="hdm")
    c.see("s2m_ndr", _ndr(NDROpcode.Cmp, 10), 8)
    spec = c.request("m2s_req", {"opcode": M2SReqOpcode.MemSpecRd.value, "tag": 11}, 5,
                     target="hdm")
    assert spec.done
    c.finish()


@pytest.mark.parametrize("kind", ["wrong_grant", "ndr_for_nxm", "nxm_data", "second_drs",
                                  "wrong_ld_id", "response_to_spec_rd", "missing_ndr",
                                  "forward_as_request"])
def test_illegal_mem_sequences_raise(kind):
    c = ProtocolChecker()
    if kind == "forward_as_request":
        with pytest.raises(ProtocolError, match="not a request"):
            c.request("m2s_req", _fwd() | {"meta_field": 3}, 1, target="hdm")
        return
    if kind == "response_to_spec_rd":
        c.request("m2s_req", {"opcode": M2SReqOpcode.MemSpecRd.value, "tag": 7}, 1,
                  target="hdm")
        with pytest.raises(ProtocolError, match=r"no open request.*completed by none"):
            c.see("s2m_drs", _drs(), 3)
        return
    c.request("m2s_req", _mem_rd(), 1, target="nxm" if kind in ("ndr_for_nxm", "nxm_data")
              else "hdm")
    with pytest.raises(ProtocolError):
        if kind == "wrong_grant":
            c.see("s2m_ndr", _ndr(NDROpcode.CmpE), 3)
        elif kind == "ndr_for_nxm":
            c.see("s2m_ndr", _ndr(NDROpcode.Cmp), 3)
        elif kind == "nxm_data":
            c.see("s2m_drs", _drs(op=DRSOpcode.MemDataNXM, data=0), 3)
        elif kind == "second_drs":
            c.see("s2m_drs", _drs(), 3)
            c.see("s2m_drs", _drs(), 4)
        elif kind == "wrong_ld_id":
            c.see("s2m_drs", _drs() | {"ld_id": 2}, 3)
        else:
            c.see("s2m_drs", _drs(), 3)
            c.finish()


def test_agent_write_flows():
    """ItoMWr: GO_WritePull then D2H Data with the pull's UQID; WritePull, with the GO-I
    before or after the data; the error flows."""
    c = ProtocolChecker()
    ito = {"opcode": D2HReqOpcode.ItoMWr.value, "address": 0x10}
    c.request("d2h_req", ito | {"cqid": 1}, 0, target="host")
    c.see("h2d_rsp", {"opcode": H2DRspOpcode.GO_WritePull.value, "cqid": 1, "rsp_data": 33}, 3)
    c.see("d2h_data", {"uqid": 33}, 5)
    for cqid, go_first in ((2, True), (3, False)):
        c.request("d2h_req", ito | {"cqid": cqid}, 0, target="host")
        c.see("h2d_rsp", {"opcode": H2DRspOpcode.WritePull.value, "cqid": cqid,
                          "rsp_data": 40 + cqid}, 3)
        go = {"opcode": GO, "cqid": cqid, "rsp_data": GoState.I.value}
        if go_first:
            c.see("h2d_rsp", go, 4)
        c.see("d2h_data", {"uqid": 40 + cqid}, 5)
        if not go_first:
            c.see("h2d_rsp", go, 6)
    c.request("d2h_req", ito | {"cqid": 4}, 0, target="host")
    c.see("h2d_rsp", {"opcode": H2DRspOpcode.GO_WritePull_Drop.value, "cqid": 4,
                      "rsp_data": 9}, 3)
    c.request("d2h_req", {"opcode": D2HReqOpcode.RdCurr.value, "cqid": 5, "address": 1}, 0,
              target="host")
    c.see("h2d_data", {"cqid": 5, "go_err": 0, "poison": 0, "data": 77}, 3)
    c.request("h2d_req", {"opcode": H2DReqOpcode.SnpInv.value, "uqid": 60, "address": 1}, 0,
              target="host")
    c.see("d2h_rsp", {"opcode": D2HRspOpcode.RspIHitI.value, "uqid": 60}, 2)
    c.finish()
    assert c.completed == {"go_writepull": 1, "writepull_go": 2, "drop": 1, "data": 1,
                           "RspIHitI": 1}


@pytest.mark.parametrize("kind", ["data_before_pull", "wrong_uqid", "second_data",
                                  "go_for_rd_curr", "ext_cmp", "second_pull",
                                  "snoop_answer_not_allowed"])
def test_illegal_agent_sequences_raise(kind):
    c = ProtocolChecker()
    ito = {"opcode": D2HReqOpcode.ItoMWr.value, "address": 0x10, "cqid": 1}
    if kind == "snoop_answer_not_allowed":
        c.request("h2d_req", {"opcode": H2DReqOpcode.SnpInv.value, "uqid": 6}, 0, target="host")
        with pytest.raises(ProtocolError, match="outside the table"):
            c.see("d2h_rsp", {"opcode": D2HRspOpcode.RspSHitSE.value, "uqid": 6}, 2)
        return
    if kind == "go_for_rd_curr":
        c.request("d2h_req", ito | {"opcode": D2HReqOpcode.RdCurr.value}, 0, target="host")
        with pytest.raises(ProtocolError, match="no flow has a message on this channel"):
            c.see("h2d_rsp", {"opcode": GO, "cqid": 1, "rsp_data": GoState.I.value}, 3)
        return
    c.request("d2h_req", ito, 0, target="host")
    pull = {"opcode": H2DRspOpcode.WritePull.value, "cqid": 1, "rsp_data": 21}
    with pytest.raises(ProtocolError):
        if kind == "data_before_pull":
            c.see("d2h_data", {"uqid": 21}, 2)
        elif kind == "ext_cmp":
            c.see("h2d_rsp", {"opcode": H2DRspOpcode.ExtCmp.value, "cqid": 1}, 2)
        else:
            c.see("h2d_rsp", pull, 2)
            if kind == "wrong_uqid":
                c.see("d2h_data", {"uqid": 22}, 3)
            elif kind == "second_pull":
                c.see("h2d_rsp", pull, 3)
            else:
                c.see("d2h_data", {"uqid": 21}, 3)
                c.see("d2h_data", {"uqid": 21}, 4)


def test_pick_and_build():
    """pick chooses among the allowed flows (both answers of a claim over seeds), keeps
    to the channels asked for, and build makes messages the checker accepts."""
    claim = row("d2h_req", D2HReqOpcode.RdOwnNoData.value, "device")
    rng = random.Random(1)
    assert {pick(rng, claim).name for _ in range(40)} == {"mem_rd_fwd", "go_e"}
    assert {pick(rng, claim, channels=["m2s_req"]).name for _ in range(10)} == {"mem_rd_fwd"}
    assert pick(rng, claim, error=True).name == "go_err"
    with pytest.raises(ValueError, match="no error flow"):
        pick(rng, claim, error=True, channels=["m2s_req"])
    c = ProtocolChecker()
    for i, name in enumerate(("mem_rd_fwd", "go_e", "go_err")):
        txn = c.request("d2h_req", _d2h(D2HReqOpcode.RdOwnNoData, 0x900 + i, 0x50), 0,
                        target="device")
        (m,) = claim.flow(name).msgs
        c.see(m.channel, m.build(txn.values), 2)
    c.finish()


def test_dcoh_host_answers_from_the_table():
    """tb.dcoh_host.DcohHost answers from the table: MemRdFwd only by default; with
    ``h2d`` a random mix of MemRdFwd and GO-E for claims; an ``answer`` hook may pick
    any answer the table allows for the request (a disallowed one is refused); every
    answer is taken once and the host ends idle with every transaction complete."""
    from tb.dcoh_host import DcohHost, HostTiming

    ops = (D2HReqOpcode.RdCurr, D2HReqOpcode.RdOwn, D2HReqOpcode.RdOwnNoData)
    errors = {D2HReqOpcode.RdCurr.value: "data_err"}
    for h2d, answer, allowed in (
            (False, None, {"mem_rd_fwd"}),
            (True, None, {"mem_rd_fwd", "go_e"}),
            (False, lambda req: errors.get(req.opcode, "go_err"), {"go_err", "data_go_err"})):
        host = DcohHost(timing=HostTiming(latency=0), rng=random.Random(5), h2d=h2d,
                        answer=answer)
        for t in range(60):
            host.d2h(2 * t, _d2h(ops[t % 3], 0x800 + t, 0x100 + t))
            if host.offer(2 * t + 1) is not None:
                host.take(2 * t + 1)
            if host.offer_h2d(2 * t + 1) is not None:
                host.take_h2d(2 * t + 1)
        assert host.idle(), host.outstanding()
        host.protocol.finish()
        assert set(host.protocol.completed) == allowed, (h2d, host.protocol.completed)
        assert all(r.t_fwd is not None for r in host.reqs)
    host = DcohHost(answer=lambda req: "go_e")
    with pytest.raises(ValueError, match="answer 'go_e' not allowed"):
        host.d2h(0, _d2h(D2HReqOpcode.RdOwn))
