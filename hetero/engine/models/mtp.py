"""Multi-token prediction (MTP): a checkpoint's own next-token layers, run as a speculative draft.

Three layouts, each built from the target model's own decoder layer class (so MLA, DSA's indexer, GQA,
the MoE schedule and the norms are the family's) with the target's ``ModelContext`` and quantization:

- ``NextNDraft``, DeepSeek-V3 / V3.2 and GLM-4.5 (``num_nextn_predict_layers``): checkpoint layer
  ``model.layers.{N}`` (N = ``num_hidden_layers``) holds ``enorm``, ``hnorm``, ``eh_proj`` (2H -> H, no bias),
  a whole decoder layer of index N (``self_attn``, ``mlp``, its norms) and ``shared_head.norm``;
- ``HYV3MTPDraft``, Hy3 (``num_nextn_predict_layers``): DeepSeek's layout with the final norm named
  ``final_layernorm`` (vLLM's ``hy_v3_mtp.py``), the checkpoint's ``shared_head.*`` and ``embed_tokens``
  under that layer ignored;
- ``QwenMTPDraft``, Qwen3-Next and Qwen3.5 (``mtp_num_hidden_layers``): ``mtp.fc`` (2H -> H, no bias),
  ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, a full-attention decoder layer
  ``mtp.layers.{i}`` (the MoE schedule at index i) and ``mtp.norm``, all the family's zero-centred norms.

All three compute ``norm(layer(proj(cat(norm_e(embed(token)), norm_h(hidden)))))``: the row at position p is
fed the token at p+1 and the target's final hidden state at p, and writes the draft's KV at p. The
embedding and the LM head are the target's: a checkpoint's own copies (DeepSeek's
``model.layers.{N}.embed_tokens`` / ``shared_head.head``) are ignored by name. The draft's output is its
final-normed hidden state, which is also what a chained step is fed back, as vLLM's DeepSeek and Qwen
MTP modules (and SGLang's) recycle it; the logits are the target's head over it. Only the first MTP
layer runs, for every draft step (vLLM's default proposer also keeps ``spec_step_idx`` at 0); the
checkpoint's further MTP layers are ignored. The draft loads its tensors with its own ``WeightMapping``
through ``hetero.engine.loader.load_weights``, so absent MTP tensors fail as the loader's missing weights.
DeepSeek-V4's layer (``mtp.{i}.*``, over hyper-connection streams) is ``_mtp_v4.DeepseekV4MTPDraft``.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch import nn

from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.models.decoder import IGNORE
from hetero.errors import UsageError

__all__ = ["HYV3MTPDraft", "MTPDraft", "NextNDraft", "QwenMTPDraft", "mtp_layer_count"]


def mtp_layer_count(target: nn.Module, fields: tuple[str, ...]) -> int:
    """The MTP layers ``target``'s config declares in the first of ``fields`` it sets; refused when none."""
    config = target.config
    for name in fields:
        value = getattr(config, name, None)
        if value:
            return int(value)
    got = getattr(config, fields[0], None)
    raise UsageError(
        f"speculative_config: method 'mtp': {type(target).__name__}'s config declares no MTP layers "
        f"({fields[0]} = {got!r})",
        arg=fields[0],
        expected="at least 1 (a checkpoint with its next-token prediction layers)",
        got=got,
    )


class MTPDraft(nn.Module):
    """The draft-module contract of ``hetero.engine.spec_decode.proposer`` for an MTP layer.

    ``target`` is kept outside the module tree, so its parameters are not the draft's to load and its
    cached layers get no second cache; the draft shares its embedding and LM head.
    """

    takes_hidden = True
    aux_layers: tuple[int, ...] = ()

    def __init__(self, target: nn.Module):
        super().__init__()
        object.__setattr__(self, "_target", target)
        self.ctx, self.config = target.ctx, target.config

    def target_hidden(self, last_hidden: torch.Tensor, captured, rows: torch.Tensor) -> torch.Tensor:
        """The target's final hidden state at each draft row's position."""
        return last_hidden[rows]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self._target.model.embed_tokens(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary: the target's own LM head."""
        return self._target.compute_logits(hidden)

    def load(self, model_dir) -> MTPDraft:
        """Fill the draft's parameters from the target's checkpoint (``self.mapping``)."""
        from hetero.engine.loader import load_weights

        load_weights(self, model_dir)
        return self.eval()


def _covering(config: Any, total: int) -> Any:
    """A copy of ``config`` whose per-layer lists also cover the MTP layers (indices up to ``total``): V3.2's
    ``mlp_layer_types`` by the ``first_k_dense_replace`` rule vLLM applies to them, GLM-5's ``indexer_types``
    "full" (an MTP layer runs its own indexer)."""
    c = copy.copy(config)
    n = config.num_hidden_layers
    c.num_hidden_layers = total
    kinds = getattr(config, "mlp_layer_types", None)
    if kinds is not None:
        if getattr(config, "first_k_dense_replace", None) is None:
            raise UsageError(
                "speculative_config: method 'mtp': the MTP layers' MLP kind follows first_k_dense_replace, "
                "which the config does not set",
                arg="first_k_dense_replace",
                expected="the number of leading dense layers (as the released checkpoints declare)",
                got=None,
            )
        c.mlp_layer_types = list(kinds[:n]) + [
            "sparse" if i >= config.first_k_dense_replace else "dense" for i in range(n, total)
        ]
    if getattr(config, "indexer_types", None) is not None:
        c.indexer_types = list(config.indexer_types[:n]) + ["full"] * (total - n)
    return c


class NextNDraft(MTPDraft):
    """DeepSeek-V3 / V3.2 and GLM-4.5's next-n layer ``model.layers.{N}`` (see the module docstring).

    The decoder layer is the target's ``layer_cls`` at index N, so the MoE schedule and V3.2's indexer
    (whose cache entries come with the layer) are the family's; ``enorm``, ``hnorm``, ``eh_proj`` (unquantized,
    as released) and ``shared_head.norm`` sit beside its modules under the checkpoint's names. A position-0
    row's token embedding is zeroed, as vLLM's DeepSeek and GLM MTP layers do.
    """

    #: the final norm's name under the layer, and the layer's copies of the target's tensors (ignored)
    final_norm = "shared_head.norm"
    copies = r"(embed_tokens|shared_head\.head)"

    def __init__(self, target: nn.Module):
        super().__init__(target)
        config, ctx, q = target.config, target.ctx, target.quant_config
        n = config.num_hidden_layers
        count = mtp_layer_count(target, ("num_nextn_predict_layers", "num_mtp_layers"))
        cls, prefix, hidden, eps = target.layer_cls, f"model.layers.{n}", config.hidden_size, config.rms_norm_eps
        covering = _covering(config, n + count)
        layer = cls(ctx, covering, n, cls.rotary_table(ctx, covering), prefix=prefix, quant_config=q)
        layer.enorm = cls.norm_cls(ctx, hidden, eps, prefix=f"{prefix}.enorm")
        layer.hnorm = cls.norm_cls(ctx, hidden, eps, prefix=f"{prefix}.hnorm")
        layer.eh_proj = ReplicatedLinear(ctx, 2 * hidden, hidden, prefix=f"{prefix}.eh_proj")
        *parents, leaf = self.final_norm.split(".")
        owner = layer
        for name in parents:
            owner.add_module(name, nn.Module())
            owner = getattr(owner, name)
        owner.add_module(leaf, cls.norm_cls(ctx, hidden, eps, prefix=f"{prefix}.{self.final_norm}"))
        self.key = str(n)
        self.model = nn.ModuleDict({"layers": nn.ModuleDict({self.key: layer})})
        mine = rf"model\.layers\.{n}\."
        self.mapping = dataclasses.replace(
            target.mapping,
            ignore=IGNORE + (rf"(?!{mine}).*", rf"{mine}{self.copies}\..*"),
        )

    def forward(self, input_ids: torch.Tensor, step, hidden: torch.Tensor) -> torch.Tensor:
        layer = self.model["layers"][self.key]
        embedded = self.embed(input_ids).masked_fill((step.positions == 0).unsqueeze(-1), 0)
        x = layer.eh_proj(torch.cat([layer.enorm(embedded), layer.hnorm(hidden)], dim=-1))
        out, residual = layer(x, None, step)
        return layer.get_submodule(self.final_norm)(out, residual)[0]


class HYV3MTPDraft(NextNDraft):
    """Hy3's MTP layer ``model.layers.{N}`` (vLLM's ``hy_v3_mtp.py``): ``enorm``, ``hnorm``, ``eh_proj``, the
    family's decoder layer (dense below ``first_k_dense_replace``, else sparse) and ``final_layernorm`` over
    its residual sum; the logits are the target head's over that, with no further norm. Any ``shared_head.*``
    and ``embed_tokens`` under the layer are ignored (vLLM loads the target's ``lm_head`` and embedding)."""

    final_norm = "final_layernorm"
    copies = r"(embed_tokens|shared_head)"


def _mtp_experts(rules: tuple[tuple[str, str, str], ...]) -> tuple[tuple[str, str, str], ...]:
    """The target's expert rules moved from ``model.layers.{i}`` to ``mtp.layers.{i}``."""
    return tuple(
        (p.replace(r"model\.layers\.", r"mtp\.layers\."), t.replace("model.layers.", "mtp.layers."), proj)
        for p, t, proj in rules
    )


class QwenMTPDraft(MTPDraft):
    """Qwen3-Next and Qwen3.5's ``mtp.*`` (see the module docstring): ``mtp.layers.0`` is the target's
    ``layer_cls`` at index 0 as a full-attention layer (vLLM builds it the same way), ``mtp.fc`` has the
    target's quantization; the checkpoint's tensors outside ``mtp.*`` are ignored."""

    def __init__(self, target: nn.Module):
        super().__init__(target)
        config, ctx, q = target.config, target.ctx, target.quant_config
        count = mtp_layer_count(target, ("mtp_num_hidden_layers", "num_nextn_predict_layers"))
        if getattr(config, "mtp_use_dedicated_embeddings", False):
            raise UsageError(
                "speculative_config: method 'mtp': an MTP layer with its own embedding is not implemented "
                "(hetero shares the target's)",
                arg="mtp_use_dedicated_embeddings",
                expected="false",
                got=config.mtp_use_dedicated_embeddings,
            )
        cls, hidden, eps = target.layer_cls, config.hidden_size, config.rms_norm_eps
        full = copy.copy(config)
        full.layer_types = ["full_attention"] * count
        mtp = nn.Module()
        mtp.fc = ReplicatedLinear(ctx, 2 * hidden, hidden, prefix="mtp.fc", quant_config=q)
        mtp.pre_fc_norm_embedding = cls.norm_cls(ctx, hidden, eps, prefix="mtp.pre_fc_norm_embedding")
        mtp.pre_fc_norm_hidden = cls.norm_cls(ctx, hidden, eps, prefix="mtp.pre_fc_norm_hidden")
        rotary = cls.rotary_table(ctx, full)
        mtp.layers = nn.ModuleList([cls(ctx, full, 0, rotary, prefix="mtp.layers.0", quant_config=q)])
        mtp.norm = cls.norm_cls(ctx, hidden, eps, prefix="mtp.norm")
        self.mtp = mtp
        self.mapping = dataclasses.replace(
            target.mapping,
            experts=_mtp_experts(target.mapping.experts),
            ignore=IGNORE + (r"(?!mtp\.).*", r"mtp\.layers\.(?!0\.).*"),
            renames=(),
        )

    def forward(self, input_ids: torch.Tensor, step, hidden: torch.Tensor) -> torch.Tensor:
        m = self.mtp
        x = m.fc(torch.cat([m.pre_fc_norm_embedding(self.embed(input_ids)), m.pre_fc_norm_hidden(hidden)], dim=-1))
        out, residual = m.layers[0](x, None, step)
        return m.norm(out, residual)[0]
