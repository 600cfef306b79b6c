"""Reading an EAGLE-3 draft's config.json and checking it against the target, before anything is built.

Every refusal is a ``UsageError`` on ``speculative_config.model`` naming the field, what hetero expects
and what the draft has (``eagle3`` holds the format facts these checks follow).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero.engine.config import text_config
from hetero.engine.loader import checkpoint_files
from hetero.errors import UsageError

__all__ = ["ARCHITECTURES", "DraftFacts", "draft_facts"]

#: the config.json ``architectures[0]`` names of the Llama-layer EAGLE-3 head (vLLM's ``Eagle3LlamaForCausalLM``)
ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


@dataclass(frozen=True)
class DraftFacts:
    """What ``build_eagle3`` builds from: the draft's config (a transformers ``LlamaConfig``), the capture
    indices it reads (sorted), the target's vocabulary and hidden width, and whether the checkpoint has its
    own ``embed_tokens`` and ``lm_head`` (else the target's are used)."""

    config: Any
    aux_ids: tuple[int, ...]
    target_vocab: int
    target_hidden: int
    own_embed: bool
    own_lm_head: bool


def _refuse(model_dir: str, what: str, expected: str, got: Any) -> UsageError:
    return UsageError(
        f"speculative_config: argument 'model': EAGLE-3 draft {model_dir}: {what}: expected {expected}, got {got!r}",
        arg="speculative_config.model",
        expected=expected,
        got=got,
    )


def _shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> shape, from the safetensors headers only."""
    from safetensors import safe_open

    shapes = {}
    for path in checkpoint_files(model_dir, "the EAGLE-3 draft"):
        with safe_open(str(path), framework="pt") as f:
            shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    return shapes


def _aux_ids(raw: dict, eagle: dict, num_target_layers: int) -> tuple[int, ...]:
    """The draft's capture indices as vLLM picks them: the config's, else (2, L // 2, L - 3); sorted, unique."""
    ids = raw.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        n = num_target_layers
        ids = (2, n // 2, n - 3)
    return tuple(sorted(set(ids)))


def _check_unsupported(model_dir: str, raw: dict, eagle: dict) -> None:
    """Fields of the format's variants hetero does not implement, refused by name."""
    if raw.get("quantization_config"):
        raise _refuse(model_dir, "quantization_config", "an unquantized draft", raw["quantization_config"])
    if raw.get("num_hidden_layers", 1) != 1:
        raise _refuse(model_dir, "num_hidden_layers", "1 (one midlayer)", raw["num_hidden_layers"])
    if raw.get("hidden_act", "silu") != "silu":
        raise _refuse(model_dir, "hidden_act", "silu", raw["hidden_act"])
    if eagle.get("use_aux_hidden_state", True) is not True:
        raise _refuse(model_dir, "eagle_config.use_aux_hidden_state", "true", eagle["use_aux_hidden_state"])
    for name in ("norm_before_fc", "fc_norm"):
        value = eagle.get(name, raw.get(name, False))
        if value:
            raise _refuse(model_dir, name, "false (no norm before fc)", value)
    if float(raw.get("logit_scale", 1.0)) != 1.0:
        raise _refuse(model_dir, "logit_scale", "1.0", raw["logit_scale"])


def _check_tensors(model_dir: str, config: Any, num_aux: int, vocab: int, hidden: int) -> tuple[bool, bool]:
    """The shapes ``fc`` needs, and what the draft lacks and takes from the target: (own embedding, own LM head)."""
    shapes = _shapes(model_dir)
    fc = (config.hidden_size, num_aux * hidden)
    if shapes.get("fc.weight") != fc:
        expected = f"shape {fc} ({num_aux} aux streams of width {hidden})"
        raise _refuse(model_dir, "tensor fc.weight", expected, shapes.get("fc.weight"))
    own_embed, own_head = "embed_tokens.weight" in shapes, "lm_head.weight" in shapes
    if not own_embed and config.hidden_size != hidden:
        expected = f"the target's {hidden} (the draft has no embed_tokens, so it uses the target's)"
        raise _refuse(model_dir, "hidden_size", expected, config.hidden_size)
    if not own_head and (config.draft_vocab_size, config.hidden_size) != (vocab, hidden):
        expected = f"present, or a draft of the target's (vocab, hidden) {(vocab, hidden)} to use its head"
        raise _refuse(model_dir, "tensor lm_head.weight", expected, (config.draft_vocab_size, config.hidden_size))
    if config.draft_vocab_size != vocab and "d2t" not in shapes:
        expected = f"present (draft_vocab_size {config.draft_vocab_size} is not the target's {vocab})"
        raise _refuse(model_dir, "tensor d2t", expected, "absent")
    return own_embed, own_head


def draft_facts(model_dir: str, target: Any, num_target_layers: int) -> DraftFacts:
    """Read and check the draft at ``model_dir`` for a target of ``num_target_layers`` layers whose config is
    ``target`` (its text part is read)."""
    from transformers import LlamaConfig

    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise _refuse(model_dir, "config.json", "an EAGLE-3 draft directory with config.json", "no config.json")
    try:
        raw = json.loads(path.read_text())
    except ValueError as e:
        raise _refuse(model_dir, "config.json", "a JSON object", str(e)) from e
    arch = (raw.get("architectures") or [None])[0]
    if arch not in ARCHITECTURES:
        raise _refuse(model_dir, "architectures[0]", " or ".join(ARCHITECTURES), arch)
    eagle = raw.get("eagle_config") or {}
    _check_unsupported(model_dir, raw, eagle)
    try:
        config = LlamaConfig(**raw)
    except (ValueError, TypeError) as e:  # a field transformers' Llama config refuses (a malformed rope)
        raise _refuse(model_dir, "config.json", "a Llama config transformers accepts", str(e)) from e
    tc = text_config(target)
    vocab, hidden = tc.vocab_size, tc.hidden_size
    if config.vocab_size != vocab:
        raise _refuse(
            model_dir, "vocab_size", f"the target's {vocab} (drafts are fed target token ids)", config.vocab_size
        )
    if getattr(config, "draft_vocab_size", None) is None:
        config.draft_vocab_size = config.vocab_size
    target_hidden = getattr(config, "target_hidden_size", None) or config.hidden_size
    if target_hidden != hidden:
        raise _refuse(
            model_dir, "target_hidden_size (else hidden_size)", f"the target's hidden size {hidden}", target_hidden
        )
    ids = _aux_ids(raw, eagle, num_target_layers)
    if any(not 0 <= i <= num_target_layers for i in ids):
        expected = (
            f"ids in [0, {num_target_layers}] (the stream entering one of the target's layers, or its last output)"
        )
        raise _refuse(model_dir, "eagle_aux_hidden_state_layer_ids", expected, list(ids))
    num_aux = getattr(config, "num_aux_hidden_states", None)
    if num_aux is not None and num_aux != len(ids):
        raise _refuse(model_dir, "num_aux_hidden_states", f"{len(ids)} (one per aux layer id {list(ids)})", num_aux)
    own_embed, own_head = _check_tensors(model_dir, config, len(ids), vocab, hidden)
    return DraftFacts(config, ids, vocab, hidden, own_embed, own_head)
