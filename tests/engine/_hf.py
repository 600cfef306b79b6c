"""transformers as the end-to-end oracle: greedy tokens with EOS disabled."""
from __future__ import annotations

import copy
from functools import lru_cache

import torch

ARCHS = ("qwen2", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3")


@lru_cache(maxsize=8)
def hf_model(path: str):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def hf_greedy(path, prompts, max_tokens: int) -> list[list[int]]:
    """``generate(do_sample=False)`` per prompt, never stopping early."""
    model = hf_model(str(path))
    # generate() refills None fields from the model's own generation_config, so EOS is switched off there
    model.generation_config.eos_token_id = None
    config = copy.deepcopy(model.generation_config)
    config.do_sample, config.max_new_tokens, config.pad_token_id = False, max_tokens, 0
    outs = []
    for p in prompts:
        out = model.generate(torch.tensor([list(p)]), generation_config=config)
        outs.append(out[0, len(p):].tolist())
    return outs


def prompts(vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]
