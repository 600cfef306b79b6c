"""Runs one scheduled batch through the model on a hetero backend and samples its next tokens."""

from __future__ import annotations

import dataclasses

import torch

import hetero
from hetero.engine.config import EngineConfig
from hetero.engine.forward import build_model
from hetero.engine.parallel import Parallel
from hetero.engine.runtime import compile_cache
from hetero.engine.runtime.compiled import CompiledForward
from hetero.engine.runtime.kv_cache import allocate_kv_cache, bytes_per_block, bytes_per_state_slot
from hetero.engine.runtime.sampler import Sampler
from hetero.engine.runtime.sequence import Sequence
from hetero.engine.runtime.step_plan import StepPlan
from hetero.engine.step import Step
from hetero.engine.step_buffers import StepBuffers
from hetero.spec.comm import Communicator

__all__ = ["ModelRunner"]


class ModelRunner:
    """The model, its paged KV cache and the sampler of one rank.

    ``config`` is resolved if it is not yet (``EngineConfig.resolve``). With a
    communicator of more than one rank, the model is split over them (tensor
    parallelism); every rank runs the plan rank 0 broadcast, and the tokens sampled
    on rank 0 are broadcast so that all ranks append the same ones. Step tensors
    live in persistent buffers sized by the config (``StepBuffers``): a step's
    tensors are views, valid until the next one. With ``config.compile`` the forward of
    decode-only steps is compiled (``CompiledForward``).
    """

    def __init__(self, config: EngineConfig, comm: Communicator | None = None):
        if config.hf_config is None:
            config = config.resolve()
        self.config = config
        # compiled: no registry value checks (they read tensors on the host, splitting the graph at
        # every op); the engine builds every index itself and backends keep reads inside the tensors
        self.ops = hetero.load(config.backend, device=config.device, validate=False if config.compile else None)
        self.device = torch.device(self.ops.device)
        self.parallel = Parallel(comm, config.expert_parallel)
        self.dtype = config.torch_dtype
        self.model = build_model(config.model, self.ops, self.dtype, self.parallel, hf_config=config.hf_config)
        self.block_size = config.block_size
        slot_bytes = bytes_per_state_slot(self.model, self.dtype)
        self.num_state_slots, self.num_state_snapshots = config.state_slots(slot_bytes)
        state_bytes = (self.num_state_slots + self.num_state_snapshots) * slot_bytes
        self.num_kv_blocks = config.kv_blocks(bytes_per_block(self.model, self.block_size, self.dtype), state_bytes)
        with torch.no_grad():
            self.cache = allocate_kv_cache(
                self.model,
                self.num_kv_blocks,
                self.block_size,
                self.dtype,
                self.device,
                self.num_state_slots + self.num_state_snapshots,
            )
        self.buffers = StepBuffers(
            config.max_num_batched_tokens,
            config.max_num_seqs,
            config.max_model_len,
            self.block_size,
            self.device,
            has_state=bool(self.num_state_slots),
        )
        self.sampler = Sampler(config.seed)
        self.forward: CompiledForward | torch.nn.Module = self.model
        if config.compile:
            self.forward = CompiledForward(self.model, self.device, cache_dir=str(self._compile_cache_dir()))
            with torch.inference_mode():
                self.forward.warm_up(self._warm_up_steps())
        # a compiled graph has no per-layer host work for a plan to save, and would guard on it
        self.plans = not config.compile

    @property
    def rank(self) -> int:
        return self.parallel.rank

    def run(self, plan: StepPlan, sampled: list[Sequence] | None = None) -> list[int]:
        """Compute ``plan``'s rows and return one token per sampled row, in order.

        ``sampled``: the sequences whose rows are sampled (rank 0 needs their sampling
        parameters and generators; the other ranks receive rank 0's choice). Rank 0 also
        appends each sampled token's logprobs to ``output_logprobs`` of the sequences whose
        parameters ask for them; the other ranks compute none.
        """
        with torch.inference_mode():
            self.cache.apply(plan.cache_ops)  # even without rows: a snapshot must not be lost
            if not plan.query_lens:
                return []
            step, input_ids = self.buffers.fill(
                plan.query_lens, plan.seq_lens, plan.block_tables, plan.sample, plan.state_slots, plan.input_ids
            )
            if self.plans:
                step = self._plan(step)
            hidden = self.forward(input_ids, step)
            if step.logits_indices.numel() == 0:
                return []
            logits = self.model.compute_logits(hidden[step.logits_indices])
            return self._sample(logits, sampled or [], plan.num_sampled)

    def _compile_cache_dir(self):
        """This rank's compile cache directory, keyed by what shapes its graphs (``compile_cache``)."""
        c, hf = self.config, self.config.hf_config
        model_config = dict(hf.to_dict() if hasattr(hf, "to_dict") else hf)
        model_config.pop("_name_or_path", None)  # where it was loaded from does not shape the graph
        factors = {
            "model_config": model_config,
            "dtype": str(self.dtype),
            "backend": self.ops.name,
            "device": self.device.type,
            "sizes": (c.block_size, c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len, self.num_kv_blocks),
            "state_slots": (self.num_state_slots, self.num_state_snapshots),
            "parallel": (self.parallel.size, self.parallel.rank, c.expert_parallel),
            "packages": [type(self.ops.backend).__module__.split(".")[0]],
        }
        return compile_cache.cache_dir(factors, self.parallel.rank)

    def _warm_up_steps(self):
        """Decode steps of every power-of-two batch size up to the engine's limit (and the limit), as
        vLLM captures its graph sizes: their graphs, and the branches a batch size takes inside the
        ops, are compiled before the first request. A batch of one runs twice, at two lengths, so its
        graph takes the length as symbolic as the others do. Each sequence reads block 0 only, at
        lengths 1..BS that earlier rows wrote first, so no unwritten cache slot is read."""
        limit = max(1, min(self.config.max_num_seqs, self.config.max_num_batched_tokens))
        sizes = sorted({min(1 << i, limit) for i in range(limit.bit_length() + 1)})
        slots = self.num_state_slots or 1
        batches = [[1], [min(2, self.block_size)]]  # the second reads the slot the first wrote
        batches += [[min(i, self.block_size - 1) + 1 for i in range(b)] for b in sizes if b > 1]
        for lens in batches:
            b = len(lens)
            state = [i % slots for i in range(b)] if self.num_state_slots else None
            step, input_ids = self.buffers.fill([1] * b, lens, [[0]] * b, [False] * b, state, [0] * b)
            yield input_ids, step

    def _plan(self, step: Step) -> Step:
        """The step with its plans: the metadata checked and prepared once for all the layers."""
        sizes = {"num_blocks": self.num_kv_blocks, "block_size": self.block_size}
        meta = self.ops.plan_attention(step.meta, num_tokens=step.num_tokens, **sizes)
        decode_meta = step.decode_meta
        if decode_meta is not None:
            decode_meta = self.ops.plan_attention(decode_meta, num_tokens=step.num_decodes, **sizes)
        state_plan = None
        if step.state_slots is not None and step.has_initial_state is not None:
            slots = self.num_state_slots + self.num_state_snapshots
            index = (step.meta.query_start_loc, step.state_slots, step.has_initial_state)
            state_plan = self.ops.plan_recurrent(*index, num_tokens=step.num_tokens, num_slots=slots)
        return dataclasses.replace(step, meta=meta, decode_meta=decode_meta, state_plan=state_plan)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], count: int) -> list[int]:
        if self.rank == 0:
            for seq in seqs:
                if seq.generator is None and not seq.sampling_params.greedy:
                    seq.generator = self.sampler.generator(seq.sampling_params, seq.index, logits.device)
            params = [s.sampling_params for s in seqs]
            ids = self.sampler(logits, params, [s.generator for s in seqs])
            for seq, entry in zip(seqs, self.sampler.logprobs(logits, params, ids)):
                if entry is not None:
                    seq.output_logprobs.append(entry)
            if self.parallel.size == 1:
                return ids
            chosen = torch.tensor(ids, dtype=torch.int64, device=self.device)
        else:
            chosen = torch.empty(count, dtype=torch.int64, device=self.device)
        return self.parallel.broadcast(chosen, 0).tolist()
