"""FP8 checkpoints (``quant_method: fp8``) on hetero: vLLM's ``Fp8Config`` replaced through its quantization registry.

``register()`` registers ``HeteroFp8Config`` under vLLM's name "fp8"
(``register_quantization_config``, vLLM's hook for this). It is vLLM's ``Fp8Config``
(same parsing, same ignored layers, same KV-cache scales), except that

- a linear layer gets ``HeteroFp8LinearMethod`` (``_fp8_linear``): block fp8
  (``weight_block_size`` [128, 128]) and per-tensor fp8 with dynamic activations, on hetero
  ``quantize_activation`` + ``scaled_gemm``; vLLM-CPU has no block-fp8 kernel without AMX;
- routed experts get ``HeteroFp8MoEMethod`` (``_fp8_moe``): hetero ``fused_moe`` with fp8 scales;
- an ignored layer gets vLLM's unquantized method, which hetero's own routes then take
  (``linear``'s layer replacements swap it for hetero ``gemm``, ``moe``'s for ``fused_moe``);
- float32 activations are accepted (vLLM's fp8 kernels take bfloat16/float16 only).

A checkpoint's ``"scale_fmt": "ue8m0"`` (DeepSeek-V3.1+) makes the activation scales powers
of two, as hetero's engine does. What hetero does not cover (static activation scales,
blocks other than 128x128, a clamped or interleaved fp8 MoE activation) keeps vLLM's method
and shows in the report.

Opt-outs:

- ``HETERO_VLLM_FP8=0`` (environment): nothing is registered and vLLM's ``Fp8Config`` stays.
  ``register()`` runs in every process before any model loads, and the workers inherit the
  variable, so every process decides alike.
- ``-Fp8LinearMethod`` / ``-Fp8MoEMethod`` in ``compilation_config.custom_ops``: the engine's
  config is not known yet when plugins load, so this one is applied as vLLM builds each
  layer: those layers get vLLM's own method (bfloat16/float16 only, as without hetero).
"""

from __future__ import annotations

import logging
import os

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.layers.quantization.fp8 import Fp8Config
from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

from hetero_vllm import _backend, report
from hetero_vllm._fp8_linear import LINEAR_SITE, HeteroFp8LinearMethod
from hetero_vllm._fp8_moe import MOE_SITE, HeteroFp8MoEMethod

__all__ = ["ENV", "HeteroFp8Config", "fp8_routed", "register"]

#: ``HETERO_VLLM_FP8=0`` keeps vLLM's fp8 methods for the whole process (and its workers).
ENV = "HETERO_VLLM_FP8"
_logger = logging.getLogger("vllm.hetero_vllm")
_SCALE_FORMATS = ("float", "ue8m0")


def _opted_out(name: str) -> bool:
    """Whether the engine's ``custom_ops`` has ``-<name>``; noted where vLLM checks its custom_ops entries."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    if config is None:
        return False
    _backend.remember_config(config)
    compilation = config.compilation_config
    off = f"-{name}" in compilation.custom_ops
    (compilation.disabled_custom_ops if off else compilation.enabled_custom_ops).update([name])
    return off


def _stock(name: str, prefix: str, reason: str) -> None:
    """Note that the layer at ``prefix`` keeps vLLM's ``name``; refuse float32, which vLLM's fp8 kernels do not take."""
    from vllm.config import get_current_vllm_config_or_none

    report.not_routed(name, reason)
    config = get_current_vllm_config_or_none()
    dtype = getattr(getattr(config, "model_config", None), "dtype", None)
    if str(dtype) == "torch.float32":
        raise ValueError(
            f"hetero-vllm: {prefix} keeps vLLM's {name} ({reason}), which takes bfloat16 or float16 activations, "
            f"and the model runs in float32; run it in bfloat16, or let hetero serve it"
        )


class HeteroFp8Config(Fp8Config):
    """vLLM's ``Fp8Config`` whose linear and expert methods run on hetero (see the module docstring)."""

    act_scale_fmt = "float"

    @classmethod
    def from_config(cls, config: dict) -> HeteroFp8Config:
        out = super().from_config(config)
        fmt = config.get("scale_fmt") or "float"
        if fmt not in _SCALE_FORMATS:
            raise ValueError(
                f"hetero-vllm: fp8 quantization_config scale_fmt must be one of {_SCALE_FORMATS}, got {fmt!r}"
            )
        out.act_scale_fmt = fmt
        return out

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.half, torch.float32]

    def _skipped(self, prefix: str) -> bool:
        return is_layer_skipped(
            prefix=prefix,
            ignored_layers=self.ignored_layers,
            fused_mapping=self.packed_modules_mapping,
            match_mode=self.ignored_layers_match_mode,
        )

    def _linear_reason(self) -> str | None:
        if self.activation_scheme != "dynamic":
            return "static activation scales: no hetero op quantizes with a given scale"
        if self.weight_block_size is not None and list(self.weight_block_size) != [128, 128]:
            return f"weight_block_size {self.weight_block_size} (hetero scaled_gemm's blocks are 128x128)"
        if _opted_out(LINEAR_SITE):
            return f"turned off by compilation_config.custom_ops (-{LINEAR_SITE})"
        return None

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase) and not self._skipped(prefix):
            reason = self._linear_reason()
            if reason is None:
                return HeteroFp8LinearMethod(self, self.act_scale_fmt)
            _stock(LINEAR_SITE, prefix, reason)
        elif isinstance(layer, RoutedExperts) and not self._skipped(prefix) and self.store_dtype != "mxfp4":
            if _opted_out(MOE_SITE):
                _stock(MOE_SITE, prefix, f"turned off by compilation_config.custom_ops (-{MOE_SITE})")
            else:
                method = HeteroFp8MoEMethod(self, layer, self.act_scale_fmt)
                if method.hetero_site is not None:
                    return method
                _stock(MOE_SITE, prefix, method.hetero_reason)
        return super().get_quant_method(layer, prefix)


def fp8_routed() -> bool:
    """Whether this process routes fp8 checkpoints (``HETERO_VLLM_FP8`` is not 0); the census lists the layers of
    one that is not, under their vLLM quant method."""
    return os.environ.get(ENV, "").strip().lower() not in ("0", "false", "no", "off")


def register() -> list[str]:
    """Register ``HeteroFp8Config`` as vLLM's "fp8" quantization config, unless ``HETERO_VLLM_FP8=0`` or another
    plugin already did; returns the vLLM class names now routed."""
    if not fp8_routed():
        return []
    from vllm.model_executor.layers import quantization

    owner = getattr(quantization, "_CUSTOMIZED_METHOD_TO_QUANT_CONFIG", {}).get("fp8")
    if owner is not None and owner is not HeteroFp8Config:
        reason = f"another plugin already replaces vLLM's fp8 config ({owner.__module__}.{owner.__qualname__})"
        _logger.warning("hetero-vllm: not routing fp8 checkpoints: %s", reason)
        for name in (LINEAR_SITE, MOE_SITE):
            report.not_routed(name, reason)
        return []
    quantization.register_quantization_config("fp8")(HeteroFp8Config)
    return [LINEAR_SITE, MOE_SITE]
