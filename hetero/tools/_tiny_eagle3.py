"""Tiny EAGLE-3 draft checkpoints for a tiny target, in the layout vLLM loads (``hetero.engine.spec_decode.eagle3``).

``write(target_dir, path)`` writes config.json and model.safetensors: a Llama midlayer over the target's hidden
size, ``fc`` over three aux streams, an LM head over a random sorted subset of the target's vocabulary
(``draft_vocab`` ids) with its ``d2t`` / ``t2d`` maps. Weights are random, or with ``echo`` chosen so the draft
reproduces the target's own prediction from its last layer's output (aux id L): ``fc`` copies that stream, the
midlayer adds nothing (o_proj and down_proj are zero), and the final norm and LM head rows are the target's.
Such a draft proposes, at every step, the token the target predicted from the row it reads: under greedy
decoding, the token it is fed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

__all__ = ["write"]


def _target_tensor(target_dir: Path, *names: str) -> torch.Tensor:
    """The first of ``names`` the target checkpoint has."""
    from safetensors import safe_open

    from hetero.engine.loader import checkpoint_files

    for name in names:
        for path in checkpoint_files(target_dir):
            with safe_open(str(path), framework="pt") as f:
                if name in f.keys():
                    return f.get_tensor(name)
    raise KeyError(f"{target_dir}: none of {names}")


def write(
    target_dir: str | Path,
    path: str | Path,
    *,
    draft_vocab: int = 200,
    layer_ids: list[int] | None = None,
    embed: bool = False,
    echo: bool = False,
    seed: int = 0,
    **overrides: Any,
) -> Path:
    """Write a tiny EAGLE-3 draft for the tiny target at ``target_dir`` to ``path``.

    ``layer_ids``: ``eagle_aux_hidden_state_layer_ids`` (default: 0, L - 1 and L of the target's L layers);
    ``embed``: the draft has its own ``embed_tokens`` (else it uses the target's); ``overrides``: config.json
    fields (``target_hidden_size`` sizes ``fc`` for another target).
    """
    target_dir, path = Path(target_dir), Path(path)
    target = json.loads((target_dir / "config.json").read_text())
    target = target.get("text_config", target)
    layers, vocab, hidden = target["num_hidden_layers"], target["vocab_size"], target["hidden_size"]
    ids = list(layer_ids) if layer_ids is not None else [0, layers - 1, layers]
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": target.get("rms_norm_eps", 1e-6),
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids},
        **overrides,
    }
    h, inter = config["hidden_size"], config["intermediate_size"]
    n_aux, h_target = len(set(ids)), config.get("target_hidden_size", h)
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return scale * torch.randn(*shape, generator=gen)

    subset = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[subset] = True
    tensors = {
        "fc.weight": rand(h, n_aux * h_target),
        "midlayer.input_layernorm.weight": 1 + rand(h, scale=0.3),
        "midlayer.hidden_norm.weight": 1 + rand(h, scale=0.3),
        "midlayer.post_attention_layernorm.weight": 1 + rand(h, scale=0.3),
        "midlayer.self_attn.q_proj.weight": rand(q, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, q),
        "midlayer.mlp.gate_proj.weight": rand(inter, h),
        "midlayer.mlp.up_proj.weight": rand(inter, h),
        "midlayer.mlp.down_proj.weight": rand(h, inter),
        "norm.weight": 1 + rand(h, scale=0.3),
        "lm_head.weight": rand(draft_vocab, h),
        "d2t": subset - torch.arange(draft_vocab),
        "t2d": t2d,
    }
    if embed:
        tensors["embed_tokens.weight"] = rand(vocab, h)
    if echo:
        if layers not in ids or h != h_target:
            raise ValueError(f"an echo draft reads aux id {layers} (the last layer's output) at the target's width")
        fc = torch.zeros(h, n_aux * h)
        at = sorted(set(ids)).index(layers) * h  # vLLM concatenates the streams in id order
        fc[:, at : at + h] = torch.eye(h)
        head = _target_tensor(target_dir, "lm_head.weight", "model.embed_tokens.weight")
        tensors.update(
            {
                "fc.weight": fc,
                "midlayer.self_attn.o_proj.weight": torch.zeros(h, q),
                "midlayer.mlp.down_proj.weight": torch.zeros(h, inter),
                "norm.weight": _target_tensor(target_dir, "model.norm.weight"),
                "lm_head.weight": head[subset],
            }
        )
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path
