"""The norms and rotary embedding of the ascend backend on torch_npu (npu_rms_norm, npu_add_rms_norm,
npu_rotary_mul) and torch's layer_norm. Never run on an NPU; the conversions are tested on CPU."""

from __future__ import annotations

import torch

from hetero.spec.checks import check_layer_norm
from hetero_ascend import common, convert
from hetero_ascend.common import WithTriton

__all__ = ["rms_norm", "rotary_embedding", "layer_norm"]


@WithTriton
def rms_norm(triton, x, weight, eps, *, residual=None, weight_offset=0.0, gate=None, gate_act="silu"):
    """torch_npu.npu_rms_norm / npu_add_rms_norm; never run on an NPU (conversions tested on CPU).
    They have no weight offset and no gate: those calls take the portable Triton kernel, which needs
    triton-ascend (``supports`` declines them without it)."""
    if weight_offset or gate is not None or gate_act != "silu":
        return triton.rms_norm(
            x, weight, eps, residual=residual, weight_offset=weight_offset, gate=gate, gate_act=gate_act
        )
    if residual is None:
        return common.torch_npu().npu_rms_norm(x, weight.to(x.dtype), epsilon=eps)[0]
    y, _, h = common.torch_npu().npu_add_rms_norm(x, residual, weight.to(x.dtype), eps)
    return y, h


def rotary_embedding(positions, q, k, cos_sin_cache, *, is_neox=True):
    """torch_npu.npu_rotary_mul (neox half-rotation), rotary dims only; never run on an NPU
    (conversions tested on CPU)."""
    r1, r2 = convert.rotary_factors(positions, cos_sin_cache.to(q.dtype))
    rot = cos_sin_cache.shape[-1]

    def apply(x):
        head = common.torch_npu().npu_rotary_mul(x[..., :rot].unsqueeze(1).contiguous(), r1, r2).squeeze(1)
        return torch.cat([head, x[..., rot:]], dim=-1) if rot < x.shape[-1] else head

    return apply(q), apply(k)


def layer_norm(x, weight, bias, eps):
    """torch.nn.functional.layer_norm in float32 (an aten op torch_npu implements; it deprecates
    npu_layer_norm_eval in its favour), rounded once to x's dtype; never run on an NPU (checked on CPU)."""
    hidden = check_layer_norm("layer_norm", x, weight, bias, eps)
    y = torch.nn.functional.layer_norm(
        x.float(), (hidden,), weight.float(), None if bias is None else bias.float(), eps
    )
    return y.to(x.dtype)
