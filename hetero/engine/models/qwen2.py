"""Qwen2: GQA attention with q/k/v bias, gated SiLU MLP, RMSNorm, optional tied embeddings.

The classes here are the skeleton Qwen3 and Qwen3-MoE reuse: an attention block, a
decoder layer that builds its MLP in ``make_mlp`` and a model body; the subclasses
change only what their architecture changes (bias rule, q/k norms, MoE blocks).

Residual stream: each decoder layer returns ``(hidden, residual)`` unsummed (the
vLLM convention); the next layer's ``input_layernorm`` (or the final norm) adds
them in the fused ``rms_norm(x, residual=...)``, which also returns the sum, the
full residual stream, so ``capture`` costs no extra op.

Every module gets its checkpoint ``prefix`` ("model.layers.3.self_attn") and the
model's ``quant_config``, which picks each Linear's and FusedMoE's method by prefix.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.activation import SiluAndMul
from hetero.engine.layers.attention import Attention
from hetero.engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from hetero.engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.base import CausalLM, WeightMapping
from hetero.engine.quant.config import QuantConfig, quant_config_of
from hetero.engine.step import Step

__all__ = ["Qwen2Attention", "Qwen2MLP", "PreNormDecoderLayer", "Qwen2DecoderLayer", "Qwen2Model", "Qwen2ForCausalLM",
           "QWEN_PACKED", "QWEN_IGNORE", "head_dim_of", "sliding_window_of"]

#: q/k/v into qkv_proj, gate/up into gate_up_proj (shared by every Qwen here)
QWEN_PACKED = (
    ("q_proj", "qkv_proj", "q"),
    ("k_proj", "qkv_proj", "k"),
    ("v_proj", "qkv_proj", "v"),
    ("gate_proj", "gate_up_proj", 0),
    ("up_proj", "gate_up_proj", 1),
)
#: rotary buffers some (older) checkpoints saved
QWEN_IGNORE = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"model\.rotary_emb\.inv_freq")


def head_dim_of(config: Any) -> int:
    """The explicit ``head_dim`` of the config, else hidden_size / num_attention_heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def sliding_window_of(config: Any, layer_idx: int) -> tuple[int, int]:
    """The ``window`` of layer ``layer_idx`` for ``paged_attention``, as transformers masks it.

    transformers keeps key j for query i iff ``j > i - sliding_window``, i.e.
    ``i - (sliding_window - 1) <= j``. With ``layer_types`` (Qwen2, Qwen3) only
    "sliding_attention" layers slide; without it (Qwen3-MoE) every layer does when
    ``sliding_window`` is set (the config clears it unless ``use_sliding_window``).
    """
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None and types[layer_idx] != "sliding_attention":
        return (-1, -1)
    if not window:
        return (-1, -1)
    return (int(window) - 1, -1)


class Qwen2Attention(nn.Module):
    """qkv_proj -> (q/k transform) -> rope -> paged attention -> o_proj, heads split over ranks."""

    def __init__(self, ctx: ModelContext, config: Any, layer_idx: int, rotary: RotaryEmbedding, *, prefix: str = "",
                 quant_config: QuantConfig | None = None):
        super().__init__()
        self.prefix, self.head_dim = prefix, head_dim_of(config)
        qkv_bias, o_bias = self.biases(config)
        self.qkv_proj = QKVParallelLinear(ctx, config.hidden_size, self.head_dim, config.num_attention_heads,
                                          config.num_key_value_heads, bias=qkv_bias,
                                          prefix=join_prefix(prefix, "qkv_proj"), quant_config=quant_config)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(ctx, config.num_attention_heads * self.head_dim, config.hidden_size, bias=o_bias,
                                        prefix=join_prefix(prefix, "o_proj"), quant_config=quant_config)
        self.rotary_emb = rotary
        self.attn = Attention(ctx, self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim ** -0.5,
                              window=sliding_window_of(config, layer_idx))

    @staticmethod
    def biases(config: Any) -> tuple[bool, bool]:
        """(q/k/v bias, o_proj bias): Qwen2 always has the first and never the second."""
        return True, False

    def qk_transform(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Applied to q [T, Hq, D] and k [T, Hkv, D] before rope (Qwen3: per-head RMSNorm)."""
        return q, k

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, step: Step) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        q, k = self.qk_transform(q, k)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v, step)
        return self.o_proj(out.reshape(tokens, self.q_size))


class Qwen2MLP(nn.Module):
    """down(silu(gate(x)) * up(x)); gate/up packed column-parallel, down row-parallel."""

    def __init__(self, ctx: ModelContext, hidden: int, intermediate: int, *, prefix: str = "",
                 quant_config: QuantConfig | None = None):
        super().__init__()
        self.prefix = prefix
        self.gate_up_proj = MergedColumnParallelLinear(ctx, hidden, [intermediate, intermediate],
                                                       prefix=join_prefix(prefix, "gate_up_proj"), quant_config=quant_config)
        self.act_fn = SiluAndMul(ctx)
        self.down_proj = RowParallelLinear(ctx, intermediate, hidden, prefix=join_prefix(prefix, "down_proj"),
                                           quant_config=quant_config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class PreNormDecoderLayer(nn.Module):
    """Pre-norm token mixer and MLP; ``forward(positions, hidden, residual, step) -> (hidden, residual)``.

    ``residual`` None means ``hidden`` is the embedding output. The layer's output
    stream is ``hidden + residual`` (summed by the next norm). A subclass builds
    ``input_layernorm``, ``post_attention_layernorm`` and ``mlp``, and says what mixes
    tokens (``mix``: attention, or a hybrid layer's own choice).
    """

    def mix(self, positions: torch.Tensor, hidden: torch.Tensor, step: Step) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, step: Step,
                capture: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
            if capture is not None:  # the previous layer's output stream
                capture.append(residual)
        hidden = self.mix(positions, hidden, step)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class Qwen2DecoderLayer(PreNormDecoderLayer):
    """Attention (``self_attn``) as the token mixer, then the MLP (see ``PreNormDecoderLayer``)."""

    attention_cls: type[Qwen2Attention] = Qwen2Attention

    def __init__(self, ctx: ModelContext, config: Any, layer_idx: int, rotary: RotaryEmbedding, *, prefix: str = "",
                 quant_config: QuantConfig | None = None):
        super().__init__()
        self.prefix = prefix
        self.self_attn = self.attention_cls(ctx, config, layer_idx, rotary, prefix=join_prefix(prefix, "self_attn"),
                                            quant_config=quant_config)
        self.mlp = self.make_mlp(ctx, config, layer_idx, prefix=join_prefix(prefix, "mlp"), quant_config=quant_config)
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(ctx, config.hidden_size, eps, prefix=join_prefix(prefix, "input_layernorm"))
        self.post_attention_layernorm = RMSNorm(ctx, config.hidden_size, eps,
                                                prefix=join_prefix(prefix, "post_attention_layernorm"))

    def make_mlp(self, ctx: ModelContext, config: Any, layer_idx: int, *, prefix: str = "",
                 quant_config: QuantConfig | None = None) -> nn.Module:
        return Qwen2MLP(ctx, config.hidden_size, config.intermediate_size, prefix=prefix, quant_config=quant_config)

    def mix(self, positions: torch.Tensor, hidden: torch.Tensor, step: Step) -> torch.Tensor:
        return self.self_attn(positions, hidden, step)


class Qwen2Model(nn.Module):
    """Embedding, decoder layers, final norm (parameters under ``model.``)."""

    layer_cls: type[Qwen2DecoderLayer] = Qwen2DecoderLayer

    def __init__(self, ctx: ModelContext, config: Any, *, prefix: str = "", quant_config: QuantConfig | None = None):
        super().__init__()
        self.prefix = prefix
        self.embed_tokens = VocabParallelEmbedding(ctx, config.vocab_size, config.hidden_size,
                                                   prefix=join_prefix(prefix, "embed_tokens"))
        # one cos/sin table for every layer (it is [max_positions, head_dim]), one module per layer
        rotary = RotaryEmbedding(ctx, config, head_dim_of(config), config.max_position_embeddings, is_neox=True)
        self.layers = nn.ModuleList(self.layer_cls(ctx, config, i, rotary.twin(ctx), quant_config=quant_config,
                                                   prefix=join_prefix(prefix, f"layers.{i}"))
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(ctx, config.hidden_size, config.rms_norm_eps, prefix=join_prefix(prefix, "norm"))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, step: Step,
                capture: list[torch.Tensor] | None = None) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        if capture is not None:
            capture.append(hidden)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, step, capture)
        if residual is None:  # no layers
            return self.norm(hidden)
        hidden, residual = self.norm(hidden, residual)
        if capture is not None:
            capture.append(residual)
        return hidden


class Qwen2ForCausalLM(CausalLM):
    """Qwen2 (and the skeleton of Qwen3 / Qwen3-MoE): ``model.*`` plus ``lm_head`` (tied when configured).

    ``quant_config`` (default: what the config's ``quantization_config`` asks for) picks each layer's method.
    """

    model_cls: type[Qwen2Model] = Qwen2Model
    mapping = WeightMapping(packed=QWEN_PACKED, ignore=QWEN_IGNORE)

    def __init__(self, hf_config: Any, ctx: ModelContext, *, quant_config: QuantConfig | None = None):
        super().__init__()
        self.ctx, self.config = ctx, hf_config
        self.quant_config = quant_config or quant_config_of(hf_config)
        self.model = self.model_cls(ctx, hf_config, prefix="model", quant_config=self.quant_config)
        self.lm_head = ParallelLMHead(ctx, hf_config.vocab_size, hf_config.hidden_size, prefix="lm_head")
        if getattr(hf_config, "tie_word_embeddings", False):
            self.lm_head.tie(self.model.embed_tokens)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, step: Step,
                capture: list[torch.Tensor] | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, step, capture)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
