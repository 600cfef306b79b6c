"""Pipeline parallelism's step: micro-batches in flight through the stages, lock-step, one tick per ``LLM.step``.

Every rank calls ``tick`` together. In a tick each stage first computes the micro-batch it holds (stage 0 a
new one rank 0 just scheduled, stage s the one stage s-1 sent in the previous tick), so all stages compute at
once; then the transfers run down the chain (stage 0 sends, each later stage receives and then sends, the
last stage's sampling rank sends the tokens to rank 0, and rank 0 receives them), which no blocking send
can deadlock. A micro-batch scheduled at tick t returns its tokens at the end of tick t + P - 1, so up to
P (``pipeline_microbatches``) are in flight; their sequences are not scheduled again until then.

The sampling state of a request (its parameters, its generator) lives on the sampling rank: a micro-batch
carries a request's parameters the first time it is sampled there and the drafts it verifies; rank 0 names
the requests that ended, so the sampling rank forgets them. The same seed derivation as one process gives
the same tokens.
"""

from __future__ import annotations

import pickle
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from hetero.engine.runtime.batch import ScheduledBatch
from hetero.engine.runtime.model_runner import ModelRunner
from hetero.engine.runtime.sequence import SamplingParams, Sequence
from hetero.engine.runtime.step_plan import StepPlan
from hetero.engine.spec_decode.verify import choose_tokens

__all__ = ["MicroBatch", "MicroBatchPipeline"]


@dataclass
class MicroBatch:
    """What travels with a micro-batch's hidden states: its ``plan``, its ``tick`` (its id), per sampled
    sequence (index, parameters the first time or None, drafts), and the request indices that ended."""

    tick: int
    plan: StepPlan
    sampling: list[tuple[int, SamplingParams | None, list[int]]] = field(default_factory=list)
    released: list[int] = field(default_factory=list)


@dataclass(eq=False)
class _Request:
    """A request's sampling state on the sampling rank (what ``choose_tokens`` reads of a ``Sequence``)."""

    index: int
    sampling_params: SamplingParams
    generator: torch.Generator | None = None
    draft_token_ids: list[int] = field(default_factory=list)
    draft_probs: Any = None
    output_logprobs: list = field(default_factory=list)


def _pack(obj: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def _unpack(t: torch.Tensor) -> Any:
    return pickle.loads(t.cpu().numpy().tobytes())


class MicroBatchPipeline:
    """One rank's part of the pipeline (``runner.stage``); rank 0 also keeps the micro-batches in flight."""

    def __init__(self, runner: ModelRunner, in_flight: set[Sequence], depth: int | None = None):
        self.runner, self.stage, self.in_flight = runner, runner.stage, in_flight
        self.depth = min(depth or self.stage.size, self.stage.size)  # more than P could never all be busy
        self.flying: deque[tuple[int, ScheduledBatch]] = deque()  # rank 0: (tick, batch), oldest first
        self.held: tuple[MicroBatch | None, dict[str, torch.Tensor]] = (None, {})  # stages > 0
        self.requests: dict[int, _Request] = {}  # the sampling rank
        self.sent: dict[int, Sequence] = {}  # rank 0: requests whose parameters the sampling rank has
        self.ticks = 0
        self.compute_s = self.transfer_s = 0.0  # this rank's time in its stage's forward, and in transfers

    @property
    def has_room(self) -> bool:
        """Rank 0: whether another micro-batch may enter the pipeline now."""
        return len(self.flying) < self.depth

    def tick(self, batch: ScheduledBatch | None, state_group: int) -> list[tuple[ScheduledBatch, list]]:
        """Run one tick. ``batch``: rank 0's new micro-batch (None: none, or another rank). Returns on rank 0
        the micro-batches that came back, each with its tokens and logprobs per sampled sequence."""
        stage, runner = self.stage, self.runner
        self.ticks += 1
        if stage.first:
            mb = self._admit(batch, state_group) if stage.world.rank == 0 else None
            mb = runner.parallel.broadcast_object(mb, runner.device)
            tensors: dict[str, torch.Tensor] = {}
        else:
            mb, tensors = self.held
        start = time.perf_counter()
        out = runner.forward_stage(mb.plan, tensors or None) if mb is not None else None
        result = self._sample(mb, out) if stage.samples and mb is not None else None
        computed = time.perf_counter()
        self.compute_s += computed - start
        try:
            return self._transfer(mb, out, result)
        finally:
            self.transfer_s += time.perf_counter() - computed

    def _transfer(self, mb, out, result) -> list[tuple[ScheduledBatch, list]]:
        """The tick's transfers, down the chain (see the module docstring)."""
        stage, world = self.stage, self.stage.world
        if not stage.last:
            world.send_tensor_dict({"batch": _pack(mb), **(out or {})}, stage.next_rank)
        if not stage.first:
            got = world.recv_tensor_dict(stage.prev_rank)
            self.held = (_unpack(got.pop("batch")), got)
        if stage.samples:
            world.send_tensor_dict({"result": _pack(result)}, 0)
        if world.rank == 0:
            back = _unpack(world.recv_tensor_dict(world.world_size - stage.tp)["result"])
            return self._returned(back)
        return []

    def _admit(self, batch: ScheduledBatch | None, state_group: int) -> MicroBatch | None:
        released = [i for i, seq in self.sent.items() if seq.is_finished]
        for i in released:
            del self.sent[i]
        if batch is None or not (batch.seqs or batch.cache_ops):
            return MicroBatch(self.ticks, StepPlan(), released=released) if released else None
        sampling = []
        for seq, drafts, sampled in zip(batch.seqs, batch.drafts, batch.sample):
            if sampled:
                sampling.append((seq.index, None if seq.index in self.sent else seq.sampling_params, list(drafts)))
                self.sent[seq.index] = seq
        stateful = self.runner.num_state_slots > 0
        self.flying.append((self.ticks, batch))
        self.in_flight.update(batch.seqs)
        return MicroBatch(self.ticks, StepPlan.of(batch, stateful, state_group), sampling, released)

    def _sample(self, mb: MicroBatch, logits: torch.Tensor | None) -> tuple[int, list] | None:
        for i in mb.released:
            self.requests.pop(i, None)
        if not mb.sampling:
            return None
        reqs = []
        for index, params, drafts in mb.sampling:
            if params is not None:
                self.requests[index] = _Request(index, params)
            req = self.requests[index]
            req.draft_token_ids, req.output_logprobs = drafts, []
            reqs.append(req)
        spec = mb.plan.spec_lens
        spec = None if spec is None else [k for k, s in zip(spec, mb.plan.sample) if s]
        emitted = choose_tokens(self.runner.ops, self.runner.sampler, logits, reqs, spec)
        return mb.tick, [(tokens, req.output_logprobs) for tokens, req in zip(emitted, reqs)]

    def _returned(self, back: tuple[int, list] | None) -> list[tuple[ScheduledBatch, list]]:
        """Rank 0: the micro-batch that entered P - 1 ticks ago has left the last stage; ``back`` is its
        tokens (None when it sampled nothing)."""
        if not self.flying or self.flying[0][0] != self.ticks - (self.stage.size - 1):
            return []
        tick, batch = self.flying.popleft()
        if back is not None and back[0] != tick:
            raise RuntimeError(f"pipeline out of step: tokens of tick {back[0]} arrived for tick {tick}")
        self.in_flight.difference_update(batch.seqs)
        return [(batch, back[1] if back is not None else [])]
