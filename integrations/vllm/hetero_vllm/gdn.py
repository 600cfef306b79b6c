"""QwenGatedDeltaNetAttention (Qwen3-Next, Qwen3.5 linear attention) on hetero ``causal_conv1d`` and
``gated_delta_rule`` over vLLM's own mamba state cache.

vLLM's layer is a ``PluggableLayer``, swapped by class name for
``HeteroQwenGatedDeltaNetAttention``, a subclass. A routed instance keeps vLLM's
input projections (``in_proj_qkvz``, ``in_proj_ba``, the Qwen3-Next head
interleaving) and its output projection (``RMSNormGated`` and ``out_proj``); the
core between them is one opaque op, ``hetero::gdn_attention_core`` (``_gdn_op``),
which reads the layer's ``GDNAttentionMetadata`` and state cache as vLLM's own CPU
core op does. vLLM's GDN metadata builder, state cache allocation and prefix-cache
state copies are unchanged.

An instance keeps vLLM's path, with the reason in the report, when hetero's ops
do not cover its configuration: an SSM state other than float32 (hetero's delta
rule keeps a float32 state), a conv state of another dtype than the activations,
speculative decoding (the wide conv buffer and per-token state slots are not
mapped), LoRA, a conv activation other than SiLU, or a platform other than CPU
(vLLM's GPU GDN core is a CUDA-graph splitting op, and hetero's op is not one).
``-QwenGatedDeltaNetAttention`` in ``compilation_config.custom_ops`` turns the route off.
"""

from __future__ import annotations

import torch

from hetero_vllm import _gdn_op, report  # noqa: F401  (_gdn_op defines torch.ops.hetero.gdn_attention_core)
from hetero_vllm._oot import AlwaysOn, register_oot

__all__ = ["register", "unsupported"]

_NAME = "QwenGatedDeltaNetAttention"


def unsupported(layer, vllm_config) -> tuple[str, str] | None:
    """(short tag, reason) why hetero cannot serve this built GDN layer, or None when it can."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "platform", (
            f"routed on CPU platforms only; on {type(current_platform).__name__} vLLM's GDN core is a CUDA-graph "
            "splitting op and hetero::gdn_attention_core is not one"
        )
    conv_dtype, ssm_dtype = layer.get_state_dtype()
    if ssm_dtype != torch.float32:
        return f"ssm state {ssm_dtype}", (
            f"the SSM state cache is {ssm_dtype} (mamba_ssm_cache_dtype={layer.cache_config.mamba_ssm_cache_dtype!r}); "
            "hetero gated_delta_rule keeps a float32 state"
        )
    if conv_dtype != layer.model_config.dtype:
        return f"conv state {conv_dtype}", (
            f"the conv state cache is {conv_dtype} and the activations {layer.model_config.dtype}; hetero "
            "causal_conv1d keeps the state in the activations' dtype (mamba_cache_dtype='auto')"
        )
    if layer.num_spec or vllm_config.speculative_config is not None:
        return "speculative decoding", "speculative decoding (wide conv buffer, per-token state slots) is not mapped"
    if vllm_config.lora_config is not None or hasattr(layer, "in_proj_qkv"):
        return "LoRA", "LoRA splits the input projections; not routed"
    if layer.activation not in ("silu", "swish"):
        return f"activation {layer.activation}", f"conv activation {layer.activation!r}; hetero causal_conv1d: SiLU"
    return None


def _layer_class(base: type) -> type:
    class HeteroQwenGatedDeltaNetAttention(AlwaysOn, base):  # type: ignore[misc, valid-type]
        """vLLM's QwenGatedDeltaNetAttention with its conv1d and delta rule on hetero (``hetero_site`` set),
        or, where hetero does not cover it, vLLM's own path (``hetero_reason`` set)."""

        hetero_site: str | None = None

        def __init__(self, config, vllm_config, *args, **kwargs) -> None:
            super().__init__(config, vllm_config, *args, **kwargs)
            seen = vllm_config.compilation_config
            if not type(self).enabled():  # reports the opt-out itself
                self.hetero_reason = "turned off by compilation_config.custom_ops"
                seen.disabled_custom_ops.update([_NAME])
                return
            seen.enabled_custom_ops.update([_NAME])  # vLLM warns about a custom_ops entry naming no built op
            refused = unsupported(self, vllm_config)
            if refused is not None:
                tag, self.hetero_reason = refused
                report.not_routed(f"{_NAME}[{tag}]", self.hetero_reason)
                return
            self.hetero_site = report.site(_NAME)

        def forward_cpu(self, hidden_states: torch.Tensor) -> torch.Tensor:
            if self.hetero_site is None:
                return super().forward_cpu(hidden_states)
            mixed_qkv, z, b, a = self._hetero_inputs(hidden_states)
            core_attn_out = hidden_states.new_zeros(hidden_states.shape[0], *z.shape[1:])
            torch.ops.hetero.gdn_attention_core(mixed_qkv, b, a, core_attn_out, self.prefix, self.hetero_site)
            return self._output_projection(core_attn_out, z)

        def _hetero_inputs(self, hidden_states: torch.Tensor):
            """vLLM's projections, split into (mixed_qkv [T, q|k|v], z [T, HV, V], b [T, HV], a [T, HV])."""
            qkvz, _ = self.in_proj_qkvz(hidden_states)
            ba, _ = self.in_proj_ba(hidden_states)
            if self.gqa_interleaved_layout:  # Qwen3-Next: q, k, v, z interleaved per key-head group
                q, k, v, z, b, a = self.fix_query_key_value_ordering(qkvz, ba)
                return torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=-1), z, b, a
            qkv_size = (2 * self.key_dim + self.value_dim) // self.tp_size
            mixed_qkv, z = qkvz.split([qkv_size, self.value_dim // self.tp_size], dim=-1)
            b, a = self.split_ba(ba)
            return mixed_qkv, z.unflatten(-1, (-1, self.head_v_dim)), b, a

    return HeteroQwenGatedDeltaNetAttention


def register() -> list[str]:
    """Register the GDN layer replacement; returns the vLLM class names now routed."""
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

    routes: list[str] = []
    register_oot(QwenGatedDeltaNetAttention, _layer_class(QwenGatedDeltaNetAttention), routes)
    return routes
