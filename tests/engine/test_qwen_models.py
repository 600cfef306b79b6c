"""Qwen2, Qwen3 and Qwen3-MoE on cpu_ref in float32 against transformers on the same tiny qwen_checkpoints.

Several prompts of different lengths (one of a single token) go through one packed
prefill step over a paged cache in random block order; every prompt's logits at
every position and every captured hidden state must match transformers running
that prompt alone, to a relative error ||a - b|| / ||b|| under 1e-4.

Hidden states: hetero's ``prefill`` gives the embedding output, each decoder
layer's output (full residual stream) and then the final norm's output (L + 2
entries). transformers 5 ``output_hidden_states`` gives L + 1: the embedding, the
first L - 1 layers' outputs, and last the final norm's output (it overwrites the
last layer's output with ``last_hidden_state``), so the last layer's own output is
taken with a forward hook.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import hetero
from hetero.engine.forward import build_model, prefill
from hetero.tools import tiny

TOL = 1e-4
PROMPT_LENS = (7, 1, 20, 33)  # block size 16: one, part of one, two and three blocks

#: name -> (tiny arch, config overrides)
CASES = {
    "qwen2": ("qwen2", {}),  # q/k/v bias (always in Qwen2), untied
    "qwen2_sliding": ("qwen2", dict(use_sliding_window=True, sliding_window=5, max_window_layers=1)),
    "qwen3": ("qwen3", {}),
    "qwen3_tied": ("qwen3", dict(tie_word_embeddings=True, attention_bias=True)),
    # layers 0, 2 MoE; 1 dense (mlp_only_layers); renormalized top-k
    "qwen3_moe": ("qwen3_moe", dict(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1])),
    # layers 1 MoE; 0, 2 dense (decoder_sparse_step); 3 dense (mlp_only_layers); top-k not renormalized
    "qwen3_moe_step2": (
        "qwen3_moe",
        dict(num_hidden_layers=4, norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[3]),
    ),
}


@pytest.fixture(scope="module")
def qwen_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen")
    # the first two are sharded (the multi-file path); the variants one file each (faster)
    return {
        name: tiny.build(arch, root / name, shard_size="20KB" if name in ("qwen2", "qwen3_moe") else None, **overrides)
        for name, (arch, overrides) in CASES.items()
    }


@pytest.fixture(scope="module")
def ops():
    return hetero.load("cpu_ref")


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, 256, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


_REFERENCE: dict[str, list] = {}


@torch.no_grad()
def reference(model_dir, prompts):
    """Per prompt (logits [n, V], [embedding, layer 1 .. layer L outputs, final norm]) from transformers."""
    key = str(model_dir)
    if key not in _REFERENCE:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        last = []
        hook = hf.model.layers[-1].register_forward_hook(
            lambda mod, args, out: last.append(out[0] if isinstance(out, tuple) else out)
        )
        results = []
        for p in prompts:
            last.clear()
            out = hf(torch.tensor([p]), output_hidden_states=True)
            states = [h[0] for h in out.hidden_states]
            if states[0].ndim == 3:  # hyper-connection streams: the embedding copied into each
                states[0] = states[0][:, 0]
            assert len(states) == hf.config.num_hidden_layers + 1
            results.append((out.logits[0], states[:-1] + [last[0][0], states[-1]]))
        hook.remove()
        _REFERENCE[key] = results
    return _REFERENCE[key]


def errors(model, model_dir, prompts) -> list[tuple[float, list[float]]]:
    """Per prompt: (logits error, [error of each hidden state]) of ``model`` against transformers."""
    ours = prefill(model, prompts, capture=True)
    out = []
    for logits, hidden, (ref_logits, ref_hidden) in zip(ours.logits, ours.hidden, reference(model_dir, prompts)):
        assert logits.dtype == torch.float32 and logits.shape == ref_logits.shape
        assert len(hidden) == len(ref_hidden), (len(hidden), len(ref_hidden))
        out.append((rel(logits, ref_logits), [rel(h, r) for h, r in zip(hidden, ref_hidden)]))
    return out


def assert_small(errs) -> None:
    """AssertionError unless every logits and hidden-state error of ``errors`` is under TOL."""
    for n, (logit_err, hidden_err) in zip(PROMPT_LENS, errs):
        assert logit_err < TOL, f"prompt of {n} tokens: logits rel error {logit_err:.2e}"
        bad = [(i, e) for i, e in enumerate(hidden_err) if not e < TOL]
        assert not bad, f"prompt of {n} tokens: hidden states (index, rel error) over {TOL}: {bad}"


@pytest.mark.parametrize("name", list(CASES))
def test_prefill_matches_transformers(name, qwen_checkpoints, ops, prompts):
    model = build_model(qwen_checkpoints[name], ops, torch.float32)
    assert type(model).__name__ == model.config.architectures[0]
    assert_small(errors(model, qwen_checkpoints[name], prompts))


def test_structure_follows_config(qwen_checkpoints, ops):
    """The variants really exercise what they claim: bias, tying, q/k norms, MoE vs dense layers."""
    from hetero.engine.layers.moe import FusedMoE

    q2 = build_model(qwen_checkpoints["qwen2"], ops, torch.float32)
    attn = q2.model.layers[0].self_attn
    assert attn.qkv_proj.bias is not None and attn.o_proj.bias is None and not hasattr(attn, "q_norm")
    assert q2.lm_head.weight is not q2.model.embed_tokens.weight

    sliding = build_model(qwen_checkpoints["qwen2_sliding"], ops, torch.float32)
    windows = [layer.self_attn.attn.window for layer in sliding.model.layers]
    assert windows == [(-1, -1), (4, -1)]

    q3 = build_model(qwen_checkpoints["qwen3"], ops, torch.float32)
    attn = q3.model.layers[0].self_attn
    assert attn.qkv_proj.bias is None and attn.head_dim == 32 and attn.q_norm.weight.shape == (32,)
    tied = build_model(qwen_checkpoints["qwen3_tied"], ops, torch.float32)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert tied.model.layers[0].self_attn.o_proj.bias is not None

    def sparse(name):
        return [
            isinstance(getattr(layer.mlp, "experts", None), FusedMoE)
            for layer in build_model(qwen_checkpoints[name], ops, torch.float32).model.layers
        ]

    assert sparse("qwen3_moe") == [True, False, True]
    assert sparse("qwen3_moe_step2") == [False, True, False, False]
    routing = build_model(qwen_checkpoints["qwen3_moe"], ops, torch.float32).model.layers[0].mlp.experts.routing
    assert routing.renormalize and routing.top_k == 2 and routing.scoring == "softmax"
    step2 = build_model(qwen_checkpoints["qwen3_moe_step2"], ops, torch.float32)
    assert not step2.model.layers[1].mlp.experts.routing.renormalize


@pytest.mark.parametrize("name,layer", [("qwen3", 1), ("qwen3_moe", 0)])
def test_a_changed_weight_does_not_match(name, layer, qwen_checkpoints, ops, prompts):
    """The comparison can fail: zeroing one layer's o_proj breaks that layer's output and everything after."""
    model = build_model(qwen_checkpoints[name], ops, torch.float32)
    with torch.no_grad():
        model.model.layers[layer].self_attn.o_proj.weight.zero_()
    with pytest.raises(AssertionError):
        assert_small(errors(model, qwen_checkpoints[name], prompts))
    for logit_err, hidden_err in errors(model, qwen_checkpoints[name], prompts):
        assert logit_err > 1e-2
        assert max(hidden_err[: layer + 1]) < TOL  # the embedding and the layers before still match
        assert min(hidden_err[layer + 1 :]) > 1e-2  # this layer's output on does not
