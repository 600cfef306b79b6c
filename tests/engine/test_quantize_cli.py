"""``hetero quantize`` and the scaled formats' rules: block math (partial blocks), refusals by name,
tensor-parallel and packed cuts of 128-blocks, and the quantization line of the engine commands."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import hetero
from hetero.cli import main
from hetero.engine.context import ModelContext
from hetero.engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.loader import WeightMismatchError, load_weights
from hetero.engine.models.base import WeightMapping
from hetero.engine.parallel import Parallel
from hetero.engine.quant import UnsupportedQuantization, quant_config_of, weights_only
from hetero.engine.quant._qmath import dequantize, quantize_blocks, quantize_channels
from hetero.engine.quant.fp8 import fp8_config
from hetero.tools import tiny

FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def ct(fmt="float-quantized", weights=None, acts=None, **extra):
    kind = "int" if fmt == "int-quantized" else "float"
    w = {"num_bits": 8, "type": kind, "strategy": "channel", "symmetric": True, "dynamic": False, **(weights or {})}
    a = {"num_bits": 8, "type": kind, "strategy": "token", "symmetric": True, "dynamic": True, **(acts or {})}
    group = {"targets": ["Linear"], "format": fmt, "weights": w, "input_activations": a}
    return {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": group}, **extra}


def test_partial_blocks_scale_by_their_own_elements():
    w = torch.randn(192, 200, generator=torch.Generator().manual_seed(0))
    w[130:, 150:] *= 0.01  # the corner block (62 x 50 elements) is small: its scale must be too
    q, s = quantize_blocks(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 2)
    for i, j in [(0, 0), (1, 1), (0, 1)]:
        block = w[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
        assert s[i, j] == block.abs().max() / 448
    back = dequantize(q, s)
    assert (
        (back - w).abs()
        <= w.abs() * 2**-4 + s.repeat_interleave(128, 0)[:192].repeat_interleave(128, 1)[:, :200] * 2**-6
    ).all()
    qi, si = quantize_channels(w, torch.int8)
    assert qi.dtype == torch.int8 and si.shape == (192, 1) and qi.abs().max() == 127
    assert (dequantize(qi, si.bfloat16()) - w).abs().max() < 0.02 * w.abs().max()


@pytest.mark.parametrize(
    "qc,match",
    [
        (dict(FP8_BLOCK, activation_scheme="static"), "static"),
        ({k: v for k, v in FP8_BLOCK.items() if k != "weight_block_size"}, "per-tensor"),
        (dict(FP8_BLOCK, fmt="e5m2"), "e5m2"),
        (ct("pack-quantized"), "pack-quantized"),
        (ct(acts={"dynamic": False}), "static activation"),
        (ct("int-quantized", acts={"symmetric": False}), "asymmetric activations"),
        (ct(weights={"strategy": "tensor"}), "weight strategy 'tensor'"),
        ({"quant_method": "mxfp4"}, "'mxfp4' is not supported"),
        ({"quant_method": "gptq", "bits": 3}, "'gptq'.*bits 3"),  # 4-bit GPTQ loads (W4A16, test_w4a16)
    ],
)
def test_unsupported_formats_are_refused_by_name(qc, match):
    config = tiny.tiny_config("qwen3")
    config.quantization_config = qc
    with pytest.raises(UnsupportedQuantization, match=match):
        quant_config_of(config)


def test_skip_lists_and_float_layers():
    qc = fp8_config(
        dict(
            FP8_BLOCK,
            modules_to_not_convert=[
                "model.layers.0.self_attn.q_proj",
                "model.layers.0.self_attn.k_proj",
                "model.layers.0.self_attn.v_proj",
                "down_proj",
            ],
        )
    )
    assert type(qc.linear_method("model.layers.0.self_attn.qkv_proj")).__name__ == "UnquantizedLinearMethod"
    assert type(qc.linear_method("model.layers.1.self_attn.qkv_proj")).__name__ == "ScaledLinearMethod"
    assert type(qc.linear_method("model.layers.3.mlp.down_proj")).__name__ == "UnquantizedLinearMethod"
    assert type(qc.linear_method("model.layers.3.mlp.gate")).__name__ == "UnquantizedLinearMethod"  # router
    assert qc.linear_method("model.layers.3.self_attn.kv_b_proj").scheme.act_quant is None
    assert qc.linear_method("model.layers.3.self_attn.o_proj").scheme.act_quant == "group128"
    assert weights_only(qc).linear_method("model.layers.3.self_attn.o_proj").scheme.act_quant is None
    partial = fp8_config(dict(FP8_BLOCK, modules_to_not_convert=["model.layers.0.self_attn.q_proj"]))
    with pytest.raises(UnsupportedQuantization, match="only some of"):
        partial.linear_method("model.layers.0.self_attn.qkv_proj")
    ct_config = quant_config_of(SimpleNamespace(quantization_config=ct(ignore=["lm_head", "re:.*o_proj$"])))
    assert type(ct_config.linear_method("model.layers.2.self_attn.o_proj")).__name__ == "UnquantizedLinearMethod"
    assert ct_config.linear_method("model.layers.2.mlp.gate_up_proj").scheme.act_quant == "token"
    block = ct(
        weights={"strategy": "block", "block_structure": [128, 128]}, acts={"strategy": "group", "group_size": 128}
    )
    scheme = quant_config_of(SimpleNamespace(quantization_config=block)).scheme  # FP8_BLOCK: fp8's layers, weight_scale
    assert (scheme.weight_form, scheme.act_quant, scheme.scale_name) == ("block", "group128", "weight_scale")


def context(rank: int = 0, size: int = 1) -> ModelContext:
    comm = SimpleNamespace(rank=rank, world_size=size) if size > 1 else None
    return ModelContext(
        ops=hetero.load("cpu_ref"), parallel=Parallel(comm=comm), dtype=torch.float32, device=torch.device("cpu")
    )


def _checkpoint(tmp_path, shapes):
    gen, dense, tensors = torch.Generator().manual_seed(0), {}, {}
    for name, shape in shapes.items():
        q, s = quantize_blocks(torch.randn(*shape, generator=gen))
        tensors[f"{name}.weight"], tensors[f"{name}.weight_scale_inv"] = q, s.bfloat16()
        dense[name] = dequantize(q, s.bfloat16())
    tmp_path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return dense


_PACKED = WeightMapping(
    packed=(
        ("q_proj", "qkv_proj", "q"),
        ("k_proj", "qkv_proj", "k"),
        ("v_proj", "qkv_proj", "v"),
        ("gate_proj", "gate_up_proj", 0),
        ("up_proj", "gate_up_proj", 1),
    )
)


@pytest.mark.parametrize("rank", [0, 1])
def test_rank_shares_cut_block_scales_in_blocks(tmp_path, rank):
    H, D, I = 256, 64, 512  # 4 heads and 4 KV heads over 2 ranks: q, k, v 128 rows each per rank, a block apiece
    dense = _checkpoint(
        tmp_path,
        {
            "a.q_proj": (4 * D, H),
            "a.k_proj": (4 * D, H),
            "a.v_proj": (4 * D, H),
            "a.o_proj": (H, 4 * D),
            "m.gate_proj": (I, H),
            "m.up_proj": (I, H),
        },
    )
    ctx, quant = context(rank, 2), weights_only(fp8_config(FP8_BLOCK))
    model = nn.Module()
    model.mapping, model.a, model.m = _PACKED, nn.Module(), nn.Module()
    model.a.qkv_proj = QKVParallelLinear(ctx, H, D, 4, 4, prefix="a.qkv_proj", quant_config=quant)
    model.a.o_proj = RowParallelLinear(ctx, 4 * D, H, prefix="a.o_proj", quant_config=quant)
    model.m.gate_up_proj = MergedColumnParallelLinear(ctx, H, [I, I], prefix="m.gate_up_proj", quant_config=quant)
    load_weights(model, tmp_path)
    half = lambda name, n: dense[name][rank * n : (rank + 1) * n]  # noqa: E731
    want = {
        "a.qkv_proj": torch.cat([half(f"a.{p}_proj", 2 * D) for p in "qkv"]),
        "a.o_proj": dense["a.o_proj"][:, rank * 2 * D : (rank + 1) * 2 * D],
        "m.gate_up_proj": torch.cat([half("m.gate_proj", I // 2), half("m.up_proj", I // 2)]),
    }
    for path, w in want.items():
        torch.testing.assert_close(model.get_submodule(path).dense, w, rtol=0, atol=0)


def test_a_cut_inside_a_block_is_named(tmp_path):
    _checkpoint(tmp_path, {"m.gate_proj": (384, 256), "m.up_proj": (384, 256)})
    model = nn.Module()
    model.mapping, model.m = _PACKED, nn.Module()
    model.m.gate_up_proj = MergedColumnParallelLinear(
        context(0, 2), 256, [384, 384], prefix="m.gate_up_proj", quant_config=fp8_config(FP8_BLOCK)
    )
    with pytest.raises(WeightMismatchError, match=r"m\.gate_up_proj: splitting over 2 ranks leaves 192"):
        load_weights(model, tmp_path)
    model.m.gate_up_proj = MergedColumnParallelLinear(
        context(), 256, [192, 192], prefix="m.gate_up_proj", quant_config=fp8_config(FP8_BLOCK)
    )
    _checkpoint(tmp_path, {"m.gate_proj": (192, 256), "m.up_proj": (192, 256)})
    with pytest.raises(WeightMismatchError, match=r"m\.gate_up_proj: a packed shard starts at row 192"):
        load_weights(model, tmp_path)
    with pytest.raises(UnsupportedQuantization, match=r"layers\.1\.mlp\.experts: .* 32, is not a multiple of 128"):
        FusedMoE(
            context(),
            8,
            64,
            32,
            Routing(top_k=2),
            prefix="model.layers.1.mlp.experts",
            quant_config=fp8_config(FP8_BLOCK),
        )


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return tiny.build(
        "qwen3",
        tmp_path_factory.mktemp("cli") / "src",
        tokenizer=True,
        hidden_size=192,
        num_key_value_heads=4,
        intermediate_size=256,
    )


@pytest.mark.parametrize("scheme,method", [("fp8-block", "fp8"), ("int8-channel", "compressed-tensors")])
def test_quantize_command_and_the_quantization_line(src, tmp_path, capsys, scheme, method):
    dst = tmp_path / scheme
    assert main(["quantize", str(src), str(dst), "--scheme", scheme, "--scale-dtype", "bfloat16"]) == 0
    assert "kept in float: lm_head" in capsys.readouterr().out
    assert (dst / "tokenizer.json").is_file() and (dst / "model.safetensors.index.json").is_file()
    assert json.loads((dst / "config.json").read_text())["quantization_config"]["quant_method"] == method
    scales = {k: v for f in dst.glob("*.safetensors") for k, v in load_file(str(f)).items() if "scale" in k}
    assert scales and all(v.dtype == torch.bfloat16 for v in scales.values())
    args = ["generate", "--model", str(dst), "--backend", "cpu_ref", "--prompt-ids", "5 6 7", "--max-tokens", "2"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert f"quantization: {method}" in err and ("1x128 groups" if scheme == "fp8-block" else "int8 per token") in err
    assert main(args + ["--quantization", "awq"]) == 2
    assert "--quantization: expected the checkpoint's" in capsys.readouterr().err
    assert main(["quantize", str(dst), str(tmp_path / "again"), "--scheme", scheme]) == 2  # already quantized
    assert main(["quantize", str(dst), str(tmp_path / "deq"), "--dequantize"]) == 0
    assert "quantization_config" not in json.loads((tmp_path / "deq" / "config.json").read_text())


@pytest.mark.parametrize("scheme", ["fp8-block", "int8-channel"])
def test_expert_parallel_composition_matches_fused_moe(scheme):
    """The expert-parallel path (quantize_activation, scaled_grouped_gemm, silu_and_mul) computes what
    fused_moe's quantized mode does, on tokens sorted by expert (one expert each, weight 1)."""
    from hetero.engine.quant.compressed_tensors import compressed_tensors_config

    E, H, I = 4, 192, 128
    quant = fp8_config(FP8_BLOCK) if scheme == "fp8-block" else compressed_tensors_config(ct("int-quantized"))
    ctx = context()
    layer = FusedMoE(ctx, E, H, I, Routing(top_k=1), prefix="model.layers.1.mlp.experts", quant_config=quant)
    method, gen = layer.quant_method, torch.Generator().manual_seed(0)
    for e in range(E):
        for proj, rows, cols in (("gate", I, H), ("up", I, H), ("down", H, I)):
            w = torch.randn(rows, cols, generator=gen)
            q, s = quantize_blocks(w) if scheme == "fp8-block" else quantize_channels(w, torch.int8)
            layer.load_expert(layer.w2 if proj == "down" else layer.w13, q, (e, proj))
            scale = method.scales(layer)[proj == "down"]
            layer.load_expert(scale, s, (e, proj))
    method.process_weights_after_loading(layer)
    ctx.bind_op(layer, "_quant", "quantize_activation", dtype=layer.w13.dtype)
    ctx.bind_op(layer, "_scaled_grouped_gemm", "scaled_grouped_gemm")
    ctx.bind_op(layer, "_silu_and_mul", "silu_and_mul")
    ids = torch.tensor([0, 0, 1, 3, 3, 3])
    x = torch.randn(len(ids), H, generator=gen)
    fused = method.apply(layer, x, torch.ones(len(ids), 1), ids.view(-1, 1).int())
    grouped = method.apply_grouped(layer, x, torch.tensor([2, 3, 3, 6], dtype=torch.int32))
    assert rel_err(grouped, fused) < 1e-5


def rel_err(a, b):
    return float((a - b).norm() / b.norm())


def test_e4m3fn_to_fnuz_keeps_the_values():
    from hetero.engine.quant._qmath import e4m3fn_to_fnuz

    w = torch.randn(130, 140, generator=torch.Generator().manual_seed(1))
    q, s = quantize_blocks(w)
    q.view(torch.int8)[0, :3] = -128  # e4m3fn's -0
    fnuz, s2 = e4m3fn_to_fnuz(q, s.bfloat16())
    assert fnuz.dtype == torch.float8_e4m3fnuz and not fnuz.float().isnan().any()
    torch.testing.assert_close(dequantize(fnuz, s2), dequantize(q, s.bfloat16()), rtol=0, atol=0)


def test_check_model_compares_a_quantized_checkpoint_with_its_emulation(src, tmp_path, capsys):
    """check-model on an fp8 checkpoint: transformers on the dequantized copy with emulated activation
    quantization, at the quantized tolerance; a wrong scale in the engine is named by layer."""
    from hetero.tools.check import QUANTIZED_TOLERANCE, ModelCheck

    dst = tmp_path / "fp8"
    assert main(["quantize", str(src), str(dst), "--scheme", "fp8-block"]) == 0
    capsys.readouterr()
    assert main(["check-model", str(dst), "--backend", "cpu_ref", "--max-tokens", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tolerance"] == QUANTIZED_TOLERANCE and report["passed"]
    assert max(layer["rel_l2"] for layer in report["layers"]) < 2e-2
    check = ModelCheck(dst, "cpu_ref")
    check.model.model.layers[1].self_attn.o_proj.weight_scale_inv.data *= 1.2
    bad = check.run([[5, 6, 7, 8, 9]], max_tokens=0)
    assert bad.first_bad == "layer 1"
