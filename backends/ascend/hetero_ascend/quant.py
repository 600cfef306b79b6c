"""The quantized ops of spec 1.4 on torch_npu: what maps, what is declined and why, and the one mapping
(scaled_grouped_gemm -> npu_grouped_matmul's int8 per-token form) as pure functions tested on CPU.
grouped_gemm takes the same one-weight form and group_list (``gmm_group_list``, ``zero_past``).

Sources (facts only; the fake in tests/backend/test_ascend_quant.py is written from them):

- GMM = torch_npu.npu_grouped_matmul(x, weight, *, scale, per_token_scale, group_list, split_item,
  group_type, group_list_type, output_dtype) (Ascend/op-plugin docs/context/torch_npu-npu_grouped_matmul.md):
  "pertoken full quantization" y_i = (x_i @ weight_i) x scale_i x pertokenscale_i with x, weight int8,
  per_token_scale float32, and either scale bfloat16 -> output bfloat16 or scale float32 -> output
  float16 (table 2, group_list a Tensor; no float32 output, no fp8 on Atlas A2/A3); offset "only None";
  group_type 0 with one 3-D weight tensor ("single-single-single"): split_item 2/3, group_list int64 with
  its last cumsum value equal to x's rows, at most 1024 groups, weight transposition allowed; inner dims
  below 65536. vllm-ascend calls this form with the weight scales squeezed to [E, N].
- DQ = torch_npu.npu_dynamic_quant(x, *, smooth_scales, group_index, dst_type) (hiascend Pytorch 7.0.0
  ptaoplist_001228; CANN ops-nn aclnnDynamicQuant.md): per-token symmetric, x float16/bfloat16, dst_type
  int8 or quint4x2 on A2/A3 (fp8/hifloat8 outputs: Ascend 950 only); the A2/A3 kernel (ops-nn
  op_kernel/dynamic_quant.h, __CCE_AICORE__ 220) computes inv = 127 / amax, stores scale = 1 / inv and
  quantizes rint(x * inv); its golden gives an all-zero row scale 1. npu_dynamic_quant_asymmetric:
  scale = (max - min) / 255, a float offset 127 - max / scale, y = round(x / scale + offset).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from hetero.kernels.limits import dtype_name, kernel_reason
from hetero_ascend.convert import group_list

__all__ = [
    "QUANT_OPS",
    "GMM",
    "NOTES",
    "reason",
    "gmm_reason",
    "gmm_static",
    "quantized_moe",
    "token_scale",
    "channel_scale",
    "gmm_group_list",
    "gmm_kwargs",
    "grouped_matmul_w8a8",
    "zero_past",
]

QUANT_OPS = ("quantize_activation", "scaled_grouped_gemm")
GMM = "npu_grouped_matmul (int8 per-token form: per_token_scale x per-channel scale)"
GMM_MAX_GROUPS = 1024  # doc: group_list at most 1024 groups (single-single-single)
GMM_INNER_LIMIT = 65536  # doc: InnerLimit, every last dimension below it
#: The output dtype GMM's per-token form gives for each scale dtype (doc, table 2): out_dtype -> scale dtype.
GMM_SCALE_DTYPE = {torch.bfloat16: torch.bfloat16, torch.float16: torch.float32}
_FP8 = ("float8_e4m3fn", "float8_e4m3fnuz")
#: The static keys that may carry an op's quantized dtype (conformance: quantize_activation's "quant_dtype",
#: scaled_grouped_gemm's "dtype"; fused_moe's weight dtype under any of these names).
_FP8_KEYS = {
    "quantize_activation": ("quant_dtype", "dtype"),
    "scaled_grouped_gemm": ("dtype",),
    "fused_moe": ("weight_dtype", "w13_dtype", "quant_dtype", "quant"),
}

FP8_REASON = (
    "Atlas A2/A3 have no fp8 data path: torch_npu documents fp8 only on Ascend 950 (npu_grouped_matmul "
    "and npu_dynamic_quant take int8/int4 there), and the portable kernel's fp8 casts and dots are "
    "unverified on triton-ascend"
)
DQ_REASON = (
    "torch_npu.npu_dynamic_quant does not compute quantize_activation's bit-exact arithmetic: its A2/A3 "
    "kernel takes inv = 127 / amax, returns scale = 1 / inv (not the correctly rounded amax / 127: they "
    "differ in the last bit for about a quarter of amax values) and quantizes rint(x * inv), a product "
    "with the reciprocal; an all-zero row gets scale 1, not 1e-10 / 127; it has no token groups, no "
    "ue8m0 scales and no float32 input; npu_dynamic_quant_asymmetric keeps a float offset 127 - max / s "
    "rounded with x / s, not the spec's integer zero point -128 - min / s"
)
MOE_REASON = (
    "no documented torch_npu op computes fused_moe's quantized composition exactly: its activation "
    "quantization is quantize_activation's (npu_dynamic_quant's arithmetic differs), and "
    "npu_grouped_matmul's antiquant (W8A16) form dequantizes with bfloat16/float16 scales"
)
#: What op_notes appends to each op's note (the mapping's assumptions, the declines).
NOTES = {
    "quantize_activation": f"not mapped to torch_npu.npu_dynamic_quant: {DQ_REASON}",
    "scaled_grouped_gemm": (
        "int8 with per-token (or per-tensor) activation scales, per-channel (or per-group) weight "
        "scales, no zero point, bfloat16 or float16 output; assumed: the bfloat16 output takes the "
        "weight scales rounded to bfloat16 (doc table 2, as vllm-ascend does; relative error <= "
        "2**-9), and a [G, N] scale serves the 3-D weight; fp8, block scales and zero points are "
        "declined (the Triton kernel or the reference)"
    ),
    "fused_moe": f"its quantized mode (w13_scale, act_quant) is not mapped: {MOE_REASON}",
}


def _on(value: Any) -> bool:
    return value is not None and value is not False


def gmm_reason(s: Mapping[str, Any]) -> str | None:
    """None if GMM's int8 per-token form computes a scaled_grouped_gemm call with static ``s``, else why not.
    Keys: dtype (of a and b), a_scale / b_scale (the forms of hetero.spec._checks_quant), a_zero_point,
    out_dtype, num_experts (or groups), n, k."""
    dtype = dtype_name(s.get("dtype"))
    if dtype in _FP8:
        return FP8_REASON
    if dtype is not None and dtype != "int8":
        return f"npu_grouped_matmul's quantized forms take int8 operands, not {dtype}"
    if s.get("a_scale") == "block":
        return "npu_grouped_matmul has no 1x128 activation-group scales on A2/A3 (per_token_scale is one per row)"
    if s.get("b_scale") == "block":
        return "npu_grouped_matmul has no 128x128 weight-block scales on A2/A3 (scale is one per output channel)"
    if _on(s.get("a_zero_point")):
        return "npu_grouped_matmul's offset takes only None (doc): no activation zero point"
    out = dtype_name(s.get("out_dtype"))
    if out is not None and out not in ("bfloat16", "float16"):
        return f"npu_grouped_matmul's int8 per-token form outputs bfloat16 or float16 (doc), not {out}"
    groups = s.get("num_experts", s.get("groups"))
    if groups is not None and int(groups) > GMM_MAX_GROUPS:
        return f"npu_grouped_matmul takes at most {GMM_MAX_GROUPS} groups (doc), not {int(groups)}"
    for key in ("n", "k"):
        if s.get(key) is not None and int(s[key]) >= GMM_INNER_LIMIT:
            return f"npu_grouped_matmul takes inner dimensions below {GMM_INNER_LIMIT} (doc), not {key} {int(s[key])}"
    return None


def quantized_moe(s: Mapping[str, Any]) -> bool:
    """Whether a static fused_moe configuration asks for the quantized mode (spec 1.4)."""
    return _on(s.get("w13_scale")) or _on(s.get("act_quant"))


def _fp8(s: Mapping[str, Any], keys: tuple[str, ...]) -> bool:
    return any(dtype_name(s.get(k)) in _FP8 or s.get(k) == "fp8" for k in keys)


def reason(op: str, s: Mapping[str, Any], triton_ok: bool) -> str | None:
    """The body of ``supports`` for the quantized ops and fused_moe's quantized mode: None where GMM or
    the portable kernel serves the call, else why not (the reference runs it)."""
    if _fp8(s, _FP8_KEYS[op]):
        return FP8_REASON
    why = {"quantize_activation": DQ_REASON, "fused_moe": MOE_REASON}.get(op) or gmm_reason(s)
    if why is None:
        return None
    if not triton_ok:
        return f"{why}; and triton-ascend is not installed (no portable kernel)"
    return kernel_reason(op, s)


def gmm_static(
    a: torch.Tensor, b: torch.Tensor, forms: tuple[str, str], a_zero_point: Any, out_dtype: torch.dtype
) -> dict:
    """The static configuration of a scaled_grouped_gemm call, for ``gmm_reason``."""
    return {
        "dtype": a.dtype,
        "a_scale": forms[0],
        "b_scale": forms[1],
        "a_zero_point": a_zero_point is not None,
        "out_dtype": out_dtype,
        "num_experts": b.shape[0],
        "n": b.shape[1],
        "k": b.shape[2],
    }


def token_scale(a_scale: torch.Tensor, form: str, rows: int) -> torch.Tensor:
    """hetero's per-token [M, 1] or per-tensor a_scale as GMM's per_token_scale: float32 [M]."""
    s = a_scale.reshape(-1).float()
    return (s.expand(rows) if form == "tensor" else s).contiguous()


def channel_scale(b_scale: torch.Tensor, form: str, n: int, out_dtype: torch.dtype) -> torch.Tensor:
    """hetero's per-channel [G, N, 1] or per-group [G] b_scale as GMM's scale [G, N], in the dtype the
    output dtype asks for (bfloat16 for bfloat16 output: rounded; float32 for float16 output: exact)."""
    s = b_scale.reshape(b_scale.shape[0], -1)
    s = s.expand(-1, n) if form == "group" else s
    return s.to(GMM_SCALE_DTYPE[out_dtype]).contiguous()


def gmm_group_list(group_ends: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(GMM's int64 cumsum group_list, the end of hetero's last group). The ends are clamped into [0, rows]
    and made non-decreasing on the device; the last one is set to ``rows`` (GMM's rule): the rows past
    hetero's last group then join it and are zeroed after the call."""
    ends = group_list(group_ends, 0, rows=rows)
    return torch.cat([ends[:-1], ends.new_full((1,), rows)]), ends[-1:]


def gmm_kwargs(token: torch.Tensor, scale: torch.Tensor, gl: torch.Tensor, out_dtype: torch.dtype) -> dict:
    """GMM's keyword arguments: one 2-D x, one 3-D weight, one output (group_type 0, split_item 3), cumsum."""
    return {
        "scale": [scale],
        "per_token_scale": [token],
        "group_list": gl,
        "split_item": 3,
        "group_type": 0,
        "group_list_type": 0,
        "output_dtype": out_dtype,
    }


def grouped_matmul_w8a8(
    npu: Any,
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    group_ends: torch.Tensor,
    forms: tuple[str, str],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """hetero's scaled_grouped_gemm (int8, per-token x per-channel) through ``npu.npu_grouped_matmul``: b
    [G, N, K] passed as its transposed view [G, K, N]. No call for an empty a or no groups."""
    rows, (groups, n, _) = a.shape[0], b.shape
    if rows == 0 or groups == 0:
        return torch.zeros(rows, n, dtype=out_dtype, device=a.device)
    gl, last = gmm_group_list(group_ends, rows)
    kwargs = gmm_kwargs(
        token_scale(a_scale, forms[0], rows), channel_scale(b_scale, forms[1], n, out_dtype), gl, out_dtype
    )
    y = npu.npu_grouped_matmul([a.contiguous()], [b.transpose(1, 2)], **kwargs)[0]
    return zero_past(y, last).to(out_dtype)


def zero_past(y: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """y with the rows at or past ``last`` (hetero's last group end, [1]) zeroed: hetero's rule for them."""
    return y.masked_fill(torch.arange(y.shape[0], device=y.device).unsqueeze(1) >= last, 0)
