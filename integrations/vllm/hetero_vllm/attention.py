"""An attention backend for vLLM on hetero ``write_kv`` + ``paged_attention``, over vLLM's own KV cache.

A layer's cache arrives in vLLM's logical order ``[NB, Hkv, BS, 2*D]`` (keys in the
first D channels, values in the last D), whatever its physical layout;
``kv_cache.transpose(1, 2).split(D, -1)`` gives the ``[NB, BS, Hkv, D]`` key and
value caches hetero's ops take, as strided views (no copy). The block table,
sequence lengths and query offsets are vLLM's ``CommonAttentionMetadata`` fields,
already in ``hetero.AttentionMeta``'s dtypes (int32; slot_mapping int64).

Registered as ``AttentionBackendEnum.CUSTOM`` (select it with vLLM's attention
backend option), and on the CPU platform also in place of ``CPU_ATTN``, which the
CPU platform always picks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)

from hetero_vllm import _backend, report, torch_ops  # noqa: F401  (torch_ops defines torch.ops.hetero.*)

__all__ = ["HeteroAttentionBackend", "HeteroAttentionMetadata", "register"]

_logger = logging.getLogger("vllm.hetero_vllm")
_SITE = "Attention"


@dataclass
class HeteroAttentionMetadata:
    """One step's batch layout: ``hetero.AttentionMeta``'s fields plus the tokens' cache slots."""

    num_actual_tokens: int
    query_start_loc: torch.Tensor  # int32 [B+1]
    seq_lens: torch.Tensor  # int32 [B]
    block_table: torch.Tensor  # int32 [B, max_blocks]
    max_query_len: int
    max_seq_len: int
    slot_mapping: torch.Tensor  # int64 [T]
    causal: bool = True


class HeteroAttentionMetadataBuilder(AttentionMetadataBuilder[HeteroAttentionMetadata]):
    """Builds ``HeteroAttentionMetadata`` from vLLM's ``CommonAttentionMetadata`` (no copies)."""

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> HeteroAttentionMetadata:
        cm = common_attn_metadata
        b = cm.num_reqs
        if not isinstance(cm.causal, bool):
            raise NotImplementedError("hetero-vllm: per-token causal masks are not routed")
        for field in ("mm_req_doc_ranges", "rswa_prefix_lens"):
            if getattr(cm, field, None) is not None:
                raise NotImplementedError(
                    f"hetero-vllm: attention metadata {field} (multimodal prefix / R-SWA masks) is not routed"
                )
        return HeteroAttentionMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            query_start_loc=cm.query_start_loc[: b + 1],
            seq_lens=cm.seq_lens[:b],
            block_table=cm.block_table_tensor[:b],
            max_query_len=int(cm.max_query_len),
            max_seq_len=int(cm.max_seq_len),
            slot_mapping=cm.slot_mapping,
            causal=cm.causal,
        )


def _kv_views(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's [NB, Hkv, BS, 2*D] layer cache as hetero's key and value caches [NB, BS, Hkv, D] (views)."""
    k_cache, v_cache = kv_cache.transpose(1, 2).split(head_size, dim=-1)
    return k_cache, v_cache


class HeteroAttentionImpl(AttentionImpl):
    """Decoder self-attention (GQA, sliding window, softcap, sinks) on hetero's paged ops."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = "decoder",
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        if str(getattr(attn_type, "value", attn_type)) != "decoder":
            raise NotImplementedError(
                f"hetero-vllm: {attn_type} attention is not routed (decoder self-attention only); "
                "unset HETERO_VLLM for this model"
            )
        if alibi_slopes is not None:
            raise NotImplementedError("hetero-vllm: ALiBi is not routed (no hetero op takes slopes)")
        if kv_cache_dtype != "auto":
            raise NotImplementedError(f"hetero-vllm: kv_cache_dtype {kv_cache_dtype!r} is not routed (only 'auto')")
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.scale = float(scale)
        # vLLM's sliding_window W keeps W keys, the token's own included: hetero's window (W - 1, -1).
        self.window_left = -1 if sliding_window is None else int(sliding_window) - 1
        self.softcap = float(logits_soft_cap or 0.0)
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type
        self.sinks = sinks
        self.hetero_site = report.site(_SITE)
        _backend.remember_config()

    def do_kv_cache_update(
        self,
        layer: torch.nn.Module,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """hetero ``write_kv`` of this step's keys and values into the layer's cache."""
        if self.kv_sharing_target_layer_name is not None:
            return
        k_cache, v_cache = _kv_views(kv_cache, self.head_size)
        n = min(key.shape[0], slot_mapping.shape[0])
        torch.ops.hetero.write_kv(key[:n], value[:n], k_cache, v_cache, slot_mapping[:n], self.hetero_site)

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: HeteroAttentionMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """hetero ``paged_attention`` of query [T, Hq, D] into output [T, Hq, D] (the cache is already written)."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("hetero-vllm: fused output quantization is not routed")
        if attn_metadata is None:  # vLLM's profiling run
            return output
        n = attn_metadata.num_actual_tokens
        k_cache, v_cache = _kv_views(kv_cache, self.head_size)
        out = output[:n].view(n, self.num_heads, -1)
        sinks = None if self.sinks is None else self.sinks.to(torch.float32)
        m = attn_metadata
        torch.ops.hetero.paged_attention(
            query[:n],
            k_cache,
            v_cache,
            m.query_start_loc,
            m.seq_lens,
            m.block_table,
            m.max_query_len,
            m.max_seq_len,
            self.scale,
            m.causal,
            self.window_left,
            -1,
            self.softcap,
            sinks,
            out,
            self.hetero_site,
        )
        return output


class HeteroAttentionBackend(AttentionBackend):
    """vLLM attention backend on the hetero backend of ``HETERO_BACKEND`` (decoder self-attention)."""

    accept_output_buffer: bool = True
    forward_includes_kv_cache_update: bool = False
    supported_dtypes = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes = ["auto"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[HeteroAttentionImpl]:
        return HeteroAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[HeteroAttentionMetadataBuilder]:
        return HeteroAttentionMetadataBuilder

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        return True


def register() -> list[str]:
    """Register the backend as CUSTOM, and for CPU_ATTN on the CPU platform; returns what it now serves."""
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    path = f"{HeteroAttentionBackend.__module__}.{HeteroAttentionBackend.__qualname__}"
    slots = [AttentionBackendEnum.CUSTOM] + ([AttentionBackendEnum.CPU_ATTN] if current_platform.is_cpu() else [])
    routes = []
    for slot in slots:
        if slot.is_overridden() and slot.get_path() != path:
            reason = f"another plugin already overrides it ({slot.get_path()})"
            _logger.warning("hetero-vllm: not routing attention backend %s: %s", slot.name, reason)
            report.not_routed(f"AttentionBackend[{slot.name}]", reason)
            continue
        register_backend(slot, path)
        routes.append(f"attention:{slot.name}")
    return routes
