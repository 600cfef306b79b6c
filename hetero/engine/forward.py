"""Build a model from a checkpoint directory and run whole prompts through it, outside the serving loop.

``check-model``, the end-to-end tests and the model runner share this: one place
decides how a checkpoint becomes a loaded model on a backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from hetero.engine.context import ModelContext
from hetero.engine.models import model_class
from hetero.engine.models.base import CausalLM
from hetero.engine.parallel import Parallel
from hetero.engine.runtime.cache_ops import ResetSlot
from hetero.engine.runtime.kv_cache import allocate_kv_cache
from hetero.engine.step_buffers import build_step
from hetero.ops import Ops

__all__ = ["build_model", "prefill", "PrefillResult"]


def build_model(
    model_dir: str | Path,
    ops: Ops,
    dtype: torch.dtype,
    parallel: Parallel | None = None,
    hf_config=None,
    quant_config=None,
    stage=None,
) -> CausalLM:
    """The checkpoint's model class, built on ``ops``' device in ``dtype`` and loaded from its safetensors.

    ``quant_config`` (a ``hetero.engine.quant.QuantConfig``) replaces the one the checkpoint's config asks
    for, e.g. ``weights_only(quant_config_of(config))`` to run an 8-bit checkpoint without activation
    quantization. ``stage`` (a ``hetero.engine.pipeline.Stage``): build and load only that stage's part."""
    from transformers import AutoConfig

    from hetero.engine.loader import load_weights

    hf_config = hf_config or AutoConfig.from_pretrained(str(model_dir))
    device = torch.device(ops.device)
    ctx = ModelContext(ops=ops, parallel=parallel or Parallel(), dtype=dtype, device=device, stage=stage)
    cls = model_class(getattr(hf_config, "architectures", None))
    model = cls(hf_config, ctx) if quant_config is None else cls(hf_config, ctx, quant_config=quant_config)
    load_weights(model, model_dir)
    return model.eval()


@dataclass
class PrefillResult:
    """Per prompt: logits float32 [n, vocab] at every position, and (when captured) the hidden
    states [n, H]: the embedding output, then each decoder layer's output, then the final norm's."""

    logits: list[torch.Tensor]
    hidden: list[list[torch.Tensor]] = field(default_factory=list)


@torch.inference_mode()
def prefill(
    model: CausalLM, prompts: Sequence[Sequence[int]], *, block_size: int = 16, capture: bool = False
) -> PrefillResult:
    """Run every prompt as one packed prefill step over a fresh paged cache (random block order)."""
    ctx: ModelContext = model.ctx
    lens = [len(p) for p in prompts]
    blocks = [-(-n // block_size) for n in lens]
    order = torch.randperm(sum(blocks), generator=torch.Generator().manual_seed(0)).tolist()
    tables, used = [], 0
    for n in blocks:
        tables.append(order[used : used + n])
        used += n
    pools = allocate_kv_cache(model, max(used, 1), block_size, ctx.dtype, ctx.device, num_state_slots=len(prompts))
    pools.apply([ResetSlot(i) for i in range(len(prompts))])
    # one-row prompts would be treated as decodes; they must come first
    idx = sorted(range(len(prompts)), key=lambda i: lens[i] != 1)
    step = build_step(
        [lens[i] for i in idx],
        [lens[i] for i in idx],
        [tables[i] for i in idx],
        block_size,
        ctx.device,
        state_slots=idx if pools.state else None,
    )
    ids = torch.tensor([t for i in idx for t in prompts[i]], dtype=torch.int64, device=ctx.device)
    captured: list[torch.Tensor] | None = [] if capture else None
    hidden = model(ids, step, capture=captured)
    logits = model.compute_logits(hidden)
    starts = [0]
    for i in idx:
        starts.append(starts[-1] + lens[i])
    result = PrefillResult(logits=[None] * len(prompts))  # type: ignore[list-item]
    per_layer = (captured or []) + [hidden]
    result.hidden = [[] for _ in prompts] if capture else []
    for j, i in enumerate(idx):
        rows = slice(starts[j], starts[j + 1])
        result.logits[i] = logits[rows].float()
        if capture:
            result.hidden[i] = [h[rows].float() for h in per_layer]
    return result
