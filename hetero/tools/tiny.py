"""Tiny random Hugging Face checkpoints of every supported architecture, for tests, demos and benchmarks.

``build("qwen3", "/tmp/q3")`` writes config.json and safetensors shards made by
transformers itself (so they are exactly what a real checkpoint looks like on
disk), with weights large enough (init range 0.2, randomized norms and biases)
that a skipped or mis-mapped tensor changes the output. ``tokenizer=True`` adds a
character-level fast tokenizer so text prompts work offline.

    python -m hetero.tools.tiny qwen3 DIR [--layers N] [--hidden H] [--shard-size 20KB]
"""

from __future__ import annotations

import argparse
import string
from pathlib import Path
from typing import Any

import torch

from hetero.tools._tiny_archs import ARCHS
from hetero.tools._tiny_eagle3 import write as write_eagle3
from hetero.tools._tiny_mtp import add_mtp

__all__ = ["ARCHS", "add_mtp", "build", "char_tokenizer", "tiny_config", "write_eagle3"]


def tiny_config(arch: str, **overrides: Any):
    """The transformers config of a tiny ``arch`` (a key of ``ARCHS``), its ``architectures`` set."""
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; known: {', '.join(ARCHS)}")
    cls_name, defaults = ARCHS[arch]
    config = getattr(transformers, cls_name)(**{**defaults, **overrides})
    config.architectures = [architecture(arch)]
    return config


def architecture(arch: str) -> str:
    """The ``architectures[0]`` of a tiny ``arch``'s checkpoint: the causal LM class transformers builds
    for its config (for a multimodal release, its image-text-to-text class)."""
    import transformers
    from transformers.models.auto import modeling_auto

    config_cls = getattr(transformers, ARCHS[arch][0])
    model_type = config_cls.model_type
    if "vision_config" in (getattr(config_cls, "sub_configs", None) or {}):
        # Qwen3.5's model_type also names a text-only causal class; the release is the wrapper
        return modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type]
    causal = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    return causal or modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type]


@torch.no_grad()
def _randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Norm weights around their initial value, biases and correction biases non-zero: every tensor matters.

    Norms start at 1, or at 0 where the model computes ``norm(x) * (1 + w)`` (Qwen3-Next, Qwen3.5),
    so the effective weight is around 1 and a missing (or doubled) offset shows. ``A_log`` (Gated
    DeltaNet's decay rate) is log(U(0.02, 0.5)): transformers' U(0.01, 16) makes many heads forget
    their state within a token, which would hide a state carried wrongly between steps.
    """
    for name, p in model.named_parameters():
        if p.ndim == 1 and "norm" in name:
            p.copy_(p + 0.3 * torch.randn(p.shape, generator=gen))
        elif name.endswith("position_bias"):  # DeepSeek-V4's compressors start it at zero
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
        elif name.endswith("A_log"):
            p.copy_(torch.empty(p.shape).uniform_(0.02, 0.5, generator=gen).log())
        elif p.ndim == 1 or name.endswith("_bias"):  # gpt-oss's stacked expert biases are [E, n]
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(0.1 * torch.randn(b.shape, generator=gen))
        elif name.endswith("tid2eid"):  # DeepSeek-V4's hash routing: distinct experts per token id
            n = model.config.get_text_config().n_routed_experts
            b.copy_(torch.stack([torch.randperm(n, generator=gen)[: b.shape[1]] for _ in range(b.shape[0])]))


def char_tokenizer(vocab_size: int):
    """A character-level fast tokenizer (ids 0-2: pad, bos, eos; then printable ASCII)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for c in chars[: vocab_size - len(vocab)]:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def build(
    arch: str,
    path: str | Path,
    *,
    seed: int = 0,
    shard_size: str | None = "20KB",
    tokenizer: bool = False,
    **overrides: Any,
) -> Path:
    """Write a tiny random ``arch`` checkpoint to ``path`` (several shards unless ``shard_size`` is None)."""
    import transformers

    config = tiny_config(arch, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, config.architectures[0])._from_config(config, dtype=torch.float32)
    _randomize(model, torch.Generator().manual_seed(seed + 1))
    path = Path(path)
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(path, **kwargs)
    if tokenizer:
        char_tokenizer(config.get_text_config().vocab_size).save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetero.tools.tiny", description="write a tiny random checkpoint")
    p.add_argument("arch", choices=sorted(ARCHS))
    p.add_argument("path")
    p.add_argument("--layers", type=int, help="num_hidden_layers")
    p.add_argument("--hidden", type=int, help="hidden_size (intermediate sizes scale with it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-size", default="20KB", help="max_shard_size of save_pretrained ('none': one file)")
    p.add_argument("--no-tokenizer", action="store_true", help="skip the character-level tokenizer")
    args = p.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.layers:
        overrides["num_hidden_layers"] = args.layers
    if args.hidden:
        scale = args.hidden / 64
        defaults = ARCHS[args.arch][1]
        overrides["hidden_size"] = args.hidden
        for key in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):
            if key in defaults:
                overrides[key] = int(defaults[key] * scale)
    shard = None if args.shard_size.lower() == "none" else args.shard_size
    out = build(args.arch, args.path, seed=args.seed, shard_size=shard, tokenizer=not args.no_tokenizer, **overrides)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
