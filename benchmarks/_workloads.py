"""The models engine_vs_vllm.py runs, and each one's decode roofline on a machine's measured ceilings.

Two tiny float32 models (vllm_route.py's: 8 layers, hidden 512, vocabulary 256) and two at real models' shapes in
bfloat16: Qwen3-0.6B's config (28 layers, hidden 1024, 16 query / 8 KV heads of 128, vocabulary 151936, tied
embeddings) and four layers of Qwen3-30B-A3B (hidden 2048, 128 experts top-8 of 768, 32 query / 4 KV heads of 128,
vocabulary 151936). Every checkpoint is written by transformers' own class with seeded random weights (its
``initializer_range``); every engine runs in the checkpoint's dtype, given explicitly (vLLM's ``dtype="auto"`` would
run a float32 checkpoint in bfloat16 on a CPU with bf16).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import vllm_route

__all__ = ["Model", "MODELS", "write", "decode_roofline"]

_REAL = dict(
    vocab_size=151936,
    head_dim=128,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    attention_bias=False,
)


@dataclass(frozen=True)
class Model:
    """One benchmark model: transformers' architecture ("qwen3" or "qwen3_moe"), the dtype it is written in, and
    the config keys over transformers' defaults (the tiny ones are vllm_route.py's)."""

    name: str
    arch: str
    dtype: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def real(self) -> bool:
        return bool(self.config)


MODELS = {
    m.name: m
    for m in (
        Model("qwen3", "qwen3", "float32"),
        Model("qwen3_moe", "qwen3_moe", "float32"),
        Model(
            "qwen3-0.6b",
            "qwen3",
            "bfloat16",
            dict(
                _REAL,
                hidden_size=1024,
                intermediate_size=3072,
                num_hidden_layers=28,
                num_attention_heads=16,
                num_key_value_heads=8,
                tie_word_embeddings=True,
            ),
        ),
        Model(
            "qwen3-30b-a3b-x4",
            "qwen3_moe",
            "bfloat16",
            dict(
                _REAL,
                hidden_size=2048,
                intermediate_size=6144,
                moe_intermediate_size=768,
                num_experts=128,
                num_experts_per_tok=8,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                num_hidden_layers=4,
                num_attention_heads=32,
                num_key_value_heads=4,
                tie_word_embeddings=False,
            ),
        ),
    )
}


def write(root: Path, names: list[str]) -> dict[str, Path]:
    """{name: checkpoint directory} for ``names`` (keys of MODELS), written under ``root``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    tiny = [n for n in names if not MODELS[n].real]
    paths = vllm_route.write_models(root, tuple(tiny)) if tiny else {}
    classes = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM)}
    for name in (n for n in names if MODELS[n].real):
        model = MODELS[name]
        config_cls, model_cls = classes[model.arch]
        dtype = getattr(torch, model.dtype)
        torch.manual_seed(0)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # initialized in the checkpoint's dtype: no float32 copy of 3B weights
        try:
            hf = model_cls(config_cls(**model.config, dtype=model.dtype))
        finally:
            torch.set_default_dtype(previous)
        hf.save_pretrained(root / name, safe_serialization=True)
        paths[name] = root / name
    return {n: paths[n] for n in names}


def decode_roofline(checkpoint: Path, batch: int, context: int, ceilings: dict[str, Any]) -> dict[str, float]:
    """The fastest decode a machine of ``ceilings`` (hetero ceilings' JSON) allows, in output tok/s.

    Each step, ``batch`` sequences of ``context`` tokens read the weights the step touches (every dense weight; of
    each MoE layer the experts ``batch`` tokens route to, at most all) and their KV cache, and do 2 flops per weight
    and token."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(checkpoint)
    width = {"float32": 4, "bfloat16": 2, "float16": 2}[str(c.dtype).removeprefix("torch.")]
    h, layers, head = c.hidden_size, c.num_hidden_layers, c.head_dim
    attn = h * head * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    experts = getattr(c, "num_experts", 0)
    if experts:
        expert = 3 * h * c.moe_intermediate_size
        mlp_read = min(experts, batch * c.num_experts_per_tok) * expert + h * experts
        mlp_flops = c.num_experts_per_tok * expert + h * experts
    else:
        mlp_read = mlp_flops = 3 * h * c.intermediate_size
    head_w = c.vocab_size * h
    weights = layers * (attn + mlp_read) + head_w
    kv = batch * context * layers * 2 * c.num_key_value_heads * head
    step_bytes = (weights + kv) * width
    # attention: per layer and token, 2 x 2 x context x heads x head_dim (scores and values) = 2 x its KV x group
    step_flops = 2 * batch * (layers * (attn + mlp_flops) + head_w) + 2 * kv * (
        c.num_attention_heads // c.num_key_value_heads
    )
    dtype = "bfloat16" if width == 2 else "float32"
    seconds = max(step_bytes / (ceilings["tb_s"] * 1e12), step_flops / (ceilings["tflops"][dtype] * 1e12))
    return {"tok_s": batch / seconds, "step_bytes": step_bytes, "step_flops": step_flops}
