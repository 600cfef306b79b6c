"""The grouped GEMMs of the ascend backend on torch_npu.npu_grouped_matmul (one 3-D weight, cumsum group_list).
Never run on an NPU; the conversions are tested on CPU."""

from __future__ import annotations

import torch

from hetero.spec.checks import check_packed_gemm, check_scaled_grouped, check_tensor
from hetero.spec.types import FLOAT_DTYPES
from hetero_ascend import common, convert, quant
from hetero_ascend.common import WithTriton

__all__ = ["grouped_gemm", "scaled_grouped_gemm"]


@WithTriton
def grouped_gemm(triton, a, b, group_ends, *, out_dtype=None, b_scale=None, b_zero_point=None, group_size=None):
    """torch_npu.npu_grouped_matmul with one 3-D weight (split_item 3, group_type 0, cumsum group_list
    ending at a's rows, <= 1024 groups); never run on an NPU (conversions tested on CPU). Packed int4
    weights (spec 1.9) go to the Triton kernel (``hetero_ascend._int4`` says why)."""
    from hetero.kernels.gemm import check_operands  # not at import: the kernel modules load under the interpreter

    if check_packed_gemm("grouped_gemm", a, b, (b_scale, b_zero_point, group_size), b_ndim=3) is not None:
        opts = dict(b_scale=b_scale, b_zero_point=b_zero_point, group_size=group_size)
        return triton.grouped_gemm(a, b, group_ends, out_dtype=out_dtype, **opts)
    check_operands("grouped_gemm", a, b, FLOAT_DTYPES, b_ndim=3)
    check_tensor("grouped_gemm", "group_ends", group_ends, shape=(b.shape[0],), dtypes=(torch.int32, torch.int64))
    if a.shape[0] == 0 or b.shape[0] == 0:  # no call: all rows are past the last group
        return a.new_zeros(a.shape[0], b.shape[1], dtype=out_dtype or a.dtype)
    gl, last = quant.gmm_group_list(group_ends, a.shape[0])
    y = common.torch_npu().npu_grouped_matmul(
        [a.contiguous()], [convert.grouped_weights(b)], group_list=gl, split_item=3, group_type=0, group_list_type=0
    )[0]
    y = quant.zero_past(y, last)
    return y if out_dtype in (None, y.dtype) else y.to(out_dtype)


@WithTriton
def scaled_grouped_gemm(triton, a, b, a_scale, b_scale, group_ends, *, a_zero_point=None, out_dtype=torch.bfloat16):
    """torch_npu.npu_grouped_matmul's int8 per-token form (per_token_scale x per-channel scale, one 3-D
    weight, cumsum group_list); never run on an NPU (conversions tested on CPU). Calls outside its
    documented limits (fp8, block scales, a zero point, float32 output) go to the Triton kernel."""
    forms = check_scaled_grouped("scaled_grouped_gemm", a, b, a_scale, b_scale, group_ends, a_zero_point, out_dtype)
    if quant.gmm_reason(quant.gmm_static(a, b, forms, a_zero_point, out_dtype)) is not None:
        return triton.scaled_grouped_gemm(
            a, b, a_scale, b_scale, group_ends, a_zero_point=a_zero_point, out_dtype=out_dtype
        )
    return quant.grouped_matmul_w8a8(common.torch_npu(), a, b, a_scale, b_scale, group_ends, forms, out_dtype)
