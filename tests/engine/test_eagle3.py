"""EAGLE-3 drafting (vLLM's checkpoint layout): greedy tokens equal non-speculative ones; a draft built to
repeat the target's own prediction proposes exactly the token it is fed, so the aux streams, ``fc``, the
residual, the final norm, the draft LM head and ``d2t`` are wired as vLLM wires them; the midlayer equals a
reference computed from the checkpoint's tensors; bad drafts are refused by name."""

from __future__ import annotations

import pytest
import torch
from _hf import prompts

from hetero.engine import LLM, SamplingParams
from hetero.engine.spec_decode.eagle3 import build_eagle3
from hetero.errors import UsageError
from hetero.tools.tiny import write_eagle3

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
KW = dict(backend="torch", dtype="float32", block_size=4, max_num_batched_tokens=16)


def _tokens(llm, ps):
    return [list(o.token_ids) for o in llm.generate(ps, GREEDY, progress=False)]


def _eagle3(target, draft):
    return LLM(
        str(target), speculative_config={"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3}, **KW
    )


@pytest.mark.parametrize("arch, echo", [("qwen3", False), ("qwen2", True)])
def test_greedy_tokens_equal_without_speculation(arch, echo, checkpoints, tmp_path):
    """A random draft sharing the target's embedding (qwen3), and an echo draft with its own (qwen2, Llama-shaped
    plus biases), aux ids listed out of order; prompts longer than a step, so the first pass spans chunks.
    Every echo draft is the token its row was fed when the draft vocabulary has it, another draft id otherwise."""
    target = checkpoints(arch)
    draft = write_eagle3(target, tmp_path / "eagle3", echo=echo, embed=echo, layer_ids=[2, 0, 1], seed=3)
    ps = prompts(256, [21, 9, 6], seed=5)
    expected = _tokens(LLM(str(target), **KW), ps)
    llm = _eagle3(target, draft)
    module, fed, drafted = llm.runner.draft, [], []
    forward, compute_logits = module.forward, module.compute_logits

    def record_fed(ids, step, hidden):  # the rows the next compute_logits reads
        fed.extend(ids[step.logits_indices].tolist())
        return forward(ids, step, hidden)

    def record_drafted(hidden):
        logits = compute_logits(hidden)
        drafted.extend(logits.argmax(-1).tolist())
        return logits

    module.forward, module.compute_logits = record_fed, record_drafted
    assert _tokens(llm, ps) == expected
    stats = llm.stats["spec_decode"]
    assert 3 * len(ps) < stats.num_draft_tokens <= len(drafted)
    vocab = set(module.target_ids.tolist())
    assert len(vocab) == 200 and set(drafted) <= vocab
    if echo:
        assert len(fed) == len(drafted)
        assert all(d == f if f in vocab else d != f for f, d in zip(fed, drafted)), list(zip(fed, drafted))
        assert sum(f in vocab for f in fed) > len(fed) // 2


@pytest.fixture(scope="module")
def qwen3(checkpoints):
    """The tiny qwen3 target and a runner of it (2 layers: aux ids 0..2)."""
    target = checkpoints("qwen3")
    return target, LLM(str(target), **KW).runner


@pytest.mark.parametrize(
    "overrides, field, got",
    [
        (dict(layer_ids=[0, 1, 5]), "eagle_aux_hidden_state_layer_ids", [0, 1, 5]),
        (dict(layer_ids=[]), "eagle_aux_hidden_state_layer_ids", [-1, 1, 2]),  # vLLM's default (2, L//2, L-3)
        (dict(target_hidden_size=48), "target_hidden_size", 48),
        (dict(hidden_size=32, head_dim=8, target_hidden_size=64), "hidden_size", 32),  # the shared embedding's 64
        (dict(architectures=["Eagle3Qwen3ForCausalLM"]), "architectures", "Eagle3Qwen3ForCausalLM"),
        (dict(norm_before_fc=True), "norm_before_fc", True),
    ],
)
def test_bad_draft_is_refused_by_name(overrides, field, got, qwen3, tmp_path):
    """Aux ids outside the target's streams, a width that is not the target's, another architecture, a variant
    hetero does not implement: a UsageError on speculative_config.model naming the field, expected and got."""
    target, runner = qwen3
    draft = write_eagle3(target, tmp_path / "eagle3", **overrides)
    with pytest.raises(UsageError) as err:
        build_eagle3(str(draft), runner)
    e = err.value
    assert e.arg == "speculative_config.model" and e.got == got and e.expected
    assert field in str(e) and str(draft) in str(e)


def _rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, positions, theta=10000.0):
    d = x.shape[-1]
    freqs = positions[:, None].double() / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = freqs.cos()[:, None, :].float(), freqs.sin()[:, None, :].float()
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def _reference(w, embeds, hidden, positions):
    """The midlayer as llama_eagle3 computes it (causal attention over one sequence), plus the residual."""
    x = torch.cat(
        [_rms(embeds, w["midlayer.input_layernorm.weight"]), _rms(hidden, w["midlayer.hidden_norm.weight"])], -1
    )
    t = x.shape[0]
    q, k, v = (x @ w[f"midlayer.self_attn.{p}_proj.weight"].T for p in "qkv")
    q, k, v = q.view(t, 4, 16), k.view(t, 2, 16).repeat_interleave(2, 1), v.view(t, 2, 16).repeat_interleave(2, 1)
    q, k = _rope(q, positions), _rope(k, positions)
    scores = torch.einsum("qhd,khd->hqk", q, k) / 4.0
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(t, 64)
    residual = hidden + attn @ w["midlayer.self_attn.o_proj.weight"].T
    y = _rms(residual, w["midlayer.post_attention_layernorm.weight"])
    gate, up = y @ w["midlayer.mlp.gate_proj.weight"].T, y @ w["midlayer.mlp.up_proj.weight"].T
    return residual + (torch.nn.functional.silu(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T


def test_draft_forward_matches_a_reference(qwen3, tmp_path):
    """The first draft pass over a whole prompt (fed tokens 1..n at positions 0..n-1, the target's embedding)
    equals the midlayer computed from the checkpoint's tensors: the cat order, the norms, GQA with rope, the
    residual, and the sum before the final norm as the hidden passed on."""
    from safetensors.torch import load_file

    target, _ = qwen3
    draft = write_eagle3(target, tmp_path / "eagle3", seed=7)
    llm = _eagle3(target, draft)
    module, calls = llm.runner.draft, []
    forward = module.forward

    def record(ids, step, hidden):
        out = forward(ids, step, hidden)
        calls.append((ids.clone(), step.positions[: ids.shape[0]].clone(), hidden.clone(), out.clone()))
        return out

    module.forward = record
    prompt = prompts(256, [12], seed=9)[0]
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), progress=False)
    ids, positions, hidden, got = calls[0]
    assert ids.tolist() == prompt[1:] + [out[0].token_ids[0]] and positions.tolist() == list(range(12))
    w = load_file(str(draft / "model.safetensors"))
    embeds = llm.runner.model.model.embed_tokens.weight[ids]
    torch.testing.assert_close(got, _reference(w, embeds, hidden, positions), rtol=1e-4, atol=1e-4)
