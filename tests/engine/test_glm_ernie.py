"""GLM-4.5 (``glm4_moe``) and ERNIE-4.5-MoE (``ernie4_5_moe``) on cpu_ref in float32 against transformers' own
classes on tiny random checkpoints: every prompt's prefill logits and layer outputs (``test_qwen_models``'
harness), for the tiny configs and for variants taking each optional branch the other way (GLM-4.5-Air's form:
no q/k norms, no q/k/v bias, one expert group; ERNIE without biases or shared experts, MoE by
``moe_layer_end_index``); the layer schedules against transformers' decoder layers; the routing features that
must bite in the tiny models; the MTP tensors skipped by name only; the refusals. Greedy tokens, 16 requests
with a prefix hit and preemption, and the Triton kernels under the interpreter: ``test_end_to_end``; TP=2 and
EP=2: ``test_parallel``."""

from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("transformers")

from _hf import prompts as make_prompts
from test_qwen_models import PROMPT_LENS, assert_small, errors

import hetero
from hetero.engine.forward import build_model, prefill
from hetero.engine.layers.moe import FusedMoE
from hetero.engine.loader import UnexpectedWeightsError
from hetero.engine.models import ernie4_5
from hetero.errors import UsageError
from hetero.tools import tiny

#: name -> (tiny arch, config overrides)
CASES = {
    "glm4_moe": ("glm4_moe", {}),
    "glm4_moe_air": (
        "glm4_moe",
        dict(use_qk_norm=False, attention_bias=False, n_group=1, topk_group=1, routed_scaling_factor=1.0),
    ),
    "ernie4_5_moe": ("ernie4_5_moe", {}),
    # MoE in layers 0 and 1 (start 0, end 1, every layer), dense 2; untied; no shared experts, no biases
    "ernie4_5_moe_plain": (
        "ernie4_5_moe",
        dict(
            use_bias=False,
            moe_num_shared_experts=0,
            moe_layer_start_index=0,
            moe_layer_end_index=1,
            moe_layer_interval=1,
            tie_word_embeddings=False,
            moe_norm_min=1e-12,
        ),
    ),
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory, checkpoints):
    root = tmp_path_factory.mktemp("glm_ernie")
    return {
        name: checkpoints(arch) if not kw else tiny.build(arch, root / name, shard_size=None, **kw)
        for name, (arch, kw) in CASES.items()
    }


@pytest.mark.parametrize("name", list(CASES))
def test_prefill_matches_transformers(name, cases):
    model = build_model(cases[name], hetero.load("cpu_ref"), torch.float32)
    assert type(model).__name__ == tiny.architecture(CASES[name][0])
    assert_small(errors(model, cases[name], make_prompts(256, PROMPT_LENS)))


def _routing(model, mlp):
    """(unbiased top-k ids, route's ids, route's unnormalized weights) of a MoE block on its inputs in a prefill."""
    seen = []
    hook = mlp.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    prefill(model, make_prompts(256, PROMPT_LENS))
    hook.remove()
    logits = mlp.gate(torch.cat(seen).float())
    weights, ids = FusedMoE._routed(mlp.experts, logits, None)  # before any renormalization glue
    scores = logits.softmax(-1) if mlp.experts.routing.scoring == "softmax" else logits.sigmoid()
    return scores.topk(ids.shape[1]).indices.sort().values, ids.long().sort().values, weights


def test_structure_and_routing_features_bite(cases):
    """GLM: dense layer 0, rope on 8 of 16 dims, float32 routers in a bfloat16 model; ERNIE: MoE in layer 1
    only, interleaved rope, a biased LM head tied to the embedding. On the tiny models' own activations the
    selection-only bias changes some tokens' experts, and ERNIE's moe_norm_min clamps some tokens' sums and
    not others'."""
    glm16 = build_model(cases["glm4_moe"], hetero.load("cpu_ref"), torch.bfloat16)
    assert glm16.model.layers[1].mlp.gate.weight.dtype == torch.float32
    assert glm16.model.layers[1].mlp.experts.w13.dtype == torch.bfloat16
    glm = build_model(cases["glm4_moe"], hetero.load("cpu_ref"), torch.float32)
    layers = glm.model.layers
    assert not hasattr(layers[0].mlp, "experts") and all(hasattr(lay.mlp, "experts") for lay in layers[1:])
    assert layers[0].self_attn.rotary_emb.cos_sin_cache.shape == (512, 8) and layers[0].self_attn.rotary_emb.is_neox
    ernie = build_model(cases["ernie4_5_moe"], hetero.load("cpu_ref"), torch.float32)
    assert [hasattr(lay.mlp, "experts") for lay in ernie.model.layers] == [False, True, False]
    assert not ernie.model.layers[0].self_attn.rotary_emb.is_neox
    assert ernie.lm_head.weight is ernie.model.embed_tokens.weight and ernie.lm_head.bias is not None
    with torch.inference_mode():
        for model, mlp in ((glm, layers[1].mlp), (ernie, ernie.model.layers[1].mlp)):
            unbiased, ids, weights = _routing(model, mlp)
            assert (unbiased != ids).any(dim=1).sum() >= 4, "the correction bias never changes a selection"
        sums = weights.sum(-1)
        assert (sums < 0.5).sum() >= 4 and (sums > 0.5).sum() >= 4, sums


@pytest.mark.parametrize(
    "schedule",
    [
        dict(moe_layer_interval=2, moe_layer_start_index=1),
        dict(moe_layer_interval=1, moe_layer_end_index=3),
        dict(moe_layer_interval=3, moe_layer_start_index=0, moe_layer_end_index=-1),
    ],
)
def test_ernie_layer_schedule_is_transformers(schedule):
    from transformers.models.ernie4_5_moe import modeling_ernie4_5_moe as m

    config = tiny.tiny_config(
        "ernie4_5_moe",
        num_hidden_layers=6,
        hidden_size=8,
        intermediate_size=8,
        moe_intermediate_size=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        **schedule,
    )
    theirs = [isinstance(m.Ernie4_5_MoeDecoderLayer(config, i).mlp, m.Ernie4_5_MoeSparseMoeBlock) for i in range(6)]
    assert [ernie4_5.is_moe_layer(config, i) for i in range(6)] == theirs and any(theirs) and not all(theirs)


def _with_extra_tensors(src, dst, names):
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    files = sorted(dst.glob("*.safetensors"))
    tensors = load_file(str(files[-1]))
    tensors.update({n: torch.randn(4, 4) for n in names})
    save_file(tensors, str(files[-1]), metadata={"format": "pt"})
    index = dst / "model.safetensors.index.json"
    if index.exists():
        import json

        data = json.loads(index.read_text())
        data["weight_map"].update({n: files[-1].name for n in names})
        index.write_text(json.dumps(data))
    return dst


@pytest.mark.parametrize(
    "name, mtp, off",
    [
        # GLM's MTP layer is layer num_hidden_layers (3); without num_nextn_predict_layers it is unexpected
        (
            "glm4_moe",
            ["model.layers.3.eh_proj.weight", "model.layers.3.self_attn.q_proj.weight"],
            dict(num_nextn_predict_layers=0),
        ),
        ("ernie4_5_moe", ["model.mtp_block.0.self_attn.q_proj.weight", "model.mtp_linear_proj.0.weight"], None),
    ],
)
def test_mtp_tensors_are_skipped_by_name(name, mtp, off, cases, tmp_path):
    path = _with_extra_tensors(cases[name], tmp_path / name, mtp)
    ps = make_prompts(256, (9,))
    want = prefill(build_model(cases[name], hetero.load("cpu_ref"), torch.float32), ps).logits[0]
    got = prefill(build_model(path, hetero.load("cpu_ref"), torch.float32), ps).logits[0]
    assert torch.equal(got, want)
    stray = _with_extra_tensors(cases[name], tmp_path / "stray", ["model.layers.4.eh_proj.weight"])
    with pytest.raises(UnexpectedWeightsError, match=r"model\.layers\.4\.eh_proj"):  # one past the MTP layers
        build_model(stray, hetero.load("cpu_ref"), torch.float32)
    if off is not None:
        with pytest.raises(UnexpectedWeightsError, match=r"model\.layers\.3\.eh_proj"):
            build_model(path, hetero.load("cpu_ref"), torch.float32, hf_config=tiny.tiny_config(name, **off))


@pytest.mark.parametrize(
    "arch, field, value",
    [
        ("glm4_moe", "hidden_act", "gelu"),
        ("glm4_moe", "n_shared_experts", 0),
        ("ernie4_5_moe", "hidden_act", "gelu"),
        ("ernie4_5_moe", "moe_gate_act", "sigmoid"),
        ("ernie4_5_moe", "moe_use_aux_free", False),
        ("ernie4_5_moe", "moe_layer_interval", 0),
    ],
)
def test_unimplemented_fields_are_refused_by_name(arch, field, value, checkpoints):
    config = tiny.tiny_config(arch)
    setattr(config, field, value)
    with pytest.raises(UsageError, match=field) as err:
        build_model(checkpoints(arch), hetero.load("cpu_ref"), torch.float32, hf_config=config)
    assert err.value.arg == field
