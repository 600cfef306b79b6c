"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE (hybrid Gated DeltaNet + gated full attention) against transformers 5.24's
own classes on tiny random checkpoints (``hetero.tools.tiny``), on cpu_ref in float32: packed prefill logits and
every layer's output, greedy tokens, batching with chunked prefill, preemption, prefix caching over the state
snapshots, check-model, and the cuda backend's Triton kernels under the interpreter.

Prefix-caching rule for these models (the runtime's, stated in docs/engine.md): a cached prefix is served only up
to a block boundary where a snapshot of every layer's conv and delta-rule state exists. Snapshots are taken where a
prompt's prefill stops at its last full block and at each block boundary decoding crosses; paged KV alone is never
reused (the linear layers would restart from a wrong state, with no error).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from _hf import hf_greedy, prompts
from test_qwen_models import PROMPT_LENS, assert_small, errors

import hetero
from hetero.engine.forward import build_model

ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
#: greedy tokens compared with transformers' generate, per architecture
MAX_TOKENS = {"qwen3_next": 32, "qwen3_5": 32, "qwen3_5_moe": 32}
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def ops():
    return hetero.load("cpu_ref")


@pytest.fixture(scope="module")
def prompt_ids():
    return prompts(256, PROMPT_LENS)


def _llm(path, backend="cpu_ref", **kw):
    from hetero.engine import LLM

    return LLM(str(path), backend=backend, dtype="float32", **kw)


def _greedy(llm, prompt_ids, max_tokens):
    from hetero.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [list(o.token_ids) for o in llm.generate(prompt_ids, params, progress=False)]


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_and_every_layer_match_transformers(arch, checkpoints, ops, prompt_ids):
    model = build_model(checkpoints(arch), ops, torch.float32)
    assert type(model).__name__ == model.config.architectures[0]
    assert_small(errors(model, checkpoints(arch), prompt_ids))


def test_structure_follows_config(checkpoints, ops):
    from hetero.engine.layers.gated_attention import GatedAttention
    from hetero.engine.layers.gated_deltanet import GatedDeltaNet
    from hetero.engine.models.decoder import GatedMLP
    from hetero.engine.models.qwen3_next import HybridSparseMoeBlock

    def kinds(arch):
        layers = build_model(checkpoints(arch), ops, torch.float32).model.layers
        mixers = [
            "gdn"
            if isinstance(getattr(x, "linear_attn", None), GatedDeltaNet)
            else "attn"
            if isinstance(getattr(x, "self_attn", None), GatedAttention)
            else "?"
            for x in layers
        ]
        mlps = [
            "moe" if isinstance(x.mlp, HybridSparseMoeBlock) else "mlp" if isinstance(x.mlp, GatedMLP) else "?"
            for x in layers
        ]
        return layers, mixers, mlps

    layers, mixers, mlps = kinds("qwen3_next")
    assert mixers == ["gdn", "gdn", "gdn", "attn"] and mlps == ["mlp", "moe", "moe", "moe"]
    assert layers[1].mlp.experts.routing.renormalize and layers[0].linear_attn.in_proj.layout == "interleaved"
    gdn, attn = layers[0].linear_attn, layers[3].self_attn
    assert {e.name: (e.shape, e.dtype, e.init) for e in gdn.cache_spec()} == {
        "conv_state": ((3, 2 * 2 * 16 + 4 * 16), None, "flag"),
        "ssm_state": ((4, 16, 16), torch.float32, "flag"),
    }
    assert attn.rotary_emb.cos_sin_cache.shape[1] == 8  # partial_rotary_factor 0.25 of head_dim 32
    assert (attn.num_heads, attn.num_kv_heads, attn.head_dim) == (4, 2, 32)
    layers, mixers, mlps = kinds("qwen3_5")
    assert mixers == ["gdn", "attn", "gdn", "attn"] and mlps == ["mlp"] * 4
    assert layers[0].linear_attn.in_proj.layout == "split" and layers[0].linear_attn.dv == 32
    layers, mixers, mlps = kinds("qwen3_5_moe")
    assert mixers == ["gdn", "gdn", "gdn", "attn"] and mlps == ["moe"] * 4
    assert all(x.mlp.experts.routing.renormalize for x in layers)


@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_5"])
def test_a_missing_norm_offset_is_caught(arch, checkpoints, ops, prompt_ids, monkeypatch):
    """The comparison can fail: the tiny checkpoints' zero-centred norms are randomized around 0, so reading
    them as plain weights (no ``1 +``) breaks the first layer already."""
    from hetero.engine.layers.gated_attention import ZeroCenteredRMSNorm

    model = build_model(checkpoints(arch), ops, torch.float32)
    for norm in (m for m in model.modules() if isinstance(m, ZeroCenteredRMSNorm)):
        monkeypatch.setattr(norm, "options", {})
    for logit_err, hidden_err in errors(model, checkpoints(arch), prompt_ids):
        assert logit_err > 1e-2 and min(hidden_err[1:]) > 1e-2


def test_mtp_weights_are_ignored(checkpoints, ops, tmp_path):
    from safetensors.torch import save_file

    from hetero.engine.loader import load_weights

    copy = Path(shutil.copytree(checkpoints("qwen3_next"), tmp_path / "ckpt"))
    names = ["mtp.fc.weight", "mtp.layers.0.mlp.experts.0.up_proj.weight", "mtp.norm.weight"]
    save_file({n: torch.zeros(4, 4) for n in names}, str(copy / "model-mtp.safetensors"))
    index = json.loads((copy / INDEX).read_text())
    index["weight_map"].update({n: "model-mtp.safetensors" for n in names})
    (copy / INDEX).write_text(json.dumps(index))
    model = build_model(checkpoints("qwen3_next"), ops, torch.float32)
    assert set(names) <= set(load_weights(model, copy).ignored)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_equal_transformers(arch, checkpoints):
    path, n = checkpoints(arch), MAX_TOKENS[arch]
    ps = prompts(256, (5, 17, 40))
    assert _greedy(_llm(path), ps, n) == hf_greedy(path, ps, n)


def test_sixteen_requests_chunked_and_preempted_equal_one_at_a_time(checkpoints):
    path = checkpoints("qwen3_next")
    ps = prompts(256, [3 + 5 * i for i in range(16)], seed=1)
    alone = _greedy(_llm(path, max_num_seqs=1, enable_prefix_caching=False), ps, 8)
    together = _llm(path, max_num_seqs=16, max_num_batched_tokens=64)  # prompts of 648 tokens: chunked prefill
    assert _greedy(together, ps, 8) == alone
    assert max(together.stats["step_tokens"]) == 64 and together.stats["preemptions"] == 0
    # 14 blocks of 8 tokens hold a few sequences at a time: preempted sequences give back their state slot too
    small = _llm(path, max_num_seqs=16, block_size=8, num_kv_blocks=14, max_num_batched_tokens=64)
    assert _greedy(small, ps, 8) == alone
    assert small.stats["preemptions"] > 0
    assert small.block_manager.slots.num_free_slots == small.runner.num_state_slots
    assert alone == hf_greedy(path, ps, 8)


def test_a_prefix_hit_gives_the_tokens_of_no_prefix_caching(checkpoints):
    """A hit is served at a block boundary with a state snapshot (the last full block of an earlier prompt),
    never at one without (24 tokens shared, snapshot only at 40): the tokens equal the uncached engine's."""
    path = checkpoints("qwen3_next")
    base, tails = prompts(256, [40], seed=5)[0], prompts(256, [5, 6, 7], seed=6)
    first, hit, no_snapshot = base + tails[0], base + tails[1], base[:24] + tails[2]
    plain = _llm(path, block_size=8, enable_prefix_caching=False)
    cached = _llm(path, block_size=8, enable_prefix_caching=True)
    for prompt, served in ((first, 0), (hit, 40), (no_snapshot, 0)):
        before = cached.stats["cached_prompt_tokens"]
        assert _greedy(cached, [prompt], 12) == _greedy(plain, [prompt], 12)
        assert cached.stats["cached_prompt_tokens"] - before == served


def test_check_model_passes(checkpoints):
    from hetero.tools.check import ModelCheck

    report = ModelCheck(checkpoints("qwen3_5_moe"), "cpu_ref").run(prompts(256, (7, 19)), max_tokens=4)
    assert report.passed, report.as_dict()
    assert [r.name for r in report.layers][1:5] == [f"layer {i}" for i in range(4)]
    assert max(r.rel_l2 for r in report.layers) < 1e-5


def test_triton_kernels_under_the_interpreter(checkpoints, triton_interpreter):
    from hetero.engine.forward import prefill

    cuda = hetero.load("cuda")
    missing = [op for op in ("causal_conv1d", "gated_delta_rule") if cuda.explain()[op].origin != "backend"]
    if missing:
        pytest.skip(f"the cuda backend has no Triton kernel for {', '.join(missing)} (falls back to the reference)")
    path = checkpoints("qwen3_5")
    ps = prompts(256, (4, 11, 23), seed=2)
    from _hf import hf_model

    for p, got in zip(ps, prefill(build_model(path, cuda, torch.float32), ps, block_size=8).logits):
        with torch.inference_mode():
            want = hf_model(str(path))(torch.tensor([p])).logits[0]
        assert float((got - want).norm() / want.norm()) < 1e-4
    # 7 blocks of 8 tokens cannot hold the three sequences at full length (9): preemption, state slots included
    llm = _llm(path, backend="cuda", max_num_seqs=4, block_size=8, num_kv_blocks=7)
    assert _greedy(llm, ps, 8) == hf_greedy(path, ps, 8)
    assert llm.stats["preemptions"] > 0
