"""Every module a model builds knows its checkpoint prefix, and a QuantConfig picks each layer's method by it."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors import safe_open

import hetero
from hetero.engine.context import ModelContext
from hetero.engine.layers.linear import Linear
from hetero.engine.layers.moe import FusedMoE
from hetero.engine.loader import checkpoint_name, map_name
from hetero.engine.models.deepseek import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from hetero.engine.models.qwen2 import Qwen2ForCausalLM
from hetero.engine.models.qwen3 import Qwen3ForCausalLM
from hetero.engine.models.qwen3_moe import Qwen3MoeForCausalLM
from hetero.engine.parallel import Parallel
from hetero.engine.quant import (
    QuantConfig,
    UnquantizedLinearMethod,
    UnquantizedMoEMethod,
    UnsupportedQuantization,
    quant_config_of,
)
from hetero.errors import UsageError
from hetero.tools import tiny

MODELS = {
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM,
    "deepseek_v2": DeepseekV2ForCausalLM,
    "deepseek_v3": DeepseekV3ForCausalLM,
}


@pytest.fixture(scope="module")
def ctx() -> ModelContext:
    return ModelContext(
        ops=hetero.load("cpu_ref"), parallel=Parallel(), dtype=torch.float32, device=torch.device("cpu")
    )


def build(arch: str, ctx: ModelContext, **overrides):
    return MODELS[arch](tiny.tiny_config(arch, **overrides), ctx)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_prefix_dot_parameter_is_the_parameters_name(ctx, arch, tied):
    model = build(arch, ctx, tie_word_embeddings=tied)
    names = dict(model.named_parameters(remove_duplicate=False))
    covered = set()
    for path, module in model.named_modules():
        own = list(module.named_parameters(recurse=False))
        if not own:
            continue
        assert module.prefix == path, type(module).__name__
        for name, param in own:
            full = f"{module.prefix}.{name}"
            assert names[full] is param, full
            covered.add(full)
    assert covered == set(names)  # shared Parameters too: the tied lm_head, V3's correction bias


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_parameters_cover_the_checkpoint_through_the_mapping(ctx, arch, tmp_path):
    """Every (parameter, shard) names one checkpoint tensor (the mapping reversed), and the mapping
    sends each of them back: the prefixes are the checkpoint's names."""
    path = tiny.build(arch, tmp_path / arch, shard_size=None)
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        on_disk = set(f.keys())
    model = build(arch, ctx)
    wanted = {checkpoint_name(model.mapping, n, s): (n, s) for n, p in model.named_parameters() for s in p.shards}
    assert set(wanted) == on_disk
    for name, (param, shard) in wanted.items():
        assert map_name(model.mapping, name) == (param, shard)


def test_quant_config_picks_methods_by_prefix(ctx):
    class Marked(UnquantizedLinearMethod):
        pass

    class MarkedMoE(UnquantizedMoEMethod):
        pass

    chosen = r"model\.layers\.\d+\.(self_attn|mlp)\.(?!gate$).*"
    config = QuantConfig(
        name="test",
        linear=((r".*\.mlp\.gate", UnquantizedLinearMethod), (chosen, Marked)),
        moe=((r"model\.layers\.2\.mlp\.experts", MarkedMoE),),
    )
    model = Qwen3MoeForCausalLM(tiny.tiny_config("qwen3_moe"), ctx, quant_config=config)
    assert model.quant_config is config
    linears = moes = 0
    for path, module in model.named_modules():
        if isinstance(module, Linear):
            linears += 1
            want = Marked if re.fullmatch(chosen, path) else UnquantizedLinearMethod
            assert type(module.quant_method) is want, path
        elif isinstance(module, FusedMoE):
            moes += 1
            assert type(module.quant_method) is (
                MarkedMoE if path.startswith("model.layers.2.") else UnquantizedMoEMethod
            )
    methods = [m.quant_method for m in model.modules() if isinstance(m, Linear)]
    # 3 layers of qkv_proj and o_proj, the routers of layers 0 and 2, layer 1's dense gate_up_proj and down_proj
    assert (
        linears == 3 * 2 + 2 + 2 and moes == 2 and len({id(m) for m in methods}) == len(methods)
    )  # one object per layer


def test_quantization_config_chooses_the_default(ctx):
    assert quant_config_of(tiny.tiny_config("qwen3")) == QuantConfig()
    config = tiny.tiny_config("qwen3")
    config.quantization_config = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    with pytest.raises(UnsupportedQuantization, match="'bitsandbytes' is not supported"):
        Qwen3ForCausalLM(config, ctx)
    assert issubclass(UnsupportedQuantization, UsageError)
