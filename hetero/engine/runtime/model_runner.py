"""Runs one scheduled batch through the model on a hetero backend and samples its next tokens."""

from __future__ import annotations

import dataclasses

import torch

import hetero
from hetero.engine.config import EngineConfig, text_config
from hetero.engine.forward import build_model
from hetero.engine.layers.cached import CachedLayer, StateEntry
from hetero.engine.parallel import Parallel
from hetero.engine.pipeline import stage_of
from hetero.engine.runtime import compile_cache
from hetero.engine.runtime.compiled import CompiledForward
from hetero.engine.runtime.kv_cache import allocate_kv_cache, bytes_per_block, bytes_per_state_slot
from hetero.engine.runtime.sampler import Sampler
from hetero.engine.runtime.sequence import Sequence
from hetero.engine.runtime.step_plan import StepPlan
from hetero.engine.spec_decode.heads import build_draft
from hetero.engine.spec_decode.verify import choose_tokens
from hetero.engine.step import Step, TokenStates
from hetero.engine.step_buffers import StepBuffers
from hetero.errors import UsageError
from hetero.spec.comm import Communicator

__all__ = ["ModelRunner"]


def _check_rollback(model: torch.nn.Module) -> None:
    """UsageError unless every layer with per-sequence state keeps it per verified row (speculative decoding)."""
    stuck = sorted(
        {
            type(m).__name__
            for m in model.modules()
            if isinstance(m, CachedLayer)
            and not m.per_token_states
            and any(isinstance(e, StateEntry) for e in m.cache_spec())
        }
    )
    if stuck:
        raise UsageError(
            f"speculative_config: {type(model).__name__} keeps per-sequence state in {', '.join(stuck)}, which "
            "cannot be rolled back to the last accepted draft token (only Gated DeltaNet and KDA state can, spec "
            "1.11); run this model without speculative decoding",
            arg="speculative_config",
            expected="a model whose per-sequence state is per-token (Gated DeltaNet, KDA) or none",
            got=", ".join(stuck),
        )


class ModelRunner:
    """The model, its paged KV cache and the sampler of one rank.

    ``config`` is resolved if it is not yet (``EngineConfig.resolve``). With a
    communicator of more than one rank, the model is split over them (tensor
    parallelism); every rank runs the plan rank 0 broadcast, and the tokens sampled
    on rank 0 are broadcast so that all ranks append the same ones. With a speculative config
    that drafts with a model, ``draft`` is that model (its cache counted in the KV budget). Step tensors
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
        self.stage, tp_comm = None, comm
        if config.pipeline_parallel_size > 1:
            layers = int(text_config(config.hf_config).num_hidden_layers)
            tp_comm, self.stage = stage_of(config, layers, comm)
        self.parallel = Parallel(tp_comm, config.expert_parallel)
        self.dtype = config.torch_dtype
        self.model = build_model(
            config.model, self.ops, self.dtype, self.parallel, hf_config=config.hf_config, stage=self.stage
        )
        self.block_size = config.block_size
        slot_bytes = bytes_per_state_slot(self.model, self.dtype)
        self.num_state_slots, self.num_state_snapshots = config.state_slots(slot_bytes)
        if self.stage is not None:  # a stage without state layers still keeps the slots' numbering
            self.num_state_slots, self.num_state_snapshots = self._agree(
                "max", self.num_state_slots, self.num_state_snapshots
            )
        spec = config.speculative_config
        # speculative decoding keeps the state after each verified row: 1 + k slots per sequence
        self.state_group = 1 + spec.num_speculative_tokens if spec is not None and self.num_state_slots else 1
        if self.state_group > 1:
            _check_rollback(self.model)
        state_bytes = self.num_physical_slots * slot_bytes
        self.draft = build_draft(spec, self) if spec is not None and spec.uses_model else None
        block_bytes = sum(bytes_per_block(m, self.block_size, self.dtype) for m in (self.model, self.draft) if m)
        self.num_kv_blocks = config.kv_blocks(block_bytes, state_bytes)
        if self.stage is not None:  # rank 0's block ids must exist on every stage
            (self.num_kv_blocks,) = self._agree("min", self.num_kv_blocks)
        with torch.no_grad():
            self.cache = allocate_kv_cache(
                self.model,
                self.num_kv_blocks,
                self.block_size,
                self.dtype,
                self.device,
                self.num_physical_slots,
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
        self.capture_layers = False  # a proposer that drafts from the target's layer outputs sets it
        self.last_hidden = self.last_step = self.last_captured = None

    def _agree(self, op: str, *values: int) -> list[int]:
        """``values`` reduced (``op``) over every rank of the pipeline."""
        x = torch.tensor(values, dtype=torch.int64, device=self.stage.world.device)
        return self.stage.world.all_reduce(x, op).tolist()

    @property
    def num_physical_slots(self) -> int:
        """Slots of the state pool: a group per running sequence, then the snapshots."""
        return self.num_state_slots * self.state_group + self.num_state_snapshots

    @property
    def rank(self) -> int:
        return self.parallel.rank

    def run(self, plan: StepPlan, sampled: list[Sequence] | None = None) -> list[list[int]]:
        """Compute ``plan``'s rows and return the tokens each sampled sequence emits, in order: one, or
        for a sequence verifying drafts its accepted drafts and the token after them
        (``spec_decode.verify.choose_tokens``).

        ``sampled``: the sequences whose rows are sampled (rank 0 needs their sampling
        parameters, generators and drafts; the other ranks receive rank 0's choice). Rank 0 also
        appends each emitted token's logprobs to ``output_logprobs`` of the sequences whose
        parameters ask for them; the other ranks compute none. The forward's hidden states stay in
        ``last_hidden`` (with ``last_step``) for a proposer that drafts from them.
        """
        with torch.inference_mode():
            step, input_ids = self._prepare(plan)
            if step is None:
                return []
            capture = [] if self.capture_layers else None
            hidden = self.forward(input_ids, step) if capture is None else self.model(input_ids, step, capture=capture)
            self.last_hidden, self.last_step, self.last_captured = hidden, step, capture
            if step.logits_indices.numel() == 0:
                return []
            logits = self.model.compute_logits(hidden[step.logits_indices])
            return self._sample(logits, sampled or [], plan)

    def forward_stage(self, plan: StepPlan, intermediate: dict[str, torch.Tensor] | None = None):
        """Pipeline parallelism: this stage's layers over ``plan``'s rows, from the previous stage's
        ``intermediate`` (None on the first stage). Returns what the stage sends on (a dict of tensors),
        or on the last stage the float32 logits of the rows ``plan`` samples; None when there are none."""
        with torch.inference_mode():
            step, input_ids = self._prepare(plan)
            if step is None:
                return None
            out = self.model(input_ids, step, None, intermediate)
            if not self.stage.last:
                return out
            if step.logits_indices.numel() == 0:
                return None
            return self.model.compute_logits(out[step.logits_indices])

    def _prepare(self, plan: StepPlan) -> tuple[Step | None, torch.Tensor | None]:
        """``plan``'s cache operations applied (even without rows: a snapshot must not be lost), and its
        ``Step`` and input ids in the persistent buffers, planned; (None, None) when it has no rows."""
        self.cache.apply(plan.cache_ops)
        if not plan.query_lens:
            return None, None
        sample = plan.sample if plan.spec_lens is None else plan.num_logits
        step, input_ids = self.buffers.fill(
            plan.query_lens, plan.seq_lens, plan.block_tables, sample, plan.state_slots, plan.input_ids
        )
        if self.plans:
            step = self._plan(step)
        if plan.token_slots is not None:
            step = dataclasses.replace(step, token_states=self._token_states(plan, step))
        return step, input_ids

    def _token_states(self, plan: StepPlan, step: Step) -> TokenStates:
        n, dev = len(plan.token_slots), self.device
        return TokenStates(
            num_seqs=n,
            num_tokens=sum(plan.query_lens[:n]),
            slots=torch.tensor(plan.token_slots, dtype=torch.int32, device=dev),
            num_accepted=torch.tensor(plan.num_accepted, dtype=torch.int32, device=dev),
        )

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
            "state_slots": (self.num_state_slots, self.num_state_snapshots, self.state_group),
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
            slots = self.num_physical_slots
            index = (step.meta.query_start_loc, step.state_slots, step.has_initial_state)
            state_plan = self.ops.plan_recurrent(*index, num_tokens=step.num_tokens, num_slots=slots)
        return dataclasses.replace(step, meta=meta, decode_meta=decode_meta, state_plan=state_plan)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], plan: StepPlan) -> list[list[int]]:
        spec = None if plan.spec_lens is None else [k for k, s in zip(plan.spec_lens, plan.sample) if s]
        emitted = choose_tokens(self.ops, self.sampler, logits, seqs, spec) if self.rank == 0 else None
        if self.parallel.size == 1:
            return emitted
        if spec is None:  # one token each: a tensor broadcast, as cheap as a collective gets
            chosen = torch.empty(plan.num_sampled, dtype=torch.int64, device=self.device)
            if emitted is not None:
                chosen = torch.tensor([t[0] for t in emitted], dtype=torch.int64, device=self.device)
            return [[t] for t in self.parallel.broadcast(chosen, 0).tolist()]
        return self.parallel.broadcast_object(emitted, self.device)
