"""A test-only hybrid model: tiny Qwen3 whose every decoder layer adds a per-sequence recurrent state.

``RunningSum`` keeps s_t = 0.5 * s_{t-1} + x_t per sequence (the shape of a linear
attention's state, without its projections) and adds tanh(s_t) / 2 to the layer's
output, so every token depends on the whole history through the state pool and
through the paged KV of the attention next to it. It is written in plain torch,
one row at a time: it is the reference, not a kernel.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from hetero.engine.layers.cached import CachedLayer, StateEntry
from hetero.engine.models.qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM
from hetero.engine.step import Step

ARCH = "ToyStateForCausalLM"


class RunningSum(CachedLayer):
    """``forward(x [T, H], step) -> [T, H]``; state ``sum`` float32 [H] per sequence."""

    def __init__(self, hidden: int, init: str):
        super().__init__()
        self.hidden, self.init = hidden, init
        self.sum: torch.Tensor | None = None

    def cache_spec(self) -> tuple[StateEntry, ...]:
        return (StateEntry("sum", (self.hidden,), torch.float32, init=self.init),)

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        assert self.sum is not None and step.state_slots is not None and step.has_initial_state is not None
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        starts = step.meta.query_start_loc.tolist()
        for b, slot in enumerate(step.state_slots.tolist()):
            if self.init == "flag" and not bool(step.has_initial_state[b]):
                s = torch.zeros(self.hidden, dtype=torch.float32, device=x.device)  # the slot holds poison
            else:
                s = self.sum[slot].clone()
            for row in range(starts[b], starts[b + 1]):
                s = 0.5 * s + x[row].float()
                out[row] = torch.tanh(s)
            self.sum[slot] = s
        return (out / 2).to(x.dtype)


class ToyStateDecoderLayer(Qwen3DecoderLayer):
    def __init__(self, ctx, config, *args, **kwargs):
        super().__init__(ctx, config, *args, **kwargs)
        self.running_sum = RunningSum(config.hidden_size, getattr(config, "toy_state_init", "zeros"))

    def forward(self, hidden, residual, step, capture=None):
        hidden, residual = super().forward(hidden, residual, step, capture)
        return hidden + self.running_sum(hidden, step), residual


class ToyStateForCausalLM(Qwen3ForCausalLM):
    layer_cls = ToyStateDecoderLayer


def make_checkpoint(qwen3_dir: str | Path, out: Path, init: str = "zeros") -> Path:
    """A copy of a tiny Qwen3 checkpoint that names the toy architecture (no new weights: the state has none)."""
    shutil.copytree(qwen3_dir, out)
    config = json.loads((out / "config.json").read_text())
    config.update(architectures=[ARCH], toy_state_init=init)
    (out / "config.json").write_text(json.dumps(config))
    return out
