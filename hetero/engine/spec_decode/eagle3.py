"""EAGLE-3 drafting: a one-layer Llama head fed three of the target's layer outputs, in vLLM's checkpoint layout.

The format, as vLLM loads it (``model_executor/models/llama_eagle3.py``, ``v1/spec_decode/llm_base_proposer.py``,
``v1/worker/gpu_model_runner.py``, ``model_executor/models/interfaces.py``):

- config.json: ``architectures[0]`` ``LlamaForCausalLMEagle3`` or ``Eagle3LlamaForCausalLM``, otherwise a Llama
  config (hidden_size, heads, head_dim, intermediate_size, rope, rms_norm_eps), ``num_hidden_layers`` 1,
  ``vocab_size`` the target's, ``draft_vocab_size`` (absent: the full vocabulary), ``target_hidden_size``
  (absent: hidden_size), and the aux layer ids: ``eagle_aux_hidden_state_layer_ids`` at the top level or in
  ``eagle_config``, else (2, L // 2, L - 3) for a target of L layers. vLLM sorts and de-duplicates them; id i
  is the residual stream entering target layer i (id 0 the embedding output, id L the last layer's output).
- tensors: ``fc.weight`` [H, n * H_target] over the n aux streams concatenated in id order; ``midlayer.*``, one
  Llama decoder layer (``input_layernorm``, ``hidden_norm``, ``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,
  down}_proj``, ``post_attention_layernorm``) whose q/k/v read 2H features; ``norm.weight``; ``lm_head.weight``
  [draft_vocab, H]; ``d2t`` int64 [draft_vocab] (draft id j is target id j + d2t[j]); ``t2d`` bool
  [target_vocab] (the inverse map's mask, not needed to draft); ``embed_tokens.weight`` only when the draft
  has its own table, else the target's embedding is used (and the target's LM head when ``lm_head`` is absent,
  which needs the full vocabulary).
- forward: e = input_layernorm(embed(token)), h = hidden_norm(hidden); attention over cat(e, h) [2H], with the
  residual stream starting at the un-normed hidden (at h with ``norm_before_residual``); post-attention norm
  and MLP as in Llama. The draft returns (norm(out + residual), out + residual): the logits come from the
  normed one, and the sum before the norm is the hidden fed to the next draft step (the normed one with
  ``norm_output``).
- logits over the draft vocabulary are scattered into the target's, -inf elsewhere, so the chosen ids are
  target ids.

Here ``forward`` returns the hidden the next step takes and ``compute_logits`` applies the final norm, the draft
LM head and the scatter; ``target_hidden`` applies ``fc`` to the captured streams. Variants refused by name are
in ``_eagle3_checks``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from hetero.engine.layers.gqa import GQAttention, head_dim_of
from hetero.engine.layers.linear import QKVParallelLinear, ReplicatedLinear
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import GATE_UP_PACKED, QKV_PACKED, DecoderModel, GatedMLP
from hetero.engine.spec_decode._eagle3_checks import DraftFacts, draft_facts
from hetero.engine.step import Step
from hetero.errors import UsageError

__all__ = ["Eagle3Draft", "build_eagle3"]


class _Eagle3Attention(GQAttention):
    """Llama GQA attention whose q/k/v read the 2H-wide cat(normed embedding, normed hidden)."""

    def __init__(self, ctx: ModelContext, config: Any, rotary: RotaryEmbedding, *, prefix: str):
        super().__init__(ctx, config, 0, rotary, prefix=prefix)
        # the base class sizes q/k/v for H inputs; this one replaces it (as vLLM's layer 0 does)
        self.qkv_proj = QKVParallelLinear(
            ctx,
            2 * config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=self.biases(config)[0],
            prefix=join_prefix(prefix, "qkv_proj"),
        )


class _MidLayer(nn.Module):
    """The draft's decoder layer: ``forward(embeds, hidden, step) -> (out, residual)``, unsummed."""

    def __init__(self, ctx: ModelContext, config: Any, rotary: RotaryEmbedding, *, prefix: str):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = _Eagle3Attention(ctx, config, rotary, prefix=join_prefix(prefix, "self_attn"))
        self.mlp = GatedMLP(
            ctx, h, config.intermediate_size, bias=bool(config.mlp_bias), prefix=join_prefix(prefix, "mlp")
        )
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            setattr(self, name, RMSNorm(ctx, h, eps, prefix=join_prefix(prefix, name)))
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = self.self_attn(torch.cat([self.input_layernorm(embeds), normed], dim=-1), step)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class Eagle3Draft(nn.Module):
    """An EAGLE-3 head as a draft module (the contract ``spec_decode.proposer`` calls).

    ``aux_ids``: the target capture indices it reads (vLLM's aux layer ids: capture index i is the stream
    entering layer i); ``aux_layers``: the same as the target layers whose outputs they are (i - 1; -1 is the
    embedding output). ``embed`` / ``lm_head``: the target's modules, used when the checkpoint has none (kept
    outside this module's parameters, so loading does not ask for them).
    """

    takes_hidden = True

    def __init__(
        self,
        ctx: ModelContext,
        facts: DraftFacts,
        max_positions: int,
        *,
        embed: nn.Module | None = None,
        lm_head: nn.Module | None = None,
    ):
        super().__init__()
        config = self.config = facts.config
        h, n = config.hidden_size, len(facts.aux_ids)
        self.aux_ids = facts.aux_ids
        self.aux_layers = tuple(i - 1 for i in facts.aux_ids)
        self.target_vocab, self.norm_output = facts.target_vocab, bool(getattr(config, "norm_output", False))
        self.fc = ReplicatedLinear(ctx, n * facts.target_hidden, h, prefix="fc")
        rotary = RotaryEmbedding(ctx, config, head_dim_of(config), max_positions, is_neox=True)
        self.midlayer = _MidLayer(ctx, config, rotary, prefix="midlayer")
        self.norm = RMSNorm(ctx, h, config.rms_norm_eps, prefix="norm")
        self._shared = {}
        if facts.own_embed:
            self.embed_tokens = VocabParallelEmbedding(ctx, config.vocab_size, h, prefix="embed_tokens")
        else:
            self._shared["embed_tokens"] = embed
        if facts.own_lm_head:
            self.lm_head = ParallelLMHead(ctx, config.draft_vocab_size, h, prefix="lm_head")
        else:
            self._shared["lm_head"] = lm_head
        self.d2t: nn.Parameter | None = None
        if config.draft_vocab_size != facts.target_vocab:
            self.d2t = nn.Parameter(ctx.empty(config.draft_vocab_size, dtype=torch.int64), requires_grad=False)
        self.target_ids: torch.Tensor | None = None
        self.mapping = WeightMapping(packed=QKV_PACKED + GATE_UP_PACKED, ignore=(r"t2d",))

    def _module(self, name: str) -> nn.Module:
        return self._shared[name] if name in self._shared else getattr(self, name)

    def post_load(self) -> None:
        """The target id of every draft id (``d2t`` added to it), for the scatter in ``compute_logits``."""
        if self.d2t is not None:
            self.target_ids = torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def target_hidden(
        self, last_hidden: torch.Tensor, captured: list[torch.Tensor], rows: torch.Tensor
    ) -> torch.Tensor:
        """``fc`` over the aux streams at the target step's ``rows``, concatenated in id order -> [R, H]."""
        return self.fc(torch.cat([captured[i].index_select(0, rows) for i in self.aux_ids], dim=-1))

    def forward(self, input_ids: torch.Tensor, step: Step, hidden: torch.Tensor) -> torch.Tensor:
        x, residual = self.midlayer(self._module("embed_tokens")(input_ids), hidden, step)
        if self.norm_output:
            return self.norm(x, residual)[0]
        return x + residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._module("lm_head")(hidden if self.norm_output else self.norm(hidden))
        if self.target_ids is None:
            return logits
        out = logits.new_full((logits.shape[0], self.target_vocab), float("-inf"))
        out[:, self.target_ids] = logits
        return out


def _check_vocab_map(model_dir: str, draft: Eagle3Draft) -> None:
    ids = draft.target_ids
    if ids is None:
        return
    outside = int(((ids < 0) | (ids >= draft.target_vocab)).sum())
    if outside or ids.unique().numel() != ids.numel():
        what = f"{outside} outside the vocabulary" if outside else "some repeated"
        raise UsageError(
            f"speculative_config: argument 'model': EAGLE-3 draft {model_dir}: tensor d2t maps draft ids to target "
            f"ids {what}",
            arg="speculative_config.model",
            expected=f"distinct target ids in [0, {draft.target_vocab})",
            got=what,
        )


def build_eagle3(model_dir: str, runner) -> Eagle3Draft:
    """The EAGLE-3 draft at ``model_dir`` for ``runner``'s target, built with its ModelContext and loaded."""
    from hetero.engine.loader import load_weights

    body = getattr(runner.model, "model", None)
    if type(body) is not DecoderModel:
        raise UsageError(
            f"speculative_config: method 'eagle3': {type(runner.model).__name__} does not keep its layer outputs "
            "as one residual stream, which an EAGLE-3 draft reads",
            arg="speculative_config.method",
            expected="a target built on the shared decoder (Qwen2/3, Qwen3-MoE, ...)",
            got=type(runner.model).__name__,
        )
    facts = draft_facts(model_dir, runner.config.hf_config, len(body.layers))
    ctx = runner.model.ctx
    max_positions = max(int(facts.config.max_position_embeddings), int(runner.config.max_model_len))
    draft = Eagle3Draft(ctx, facts, max_positions, embed=body.embed_tokens, lm_head=runner.model.lm_head)
    load_weights(draft, model_dir)
    _check_vocab_map(model_dir, draft)
    return draft
