"""Kimi-Linear (KDA 3:1 with NoPE MLA, V3 routing) on cpu_ref in float32 against transformers' own class on its
tiny random checkpoint: prefill logits and every layer (``test_qwen_models``' harness; transformers runs its torch
fallbacks of fla's chunked KDA and of the causal conv), the structure the config asks for, that the comparison
catches a rope on the MLA, the release's dense MLP under ``mlp.`` and config fields refused by name. Greedy
tokens, 16 requests with chunked prefill, a prefix hit and preemption, and the Triton kernels under the
interpreter: ``test_end_to_end``; TP=2 and EP=2: ``test_parallel``; op replay: ``test_per_op``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from _hf import prompts
from test_qwen_models import PROMPT_LENS, assert_small, errors

import hetero
from hetero.engine.forward import build_model, prefill
from hetero.errors import UsageError
from hetero.tools import tiny

ARCH = "kimi_linear"


@pytest.fixture(scope="module")
def ops():
    return hetero.load("cpu_ref")


@pytest.fixture(scope="module")
def model(checkpoints, ops):
    return build_model(checkpoints(ARCH), ops, torch.float32)


def test_prefill_and_every_layer_match_transformers(model, checkpoints):
    assert type(model).__name__ == "KimiLinearForCausalLM"
    assert_small(errors(model, checkpoints(ARCH), prompts(256, PROMPT_LENS)))


def test_structure_follows_config(model):
    layers = model.model.layers
    assert [type(x.self_attn).__name__ for x in layers] == ["KimiDeltaAttention"] * 3 + ["NoPEMLAttention"]
    assert [type(x.mlp).__name__ for x in layers] == ["GatedMLP"] + ["DeepseekMoE"] * 3
    kda = layers[0].self_attn
    assert {e.name: (e.shape, e.dtype, e.init) for e in kda.cache_spec()} == {
        "conv_state": ((3, 3 * 4 * 16), None, "flag"),
        "ssm_state": ((4, 16, 16), torch.float32, "flag"),
    }
    assert kda.o_norm.gate_act == "sigmoid" and kda.A_log.shape == (4,) and kda.dt_bias.shape == (64,)
    moe = layers[1].mlp
    r = moe.experts.routing
    assert (r.scoring, r.n_group, r.topk_group, r.renormalize, r.routed_scaling_factor) == ("sigmoid", 4, 2, True, 2.5)
    assert moe.gate.e_score_correction_bias is moe.experts.correction_bias and moe.experts.num_experts == 8
    assert layers[3].self_attn.scale == 24**-0.5


def test_no_rope_is_what_matches(model, checkpoints, monkeypatch):
    """No rotary op runs; rotating the MLA's q_pe / k_pe (DeepSeek's rope on the same dims) breaks the MLA
    layer and everything after it."""
    from hetero.engine.instrument import OpCounter, instrument
    from hetero.engine.layers.rotary import RotaryEmbedding

    counter = OpCounter()
    with instrument(model, counter):
        prefill(model, prompts(256, (9,)))
    assert "rotary_embedding" not in counter.per_op() and "gated_delta_rule" in counter.per_op()
    mla = model.model.layers[3].self_attn
    monkeypatch.setattr(mla, "rotary", RotaryEmbedding(model.ctx, model.config, 8, 512))
    for n, (logit_err, hidden_err) in zip(PROMPT_LENS, errors(model, checkpoints(ARCH), prompts(256, PROMPT_LENS))):
        assert max(hidden_err[:4]) < 1e-4 and (n == 1 or min(logit_err, *hidden_err[4:]) > 1e-3), (n, hidden_err)


def test_dense_mlp_under_mlp_loads_as_under_block_sparse_moe(model, tmp_path):
    """transformers writes every MLP under ``block_sparse_moe``; a checkpoint with its dense MLP under ``mlp.``
    loads the same weights."""
    from safetensors.torch import load_file, save_file

    path = tiny.build(ARCH, tmp_path / "ckpt", shard_size=None)
    tensors = load_file(str(path / "model.safetensors"))
    renamed = {k.replace("layers.0.block_sparse_moe.", "layers.0.mlp."): v for k, v in tensors.items()}
    assert "model.layers.0.mlp.gate_proj.weight" in renamed
    save_file(renamed, str(path / "model.safetensors"), metadata={"format": "pt"})
    other = build_model(path, hetero.load("cpu_ref"), torch.float32)
    ours = model.state_dict()
    assert all(torch.equal(v, ours[k]) for k, v in other.state_dict().items())


@pytest.mark.parametrize(
    "field, value, arg",
    [
        ("hidden_act", "gelu", "hidden_act"),
        ("num_key_value_heads", 2, "num_key_value_heads"),
        ("n_shared_experts", 0, "num_shared_experts"),
        ("mla_use_nope", False, "mla_use_nope"),
        ("moe_layer_freq", 2, "moe_layer_freq"),
        ("linear_attn_config", {"num_heads": 4, "gate_lower_bound": -5.0}, "linear_attn_config.gate_lower_bound"),
        ("layer_types", ["linear_attention"] * 3 + ["sliding_attention"], "layer_types"),
        ("mlp_layer_types", ["dense", "moe", "sparse", "sparse"], "mlp_layer_types"),
    ],
)
def test_unimplemented_config_fields_are_refused_by_name(field, value, arg, checkpoints):
    config = tiny.tiny_config(ARCH)
    setattr(config, field, value)
    with pytest.raises(UsageError, match=arg.split(".")[-1]) as err:
        build_model(checkpoints(ARCH), hetero.load("cpu_ref"), torch.float32, hf_config=config)
    assert err.value.arg == arg
