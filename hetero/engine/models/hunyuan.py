"""Hunyuan V1 (Tencent), dense and MoE: Qwen3's attention with its per-head q/k RMSNorms named
``query_layernorm`` / ``key_layernorm`` and applied after rope, not before; rope "dynamic" with
``alpha`` is a fixed NTK-alpha table (``layers/rotary.py``). The MoE model (Hunyuan-A13B) routes
every layer by a float32 softmax router and adds a shared MLP. The rest is the shared decoder."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.gqa import head_dim_of
from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import (
    GATE_UP_PACKED,
    IGNORE,
    QKV_PACKED,
    DecoderForCausalLM,
    DecoderLayer,
    GatedMLP,
)
from hetero.engine.models.qwen3 import Qwen3Attention
from hetero.engine.quant.config import QuantConfig
from hetero.errors import UsageError

__all__ = [
    "HunYuanDenseV1Attention",
    "HunYuanDenseV1DecoderLayer",
    "HunYuanDenseV1ForCausalLM",
    "HunYuanMoEV1SparseMoeBlock",
    "HunYuanMoEV1DecoderLayer",
    "HunYuanMoEV1ForCausalLM",
    "check_v1_moe_config",
    "per_layer",
]


class HunYuanDenseV1Attention(Qwen3Attention):
    norm_names = ("query_layernorm", "key_layernorm")
    norms_after_rope = True


class HunYuanDenseV1DecoderLayer(DecoderLayer):
    attention_cls = HunYuanDenseV1Attention

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> RotaryEmbedding:
        """NeoX pairs over the whole head; "dynamic" with ``alpha`` is the fixed NTK-alpha table."""
        return RotaryEmbedding(ctx, config, head_dim_of(config), config.max_position_embeddings, ntk_alpha=True)


class HunYuanDenseV1ForCausalLM(DecoderForCausalLM):
    """Hunyuan V1 dense models (0.5B-7B, HunyuanOCR's text backbone); Qwen-style parameter names."""

    layer_cls = HunYuanDenseV1DecoderLayer


def per_layer(config: Any, name: str, layer_idx: int) -> int:
    """``config.<name>`` for layer ``layer_idx``: an int for every layer, or a list with one per layer."""
    value = getattr(config, name)
    if isinstance(value, (list, tuple)):
        if len(value) != config.num_hidden_layers:
            raise UsageError(
                f"{name} has {len(value)} entries for {config.num_hidden_layers} layers",
                arg=name,
                expected=f"an int or a list of num_hidden_layers ({config.num_hidden_layers}) ints",
                got=value,
            )
        value = value[layer_idx]
    return int(value)


#: fields of Hunyuan V1 MoE checkpoints (the original remote-code config) that transformers' class does not read,
#: with the one value under which its computation is what the checkpoint meant; any other value is refused
_V1_MOE_FIXED = {"use_cla": False, "use_mixed_mlp_moe": True, "use_qk_norm": True, "moe_layer_num_skipped": 0}


def check_v1_moe_config(config: Any) -> None:
    """Refuse, by field name, a Hunyuan V1 MoE config asking for what neither transformers nor hetero computes:
    cross-layer attention, no shared MLP, no QK norms, skipped MoE layers, a shared MLP count other than one
    or expert widths other than ``intermediate_size`` (both MLPs are ``intermediate_size`` wide)."""
    for name, fixed in _V1_MOE_FIXED.items():
        got = getattr(config, name, fixed)
        if got != fixed:
            raise UsageError(f"Hunyuan V1 MoE: {name}={got!r} is not implemented", arg=name, expected=fixed, got=got)
    for name, want in (("num_shared_expert", 1), ("moe_intermediate_size", config.intermediate_size)):
        got = getattr(config, name, None)
        values = got if isinstance(got, (list, tuple)) else [got]
        if got is not None and any(v != want for v in values):
            raise UsageError(
                f"Hunyuan V1 MoE: {name}={got!r} is not implemented (experts and the shared MLP are one "
                "intermediate_size wide, with one shared MLP)",
                arg=name,
                expected=want,
                got=got,
            )


class HunYuanMoEV1Router(nn.Module):
    """``wg``: the float32 router weight (no bias); the logits are of the hidden state upcast to float32."""

    def __init__(self, ctx: ModelContext, hidden: int, experts: int, *, prefix: str, quant_config: QuantConfig | None):
        super().__init__()
        self.prefix = prefix
        fp32 = dataclasses.replace(ctx, dtype=torch.float32)
        self.wg = ReplicatedLinear(fp32, hidden, experts, prefix=join_prefix(prefix, "wg"), quant_config=quant_config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wg(x.float())


class HunYuanMoEV1SparseMoeBlock(nn.Module):
    """Softmax over the float32 router logits, top ``moe_topk[layer]``, renormalized; plus ``shared_mlp``,
    unweighted. Experts and the shared MLP are both ``intermediate_size`` wide."""

    def __init__(
        self, ctx: ModelContext, config: Any, layer_idx: int, *, prefix: str, quant_config: QuantConfig | None
    ):
        super().__init__()
        self.prefix = prefix
        experts = per_layer(config, "num_experts", layer_idx)
        h, inter = config.hidden_size, config.intermediate_size
        self.gate = HunYuanMoEV1Router(ctx, h, experts, prefix=join_prefix(prefix, "gate"), quant_config=quant_config)
        routing = Routing(top_k=per_layer(config, "moe_topk", layer_idx), scoring="softmax", renormalize=True)
        self.experts = FusedMoE(
            ctx, experts, h, inter, routing, prefix=join_prefix(prefix, "experts"), quant_config=quant_config
        )
        self.shared_mlp = GatedMLP(ctx, h, inter, prefix=join_prefix(prefix, "shared_mlp"), quant_config=quant_config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.gate(x)) + self.shared_mlp(x)


class HunYuanMoEV1DecoderLayer(HunYuanDenseV1DecoderLayer):
    """Hunyuan V1 attention; every layer's MLP is the sparse block (its width and top-k may vary by layer)."""

    def make_mlp(
        self, ctx: ModelContext, config: Any, layer_idx: int, *, prefix: str, quant_config: QuantConfig | None
    ) -> nn.Module:
        return HunYuanMoEV1SparseMoeBlock(ctx, config, layer_idx, prefix=prefix, quant_config=quant_config)


class HunYuanMoEV1ForCausalLM(DecoderForCausalLM):
    """Hunyuan-A13B (``hunyuan_v1_moe``): per-expert checkpoint tensors stacked into FusedMoE."""

    layer_cls = HunYuanMoEV1DecoderLayer
    mapping = WeightMapping(packed=QKV_PACKED + GATE_UP_PACKED, experts=WeightMapping.stacked_experts(), ignore=IGNORE)

    def __init__(self, hf_config: Any, ctx: ModelContext, *, quant_config: QuantConfig | None = None):
        check_v1_moe_config(hf_config)
        super().__init__(hf_config, ctx, quant_config=quant_config)
