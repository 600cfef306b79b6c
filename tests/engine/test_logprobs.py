"""SamplingParams.logprobs: the raw log_softmax of each generated token's logits, its top-k and the
sampled token's rank."""

from __future__ import annotations

import json

import pytest
import torch
from torch.overrides import TorchFunctionMode

from hetero.cli import main
from hetero.engine import LLM, Logprob, RequestOutput, SamplingParams
from hetero.engine.runtime.sampler import Sampler
from hetero.errors import UsageError

TOL = 1e-4  # engine batch vs. one independent prefill, float32 on cpu_ref


@pytest.fixture(scope="module")
def path(checkpoints):
    return str(checkpoints("qwen3"))


@pytest.fixture(scope="module")
def llm(path):
    return LLM(path, backend="cpu_ref", dtype="float32", block_size=4, max_num_batched_tokens=16)


@pytest.fixture(scope="module")
def model(path):
    import hetero
    from hetero.engine.forward import build_model

    return build_model(path, hetero.load("cpu_ref"), torch.float32)


def _prompts(*lengths: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(3, 256, (n,), generator=gen).tolist() for n in lengths]


def _reference(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log_softmax (float64) of the logits that chose each of ``tokens``, from one independent prefill:
    [len(tokens), V]."""
    from hetero.engine.forward import prefill

    with torch.inference_mode():
        logits = prefill(model, [prompt + tokens[:-1]]).logits[0].double()
    return logits[len(prompt) - 1 :].log_softmax(dim=-1)


def _check_position(entry: dict[int, Logprob], ref: torch.Tensor, token: int, k: int) -> None:
    assert token in entry and len(entry) in (k, k + 1)
    ranks = [lp.rank for lp in entry.values()]
    assert ranks == sorted(ranks)
    for t, lp in entry.items():
        assert isinstance(t, int) and abs(lp.logprob - float(ref[t])) < TOL
        # rank = 1 + tokens strictly above; a near-tie may go either way
        assert 1 + int((ref > ref[t] + TOL).sum()) <= lp.rank <= int((ref >= ref[t] - TOL).sum())
    at_most = (ref.unsqueeze(0) >= ref.unsqueeze(1) - TOL).sum(dim=1)  # the worst rank each token may have
    assert set((at_most <= k).nonzero().flatten().tolist()) <= set(entry)


def _check_output(model, prompt: list[int], out: RequestOutput, k: int) -> None:
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
    ref = _reference(model, prompt, list(out.token_ids))
    for i, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        _check_position(entry, ref[i], token, k)


def test_greedy_logprobs_match_an_independent_forward(llm, model):
    prompts = _prompts(5, 13)
    outs = llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=4), progress=False
    )
    for prompt, out in zip(prompts, outs):
        _check_output(model, prompt, out, 4)
        assert all(entry[t].rank == 1 for t, entry in zip(out.token_ids, out.logprobs))


def test_sampled_logprobs_are_taken_before_temperature_top_k_and_top_p(llm, model):
    prompts = _prompts(6, 9)
    params = SamplingParams(temperature=0.7, top_k=3, top_p=0.9, max_tokens=8, ignore_eos=True, seed=3, logprobs=5)
    outs = llm.generate(prompts, params, progress=False)
    for prompt, out in zip(prompts, outs):
        _check_output(model, prompt, out, 5)  # raw log_softmax: neither scaled by 1/T nor -inf outside the top 3
        assert all(len(e) == 5 and all(lp.logprob > -1e9 for lp in e.values()) for e in out.logprobs)
        assert all(entry[t].rank <= 3 for t, entry in zip(out.token_ids, out.logprobs))


def test_sampled_token_outside_the_top_k_comes_with_its_true_rank(llm, model):
    prompt = _prompts(8)[0]
    for k in (0, 1):
        out = llm.generate(
            [prompt],
            SamplingParams(temperature=5.0, max_tokens=12, ignore_eos=True, seed=11, logprobs=k),
            progress=False,
        )[0]
        _check_output(model, prompt, out, k)
        assert any(entry[t].rank > 1 for t, entry in zip(out.token_ids, out.logprobs))
    assert max(len(e) for e in out.logprobs) == 2  # k = 1: the best token, and the sampled one when it is not


def test_mixed_batch_and_tokens_unchanged_by_logprobs(llm):
    prompts = _prompts(4, 7, 10, 5)
    plain = [
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True, seed=1),
    ] * 2
    asking = [
        plain[0],
        SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True, seed=1, logprobs=0),
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=2),
        plain[3],
    ]
    want = llm.generate(prompts, plain, progress=False)
    got = llm.generate(prompts, asking, progress=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert got[0].logprobs is None and got[3].logprobs is None and got[0].new_logprobs is None
    assert [list(e) for e in got[1].logprobs] == [[t] for t in got[1].token_ids]
    assert all(len(e) in (2, 3) for e in got[2].logprobs)


def test_streaming_reports_each_position_once(llm):
    prompts = _prompts(5, 11, 19)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=2)
    want = [o.logprobs for o in llm.generate(prompts, params, progress=False)]
    ids = [llm.add_request(p, params, request_id=f"s{i}") for i, p in enumerate(prompts)]
    streamed: dict[str, list] = {i: [] for i in ids}
    while llm.has_unfinished():
        for out in llm.step():
            assert len(out.new_logprobs) == len(out.new_token_ids) and len(out.logprobs) == len(out.token_ids)
            assert out.logprobs == streamed[out.request_id] + out.new_logprobs
            streamed[out.request_id] += out.new_logprobs
    got = [streamed[i] for i in ids]  # the prefix cache now serves the prompts: values agree to rounding
    assert [[list(e) for e in g] for g in got] == [[list(e) for e in w] for w in want]
    assert [lp.logprob for g in got for e in g for lp in e.values()] == pytest.approx(
        [lp.logprob for w in want for e in w for lp in e.values()], abs=TOL
    )


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_invalid_logprobs_are_rejected_naming_the_field(bad):
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=bad)


def test_logprobs_over_the_vocabulary_are_rejected_on_add(llm):
    with pytest.raises(UsageError, match="logprobs.*257") as info:
        llm.add_request([1, 2, 3], SamplingParams(logprobs=257))
    assert info.value.arg == "logprobs" and not llm.has_unfinished()
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=1, logprobs=256), progress=False)[0]
    assert len(out.logprobs[0]) == 256 and sorted(lp.rank for lp in out.logprobs[0].values())[-1] <= 256


class _Calls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_sampler_ties_ranks_and_no_log_softmax_when_off():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [0.0, 2.0, 1.0, 5.0]])
    with _Calls() as calls:
        assert Sampler.logprobs(logits, [SamplingParams(), SamplingParams()], [0, 1]) == [None, None]
    assert "log_softmax" not in calls.names
    params = [SamplingParams(logprobs=1), SamplingParams(logprobs=2)]
    with _Calls() as calls:
        first, second = Sampler.logprobs(logits, params, [0, 2])
    assert "log_softmax" in calls.names
    lp = logits.double().log_softmax(dim=-1)
    assert len(first) == 2 and first[0].logprob == pytest.approx(float(lp[0, 0]), abs=1e-6)
    assert first[0].rank == 3 and all(first[t].rank == 1 for t in first if t != 0)  # the tied best are both rank 1
    assert list(second) == [3, 1, 2] and [e.rank for e in second.values()] == [1, 2, 3]
    assert [e.logprob for e in second.values()] == pytest.approx(lp[1, [3, 1, 2]].tolist(), abs=1e-6)


def test_check_model_takes_heteros_top_k_from_the_engine_logprobs():
    from types import SimpleNamespace

    from hetero.tools.check import ModelCheck

    reference = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 4.0, 1.0, 0.0, 3.0]])
    stub = SimpleNamespace(reference_states=lambda prefix: ([], reference))
    ours = RequestOutput(
        "0",
        [1],
        [5, 6],
        None,
        "length",
        logprobs=[{5: Logprob(-0.1, 1)}, {6: Logprob(-1.0, 1), 7: Logprob(-2.0, 2), 8: Logprob(-3.0, 3)}],
    )
    wide = ModelCheck.divergence(stub, 0, [1], ours, [5, 8], top_k=3)
    assert (wide.position, wide.hetero_token, wide.reference_token) == (1, 6, 8)
    assert wide.reference_in_hetero_topk and wide.hetero_in_reference_topk and wide.acceptable
    narrow = ModelCheck.divergence(stub, 0, [1], ours, [5, 8], top_k=2)  # 8 is hetero's third
    assert narrow.reference_in_hetero_topk is False and not narrow.acceptable


def test_generate_json_logprobs(path, capsys):
    argv = [
        "generate",
        "--model",
        path,
        "--backend",
        "cpu_ref",
        "--dtype",
        "float32",
        "--prompt-ids",
        "5 6 7 8",
        "--max-tokens",
        "4",
        "--ignore-eos",
        "--json",
        "--logprobs",
        "3",
    ]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out.splitlines()[0])
    assert len(record["logprobs"]) == len(record["token_ids"]) == 4
    for token, entries in zip(record["token_ids"], record["logprobs"]):
        assert len(entries) in (3, 4) and entries[0]["token_id"] == token and entries[0]["rank"] == 1
        assert [e["rank"] for e in entries] == sorted(e["rank"] for e in entries)
        assert all(set(e) == {"token_id", "logprob", "rank"} and e["logprob"] < 0 for e in entries)
    assert main(argv[:-2]) == 0 and "logprobs" not in json.loads(capsys.readouterr().out)
    assert main(argv[:-3] + ["--logprobs", "1"]) == 0 and "#1" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["-1", "1000"])
def test_generate_bad_logprobs_is_a_usage_error(path, capsys, value):
    argv = ["generate", "--model", path, "--backend", "cpu_ref", "--prompt-ids", "5 6", "--logprobs", value]
    assert main(argv) == 2
    assert "--logprobs" in capsys.readouterr().err
