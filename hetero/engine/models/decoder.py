"""The decoder skeleton every model family here is built on: embed -> pre-norm layers -> final norm.

A family is a ``DecoderLayer`` subclass that sets a few class attributes (its attention class, its
MoE class and which layers have it, its norm class, its rotary table) and a ``DecoderForCausalLM``
subclass that names the layer class and the checkpoint's ``WeightMapping``. The model body, the
residual convention, the LM head and the forward are this module's, shared by all.

Residual stream: each decoder layer returns ``(hidden, residual)`` unsummed (the vLLM convention);
the next layer's ``input_layernorm`` (or the final norm) adds them in the fused
``rms_norm(x, residual=...)``, which also returns the sum, the full residual stream, so ``capture``
costs no extra op.

Every module gets its checkpoint ``prefix`` ("model.layers.3.self_attn") and the model's
``quant_config``, which picks each Linear's and FusedMoE's method by prefix. Positions, cache slots
and the attention layout all come from the ``Step``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from hetero.engine.layers.gqa import head_dim_of
from hetero.engine.layers.mlp import GatedMLP
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.base import CausalLM, WeightMapping
from hetero.engine.pipeline import StandIn
from hetero.engine.quant.config import QuantConfig, quant_config_of
from hetero.engine.step import Step

__all__ = [
    "GatedMLP",
    "DecoderLayer",
    "DecoderModel",
    "DecoderForCausalLM",
    "IGNORE",
    "QKV_PACKED",
    "GATE_UP_PACKED",
    "every_layer",
]

#: rotary buffers some (older) checkpoints saved; no model here reads them
IGNORE = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"model\.rotary_emb\.inv_freq")
#: q/k/v into one column-parallel ``qkv_proj``
QKV_PACKED = (("q_proj", "qkv_proj", "q"), ("k_proj", "qkv_proj", "k"), ("v_proj", "qkv_proj", "v"))
#: gate/up into one column-parallel ``gate_up_proj`` (``GatedMLP``)
GATE_UP_PACKED = (("gate_proj", "gate_up_proj", 0), ("up_proj", "gate_up_proj", 1))


def every_layer(config: Any, layer_idx: int) -> bool:
    """The layer schedule of a family whose every layer has its ``moe_cls``."""
    return True


class DecoderLayer(nn.Module):
    """Pre-norm: ``input_layernorm`` -> token mixer -> ``post_attention_layernorm`` -> ``mlp``.

    ``forward(hidden, residual, step, capture=None) -> (hidden, residual)``; ``residual`` None means
    ``hidden`` is the embedding output, and the layer's output stream is ``hidden + residual``.
    A family sets:

    - ``attention_cls``: the token mixer, under ``self_attn``, built ``(ctx, config, layer_idx, rotary, *,
      prefix, quant_config)`` and called ``(hidden, step)``;
    - ``moe_cls``: the sparse MLP, built ``(ctx, config, *, prefix, quant_config)``, in the layers where
      ``is_moe_layer(config, layer_idx)`` (the layer schedule); the others have a ``GatedMLP`` of
      ``intermediate_size``, biased when ``mlp_bias(config)``;
    - ``norm_cls``: every decoder norm's class (the model's final norm too), built ``(ctx, hidden, eps, prefix=)``;
    - ``rotary_table(ctx, config)``: the one cos/sin table of the model (each layer gets a twin of it).

    A layer whose token mixer depends on its index (a hybrid model) overrides ``make_mixer``; ``self.mixer``
    is the attribute the layer's token mixer is under.
    """

    attention_cls: ClassVar[Callable[..., nn.Module]]
    moe_cls: ClassVar[Callable[..., nn.Module] | None] = None
    norm_cls: ClassVar[Callable[..., RMSNorm]] = RMSNorm
    #: ``(config, layer_idx) -> bool``: whether that layer has ``moe_cls`` (when there is one)
    is_moe_layer = staticmethod(every_layer)

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
        super().__init__()
        self.prefix = prefix
        self.mixer, mixer = self.make_mixer(ctx, config, layer_idx, rotary, prefix=prefix, quant_config=quant_config)
        self.add_module(self.mixer, mixer)
        self.mlp = self.make_mlp(ctx, config, layer_idx, prefix=join_prefix(prefix, "mlp"), quant_config=quant_config)
        eps = config.rms_norm_eps
        self.input_layernorm = self.norm_cls(
            ctx, config.hidden_size, eps, prefix=join_prefix(prefix, "input_layernorm")
        )
        self.post_attention_layernorm = self.norm_cls(
            ctx, config.hidden_size, eps, prefix=join_prefix(prefix, "post_attention_layernorm")
        )

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> RotaryEmbedding:
        """The model's cos/sin table: NeoX pairs over the whole head (``head_dim_of``)."""
        return RotaryEmbedding(ctx, config, head_dim_of(config), config.max_position_embeddings, is_neox=True)

    @staticmethod
    def mlp_bias(config: Any) -> bool:
        """Whether the dense MLP has biases."""
        return False

    def make_mixer(
        self,
        ctx: ModelContext,
        config: Any,
        layer_idx: int,
        rotary: RotaryEmbedding,
        *,
        prefix: str,
        quant_config: QuantConfig | None,
    ) -> tuple[str, nn.Module]:
        """(attribute, module) of the token mixer (``prefix``: the layer's); by default ``self_attn``, an
        ``attention_cls``."""
        return "self_attn", self.attention_cls(
            ctx, config, layer_idx, rotary, prefix=join_prefix(prefix, "self_attn"), quant_config=quant_config
        )

    def make_mlp(
        self, ctx: ModelContext, config: Any, layer_idx: int, *, prefix: str, quant_config: QuantConfig | None
    ) -> nn.Module:
        if self.moe_cls is not None and self.is_moe_layer(config, layer_idx):
            return self.moe_cls(ctx, config, prefix=prefix, quant_config=quant_config)
        return GatedMLP(
            ctx,
            config.hidden_size,
            config.intermediate_size,
            bias=self.mlp_bias(config),
            prefix=prefix,
            quant_config=quant_config,
        )

    def forward(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, step: Step, capture: list[torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
            if capture is not None:  # the previous layer's output stream
                capture.append(residual)
        hidden = getattr(self, self.mixer)(hidden, step)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DecoderModel(nn.Module):
    """``embed_tokens`` -> ``layers`` (``layer_cls``, one per ``num_hidden_layers``) -> ``norm``.

    ``forward(input_ids int64 [T], step, capture=None) -> hidden [T, H]`` after the final norm; with a
    ``capture`` list, the embedding output and each layer's output stream are appended to it, in order.
    A pipeline stage (``ctx.stage``) builds only its layers (``owned``; ``StandIn`` for the others), the
    embedding on the first stage (and the last when tied to the head), the norm on the last; it starts
    from the previous stage's ``intermediate`` and, unless last, returns its own (``stage_output``).
    """

    def __init__(
        self,
        ctx: ModelContext,
        config: Any,
        layer_cls: type[DecoderLayer],
        *,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        self.prefix = prefix
        self.first, self.last = ctx.owns("first"), ctx.owns("last")
        tied = self.last and getattr(config, "tie_word_embeddings", False)  # the last stage's head reads it
        self.embed_tokens = (
            VocabParallelEmbedding(
                ctx, config.vocab_size, config.hidden_size, prefix=join_prefix(prefix, "embed_tokens")
            )
            if self.first or tied
            else StandIn("the embedding")
        )
        # one cos/sin table for every layer (it is [max_positions, rotary_dim]), one module per layer
        rotary = layer_cls.rotary_table(ctx, config)
        self.layers = nn.ModuleList(
            layer_cls(
                ctx, config, i, rotary.twin(ctx), quant_config=quant_config, prefix=join_prefix(prefix, f"layers.{i}")
            )
            if ctx.owns(i)
            else StandIn(f"decoder layer {i}")
            for i in range(config.num_hidden_layers)
        )
        self.owned = tuple(m for m in self.layers if not isinstance(m, StandIn))
        self.end = ctx.stage.end if ctx.stage is not None else config.num_hidden_layers
        self.shared_indices, self.carry_indices = None, False
        norm = layer_cls.norm_cls(ctx, config.hidden_size, config.rms_norm_eps, prefix=join_prefix(prefix, "norm"))
        self.norm = norm if self.last else StandIn("the final norm")

    def share_indices(self, shared: Any, types: list[str]) -> None:
        """Give every owned layer's sparse attention the model's one ``SharedIndices`` (a DSA "shared" layer
        reads the previous full layer's); they travel to the next stage when its first layer (``types``:
        "full" or "shared" per layer) is shared."""
        self.shared_indices = shared
        for layer in self.owned:
            layer.self_attn.shared = shared
        self.carry_indices = not self.last and types[self.end] == "shared"

    def stage_input(self, input_ids: torch.Tensor, intermediate: dict[str, torch.Tensor] | None):
        """(hidden, residual) this stage starts from: the embedding, or the previous stage's output."""
        if intermediate is None:
            return self.embed_tokens(input_ids), None
        if "topk_indices" in intermediate:
            self.shared_indices.topk = intermediate["topk_indices"]
        return intermediate["hidden"], intermediate.get("residual")

    def stage_output(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """What a stage other than the last sends on (hyper-connection streams travel as ``hidden``)."""
        out = {"hidden": hidden} if residual is None else {"hidden": hidden, "residual": residual}
        if self.carry_indices:
            out["topk_indices"] = self.shared_indices.topk
        return out

    def forward(
        self,
        input_ids: torch.Tensor,
        step: Step,
        capture: list[torch.Tensor] | None = None,
        intermediate: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        hidden, residual = self.stage_input(input_ids, intermediate)
        if capture is not None:
            capture.append(hidden)
        for layer in self.owned:
            hidden, residual = layer(hidden, residual, step, capture)
        if not self.last:
            return self.stage_output(hidden, residual)
        if residual is None:  # no layers
            return self.norm(hidden)
        hidden, residual = self.norm(hidden, residual)
        if capture is not None:
            capture.append(residual)
        return hidden


class DecoderForCausalLM(CausalLM):
    """``model.*`` (a ``DecoderModel`` of ``layer_cls``) plus ``lm_head`` (tied when ``tie_word_embeddings``).

    ``quant_config`` (default: what the config's ``quantization_config`` asks for) picks each layer's
    method. ``mapping`` is the class's weight mapping; ``weight_mapping(config)`` gives an instance's
    (a family whose mapping depends on the config overrides it).
    """

    layer_cls: ClassVar[type[DecoderLayer]]
    #: the model body's class (a family whose residual is not one stream overrides it)
    model_cls: ClassVar[type[DecoderModel]] = DecoderModel
    #: a float32 LM head fed the final hidden state widened (HY4), as the family's reference keeps it
    lm_head_float32: ClassVar[bool] = False
    mapping = WeightMapping(packed=QKV_PACKED + GATE_UP_PACKED, ignore=IGNORE)

    def __init__(self, hf_config: Any, ctx: ModelContext, *, quant_config: QuantConfig | None = None):
        super().__init__()
        self.ctx, self.config = ctx, hf_config
        self.quant_config = quant_config or quant_config_of(hf_config)
        self.model = self.model_cls(ctx, hf_config, self.layer_cls, prefix="model", quant_config=self.quant_config)
        head_ctx = dataclasses.replace(ctx, dtype=torch.float32) if self.lm_head_float32 else ctx
        self.lm_head = StandIn("the LM head")
        if ctx.owns("last"):
            self.lm_head = ParallelLMHead(head_ctx, hf_config.vocab_size, hf_config.hidden_size, prefix="lm_head")
            if getattr(hf_config, "tie_word_embeddings", False):
                self.lm_head.tie(self.model.embed_tokens)
        self.mapping = self.weight_mapping(hf_config)

    def weight_mapping(self, hf_config: Any) -> WeightMapping:
        """This model's mapping: the class's, unless a family derives it from the config."""
        return type(self).mapping

    def forward(
        self,
        input_ids: torch.Tensor,
        step: Step,
        capture: list[torch.Tensor] | None = None,
        intermediate: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        return self.model(input_ids, step, capture, intermediate)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden.float() if self.lm_head_float32 else hidden)
