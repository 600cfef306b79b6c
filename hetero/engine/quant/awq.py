"""``quant_method: "awq"`` (AutoAWQ, GEMM version): 4-bit weights with zero points, run as W4A16 (``int4``).

config.json: ``{"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version":
"gemm"}`` and optionally ``"modules_to_not_convert"``. ``qweight`` and ``qzeros`` pack eight columns of
N a word in AWQ's interleaved order (``_int4math.AWQ_ORDER``). Refused by name: other versions (gemv,
gemv_fast, exllama, marlin, ipex), other bit widths, ``zero_point`` false.
"""

from __future__ import annotations

from typing import Any

from hetero.engine.quant.config import UnsupportedQuantization
from hetero.engine.quant.gptq import int4_group_size, substring_skips
from hetero.engine.quant.int4 import Int4QuantConfig, Int4Scheme

__all__ = ["awq_config"]


def awq_config(qc: dict[str, Any]) -> Int4QuantConfig:
    """The QuantConfig of an AWQ GEMM checkpoint; any other variant is an UnsupportedQuantization naming it."""
    problems: list[str] = []
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        problems.append(f"bits {bits!r} (only 4)")
    group_size = int4_group_size(qc.get("group_size", qc.get("q_group_size", 128)), problems)
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        problems.append(f"version {qc.get('version')!r} (only the GEMM layout)")
    if not qc.get("zero_point", True):
        problems.append("zero_point false (AWQ checkpoints with zero points only)")
    if problems:
        raise UnsupportedQuantization("quantization_config (quant_method 'awq'): unsupported " + "; ".join(problems))
    scheme = Int4Scheme("awq", group_size, symmetric=False)
    return Int4QuantConfig(name="awq", scheme=scheme, skip=substring_skips(qc.get("modules_to_not_convert")))
