"""What every model class provides to the runner and the loader."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from hetero.engine.layers.cached import CachedLayer
from hetero.engine.step import Step

__all__ = ["CausalLM", "WeightMapping"]


@dataclass(frozen=True)
class WeightMapping:
    """How checkpoint tensor names become parameter names, declared per model class.

    - ``packed``: (checkpoint fragment, parameter fragment, shard) triples: a
      checkpoint name containing ``.{checkpoint fragment}.`` loads into the
      parameter named with ``.{parameter fragment}.`` instead, at ``shard``
      (e.g. ("q_proj", "qkv_proj", "q"), ("gate_proj", "gate_up_proj", 0)).
    - ``experts``: (checkpoint regex, parameter name template, projection) triples for
      per-expert tensors; the regex has named groups ``layer`` and ``expert``, and
      optionally ``suffix`` (what follows the projection: ``weight``,
      ``weight_scale_inv``, ``bias``...); the template has ``{layer}``. The parameter is
      the template for suffix ``weight`` (or no suffix group) and template + "_" + suffix
      otherwise (``w13_weight_scale_inv``); the shard passed to the weight loader is
      (expert, projection). A regex without an ``expert`` group is one tensor of every
      expert (shard (None, projection)). See ``stacked_experts`` and ``fused_experts``.
    - ``ignore``: regexes of checkpoint tensors the model may find and does not use
      (rotary inv_freq buffers, MTP layers, a tied lm_head).
    - ``renames``: (regex, replacement) pairs applied in order (``re.sub``) to every checkpoint
      name before the rules above, for a release whose names are not the ones transformers
      uses (DeepSeek-V4's ``layers.3.attn.wq_a``); ``ignore``, ``experts`` and ``packed`` then
      see the renamed name.
    """

    packed: tuple[tuple[str, str, Any], ...] = ()
    experts: tuple[tuple[str, str, str], ...] = ()
    ignore: tuple[str, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def stacked_experts(
        checkpoint: str = r"model\.layers\.(?P<layer>\d+)\.mlp\.experts",
        parameter: str = "model.layers.{layer}.mlp.experts",
    ) -> tuple[tuple[str, str, str], ...]:
        """The ``experts`` rules of per-expert ``{checkpoint}.E.{gate,up,down}_proj.{suffix}`` tensors
        stacked into ``{parameter}.w13`` (gate, up) and ``{parameter}.w2`` (down), any suffix."""
        return tuple(
            (
                rf"{checkpoint}\.(?P<expert>\d+)\.{proj}_proj\.(?P<suffix>\w+)",
                f"{parameter}.{'w2' if proj == 'down' else 'w13'}",
                proj,
            )
            for proj in ("gate", "up", "down")
        )

    @staticmethod
    def fused_experts(
        checkpoint: str = r"model\.layers\.(?P<layer>\d+)\.mlp\.experts",
        parameter: str = "model.layers.{layer}.mlp.experts",
    ) -> tuple[tuple[str, str, str], ...]:
        """The ``experts`` rules of every expert in one tensor: ``{checkpoint}.gate_up_proj [E, 2I, H]`` (gate
        rows, then up rows) into ``{parameter}.w13``, ``{checkpoint}.down_proj [E, H, I]`` into ``.w2``; the
        shard is (None, "gate_up" | "down")."""
        return (
            (rf"{checkpoint}\.gate_up_proj", f"{parameter}.w13", "gate_up"),
            (rf"{checkpoint}\.down_proj", f"{parameter}.w2", "down"),
        )

    @staticmethod
    def expert_param(template: str, groups: dict[str, Any]) -> str:
        """The parameter name an expert rule's match ``groups`` (layer, optional suffix) stands for."""
        name, suffix = template.format(layer=groups["layer"]), groups.get("suffix")
        return name if suffix in (None, "weight") else f"{name}_{suffix}"

    @staticmethod
    def expert_groups(template: str, param_name: str) -> dict[str, str] | None:
        """``expert_param`` reversed: the layer and suffix of ``param_name`` under ``template``, or None."""
        pattern = re.escape(template).replace(re.escape("{layer}"), r"(?P<layer>\d+)") + r"(?:_(?P<suffix>\w+))?"
        m = re.fullmatch(pattern, param_name)
        if m is None:
            return None
        return {"layer": m["layer"], "suffix": m["suffix"] or "weight"}


class CausalLM(nn.Module):
    """A decoder-only model built from hetero layers (the families here: ``decoder.DecoderForCausalLM``).

    ``__init__(hf_config, ctx)`` (keeps ``self.ctx``, the ModelContext); ``forward(input_ids int64 [T], step,
    capture=None) -> hidden [T, H]`` (after the final norm; the positions are ``step.positions``); when
    ``capture`` is a list, the embedding output and then each decoder layer's output (the full residual
    stream, as transformers' ``output_hidden_states``) are appended to it, in order.
    ``compute_logits(hidden [N, H]) -> float32 [N, vocab]`` (whole vocabulary on every rank).
    """

    mapping: ClassVar[WeightMapping] = WeightMapping()

    def forward(self, input_ids: torch.Tensor, step: Step, capture: list[torch.Tensor] | None = None) -> torch.Tensor:
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def cached_layers(self) -> list[CachedLayer]:
        return [m for m in self.modules() if isinstance(m, CachedLayer)]
