"""Op-level accuracy replay (``hetero check-model --per-op``): which op call of a real run is wrong.

``per_op_check`` runs prompts through the engine on a backend with every op call going through
an ``OpRecorder`` (bounded sampling, a size-capped safetensors store), then replays each recorded
call on the reference in float64 and judges it with the verifier's rule and tolerance for that op
and dtype. Under tensor parallelism each rank records and replays its own calls.
"""

from __future__ import annotations

from typing import Sequence

from hetero.tools.replay._store import TensorStore
from hetero.tools.replay.recorder import CallRecord, OpRecorder, layer_of
from hetero.tools.replay.replayer import CallVerdict, Replayer
from hetero.tools.replay.report import STATUSES, OpRow, PerOpReport

__all__ = [
    "per_op_check",
    "OpRecorder",
    "CallRecord",
    "Replayer",
    "CallVerdict",
    "PerOpReport",
    "OpRow",
    "TensorStore",
    "layer_of",
    "STATUSES",
    "DEFAULT_SAMPLES",
    "DEFAULT_MAX_BYTES",
]

#: recorded calls per op call site (a layer's op slot)
DEFAULT_SAMPLES = 4
#: the recording store's cap
DEFAULT_MAX_BYTES = 1 << 30


def per_op_check(
    model: str,
    backend: str | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
    *,
    dtype: str = "float32",
    max_tokens: int = 8,
    block_size: int = 16,
    samples: int = DEFAULT_SAMPLES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    **engine: object,
) -> PerOpReport:
    """Greedy-generate ``max_tokens`` for each prompt (token ids; default: ``check.default_prompts``) through
    ``LLM(model, backend, ...)`` while recording its op calls, then replay and judge them.

    ``engine``: more ``LLM`` options (``tensor_parallel_size`` under torchrun: every rank returns
    the report of its own calls)."""
    from hetero.engine import LLM, SamplingParams
    from hetero.engine.config import text_config
    from hetero.engine.instrument import instrument
    from hetero.tools.check import default_prompts

    llm = LLM(model, backend=backend, dtype=dtype, block_size=block_size, **engine)
    prompts = prompts or default_prompts(int(text_config(llm.config.hf_config).vocab_size))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    with TensorStore(max_bytes) as store:
        recorder = OpRecorder(store, samples, model=llm.runner.model)
        with instrument(llm.runner.model, recorder):
            llm.generate([list(p) for p in prompts], params, progress=False)
        run_dtype = llm.config.torch_dtype
        verdicts = Replayer(store, run_dtype).replay_all(recorder.records)
        skipped = [{"op": op, "reason": why, "calls": n} for (op, why), n in sorted(recorder.skipped.items())]
        return PerOpReport(
            llm.runner.ops.name,
            str(run_dtype).removeprefix("torch."),
            verdicts,
            skipped,
            recorder.unrecorded(),
            store.nbytes,
            rank=llm.rank,
        )
