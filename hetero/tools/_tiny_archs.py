"""The architectures of ``hetero.tools.tiny`` (import ``ARCHS`` from there): for each short name, the
transformers config class and the small sizes of its tiny random checkpoint.
"""

from __future__ import annotations

from typing import Any

from hetero.tools._tiny_families import FAMILIES

__all__ = ["ARCHS"]

_ATTN = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.2,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
_MLA = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    max_position_embeddings=512,
    initializer_range=0.2,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
#: hybrid linear/full attention (Qwen3-Next, Qwen3.5): Gated DeltaNet head dims powers of two, 2 key heads and
#: 4 value heads (GVA 2), so TP=2 splits both; 4 layers: three linear, then one full (full_attention_interval 4)
_HYBRID = dict(
    _ATTN,
    num_hidden_layers=4,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
)
_HYBRID_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)

#: DeepSeek Sparse Attention: 16 index heads (fewer leave exact ReLU ties that make transformers' own cached and
#: uncached decoding disagree) and index_topk 6, well below the test prompts, so the indexer really prunes; no
#: pad_token_id, whose all-zero embedding row would score every key 0 (a tie transformers breaks arbitrarily)
_DSA = dict(
    _MLA,
    pad_token_id=None,
    q_lora_rank=32,
    index_n_heads=16,
    index_head_dim=16,
    index_topk=6,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
)
_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
}

#: HY4's text model: one group of experts, a small swiglu_limit so the expert clamp bites
_HY4 = dict(
    _DSA,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=2.827,
    swiglu_limit=1.5,
    rms_norm_eps=1e-5,
    rope_parameters=_YARN,
)

#: DeepSeek-V4: a sliding, a CSA (ratio 2, indexer top-4) and an HCA (ratio 8) layer over a window of 8, so
#: test prompts cross several windows and the indexer prunes; hash routing in layer 0; rope on the last 8 of 32
#: dims (the yarn compress table beside the plain main one); a small swiglu_limit so the clamps bite
_DSV4 = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    head_dim=32,
    qk_rope_head_dim=8,
    q_lora_rank=32,
    moe_intermediate_size=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    routed_scaling_factor=1.5,
    swiglu_limit=1.5,
    sliding_window=8,
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    mlp_layer_types=["hash_moe", "moe", "moe"],
    compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 8},
    o_groups=2,
    o_lora_rank=16,
    index_n_heads=16,
    index_head_dim=16,
    index_topk=4,
    rope_parameters={
        "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "compress": {**_YARN, "rope_theta": 160000.0, "partial_rotary_factor": 0.25},
    },
    max_position_embeddings=512,
    initializer_range=0.2,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)

#: Hunyuan's rope: "dynamic" with alpha is a fixed NTK-alpha table; the yarn-style fields beside it are neutral
_NTK_ALPHA = {
    "rope_type": "dynamic",
    "rope_theta": 10000.0,
    "alpha": 1000.0,
    "factor": 1.0,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}

#: short name -> (config class name, defaults); ``architecture(name)`` is the causal LM class a checkpoint names
ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2": ("Qwen2Config", dict(_ATTN)),
    "qwen3": ("Qwen3Config", dict(_ATTN, head_dim=32)),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(
            _ATTN,
            head_dim=16,
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
        ),
    ),
    # dense layer 0 (mlp_only_layers), MoE with a shared expert after
    "qwen3_next": (
        "Qwen3NextConfig",
        dict(_HYBRID, **_HYBRID_MOE, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0]),
    ),
    # [linear, full, linear, full], value heads wider than key heads
    "qwen3_5": ("Qwen3_5TextConfig", dict(_HYBRID, full_attention_interval=2, linear_value_head_dim=32)),
    "qwen3_5_moe": (
        "Qwen3_5MoeTextConfig",
        dict({k: v for k, v in _HYBRID.items() if k != "intermediate_size"}, **_HYBRID_MOE),
    ),
    "deepseek_v2": (
        "DeepseekV2Config",
        dict(
            _MLA,
            q_lora_rank=None,
            n_group=4,
            topk_group=2,
            topk_method="group_limited_greedy",
            routed_scaling_factor=1.5,
            norm_topk_prob=False,
        ),
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        dict(
            _MLA,
            q_lora_rank=32,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            rope_interleave=True,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 128,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        ),
    ),
    "deepseek_v32": ("DeepseekV32Config", dict(_DSA, n_group=4, topk_group=2, rope_parameters=_YARN)),
    # layer 1 reuses layer 0's indices (indexer_types), layer 2 runs its own
    "glm_moe_dsa": (
        "GlmMoeDsaConfig",
        dict(_DSA, n_group=1, topk_group=1, rms_norm_eps=1e-5, indexer_types=["full", "shared", "full"]),
    ),
    # rope "dynamic" with alpha: Hunyuan's fixed NTK-alpha table, its neutral yarn-style fields beside it
    "hunyuan_v1_dense": (
        "HunYuanDenseV1Config",
        dict(
            _ATTN,
            head_dim=16,
            rope_parameters=_NTK_ALPHA,
        ),
    ),
    # Hunyuan-A13B's form: every layer MoE plus a shared MLP; moe_topk per layer (a list)
    "hunyuan_v1_moe": (
        "HunYuanMoEV1Config",
        dict(_ATTN, head_dim=16, intermediate_size=32, num_experts=8, moe_topk=[2, 3], rope_parameters=_NTK_ALPHA),
    ),
    # Hy3: layer 0 dense (mlp_layer_types), sigmoid routing with a selection-only bias, a shared expert
    "hy_v3": (
        "HYV3Config",
        dict(
            _ATTN,
            head_dim=16,
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=2,
            num_shared_experts=1,
            moe_intermediate_size=32,
            router_scaling_factor=2.826,
        ),
    ),
    # HY4: layer 0 dense; indexers full, full, shared (the default schedule); 4 hyper-connection streams; a small
    # swiglu_limit so the expert clamp bites
    "hy_v4": ("HYV4Config", dict(_HY4)),
    "deepseek_v4": ("DeepseekV4Config", dict(_DSV4)),
    # HY4-VL: HY4's text model (interleaved rope, rms_norm_eps latent norms) beside a one-layer vision tower;
    # the placeholders inside the tiny vocabulary, so a prompt can hold them
    "hy_v4_vl": (
        "HYV4VLConfig",
        dict(
            text_config=dict(_HY4, rope_parameters=dict(_YARN, mrope_section=[2, 1, 1])),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                out_hidden_size=64,
                patch_size=4,
                spatial_merge_size=2,
            ),
            image_token_id=250,
            video_token_id=251,
        ),
    ),
    # [sliding, full, sliding, full], window 4; a small swiglu_limit so the clamps bite; yarn rope
    "gpt_oss": (
        "GptOssConfig",
        dict(
            _ATTN,
            num_hidden_layers=4,
            head_dim=16,
            intermediate_size=32,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=4,
            swiglu_limit=1.5,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 128,
            },
        ),
    ),
}
ARCHS.update(FAMILIES)
