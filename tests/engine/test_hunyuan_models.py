"""Hunyuan V1 dense and MoE and Hy3 on cpu_ref in float32 against transformers' own classes on tiny random
checkpoints: every prompt's prefill logits and layer outputs (``test_qwen_models``' harness), check-model, and
the NTK-alpha rope's table, with the refusal of rope and config fields hetero does not implement. Greedy
tokens, 16 requests with a prefix hit and preemption, and the Triton kernels under the interpreter:
``test_end_to_end``; TP=2 and EP=2: ``test_parallel``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from _hf import prompts as make_prompts
from test_qwen_models import PROMPT_LENS, assert_small, errors

import hetero
from hetero.engine.forward import build_model
from hetero.engine.layers.rotary import rope_frequencies
from hetero.errors import UsageError
from hetero.tools import tiny

ARCHS = ("hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3", "hy_v4")


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_matches_transformers(arch, checkpoints):
    model = build_model(checkpoints(arch), hetero.load("cpu_ref"), torch.float32)
    assert type(model).__name__ == tiny.architecture(arch)
    assert_small(errors(model, checkpoints(arch), make_prompts(256, PROMPT_LENS)))


def test_structure_follows_config(checkpoints):
    """Hunyuan-A13B's per-layer ``moe_topk`` reaches each layer; Hy3's first layer is dense; in a bfloat16
    model the routers, and HY4's sinks, indexer key norm, hyper-connections and LM head, stay float32 as
    transformers keeps them (the tiny models' tokens cannot tell)."""
    moe = build_model(checkpoints("hunyuan_v1_moe"), hetero.load("cpu_ref"), torch.bfloat16)
    assert [layer.mlp.experts.routing.top_k for layer in moe.model.layers] == [2, 3]
    hy3 = build_model(checkpoints("hy_v3"), hetero.load("cpu_ref"), torch.bfloat16)
    assert not hasattr(hy3.model.layers[0].mlp, "experts") and hy3.model.layers[1].mlp.fp32_combine
    routers = (moe.model.layers[0].mlp.gate, hy3.model.layers[1].mlp.router)
    for router, mlp in zip(routers, (moe.model.layers[0].mlp, hy3.model.layers[1].mlp)):
        assert next(router.parameters()).dtype == torch.float32 and mlp.experts.w13.dtype == torch.bfloat16
        assert router(torch.randn(3, 64, dtype=torch.bfloat16)).dtype == torch.float32
    hy4 = build_model(checkpoints("hy_v4"), hetero.load("cpu_ref"), torch.bfloat16)
    layer, attn = hy4.model.layers[1], hy4.model.layers[1].self_attn
    float32 = [
        hy4.lm_head.weight,
        attn.learnable_sink_param,
        attn.indexer.k_norm.weight,
        layer.hc_pre.hc_mlp_layer.hc_fn,
    ]
    assert all(p.dtype == torch.float32 for p in float32) and attn.q_b_proj.weight.dtype == torch.bfloat16
    assert [layer.self_attn.indexer is None for layer in hy4.model.layers] == [False, False, True]  # full, full, shared
    assert hy4.model.layers[1].mlp.experts.activation == "swiglu_clamp"


def _config(**rope):
    return tiny.tiny_config("hunyuan_v1_dense", rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, **rope})


def test_ntk_alpha_table_is_transformers():
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1RotaryEmbedding

    config = _config(alpha=1000.0, factor=1.0, beta_fast=32)
    ours, factor = rope_frequencies(config, 16, ntk_alpha=True)
    theirs = HunYuanDenseV1RotaryEmbedding(config).inv_freq
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0)
    assert factor == 1.0
    plain, _ = rope_frequencies(_config(factor=1.0), 16)  # "dynamic" without alpha: the plain schedule at init
    assert not torch.allclose(ours, plain)


@pytest.mark.parametrize(
    "rope, field",
    [
        (dict(alpha=1000.0, factor=1.0, low_freq_factor=2.0), "low_freq_factor"),
        (dict(alpha=1000.0, factor=2.0), "factor"),
    ],
)
def test_unimplemented_rope_fields_are_refused_by_name(rope, field):
    with pytest.raises(UsageError, match=f"rope_parameters.{field}") as err:
        rope_frequencies(_config(**rope), 16, ntk_alpha=True)
    assert err.value.arg == f"rope_parameters.{field}"


def test_alpha_outside_hunyuan_is_refused():
    """Another family's "dynamic" rope with alpha: transformers' generic class would ignore alpha, so
    hetero names it instead of choosing a reading."""
    with pytest.raises(UsageError, match="rope_parameters.alpha"):
        rope_frequencies(_config(alpha=1000.0, factor=1.0), 16)


def test_an_unknown_rope_type_is_refused_by_name():
    config = _config(alpha=1000.0, factor=1.0)
    config.rope_parameters["rope_type"] = "ntk_by_parts"
    with pytest.raises(UsageError, match="rope_type 'ntk_by_parts'") as err:
        rope_frequencies(config, 16, ntk_alpha=True)
    assert err.value.arg == "rope_parameters.rope_type"


@pytest.mark.parametrize(
    "field, value",
    [("use_cla", True), ("num_shared_expert", [1, 2]), ("moe_intermediate_size", 64), ("moe_topk", [2, 2, 2])],
)
def test_unimplemented_v1_moe_fields_are_refused_by_name(field, value, checkpoints):
    """Fields of the original Hunyuan-A13B config that transformers' class does not read either."""
    config = tiny.tiny_config("hunyuan_v1_moe")
    setattr(config, field, value)
    with pytest.raises(UsageError, match=field) as err:
        build_model(checkpoints("hunyuan_v1_moe"), hetero.load("cpu_ref"), torch.float32, hf_config=config)
    assert err.value.arg == field


def test_a_bad_hy3_layer_schedule_is_refused(checkpoints):
    config = tiny.tiny_config("hy_v3")
    config.mlp_layer_types = ["dense", "moe", "sparse"]
    with pytest.raises(UsageError, match="mlp_layer_types"):
        build_model(checkpoints("hy_v3"), hetero.load("cpu_ref"), torch.float32, hf_config=config)


@pytest.mark.parametrize("arch", ARCHS)
def test_check_model_passes(arch, checkpoints):
    from hetero.tools.check import ModelCheck

    report = ModelCheck(checkpoints(arch), "cpu_ref").run(make_prompts(256, (7, 19)), max_tokens=4)
    assert report.passed, report.as_dict()
    assert max(r.rel_l2 for r in report.layers) < 1e-5


def test_tp2_and_ep2_equal_transformers(checkpoints, tmp_path):
    """Heads, MLPs, shared MLPs and experts split over two gloo ranks; EP=2 holds half the experts a rank."""
    from test_parallel import _jobs, _torchrun

    plan = [(arch, False) for arch in ARCHS] + [("hunyuan_v1_moe", True), ("hy_v3", True), ("hy_v4", True)]
    jobs, want = _jobs(checkpoints, "cpu_ref", plan)
    for (arch, ep), got, expected in zip(plan, _torchrun(jobs, tmp_path), want):
        assert got == expected, f"{arch} {'EP' if ep else 'TP'}=2 differs from transformers"


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_greedy_tokens_follow_the_top5_rule(arch, checkpoints, tmp_path):
    """hetero in bfloat16 (float32 routers, shared-expert combine, hyper-connections and LM head, as
    transformers keeps them) against transformers in float32: each greedy token among the reference's top-5
    given the engine's own prefix (a bf16 rounding may flip a near-tie, even the first token). transformers'
    own bfloat16 run strays from float32 as far as hetero's (HY4: 9% of the logits' norm). HY4's checkpoint
    keeps every key (index_topk 64): at the tiny model's 6 of up to 56 keys, a bf16 rounding of two
    near-equal index scores swaps a key and the logits jump (in transformers' bfloat16 run too); the
    indexer's selection is checked in float32 above."""
    import transformers

    from hetero.engine import LLM, SamplingParams

    path = checkpoints(arch) if arch != "hy_v4" else tiny.build(arch, tmp_path / arch, index_topk=64)
    ps = make_prompts(256, (5, 17, 40), seed=5)
    llm = LLM(str(path), backend="cpu_ref", dtype="bfloat16")
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = [list(o.token_ids) for o in llm.generate(ps, params, progress=False)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    for p, out in zip(ps, outs):
        with torch.inference_mode():
            logits = hf(torch.tensor([p + out])).logits[0].float()
        for i, token in enumerate(out):
            top = logits[len(p) - 1 + i].topk(5).indices.tolist()
            assert token in top, (arch, p, i, token, top)


def test_hy4_vl_runs_its_text_model_and_refuses_image_tokens(checkpoints):
    """HY4-VL's text model (interleaved rope, the vision tower's weights ignored) against transformers' own
    multimodal class on text prompts, directly and through check-model; a prompt holding the image or video
    placeholder is refused by name."""
    import transformers

    from hetero.engine import LLM, SamplingParams
    from hetero.engine.forward import prefill

    path = checkpoints("hy_v4_vl")
    model = build_model(path, hetero.load("cpu_ref"), torch.float32)
    assert type(model).__name__ == "HYV4VLForConditionalGeneration"
    assert not model.model.layers[0].self_attn.rotary.is_neox
    hf = transformers.HYV4VLForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
    ps = make_prompts(240, (7, 30))
    for p, got in zip(ps, prefill(model, ps).logits):
        with torch.inference_mode():
            want = hf(input_ids=torch.tensor([p])).logits[0]
        assert float((got - want).norm() / want.norm()) < 1e-4
    from hetero.tools.check import ModelCheck

    check = ModelCheck(path, "cpu_ref")  # transformers' image-text-to-text class; prompts without placeholders
    assert check.media_tokens == (250, 251) and check.run(max_tokens=4).passed
    llm = LLM(str(path), backend="cpu_ref", dtype="float32")
    for token, name in ((250, "image_token_id"), (251, "video_token_id")):
        with pytest.raises(UsageError, match=name):
            llm.generate([[5, 6, token, 7]], SamplingParams(max_tokens=2), progress=False)
