"""Why ascend declines packed int4 weights (spec 1.9, W4A16) in gemm, grouped_gemm and fused_moe.

torch_npu's weight-only quantized matmul, ``npu_weight_quant_batchmatmul`` (op-plugin docs,
ptaoplist, PyTorch 7.0.0), takes int4 only as int32 ``[K, N]`` words packed by
``npu_convert_weight_to_int4pack``, and its per-group ``antiquant_scale`` / ``antiquant_offset`` in x's
dtype (float16 or bfloat16). hetero's weights are uint8 ``[N, ceil(K/2)]`` with float32 scales: a
call would repack the weight (a copy of it per call, or a cache the spec's weights do not carry) and
round every scale to x's dtype, which breaks the bit-exact dequantization the spec requires.
"""

from __future__ import annotations

from typing import Any, Mapping

from hetero.kernels.limits import dtype_name

__all__ = ["INT4_OPS", "INT4_REASON", "packed_int4"]

INT4_OPS = ("gemm", "grouped_gemm", "fused_moe")
INT4_REASON = (
    "packed int4 weights (W4A16, spec 1.9): torch_npu's npu_weight_quant_batchmatmul takes int4 as int32 [K, N] "
    "words (npu_convert_weight_to_int4pack) with per-group scales in x's dtype (float16/bfloat16, doc), so "
    "hetero's uint8 [N, ceil(K/2)] weights would be repacked per call and their float32 scales rounded, "
    "breaking the spec's bit-exact dequantization; hetero's portable Triton int4 kernels are unverified on "
    "triton-ascend: never run on an NPU"
)
_OPTIONS = ("group_size", "b_zero_point", "w13_zero_point", "w2_zero_point")


def packed_int4(op: str, static: Mapping[str, Any]) -> bool:
    """Whether a static configuration of gemm, grouped_gemm or fused_moe is a packed int4 one."""
    if op not in INT4_OPS:
        return False
    weights = {dtype_name(static.get(k)) for k in ("weight_dtype", "w_dtype", "b_dtype")}
    return bool(weights & {"int4", "uint8"}) or any(static.get(k) not in (None, False) for k in _OPTIONS)
