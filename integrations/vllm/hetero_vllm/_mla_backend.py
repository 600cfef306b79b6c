"""The MLA attention backend classes (see ``hetero_vllm.mla``); vLLM imports this module when it selects one.

vLLM's ``MLAAttention.forward_impl`` sends the first ``num_decode_tokens`` tokens to
``impl.forward_mqa`` with the query already absorbed (``ql_nope = q_nope @ W_UK``) and
applies W_UV to what comes back; the rest go to an MLA prefill backend. This
backend's metadata names every token a decode token, so the whole step is one
``forward_mqa``: hetero ``mla_attention`` over the latent cache, which serves
prefill, chunked prefill and decode rows alike.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonDecodeMetadata,
    MLACommonImpl,
    MLACommonMetadata,
)
from vllm.v1.attention.backend import AttentionMetadataBuilder, AttentionType, CommonAttentionMetadata, MultipleOf

from hetero_vllm import _backend, _mla_ops, mla, report  # noqa: F401  (_mla_ops defines torch.ops.hetero.*)

__all__ = ["HeteroMLABackend", "HeteroAMXSlotMLABackend", "HeteroMLAImpl", "HeteroMLAMetadataBuilder"]

# MLAAttention's arguments to its impl that hetero's dense MLA takes (the rest are refused by name)
_MLA_ARGS = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "qk_head_dim",
    "v_head_dim",
    "kv_b_proj",
    "q_pad_num_heads",
)
_SPARSE_ARGS = ("indexer", "topk_indices_buffer", "index_group_builder")


def _refuse(option: str, got: object, expected: str) -> None:
    raise NotImplementedError(
        f"hetero-vllm MLA: {option} {got!r} is not routed (hetero write_mla_kv + mla_attention serve {expected}); "
        f"change {option}, or unset HETERO_VLLM for this model"
    )


class HeteroMLAImpl(MLACommonImpl[MLACommonMetadata]):
    """Dense MLA on hetero ``write_mla_kv`` + ``mla_attention`` over vLLM's ``[NB, BS, L + R]`` latent cache."""

    can_return_lse_for_decode: bool = False

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
        **mla_args,
    ) -> None:
        from vllm.config import get_current_vllm_config

        if attn_type != AttentionType.DECODER:
            _refuse("attn_type", attn_type, "decoder self-attention")
        for option, value in (("alibi_slopes", alibi_slopes), ("logits_soft_cap", logits_soft_cap)):
            if value:
                _refuse(option, value, "no ALiBi and no softcap")
        if sliding_window is not None:
            _refuse("sliding_window", sliding_window, "full causal attention")
        if kv_cache_dtype != "auto":
            _refuse("kv_cache_dtype", kv_cache_dtype, "a cache in the model dtype: 'auto'")
        sparse = [k for k in _SPARSE_ARGS if mla_args.get(k) is not None]
        if sparse:
            _refuse("sparse MLA (DSA)", sparse, "dense MLA here")
        unknown = sorted(set(mla_args) - set(_MLA_ARGS) - set(_SPARSE_ARGS))
        if unknown:
            _refuse("MLA layer argument", unknown, f"only {', '.join(_MLA_ARGS)}")
        config = get_current_vllm_config()
        if config.speculative_config is not None:
            _refuse("speculative_config", getattr(config.speculative_config, "method", "?"), "no speculative decoding")
        parallel = config.parallel_config
        for option in ("decode_context_parallel_size", "prefill_context_parallel_size"):
            if getattr(parallel, option, 1) > 1:
                _refuse(option, getattr(parallel, option), "one context-parallel rank: 1")
        super().__init__(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            alibi_slopes,
            sliding_window,
            kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
            **{k: mla_args[k] for k in _MLA_ARGS if k in mla_args},
        )
        self.supports_quant_query_input = False  # forward_mqa takes (ql_nope, q_pe), not an fp8 concatenation
        self._use_flashinfer_concat_mla_k = False
        self._pad_v = False
        self.dcp_world_size = 1
        self.cp_kv_cache_interleave_size = 1
        _backend.remember_config()
        config.compilation_config.enabled_custom_ops.update([mla.ROUTED_CLASS])
        self.hetero_site = report.site(mla.ROUTED_CLASS)

    def _latent_views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's [NB, BS, L + R] layer cache as hetero's ckv [NB, BS, L] and kpe [NB, BS, R] caches (views)."""
        return kv_cache[..., : self.kv_lora_rank], kv_cache[..., self.kv_lora_rank :]

    def do_kv_cache_update(
        self,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache_dtype: str,
        k_scale: torch.Tensor,
    ) -> None:
        """hetero ``write_mla_kv`` of this step's latents kv_c [T, L] and rope keys k_pe [T, 1, R]."""
        if kv_cache.numel() == 0:  # vLLM's profiling run, before the cache exists
            return
        n = min(kv_c_normed.shape[0], slot_mapping.shape[0])
        ckv, kpe = self._latent_views(kv_cache)
        k_pe = k_pe[:n].reshape(n, k_pe.shape[-1])
        torch.ops.hetero.write_mla_kv(kv_c_normed[:n], k_pe, ckv, kpe, slot_mapping[:n], self.hetero_site)

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: MLACommonMetadata,
        layer,
    ) -> tuple[torch.Tensor, None]:
        """hetero ``mla_attention`` of every token of the step: (ql_nope [T, H, L], q_pe [T, H, R]) -> [T, H, L]."""
        if isinstance(q, tuple):
            q_nope, q_pe = q
        else:
            q_nope, q_pe = q.split([self.kv_lora_rank, q.shape[-1] - self.kv_lora_rank], dim=-1)
        m, decode = attn_metadata, attn_metadata.decode
        ckv, kpe = self._latent_views(kv_c_and_k_pe_cache)
        out = torch.ops.hetero.mla_attention(
            q_nope,
            q_pe,
            ckv,
            kpe,
            m.query_start_loc,
            decode.seq_lens,
            decode.block_table,
            m.max_query_len,
            m.max_seq_len,
            self.scale,
            bool(m.causal),
            self.hetero_site,
        )
        return out, None


class HeteroMLAMetadataBuilder(AttentionMetadataBuilder[MLACommonMetadata]):
    """vLLM's ``MLACommonMetadata`` with every request a decode: no prefill split, no batch reordering.

    For layers whose impl is not hetero's (the route turned off), it builds the metadata builder of
    the vLLM backend its slot stands for instead.
    """

    def __new__(cls, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device, *args, **kwargs):
        layer = vllm_config.compilation_config.static_forward_context[layer_names[0]]
        if not isinstance(getattr(layer, "impl", None), HeteroMLAImpl):
            vllm_builder = layer.attn_backend.vllm_class().get_builder_cls()
            return vllm_builder(kv_cache_spec, layer_names, vllm_config, device, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> MLACommonMetadata:
        cm = common_attn_metadata
        b = cm.num_reqs
        if not isinstance(cm.causal, bool):
            raise NotImplementedError("hetero-vllm MLA: per-token causal masks are not routed (causal must be a bool)")
        tokens = int(cm.query_start_loc_cpu[b])  # without the padding rows, whatever num_actual_tokens counts
        return MLACommonMetadata(
            num_reqs=b,
            max_query_len=int(cm.max_query_len),
            max_seq_len=int(cm.max_seq_len),
            num_actual_tokens=tokens,
            query_start_loc=cm.query_start_loc[: b + 1],
            slot_mapping=cm.slot_mapping,
            num_decodes=b,
            num_decode_tokens=tokens,
            num_prefills=0,
            causal=cm.causal,
            decode=MLACommonDecodeMetadata(
                block_table=cm.block_table_tensor[:b], seq_lens=cm.seq_lens[:b], dcp_tot_seq_lens=None
            ),
        )


class HeteroMLABackend(MLACommonBackend):
    """vLLM MLA backend on hetero ``write_mla_kv`` + ``mla_attention``: any latent and rope size, any block size,
    prefill and decode in one call. Registered as ``HETERO_MLA`` and, on the CPU platform, as ``CPU_MLA``."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]
    #: The vLLM backend slot this class fills: its impl and builder serve when the route is turned off.
    vllm_slot: ClassVar[str] = "CPU_MLA"

    @staticmethod
    def get_name() -> str:
        return mla.BACKEND_NAME

    @classmethod
    def vllm_class(cls) -> type:
        """vLLM's own backend of ``vllm_slot`` (its original class, not the override)."""
        from vllm.utils.import_utils import resolve_obj_by_qualname
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        return resolve_obj_by_qualname(AttentionBackendEnum[cls.vllm_slot].value)

    @classmethod
    def get_impl_cls(cls) -> type:
        if mla.opted_out():
            vllm_impl = cls.vllm_class().get_impl_cls()
            mla.note_opted_out(vllm_impl.__name__)
            return vllm_impl
        return HeteroMLAImpl

    @staticmethod
    def get_builder_cls() -> type[HeteroMLAMetadataBuilder]:
        return HeteroMLAMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any kv_lora_rank + qk_rope_head_dim

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(1)]


class HeteroAMXSlotMLABackend(HeteroMLABackend):
    """``HeteroMLABackend`` in the ``AMX_MLA`` slot (an x86 CPU with AMX): vLLM's AMX MLA when turned off."""

    vllm_slot: ClassVar[str] = "AMX_MLA"
