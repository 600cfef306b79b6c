"""Tiny random float32 checkpoints written by transformers (directly, or by hetero.tools.tiny and hetero quantize)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["WRITERS"]

_COMMON = dict(
    vocab_size=256,
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    initializer_range=0.1,
    tie_word_embeddings=False,
    torch_dtype="float32",
)


def _save(model, path: Path) -> Path:
    model.save_pretrained(path, safe_serialization=True)
    return path


def write_llama(path: Path) -> Path:
    """A 2-layer Llama (4 query / 2 KV heads of 32, Llama-3 rope scaling) with random weights, at ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    }
    return _save(LlamaForCausalLM(LlamaConfig(intermediate_size=256, rope_parameters=rope, **_COMMON)).float(), path)


def write_qwen3(path: Path) -> Path:
    """A 2-layer Qwen3 (4 query / 2 KV heads of 32) with random weights, at ``path``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return _save(Qwen3ForCausalLM(Qwen3Config(intermediate_size=256, **_COMMON)).float(), path)


def write_qwen3_moe(path: Path) -> Path:
    """A 2-layer Qwen3-MoE (8 experts, top-2, every layer sparse) with random weights, at ``path``."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        intermediate_size=256,
        moe_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        mlp_only_layers=[],
        **_COMMON,
    )
    return _save(Qwen3MoeForCausalLM(config).float(), path)


def write_gemma2(path: Path) -> Path:
    """A 2-layer Gemma2 (a 48-key sliding window on layer 0, logit softcap 50) with random weights, at ``path``."""
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        intermediate_size=256,
        sliding_window=48,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        query_pre_attn_scalar=32,
        hidden_activation="gelu_pytorch_tanh",
        layer_types=["sliding_attention", "full_attention"],
        **{**_COMMON, "tie_word_embeddings": True},
    )  # vLLM's Gemma2 has no separate lm_head
    return _save(Gemma2ForCausalLM(config).float(), path)


def _tiny(arch: str, path: Path, **overrides) -> Path:
    from hetero.tools.tiny import build

    return build(arch, path, shard_size=None, **overrides)


#: DeepSeek-V3's own config.json names its router: transformers always scores with a sigmoid and a correction
#: bias, vLLM reads these two fields (without them it scores with softmax and loads no correction bias).
_DEEPSEEK_ROUTER = dict(topk_method="noaux_tc", scoring_func="sigmoid")


def write_deepseek_v3(path: Path) -> Path:
    """A tiny DeepSeek-V3 (MLA, a dense layer then MoE layers with a shared expert), its latent 512 + rope 64:
    the only MLA head vLLM-CPU's own MLA kernel (the stock reference) takes."""
    return _tiny("deepseek_v3", path, kv_lora_rank=512, qk_rope_head_dim=64, **_DEEPSEEK_ROUTER)


def write_deepseek_v32(path: Path) -> Path:
    """A tiny DeepSeek-V3.2 (MLA with the DSA indexer's top-k sparse attention)."""
    return _tiny("deepseek_v32", path, **_DEEPSEEK_ROUTER)


def write_qwen3_next(path: Path) -> Path:
    """A tiny Qwen3-Next: three Gated DeltaNet layers, then a gated full-attention layer; MoE."""
    return _tiny("qwen3_next", path)


WRITERS = (
    write_llama,
    write_qwen3,
    write_qwen3_moe,
    write_gemma2,
    write_deepseek_v3,
    write_deepseek_v32,
    write_qwen3_next,
)
