"""CXL message layouts: every field width and encoding from the CXL specification
(``docs/cxl-encodings.md``), and
pack/unpack round trips in Python (fast tier)."""

from __future__ import annotations

import random

import pytest

from hw.cxl import messages as msg

# Field widths as the CXL 2.0 68B flit states them (Valid excluded: it is the stream's valid).
REFERENCE_FIELDS = {
    "m2s_req": {"opcode": 4, "snp_type": 3, "meta_field": 2, "meta_value": 2, "tag": 16,
                "address": 47, "tc": 2, "ld_id": 4, "rsvd": 6},
    "m2s_rwd": {"opcode": 4, "snp_type": 3, "meta_field": 2, "meta_value": 2, "tag": 16,
                "address": 46, "poison": 1, "tc": 2, "ld_id": 4, "rsvd": 6,
                "data": 512, "byte_enable": 64},
    "s2m_ndr": {"opcode": 3, "meta_field": 2, "meta_value": 2, "tag": 16, "ld_id": 4,
                "dev_load": 2},
    "s2m_drs": {"opcode": 3, "meta_field": 2, "meta_value": 2, "tag": 16, "poison": 1,
                "ld_id": 4, "dev_load": 2, "rsvd": 9, "data": 512},
    "d2h_req": {"opcode": 5, "cqid": 12, "nt": 1, "rsvd0": 7, "address": 46, "rsvd1": 7},
    "d2h_rsp": {"opcode": 5, "uqid": 12, "rsvd": 2},
    "d2h_data": {"uqid": 12, "chunk_valid": 1, "bogus": 1, "poison": 1, "rsvd": 1, "data": 512},
    "h2d_req": {"opcode": 3, "address": 46, "uqid": 12, "rsvd": 2},
    "h2d_rsp": {"opcode": 4, "rsp_data": 12, "rsp_pre": 2, "cqid": 12, "rsvd": 1},
    "h2d_data": {"cqid": 12, "chunk_valid": 1, "poison": 1, "go_err": 1, "rsvd": 8, "data": 512},
}

# Encodings from the CXL specification (``docs/cxl-encodings.md``).
REFERENCE_ENCODINGS = {
    msg.M2SReqOpcode: {"MemInv": 0b0000, "MemRd": 0b0001, "MemRdData": 0b0010,
                       "MemRdFwd": 0b0011, "MemWrFwd": 0b0100, "MemSpecRd": 0b1000,
                       "MemInvNT": 0b1001, "MemClnEvct": 0b1010},
    msg.M2SRwDOpcode: {"MemWr": 0b0001, "MemWrPtl": 0b0010, "BIConflict": 0b0100},
    msg.SnpType: {"NoOp": 0, "SnpData": 1, "SnpCur": 2, "SnpInv": 3},
    msg.MetaField: {"Meta0State": 0b00, "NoOp": 0b11},
    msg.MetaValue: {"Invalid": 0b00, "Any": 0b10, "Shared": 0b11},
    msg.NDROpcode: {"Cmp": 0, "CmpS": 1, "CmpE": 2, "BIConflictAck": 4},
    msg.DRSOpcode: {"MemData": 0, "MemDataNXM": 1},
    msg.DevLoad: {"Light": 0, "Optimal": 1, "ModerateOverload": 2, "SevereOverload": 3},
    msg.D2HReqOpcode: {"RdCurr": 1, "RdOwn": 2, "RdShared": 3, "RdAny": 4, "RdOwnNoData": 5,
                       "ItoMWr": 6, "WrCur": 7, "CLFlush": 8, "CleanEvict": 9,
                       "DirtyEvict": 10, "CleanEvictNoData": 11, "WOWrInv": 12,
                       "WOWrInvF": 13, "WrInv": 14, "CacheFlushed": 16},
    msg.D2HRspOpcode: {"RspSHitSE": 1, "RspIHitI": 4, "RspIHitSE": 5, "RspVHitV": 6,
                       "RspSFwdM": 7, "RspIFwdM": 15, "RspVFwdV": 22},
    msg.H2DReqOpcode: {"SnpData": 1, "SnpInv": 2, "SnpCur": 3},
    msg.H2DRspOpcode: {"WritePull": 1, "GO": 4, "GO_WritePull": 5, "ExtCmp": 6,
                       "GO_WritePull_Drop": 8, "Fast_GO": 12, "Fast_GO_WritePull": 13,
                       "GO_ERR_WritePull": 15},
    msg.GoState: {"I": 0b0011, "S": 0b0001, "E": 0b0010, "M": 0b0110, "Error": 0b0100},
    msg.RspPre: {"LocalMiss": 0, "Hit": 1, "RemoteMiss": 2},
}


@pytest.mark.parametrize("channel", sorted(REFERENCE_FIELDS))
def test_field_widths_match_reference(channel):
    layout = msg.CHANNELS[channel]
    widths = {name: field.width for name, field in layout}
    assert widths == REFERENCE_FIELDS[channel]
    header = sum(w for n, w in widths.items() if n not in ("data", "byte_enable"))
    assert header + 1 == msg.REFERENCE_BITS[channel]  # + Valid


def test_fields_are_packed_lsb_first_in_reference_order():
    offsets = [field.offset for _, field in msg.M2SReq]
    assert offsets == sorted(offsets) and offsets[0] == 0


@pytest.mark.parametrize("enum", list(REFERENCE_ENCODINGS), ids=lambda e: e.__name__)
def test_encodings_match_reference(enum):
    assert {m.name: m.value for m in enum} == REFERENCE_ENCODINGS[enum]


@pytest.mark.parametrize("channel", sorted(REFERENCE_FIELDS))
def test_codec_round_trip_matches_amaranth(channel):
    layout = msg.CHANNELS[channel]
    codec = msg.Codec(layout)
    rng = random.Random(1)
    for _ in range(50):
        values = {name: rng.getrandbits(field.width) for name, field in layout}
        word = codec.pack(**values)
        assert word == layout.const(values).as_bits()
        assert codec.unpack(word) == values
        assert all(codec.get(word, n) == v for n, v in values.items())


def test_codec_rejects_bad_fields():
    codec = msg.Codec(msg.S2MNDR)
    with pytest.raises(ValueError, match="value 0x8 does not fit field 'opcode' \\(3 bits\\)"):
        codec.pack(opcode=8)
    with pytest.raises(ValueError, match="'bogus' is not a field of this layout"):
        codec.pack(bogus=1)
