"""Hunyuan V1 dense on cpu_ref in float32 against transformers' own class on a tiny random checkpoint:
every prompt's prefill logits and layer outputs (``test_qwen_models``' harness) and the NTK-alpha rope's
table, including the refusal of rope fields hetero does not implement. Greedy tokens, 16 requests with
a prefix hit and preemption, and the Triton kernels under the interpreter: ``test_end_to_end``."""

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


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny.build("hunyuan_v1_dense", tmp_path_factory.mktemp("hunyuan") / "dense")


def test_prefill_matches_transformers(checkpoint):
    model = build_model(checkpoint, hetero.load("cpu_ref"), torch.float32)
    assert type(model).__name__ == "HunYuanDenseV1ForCausalLM"
    assert model.model.layers[0].self_attn.query_layernorm.weight.shape == (16,)
    assert_small(errors(model, checkpoint, make_prompts(256, PROMPT_LENS)))


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


def test_check_model_passes(checkpoint):
    from hetero.tools.check import ModelCheck

    report = ModelCheck(checkpoint, "cpu_ref").run(make_prompts(256, (7, 19)), max_tokens=4)
    assert report.passed, report.as_dict()
    assert max(r.rel_l2 for r in report.layers) < 1e-5
