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

ARCHS = ("hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3")


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_matches_transformers(arch, checkpoints):
    model = build_model(checkpoints(arch), hetero.load("cpu_ref"), torch.float32)
    assert type(model).__name__ == tiny.architecture(arch)
    assert_small(errors(model, checkpoints(arch), make_prompts(256, PROMPT_LENS)))


def test_structure_follows_config(checkpoints):
    """Hunyuan-A13B's per-layer ``moe_topk`` reaches each layer; Hy3's first layer is dense; in a bfloat16
    model both routers stay float32, as transformers keeps them (the tiny models' tokens cannot tell)."""
    moe = build_model(checkpoints("hunyuan_v1_moe"), hetero.load("cpu_ref"), torch.bfloat16)
    assert [layer.mlp.experts.routing.top_k for layer in moe.model.layers] == [2, 3]
    hy3 = build_model(checkpoints("hy_v3"), hetero.load("cpu_ref"), torch.bfloat16)
    assert not hasattr(hy3.model.layers[0].mlp, "experts") and hy3.model.layers[1].mlp.fp32_combine
    routers = (moe.model.layers[0].mlp.gate, hy3.model.layers[1].mlp.router)
    for router, mlp in zip(routers, (moe.model.layers[0].mlp, hy3.model.layers[1].mlp)):
        assert next(router.parameters()).dtype == torch.float32 and mlp.experts.w13.dtype == torch.bfloat16
        assert router(torch.randn(3, 64, dtype=torch.bfloat16)).dtype == torch.float32


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

    plan = [(arch, False) for arch in ARCHS] + [("hunyuan_v1_moe", True), ("hy_v3", True)]
    jobs, want = _jobs(checkpoints, "cpu_ref", plan)
    for (arch, ep), got, expected in zip(plan, _torchrun(jobs, tmp_path), want):
        assert got == expected, f"{arch} {'EP' if ep else 'TP'}=2 differs from transformers"


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_greedy_tokens_follow_the_top5_rule(arch, checkpoints):
    """hetero in bfloat16 (float32 routers and shared-expert combine, as transformers keeps them) against
    transformers in bfloat16: the first token equal, and each greedy token among the reference's top-5
    given the engine's own prefix (bf16 rounding may flip a near-tie later)."""
    import transformers

    from hetero.engine import LLM, SamplingParams

    path = checkpoints(arch)
    ps = make_prompts(256, (5, 17, 40), seed=5)
    llm = LLM(str(path), backend="cpu_ref", dtype="bfloat16")
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = [list(o.token_ids) for o in llm.generate(ps, params, progress=False)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()
    for p, out in zip(ps, outs):
        with torch.inference_mode():
            logits = hf(torch.tensor([p + out])).logits[0].float()
        assert out[0] == int(logits[len(p) - 1].argmax())
        for i, token in enumerate(out):
            top = logits[len(p) - 1 + i].topk(5).indices.tolist()
            assert token in top, (arch, p, i, token, top)
