"""Tiny architectures of the families private clouds serve beside DeepSeek, Qwen and Hunyuan (issue 35):
GLM-4.5, ERNIE-4.5-MoE, MiniMax-M2, MiMo-V2-Flash, Kimi-Linear and the multimodal wrappers' text models.
``hetero.tools._tiny_archs`` merges ``FAMILIES`` into ``ARCHS``."""

from __future__ import annotations

from typing import Any

__all__ = ["FAMILIES"]

#: MiniMax-M2's and MiMo-V2-Flash's shared tiny sizes
_MM_SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=512,
    initializer_range=0.2,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

#: the wrappers' Qwen3.5 text model (as ``_tiny_archs``' qwen3_5, two layers), vision tower and placeholders
_QWEN3_5_TEXT = dict(
    _MM_SMALL,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    full_attention_interval=2,
)
_QWEN_VISION = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    out_hidden_size=64,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
    num_position_embeddings=16,
)
_MEDIA = dict(
    image_token_id=250,
    video_token_id=251,
    vision_start_token_id=252,
    vision_end_token_id=253,
    tie_word_embeddings=False,
)

#: short name -> (config class name, defaults), as ``_tiny_archs.ARCHS``
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    # --- glm4_moe, ernie4_5_moe ---
    # GLM-4.5: layer 0 dense; q/k/v biases, per-head q/k norms before a partial (half the head) NeoX rope;
    # sigmoid routing over 4 groups of 2 (2 kept) with a selection-only bias, renormalized, scaled; one shared
    # expert; one MTP layer in the config (transformers writes none; tests add one to a copy)
    "glm4_moe": (
        "Glm4MoeConfig",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=4,
            topk_group=2,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            use_qk_norm=True,
            attention_bias=True,
            num_nextn_predict_layers=1,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            max_position_embeddings=512,
            initializer_range=0.2,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
    ),
    # ERNIE-4.5-MoE: MoE in layer 1 only (every 2nd layer from 1), dense 0 and 2; biases on every linear but the
    # experts and router; interleaved rope; softmax routing with a selection-only bias; one shared expert; tied
    # embeddings; moe_norm_min 0.5 (released: 1e-12) so the clamped renormalization bites for some tokens
    "ernie4_5_moe": (
        "Ernie4_5_MoeConfig",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            moe_num_experts=8,
            moe_k=2,
            moe_num_shared_experts=1,
            moe_layer_start_index=1,
            moe_layer_interval=2,
            moe_norm_min=0.5,
            use_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            max_position_embeddings=512,
            initializer_range=0.2,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
    ),
    # --- minimax_m2, mimo_v2_flash ---
    # MiniMax-M2: q/k norms over all heads (one KV head: under TP=2 both ranks hold it, and the k norm's sum over
    # the ranks counts it twice), rope on half of head_dim (rotary_dim), experts of intermediate_size
    "minimax_m2": (
        "MiniMaxM2Config",
        dict(
            _MM_SMALL,
            intermediate_size=32,
            num_key_value_heads=1,
            head_dim=16,
            rotary_dim=8,
            num_local_experts=8,
            num_experts_per_tok=2,
        ),
    ),
    # MiMo-V2-Flash: a full layer (1 KV head, no sinks), then two sliding ones (window 5, 2 KV heads, sinks);
    # D 24 / Dv 16; rope on int(24 * 0.334) = 8 dims, a theta per layer type; V3 grouped routing; layer 0 dense
    "mimo_v2_flash": (
        "MiMoV2FlashConfig",
        dict(
            _MM_SMALL,
            num_hidden_layers=3,
            num_key_value_heads=1,
            head_dim=24,
            v_head_dim=16,
            sliding_window=5,
            layer_types=["full_attention", "sliding_attention", "sliding_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.334},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.334},
            },
            moe_intermediate_size=32,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=2.5,
        ),
    ),
    # --- kimi_linear, wrappers ---
    # Kimi-Linear: three KDA layers (4 heads of 16), then a NoPE MLA; layer 0 dense (first_k_dense_replace);
    # V3 routing over 4 groups of 2 (2 kept), one shared expert
    "kimi_linear": (
        "KimiLinearConfig",
        dict(
            _MM_SMALL,
            num_hidden_layers=4,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            linear_num_heads=4,
            linear_head_dim=16,
            linear_conv_kernel_dim=4,
            num_key_value_heads=4,
            kv_lora_rank=32,
            q_lora_rank=None,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            moe_intermediate_size=32,
            num_local_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            first_k_dense_replace=1,
        ),
    ),
    # the multimodal releases (``*ForConditionalGeneration``): a two-layer text model beside a one-layer vision
    # tower; the placeholders inside the tiny vocabulary, so a prompt can hold them. Qwen3.5: [linear, full]
    "qwen3_5_vl": ("Qwen3_5Config", dict(text_config=_QWEN3_5_TEXT, vision_config=_QWEN_VISION, **_MEDIA)),
    "qwen3_5_moe_vl": (
        "Qwen3_5MoeConfig",
        dict(
            text_config=dict(
                {k: v for k, v in _QWEN3_5_TEXT.items() if k != "intermediate_size"},
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=32,
            ),
            vision_config=_QWEN_VISION,
            **_MEDIA,
        ),
    ),
    # Kimi-K2.5: K2's DeepSeek-V3 (one group, yarn rope), its text model_type "kimi_k2" as the release writes it
    "kimi_k25": (
        "Kimi_K25Config",
        dict(
            text_config=dict(
                _MM_SMALL,
                model_type="kimi_k2",
                num_key_value_heads=4,
                kv_lora_rank=32,
                q_lora_rank=32,
                qk_nope_head_dim=16,
                qk_rope_head_dim=8,
                v_head_dim=16,
                moe_intermediate_size=32,
                n_routed_experts=8,
                num_experts_per_tok=2,
                n_shared_experts=1,
                first_k_dense_replace=1,
                n_group=1,
                topk_group=1,
                routed_scaling_factor=2.827,
                norm_topk_prob=True,
                rope_parameters=dict(
                    rope_type="yarn",
                    rope_theta=50000.0,
                    factor=4.0,
                    original_max_position_embeddings=128,
                    beta_fast=32.0,
                    beta_slow=1.0,
                    mscale=1.0,
                    mscale_all_dim=1.0,
                ),
            ),
            vision_config=dict(
                patch_size=4,
                pos_emb_height=4,
                pos_emb_width=4,
                pos_emb_time=2,
                num_attention_heads=2,
                num_hidden_layers=1,
                hidden_size=32,
                intermediate_size=64,
            ),
            projection_hidden_size=32,
            **_MEDIA,
        ),
    ),
}
