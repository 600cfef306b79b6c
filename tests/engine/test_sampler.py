"""Sampler: greedy, temperature/top-k/top-p against a float64 hand computation, seeded determinism;
SamplingParams and EngineConfig validation."""

from __future__ import annotations

import math
import re

import pytest
import torch

from hetero.engine.config import EngineConfig
from hetero.engine.runtime.sampler import Sampler
from hetero.engine.runtime.sequence import SamplingParams


def logits(rows: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def by_hand(row: torch.Tensor, p: SamplingParams) -> list[float]:
    """The expected distribution, in float64 Python arithmetic."""
    x = [float(v) / p.temperature for v in row.double()]
    order = sorted(range(len(x)), key=lambda i: -x[i])
    keep = order[: p.top_k] if p.top_k else order
    z = sum(math.exp(x[i] - x[keep[0]]) for i in keep)
    prob = {i: math.exp(x[i] - x[keep[0]]) / z for i in keep}
    if p.top_p < 1:
        kept, mass = [], 0.0
        for i in keep:
            kept.append(i)
            mass += prob[i]
            if mass >= p.top_p:
                break
        keep = kept
    z = sum(prob[i] for i in keep)
    return [prob[i] / z if i in keep else 0.0 for i in range(len(x))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_is_argmax_the_first_of_tied_maxima(dtype):
    x = torch.randn(4, 151936, generator=torch.Generator().manual_seed(3)).to(dtype)
    x[1, [70000, 9, 150000]] = 50.0  # a tie: the lowest index wins
    x[2, [20, 30]] = float("nan")  # a NaN row: the first NaN, as argmax says
    params = [SamplingParams(temperature=0)] * 4
    got = Sampler()(x, params, [None] * 4)
    assert got == x.argmax(dim=-1).tolist() and got[1:3] == [9, 20]


@pytest.mark.parametrize(
    "p",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=5),
        SamplingParams(temperature=1.0, top_p=0.6),
        SamplingParams(temperature=0.5, top_k=8, top_p=0.9),
        SamplingParams(temperature=2.0, top_k=1),
        SamplingParams(temperature=1.0, top_p=1e-6),
    ],
)
def test_probabilities_match_a_float64_hand_computation(p):
    x = logits(3, seed=1)
    got = Sampler.probabilities(x, [p] * 3)
    assert got.dtype == torch.float32
    for r in range(3):
        want = torch.tensor(by_hand(x[r], p), dtype=torch.float64)
        assert (got[r] > 0).tolist() == (want > 0).tolist(), "a different set of tokens kept"
        torch.testing.assert_close(got[r].double(), want, rtol=1e-5, atol=1e-7)


def test_top_k_and_top_p_actually_cut():
    x = logits(1, vocab=100, seed=2)
    assert int((Sampler.probabilities(x, [SamplingParams(top_k=7)]) > 0).sum()) == 7
    kept = int((Sampler.probabilities(x, [SamplingParams(top_p=0.5)]) > 0).sum())
    assert 1 <= kept < 100
    assert int((Sampler.probabilities(x, [SamplingParams()]) > 0).sum()) == 100
    uniform = torch.zeros(1, 4)  # exact quarters: reaching 0.5 takes exactly two tokens
    assert int((Sampler.probabilities(uniform, [SamplingParams(top_p=0.5)]) > 0).sum()) == 2


def test_rows_with_different_params_do_not_mix():
    x = logits(2, seed=3)
    a, b = SamplingParams(top_k=2), SamplingParams(temperature=0.3, top_p=0.8)
    both = Sampler.probabilities(x, [a, b])
    torch.testing.assert_close(both[0], Sampler.probabilities(x[:1], [a])[0])
    torch.testing.assert_close(both[1], Sampler.probabilities(x[1:], [b])[0])


def draw(sampler, x, params, indices):
    gens = [sampler.generator(p, i, "cpu") for p, i in zip(params, indices)]
    return [sampler(x, params, gens) for _ in range(20)]


def test_seeded_request_draws_the_same_alone_or_in_a_batch():
    sampler = Sampler(seed=7)
    x = logits(4, seed=4)
    params = [
        SamplingParams(temperature=1.0, seed=11),
        SamplingParams(temperature=0.8, top_k=10),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.5, top_p=0.9),
    ]
    batched = draw(sampler, x, params, [0, 1, 2, 3])
    for r in range(4):
        alone = draw(sampler, x[r : r + 1], params[r : r + 1], [r])
        assert [step[r] for step in batched] == [step[0] for step in alone]
    seen = {step[0] for step in batched}
    assert len(seen) > 1, "temperature 1 over 50 tokens: 20 draws should not all agree"


def test_seed_sources():
    sampler, other = Sampler(seed=0), Sampler(seed=1)
    x = logits(1, vocab=1000, seed=5) * 0.01  # nearly uniform: different streams differ
    p = SamplingParams()
    assert draw(sampler, x, [p], [0]) == draw(sampler, x, [p], [0])
    assert draw(sampler, x, [p], [0]) != draw(sampler, x, [p], [1]), "the request index feeds the seed"
    assert draw(sampler, x, [p], [0]) != draw(other, x, [p], [0]), "the engine seed feeds the seed"
    fixed = SamplingParams(seed=3)
    assert draw(sampler, x, [fixed], [0]) == draw(other, x, [fixed], [9]), "an explicit seed wins"
    assert draw(sampler, x, [fixed], [0]) != draw(sampler, x, [SamplingParams(seed=4)], [0])


def test_sampling_follows_the_distribution():
    x = torch.tensor([[math.log(0.7), math.log(0.2), math.log(0.1), -1e9]])
    p = SamplingParams()
    gen = Sampler().generator(p, 0, "cpu")
    counts = [0] * 4
    for _ in range(2000):
        counts[Sampler()(x, [p], [gen])[0]] += 1
    assert counts[3] == 0 and abs(counts[0] / 2000 - 0.7) < 0.05 and abs(counts[2] / 2000 - 0.1) < 0.03


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("temperature", -0.1, "finite number >= 0"),
        ("temperature", float("nan"), "finite number >= 0"),
        ("top_k", -1, "integer >= 0"),
        ("top_k", 2.5, "integer >= 0"),
        ("top_p", 0.0, r"in \(0, 1\]"),
        ("top_p", 1.5, r"in \(0, 1\]"),
        ("max_tokens", 0, "integer >= 1"),
        ("seed", -3, r"integer in \[0, 2\*\*63\) or None"),
        ("seed", 2**63, r"integer in \[0, 2\*\*63\)"),
        ("ignore_eos", "yes", "True or False"),
        ("stop_token_ids", [1, -2], "token ids"),
        ("stop_token_ids", 5, "sequence of token ids"),
    ],
)
def test_bad_sampling_params_name_the_field(field, value, expected):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} must be .*{expected}.*got"):
        SamplingParams(**{field: value})


def test_stop_token_ids_become_a_tuple():
    assert SamplingParams(stop_token_ids=[4, 5]).stop_token_ids == (4, 5)


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("dtype", "fp8", "'auto' or one of float32, bfloat16, float16"),
        ("block_size", 0, "integer >= 1"),
        ("max_num_seqs", True, "integer >= 1"),
        ("max_num_batched_tokens", -5, "integer >= 1"),
        ("max_model_len", 0, "integer >= 1"),
        ("num_kv_blocks", 1.5, "integer >= 1"),
        ("tensor_parallel_size", 0, "integer >= 1"),
        ("enable_prefix_caching", 1, "True or False"),
        ("expert_parallel", None, "True or False"),
        ("seed", -1, "integer >= 0"),
        ("backend", "", "backend name or None"),
        ("device", 3, "device string"),
    ],
)
def test_bad_engine_config_names_the_field(field, value, expected):
    with pytest.raises(ValueError, match=rf"EngineConfig\.{field} must be .*{expected}.*got {re.escape(repr(value))}"):
        EngineConfig(model="/some/dir", **{field: value})


def test_engine_config_resolves_against_the_checkpoint_config():
    class HF:
        max_position_embeddings = 512
        dtype = torch.float16

    cfg = EngineConfig(model="/x").resolve(HF())
    assert cfg.max_model_len == 512 and cfg.dtype == "float16" and cfg.torch_dtype is torch.float16
    assert EngineConfig(model="/x", dtype="float32").resolve(HF()).torch_dtype is torch.float32
    with pytest.raises(ValueError, match=r"EngineConfig\.max_model_len must be <= .*512.*got 1000"):
        EngineConfig(model="/x", max_model_len=1000).resolve(HF())
    cfg = EngineConfig(model="/x", max_num_seqs=4, block_size=16, kv_cache_bytes=10_000).resolve(HF())
    assert cfg.kv_blocks(bytes_per_block=10) == 4 * 32
    assert cfg.kv_blocks(bytes_per_block=1000) == 10
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        cfg.kv_blocks(bytes_per_block=20_000)


def test_missing_model_dir_or_config_is_a_clear_error(tmp_path):
    from hetero.engine.config import load_hf_config

    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf_config(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_hf_config(tmp_path)
