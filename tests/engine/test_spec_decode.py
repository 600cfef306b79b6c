"""Speculative decoding in the engine: greedy tokens equal non-speculative ones, rollback never hashes a
rejected token, a self-draft accepts everything, and sampled tokens keep the target's distribution."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from _hf import prompts

from hetero.engine import LLM, SamplingParams
from hetero.engine.runtime.block_manager import BlockManager
from hetero.engine.runtime.scheduler import Scheduler
from hetero.engine.runtime.sequence import Sequence
from hetero.errors import UsageError

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def _repetitive(n: int, seed: int) -> list[list[int]]:
    """Prompts with repeats, so n-gram lookup finds matches, and shared prefixes for the prefix cache."""
    base = prompts(256, [6 + 3 * i for i in range(n)], seed=seed)
    out = [p + p[: 4 + i % 3] + p for i, p in enumerate(base)]
    out[-1] = out[0][:16] + out[-1]
    return out


def _tokens(llm, ps, params=GREEDY):
    return [list(o.token_ids) for o in llm.generate(ps, params, progress=False)]


@pytest.mark.parametrize("arch", ["qwen3", "deepseek_v3", "deepseek_v32"])
def test_greedy_tokens_equal_without_speculation(arch, checkpoints):
    """n-gram and a self-draft, in a batch with chunked prefill, prefix hits and (for qwen3) preemption."""
    path = str(checkpoints(arch))
    ps = _repetitive(6, seed=3)
    small = dict(block_size=4, max_num_batched_tokens=48)
    if arch == "qwen3":
        small["num_kv_blocks"] = 40
    kw = dict(backend="torch", dtype="float32", **small)
    expected = _tokens(LLM(path, **kw), ps)
    for spec in (NGRAM, {"method": "draft_model", "model": path, "num_speculative_tokens": 2}):
        llm = LLM(path, speculative_config=spec, **kw)
        assert _tokens(llm, ps) == expected, spec["method"]
        stats = llm.stats["spec_decode"]
        assert stats.num_drafts > 0 and llm.stats["cached_prompt_tokens"] > 0
        if spec["method"] == "draft_model":
            assert stats.acceptance_rate == 1.0 and stats.mean_acceptance_length > 2.5
        elif arch == "qwen3":
            assert llm.stats["preemptions"] > 0 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens


@pytest.mark.parametrize("arch", ["qwen3_next", "kimi_linear"])
def test_recurrent_state_rolls_back_to_every_accepted_count(arch, checkpoints):
    """A drafter that knows the greedy continuation and spoils one draft in a cycle, so every count of
    accepted drafts (0 to k) occurs: the Gated DeltaNet / KDA states must continue from the last accepted
    row's (per-token state slots), with chunked prefill and prefix hits (state snapshots) in the batch."""
    path = str(checkpoints(arch))
    ps = prompts(256, (5, 9, 17, 33, 12), seed=4)
    ps[4] = ps[3][:16] + ps[4]
    kw = dict(backend="torch", dtype="float32", block_size=4, max_num_batched_tokens=32)
    want = {tuple(p): t for p, t in zip(ps, _tokens(LLM(path, **kw), ps))}
    llm = LLM(path, speculative_config=NGRAM, **kw)
    k = NGRAM["num_speculative_tokens"]

    def oracle(batch):
        for seq in batch.sampled_seqs:
            if not seq.is_finished:
                right = want[tuple(seq.prompt_token_ids)][len(seq.output_token_ids) :][:k]
                spoil = seq.num_tokens % (k + 2)
                seq.draft_token_ids = [t if j != spoil else (t + 1) % 256 for j, t in enumerate(right)]

    llm.drafter.propose = oracle
    assert _tokens(llm, ps) == list(want.values())
    per_pos = llm.stats["spec_decode"].accepted_per_position
    assert per_pos[0] > per_pos[k - 1] > 0 and llm.stats["cached_prompt_tokens"] > 0
    with pytest.raises(UsageError, match="recurrent state"):  # its own drafts would need rolling back too
        LLM(path, speculative_config={"method": "draft_model", "model": path, "num_speculative_tokens": 2}, **kw)


def test_rejected_tokens_are_never_hashed():
    """A verify step with one of three drafts accepted: computed moves past the accepted one only, and the
    block the rejected drafts were written into is not registered in the prefix cache."""
    bm = BlockManager(16, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    seq = Sequence("a", list(range(10, 16)), SamplingParams(max_tokens=20))
    sched.add(seq)
    sched.postprocess(sched.schedule(), [[30]])  # prefill: 6 rows, token 30 sampled
    assert seq.num_computed_tokens == 6 and len(seq.block_hashes) == 1
    seq.draft_token_ids = [31, 32, 33]
    batch = sched.schedule()
    assert batch.query_lens == [4] and batch.drafts == [[31, 32, 33]]
    assert len(seq.block_table) == 3  # room for 7 tokens + 3 drafts
    sched.postprocess(batch, [[31, 40]])  # 31 accepted, 32 rejected: 40 emitted in its place
    assert seq.output_token_ids == [30, 31, 40] and seq.num_computed_tokens == 8
    assert seq.spec_decode.num_draft_tokens == 3 and seq.spec_decode.num_accepted_tokens == 1
    assert len(seq.block_hashes) == 2  # tokens 0-7 only: 10..15, 30, 31
    assert seq.draft_token_ids == [] and sched.schedule().query_lens == [1]


def test_cli_json_reports_spec_decode(checkpoints, capsys):
    from hetero.cli import main

    path = str(checkpoints("qwen3"))
    spec = json.dumps({"method": "draft_model", "model": path, "num_speculative_tokens": 2})
    argv = ["generate", "--model", path, "--backend", "torch", "--dtype", "float32", "--json", "--ignore-eos"]
    assert main(argv + ["--prompt-ids", "5 6 7 5 6", "--max-tokens", "9", "--speculative-config", spec]) == 0
    record = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert record["spec_decode"]["num_accepted_tokens"] == record["spec_decode"]["num_draft_tokens"] > 0
    assert main(argv + ["--prompt-ids", "5", "--speculative-config", '{"method": "eagle"}']) == 2
    assert "method" in capsys.readouterr().err


@pytest.mark.parametrize(
    "value, key",
    [
        ({"method": "medusa", "num_speculative_tokens": 2}, "method"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "model"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "max"),
        ({"method": "draft_model", "num_speculative_tokens": 2, "model": "/nonexistent"}, "model"),
        ("{not json", "speculative_config"),
    ],
)
def test_bad_speculative_config_is_refused_by_name(value, key, tmp_path):
    with pytest.raises(UsageError, match=key):
        LLM(str(tmp_path), speculative_config=value)


# -- sampled tokens: the verified position keeps the target's distribution --------------------------------------

V, N, T = 16, 2000, 0.7
PROMPT = [3, 7, 1, 12]


def _pearson(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """Pearson's statistic (cells expected below 10 merged) and the 1e-4 critical value of its dof."""
    expected = probs.double() * counts.sum()
    small = expected < 10
    obs = torch.cat([counts[~small], counts[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    stat = float(((obs - exp) ** 2 / exp.clamp(min=1e-12)).sum())
    d = obs.numel() - 1
    crit = d * (1 - 2 / (9 * d) + 3.719 * math.sqrt(2 / (9 * d))) ** 3  # Wilson-Hilferty, p = 1e-4
    return stat, crit


@pytest.fixture(scope="module")
def draws(tmp_path_factory):
    """The joint counts of (first, second) generated token, with a draft of other weights, for the engine
    and for an engine whose recovered tokens come from p_target (the planted bug); and the exact joint."""
    from hetero.engine.forward import prefill
    from hetero.tools import tiny

    sys.path.insert(0, str(Path(__file__).parents[1] / "conformance"))
    from broken_sampling import mini_rejection_sample

    target = str(tiny.build("qwen3", tmp_path_factory.mktemp("t"), vocab_size=V))
    draft = str(tiny.build("qwen3", tmp_path_factory.mktemp("d"), seed=5, vocab_size=V))
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 2}
    params = SamplingParams(temperature=T, max_tokens=3, ignore_eos=True)
    counts = {}
    for name in ("engine", "bug"):
        llm = LLM(target, backend="torch", dtype="float32", max_num_seqs=256, max_model_len=32, speculative_config=spec)
        if name == "bug":
            buggy = mini_rejection_sample("rejection_sample_recovered_from_target").__func__
            llm.runner.ops = _Swap(llm.runner.ops, buggy)
        c = torch.zeros(V * V, dtype=torch.float64)
        for out in llm.generate([PROMPT] * N, params, progress=False):
            c[out.token_ids[0] * V + out.token_ids[1]] += 1
        counts[name] = (c, llm.stats["spec_decode"])
    res = prefill(llm.runner.model, [PROMPT] + [PROMPT + [a] for a in range(V)])
    first = torch.softmax(res.logits[0][-1].double() / T, -1)
    second = torch.stack([torch.softmax(res.logits[1 + a][-1].double() / T, -1) for a in range(V)])
    return counts, (first[:, None] * second).reshape(-1)


class _Swap:
    """The engine's op table with one op replaced."""

    def __init__(self, ops, rejection_sample):
        self._ops, self.rejection_sample = ops, rejection_sample

    def __getattr__(self, name):
        return getattr(self._ops, name)


def test_sampled_tokens_follow_the_target(draws):
    counts, joint = draws
    c, stats = counts["engine"]
    stat, crit = _pearson(c, joint)
    assert stat < crit, f"chi-squared {stat:.1f} >= {crit:.1f}"
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # the draft disagrees often enough


def test_recovered_from_target_is_caught(draws):
    counts, joint = draws
    stat, crit = _pearson(counts["bug"][0], joint)
    assert stat > crit, f"the planted bug went unnoticed: chi-squared {stat:.1f} <= {crit:.1f}"


def test_server_metrics_count_spec_decode():
    """hetero serve's /metrics: vLLM's spec_decode counters, advanced by what each step added."""
    from prometheus_client.parser import text_string_to_metric_families

    from hetero.engine.spec_decode.metrics import SpecDecodeStats
    from hetero.serve.metrics import ServerMetrics

    metrics, stats = ServerMetrics("m"), SpecDecodeStats()
    stats.add([3, 2, 0], [[5, 6, 7, 8], [9], [4]])
    metrics._count_spec(stats)
    stats.add([3], [[1, 2]])
    metrics._count_spec(stats)
    got = {
        (s.name, s.labels.get("position")): s.value
        for f in text_string_to_metric_families(metrics.render().decode())
        for s in f.samples
        if s.name.startswith("hetero_spec_decode") and s.name.endswith("_total")
    }
    assert got[("hetero_spec_decode_num_drafts_total", None)] == 3
    assert got[("hetero_spec_decode_num_draft_tokens_total", None)] == 8
    assert got[("hetero_spec_decode_num_accepted_tokens_total", None)] == 4
    per_pos = [got[("hetero_spec_decode_num_accepted_tokens_per_pos_total", str(j))] for j in range(3)]
    assert per_pos == [2, 1, 1]
