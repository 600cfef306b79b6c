"""The model's forward under torch.compile, for the steps where one graph fits: decode-only steps.

A decode-only step (every sequence one query row, no prefill span) has a fixed structure whatever
its batch size and lengths, so one graph serves them all: the batch dimension of the step's
tensors is marked dynamic before each call, and the lengths (``max_seq_len``) become symbolic
after the first recompile (Dynamo's automatic dynamic ints). A batch of one sequence gets its own
graph (sizes 0 and 1 are always specialized). Steps with prefill rows, and forwards that capture
hidden states, run eager: their structure changes with every mix of chunks.

Ops are traced when their code is traceable (the ``torch`` backend); what a backend makes opaque
(a ``torch.library.custom_op``, as hetero-torch's KV scatter) stays one node, and what Dynamo
cannot trace runs between graphs, eagerly. Mode: "reduce-overhead" (CUDA graphs recorded per
batch size) on CUDA, Inductor's default elsewhere. ``torch.compile`` itself is lazy: the first
decode step of each kind compiles, and ``compiled_steps`` / ``eager_steps`` count what ran how.
The engine calls :meth:`CompiledForward.warm_up` at start-up on its decode batch sizes, so
requests find their graphs built; compiling writes into ``cache_dir`` (``compile_cache``), so a
restart on the same model reuses Inductor's artifacts, and ``report`` says what it cost.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Iterable

import torch
from torch import nn

from hetero.engine.step import Step

__all__ = ["CompiledForward"]


def _batch_tensors(step: Step, input_ids: torch.Tensor | None) -> list[torch.Tensor]:
    """The tensors whose first dimension is the step's batch (or batch + 1)."""
    metas = [m for m in (step.meta, step.decode_meta) if m is not None]
    found = [
        input_ids,
        step.positions,
        step.slot_mapping,
        step.state_slots,
        step.has_initial_state,
        *(t for m in metas for t in (m.query_start_loc, m.seq_lens, m.block_table)),
    ]
    return [t for t in found if t is not None]


class CompiledForward:
    """Calls ``model``'s forward compiled for decode-only steps and eager otherwise.

    ``mode``: torch.compile's mode; None picks "reduce-overhead" on CUDA and the default elsewhere.
    """

    def __init__(self, model: nn.Module, device: torch.device, mode: str | None = None, cache_dir: str | None = None):
        self.model = model
        self.cache_dir = cache_dir
        if mode is None and device.type == "cuda":
            mode = "reduce-overhead"
        self.mode = mode
        self._compiled = torch.compile(model.forward, dynamic=None, mode=mode)
        # freezing (CPU): Inductor folds the weights in as constants and packs them for its GEMMs
        # (1.2x over unfrozen on the engine_vs_vllm dense workload). The weights must not change
        # after the first compiled step; the engine loads them before. Set while compiling, which
        # happens inside the call, rather than process-wide.
        self._compiling = contextlib.nullcontext
        if device.type == "cpu":
            import torch._inductor.config as inductor_config

            # no weight prepacking: its oneDNN-packed constants cannot be pickled, so Inductor's FX graph cache
            # would bypass every graph and a restart would compile from scratch (measured no slower without it)
            self._compiling = functools.partial(inductor_config.patch, {"freezing": True, "cpp.weight_prepack": False})
        self.compiled_steps = self.eager_steps = 0
        self.report: dict[str, float | int | str | None] = {}

    @contextlib.contextmanager
    def _context(self):
        with self._compiling(), contextlib.ExitStack() as stack:
            if self.cache_dir is not None:
                from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

                stack.enter_context(temporary_cache_dir(self.cache_dir))
            yield

    def warm_up(self, steps: Iterable[tuple[torch.Tensor | None, Step]]) -> dict[str, float | int | str | None]:
        """Run these decode steps (their outputs discarded) so the graphs they need are compiled
        now; returns and keeps ``report``: seconds, graphs compiled, and Inductor's FX graph cache
        hits and misses (hits: a restart reused the graph)."""
        from torch._dynamo.utils import counters

        before = dict(counters["inductor"])
        frames = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        for input_ids, step in steps:
            self(input_ids, step)
        self.compiled_steps = 0
        inductor = counters["inductor"]
        self.report = {
            "compile_s": round(time.perf_counter() - start, 3),
            "graphs": counters["stats"]["unique_graphs"] - frames,
            "cache_hits": inductor["fxgraph_cache_hit"] - before.get("fxgraph_cache_hit", 0),
            "cache_misses": inductor["fxgraph_cache_miss"] - before.get("fxgraph_cache_miss", 0),
            "cache_dir": self.cache_dir,
        }
        return self.report

    @staticmethod
    def fits(step: Step) -> bool:
        """Whether ``step`` is decode-only (the compiled graph's kind)."""
        return step.prefill is None and step.num_decodes == step.num_tokens > 0

    def __call__(self, input_ids: torch.Tensor | None, step: Step) -> torch.Tensor:
        if not self.fits(step):
            self.eager_steps += 1
            return self.model(input_ids, step)
        for t in _batch_tensors(step, input_ids):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        self.compiled_steps += 1
        with self._context():
            return self._compiled(input_ids, step)
