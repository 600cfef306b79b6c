"""The draft a model proposer runs: another checkpoint, the target's MTP layers, or an EAGLE-3 head."""

from __future__ import annotations

import torch
from torch import nn

from hetero.engine.config import text_config
from hetero.engine.runtime.kv_cache import bytes_per_state_slot
from hetero.engine.spec_decode.config import SpeculativeConfig
from hetero.errors import UsageError

__all__ = ["TokenDraft", "build_draft"]


class TokenDraft(nn.Module):
    """A draft checkpoint run as a model of its own: fed tokens, no hidden state of the target."""

    takes_hidden = False
    aux_layers: tuple[int, ...] = ()

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, step, hidden: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, step)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)


def build_draft(config: SpeculativeConfig, runner) -> nn.Module:
    """The draft module of ``config`` for ``runner``'s target, built on its ops, dtype and parallel group."""
    target_vocab = text_config(runner.config.hf_config).vocab_size
    if config.method == "draft_model":
        from hetero.engine.config import load_hf_config
        from hetero.engine.forward import build_model

        hf = load_hf_config(config.model)
        vocab = text_config(hf).vocab_size
        if vocab != target_vocab:
            raise UsageError(
                f"speculative_config: argument 'model': the draft's vocabulary ({vocab} tokens) is not the "
                f"target's ({target_vocab})",
                arg="speculative_config.model",
                expected=f"a draft with the target's {target_vocab}-token vocabulary",
                got=vocab,
            )
        draft = TokenDraft(build_model(config.model, runner.ops, runner.dtype, runner.parallel, hf_config=hf))
        if bytes_per_state_slot(draft, runner.dtype):
            raise UsageError(
                f"speculative_config: argument 'model': {config.model} has per-sequence recurrent state "
                f"({type(draft.model).__name__}); a draft model with state is not supported (its drafted "
                "tokens would have to be rolled back too): use method 'mtp' or 'ngram' for hybrid models",
                arg="speculative_config.model",
                expected="a draft model without recurrent state (attention only)",
                got=type(draft.model).__name__,
            )
        return draft
    if config.method == "mtp":
        build = getattr(runner.model, "build_mtp", None)
        if build is None:
            raise UsageError(
                f"speculative_config: method 'mtp': {type(runner.model).__name__} has no next-token (MTP) layers "
                "hetero can run",
                arg="speculative_config.method",
                expected="a model with MTP layers (DeepSeek-V3/V3.2/V4, GLM-4.5, Hy3, Qwen3-Next/3.5)",
                got=type(runner.model).__name__,
            )
        return build(runner.config.model)
    from hetero.engine.spec_decode.eagle3 import build_eagle3

    return build_eagle3(config.model, runner)
