"""What the CXL.mem endpoint's parts share: error codes, payload layouts, the HDM decoder
and the DevLoad thresholds.

The endpoint (:class:`~hw.cxl.mem_endpoint.MemEndpoint`) is composed of
:class:`~hw.cxl.m2s_decoder.M2SDecoder`,
:class:`~hw.cxl.endpoint_admission.EndpointAdmission`,
:class:`~hw.cxl.slot_tracker.SlotTracker`,
:class:`~hw.cxl.ordering_table.OrderingTable` and
:class:`~hw.cxl.endpoint_completion.EndpointCompletion`; their streams carry the
layouts below. ``docs/mem-endpoint.md`` describes the whole.
"""

from __future__ import annotations

from functools import reduce

from amaranth.hdl import Module, Signal
from amaranth.lib import data

from ..config import LINE_BITS, DeviceConfig
from .messages import LINE_ADDR_BITS

__all__ = [
    "ECHOED",
    "IMM_FIFO_DEPTH",
    "LINE_SHIFT",
    "ErrorChannel",
    "ErrorInfo",
    "ImmEntry",
    "M2SError",
    "MemError",
    "PerfEvents",
    "PmemWBeat",
    "check_config",
    "dev_load_thresholds",
    "hdm_decode",
    "issue_layout",
    "ordering_event_layout",
    "pmem_b_layout",
    "pmem_r_layout",
    "pmem_request_layout",
    "request_layout",
    "xor_fold",
]


class MemError:
    """Bit positions of :attr:`MemEndpoint.o_err_set`, one per error kind."""
    HDM_RANGE = 0       # address outside the HDM window (or beyond PMEM)
    RSVD_OPCODE = 1     # reserved M2S Req or RwD opcode
    POISON = 2          # poisoned MemWr / MemWrPtl (dropped)
    EMPTY_PTL = 3       # MemWrPtl with no byte enabled
    UNEXPECTED_FWD = 4  # MemRdFwd / MemWrFwd with no CXL.cache request outstanding
    PMEM_RESP = 5       # RRESP / BRESP other than OKAY
    COUNT = 6


class ErrorChannel:
    """Values of ``ErrorInfo.channel``: where the reported error was seen."""
    M2S_REQ = 0
    M2S_RWD = 1
    PMEM_R = 2
    PMEM_B = 3


#: Details of the error(s) flagged in the same cycle on ``o_err_set``. ``address`` is the
#: host line address (Addr[51:6]) for the M2S channels, the device line address for PMEM.
ErrorInfo = data.StructLayout({"channel": 2, "opcode": 4, "address": LINE_ADDR_BITS})

#: An accepted M2S request's error bits (:class:`MemError`) and their details.
M2SError = data.StructLayout({"errors": MemError.COUNT, "info": ErrorInfo})

#: One-cycle event strobes for the performance counters of the CSR block.
PerfEvents = data.StructLayout({"read": 1, "write": 1, "busy": 1})

#: Entries of the immediate-response FIFO (responses that need no PMEM access).
IMM_FIFO_DEPTH = 4

#: Log2 of the line size in bytes: device byte address = device line address << 6.
LINE_SHIFT = (LINE_BITS // 8).bit_length() - 1

#: Request fields that every response to it echoes (the Tag is returned unchanged in NDR
#: and DRS; ``docs/cxl-encodings.md``).
ECHOED = ("tag", "ld_id", "meta_field", "meta_value")

_ECHO_LAYOUT = {"tag": 16, "ld_id": 4, "meta_field": 2, "meta_value": 2}

#: An immediate response: one that needs no PMEM access.
ImmEntry = data.StructLayout({
    "ndr_opcode": 3,    # NDROpcode
    "nxm": 1,           # DRS MemData-NXM instead of the NDR (out-of-range read)
    **_ECHO_LAYOUT,
})


def check_config(config) -> DeviceConfig:
    """``config`` if it is a :class:`~hw.config.DeviceConfig`, else :class:`TypeError`."""
    if not isinstance(config, DeviceConfig):
        raise TypeError(f"config must be a DeviceConfig, not {config!r}")
    return config


def _line_width(config: DeviceConfig) -> int:
    """Bits of a device line address."""
    return config.pmem_addr_width - LINE_SHIFT


def request_layout(config: DeviceConfig) -> data.StructLayout:
    """A decoded M2S request (Req or RwD) with everything the endpoint derives from it
    once, where it arrives. A Req has ``data`` and ``wstrb`` zero."""
    return data.StructLayout({
        **_ECHO_LAYOUT,
        "opcode": 4,
        "line": LINE_ADDR_BITS,     # host line address, for the error report
        "to_pmem": 1,               # served by one PMEM access
        "immediate": 1,             # answered without PMEM (NDR, or MemData-NXM)
        "errors": MemError.COUNT,
        "ndr_opcode": 3,            # the NDR it gets (NDROpcode)
        "nxm": 1,                   # an out-of-range read: MemData-NXM alone
        "meta_store": 1,            # with meta_state: stores its MetaValue
        "meta_promote": 1,          # MemRdData: the line's state goes from I to A
        "dev_line": _line_width(config),
        "bucket": config.hazard_bucket_width,
        "data": LINE_BITS,
        "wstrb": LINE_BITS // 8,
    })


def issue_layout(config: DeviceConfig) -> data.StructLayout:
    """A request sent to PMEM: its slot (the AXI ID) and what its completion needs."""
    return data.StructLayout({
        "slot": config.tag_index_width,
        "entry": data.StructLayout({
            **_ECHO_LAYOUT,
            "ndr_opcode": 3, "opcode": 4, "bucket": config.hazard_bucket_width,
            "dev_line": _line_width(config),
        }),
    })


def ordering_event_layout(config: DeviceConfig) -> data.StructLayout:
    """A PMEM access entering or leaving the ordering table."""
    return data.StructLayout({"bucket": config.hazard_bucket_width, "write": 1})


def pmem_request_layout(config: DeviceConfig) -> data.StructLayout:
    """An AR or AW beat: one line at device line ``line``, ID = the request's slot."""
    return data.StructLayout({"id": config.tag_index_width, "line": _line_width(config)})


#: A W beat: the line's data and byte strobes.
PmemWBeat = data.StructLayout({"data": LINE_BITS, "strb": LINE_BITS // 8})


def pmem_r_layout(config: DeviceConfig) -> data.StructLayout:
    return data.StructLayout({"id": config.tag_index_width, "data": LINE_BITS, "resp": 2})


def pmem_b_layout(config: DeviceConfig) -> data.StructLayout:
    return data.StructLayout({"id": config.tag_index_width, "resp": 2})


def dev_load_thresholds(max_tags: int) -> tuple[int, int, int]:
    """Occupancy thresholds ``(t1, t2, t3)`` of the DevLoad encoding.

    DevLoad is Light below ``t1``, Optimal below ``t2``, ModerateOverload below ``t3``
    and SevereOverload from ``t3`` on, with ``tk = ceil(k * max_tags / 4)``: an integer
    occupancy ``n`` satisfies ``n < tk`` exactly when ``n < k * max_tags / 4`` in real
    numbers, so the quarters are exact for every ``max_tags`` (for ``max_tags = 1`` an
    idle device is Light and a busy one SevereOverload).
    """
    return tuple((k * max_tags + 3) // 4 for k in (1, 2, 3))


def hdm_decode(m: Module, line, hdm_base, hdm_size, pmem_lines: int, name: str):
    """The HDM decoder: ``(in range, offset)`` of host line address ``line``
    (``LINE_ADDR_BITS``, 46 bits) for ``hdm_base`` (46 bits) and ``hdm_size`` (47 bits;
    bit 46 set: the whole space). In range means at or above the base, below base + size,
    and inside the ``pmem_lines`` lines of device memory; ``offset[:46]`` is then the
    device line."""
    top = LINE_ADDR_BITS
    offset = Signal(top + 1, name=f"{name}_offset")   # bit 46: borrow
    in_range = Signal(name=f"{name}_in_range")
    m.d.comb += [
        offset.eq(line - hdm_base),
        # Compare 46 bits and treat size bit 46 separately: when a parent ties that bit
        # to 0, Yosys then keeps both comparison operands equally wide.
        in_range.eq(~offset[top] & (hdm_size[top] | (offset[:top] < hdm_size[:top])) &
                    (offset < pmem_lines)),
    ]
    return in_range, offset


def xor_fold(value, width: int):
    """XOR of ``value``'s ``width``-bit chunks (the last one zero-extended)."""
    chunks = [value[i:i + width] for i in range(0, len(value), width)]
    return reduce(lambda a, b: a ^ b, chunks)[:width]
