"""CustomOp replacements: RMSNorm (with the fused residual add), SiluAndMul and the rotary embedding family.

Each replacement subclasses the vLLM class it replaces (same weights, buffers and
``forward_native``) and sends every platform's forward to hetero's op through
``torch.ops.hetero.*``. An instance whose configuration hetero's op does not
cover keeps ``forward_native`` and is listed in the report as not routed.
"""

from __future__ import annotations

import torch

from hetero_vllm import report, torch_ops  # noqa: F401  (torch_ops defines torch.ops.hetero.*)
from hetero_vllm._oot import AlwaysOn, dispatch_to, register_oot

__all__ = ["ROTARY_CLASSES", "own_forward", "register"]

#: Rotary classes routed when they keep the base class's forward: they differ only in how
#: the cos/sin cache is computed, which vLLM still does; hetero applies it.
ROTARY_CLASSES = (
    "RotaryEmbedding",
    "Llama3RotaryEmbedding",
    "LinearScalingRotaryEmbedding",
    "NTKScalingRotaryEmbedding",
    "DynamicNTKScalingRotaryEmbedding",
    "DynamicNTKAlphaRotaryEmbedding",
    "YaRNScalingRotaryEmbedding",
    "Gemma4RotaryEmbedding",
)
_FORWARDS = ("forward", "forward_native", "forward_cpu", "forward_cuda", "forward_oot", "forward_static")


def _rms_norm_class(base: type) -> type:
    class HeteroRMSNorm(AlwaysOn, base):  # type: ignore[misc, valid-type]
        """vLLM RMSNorm on hetero ``rms_norm`` (``residual=`` for the fused add)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.hetero_ok = self.has_weight and self.variance_size_override is None
            if self.hetero_ok:
                self.hetero_site = report.site("RMSNorm")
            else:
                self.hetero_reason = "hetero rms_norm needs a full weight (no weight, or var_hidden_size)"

        def forward_hetero(self, x: torch.Tensor, residual: torch.Tensor | None = None):
            if not self.hetero_ok:
                return self.forward_native(x, residual)
            if residual is None:
                return torch.ops.hetero.rms_norm(x, self.weight, self.variance_epsilon, self.hetero_site)
            eps, site = self.variance_epsilon, self.hetero_site
            return torch.ops.hetero.fused_add_rms_norm(x, residual, self.weight, eps, site)

    return dispatch_to(HeteroRMSNorm, "forward_hetero")


def _silu_and_mul_class(base: type) -> type:
    class HeteroSiluAndMul(AlwaysOn, base):  # type: ignore[misc, valid-type]
        """vLLM SiluAndMul on hetero ``silu_and_mul``."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.hetero_site = report.site("SiluAndMul")

        def forward_hetero(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.hetero.silu_and_mul(x, self.hetero_site)

    return dispatch_to(HeteroSiluAndMul, "forward_hetero")


def _rotary_forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None):
    """hetero ``rotary_embedding`` on vLLM's flat [T, H*D] query/key; a call without key keeps vLLM's path."""
    if key is None:
        return self.forward_native(positions, query, key)
    cache = self.cos_sin_cache
    if cache.dtype not in (torch.float32, query.dtype) or cache.device != query.device:
        cache = self._match_cos_sin_cache_dtype(query)
    positions = positions.flatten()
    tokens = positions.shape[0]
    q = query.reshape(tokens, -1, self.head_size)
    k = key.reshape(tokens, -1, self.head_size)
    q, k = torch.ops.hetero.rotary_embedding(positions, q, k, cache, self.is_neox_style, self.hetero_site)
    return q.reshape(query.shape), k.reshape(key.shape)


def _rotary_init(self, *args, **kwargs) -> None:
    super(type(self), self).__init__(*args, **kwargs)
    self.hetero_site = report.site(type(self).vllm_class_name)


def own_forward(cls: type, base: type) -> str | None:
    """The first class from ``cls`` up to ``base`` (excluded) that defines its own forward, if any."""
    for klass in cls.__mro__:
        if klass is base:
            return None
        if any(f in vars(klass) for f in _FORWARDS):
            return klass.__name__
    return None


def _rotary_classes(routes: list[str]) -> None:
    from vllm.model_executor.layers import rotary_embedding as rope

    for name in ROTARY_CLASSES:
        vllm_cls = getattr(rope, name, None)
        if vllm_cls is None:
            continue
        if own_forward(vllm_cls, rope.RotaryEmbedding) is not None:
            continue  # built, it is listed by the census as a subclass with its own forward
        methods = {"forward_hetero": _rotary_forward, "__init__": _rotary_init}
        replacement = type(f"Hetero{name}", (AlwaysOn, vllm_cls), methods)
        register_oot(vllm_cls, dispatch_to(replacement, "forward_hetero"), routes)


def register() -> list[str]:
    """Register the layer replacements; returns the vLLM class names now routed."""
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm

    routes: list[str] = []
    register_oot(RMSNorm, _rms_norm_class(RMSNorm), routes)
    register_oot(SiluAndMul, _silu_and_mul_class(SiluAndMul), routes)
    _rotary_classes(routes)
    return routes
