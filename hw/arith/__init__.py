"""IEEE-754 binary32 arithmetic and bfloat16 conversion units.

Every unit is a :class:`~amaranth.lib.wiring.Component` with an ``i_operands`` stream in
and an ``o_result`` stream out, and follows the numerics contract of
``docs/numerics.md`` (round-to-nearest-even, no flushing of subnormals, canonical quiet
NaN, bit-identical to numpy float32 / ml_dtypes otherwise).

========================  ==============================  =========================
unit                      latency (cycles)                throughput
========================  ==============================  =========================
:class:`FpAdd`            ``stages`` (1-5, default 3)     1 per cycle
:class:`FpMul`            ``stages`` (1-4, default 3)     1 per cycle
:class:`FpMax`            ``stages`` (1-2, default 1)     1 per cycle
:class:`FpDiv`            ``ceil(25/k) + 3`` (28 at k=1)  1 per ``ceil(25/k) + 1``
:class:`Fp32ToBf16`       1                               1 per cycle
:class:`Bf16ToFp32`       1                               1 per cycle
========================  ==============================  =========================
"""

from .bf16_to_fp32 import Bf16ToFp32
from .fp32_to_bf16 import Fp32ToBf16
from .fp_add import FpAdd
from .fp_div import FpDiv
from .fp_max import FpMax
from .fp_mul import FpMul

__all__ = ["UNITS", "Bf16ToFp32", "Fp32ToBf16", "FpAdd", "FpDiv", "FpMax", "FpMul"]

#: Unit name (as used by ``sim/fpcheck.py`` and module names) -> class.
UNITS = {
    "fp_add": FpAdd,
    "fp_mul": FpMul,
    "fp_max": FpMax,
    "fp_div": FpDiv,
    "fp32_to_bf16": Fp32ToBf16,
    "bf16_to_fp32": Bf16ToFp32,
}
