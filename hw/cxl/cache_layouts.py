"""Layouts and error kinds shared by the CXL.cache agent and its parts.

:class:`~hw.cxl.cache_agent.CacheAgent` re-exports the user-facing ones.
"""

from __future__ import annotations

from amaranth.lib import data

from .messages import LINE_ADDR_BITS, LINE_BITS

__all__ = [
    "ERR_DETAILS",
    "ERR_INFO",
    "ERR_REPORT",
    "ID_BITS",
    "RD_REQ",
    "RD_RSP",
    "TAG_BITS",
    "WR_REQ",
    "WR_RSP",
    "CacheError",
]

#: Width of the user's request tag, echoed with the response.
TAG_BITS = 16

#: Width of a CQID / UQID (CXL 2.0 §3.2.3; ``docs/cxl-encodings.md``).
ID_BITS = 12

#: A read of one line of host memory: ``address`` is the line address Addr[51:6].
RD_REQ = data.StructLayout({"address": LINE_ADDR_BITS, "tag": TAG_BITS})

#: The line read, in request order; ``error`` as :class:`CacheAgent` lists.
RD_RSP = data.StructLayout({"data": LINE_BITS, "tag": TAG_BITS, "error": 1})

#: A write of one whole line of host memory.
WR_REQ = data.StructLayout({"address": LINE_ADDR_BITS, "data": LINE_BITS, "tag": TAG_BITS})

#: A write's completion, in request order.
WR_RSP = data.StructLayout({"tag": TAG_BITS, "error": 1})


class CacheError:
    """Error kinds: bit positions of ``o_err_set`` / ``o_err_status`` and values of
    ``ERR_INFO.code``."""
    RSP_NOT_IN_FLIGHT = 0   # H2D Rsp names a CQID with no request in flight: dropped
    DATA_NOT_IN_FLIGHT = 1  # H2D Data names no read in flight (free, write or unused CQID)
    DATA_DUPLICATE = 2      # second H2D Data for one read: dropped, the first one kept
    RSP_UNEXPECTED = 3      # H2D Rsp the request cannot take (see docs): dropped
    READ_ERROR = 4          # a read was delivered with ``error`` set
    WRITE_ERROR = 5         # a write completed with ``error`` set
    SNOOP_RESERVED = 6      # H2D Req with a reserved opcode (answered RspIHitI anyway)
    COUNT = 7


#: Details of an error (:attr:`CacheAgent.o_err_first`). ``opcode`` is the message's
#: opcode (zero for H2D Data and for READ_ERROR / WRITE_ERROR); ``id`` the CQID named by
#: the H2D Rsp / H2D Data or of the request that completed with an error, or the UQID of
#: the snoop.
ERR_DETAILS = data.StructLayout({"opcode": 5, "id": ID_BITS})
ERR_INFO = data.StructLayout({"code": 3, **ERR_DETAILS.members})

#: This cycle's errors of one part of the agent, as the agent's
#: :class:`~hw.csr.error_log.ErrorLog` takes them: a bit per kind raised and each
#: raised kind's details. A part drives only its own kinds (the others stay zero), so
#: the agent ORs the reports of its parts.
ERR_REPORT = data.StructLayout({"raised": CacheError.COUNT,
                                "info": data.ArrayLayout(ERR_DETAILS, CacheError.COUNT)})
