"""``LLM``: the offline serving loop (scheduler, block manager and model runner) behind one ``generate`` call."""

from __future__ import annotations

import os
import sys
import time
from typing import Any
from typing import Sequence as Seq

from hetero.engine._export import export_running
from hetero.engine._inputs import check_import, check_logprobs, check_params, encode_prompt, params_list, prompt_list
from hetero.engine._pipeline_step import account, advance, check_pipeline, pipeline_step
from hetero.engine._progress import progress_bar
from hetero.engine._setup import communicator, eos_token_ids, load_tokenizer
from hetero.engine.config import EngineConfig, text_config
from hetero.engine.outputs import RequestOutput
from hetero.engine.parallel import Parallel
from hetero.engine.runtime.block_manager import BlockManager
from hetero.engine.runtime.cache_io import SequenceCache, check_fits
from hetero.engine.runtime.microbatch import MicroBatchPipeline
from hetero.engine.runtime.model_runner import ModelRunner
from hetero.engine.runtime.scheduler import Scheduler
from hetero.engine.runtime.sequence import Logprob, SamplingParams, Sequence
from hetero.engine.runtime.step_plan import StepPlan
from hetero.engine.spec_decode.drafting import Drafter
from hetero.engine.spec_decode.metrics import SpecDecodeStats
from hetero.errors import UsageError

__all__ = ["LLM", "Logprob", "RequestOutput"]


class LLM:
    """Generate from a Hugging Face checkpoint directory through hetero ops.

    Keyword arguments are ``EngineConfig`` fields. With ``tensor_parallel_size`` N > 1,
    launch N processes with ``torchrun --nproc-per-node N script.py``. Rank 0 owns the
    requests: it schedules every step and broadcasts the plan and the outputs, so every
    rank returns rank 0's outputs and a request added on another rank is checked but
    never served. Under TP, ``step``, ``has_unfinished`` and ``generate`` are collective
    (every rank calls them together); ``abort`` and ``export_cache`` act on rank 0 only.
    Logprobs (``SamplingParams.logprobs``) are computed on rank 0, where the tokens are
    sampled, and reach the other ranks with its outputs.

    ``stats`` (a dict, counted since construction): ``num_kv_blocks``, ``block_size``,
    ``steps``, ``preemptions``, ``prompt_tokens``, ``cached_prompt_tokens`` (found in the
    prefix cache), ``generated_tokens``, and per step ``kv_blocks_in_use`` (blocks held
    by sequences while it ran), ``step_tokens`` (rows computed) and ``step_seconds``; with
    ``speculative_config``, ``spec_decode`` (a ``SpecDecodeStats``: drafts, draft and accepted
    tokens, acceptance per draft position).
    """

    def __init__(
        self,
        model: str | os.PathLike,
        backend: str | None = None,
        dtype: str = "auto",
        block_size: int = 16,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        tensor_parallel_size: int = 1,
        expert_parallel: bool = False,
        seed: int = 0,
        **config: Any,
    ):
        cfg = EngineConfig(
            model=model,
            backend=backend,
            dtype=dtype,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            tensor_parallel_size=tensor_parallel_size,
            expert_parallel=expert_parallel,
            seed=seed,
            **config,
        )
        comm = communicator(cfg)
        self.config = cfg.resolve()
        check_pipeline(self.config)
        self.tokenizer = load_tokenizer(self.config.model)
        self.runner = ModelRunner(self.config, comm)
        self.world = Parallel(comm)  # every rank: TP x PP
        self.block_manager = BlockManager(
            self.runner.num_kv_blocks,
            cfg.block_size,
            cfg.enable_prefix_caching,
            num_state_slots=self.runner.num_state_slots,
            num_state_snapshots=self.runner.num_state_snapshots,
            state_group=self.runner.state_group,
        )
        spec = self.config.speculative_config
        self.drafter = Drafter(spec, self.runner, self.rank == 0) if spec is not None else None
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=self.config.max_model_len,
            eos_token_ids=eos_token_ids(self.config, self.tokenizer),
            num_lookahead_tokens=self.drafter.lookahead if self.drafter is not None else 0,
        )
        self.stats: dict[str, Any] = dict(
            num_kv_blocks=self.runner.num_kv_blocks,
            block_size=cfg.block_size,
            steps=0,
            preemptions=0,
            prompt_tokens=0,
            cached_prompt_tokens=0,
            generated_tokens=0,
            kv_blocks_in_use=[],
            step_tokens=[],
            step_seconds=[],
        )
        if spec is not None:
            self.stats["spec_decode"] = SpecDecodeStats()
        self._num_requests = 0
        self.pipeline = None
        if self.runner.stage is not None:
            self.pipeline = MicroBatchPipeline(self.runner, self.scheduler.in_flight, cfg.pipeline_microbatches)

    def add_request(
        self,
        prompt: str | Seq[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        cache: SequenceCache | None = None,
    ) -> str:
        """Queue one request (text needs a tokenizer); returns its id.

        ``cache``: the exported cache of this prompt's first ``cache.num_tokens`` tokens
        (``export_cache`` on another engine of the same model and parallel layout), written
        into this request's blocks when it is admitted; only the rest is computed.

        Checked here, before any op sees it: the sampling parameters are a
        ``SamplingParams`` (whose values are checked when it is made), the token ids are
        integers in ``[0, vocab_size)``, ``logprobs`` is at most ``vocab_size``, the prompt is
        neither empty nor longer than ``max_model_len``, and the request fits the KV cache. A
        prompt that leaves less than ``max_tokens`` room stops at ``max_model_len`` tokens
        (finish reason "length"). A failed check raises :class:`hetero.errors.UsageError` (a ValueError)
        naming the request (its index: the arrival number on this engine, which is also the
        default request id), the argument, what was expected and what came.
        """
        index = self._num_requests
        params = check_params(sampling_params, index)
        check_logprobs(params, getattr(text_config(self.config.hf_config), "vocab_size", None), index)
        seq = Sequence(request_id if request_id is not None else str(index), self._encode(prompt, index), params, index)
        if cache is not None:
            if self.pipeline is not None:
                raise UsageError(
                    f"request {index}: argument 'cache': importing a cache under pipeline parallelism is not "
                    f"supported (each stage holds its own layers' cache)",
                    arg="cache",
                    expected="pipeline_parallel_size 1",
                    got=self.config.pipeline_parallel_size,
                )
            check_import(cache, seq.prompt_token_ids, index)
            check_fits(self.runner.cache, cache)
            seq.imported = cache
        if self.rank == 0:
            self.scheduler.add(seq)
        self._num_requests += 1
        seq.metrics["arrival_time"] = time.perf_counter()
        self.stats["prompt_tokens"] += seq.num_prompt_tokens
        return seq.request_id

    def export_cache(self, request_id: str | None = None) -> SequenceCache | None:
        """The cache of a running request's computed tokens, on the CPU in a layout another engine imports, of any
        tensor-parallel size. Under tensor parallelism every rank calls it together, rank 0 naming the request:
        rank 0 gets the cache gathered from every rank's shard, the others None."""
        return export_running(self, request_id)

    def encode(self, prompt: str | Seq[int]) -> list[int]:
        """The token ids ``add_request`` would queue for ``prompt``, checked as it checks them."""
        return self._encode(prompt, self._num_requests)

    @property
    def rank(self) -> int:
        """This process's global rank (its tensor-parallel rank without pipeline parallelism; 0 without torchrun)."""
        return self.world.rank

    def has_unfinished(self) -> bool:
        """Whether rank 0 has requests waiting, running or in the pipeline (collective under TP and PP)."""
        busy = self.scheduler.has_unfinished() or (self.pipeline is not None and bool(self.pipeline.flying))
        if self.world.size == 1:
            return busy
        return bool(self.world.broadcast_object(busy, self.runner.device))

    def abort(self, request_id: str) -> bool:
        """End a waiting or running request now (finish reason "abort"), freeing its blocks and state slot.

        Returns False when no such request is unfinished (it may have just finished). An
        aborted request is not reported by later steps.
        """
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            if seq.request_id == request_id:
                self.scheduler.finish(seq, "abort")
                return True
        return False

    def step(self) -> list[RequestOutput]:
        """Schedule and run one step; an output for every request that got tokens or finished in it.

        Each output carries the tokens new since the request was last reported
        (``new_token_ids``) and ``finish_reason`` once it ends. Under pipeline parallelism a step is one
        tick of the pipeline (``runtime.microbatch``): a new micro-batch enters, and the outputs are those
        of the one that left, on rank 0 (the other ranks return none).
        """
        if self.pipeline is not None:
            return pipeline_step(self)
        start = time.perf_counter()
        lead = self.rank == 0
        batch = self.scheduler.schedule() if lead else None
        in_use = self.block_manager.num_used_blocks
        stateful, group = self.runner.num_state_slots > 0, self.runner.state_group
        plan = StepPlan.of(batch, stateful, group) if batch is not None else None
        plan = self.world.broadcast_object(plan, self.runner.device)
        sampled = self.runner.run(plan, batch.sampled_seqs if batch is not None else None)
        report = (advance(self, batch, sampled), len(batch.preempted), in_use) if lead else None
        if self.drafter is not None:
            self.drafter.propose(batch)
        outputs, preempted, in_use = self.world.broadcast_object(report, self.runner.device)
        spec = None if plan.spec_lens is None else [k for k, s in zip(plan.spec_lens, plan.sample) if s]
        account(self, start, outputs, sampled, spec, preempted, in_use, len(plan.input_ids))
        return outputs

    def generate(
        self,
        prompts: str | Seq[int] | Seq[str | Seq[int]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        progress: bool | None = None,
    ) -> list[RequestOutput]:
        """Run ``prompts`` (strings, token-id lists, or one of either) to completion; outputs in input order.

        ``sampling_params``: one for all, or one per prompt (default ``SamplingParams()``).
        ``progress``: a transient progress bar on stderr (None: only when stderr is a terminal).
        """
        if self.has_unfinished():
            raise RuntimeError(
                "generate() needs an idle engine: requests added with add_request() are unfinished; "
                "drive them with step() first"
            )
        prompts = prompt_list(prompts)
        params = params_list(sampling_params, len(prompts))
        ids: list[str] = []
        first, prompt_tokens = self._num_requests, self.stats["prompt_tokens"]
        try:
            for prompt, p in zip(prompts, params):
                ids.append(self.add_request(prompt, p))
        except Exception:
            # a refused batch leaves nothing behind: the next one gets the same request indices (and seeds)
            self._abort_all()
            self._num_requests, self.stats["prompt_tokens"] = first, prompt_tokens
            raise
        ids = self.world.broadcast_object(ids, self.runner.device)  # rank 0's requests, in its order
        outputs: dict[str, RequestOutput] = {}
        show = progress if progress is not None else sys.stderr.isatty()
        before = self.stats["generated_tokens"]
        with progress_bar(show and self.rank == 0, len(ids)) as advance:
            while self.has_unfinished():
                done = [out for out in self.step() if out.finished]
                outputs.update((out.request_id, out) for out in done)
                advance(len(done), self.stats["generated_tokens"] - before)
        if self.pipeline is None:
            return [outputs[i] for i in ids]
        return self.world.broadcast_object([outputs[i] for i in ids] if self.rank == 0 else None, self.runner.device)

    def _abort_all(self) -> None:
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.finish(seq, "abort")

    def _encode(self, prompt: str | Seq[int], index: int) -> list[int]:
        return encode_prompt(prompt, self.tokenizer, self.config, index)
