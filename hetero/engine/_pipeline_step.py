"""``LLM.step``'s bookkeeping (rank 0's outputs and the stats), and its form under pipeline parallelism.
Each function takes the ``LLM`` (``llm``) whose step it is."""

from __future__ import annotations

import time

from hetero.engine.config import EngineConfig
from hetero.engine.outputs import RequestOutput, request_output
from hetero.engine.runtime.batch import ScheduledBatch
from hetero.errors import UsageError

__all__ = ["check_pipeline", "advance", "account", "pipeline_step"]


def check_pipeline(config: EngineConfig) -> None:
    """UsageError for what pipeline parallelism does not run, naming the option and why."""
    if config.pipeline_parallel_size == 1:
        if config.pp_layer_partition is not None and len(config.pp_layer_partition) != 1:
            raise UsageError(
                f"EngineConfig.pp_layer_partition {list(config.pp_layer_partition)} splits the layers over "
                f"{len(config.pp_layer_partition)} stages but pipeline_parallel_size is 1",
                arg="pp_layer_partition",
                expected="None, or one count per stage",
                got=list(config.pp_layer_partition),
            )
        return
    if config.compile:
        raise UsageError(
            "EngineConfig.compile is not supported with pipeline_parallel_size > 1: a stage's forward starts "
            "from the previous stage's tensors, which the compiled decode graphs do not take; run eager",
            arg="compile",
            expected="False under pipeline parallelism",
            got=True,
        )
    spec = config.speculative_config
    if spec is not None and spec.uses_model:
        raise UsageError(
            f"speculative_config: method {spec.method!r} drafts with a model that reads the target's embedding "
            "(first stage) and its last hidden states (last stage); under pipeline parallelism only 'ngram' "
            "runs",
            arg="speculative_config.method",
            expected="'ngram' under pipeline parallelism",
            got=spec.method,
        )


def advance(llm, batch: ScheduledBatch, sampled: list[list[int]]) -> list[RequestOutput]:
    """Rank 0: account ``batch``'s tokens in the scheduler; the outputs of the requests that moved."""
    now = time.perf_counter()
    for seq in batch.sampled_seqs:
        seq.metrics.setdefault("first_token_time", now)
    llm.scheduler.postprocess(batch, sampled)
    moved = [seq for seq in batch.sampled_seqs if seq.num_streamed < len(seq.output_token_ids)]
    return [request_output(seq, now, llm.tokenizer) for seq in moved]


def account(llm, start: float, outputs: list[RequestOutput], sampled, spec, preempted: int, in_use: int, rows: int):
    """Add one step to ``llm.stats``: ``sampled`` the tokens it emitted per sampled sequence, ``spec`` their
    drafts' counts (None: none)."""
    st = llm.stats
    st["steps"] += 1
    st["preemptions"] += preempted
    st["generated_tokens"] += sum(len(t) for t in sampled)
    if spec is not None:
        st["spec_decode"].add(spec, sampled)
    st["cached_prompt_tokens"] += sum(o.metrics["num_cached_tokens"] for o in outputs if o.finished)
    st["kv_blocks_in_use"].append(in_use)
    st["step_tokens"].append(rows)
    st["step_seconds"].append(time.perf_counter() - start)


def pipeline_step(llm) -> list[RequestOutput]:
    """One tick (``runtime.microbatch``): rank 0 schedules a micro-batch if one may enter, every stage runs,
    and the micro-batch leaving the pipeline is accounted on rank 0, whose outputs these are."""
    start = time.perf_counter()
    pipe = llm.pipeline
    batch = None
    if llm.rank == 0 and pipe.has_room:
        sched = llm.scheduler
        active = min(len(sched.running) + len(sched.waiting), sched.max_num_seqs)
        batch = sched.schedule(max_seqs=max(1, -(-active // pipe.depth)))  # a share for each micro-batch
    in_use = llm.block_manager.num_used_blocks
    outputs: list[RequestOutput] = []
    sampled_all, spec_all = [], []
    for done, results in pipe.tick(batch, llm.runner.state_group):
        sampled = [tokens for tokens, _ in results]
        for seq, (_, logprobs) in zip(done.sampled_seqs, results):
            seq.output_logprobs.extend(logprobs)
        outputs += advance(llm, done, sampled)
        if llm.drafter is not None:
            llm.drafter.propose(done)
        sampled_all += sampled
        spec_all += [len(d) for d, s in zip(done.drafts, done.sample) if s]
    spec = spec_all if any(spec_all) else None
    preempted = len(batch.preempted) if batch is not None else 0
    account(llm, start, outputs, sampled_all, spec, preempted, in_use, batch.num_tokens if batch is not None else 0)
    return outputs
