"""The checks API: the argument validation every built-in backend runs, for any backend to reuse.

Each failure is an ``hetero.OpError`` (a ValueError) naming the op, the argument, what was
expected and what came, so a plugin that calls these raises what the built-in backends raise
for the same bad input. This module is public and versioned with the spec
(``docs/spec-changes.md``): a check is added in a minor version and changed or removed only in a
major one. The implementations live in private modules, one per family; import them from here.

- General: ``expect``, ``check_tensor``, ``check_same_device``, ``check_at_least_1d``,
  ``meta_tensors`` and the index checks ``check_cu_seqlens``, ``check_slot_mapping``,
  ``check_group_ends``, ``check_ids``, ``check_perm``, ``check_positions``.
- Per op: the cheap checks (types, dtypes, shapes, options; no host read) that every backend
  runs on every call, e.g. ``check_paged_cache``, ``check_operands``, ``check_fused_moe``,
  ``check_gated_delta_rule``, ``check_hc_pre``. ``check_meta`` and ``check_state_batch`` also read index values on
  the host, as the reference does on every call (``hetero.spec.validate`` is the opt-in form).
"""

from __future__ import annotations

from hetero.spec._checks_attention import (
    STAT_DTYPES,
    check_flag,
    check_gqa,
    check_max_len,
    check_mla,
    check_mla_kv_write,
    check_options,
    check_out,
    check_paged_cache,
    check_sinks,
    check_varlen,
)
from hetero.spec._checks_compress import (
    COMPRESS_PARAM_DTYPES,
    CompressDims,
    check_kv_compress,
    check_kv_compress_indices,
)
from hetero.spec._checks_compressed_attention import check_comp_block_table, check_compressed_attention
from hetero.spec._checks_core import (
    INDEX_DTYPES,
    check_at_least_1d,
    check_cu_seqlens,
    check_group_ends,
    check_ids,
    check_kv_write,
    check_mla_inputs,
    check_perm,
    check_same_device,
    check_scale_form,
    check_slot_mapping,
    check_tensor,
    expect,
    meta_tensors,
    scale_blocks,
)
from hetero.spec._checks_dsa import (
    INDEX_FP8,
    SCALE_DTYPES,
    check_compress_ratio,
    check_index_k_write,
    check_indexer_inputs,
    check_layer_norm,
    check_topk_indices,
)
from hetero.spec._checks_gemm import (
    QUANT_DTYPES,
    SCALED_OUT_DTYPES,
    check_bias,
    check_operands,
    check_out_dtype,
    check_scaled_gemm,
)
from hetero.spec._checks_hyper import HC_PARAM_DTYPES, check_hc_head, check_hc_post, check_hc_pre, hc_rows
from hetero.spec._checks_int4 import (
    INT4_OPTIONS,
    PACKED_INT4,
    check_fused_moe_int4,
    check_group_size,
    check_int4_weight,
    check_int4_zero_point_values,
    check_no_int4,
    check_packed_gemm,
    int4_cols,
    int4_groups,
)
from hetero.spec._checks_layers import check_positions, check_rms_norm, check_rotary
from hetero.spec._checks_meta import check_meta, check_meta_shapes
from hetero.spec._checks_moe import check_fused_moe_options, check_fused_moe_weights
from hetero.spec._checks_moe_ops import (
    WEIGHT_DTYPES,
    check_fixed_ids,
    check_fused_moe,
    check_int,
    check_route,
    check_weights,
)
from hetero.spec._checks_quant import (
    check_a_scale,
    check_b_scale,
    check_fused_moe_quant,
    check_quantize_inputs,
    check_scaled_grouped,
)
from hetero.spec._checks_recurrent import (
    CONV_ACTIVATIONS,
    L2NORM_EPS,
    STATE_DTYPES,
    check_causal_conv1d,
    check_gated_delta_rule,
    check_state_batch,
    check_state_index,
)
from hetero.spec._checks_sampling import PROB_DTYPES, check_rejection_sample, check_rejection_sample_indices
from hetero.spec._checks_token_slots import check_num_accepted_tokens, check_token_slots

__all__ = [
    # general (spec 1.0; public since 1.5)
    "expect",
    "check_tensor",
    "check_same_device",
    "check_at_least_1d",
    "meta_tensors",
    "INDEX_DTYPES",
    "check_slot_mapping",
    "check_cu_seqlens",
    "check_group_ends",
    "check_ids",
    "check_perm",
    "check_positions",
    # attention and AttentionMeta
    "STAT_DTYPES",
    "check_options",
    "check_flag",
    "check_max_len",
    "check_paged_cache",
    "check_gqa",
    "check_sinks",
    "check_out",
    "check_varlen",
    "check_kv_write",
    "check_mla_kv_write",
    "check_mla",
    "check_mla_inputs",
    "check_meta",
    "check_meta_shapes",
    # sparse attention (DSA) and layer_norm
    "INDEX_FP8",
    "SCALE_DTYPES",
    "check_index_k_write",
    "check_indexer_inputs",
    "check_compress_ratio",
    "check_topk_indices",
    "check_layer_norm",
    # layers
    "check_rms_norm",
    "check_rotary",
    # gemm and quantization
    "QUANT_DTYPES",
    "SCALED_OUT_DTYPES",
    "check_operands",
    "check_out_dtype",
    "check_bias",
    "check_scaled_gemm",
    "check_scale_form",
    "scale_blocks",
    "check_quantize_inputs",
    "check_a_scale",
    "check_b_scale",
    "check_scaled_grouped",
    # moe
    "WEIGHT_DTYPES",
    "check_int",
    "check_route",
    "check_fixed_ids",
    "check_weights",
    "check_fused_moe",
    "check_fused_moe_options",
    "check_fused_moe_weights",
    "check_fused_moe_quant",
    # recurrent
    "CONV_ACTIVATIONS",
    "STATE_DTYPES",
    "L2NORM_EPS",
    "check_state_index",
    "check_state_batch",
    "check_causal_conv1d",
    "check_gated_delta_rule",
    "check_num_accepted_tokens",  # per-token state slots (spec 1.11)
    "check_token_slots",
    # hyper-connections (spec 1.7)
    "HC_PARAM_DTYPES",
    "hc_rows",
    "check_hc_pre",
    "check_hc_post",
    "check_hc_head",
    # the KV compressor (spec 1.8)
    "COMPRESS_PARAM_DTYPES",
    "CompressDims",
    "check_kv_compress",
    "check_kv_compress_indices",
    # compressed attention (spec 1.8)
    "check_compressed_attention",
    "check_comp_block_table",
    # packed int4 weights, W4A16 (spec 1.9)
    "PACKED_INT4",
    "INT4_OPTIONS",
    "int4_cols",
    "int4_groups",
    "check_group_size",
    "check_int4_weight",
    "check_packed_gemm",
    "check_no_int4",
    "check_fused_moe_int4",
    "check_int4_zero_point_values",
    # speculative decoding's rejection sampling (spec 1.10)
    "PROB_DTYPES",
    "check_rejection_sample",
    "check_rejection_sample_indices",
]
