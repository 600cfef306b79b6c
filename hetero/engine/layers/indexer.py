"""The lightning indexer of DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): which keys each query attends to.

Per token (transformers' ``DeepseekV32Indexer`` / ``GlmMoeDsaIndexer``):

- ``q = wq_b(q_resid)`` viewed [T, Hi, D], where ``q_resid`` is MLA's ``q_a_layernorm(q_a_proj(x))``;
- ``k = LayerNorm(wk(x))`` [T, D] (``k_norm``: weight and bias, eps 1e-6, the ``layer_norm`` op);
- rope on the FIRST ``qk_rope_head_dim`` dims of q and k (``[rope | nope]``, unlike MLA's ``[nope | rope]``),
  NeoX pairs for V3.2, interleaved pairs for GLM-5, over MLA's cos/sin table; HY4 (``rope_last``) ropes the
  LAST ones, and keeps ``k_norm``'s parameters in float32 (``k_norm_float32``, eps ``rms_norm_eps``);
- ``weights = weights_proj(x) * Hi**-0.5 * D**-0.5`` in float32 (``weights_proj`` is a float32 layer, as
  transformers keeps it); ``D**-0.5`` is transformers' softmax scale inside the ReLU, folded out (ReLU is
  positively homogeneous);
- ``write_index_k`` puts k into this layer's own paged cache (``index_cache`` [D] per token, a ``PagedEntry``
  beside MLA's latent entries, so it shares their block ids), and ``indexer_topk`` returns int32 [T, topk]
  key positions (-1 padded) for ``mla_attention(topk_indices=...)``.

Tensor parallel: the indexer is replicated (every projection a ``ReplicatedLinear``), so every rank computes
the same indices and all ranks attend to the same keys.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.cached import CachedLayer, PagedEntry
from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import copy_checked, join_prefix
from hetero.engine.quant.config import QuantConfig
from hetero.engine.step import Step

__all__ = ["LayerNorm", "Indexer", "INDEXER_NORM_EPS"]

#: transformers builds the indexer's k_norm as ``nn.LayerNorm(index_head_dim, eps=1e-6)``
INDEXER_NORM_EPS = 1e-6


class LayerNorm(nn.Module):
    """``layer_norm(x, weight, bias, eps)`` over the last dimension (torch.nn.LayerNorm with bias)."""

    def __init__(self, ctx: ModelContext, hidden: int, eps: float, *, prefix: str = ""):
        super().__init__()
        self.eps, self.prefix = float(eps), prefix
        for name in ("weight", "bias"):
            p = nn.Parameter(ctx.empty(hidden), requires_grad=False)
            p.weight_loader = lambda param, t, shard=None, name=name: copy_checked(param, t, f"LayerNorm {name}")
            p.shards = (None,)
            self.register_parameter(name, p)
        ctx.bind_op(self, "_layer_norm", "layer_norm")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._layer_norm(x, self.weight, self.bias, self.eps)


class Indexer(CachedLayer):
    """``forward(hidden [T, H], q_resid [T, q_lora_rank], step) -> int32 [T, index_topk]`` (see the module docstring).

    ``rotary`` is a twin of MLA's rotary module (same table); its pair layout is set here from ``interleaved``.
    """

    def __init__(
        self,
        ctx: ModelContext,
        hf_config: Any,
        rotary: RotaryEmbedding,
        *,
        interleaved: bool,
        rope_last: bool = False,
        k_norm_eps: float = INDEXER_NORM_EPS,
        k_norm_float32: bool = False,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        c = hf_config
        self.prefix, self.rope_last = prefix, rope_last
        self.num_heads, self.head_dim = int(c.index_n_heads), int(c.index_head_dim)
        self.topk = int(c.index_topk)
        if c.qk_rope_head_dim > self.head_dim:
            raise ValueError(
                f"index_head_dim ({self.head_dim}) is smaller than qk_rope_head_dim ({c.qk_rope_head_dim})"
            )
        self.weight_scale = self.num_heads**-0.5 * self.head_dim**-0.5

        def at(name: str) -> dict[str, Any]:
            return dict(prefix=join_prefix(prefix, name), quant_config=quant_config)

        self.wq_b = ReplicatedLinear(ctx, c.q_lora_rank, self.num_heads * self.head_dim, **at("wq_b"))
        self.wk = ReplicatedLinear(ctx, c.hidden_size, self.head_dim, **at("wk"))
        fp32 = dataclasses.replace(ctx, dtype=torch.float32)
        norm_ctx = fp32 if k_norm_float32 else ctx
        self.k_norm = LayerNorm(norm_ctx, self.head_dim, k_norm_eps, prefix=join_prefix(prefix, "k_norm"))
        self.weights_proj = ReplicatedLinear(fp32, c.hidden_size, self.num_heads, **at("weights_proj"))
        self.rotary = rotary
        rotary.is_neox = not interleaved
        ctx.bind_op(self, "_write", "write_index_k")
        ctx.bind_op(self, "_topk", "indexer_topk")
        self.index_cache: torch.Tensor | None = None

    def cache_spec(self) -> tuple[PagedEntry, ...]:
        return (PagedEntry("index_cache", (self.head_dim,)),)

    def forward(self, hidden: torch.Tensor, q_resid: torch.Tensor, step: Step) -> torch.Tensor:
        if self.index_cache is None:
            raise RuntimeError(
                "Indexer: the index-key cache is not allocated (ModelRunner binds it before the first step)"
            )
        t = hidden.shape[0]
        q = self.wq_b(q_resid).view(t, self.num_heads, self.head_dim)
        k = self.k_norm(self.wk(hidden)).view(t, 1, self.head_dim)
        if self.rope_last:  # HY4: rope on the last rope dims ([nope | rope]), the first ones pass
            cut = self.head_dim - self.rotary.cos_sin_cache.shape[-1]
            q_rot, k_rot = self.rotary(step.positions, q[..., cut:].contiguous(), k[..., cut:].contiguous())
            q, k = torch.cat([q[..., :cut], q_rot], dim=-1), torch.cat([k[..., :cut], k_rot], dim=-1)
        else:
            q, k = self.rotary(step.positions, q, k)
        self._write(k.view(t, self.head_dim), self.index_cache, step.slot_mapping)
        weights = self.weights_proj(hidden.float()) * self.weight_scale
        return self._topk(q.contiguous(), weights, self.index_cache, step.meta, topk=self.topk)
