"""DeepSeek multi-head latent attention (MLA): a latent KV cache, absorbed decode, expanded prefill.

Per token the cache keeps one latent ``kv_c`` [kv_lora_rank] (after ``kv_a_layernorm``)
and one rope key ``k_pe`` [qk_rope_head_dim] (after rotary), shared by every head:

- decode rows (``[0, step.num_decodes)``) take the *absorbed* path: each head's
  ``W_UK`` (from ``kv_b_proj``, split per head by the post-load pass: ``post_load``,
  run by the loader after every load) is folded into its ``q_nope``, ``mla_attention``
  attends over the latent cache, and each head's ``W_UV`` maps the latent output
  to ``v_head_dim``. The per-head products are one ``grouped_gemm`` over head-major
  rows (group h = head h).
- prefill rows (``step.prefill``) gather their sequences' whole latent context from
  the cache by ``kv_slots`` (cached prefix and chunked prefill included), expand it
  with ``kv_b_proj`` into per-head ``k_nope`` / ``v``, append the shared ``k_pe`` and
  run ``varlen_attention`` (D = qk_nope + qk_rope, Dv = v_head_dim), causal.

``project`` (queries, latent write) and ``absorbed`` (the absorbed attention) are the parts sparse MLA
(``layers/dsa.py``) reuses with every row absorbed.

Matches transformers' DeepseekV2Attention / DeepseekV3Attention: rope on q_pe and k_pe
only, interleaved pairs (V2 always; V3 when ``rope_interleave``), q_a/kv_a layernorms
with transformers' default eps 1e-6, softmax scale ``qk_head_dim ** -0.5`` times
``yarn_get_mscale(factor, mscale_all_dim) ** 2`` for any non-default rope with
``mscale_all_dim`` set. Tensor parallel: heads split over ranks (q_proj / q_b_proj /
kv_b_proj column-parallel, o_proj row-parallel), q_a / kv_a replicated.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hetero.engine.context import ModelContext
from hetero.engine.layers.cached import CachedLayer, PagedEntry
from hetero.engine.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.parallel import divide
from hetero.engine.quant.config import QuantConfig
from hetero.engine.step import Step

__all__ = ["MLAttention", "mla_softmax_scale", "yarn_get_mscale"]

#: transformers builds q_a_layernorm / kv_a_layernorm with the RMSNorm default eps, not rms_norm_eps
LATENT_NORM_EPS = 1e-6


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """DeepSeek's yarn magnitude correction (transformers' ``yarn_get_mscale``)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def mla_softmax_scale(hf_config: Any) -> float:
    """``(qk_nope + qk_rope) ** -0.5``, times mscale(factor, mscale_all_dim)^2 for a scaled rope with
    ``mscale_all_dim`` set (transformers' ``yarn_apply_mscale``, applied to any non-default rope type)."""
    scale = (hf_config.qk_nope_head_dim + hf_config.qk_rope_head_dim) ** -0.5
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    if params.get("rope_type", params.get("type", "default")) != "default":
        mscale_all_dim = params.get("mscale_all_dim", 0)
        if mscale_all_dim:
            m = yarn_get_mscale(params["factor"], mscale_all_dim)
            scale = scale * m * m
    return scale


class MLAttention(CachedLayer):
    """``forward(hidden [T, H], step) -> [T, H]`` (after o_proj and its all-reduce).

    Built like every decoder token mixer (``models/decoder.py``; every MLA layer is alike, so ``layer_idx``
    is not used here). ``rotary``'s cos/sin table is shared by all layers (it can be large; pass
    ``rotary.twin(ctx)``); build it with ``rotary_dim = qk_rope_head_dim`` and ``is_neox = not interleaved``.
    ``prefix`` is the checkpoint name ("model.layers.0.self_attn"); ``quant_config`` picks the projections'
    methods. MLA has one latent KV per token for all heads: ``num_key_value_heads``, when set, must equal
    ``num_attention_heads``.
    """

    #: static options of mla_attention (sparse MLA: ``topk_indices``); whether prefill rows take the expanded path
    mla_options: dict[str, Any] = {}
    expanded_prefill = True

    def __init__(
        self,
        ctx: ModelContext,
        hf_config: Any,
        layer_idx: int,
        rotary: RotaryEmbedding,
        *,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        c = hf_config
        if getattr(c, "num_key_value_heads", None) not in (None, c.num_attention_heads):
            raise ValueError(
                f"{prefix or 'MLAttention'}: MLA needs num_key_value_heads == num_attention_heads, "
                f"the config has {c.num_key_value_heads} and {c.num_attention_heads}"
            )
        self.ctx, self.prefix = ctx, prefix
        self.hidden = c.hidden_size
        self.num_heads = divide(c.num_attention_heads, ctx.parallel.size, "attention heads")
        self.q_lora_rank = getattr(c, "q_lora_rank", None)
        self.kv_lora_rank = c.kv_lora_rank
        self.nope, self.rope, self.v_dim = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        self.qk_dim = self.nope + self.rope
        self.scale = mla_softmax_scale(c)
        bias = bool(getattr(c, "attention_bias", False))
        total_heads = c.num_attention_heads

        def at(name: str) -> dict[str, Any]:
            return dict(prefix=join_prefix(prefix, name), quant_config=quant_config)

        if self.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(ctx, self.hidden, total_heads * self.qk_dim, **at("q_proj"))
        else:
            self.q_a_proj = ReplicatedLinear(ctx, self.hidden, self.q_lora_rank, bias=bias, **at("q_a_proj"))
            self.q_a_layernorm = RMSNorm(
                ctx, self.q_lora_rank, self.latent_norm_eps(c), prefix=join_prefix(prefix, "q_a_layernorm")
            )
            self.q_b_proj = ColumnParallelLinear(ctx, self.q_lora_rank, total_heads * self.qk_dim, **at("q_b_proj"))
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            ctx, self.hidden, self.kv_lora_rank + self.rope, bias=bias, **at("kv_a_proj_with_mqa")
        )
        self.kv_a_layernorm = RMSNorm(
            ctx, self.kv_lora_rank, self.latent_norm_eps(c), prefix=join_prefix(prefix, "kv_a_layernorm")
        )
        self.kv_b_proj = ColumnParallelLinear(
            ctx, self.kv_lora_rank, total_heads * (self.nope + self.v_dim), **at("kv_b_proj")
        )
        self.o_proj = RowParallelLinear(ctx, total_heads * self.v_dim, self.hidden, bias=bias, **at("o_proj"))
        self.rotary = rotary

        ctx.bind_op(self, "_write", "write_mla_kv")
        ctx.bind_op(self, "_mla", "mla_attention", head_dim=self.kv_lora_rank + self.rope, **self.mla_options)
        if self.expanded_prefill:
            ctx.bind_op(self, "_varlen", "varlen_attention", head_dim=self.qk_dim, head_dim_v=self.v_dim)
        ctx.bind_op(self, "_grouped_gemm", "grouped_gemm")
        self.ckv_cache: torch.Tensor | None = None
        self.kpe_cache: torch.Tensor | None = None
        # the absorbed path's per-head weights, set by post_load()
        self.w_uk_t: torch.Tensor | None = None
        self.w_uv: torch.Tensor | None = None

    def latent_norm_eps(self, hf_config: Any) -> float:
        """The eps of q_a_layernorm / kv_a_layernorm: transformers' RMSNorm default (a family may read its config)."""
        return LATENT_NORM_EPS

    def cache_spec(self) -> tuple[PagedEntry, ...]:
        return PagedEntry("ckv_cache", (self.kv_lora_rank,)), PagedEntry("kpe_cache", (self.rope,))

    # -- weights of the absorbed path ------------------------------------------------
    def post_load(self) -> None:
        """Split kv_b_proj's weight (dense, as its method gives it) into this rank's W_UK^T [h, Lkv, nope] and
        W_UV [h, v, Lkv], contiguous. The loader's post-load pass calls it after every load, once kv_b_proj's
        method has processed its weights; a weight edited in place afterwards is not seen until it runs again."""
        w = self.kv_b_proj.quant_method.dense_weight(self.kv_b_proj)
        per_head = w.view(self.num_heads, self.nope + self.v_dim, self.kv_lora_rank)
        self.w_uk_t = per_head[:, : self.nope].transpose(1, 2).contiguous()
        self.w_uv = per_head[:, self.nope :].contiguous()

    def _per_head(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [T, h, K], w [h, N, K] -> [T, h, N]: ``x[:, i] @ w[i].T`` for every head, one grouped GEMM."""
        t, h, k = x.shape
        rows = x.transpose(0, 1).reshape(h * t, k)
        ends = torch.arange(1, h + 1, dtype=torch.int32, device=x.device) * t
        return self._grouped_gemm(rows, w, ends).view(h, t, w.shape[1]).transpose(0, 1)

    # -- forward -----------------------------------------------------------------------
    def project(self, hidden: torch.Tensor, step: Step) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(q_nope [T, h, nope], rotated q_pe [T, h, rope], q_resid): the queries, and ``q_a_layernorm``'s output
        (None without q_lora_rank; the DSA indexer reads it). Writes this step's latent and rope key to the cache."""
        if self.ckv_cache is None:
            raise RuntimeError(
                "MLAttention: the latent KV cache is not allocated (ModelRunner binds it before the first step)"
            )
        t = hidden.shape[0]
        q_resid = None
        if self.q_lora_rank is None:
            q = self.q_proj(hidden)
        else:
            q_resid = self.q_a_layernorm(self.q_a_proj(hidden))
            q = self.q_b_proj(q_resid)
        q = q.view(t, self.num_heads, self.qk_dim)
        q_nope, q_pe = q[..., : self.nope], q[..., self.nope :].contiguous()

        latent = self.kv_a_proj_with_mqa(hidden)
        kv_c = self.kv_a_layernorm(latent[:, : self.kv_lora_rank].contiguous())
        k_pe = latent[:, self.kv_lora_rank :].contiguous().view(t, 1, self.rope)
        q_pe, k_pe = self.rotary(step.positions, q_pe, k_pe)
        self._write(kv_c, k_pe.view(t, self.rope), self.ckv_cache, self.kpe_cache, step.slot_mapping)
        return q_nope, q_pe, q_resid

    def absorbed(self, q_nope: torch.Tensor, q_pe: torch.Tensor, meta, **options) -> torch.Tensor:
        """``mla_attention`` over the latent cache for the rows of ``meta``: [n, h, v_head_dim] (``options``:
        ``topk_indices`` for sparse attention)."""
        if self.w_uk_t is None:
            raise RuntimeError(
                "MLAttention: no absorbed weights; the post-load pass computes them "
                "(hetero.engine.loader.load_weights runs it, or process_weights_after_loading)"
            )
        q_lat = self._per_head(q_nope, self.w_uk_t)  # [n, h, Lkv]
        o_lat = self._mla(
            q_lat.contiguous(), q_pe.contiguous(), self.ckv_cache, self.kpe_cache, meta, scale=self.scale, **options
        )
        return self._per_head(o_lat, self.w_uv)

    def forward(self, hidden: torch.Tensor, step: Step) -> torch.Tensor:
        t = hidden.shape[0]
        q_nope, q_pe, _ = self.project(hidden, step)
        out = hidden.new_empty(t, self.num_heads, self.v_dim)
        nd = step.num_decodes
        if nd:
            out[:nd] = self.absorbed(q_nope[:nd], q_pe[:nd], step.decode_meta)
        if step.prefill is not None:
            out[step.prefill.first_token :] = self._prefill(q_nope, q_pe, step)
        return self.o_proj(out.view(t, self.num_heads * self.v_dim))

    def _prefill(self, q_nope: torch.Tensor, q_pe: torch.Tensor, step: Step) -> torch.Tensor:
        span = step.prefill
        first = span.first_token
        slots = span.kv_slots
        kv_c = self.ckv_cache.view(-1, self.kv_lora_rank).index_select(0, slots)
        k_pe = self.kpe_cache.view(-1, self.rope).index_select(0, slots)
        tk = kv_c.shape[0]
        kv = self.kv_b_proj(kv_c).view(tk, self.num_heads, self.nope + self.v_dim)
        key = torch.cat(
            [kv[..., : self.nope], k_pe.view(tk, 1, self.rope).expand(tk, self.num_heads, self.rope)], dim=-1
        )
        value = kv[..., self.nope :].contiguous()
        query = torch.cat([q_nope[first:], q_pe[first:]], dim=-1)
        return self._varlen(
            query,
            key,
            value,
            span.cu_seqlens_q,
            span.cu_seqlens_k,
            span.max_seqlen_q,
            span.max_seqlen_k,
            scale=self.scale,
            causal=True,
        )
