"""ERNIE-4.5-MoE (``ernie4_5_moe``, Baidu; ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B): GQA; a bias on q/k/v/o, on the
dense MLPs, the shared experts and the LM head when ``use_bias``; interleaved rope (pairs (2i, 2i+1)) over the
whole head.

A layer has routed experts when ``(layer + 1) % moe_layer_interval == 0`` and ``moe_layer_start_index <= layer <=
moe_layer_end_index``. Its router ``gate`` (float32, no bias) scores by softmax; ``moe_statics.e_score_correction_bias``
(``[1, E]`` in the checkpoint) only selects; the chosen scores are divided by their sum clamped below at
``moe_norm_min``. ``route`` renormalizes by the plain sum, so the layer asks it for the raw scores and divides
them itself (``NormMinFusedMoE``). ``moe_num_shared_experts`` shared experts (none when 0) are added unweighted.
The checkpoint's ``mtp_*`` tensors (the multi-token-prediction block) are ignored by name; ``moe_capacity``,
``output_router_logits`` and ``router_aux_loss_coef`` are training-only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.embedding import ParallelLMHead
from hetero.engine.layers.gqa import GQAttention, head_dim_of
from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import copy_checked, join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import (
    GATE_UP_PACKED,
    IGNORE,
    QKV_PACKED,
    DecoderForCausalLM,
    DecoderLayer,
    GatedMLP,
)
from hetero.engine.quant.config import QuantConfig
from hetero.errors import UsageError

__all__ = [
    "Ernie4_5_MoeAttention",
    "BiasedLMHead",
    "Ernie4_5_MoeSparseMoeBlock",
    "Ernie4_5_MoeDecoderLayer",
    "Ernie4_5_MoeForCausalLM",
    "NormMinFusedMoE",
    "check_config",
    "is_moe_layer",
]

#: fields Baidu's own code reads (absent from transformers' config), with the one value transformers' class computes
_FIXED = {"hidden_act": "silu", "moe_gate_act": "softmax", "moe_use_aux_free": True}
#: the multi-token-prediction block of the released checkpoints (transformers ignores every "mtp" name)
MTP_IGNORE = (r"(?:model\.)?mtp_(?:block|linear_proj|hidden_norm|emb_norm)\..*",)


def check_config(config: Any) -> None:
    """Refuse, by field name, an ERNIE-4.5-MoE config asking for what hetero does not compute: another
    activation or gate activation, no correction bias, or MoE layers at an interval below 1."""
    for name, fixed in _FIXED.items():
        got = getattr(config, name, fixed)
        if got != fixed:
            raise UsageError(f"ERNIE-4.5-MoE: {name}={got!r} is not implemented", arg=name, expected=fixed, got=got)
    if config.moe_layer_interval < 1:
        raise UsageError(
            "ERNIE-4.5-MoE: moe_layer_interval must be at least 1",
            arg="moe_layer_interval",
            expected=">= 1",
            got=config.moe_layer_interval,
        )


def is_moe_layer(config: Any, layer_idx: int) -> bool:
    """Whether layer ``layer_idx`` has routed experts (else a dense MLP of ``intermediate_size``)."""
    end = config.moe_layer_end_index
    end = config.num_hidden_layers - 1 if end == -1 else end
    return (
        (layer_idx + 1) % config.moe_layer_interval == 0
        and config.moe_layer_start_index <= layer_idx
        and layer_idx <= end
    )


class Ernie4_5_MoeAttention(GQAttention):
    """GQA with q/k/v and o_proj biased iff ``use_bias``."""

    @staticmethod
    def biases(config: Any) -> tuple[bool, bool]:
        return bool(config.use_bias), bool(config.use_bias)


class NormMinFusedMoE(FusedMoE):
    """FusedMoE whose routing weights are ``route``'s unnormalized scores divided by ``max(sum, norm_min)``
    (glue on route's outputs, in float32, on every rank's share of the tokens under EP too)."""

    def __init__(self, *args: Any, norm_min: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.routing.renormalize:
            raise ValueError("NormMinFusedMoE renormalizes itself: its Routing must have renormalize=False")
        self.norm_min = float(norm_min)

    def _routed(self, router_logits: torch.Tensor, fixed_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        weights, ids = super()._routed(router_logits, fixed_ids)
        return weights / weights.sum(dim=-1, keepdim=True).clamp(min=self.norm_min), ids


class Ernie4_5_MoeSparseMoeBlock(nn.Module):
    """Float32 router ``gate``, routed experts (``NormMinFusedMoE``), shared experts; returns their sum."""

    def __init__(self, ctx: ModelContext, config: Any, *, prefix: str = "", quant_config: QuantConfig | None = None):
        super().__init__()
        c, self.prefix = config, prefix
        self.gate = ReplicatedLinear(
            dataclasses.replace(ctx, dtype=torch.float32),
            c.hidden_size,
            c.moe_num_experts,
            prefix=join_prefix(prefix, "gate"),
            quant_config=quant_config,
        )
        self.moe_statics = nn.Module()  # registered before the experts: the bias's name is the checkpoint's
        self.experts = NormMinFusedMoE(
            ctx,
            c.moe_num_experts,
            c.hidden_size,
            c.moe_intermediate_size,
            Routing(top_k=c.moe_k, scoring="softmax", renormalize=False),
            correction_bias=True,
            norm_min=c.moe_norm_min,
            prefix=join_prefix(prefix, "experts"),
            quant_config=quant_config,
        )
        bias = self.experts.correction_bias
        what = join_prefix(prefix, "moe_statics.e_score_correction_bias")
        # one group of experts: [1, E] in the checkpoint
        bias.weight_loader = lambda p, t, shard=None: copy_checked(p.view(1, -1), t, what)
        self.moe_statics.e_score_correction_bias = bias
        self.shared_experts = None
        if c.moe_num_shared_experts:
            self.shared_experts = GatedMLP(
                ctx,
                c.hidden_size,
                c.moe_intermediate_size * c.moe_num_shared_experts,
                bias=bool(c.use_bias),
                prefix=join_prefix(prefix, "shared_experts"),
                quant_config=quant_config,
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, self.gate(x.float()))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class BiasedLMHead(ParallelLMHead):
    """The LM head plus ``bias`` [vocab], split over ranks as the weight rows are (``use_bias``)."""

    def __init__(self, ctx: ModelContext, vocab_size: int, hidden: int, *, prefix: str = ""):
        super().__init__(ctx, vocab_size, hidden, prefix=prefix)
        self.bias = nn.Parameter(ctx.empty(self.per_rank), requires_grad=False)
        self.bias.weight_loader, self.bias.shards = self.load_bias, (None,)

    def load_bias(self, param: nn.Parameter, tensor: torch.Tensor, shard: Any = None) -> None:
        if tuple(tensor.shape) != (self.vocab_size,):
            raise ValueError(f"lm_head.bias: expected ({self.vocab_size},), the checkpoint has {tuple(tensor.shape)}")
        param.data.zero_()
        copy_checked(param.data[: self.end - self.start], tensor[self.start : self.end], "lm_head.bias")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.ctx.parallel.all_gather(self._gemm(hidden, self.weight, bias=self.bias), dim=-1)
        return logits[..., : self.vocab_size]


class Ernie4_5_MoeDecoderLayer(DecoderLayer):
    attention_cls = Ernie4_5_MoeAttention
    moe_cls = Ernie4_5_MoeSparseMoeBlock
    is_moe_layer = staticmethod(is_moe_layer)

    @staticmethod
    def mlp_bias(config: Any) -> bool:
        return bool(config.use_bias)

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> RotaryEmbedding:
        """Interleaved pairs (2i, 2i+1) over the whole head."""
        return RotaryEmbedding(ctx, config, head_dim_of(config), config.max_position_embeddings, is_neox=False)


class Ernie4_5_MoeForCausalLM(DecoderForCausalLM):
    """ERNIE-4.5-MoE text models: per-expert checkpoint tensors (as released and as transformers writes them)
    or every expert fused; the MTP block ignored; with ``use_bias`` the LM head has a bias too."""

    layer_cls = Ernie4_5_MoeDecoderLayer
    mapping = WeightMapping(
        packed=QKV_PACKED + GATE_UP_PACKED,
        experts=WeightMapping.stacked_experts() + WeightMapping.fused_experts(),
        ignore=IGNORE + MTP_IGNORE,
    )

    def __init__(self, hf_config: Any, ctx: ModelContext, *, quant_config: QuantConfig | None = None):
        check_config(hf_config)
        super().__init__(hf_config, ctx, quant_config=quant_config)
        if hf_config.use_bias:
            self.lm_head = BiasedLMHead(ctx, hf_config.vocab_size, hf_config.hidden_size, prefix="lm_head")
            if hf_config.tie_word_embeddings:
                self.lm_head.tie(self.model.embed_tokens)
