"""transformers as the end-to-end oracle: greedy tokens with EOS disabled."""

from __future__ import annotations

from functools import lru_cache

import torch

from hetero.tools.check import greedy_generation_config

ARCHS = (
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "hunyuan_v1_dense",
    "hunyuan_v1_moe",
    "hy_v3",
    "hy_v4",
    "minimax_m2",
    "mimo_v2_flash",
    "glm4_moe",
    "ernie4_5_moe",
    "kimi_linear",
)


@lru_cache(maxsize=8)
def hf_model(path: str):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def hf_greedy(path, prompts, max_tokens: int) -> list[list[int]]:
    """``generate(do_sample=False)`` per prompt, never stopping early."""
    model = hf_model(str(path))
    config = greedy_generation_config(model, max_tokens)
    outs = []
    for p in prompts:
        out = model.generate(torch.tensor([list(p)]), generation_config=config)
        outs.append(out[0, len(p) :].tolist())
    return outs


def prompts(vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]
