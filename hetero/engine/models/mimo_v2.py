"""MiMo-V2-Flash (``MiMoV2FlashForCausalLM``, transformers ``mimo_v2_flash``): sliding-window and full attention
layers by ``layer_types``, DeepSeek-V3 routing without shared experts, a dense first layer by ``mlp_layer_types``.

As transformers' ``MiMoV2FlashAttention``:

- a "sliding_attention" layer keeps ``sliding_window`` keys (``sliding_window_of``), has twice the config's
  ``num_key_value_heads`` and per-head sink logits (the release's ``attention_sink_bias``); a "full_attention"
  layer has ``num_key_value_heads`` and no sinks. Each layer's cache entries are its own (``Attention``'s), so the
  two kinds of layer keep KV heads of their own count;
- q/k heads are ``head_dim`` wide, v heads ``v_head_dim`` (192 / 128 in the release): ``paged_attention`` with
  Dv < D, scale ``head_dim ** -0.5``; v is multiplied by ``attention_value_scale`` before it is cached;
- NeoX rope on the leading ``int(head_dim * partial_rotary_factor)`` dims, with each layer type's own
  ``rope_parameters`` (the release: theta 5e6 for full layers, 1e4 for sliding ones);
- q/k/v biased when ``attention_bias``, o_proj never.

Sparse layers (``mlp_layer_types`` "sparse") route like DeepSeek-V3 (float32 router ``mlp.gate``, sigmoid,
``e_score_correction_bias`` selects only, ``topk_group`` of ``n_group`` groups, renormalized when
``norm_topk_prob``, times ``routed_scaling_factor``). The MTP modules (``model.mtp.*``, transformers' rule) are
ignored. The release's own config fields are checked against what transformers derives (``check_config``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.gqa import GQAttention, head_dim_of
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import head_param, join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import GATE_UP_PACKED, IGNORE, QKV_PACKED, DecoderForCausalLM, DecoderLayer
from hetero.engine.models.deepseek import DeepseekMoE
from hetero.engine.models.hy_v3 import is_sparse_layer
from hetero.engine.quant.config import QuantConfig
from hetero.errors import UsageError

__all__ = [
    "MiMoV2FullAttention",
    "MiMoV2SlidingAttention",
    "MiMoV2DecoderLayer",
    "MiMoV2FlashForCausalLM",
    "LayerTypeRopes",
    "check_config",
    "rotary_dim_of",
]

LAYER_TYPES = ("full_attention", "sliding_attention")


def rotary_dim_of(config: Any, kind: str) -> int:
    """The rotated dims of a ``kind`` layer's heads: ``int(head_dim * partial_rotary_factor)``, the factor 0.334
    when a "default" rope leaves it out (transformers' MiMo rope; its other rope types default to 1)."""
    params = config.rope_parameters[kind]
    factor = params.get("partial_rotary_factor", 0.334 if params.get("rope_type", "default") == "default" else 1.0)
    return int(head_dim_of(config) * float(factor))


def _release_fields(c: Any) -> dict[str, tuple[Any, ...]]:
    """The release config's fields transformers does not read (and ``hidden_act``) -> the values under which
    its class computes what they say (hybrid_layer_pattern 1 = sliding, moe_layer_freq 1 = routed experts)."""
    types, rope = c.layer_types, c.rope_parameters
    full, sliding = rope.get("full_attention", {}), rope.get("sliding_attention", {})
    return {
        "rope_theta": (full.get("rope_theta"),),
        "partial_rotary_factor": (full.get("partial_rotary_factor", 0.334),),
        "hybrid_layer_pattern": ([int(t == "sliding_attention") for t in types],),
        "moe_layer_freq": ([int(t == "sparse") for t in c.mlp_layer_types],),
        "swa_num_attention_heads": (c.num_attention_heads,),
        "swa_num_key_value_heads": (2 * c.num_key_value_heads,),
        "swa_head_dim": (c.head_dim,),
        "swa_v_head_dim": (c.v_head_dim,),
        "swa_rope_theta": (sliding.get("rope_theta"),),
        "add_swa_attention_sink_bias": (True,),
        "add_full_attention_sink_bias": (False,),
        "n_shared_experts": (None, 0),
        "hidden_act": ("silu",),
    }


def check_config(config: Any) -> None:
    """Refuse, by field name, a MiMo-V2-Flash config hetero would compute otherwise than it says: layer types
    other than the two, rope parameters missing for one, or a field of the release's config (``_release_fields``)
    whose value disagrees with what transformers' class builds."""
    bad = sorted(set(config.layer_types) - set(LAYER_TYPES))
    if bad or len(config.layer_types) != config.num_hidden_layers:
        raise UsageError(
            "MiMo-V2-Flash: layer_types must give 'full_attention' or 'sliding_attention' for each layer",
            arg="layer_types",
            expected=f"{config.num_hidden_layers} entries of {LAYER_TYPES}",
            got=config.layer_types,
        )
    for kind in set(config.layer_types):
        if not isinstance(config.rope_parameters.get(kind), dict):
            raise UsageError(
                f"MiMo-V2-Flash: rope_parameters has no entry for {kind!r} layers",
                arg="rope_parameters",
                expected=f"one dict per layer type {LAYER_TYPES}",
                got=config.rope_parameters,
            )
    for name, allowed in _release_fields(config).items():
        got = getattr(config, name, allowed[0])
        if got not in allowed:
            raise UsageError(
                f"MiMo-V2-Flash: {name}={got!r} is not implemented", arg=name, expected=allowed[0], got=got
            )


class LayerTypeRopes(nn.Module):
    """One cos/sin table per layer type (``tables``); ``twin`` twins them all, a layer registers the one it uses."""

    def __init__(self, tables: dict[str, RotaryEmbedding]):
        super().__init__()
        self.tables = tables

    def twin(self, ctx: ModelContext) -> LayerTypeRopes:
        return LayerTypeRopes({kind: table.twin(ctx) for kind, table in self.tables.items()})


class MiMoV2FullAttention(GQAttention):
    """A full-attention layer: ``num_key_value_heads``, Dv = ``v_head_dim``, v scaled, o_proj unbiased."""

    def __init__(self, ctx: ModelContext, config: Any, layer_idx: int, rotary: RotaryEmbedding, **kw: Any):
        super().__init__(ctx, config, layer_idx, rotary, **kw)
        value_scale = config.attention_value_scale
        self.value_scale = 1.0 if value_scale is None else float(value_scale)

    @staticmethod
    def biases(config: Any) -> tuple[bool, bool]:
        return bool(config.attention_bias), False

    @staticmethod
    def value_head_dim(config: Any) -> int:
        return int(config.v_head_dim)

    def v_transform(self, v: torch.Tensor) -> torch.Tensor:
        return v * self.value_scale


class MiMoV2SlidingAttention(MiMoV2FullAttention):
    """A sliding-window layer: twice the KV heads, this rank's sink logits (``sinks`` float32 [Hq/R])."""

    with_sinks = True

    def __init__(self, ctx: ModelContext, config: Any, layer_idx: int, rotary: RotaryEmbedding, **kw: Any):
        super().__init__(ctx, config, layer_idx, rotary, **kw)
        self.sinks = head_param(self.num_heads, ctx.parallel.rank, ctx.parallel.size, ctx.device, "sinks")

    @staticmethod
    def kv_heads(config: Any, layer_idx: int) -> int:
        return 2 * config.num_key_value_heads


class MiMoV2DecoderLayer(DecoderLayer):
    """The attention class and rope table of the layer's type; a dense MLP or the V3-routed experts."""

    moe_cls = partial(DeepseekMoE, v3=True)
    is_moe_layer = staticmethod(is_sparse_layer)

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> LayerTypeRopes:  # type: ignore[override]
        """NeoX rope over ``int(head_dim * partial_rotary_factor)`` dims, one table per layer type present."""
        tables = {}
        for kind in sorted(set(config.layer_types)):
            rot = rotary_dim_of(config, kind)
            tables[kind] = RotaryEmbedding(
                ctx, config, rot, config.max_position_embeddings, is_neox=True, layer_type=kind
            )
        return LayerTypeRopes(tables)

    def make_mixer(self, ctx, config, layer_idx, rotary, *, prefix, quant_config):  # type: ignore[override]
        kind = config.layer_types[layer_idx]
        cls = MiMoV2SlidingAttention if kind == "sliding_attention" else MiMoV2FullAttention
        attention = cls(
            ctx,
            config,
            layer_idx,
            rotary.tables[kind],
            prefix=join_prefix(prefix, "self_attn"),
            quant_config=quant_config,
        )
        return "self_attn", attention


class MiMoV2FlashForCausalLM(DecoderForCausalLM):
    """MiMo-V2-Flash (Xiaomi) and checkpoints of its architecture."""

    layer_cls = MiMoV2DecoderLayer
    mapping = WeightMapping(
        packed=QKV_PACKED + GATE_UP_PACKED,
        experts=WeightMapping.stacked_experts() + WeightMapping.fused_experts(),
        ignore=IGNORE + (r"model\.mtp\..*",),
        renames=((r"\.self_attn\.attention_sink_bias$", ".self_attn.sinks"),),
    )

    def __init__(self, hf_config: Any, ctx: ModelContext, *, quant_config: QuantConfig | None = None):
        check_config(hf_config)
        super().__init__(hf_config, ctx, quant_config=quant_config)
