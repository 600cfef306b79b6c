"""LLM(compile=True): decode-only steps run through torch.compile of the forward and give the greedy
tokens of eager, dense and MoE, on the torch backend (the one whose ops Dynamo traces)."""

from __future__ import annotations

import pytest
import torch

from hetero.engine import LLM, EngineConfig, SamplingParams
from hetero.engine.runtime.compiled import CompiledForward
from hetero.errors import UsageError

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, 200, (2 + 7 * i,), generator=gen).tolist() for i in range(5)]


def run(path: str, compile: bool) -> tuple[list[list[int]], LLM]:
    llm = LLM(path, backend="torch", dtype="float32", block_size=8, max_num_seqs=4, compile=compile)
    return [o.token_ids for o in llm.generate(prompts(), GREEDY, progress=False)], llm


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_compiled_decode_gives_the_tokens_of_eager(checkpoints, arch):
    path = str(checkpoints(arch))
    eager, _ = run(path, compile=False)
    compiled, llm = run(path, compile=True)
    assert compiled == eager
    forward = llm.runner.forward
    assert isinstance(forward, CompiledForward) and not llm.runner.ops.backend.validate
    # 5 requests over 4 slots: prefill steps ran eager, decode batches of 1 to 4 compiled
    assert forward.compiled_steps > 0 and forward.eager_steps > 0


def test_only_decode_only_steps_fit():
    from hetero.engine.step_buffers import build_step

    decode = build_step([1, 1], [5, 9], [[0], [1, 2]], 8, "cpu")
    mixed = build_step([1, 4], [5, 9], [[0], [1, 2]], 8, "cpu")
    assert CompiledForward.fits(decode) and not CompiledForward.fits(mixed)


def test_compile_must_be_a_bool(tmp_path):
    with pytest.raises(UsageError, match="compile"):
        EngineConfig(model=str(tmp_path), compile="yes")
