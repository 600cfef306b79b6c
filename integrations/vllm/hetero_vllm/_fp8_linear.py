"""vLLM's ``Fp8LinearMethod`` on hetero ``quantize_activation`` + ``scaled_gemm``, the fp8 weight kept as loaded.

vLLM picks an fp8 GEMM kernel when it creates the weights (``init_fp8_linear_kernel``);
on a CPU without AMX there is none for block fp8, and vLLM raises. This method
creates the same parameters (so vLLM's loaders fill them unchanged) without a kernel:

- block fp8 (``weight_block_size`` [128, 128], DeepSeek-V3 / Qwen3-FP8): ``weight``
  float8_e4m3fn [N, K] and ``weight_scale_inv`` [ceil(N/128), ceil(K/128)], float32
  (an e8m0 scale is converted to float32, exactly); each input is quantized per token
  and 128 columns;
- per-tensor fp8: one ``weight_scale`` per logical shard of a fused layer (q/k/v,
  gate/up), expanded at load to the per-channel [N, 1] form hetero's ``scaled_gemm``
  takes (exact: no requantization); each input is quantized per token.

The activation scales are float32, or powers of two (``ue8m0``) when the checkpoint's
``scale_fmt`` says so (DeepSeek-V3.1+). Static activation scales are not routed.
A per-tensor weight stays [N, K]: vLLM's MLA, which dequantizes ``kv_b_proj`` itself and
assumes its own per-tensor [K, N] layout, would read it transposed (block fp8 is unaffected).
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import register_weight_loader_v2_supported_method
from vllm.model_executor.layers.quantization.fp8 import Fp8LinearMethod
from vllm.model_executor.layers.quantization.utils.fp8_utils import (
    create_fp8_scale_parameter,
    create_fp8_weight_parameter,
    validate_fp8_block_shape,
)
from vllm.model_executor.parameter import BlockQuantScaleParameter, PerTensorScaleParameter
from vllm.model_executor.utils import replace_parameter

from hetero_vllm import _backend, report
from hetero_vllm.torch_ops import _fresh

__all__ = ["FP8", "LINEAR_SITE", "HeteroFp8LinearMethod", "quantize_activation", "scaled_gemm"]

#: The vLLM class this route replaces: the report's name for it, and its custom_ops opt-out (``-Fp8LinearMethod``).
LINEAR_SITE = "Fp8LinearMethod"
FP8 = torch.float8_e4m3fn


@torch.library.custom_op("hetero::quantize_activation", mutates_args=())
def quantize_activation(
    x: torch.Tensor, dtype: torch.dtype, group_size: int | None, scale_fmt: str, site: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """hetero ``quantize_activation``: x [M, K] -> (q [M, K] of ``dtype``, scale float32 [M, ceil(K/group_size)]
    or [M, 1] when ``group_size`` is None)."""
    report.record(site, "quantize_activation")
    q, scale = _backend.ops().quantize_activation(x, dtype=dtype, group_size=group_size, scale_fmt=scale_fmt)[:2]
    return _fresh(q, x), _fresh(scale, x)


@quantize_activation.register_fake
def _(x, dtype, group_size, scale_fmt, site):
    groups = 1 if group_size is None else -(-x.shape[1] // group_size)
    return x.new_empty(x.shape, dtype=dtype), x.new_empty((x.shape[0], groups), dtype=torch.float32)


@torch.library.custom_op("hetero::scaled_gemm", mutates_args=())
def scaled_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    site: str,
) -> torch.Tensor:
    """hetero ``scaled_gemm``: dequant(a [M, K]) @ dequant(b [N, K]).T + bias -> [M, N] of ``out_dtype``
    (scales per tensor, per token/channel or per 128-block, by their shapes)."""
    report.record(site, "scaled_gemm")
    out = _backend.ops().scaled_gemm(a, b, a_scale, b_scale, bias=bias, out_dtype=out_dtype)
    return _fresh(out, a, b) if bias is None else _fresh(out, a, b, bias)


@scaled_gemm.register_fake
def _(a, b, a_scale, b_scale, bias, out_dtype, site):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


# vLLM picks a layer's weight loader by its method's class name: keep this one on the v2 loader, as vLLM's
@register_weight_loader_v2_supported_method
class HeteroFp8LinearMethod(Fp8LinearMethod):
    """vLLM's fp8 linear method (block or per-tensor weights, dynamic activations) on hetero."""

    supports_pre_processed_weights = False  # the scales are converted at load

    def __init__(self, quant_config, act_scale_fmt: str = "float") -> None:
        super().__init__(quant_config)
        self.act_scale_fmt = act_scale_fmt
        self.group_size = self.weight_block_size[1] if self.block_quant else None
        self.hetero_site: str | None = report.site(LINEAR_SITE)

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        loader = extra_weight_attrs.get("weight_loader")
        n = sum(output_partition_sizes)
        layer.logical_widths = output_partition_sizes
        layer.input_size_per_partition = input_size_per_partition
        layer.output_size_per_partition = n
        layer.orig_dtype = params_dtype
        layer.weight_block_size = self.weight_block_size
        if self.block_quant:
            block = self.weight_block_size
            validate_fp8_block_shape(
                layer, input_size, output_size, input_size_per_partition, output_partition_sizes, block
            )
            e8m0 = torch.float8_e8m0fnu if self.is_scale_e8m0 else None
            scale = create_fp8_scale_parameter(
                BlockQuantScaleParameter, output_partition_sizes, input_size_per_partition, block, loader, e8m0
            )
            scale_name = "weight_scale_inv"  # DeepSeek-V3's name for block scales
        else:
            scale = create_fp8_scale_parameter(
                PerTensorScaleParameter, output_partition_sizes, input_size_per_partition, None, loader
            )
            scale_name = "weight_scale"
        layer.register_parameter("weight", create_fp8_weight_parameter(n, input_size_per_partition, loader))
        layer.register_parameter(scale_name, scale)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if self.block_quant:
            scale = layer.weight_scale_inv
            if scale.dtype != torch.float32:
                replace_parameter(layer, "weight_scale_inv", scale.data.to(torch.float32))
        else:
            widths = torch.tensor(layer.logical_widths, device=layer.weight_scale.device)
            per_channel = layer.weight_scale.data.to(torch.float32).repeat_interleave(widths).unsqueeze(1)
            replace_parameter(layer, "weight_scale", per_channel)
        layer.input_scale = None

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        site = self.hetero_site
        flat = x.reshape(-1, x.shape[-1])
        q, scale = torch.ops.hetero.quantize_activation(flat, FP8, self.group_size, self.act_scale_fmt, site)
        w_scale = layer.weight_scale_inv if self.block_quant else layer.weight_scale
        out = torch.ops.hetero.scaled_gemm(q, layer.weight, scale, w_scale, bias, x.dtype, site)
        return out.reshape(*x.shape[:-1], out.shape[-1])
