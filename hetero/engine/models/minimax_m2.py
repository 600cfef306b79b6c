"""MiniMax-M2 (``MiniMaxM2ForCausalLM``, transformers ``minimax_m2``): GQA attention whose q and k RMSNorms span
the whole projection (all heads at once, one weight of ``Hq * D`` / ``Hkv * D``), applied before a partial NeoX
rope (``rotary_dim`` = ``head_dim * partial_rotary_factor`` leading dims); routed experts in every layer, no
shared expert.

Routing, as transformers' ``MiniMaxM2TopKRouter``: logits ``gate(x)`` in the model's dtype, sigmoid scores,
experts chosen by score plus ``e_score_correction_bias`` (selection only), the chosen scores renormalized, no
scale. Experts are ``intermediate_size`` wide.

Under tensor parallelism a rank holds only its heads' part of q and k, so the norm's mean square needs every
rank's sum of squares: one explicit ``all_reduce`` of a [T, 2] float32 tensor per layer (q's and k's), then the
normalization in glue (``docs/design-notes.md``). One rank alone uses the ``rms_norm`` op over the whole width.

Checkpoints: the release's names (``block_sparse_moe``, experts ``w1``/``w3``/``w2``) and transformers' own
(``mlp``, per-expert ``gate/up/down_proj`` or fused ``gate_up_proj``/``down_proj``). The MTP modules
(``num_mtp_modules`` layers past ``num_hidden_layers``) are ignored. Fields of the release's config that
transformers' class does not read are accepted only at the value under which its computation is the model's
(``check_config``); ``mlp_intermediate_size`` (no layer has a dense MLP) and ``router_jitter_noise`` (training
only) change nothing at inference.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.gqa import GQAttention, head_dim_of
from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import copy_checked, join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import IGNORE, QKV_PACKED, DecoderForCausalLM, DecoderLayer
from hetero.engine.quant.config import QuantConfig
from hetero.errors import UsageError

__all__ = [
    "MiniMaxM2Attention",
    "MiniMaxM2SparseMoeBlock",
    "MiniMaxM2DecoderLayer",
    "MiniMaxM2ForCausalLM",
    "check_config",
    "rotary_dim_of",
]

#: fields of the release's config (its remote code) that transformers' class does not read (and ``hidden_act``),
#: with the values under which that class computes what the checkpoint means; an absent field is the last value
_FIXED: dict[str, tuple[Any, ...]] = {
    "use_qk_norm": (True,),
    "qk_norm_type": ("per_layer",),  # one norm over all heads; "per_head" would be Qwen3's
    "scoring_func": ("sigmoid",),
    "use_routing_bias": (True,),
    "shared_intermediate_size": (0, None),
    "routed_scaling_factor": (1.0, None),
    "num_expert_group": (1, None),
    "topk_group": (1, None),
    "layernorm_full_attention_beta": (1.0,),
    "layernorm_mlp_beta": (1.0,),
    "sliding_window": (None,),
    "attn_window_size": (None,),
    "hidden_act": ("silu",),
}


def rotary_dim_of(config: Any) -> int:
    """The rotated leading dims of a head: ``head_dim * rope_parameters.partial_rotary_factor`` (transformers'
    rounding), which must agree with the release's ``rotary_dim`` when the config has it."""
    params = getattr(config, "rope_parameters", None) or {}
    rot = int(head_dim_of(config) * float(params.get("partial_rotary_factor", 1.0)))
    given = getattr(config, "rotary_dim", None)
    if given is not None and int(given) != rot:
        raise UsageError(
            f"MiniMax-M2: rotary_dim={given} disagrees with head_dim * partial_rotary_factor = {rot}",
            arg="rotary_dim",
            expected=rot,
            got=given,
        )
    return rot


def check_config(config: Any) -> None:
    """Refuse, by field name, a MiniMax-M2 config asking for what hetero does not compute (see ``_FIXED``;
    ``attn_type_list`` must mark every layer softmax attention, 1: MiniMax-01's lightning layers are not here)."""
    for name, allowed in _FIXED.items():
        got = getattr(config, name, allowed[-1])
        if got not in allowed:
            raise UsageError(f"MiniMax-M2: {name}={got!r} is not implemented", arg=name, expected=allowed[0], got=got)
    kinds = getattr(config, "attn_type_list", None)
    if kinds is not None and any(int(k) != 1 for k in kinds):
        raise UsageError(
            "MiniMax-M2: attn_type_list marks linear-attention layers (0), which are not implemented",
            arg="attn_type_list",
            expected="1 for every layer",
            got=kinds,
        )
    rotary_dim_of(config)


class _AllHeadsNorm(RMSNorm):
    """The RMSNorm weight over a whole projection, this rank's ``width`` of it: part ``index`` of ``count`` equal
    parts of the checkpoint's (``QKVParallelLinear.rank_part``: a replicated KV head's rank loads that head's)."""

    def __init__(self, ctx: ModelContext, width: int, eps: float, part: tuple[int, int], *, prefix: str):
        super().__init__(ctx, width, eps, prefix=prefix)
        index, count = part

        def load(p: nn.Parameter, tensor: torch.Tensor, shard: object = None) -> None:
            if tuple(tensor.shape) != (width * count,):
                raise ValueError(
                    f"{prefix}: expected shape ({width * count},), the checkpoint has {tuple(tensor.shape)}"
                )
            copy_checked(p, tensor.narrow(0, index * width, width), prefix)

        self.weight.weight_loader = load


class MiniMaxM2Attention(GQAttention):
    """GQA attention with q/k RMSNorms over all heads before rope, summed over the ranks under TP."""

    def __init__(
        self,
        ctx: ModelContext,
        config: Any,
        layer_idx: int,
        rotary: RotaryEmbedding,
        *,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__(ctx, config, layer_idx, rotary, prefix=prefix, quant_config=quant_config)
        self.parallel, self.eps = ctx.parallel, float(config.rms_norm_eps)
        qkv = self.qkv_proj
        self.q_norm = _AllHeadsNorm(
            ctx, self.q_size, self.eps, qkv.rank_part("q"), prefix=join_prefix(prefix, "q_norm")
        )
        self.k_norm = _AllHeadsNorm(
            ctx, self.kv_size, self.eps, qkv.rank_part("k"), prefix=join_prefix(prefix, "k_norm")
        )

    def qk_transform(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = q.shape[0]
        q, k = q.reshape(tokens, -1), k.reshape(tokens, -1)
        if self.parallel.size == 1:
            q, k = self.q_norm(q), self.k_norm(k)
        else:
            # every rank's sum of squares: a replicated KV head is counted on each of its R/Hkv ranks, so the mean
            # divides by R * (this rank's width) for q and k alike
            sums = torch.stack([q.float().square().sum(-1), k.float().square().sum(-1)], dim=-1)
            sums, ranks = self.parallel.all_reduce(sums), self.parallel.size
            q_scale = torch.rsqrt(sums[:, :1] / (ranks * q.shape[1]) + self.eps)
            k_scale = torch.rsqrt(sums[:, 1:] / (ranks * k.shape[1]) + self.eps)
            q = (q.float() * q_scale).to(q.dtype) * self.q_norm.weight
            k = (k.float() * k_scale).to(k.dtype) * self.k_norm.weight
        return q.view(tokens, self.num_heads, self.head_dim), k.view(tokens, self.num_kv_heads, self.head_dim)


class MiniMaxM2SparseMoeBlock(nn.Module):
    """``gate`` (the router, model dtype), experts of ``intermediate_size``; the correction bias is registered
    under ``e_score_correction_bias``, the checkpoint's name."""

    def __init__(self, ctx: ModelContext, config: Any, *, prefix: str = "", quant_config: QuantConfig | None = None):
        super().__init__()
        c, self.prefix = config, prefix
        self.gate = ReplicatedLinear(
            ctx, c.hidden_size, c.num_local_experts, prefix=join_prefix(prefix, "gate"), quant_config=quant_config
        )
        self.experts = FusedMoE(
            ctx,
            c.num_local_experts,
            c.hidden_size,
            c.intermediate_size,
            Routing(top_k=c.num_experts_per_tok, scoring="sigmoid", renormalize=True),
            correction_bias=True,
            prefix=join_prefix(prefix, "experts"),
            quant_config=quant_config,
        )
        self.e_score_correction_bias = self.experts.correction_bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.gate(x))


class MiniMaxM2DecoderLayer(DecoderLayer):
    attention_cls = MiniMaxM2Attention
    moe_cls = MiniMaxM2SparseMoeBlock

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> RotaryEmbedding:
        """NeoX pairs over the leading ``rotary_dim_of(config)`` dims of a head."""
        return RotaryEmbedding(ctx, config, rotary_dim_of(config), config.max_position_embeddings, is_neox=True)


#: the release's names -> transformers' (block_sparse_moe -> mlp; Mixtral's w1/w3/w2 -> gate/up/down_proj)
RELEASE_NAMES = (
    (r"\.block_sparse_moe\.", ".mlp."),
    (r"\.experts\.(\d+)\.w1\.", r".experts.\1.gate_proj."),
    (r"\.experts\.(\d+)\.w3\.", r".experts.\1.up_proj."),
    (r"\.experts\.(\d+)\.w2\.", r".experts.\1.down_proj."),
)


class MiniMaxM2ForCausalLM(DecoderForCausalLM):
    """MiniMax-M2 and checkpoints of its architecture; an instance's mapping ignores its MTP layers."""

    layer_cls = MiniMaxM2DecoderLayer
    mapping = WeightMapping(
        packed=QKV_PACKED,
        experts=WeightMapping.stacked_experts() + WeightMapping.fused_experts(),
        ignore=IGNORE,
        renames=RELEASE_NAMES,
    )

    def __init__(self, hf_config: Any, ctx: ModelContext, *, quant_config: QuantConfig | None = None):
        check_config(hf_config)
        super().__init__(hf_config, ctx, quant_config=quant_config)

    def weight_mapping(self, hf_config: Any) -> WeightMapping:
        n, mtp = hf_config.num_hidden_layers, int(getattr(hf_config, "num_mtp_modules", 0) or 0)
        extra = tuple(rf"model\.layers\.{i}\..*" for i in range(n, n + mtp))
        return dataclasses.replace(type(self).mapping, ignore=IGNORE + extra)
