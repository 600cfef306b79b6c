"""Kimi-Linear (``kimi_linear``, Moonshot): KDA linear attention and NoPE MLA by ``layer_types``, V3 routing.

Mirrors transformers' modeling_kimi_linear.py:

- token mixer ``self_attn``: a ``KimiDeltaAttention`` (``layers/kda.py``) where ``layer_types[i]`` is
  "linear_attention", an MLA (``layers/mla.py``) where it is "full_attention" (the release's 3:1; transformers
  reads ``layer_types``, from ``linear_attn_config``'s 1-based ``kda_layers`` / ``full_attn_layers``). The MLA
  rotates neither q_pe nor k_pe (no rope table at all; ``mla_use_nope``) and scales by ``qk_head_dim ** -0.5``;
  its latent norms keep transformers' default eps 1e-6;
- MLP: ``mlp_layer_types[i]`` "dense" (SwiGLU of ``intermediate_size``; by default the first
  ``first_k_dense_replace`` layers) or "sparse": DeepSeek-V3's block (``deepseek.DeepseekMoE``): float32 router
  ``gate``, sigmoid scores whose ``e_score_correction_bias`` only selects, top-2-sum groups (``num_expert_group``,
  ``topk_group``), renormalized when ``moe_renormalize``, times ``routed_scaling_factor``, plus
  ``num_shared_experts`` shared experts;
- plain pre-norm RMSNorms (``rms_norm_eps``).

The checkpoint is the release's layout (what transformers' ``save_pretrained`` writes back): the MLPs under
``block_sparse_moe`` (renamed ``mlp``), per-expert ``w1`` / ``w3`` / ``w2`` (gate, up, down), the three short
convolutions ``q_conv1d`` / ``k_conv1d`` / ``v_conv1d`` and the forget gate's tensors under ``self_attn``. MTP
layers past ``num_hidden_layers`` are ignored. Config fields transformers does not read, and values hetero does
not compute, are refused by name (``check_config``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NoReturn

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.kda import CONV_PACKED, KimiDeltaAttention
from hetero.engine.layers.mla import MLAttention
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import GATE_UP_PACKED, IGNORE, DecoderForCausalLM, DecoderLayer
from hetero.engine.models.deepseek import DeepseekMoE, mtp_ignore
from hetero.engine.quant.config import QuantConfig
from hetero.errors import UsageError

__all__ = ["NoPEMLAttention", "KimiLinearDecoderLayer", "KimiLinearForCausalLM", "check_config", "kimi_moe"]

LAYER_TYPES = ("linear_attention", "full_attention")
MLP_TYPES = ("dense", "sparse")
#: fields of the release's config that transformers' class does not read, each with the one value under which
#: transformers computes what the checkpoint means; any other value is refused
_RELEASE_FIXED = {
    "mla_use_nope": True,
    "mla_use_output_gate": False,
    "moe_router_activation_func": "sigmoid",
    "moe_layer_freq": 1,
}
#: the keys of ``linear_attn_config`` transformers reads (any other, e.g. ``gate_lower_bound``, is refused)
_LINEAR_ATTN_KEYS = ("kda_layers", "full_attn_layers", "num_heads", "head_dim", "short_conv_kernel_size")


def _refuse(name: str, expected: Any, got: Any, why: str = "is not implemented") -> NoReturn:
    raise UsageError(f"Kimi-Linear: {name}={got!r} {why}", arg=name, expected=expected, got=got)


def check_config(config: Any) -> None:
    """Refuse, by field name, a Kimi-Linear config asking for what hetero does not compute."""
    if config.hidden_act != "silu":  # the MLPs', the experts' and the short convolutions' activation
        _refuse("hidden_act", "silu", config.hidden_act)
    if config.num_key_value_heads != config.num_attention_heads:
        _refuse(
            "num_key_value_heads",
            config.num_attention_heads,
            config.num_key_value_heads,
            "is not MLA (one latent, every head)",
        )
    if int(config.n_shared_experts) < 1:
        _refuse("num_shared_experts", ">= 1", config.n_shared_experts)
    for name, fixed in _RELEASE_FIXED.items():
        got = getattr(config, name, fixed)
        if got != fixed:
            _refuse(name, fixed, got)
    if getattr(config, "use_grouped_topk", True) is False and int(config.n_group or 1) > 1:
        _refuse("use_grouped_topk", "true (transformers always routes by groups)", False)
    for key, value in (getattr(config, "linear_attn_config", None) or {}).items():
        if key not in _LINEAR_ATTN_KEYS:
            _refuse(f"linear_attn_config.{key}", f"only {', '.join(_LINEAR_ATTN_KEYS)}", value)
    for name, kinds in (("layer_types", LAYER_TYPES), ("mlp_layer_types", MLP_TYPES)):
        got = list(getattr(config, name))
        if len(got) != config.num_hidden_layers or not set(got) <= set(kinds):
            _refuse(name, f"{config.num_hidden_layers} entries of {' / '.join(kinds)}", got)


class _NoRotary(nn.Module):
    """Kimi-Linear's MLA rope: none; q_pe and k_pe pass unrotated."""

    def twin(self, ctx: ModelContext) -> _NoRotary:
        return _NoRotary()

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k


class NoPEMLAttention(MLAttention):
    """MLA without rope (the ``rotary`` given is not used) and softmax scale ``qk_head_dim ** -0.5`` whatever the
    config's rope says."""

    def __init__(self, ctx: ModelContext, hf_config: Any, layer_idx: int, rotary: Any, **kw: Any):
        super().__init__(ctx, hf_config, layer_idx, _NoRotary(), **kw)
        self.scale = self.qk_dim**-0.5


def kimi_moe(ctx: ModelContext, config: Any, *, prefix: str = "", quant_config: QuantConfig | None = None):
    """DeepSeek-V3's MoE block over Kimi's ``num_experts`` routed experts."""
    return DeepseekMoE(ctx, config, v3=True, num_experts=config.num_experts, prefix=prefix, quant_config=quant_config)


def is_sparse_layer(config: Any, layer_idx: int) -> bool:
    """``mlp_layer_types[layer_idx] == "sparse"`` (checked by ``check_config``)."""
    return config.mlp_layer_types[layer_idx] == "sparse"


class KimiLinearDecoderLayer(DecoderLayer):
    """KDA or NoPE MLA (``self_attn``, by ``layer_types``), then a dense MLP or the V3 MoE (``mlp_layer_types``)."""

    attention_cls = NoPEMLAttention
    moe_cls = staticmethod(kimi_moe)
    is_moe_layer = staticmethod(is_sparse_layer)

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> Any:
        """No rope anywhere: KDA has none and the MLA's is NoPE."""
        return _NoRotary()

    def make_mixer(
        self,
        ctx: ModelContext,
        config: Any,
        layer_idx: int,
        rotary: Any,
        *,
        prefix: str,
        quant_config: QuantConfig | None,
    ) -> tuple[str, nn.Module]:
        if config.layer_types[layer_idx] == "linear_attention":
            attn = KimiDeltaAttention(ctx, config, prefix=join_prefix(prefix, "self_attn"), quant_config=quant_config)
            return "self_attn", attn
        return super().make_mixer(ctx, config, layer_idx, rotary, prefix=prefix, quant_config=quant_config)


#: the release's per-expert tensors ``experts.E.w1`` / ``w3`` / ``w2`` (gate, up, down) stacked into w13 / w2
_EXPERTS = tuple(
    (
        rf"model\.layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<expert>\d+)\.{w}\.(?P<suffix>\w+)",
        f"model.layers.{{layer}}.mlp.experts.{'w2' if proj == 'down' else 'w13'}",
        proj,
    )
    for w, proj in (("w1", "gate"), ("w3", "up"), ("w2", "down"))
)


class KimiLinearForCausalLM(DecoderForCausalLM):
    """Kimi-Linear (Kimi-Linear-48B-A3B and its tiny versions); an instance's mapping also ignores MTP layers."""

    layer_cls = KimiLinearDecoderLayer
    mapping = WeightMapping(
        packed=GATE_UP_PACKED + CONV_PACKED,
        experts=_EXPERTS,
        ignore=IGNORE,
        renames=((r"\.block_sparse_moe\.", ".mlp."),),
    )

    def __init__(self, hf_config: Any, ctx: ModelContext, *, quant_config: QuantConfig | None = None):
        check_config(hf_config)
        super().__init__(hf_config, ctx, quant_config=quant_config)

    def weight_mapping(self, hf_config: Any) -> WeightMapping:
        return dataclasses.replace(type(self).mapping, ignore=IGNORE + mtp_ignore(hf_config))
