"""HY4 (``hy_v4``, Tencent): GLM-5's sparse MLA with learned sinks and an output gate, hyper-connections,
clamped SwiGLU experts and a float32 LM head. Mirrors transformers 5.24's ``modular_hy_v4.py``:

- attention: sparse absorbed MLA (``layers/dsa.py``) with NeoX rope; each head's ``learnable_sink_param``
  (float32, split with the heads under TP) joins its softmax (``mla_attention(sinks=)``), and its output is
  gated, ``o * sigmoid(linear_gate(x))`` per head and value channel, before ``o_proj``;
- indexer: DeepSeek-V3.2's with rope on the LAST ``qk_rope_head_dim`` dims of its keys and queries, a
  float32 LayerNorm ``k_norm`` of eps ``rms_norm_eps``; "shared" layers (``indexer_types``) reuse the
  previous full layer's indices, as GLM-5's;
- residual: ``hc_mult`` streams (``layers/hyper.py``, no Sinkhorn, post weights ``hc_magnitude *
  sigmoid(.) + hc_eps``); each sublayer reads the streams' pre-collapse through its plain RMSNorm, and
  ``hc_head`` collapses them before the final norm;
- MLP: ``mlp_layer_types`` dense (SwiGLU) or sparse: V3 routing (sigmoid, selection-only bias, one group,
  renormalized, scaled), experts with ``swiglu_clamp`` at ``swiglu_limit`` (<= 0: no clamp) stored fused
  (``experts.gate_up_proj`` / ``experts.down_proj``), one plain shared expert;
- ``lm_head`` float32, fed the final hidden state widened; ``model.mtp_layers.*`` ignored.

The checkpoint's names are the original release's (what transformers' ``save_pretrained`` writes back):
``layers.i.hc_pre.hc_{attn,mlp}_layer.hc_{fn,base,scale}``, ``hc_pre.hc_head.hc_head_*``,
``self_attn.learnable_sink_param``, ``self_attn.linear_gate`` and ``linear_gate`` for the MLPs' gate.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.dsa import SharedIndices, SparseMLAttention, indexer_types_of
from hetero.engine.layers.hyper import HyperConnection, HyperHead, entry_streams
from hetero.engine.layers.linear import ColumnParallelLinear
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import head_param, join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import GATE_UP_PACKED, IGNORE, DecoderForCausalLM, DecoderLayer, DecoderModel
from hetero.engine.models.deepseek import DeepseekMoE
from hetero.engine.models.hy_v3 import is_sparse_layer
from hetero.engine.models.wrapper import TextOfMultimodal
from hetero.engine.pipeline import StandIn
from hetero.engine.quant.config import QuantConfig
from hetero.engine.step import Step

__all__ = [
    "HYV4Attention",
    "HYV4MoE",
    "HYV4DecoderLayer",
    "HYV4Model",
    "HYV4ForCausalLM",
    "HYV4VLForConditionalGeneration",
]

#: the MLPs' gate projection is ``linear_gate`` in the original checkpoints (the attention gate keeps its name)
GATE_PACKED = (
    ("shared_experts.linear_gate", "shared_experts.gate_up_proj", 0),
    ("mlp.linear_gate", "mlp.gate_up_proj", 0),
)
#: transformers writes the head's hyper-connection back as ``hc_pre.hc_head`` (HY4) or ``hc_head.hc_pre`` (HY4-VL)
HEAD_ALIAS = (("hc_head.hc_pre", "hc_pre.hc_head", None),)


class HYV4Attention(SparseMLAttention):
    """Sparse MLA with per-head sinks and a sigmoid output gate (see the module docstring)."""

    mla_options = {"topk_indices": True, "sinks": True}

    def __init__(self, ctx: ModelContext, hf_config: Any, layer_idx: int, rotary: RotaryEmbedding, **kw: Any):
        # the indexer ropes with MLA's pair layout (NeoX for HY4, interleaved for HY4-VL)
        super().__init__(ctx, hf_config, layer_idx, rotary, indexer_interleaved=not rotary.is_neox, **kw)
        prefix, quant_config = self.prefix, kw.get("quant_config")
        total = hf_config.num_attention_heads
        self.linear_gate = ColumnParallelLinear(
            ctx, self.hidden, total * self.v_dim, prefix=join_prefix(prefix, "linear_gate"), quant_config=quant_config
        )
        what = join_prefix(prefix, "learnable_sink_param")
        self.learnable_sink_param = head_param(self.num_heads, ctx.parallel.rank, ctx.parallel.size, ctx.device, what)

    def indexer_options(self, hf_config: Any) -> dict[str, Any]:
        return dict(rope_last=True, k_norm_eps=float(hf_config.rms_norm_eps), k_norm_float32=True)

    def forward(self, hidden: torch.Tensor, step: Step) -> torch.Tensor:  # type: ignore[override]
        t = hidden.shape[0]
        gate = self.linear_gate(hidden).view(t, self.num_heads, self.v_dim)
        out = self.attend(hidden, step, sinks=self.learnable_sink_param) * torch.sigmoid(gate)
        return self.o_proj(out.reshape(t, self.num_heads * self.v_dim))


class HYV4MoE(DeepseekMoE):
    """DeepSeek-V3's MoE block with experts clamped at ``swiglu_limit`` (none when it is <= 0)."""

    def __init__(self, ctx: ModelContext, hf_config: Any, *, prefix: str = "", quant_config: QuantConfig | None = None):
        limit = float(hf_config.swiglu_limit or 0.0)
        super().__init__(
            ctx,
            hf_config,
            v3=True,
            activation="swiglu_clamp" if limit > 0 else "silu",
            limit=limit if limit > 0 else None,
            prefix=prefix,
            quant_config=quant_config,
        )


class HYV4DecoderLayer(DecoderLayer):
    """``forward(streams [T, N, H], None, step, capture) -> (streams, None)``: each sublayer between its
    hyper-connection's collapse and spread (``hc_pre.hc_attn_layer`` / ``hc_pre.hc_mlp_layer``)."""

    attention_cls = HYV4Attention
    moe_cls = HYV4MoE
    is_moe_layer = staticmethod(is_sparse_layer)

    def __init__(self, ctx: ModelContext, config: Any, layer_idx: int, rotary: RotaryEmbedding, **kw: Any):
        super().__init__(ctx, config, layer_idx, rotary, **kw)
        options = dict(names=("hc_fn", "hc_base", "hc_scale"), post_mult=config.hc_magnitude, post_eps=config.hc_eps)
        self.hc_pre = nn.Module()
        for name in ("hc_attn_layer", "hc_mlp_layer"):
            prefix = join_prefix(self.prefix, f"hc_pre.{name}")
            self.hc_pre.add_module(name, HyperConnection(ctx, config, prefix=prefix, **options))

    #: the rope's pair layout, in MLA and in the indexer (which ropes its last dims with a twin)
    rope_neox: ClassVar[bool] = True

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> RotaryEmbedding:
        """Rope over MLA's ``qk_rope_head_dim``: NeoX pairs unless ``rope_neox`` is False."""
        return RotaryEmbedding(
            ctx, config, config.qk_rope_head_dim, config.max_position_embeddings, is_neox=cls.rope_neox
        )

    def forward(  # type: ignore[override]
        self, streams: torch.Tensor, residual: None, step: Step, capture: list[torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, None]:
        hc = self.hc_pre.hc_attn_layer
        x, post, comb = hc.pre(streams)
        streams = hc.post(self.self_attn(self.input_layernorm(x), step), streams, post, comb)
        hc = self.hc_pre.hc_mlp_layer
        x, post, comb = hc.pre(streams)
        streams = hc.post(self.mlp(self.post_attention_layernorm(x)), streams, post, comb)
        if capture is not None:
            capture.append(streams)
        return streams, None


class HYV4Model(DecoderModel):
    """Embedding -> ``hc_mult`` streams -> layers -> ``hc_pre.hc_head`` collapse -> final norm; ``capture``
    gets the embedding output [T, H], then each layer's streams [T, N, H]."""

    def __init__(self, ctx: ModelContext, config: Any, layer_cls: type[DecoderLayer], **kw: Any):
        super().__init__(ctx, config, layer_cls, **kw)
        self.streams = int(config.hc_mult)
        self.hc_pre = nn.Module()
        names = ("hc_head_fn", "hc_head_base", "hc_head_scale")
        prefix = join_prefix(self.prefix, "hc_pre.hc_head")
        head = HyperHead(ctx, config, names=names, prefix=prefix) if self.last else StandIn("the hyper-connection head")
        self.hc_pre.hc_head = head
        # a "shared" indexer layer reads what the full layer before it wrote
        self.share_indices(SharedIndices(), indexer_types_of(config))

    def forward(self, input_ids: torch.Tensor, step: Step, capture=None, intermediate=None):  # type: ignore[override]
        hidden, _ = self.stage_input(input_ids, intermediate)
        streams = entry_streams(hidden, intermediate is None, capture, self.streams)
        for layer in self.owned:
            streams, _ = layer(streams, None, step, capture)
        if not self.last:
            return self.stage_output(streams, None)
        return self.norm(self.hc_pre.hc_head(streams))


class HYV4ForCausalLM(DecoderForCausalLM):
    """HY4 (Hy4-preview); the float32 LM head reads the final hidden state widened to float32."""

    layer_cls = HYV4DecoderLayer
    model_cls = HYV4Model
    lm_head_float32 = True
    mapping = WeightMapping(
        packed=GATE_PACKED + GATE_UP_PACKED + HEAD_ALIAS,
        experts=WeightMapping.fused_experts(),
        ignore=IGNORE + (r"model\.mtp_layers\..*",),
    )


class HYV4VLAttention(HYV4Attention):
    """HY4-VL's text attention: its latent norms take ``rms_norm_eps``."""

    def latent_norm_eps(self, hf_config: Any) -> float:
        return float(hf_config.rms_norm_eps)


class HYV4VLDecoderLayer(HYV4DecoderLayer):
    """Interleaved rope pairs, in MLA and the indexer (GLM's rope; the M-RoPE sections coincide on text
    positions)."""

    attention_cls = HYV4VLAttention
    rope_neox = False


class HYV4VLForConditionalGeneration(TextOfMultimodal, HYV4ForCausalLM):
    """HY4-VL's text model (``text_config``, ``wrapper.py``), on text prompts: its M-RoPE is plain rope when a
    token's three position ids are equal. The release keeps the text names (``model.*``); the vision tower and
    its projector (``vit.*``, or ``model.vision_tower.*`` as transformers names them) are ignored."""

    layer_cls = HYV4VLDecoderLayer
    vision_ignore = (r"vit\..*", r"model\.vision_tower\..*")
