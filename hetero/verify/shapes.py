"""Real model configurations the catalog draws its shapes from (token counts are scaled down per case)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Model", "MODELS"]


@dataclass(frozen=True)
class Model:
    name: str
    hidden: int
    heads: int  # query heads
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    n_group: int = 1
    topk_group: int = 1
    scoring: str = "softmax"
    # MLA (DeepSeek)
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0


MODELS = {
    m.name: m
    for m in [
        Model("qwen3-0.6b", hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072),
        Model("qwen3-8b", hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=12288),
        Model("qwen3-32b", hidden=5120, heads=64, kv_heads=8, head_dim=128, intermediate=25600),
        Model("llama-3-8b", hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336),
        Model(
            "qwen3-30b-a3b",
            hidden=2048,
            heads=32,
            kv_heads=4,
            head_dim=128,
            intermediate=6144,
            experts=128,
            top_k=8,
            moe_intermediate=768,
        ),
        Model(
            "qwen3-235b-a22b",
            hidden=4096,
            heads=64,
            kv_heads=4,
            head_dim=128,
            intermediate=12288,
            experts=128,
            top_k=8,
            moe_intermediate=1536,
        ),
        Model(
            "deepseek-v3",
            hidden=7168,
            heads=128,
            kv_heads=128,
            head_dim=192,
            intermediate=18432,
            experts=256,
            top_k=8,
            moe_intermediate=2048,
            n_group=8,
            topk_group=4,
            scoring="sigmoid",
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
        ),
        Model(
            "deepseek-v2-lite",
            hidden=2048,
            heads=16,
            kv_heads=16,
            head_dim=192,
            intermediate=10944,
            experts=64,
            top_k=6,
            moe_intermediate=1408,
            scoring="softmax",
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
        ),
        # Models for attention features the ones above do not use (the cases set the feature values).
        # Gemma-2-9B: head dim 256, attention softcap 50.0, sliding window 4096 on alternate layers.
        Model("gemma-2-9b", hidden=3584, heads=16, kv_heads=8, head_dim=256, intermediate=14336),
        # gpt-oss-20b: head dim 64, sliding window 128 on alternate layers, attention sinks.
        Model(
            "gpt-oss-20b",
            hidden=2880,
            heads=64,
            kv_heads=8,
            head_dim=64,
            intermediate=2880,
            experts=32,
            top_k=4,
            moe_intermediate=2880,
        ),
        # Llama-2-7B: MHA (GQA ratio 1).
        Model("llama-2-7b", hidden=4096, heads=32, kv_heads=32, head_dim=128, intermediate=11008),
        # Falcon-7B: MQA with 71 query heads (not a power of two); dense MLP of 4 * hidden.
        Model("falcon-7b", hidden=4544, heads=71, kv_heads=1, head_dim=64, intermediate=18176),
    ]
}
