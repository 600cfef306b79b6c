"""DeepSeek-V3.2 sparse attention (DSA) on hetero: a sparse MLA backend and the lightning indexer.

``HeteroSparseMLABackend`` (``is_sparse()``) serves vLLM's ``MLAAttention`` layers built with
``use_sparse=True``: every token goes through ``forward_mqa`` (its metadata reports the whole step as
"decode", so vLLM's dense-MHA prefill is never used), which calls hetero ``mla_attention`` with the
step's rows of vLLM's shared top-k buffer; the latent cache is written with hetero ``write_mla_kv``.
vLLM does the W_UK absorption and W_UV projection around it. Any ``kv_lora_rank + rope``, any block size.

The top-k buffer is filled by the layer's indexer, which the impl hands to ``_dsa_indexer.adopt`` when
vLLM builds it (hetero ``write_index_k`` + ``indexer_topk``, see there). Under torch.compile nothing in the
graph links the indexer op to vLLM's opaque attention op, which reads the buffer at runtime; the impl gives
the indexer a fence tensor on the attention's side of the graph (``process_weights_after_loading``) and
``forward_mqa`` refuses to read top-k rows its indexer did not write in the current step. Selection is the platform's:
vLLM's CPU platform refuses sparse attention (``platforms/cpu.py``: "Sparse Attention is not supported on
CPU"), so DSA routes only on hetero's platform (``HETERO_VLLM_PLATFORM=1``), whose
``get_attn_backend_cls`` returns ``backend_path()`` for ``use_mla and use_sparse``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionType, CommonAttentionMetadata, MLAAttentionImpl

from hetero_vllm import _dsa_ops, _mla_ops, report  # noqa: F401  (they define torch.ops.hetero.*)
from hetero_vllm.attention import HeteroAttentionMetadata, HeteroAttentionMetadataBuilder

__all__ = ["HeteroSparseMLABackend", "HeteroSparseMLAImpl", "backend_path", "register"]

_logger = logging.getLogger("vllm.hetero_vllm")
_SITE = "MLAAttention"
_NAME = "HETERO_MLA_SPARSE"


@dataclass
class HeteroSparseMLAMetadata(HeteroAttentionMetadata):
    """hetero attention's batch layout plus the fields ``MLAAttention.forward_impl`` reads: the whole step
    is one "decode" (MQA) part, which hetero ``mla_attention`` serves for prefill and decode alike."""

    num_decodes: int = 0
    num_decode_tokens: int = 0
    num_prefills: int = 0
    prefill: None = None
    decode: None = None


class HeteroSparseMLAMetadataBuilder(HeteroAttentionMetadataBuilder):
    """``HeteroSparseMLAMetadata`` from vLLM's ``CommonAttentionMetadata`` (no copies)."""

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> HeteroSparseMLAMetadata:
        m = super().build(common_prefix_len, common_attn_metadata, fast_build)
        fields = {name: getattr(m, name) for name in HeteroAttentionMetadata.__dataclass_fields__}
        n = m.num_actual_tokens
        return HeteroSparseMLAMetadata(**fields, num_decodes=common_attn_metadata.num_reqs, num_decode_tokens=n)


def _forward_layers() -> dict:
    """vLLM's registry of attention-like layers by name (filled as the model is built), or {} outside one."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    return {} if config is None else config.compilation_config.static_forward_context


def _hisparse() -> bool:
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    return config is not None and getattr(config.attention_config, "hisparse_config", None) is not None


class HeteroSparseMLAImpl(MLAAttentionImpl):
    """Sparse MLA (DSA) on hetero ``write_mla_kv`` + ``mla_attention(topk_indices=...)``."""

    is_sparse = True
    supports_dense_mha_prefill = False
    can_return_lse_for_decode = False
    supports_quant_query_input = False
    q_pad_num_heads = None
    dcp_world_size = 1

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        **mla: object,
    ) -> None:
        refused = {
            "attention type": attn_type != AttentionType.DECODER,
            "ALiBi": alibi_slopes is not None,
            "a sliding window": sliding_window is not None,
            "a logit softcap": bool(logits_soft_cap),
            "KV sharing": kv_sharing_target_layer_name is not None,
            f"kv_cache_dtype {kv_cache_dtype!r} (only 'auto')": kv_cache_dtype != "auto",
            "HiSparse (attention_config.hisparse_config)": _hisparse(),
        }
        bad = [what for what, hit in refused.items() if hit]
        if bad:
            raise NotImplementedError(f"hetero-vllm: sparse MLA does not route {', '.join(bad)}")
        buffer = mla.get("topk_indices_buffer")
        if not isinstance(buffer, torch.Tensor):
            raise NotImplementedError("hetero-vllm: sparse MLA needs vLLM's shared topk_indices_buffer, got none")
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.scale = float(scale)
        self.kv_cache_dtype = kv_cache_dtype
        for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "qk_head_dim"):
            setattr(self, name, mla[name])
        self.v_head_dim, self.kv_b_proj = mla["v_head_dim"], mla["kv_b_proj"]
        # vLLM's index_group_builder (logical -> physical top-k) is not used: hetero takes positions
        self.topk_indices_buffer = buffer
        indexer = mla.get("indexer")
        from hetero_vllm import _dsa_indexer  # imports vLLM's deepseek_v2 model module: only when DSA is built

        # None: an IndexCache "skip" layer, which reads the buffer an earlier layer's indexer wrote
        self.indexer = None if indexer is None else _dsa_indexer.adopt(indexer)
        self._layers = _forward_layers()  # the MLAAttention building this impl registers there after it
        self.hetero_site = report.site(_SITE)

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        """Gives the indexer its fence: the ``_k_scale`` of the MLAAttention layer that owns this impl.

        vLLM's compiled ``MLAAttention.forward`` passes ``_k_scale`` to its KV-cache update op, whose result the
        attention op takes (``kv_cache_dummy_dep``), so an indexer op that declares ``_k_scale`` mutated runs
        before the attention. W_UK/W_UV are vLLM's (derived from kv_b_proj by MLAAttention)."""
        if self.indexer is None:
            return
        layer = next((m for m in self._layers.values() if getattr(m, "impl", None) is self), None)
        fence = getattr(layer, "_k_scale", None)
        self.indexer.hetero_fence = fence if isinstance(fence, torch.Tensor) else None

    def record_logical_topk_ready(self) -> None:
        """vLLM's hook once the indexer wrote the step's rows: hetero takes positions, nothing to convert."""

    def do_kv_cache_update(
        self,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache_dtype: str,
        k_scale: torch.Tensor,
    ) -> None:
        """hetero ``write_mla_kv`` of kv_c [T, L] and k_pe [T, 1, R] into the layer cache [NB, BS, L + R]."""
        if kv_cache.numel() == 0:
            return
        n = min(kv_c_normed.shape[0], slot_mapping.shape[0])
        k_pe = k_pe.reshape(k_pe.shape[0], -1)
        lkv = kv_c_normed.shape[-1]
        ckv, kpe = kv_cache[..., :lkv], kv_cache[..., lkv:]
        torch.ops.hetero.write_mla_kv(kv_c_normed[:n], k_pe[:n], ckv, kpe, slot_mapping[:n], self.hetero_site)

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: HeteroSparseMLAMetadata,
        layer: torch.nn.Module,
    ) -> tuple[torch.Tensor, None]:
        """Sparse attention of every token of the step: (out [T, H, L], no lse)."""
        if not isinstance(q, tuple):
            q = q.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        q_nope, q_pe = q
        if self.indexer is not None and not _dsa_ops.topk_fresh(self.indexer.k_cache.prefix):
            raise RuntimeError(
                f"hetero-vllm DSA: sparse attention of {getattr(layer, 'layer_name', layer)} ran before its indexer "
                f"({self.indexer.k_cache.prefix}) wrote this step's top-k: compiled mode scheduled "
                "hetero::dsa_indexer after vLLM's attention op. Run the model with enforce_eager=True."
            )
        m = attn_metadata
        n = q_nope.shape[0]
        lkv = q_nope.shape[-1]
        out = torch.ops.hetero.mla_attention(
            q_nope,
            q_pe,
            kv_c_and_k_pe_cache[..., :lkv],
            kv_c_and_k_pe_cache[..., lkv:],
            m.query_start_loc,
            m.seq_lens,
            m.block_table,
            m.max_query_len,
            m.max_seq_len,
            self.scale,
            True,
            self.hetero_site,
            self.topk_indices_buffer[:n],
        )
        return out, None


class HeteroSparseMLABackend(AttentionBackend):
    """vLLM sparse MLA backend (DeepSeek-V3.2 DSA, GLM-5) on the hetero backend of ``HETERO_BACKEND``."""

    accept_output_buffer: bool = True
    supported_dtypes = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes = ["auto"]

    @staticmethod
    def get_name() -> str:
        return _NAME

    @staticmethod
    def get_impl_cls() -> type[HeteroSparseMLAImpl]:
        return HeteroSparseMLAImpl

    @staticmethod
    def get_builder_cls() -> type[HeteroSparseMLAMetadataBuilder]:
        return HeteroSparseMLAMetadataBuilder

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True


def backend_path() -> str:
    """The class path a platform returns for ``use_mla and use_sparse``."""
    return f"{HeteroSparseMLABackend.__module__}.{HeteroSparseMLABackend.__qualname__}"


def register() -> list[str]:
    """Name the backend in vLLM's registry (``HETERO_MLA_SPARSE``); it routes only where hetero's platform picks
    it, so this returns what it serves there."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if _NAME not in AttentionBackendEnum.__members__:
        register_backend(_NAME, backend_path())
    return [f"attention:{_NAME} (DSA, on hetero's platform)"]
