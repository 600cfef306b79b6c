"""DeepSeek-V4 (``deepseek_v4``): compressed sparse attention over a sliding window, hyper-connections with
Sinkhorn mixing, and sqrtsoftplus / hash-routed MoE. Mirrors transformers 5.24's ``modular_deepseek_v4.py``:

- attention (``layers/compressed_attention.py``): per ``layer_types`` entry a sliding layer, a CSA layer
  (compressor of ratio ``compress_rates[...]``, 4, with overlapping windows and a lightning indexer) or an
  HCA layer (ratio 128, all entries); the main rope (``rope_parameters["main"]``) in sliding layers, the
  yarn compress rope elsewhere and in the compressors;
- residual: ``hc_mult`` streams, ``attn_hc`` / ``ffn_hc`` hyper-connections with ``hc_sinkhorn_iters``
  Sinkhorn rounds (post weights ``2 * sigmoid(.)``), ``hc_head`` collapsing them before the final norm;
- MoE in every layer (``layers/moe_v4.py``): the router ``gate`` (model dtype) scores with ``scoring_func``
  (sqrtsoftplus), a selection-only ``e_score_correction_bias``, renormalized, times ``routed_scaling_factor``;
  a ``mlp_layer_types`` "hash_moe" layer takes its experts from ``gate.tid2eid[token id]`` instead; experts
  and the shared expert clamp SwiGLU at ``swiglu_limit``;
- every norm and mixing parameter float32; the MTP layers (``mtp.*``) ignored here, ``build_mtp`` runs the first
  as a speculative draft (``_mtp_v4.py``).

The step's compressed block tables (one per ratio) are derived once per forward, not per layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.cached import compressed_block_table
from hetero.engine.layers.compressed_attention import CompressedAttention
from hetero.engine.layers.hyper import HyperConnection, HyperHead, entry_streams
from hetero.engine.layers.moe_v4 import DeepseekV4MoE
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import IGNORE, DecoderForCausalLM, DecoderLayer, DecoderModel
from hetero.engine.models.deepseek import mtp_ignore
from hetero.engine.pipeline import StandIn
from hetero.engine.step import Step
from hetero.errors import UsageError
from hetero.spec.types import AttentionMeta

__all__ = ["DeepseekV4DecoderLayer", "DeepseekV4Model", "DeepseekV4ForCausalLM", "check_config"]

#: config fields hetero computes only at this value (what every V4 release has), refused by name otherwise
_FIXED = {
    "num_key_value_heads": 1,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
}


def check_config(config: Any) -> None:
    """Refuse, by field name, a DeepSeek-V4 config asking for what hetero does not compute."""
    for name, fixed in _FIXED.items():
        got = getattr(config, name, fixed)
        if got != fixed:
            raise UsageError(f"DeepSeek-V4: {name}={got!r} is not implemented", arg=name, expected=fixed, got=got)
    if config.num_attention_heads % int(config.o_groups):
        raise UsageError(
            "DeepSeek-V4: o_groups must divide num_attention_heads",
            arg="o_groups",
            expected=f"a divisor of {config.num_attention_heads}",
            got=config.o_groups,
        )


#: the original release's tensor names (``layers.3.attn.wq_a``, ``hc_head_fn``, ...) -> transformers' (the
#: reverse of what transformers' ``save_pretrained`` writes back; names already in transformers' form pass)
RELEASE_NAMES = (
    (r"^(?:model\.)?embed\.weight$", "model.embed_tokens.weight"),
    (r"^(?:model\.)?head\.weight$", "lm_head.weight"),
    (r"^(?:model\.)?hc_head_(fn|base|scale)$", r"model.hc_head.hc_\1"),
    (r"^norm\.weight$", "model.norm.weight"),
    (r"^layers\.", "model.layers."),
    (r"\.attn\.indexer\.compressor\.", ".self_attn.compressor.indexer."),
    (r"\.attn\.indexer\.weights_proj\.", ".self_attn.compressor.indexer.scorer.weights_proj."),
    (r"\.attn\.indexer\.wq_b\.", ".self_attn.compressor.indexer.q_b_proj."),
    (r"\.attn\.", ".self_attn."),
    (r"\.ffn\.", ".mlp."),
    (r"\.attn_norm\.", ".input_layernorm."),
    (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_(attn|ffn)_(fn|base|scale)$", r".\1_hc.\2"),
    (r"\.attn_sink$", ".sinks"),
    (r"\.(self_attn|compressor|indexer)\.norm\.", r".\1.kv_norm."),
    (r"\.ape$", ".position_bias"),
    (r"\.q_norm\.", ".q_a_norm."),
    (r"\.wq_a\.", ".q_a_proj."),
    (r"\.wq_b\.", ".q_b_proj."),
    (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."),
    (r"\.wo_a\.", ".o_a_proj."),
    (r"\.wo_b\.", ".o_b_proj."),
    (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    (r"\.(shared_experts|experts\.\d+)\.w1\.", r".\1.gate_proj."),
    (r"\.(shared_experts|experts\.\d+)\.w2\.", r".\1.down_proj."),
    (r"\.(shared_experts|experts\.\d+)\.w3\.", r".\1.up_proj."),
)


def _fp32_norm(ctx: ModelContext, hidden: int, eps: float, *, prefix: str = "") -> RMSNorm:
    return RMSNorm(dataclasses.replace(ctx, dtype=torch.float32), hidden, eps, prefix=prefix)


class Ropes(nn.Module):
    """The two cos/sin tables of a layer, ``main`` and ``compress``: twins of the model's."""

    def __init__(self, main: RotaryEmbedding, compress: RotaryEmbedding):
        super().__init__()
        self.main, self.compress = main, compress

    def twin(self, ctx: ModelContext) -> Ropes:
        return Ropes(self.main.twin(ctx), self.compress.twin(ctx))


class DeepseekV4DecoderLayer(DecoderLayer):
    """``forward(streams [T, N, H], input_ids, step, comp_metas, capture) -> streams``: attention and MoE, each
    between its hyper-connection's collapse and spread (``attn_hc``, ``ffn_hc``)."""

    norm_cls = staticmethod(_fp32_norm)

    def __init__(self, ctx: ModelContext, config: Any, layer_idx: int, rotary: Ropes, **kw: Any):
        super().__init__(ctx, config, layer_idx, rotary, **kw)
        options = dict(sinkhorn_iters=int(config.hc_sinkhorn_iters), post_mult=2.0, post_eps=0.0)
        self.attn_hc = HyperConnection(ctx, config, prefix=join_prefix(self.prefix, "attn_hc"), **options)
        self.ffn_hc = HyperConnection(ctx, config, prefix=join_prefix(self.prefix, "ffn_hc"), **options)

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> Ropes:  # type: ignore[override]
        """Interleaved rope over the last ``head_dim * partial_rotary_factor`` dims, both tables."""
        rot = int(round(config.head_dim * config.partial_rotary_factor))
        main, compress = (
            RotaryEmbedding(ctx, config, rot, config.max_position_embeddings, is_neox=False, layer_type=kind)
            for kind in ("main", "compress")
        )
        return Ropes(main, compress)

    def make_mixer(self, ctx, config, layer_idx, rotary, *, prefix, quant_config):  # type: ignore[override]
        sliding = config.layer_types[layer_idx] == "sliding_attention"
        table = rotary.main if sliding else rotary.compress
        attention = CompressedAttention(
            ctx,
            config,
            layer_idx,
            table,
            rotary.compress,
            prefix=join_prefix(prefix, "self_attn"),
            quant_config=quant_config,
        )
        return "self_attn", attention

    def make_mlp(self, ctx, config, layer_idx, *, prefix, quant_config):  # type: ignore[override]
        return DeepseekV4MoE(ctx, config, layer_idx, prefix=prefix, quant_config=quant_config)

    def forward(  # type: ignore[override]
        self,
        streams: torch.Tensor,
        input_ids: torch.Tensor,
        step: Step,
        comp_metas: dict[int, AttentionMeta],
        capture: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        x, post, comb = self.attn_hc.pre(streams)
        streams = self.attn_hc.post(self.self_attn(self.input_layernorm(x), step, comp_metas), streams, post, comb)
        x, post, comb = self.ffn_hc.pre(streams)
        streams = self.ffn_hc.post(self.mlp(self.post_attention_layernorm(x), input_ids), streams, post, comb)
        if capture is not None:
            capture.append(streams)
        return streams


class DeepseekV4Model(DecoderModel):
    """Embedding -> ``hc_mult`` streams -> layers -> ``hc_head`` -> final norm; ``capture`` gets the embedding
    output [T, H], then each layer's streams [T, N, H]."""

    def __init__(self, ctx: ModelContext, config: Any, layer_cls: type[DecoderLayer], **kw: Any):
        check_config(config)
        super().__init__(ctx, config, layer_cls, **kw)
        self.streams = int(config.hc_mult)
        names = ("hc_fn", "hc_base", "hc_scale")
        head = HyperHead(ctx, config, names=names, prefix=join_prefix(self.prefix, "hc_head"))
        self.hc_head = head if self.last else StandIn("the hyper-connection head")
        self.ratios = sorted({layer.self_attn.ratio for layer in self.owned} - {0})

    def compressed_metas(self, step: Step) -> dict[int, AttentionMeta]:
        """The step's metadata over each ratio's compressed block table (the blocks are the window cache's)."""
        if not self.ratios:
            return {}
        block_size = self.owned[0].self_attn.kv_cache.shape[1]
        meta = step.meta
        return {
            m: dataclasses.replace(meta, block_table=compressed_block_table(meta.block_table, block_size, m), plan=None)
            for m in self.ratios
        }

    def forward(self, input_ids: torch.Tensor, step: Step, capture=None, intermediate=None):  # type: ignore[override]
        hidden, _ = self.stage_input(input_ids, intermediate)
        streams = entry_streams(hidden, intermediate is None, capture, self.streams)
        metas = self.compressed_metas(step)
        for layer in self.owned:
            streams = layer(streams, input_ids, step, metas, capture)
        if not self.last:
            return self.stage_output(streams, None)
        return self.norm(self.hc_head(streams))


class DeepseekV4ForCausalLM(DecoderForCausalLM):
    """DeepSeek-V4 (Flash, Pro); the MTP layers (``mtp.*``, or layers past ``num_hidden_layers``) are ignored by the
    model and run as a draft by ``build_mtp``."""

    layer_cls = DeepseekV4DecoderLayer
    model_cls = DeepseekV4Model
    mapping = WeightMapping(
        packed=(
            ("shared_experts.gate_proj", "shared_experts.gate_up_proj", 0),
            ("shared_experts.up_proj", "shared_experts.gate_up_proj", 1),
        ),
        experts=WeightMapping.stacked_experts() + WeightMapping.fused_experts(),
        ignore=IGNORE + (r"(model\.)?mtp\..*",),
        renames=RELEASE_NAMES,
    )

    def weight_mapping(self, hf_config: Any) -> WeightMapping:
        return dataclasses.replace(type(self).mapping, ignore=type(self).mapping.ignore + mtp_ignore(hf_config))

    def build_mtp(self, model_dir):
        """The checkpoint's first MTP layer (``mtp.0.*``) as a speculative draft sharing this model's embedding
        and head (``_mtp_v4.DeepseekV4MTPDraft``)."""
        from hetero.engine.models._mtp_v4 import DeepseekV4MTPDraft

        return DeepseekV4MTPDraft(self, model_dir).load(model_dir)
