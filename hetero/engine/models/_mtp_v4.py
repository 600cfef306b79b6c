"""DeepSeek-V4's MTP layer as a speculative draft (``speculative_config`` method "mtp"; ``mtp.py`` has the draft
contract and the other families' layouts).

Layout, as the release's ``inference/model.py`` (``MTPBlock``, built ``Block(num_hidden_layers + i)``) and vLLM's
``deepseek_v4_mtp.py`` load it: checkpoint tensors ``mtp.{i}.*`` in the release's names, ``num_nextn_predict_layers``
of them (the first runs):

- ``enorm``, ``hnorm``, ``norm`` (RMSNorms), ``e_proj`` and ``h_proj`` (H -> H each, no bias, quantized as the
  release's other projections) and the layer's own ``hc_head_fn`` [N, N*H], ``hc_head_base`` [N], ``hc_head_scale``
  [1];
- a whole decoder block of index ``num_hidden_layers`` in the family's names (``attn.*``, ``ffn.*``, ``attn_norm``,
  ``ffn_norm``, ``hc_attn_*``, ``hc_ffn_*``): a sliding-window layer (no compressor; the main rope), as vLLM builds
  it and as the release config's ``compress_ratios`` has it (its entry past the layers is 0); an index past the
  hash layers, so a score-routed MoE with ``gate.bias``.

Forward over ``hc_mult`` streams: row p is fed the token at p+1 and the target's last-layer streams at p (before
``hc_head``); ``x = e_proj(enorm(embed(token))) + h_proj(hnorm(streams))`` (each stream normed and projected alone,
the embedding's projection added to all), then the block. Its output streams are what a chained step is fed back
(vLLM); the logits are the target's head over ``norm(hc_head(streams))`` with the MTP layer's own ``hc_head`` and
``norm``. A position-0 row's token embedding is zeroed, as vLLM does. The embedding and head are the target's (the
reference assigns them to the block); copies under the layer are ignored by name.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

from hetero.engine.layers.hyper import HyperHead
from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.models.decoder import IGNORE
from hetero.engine.models.mtp import MTPDraft, mtp_layer_count
from hetero.errors import UsageError

__all__ = ["DeepseekV4MTPDraft"]


def _check_sliding(model_dir, n: int) -> None:
    """Refuse, by field name, a release config whose MTP entry (index ``n``) asks for a compressed layer."""
    path = Path(model_dir) / "config.json"
    raw = json.loads(path.read_text()) if path.is_file() else {}
    for field, fixed in (("compress_ratios", 0), ("layer_types", "sliding_attention")):
        kinds = raw.get(field) or []
        if len(kinds) > n and kinds[n] != fixed:
            raise UsageError(
                f"speculative_config: method 'mtp': a DeepSeek-V4 MTP layer of {field}[{n}] = {kinds[n]!r} "
                "(compressed) is not implemented: hetero runs it as a sliding-window layer, as the releases declare",
                arg=field,
                expected=f"{field}[{n}] = {fixed!r}",
                got=kinds[n],
            )


class DeepseekV4MTPDraft(MTPDraft):
    """DeepSeek-V4's ``mtp.0.*`` (see the module docstring): the target's ``layer_cls`` at index
    ``num_hidden_layers`` under ``mtp.0`` with ``enorm``, ``hnorm``, ``e_proj``, ``h_proj``, ``hc_head``, ``norm``
    beside its modules. It reads the target's last-layer streams, so the runner captures the layer outputs."""

    def __init__(self, target: nn.Module, model_dir):
        super().__init__(target)
        config, ctx, q = target.config, target.ctx, target.quant_config
        n = config.num_hidden_layers
        mtp_layer_count(target, ("num_nextn_predict_layers",))
        _check_sliding(model_dir, n)
        covering = copy.copy(config)
        covering.num_hidden_layers = n + 1
        covering.layer_types = list(config.layer_types[:n]) + ["sliding_attention"]
        covering.mlp_layer_types = list(config.mlp_layer_types[:n]) + ["moe"]
        cls, hidden, eps, prefix = target.layer_cls, config.hidden_size, config.rms_norm_eps, "mtp.0"
        layer = cls(ctx, covering, n, cls.rotary_table(ctx, config), prefix=prefix, quant_config=q)
        for name in ("enorm", "hnorm", "norm"):
            layer.add_module(name, cls.norm_cls(ctx, hidden, eps, prefix=f"{prefix}.{name}"))
        for name in ("e_proj", "h_proj"):
            layer.add_module(name, ReplicatedLinear(ctx, hidden, hidden, prefix=f"{prefix}.{name}", quant_config=q))
        layer.hc_head = HyperHead(ctx, config, names=("fn", "base", "scale"), prefix=f"{prefix}.hc_head")
        self.mtp = nn.ModuleDict({"0": layer})
        self.streams, self.hidden = int(config.hc_mult), hidden
        self.aux_layers = (n - 1,)  # the runner keeps every layer's streams; the last one's are read
        m = target.mapping
        self.mapping = dataclasses.replace(
            m,
            experts=tuple(
                (p.replace(r"model\.layers\.", r"mtp\."), t.replace("model.layers.", "mtp."), proj)
                for p, t, proj in m.experts
            ),
            ignore=IGNORE + (r"(?!mtp\.0\.).*", r"mtp\.0\.(emb|embed|embed_tokens|head|shared_head)\..*"),
            renames=((r"^mtp\.(\d+)\.hc_head_(fn|base|scale)$", r"mtp.\1.hc_head.\2"),) + m.renames,
        )

    def target_hidden(self, last_hidden: torch.Tensor, captured, rows: torch.Tensor) -> torch.Tensor:
        """The target's last-layer streams at each row, flattened to [R, N*H] (``captured[0]`` is the embedding)."""
        return captured[len(self._target.model.layers)][rows].flatten(1)

    def forward(self, input_ids: torch.Tensor, step, hidden: torch.Tensor) -> torch.Tensor:
        layer, t, h = self.mtp["0"], hidden.shape[0], self.hidden
        embedded = self.embed(input_ids).masked_fill((step.positions == 0).unsqueeze(-1), 0)
        projected = layer.h_proj(layer.hnorm(hidden.reshape(t * self.streams, h))).view(t, self.streams, h)
        streams = projected + layer.e_proj(layer.enorm(embedded)).unsqueeze(1)
        return layer(streams, input_ids, step, {}).flatten(1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's head over ``norm(hc_head(streams))``, with the MTP layer's ``hc_head`` and ``norm``."""
        layer = self.mtp["0"]
        return self._target.compute_logits(layer.norm(layer.hc_head(hidden.view(hidden.shape[0], self.streams, -1))))
