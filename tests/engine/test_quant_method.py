"""Quantization methods: a block-scaled test format (the shape fp8 checkpoints have) loads through the
method's shard rules at any tensor-parallel rank, expert scales map by suffix, and the post-load pass
runs after every load (MLA's absorbed weights included)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import hetero
from hetero.engine.context import ModelContext
from hetero.engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.loader import MissingWeightsError, WeightMismatchError, checkpoint_name, load_weights, map_name
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.deepseek import DeepseekV3ForCausalLM
from hetero.engine.models.qwen3 import Qwen3ForCausalLM
from hetero.engine.parallel import Parallel
from hetero.engine.quant import LinearMethod, MoEMethod, QuantConfig, register_weight
from hetero.tools import tiny

B = 4  # block size of the test format


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> int8 [N, K] and one float32 scale per B x B block [ceil(N/B), ceil(K/B)]."""
    n, k = w.shape
    padded = torch.zeros(cdiv(n, B) * B, cdiv(k, B) * B)
    padded[:n, :k] = w
    blocks = padded.view(cdiv(n, B), B, cdiv(k, B), B)
    scale = blocks.abs().amax(dim=(1, 3)) / 127
    q = (blocks / scale[:, None, :, None]).round().view(padded.shape)[:n, :k].to(torch.int8)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.repeat_interleave(B, 0).repeat_interleave(B, 1)[: q.shape[0], : q.shape[1]]


class Int8BlockLinear(LinearMethod):
    """A test format: int8 ``weight`` and ``weight_scale_inv`` (one float32 scale per B x B block),
    dequantized once by the post-load pass. Scales are placed in block units."""

    def create_weights(self, layer, in_features, out_features):
        kw = dict(loader=layer.load_weight, shards=layer.shard_ids, output_dim=0, input_dim=1)
        register_weight(layer, "weight", torch.empty(out_features, in_features, dtype=torch.int8), **kw)
        register_weight(layer, "weight_scale_inv", torch.empty(cdiv(out_features, B), cdiv(in_features, B)), **kw)
        layer.ctx.bind_op(layer, "_gemm", "gemm")
        layer.dense, layer.processed = None, 0

    def shard_range(self, layer, param, dim, start, size):
        if param is not layer.weight_scale_inv:
            return start, size
        assert start % B == 0, "a packed shard starts on a block"
        return start // B, cdiv(size, B)

    def process_weights_after_loading(self, layer):
        layer.dense, layer.processed = dequantize(layer.weight, layer.weight_scale_inv), layer.processed + 1

    def apply(self, layer, x, bias=None):
        return layer._gemm(x, layer.dense, bias=bias)

    def dense_weight(self, layer):
        return layer.dense


class Int8BlockMoE(MoEMethod):
    """The same format for stacked experts: ``w13``/``w2`` int8 plus
    ``w13_weight_scale_inv``/``w2_weight_scale_inv``."""

    def create_weights(self, layer, num_experts, hidden, intermediate):
        for name, shape, projs in (
            ("w13", (2 * intermediate, hidden), ("gate", "up")),
            ("w2", (hidden, intermediate), ("down",)),
        ):
            kw = dict(loader=layer.load_expert, shards=layer.expert_shards(projs))
            register_weight(layer, name, torch.empty(num_experts, *shape, dtype=torch.int8), **kw)
            register_weight(
                layer, f"{name}_weight_scale_inv", torch.empty(num_experts, cdiv(shape[0], B), cdiv(shape[1], B)), **kw
            )
        layer.ctx.bind_op(layer, "_fused_moe", "fused_moe", activation="silu")

    def shard_range(self, layer, param, dim, start, size):
        return (start, size) if param.dtype == torch.int8 else (start // B, cdiv(size, B))

    def process_weights_after_loading(self, layer):
        for name in ("w13", "w2"):
            q, s = getattr(layer, name), getattr(layer, f"{name}_weight_scale_inv")
            setattr(layer, f"{name}_dense", torch.stack([dequantize(q[e], s[e]) for e in range(q.shape[0])]))

    def apply(self, layer, x, weights, ids):
        return layer._fused_moe(x, layer.w13_dense, layer.w2_dense, weights, ids)


def context(rank: int = 0, size: int = 1) -> ModelContext:
    """A context at ``rank`` of ``size``: loading only reads the rank (no collective runs here)."""
    comm = SimpleNamespace(rank=rank, world_size=size) if size > 1 else None
    return ModelContext(
        ops=hetero.load("cpu_ref"), parallel=Parallel(comm=comm), dtype=torch.float32, device=torch.device("cpu")
    )


def write(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


def quantized_checkpoint(names_shapes: dict[str, tuple[int, int]], seed: int = 0) -> tuple[dict, dict]:
    """Random float weights, and the checkpoint: each as int8 ``.weight`` + ``.weight_scale_inv``."""
    gen = torch.Generator().manual_seed(seed)
    dense, ckpt = {}, {}
    for name, shape in names_shapes.items():
        q, s = quantize(torch.randn(*shape, generator=gen))
        ckpt[f"{name}.weight"], ckpt[f"{name}.weight_scale_inv"] = q, s
        dense[name] = dequantize(q, s)
    return dense, ckpt


# ---------------------------------------------------------------- dtypes


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> dict[str, torch.Tensor]:
    return load_file(tiny.build("qwen3", tmp_path_factory.mktemp("qwen3"), shard_size=None) / "model.safetensors")


@pytest.mark.parametrize(
    "name,dtype",
    [
        ("model.layers.0.mlp.down_proj.weight", torch.float8_e4m3fn),
        ("model.layers.1.self_attn.k_proj.weight", torch.int8),
        ("model.norm.weight", torch.uint8),
    ],
)
def test_quantized_tensor_is_never_cast_into_a_float_parameter(qwen3, tmp_path, name, dtype):
    path = write(tmp_path, {**qwen3, name: qwen3[name].to(dtype)})
    model = Qwen3ForCausalLM(tiny.tiny_config("qwen3"), context())
    with pytest.raises(WeightMismatchError) as e:
        load_weights(model, path)
    msg, param = str(e.value), map_name(model.mapping, name)[0]
    assert name in msg and f"parameter {param}" in msg and str(dtype) in msg and "expects torch.float32" in msg
    assert len(e.value.mismatched) == 1 and not e.value.missing


def test_float_tensors_of_another_width_are_cast(qwen3, tmp_path):
    name = "model.layers.0.mlp.down_proj.weight"
    path = write(tmp_path, {**qwen3, name: qwen3[name].to(torch.bfloat16)})
    model = Qwen3ForCausalLM(tiny.tiny_config("qwen3"), context())
    load_weights(model, path)
    torch.testing.assert_close(
        model.model.layers[0].mlp.down_proj.weight, qwen3[name].bfloat16().float(), rtol=0, atol=0
    )


# ---------------------------------------------------------------- linear layers


@pytest.mark.parametrize("rank", [0, 1])
def test_block_scaled_linears_load_their_rank_in_block_units(tmp_path, rank):
    H, D, I = 8, 4, 16  # hidden, head_dim, intermediate: 4 heads and 2 KV heads over 2 ranks
    dense, ckpt = quantized_checkpoint(
        {
            "attn.q_proj": (4 * D, H),
            "attn.k_proj": (2 * D, H),
            "attn.v_proj": (2 * D, H),
            "attn.o_proj": (H, 4 * D),
            "mlp.gate_proj": (I, H),
            "mlp.up_proj": (I, H),
            "mlp.down_proj": (H, I),
        }
    )
    ctx, quant = context(rank, 2), QuantConfig(linear=((r".*", Int8BlockLinear),))
    model = nn.Module()
    model.mapping = WeightMapping(
        packed=(
            ("q_proj", "qkv_proj", "q"),
            ("k_proj", "qkv_proj", "k"),
            ("v_proj", "qkv_proj", "v"),
            ("gate_proj", "gate_up_proj", 0),
            ("up_proj", "gate_up_proj", 1),
        )
    )
    model.attn, model.mlp = nn.Module(), nn.Module()
    model.attn.qkv_proj = QKVParallelLinear(ctx, H, D, 4, 2, prefix="attn.qkv_proj", quant_config=quant)
    model.attn.o_proj = RowParallelLinear(ctx, 4 * D, H, prefix="attn.o_proj", quant_config=quant)
    model.mlp.gate_up_proj = MergedColumnParallelLinear(ctx, H, [I, I], prefix="mlp.gate_up_proj", quant_config=quant)
    model.mlp.down_proj = RowParallelLinear(ctx, I, H, prefix="mlp.down_proj", quant_config=quant)
    report = load_weights(model, write(tmp_path, ckpt))
    assert report.loaded == len(ckpt)

    def rows(name, n):
        return dense[name][rank * n : (rank + 1) * n]

    expect = {
        "attn.qkv_proj": torch.cat([rows("attn.q_proj", 2 * D), rows("attn.k_proj", D), rows("attn.v_proj", D)]),
        "attn.o_proj": dense["attn.o_proj"][:, rank * 2 * D : (rank + 1) * 2 * D],
        "mlp.gate_up_proj": torch.cat([rows("mlp.gate_proj", I // 2), rows("mlp.up_proj", I // 2)]),
        "mlp.down_proj": dense["mlp.down_proj"][:, rank * I // 2 : (rank + 1) * I // 2],
    }
    for path, want in expect.items():
        layer = model.get_submodule(path)
        assert layer.processed == 1 and layer.weight.dtype == torch.int8
        torch.testing.assert_close(layer.dense, want, rtol=0, atol=0)
    x = torch.randn(3, H)
    torch.testing.assert_close(model.mlp.gate_up_proj(x), x @ expect["mlp.gate_up_proj"].T)
    load_weights(model, tmp_path)  # the pass runs again after every load
    assert model.attn.qkv_proj.processed == 2


# ---------------------------------------------------------------- experts

EXPERTS = WeightMapping.stacked_experts()
W13_SCALE = "model.layers.0.mlp.experts.w13_weight_scale_inv"


def test_expert_rules_map_any_suffix():
    mapping = WeightMapping(experts=EXPERTS)
    name = "model.layers.0.mlp.experts.3.gate_proj.weight_scale_inv"
    assert map_name(mapping, name) == (W13_SCALE, (3, "gate"))
    assert checkpoint_name(mapping, W13_SCALE, (3, "gate")) == name
    assert map_name(mapping, "model.layers.5.mlp.experts.0.down_proj.weight") == (
        "model.layers.5.mlp.experts.w2",
        (0, "down"),
    )
    assert map_name(mapping, "model.layers.5.mlp.experts.1.up_proj.bias") == (
        "model.layers.5.mlp.experts.w13_bias",
        (1, "up"),
    )
    assert (
        checkpoint_name(mapping, "model.layers.5.mlp.experts.w2", (2, "down"))
        == "model.layers.5.mlp.experts.2.down_proj.weight"
    )


class MoeModel(nn.Module):
    mapping = WeightMapping(experts=EXPERTS)

    def __init__(self, ctx: ModelContext, E: int, H: int, I: int):
        super().__init__()
        quant = QuantConfig(moe=((r"model\.layers\.\d+\.mlp\.experts", Int8BlockMoE),))
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([nn.Module()])
        self.model.layers[0].mlp = nn.Module()
        self.model.layers[0].mlp.experts = FusedMoE(
            ctx, E, H, I, Routing(top_k=2), prefix="model.layers.0.mlp.experts", quant_config=quant
        )


@pytest.mark.parametrize("rank,size", [(0, 1), (1, 2)])
def test_expert_scales_stack_by_suffix(tmp_path, rank, size):
    E, H, I = 4, 8, 8
    shapes = {
        f"model.layers.0.mlp.experts.{e}.{p}_proj": ((H, I) if p == "down" else (I, H))
        for e in range(E)
        for p in ("gate", "up", "down")
    }
    dense, ckpt = quantized_checkpoint(shapes)
    model = MoeModel(context(rank, size), E, H, I)
    assert load_weights(model, write(tmp_path, ckpt)).loaded == len(ckpt)
    experts, part = model.model.layers[0].mlp.experts, I // size
    for e in range(E):
        p = f"model.layers.0.mlp.experts.{e}."
        gate_up = torch.cat([dense[p + x][rank * part : (rank + 1) * part] for x in ("gate_proj", "up_proj")])
        torch.testing.assert_close(experts.w13_dense[e], gate_up, rtol=0, atol=0)
        torch.testing.assert_close(
            experts.w2_dense[e], dense[p + "down_proj"][:, rank * part : (rank + 1) * part], rtol=0, atol=0
        )
    if size == 1:  # the method's apply runs the dequantized experts
        x, logits = torch.randn(5, H), torch.randn(5, E)
        weights, ids = torch.softmax(logits, -1).topk(2)
        weights = weights / weights.sum(-1, keepdim=True)
        want = torch.zeros(5, H)
        for t in range(5):
            for w, e in zip(weights[t], ids[t]):
                gate, up = (x[t] @ experts.w13_dense[e].T).chunk(2)
                want[t] += w * ((torch.nn.functional.silu(gate) * up) @ experts.w2_dense[e].T)
        torch.testing.assert_close(experts(x, logits), want, rtol=1e-5, atol=1e-5)


def test_missing_expert_scale_is_named_by_its_checkpoint_name(tmp_path):
    shapes = {f"model.layers.0.mlp.experts.{e}.{p}_proj": (4, 4) for e in range(2) for p in ("gate", "up", "down")}
    _, ckpt = quantized_checkpoint(shapes)
    gone = "model.layers.0.mlp.experts.1.up_proj.weight_scale_inv"
    del ckpt[gone]
    with pytest.raises(MissingWeightsError) as e:
        load_weights(MoeModel(context(), 2, 4, 4), write(tmp_path, ckpt))
    assert e.value.missing == [gone]


# ---------------------------------------------------------------- the post-load pass and MLA


def test_mla_absorbs_after_every_load(tmp_path):
    path = tiny.build("deepseek_v3", tmp_path / "a", shard_size=None)
    model = DeepseekV3ForCausalLM(tiny.tiny_config("deepseek_v3"), context())
    attn = model.model.layers[0].self_attn
    assert attn.w_uk_t is None
    load_weights(model, path)
    h, nope, lkv = attn.num_heads, attn.nope, attn.kv_lora_rank
    per_head = attn.kv_b_proj.weight.detach().view(h, nope + attn.v_dim, lkv)
    torch.testing.assert_close(attn.w_uk_t, per_head[:, :nope].transpose(1, 2), rtol=0, atol=0)
    torch.testing.assert_close(attn.w_uv, per_head[:, nope:], rtol=0, atol=0)
    assert attn.w_uk_t.is_contiguous() and attn.w_uv.is_contiguous()
    before = attn.w_uv.clone()
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.self_attn.kv_b_proj.weight"] *= 2
    load_weights(model, write(tmp_path / "b", tensors))
    torch.testing.assert_close(attn.w_uv, 2 * before, rtol=0, atol=0)
