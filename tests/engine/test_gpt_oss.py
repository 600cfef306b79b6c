"""gpt-oss against transformers 5.24's own class on a tiny random checkpoint (``hetero.tools.tiny``: four layers
[sliding, full, sliding, full] with window 4, sinks, q/k/v/o biases, yarn rope, eight experts with biases and a
swiglu_limit of 1.5 so the clamps bite), on cpu_ref in float32: packed prefill logits and every layer, greedy
tokens, batching with chunked prefill, preemption, check-model, and MXFP4 expert weights dequantized at load.
TP=2 runs in test_dsa_models.py (one torchrun for the three new families).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("transformers")

from _hf import hf_greedy, prompts
from test_dsa_models import _greedy, _llm
from test_qwen_models import PROMPT_LENS, assert_small, errors

import hetero
from hetero.engine.forward import build_model

#: e2m1 by code, written out here so the test does not read the engine's table
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


@pytest.fixture(scope="module")
def path(checkpoints):
    return checkpoints("gpt_oss")


@pytest.fixture(scope="module")
def model(path):
    return build_model(path, hetero.load("cpu_ref"), torch.float32)


@pytest.fixture(scope="module")
def prompt_ids():
    return prompts(256, PROMPT_LENS)


def test_prefill_and_every_layer_match_transformers(model, path, prompt_ids):
    assert type(model).__name__ == "GptOssForCausalLM"
    assert_small(errors(model, path, prompt_ids))


def test_structure_follows_config(model, path):
    from _hf import hf_model

    layers = model.model.layers
    assert [x.self_attn.attn.window for x in layers] == [(3, -1), (-1, -1), (3, -1), (-1, -1)]
    attn = layers[0].self_attn
    assert attn.sinks.dtype == torch.float32 and attn.qkv_proj.bias is not None and attn.o_proj.bias is not None
    experts = layers[1].mlp.experts
    ref = hf_model(str(path)).model.layers[1].mlp.experts
    w13 = ref.gate_up_proj.detach().transpose(1, 2)  # [E, 2I, H], gate/up rows interleaved
    assert torch.equal(experts.w13, torch.cat([w13[:, 0::2], w13[:, 1::2]], dim=1))
    assert torch.equal(
        experts.gate_up_proj_bias, torch.cat([ref.gate_up_proj_bias[:, 0::2], ref.gate_up_proj_bias[:, 1::2]], dim=1)
    )
    assert torch.equal(experts.w2, ref.down_proj.detach().transpose(1, 2))
    assert (experts.alpha, experts.limit) == (1.702, 1.5)


@pytest.mark.parametrize("change", ["no_sinks", "interleaved_gate_up", "no_clamp"])
def test_the_comparison_can_fail(change, model, path, prompt_ids, monkeypatch):
    """Dropping the sinks, reading gate/up as halves of the checkpoint's columns, or a limit that never clamps
    each move the logits past the tolerance."""
    saved = [(p, p.detach().clone()) for p in model.parameters()]
    try:
        for layer in model.model.layers:
            attn, experts = layer.self_attn, layer.mlp.experts
            if change == "no_sinks":
                attn.sinks.data.fill_(-1e4)
            elif change == "interleaved_gate_up":
                i = experts.inter
                for t in (experts.w13, experts.gate_up_proj_bias.data):  # rows gate0, up0, gate1, ...
                    t.copy_(torch.stack([t[:, :i], t[:, i:]], dim=2).flatten(1, 2))
            else:
                monkeypatch.setattr(experts, "limit", 1e4)
        assert min(e for e, _ in errors(model, path, prompt_ids)) > 1e-3
    finally:
        for p, value in saved:
            p.data.copy_(value)


def test_greedy_tokens_equal_transformers(path):
    ps = prompts(256, (5, 17, 40))
    assert _greedy(_llm(path), ps, 32) == hf_greedy(path, ps, 32)


def test_sixteen_requests_chunked_and_preempted_equal_one_at_a_time(path):
    ps = prompts(256, [3 + 5 * i for i in range(16)], seed=1)
    alone = _greedy(_llm(path, max_num_seqs=1, enable_prefix_caching=False), ps, 8)
    small = _llm(path, max_num_seqs=16, block_size=8, num_kv_blocks=14, max_num_batched_tokens=64)
    assert _greedy(small, ps, 8) == alone
    assert small.stats["preemptions"] > 0 and max(small.stats["step_tokens"]) == 64
    assert alone == hf_greedy(path, ps, 8)


def test_check_model_passes(path):
    from hetero.tools.check import ModelCheck

    report = ModelCheck(path, "cpu_ref").run(prompts(256, (7, 19)), max_tokens=4)
    assert report.passed, report.as_dict()
    assert max(r.rel_l2 for r in report.layers) < 1e-5


def _mxfp4(values_shape: tuple[int, ...], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random MXFP4 data for a [..., K] weight: (blocks uint8 [..., K/32, 16], scales uint8 [..., K/32], values)."""
    *lead, k = values_shape
    codes = torch.randint(0, 16, (*lead, k // 32, 32), generator=gen, dtype=torch.uint8)
    scales = torch.randint(121, 125, (*lead, k // 32), generator=gen, dtype=torch.uint8)
    values = torch.tensor(E2M1)[codes.long()] * torch.exp2(scales.double() - 127).float().unsqueeze(-1)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, scales, values.flatten(-2)


def test_mxfp4_experts_are_dequantized_at_load(path, tmp_path, prompt_ids):
    """A copy with MXFP4 experts (``*_blocks`` / ``*_scales``, ``quant_method: mxfp4``) runs like transformers on
    a float checkpoint holding exactly the dequantized values; another quant_method is refused by name."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from hetero.engine.quant.config import UnsupportedQuantization

    single = tmp_path / "float"
    AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).save_pretrained(single)
    tensors, gen = load_file(str(single / "model.safetensors")), torch.Generator().manual_seed(3)
    quant = shutil.copytree(single, tmp_path / "mxfp4")
    packed = dict(tensors)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, k_in, n_out = tensors[name].shape  # transformers' layout [E, in, out]
        blocks, scales, values = _mxfp4((e, n_out, k_in), gen)  # MXFP4 rows are [out, in]
        tensors[name] = values.transpose(1, 2).contiguous()
        del packed[name]
        packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
    save_file(tensors, str(single / "model.safetensors"), metadata={"format": "pt"})
    save_file(packed, str(quant / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((quant / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (quant / "config.json").write_text(json.dumps(config))

    model = build_model(quant, hetero.load("cpu_ref"), torch.float32)
    assert model.model.layers[0].mlp.experts.gate_up_proj_blocks.dtype == torch.uint8
    assert_small(errors(model, single, prompt_ids))
    config["quantization_config"]["quant_method"] = "awq"
    (quant / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedQuantization, match="awq"):
        build_model(quant, hetero.load("cpu_ref"), torch.float32)
