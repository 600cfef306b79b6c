"""MiniMax-M2 and MiMo-V2-Flash on cpu_ref in float32 against transformers' own classes on tiny random checkpoints:
every prompt's prefill logits and layer outputs (``test_qwen_models``' harness), the structure each config asks for
(per-layer-type KV heads, windows, sinks, cache entries, rope tables), the release's checkpoint names, and the
refusal of config fields hetero does not implement. Greedy tokens, 16 requests with a prefix hit and preemption,
and the Triton kernels under the interpreter: ``test_end_to_end``; TP=2 (MiniMax-M2's all-heads q/k norm summed
over the ranks) and EP=2: ``test_parallel``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from _hf import prompts as make_prompts
from test_qwen_models import PROMPT_LENS, assert_small, errors

import hetero
from hetero.engine.forward import build_model
from hetero.engine.loader import map_name
from hetero.errors import UsageError
from hetero.tools import tiny

ARCHS = ("minimax_m2", "mimo_v2_flash")


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_matches_transformers(arch, checkpoints):
    model = build_model(checkpoints(arch), hetero.load("cpu_ref"), torch.float32)
    assert type(model).__name__ == tiny.architecture(arch)
    assert_small(errors(model, checkpoints(arch), make_prompts(256, PROMPT_LENS)))


def test_mimo_layers_follow_their_type(checkpoints):
    """Full layer 0: one KV head, no sinks, no window, theta 1e6; sliding layers 1-2: two KV heads, sinks, window
    5, theta 1e4; each layer's cache entries keep its own KV heads, D = 24 for keys and Dv = 16 for values."""
    model = build_model(checkpoints("mimo_v2_flash"), hetero.load("cpu_ref"), torch.float32)
    attns = [layer.self_attn for layer in model.model.layers]
    assert [a.attn.window for a in attns] == [(-1, -1), (4, -1), (4, -1)]
    assert [a.sinks is None for a in attns] == [True, False, False]
    specs = [[(e.name, e.shape) for e in a.attn.cache_spec()] for a in attns]
    assert specs == [[("k_cache", (h, 24)), ("v_cache", (h, 16))] for h in (1, 2, 2)]
    tables = [a.rotary_emb.cos_sin_cache for a in attns]
    assert all(t.shape == (512, 8) for t in tables)  # int(24 * 0.334) = 8 rotated dims
    assert torch.equal(tables[1], tables[2]) and not torch.equal(tables[0], tables[1])
    assert attns[0].value_scale == pytest.approx(0.707) and attns[0].o_proj.bias is None
    assert not hasattr(model.model.layers[0].mlp, "experts") and model.model.layers[1].mlp.shared_experts is None


def test_minimax_norms_span_every_head(checkpoints):
    model = build_model(checkpoints("minimax_m2"), hetero.load("cpu_ref"), torch.float32)
    attn = model.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == (4 * 16,) and attn.k_norm.weight.shape == (1 * 16,)
    assert attn.rotary_emb.cos_sin_cache.shape == (512, 8)  # rotary_dim 8 of head_dim 16


def test_release_names_and_mtp_layers():
    """The releases' tensor names land in the same parameters as transformers' (per-expert or fused); their MTP
    layers are ignored by an explicit rule (MiniMax-M2: ``num_mtp_modules`` layers past the last; MiMo:
    ``model.mtp.*``)."""
    from hetero.engine.models.mimo_v2 import MiMoV2FlashForCausalLM
    from hetero.engine.models.minimax_m2 import MiniMaxM2ForCausalLM

    unbuilt = MiniMaxM2ForCausalLM.__new__(MiniMaxM2ForCausalLM)
    m2 = unbuilt.weight_mapping(tiny.tiny_config("minimax_m2", num_mtp_modules=2))
    experts = "model.layers.1.mlp.experts"
    assert map_name(m2, "model.layers.1.block_sparse_moe.experts.3.w3.weight") == (f"{experts}.w13", (3, "up"))
    assert map_name(m2, "model.layers.1.block_sparse_moe.experts.3.w2.weight") == (f"{experts}.w2", (3, "down"))
    assert map_name(m2, f"{experts}.gate_up_proj") == (f"{experts}.w13", (None, "gate_up"))
    bias = "model.layers.1.mlp.e_score_correction_bias"
    assert map_name(m2, "model.layers.1.block_sparse_moe.e_score_correction_bias") == (bias, None)
    assert map_name(m2, "model.layers.3.self_attn.q_proj.weight") is None  # the second MTP module
    assert map_name(m2, "model.layers.4.self_attn.q_proj.weight") is not None  # past them: unknown, reported
    mimo = MiMoV2FlashForCausalLM.mapping
    assert map_name(mimo, "model.layers.1.self_attn.attention_sink_bias") == ("model.layers.1.self_attn.sinks", None)
    assert map_name(mimo, "model.mtp.layers.0.self_attn.q_proj.weight") is None


@pytest.mark.parametrize(
    "arch, field, value",
    [
        ("minimax_m2", "qk_norm_type", "per_head"),
        ("minimax_m2", "attn_type_list", [1, 0]),
        ("minimax_m2", "shared_intermediate_size", 64),
        ("minimax_m2", "scoring_func", "softmax"),
        ("minimax_m2", "rotary_dim", 16),
        ("mimo_v2_flash", "swa_num_key_value_heads", 1),
        ("mimo_v2_flash", "add_full_attention_sink_bias", True),
        ("mimo_v2_flash", "hybrid_layer_pattern", [1, 1, 1]),
        ("mimo_v2_flash", "layer_types", ["full_attention", "chunked_attention", "sliding_attention"]),
    ],
)
def test_unimplemented_fields_are_refused_by_name(arch, field, value, checkpoints):
    """Fields of the releases' configs that transformers' classes do not read, at values under which those
    classes would compute another model than the checkpoint's."""
    config = tiny.tiny_config(arch)
    setattr(config, field, value)
    with pytest.raises(UsageError, match=field) as err:
        build_model(checkpoints(arch), hetero.load("cpu_ref"), torch.float32, hf_config=config)
    assert err.value.arg == field
