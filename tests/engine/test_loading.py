"""hetero.engine.loader against tiny transformers checkpoints, with small models built from the real layers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import hetero
from hetero.engine.context import ModelContext
from hetero.engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear, copy_checked
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.loader import (
    INDEX,
    CheckpointFilesError,
    MissingWeightsError,
    UnexpectedWeightsError,
    WeightLoadError,
    WeightMismatchError,
    checkpoint_name,
    load_weights,
    map_name,
    render_pattern,
)
from hetero.engine.models.base import CausalLM, WeightMapping
from hetero.engine.parallel import Parallel
from hetero.tools import tiny

EXPERT = r"model\.layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<expert>\d+)\.{}_proj\.weight"
EXPERTS = tuple(
    (EXPERT.format(p), "model.layers.{layer}.mlp.experts." + ("w2" if p == "down" else "w13"), p)
    for p in ("gate", "up", "down")
)


# ---------------------------------------------------------------- test models


class Table(nn.Module):
    """A plain parameter; with ``loader`` False it has no weight_loader/shards (the loader's default path)."""

    def __init__(self, rows: int, cols: int, loader: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.full((rows, cols), float("nan")), requires_grad=False)
        if loader:
            self.weight.weight_loader = lambda p, t, shard=None: copy_checked(p, t, "Table")
            self.weight.shards = (None,)


class Layer(nn.Module):
    def __init__(self, c, ctx: ModelContext):
        super().__init__()
        H, D = c.hidden_size, c.head_dim
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = QKVParallelLinear(ctx, H, D, c.num_attention_heads, c.num_key_value_heads)
        self.self_attn.o_proj = RowParallelLinear(ctx, c.num_attention_heads * D, H)
        self.self_attn.q_norm, self.self_attn.k_norm = RMSNorm(ctx, D, 1e-6), RMSNorm(ctx, D, 1e-6)
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = MergedColumnParallelLinear(ctx, H, [c.intermediate_size] * 2)
        self.mlp.down_proj = RowParallelLinear(ctx, c.intermediate_size, H)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(ctx, H, 1e-6), RMSNorm(ctx, H, 1e-6)


class TinyQwen3(CausalLM):
    """The parameter names of a Qwen3 checkpoint, with packed qkv and gate_up."""

    mapping = WeightMapping(
        packed=(
            ("q_proj", "qkv_proj", "q"),
            ("k_proj", "qkv_proj", "k"),
            ("v_proj", "qkv_proj", "v"),
            ("gate_proj", "gate_up_proj", 0),
            ("up_proj", "gate_up_proj", 1),
        ),
        ignore=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"model\.layers\.9\..*"),
    )

    def __init__(self, c, ctx: ModelContext):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = Table(c.vocab_size, c.hidden_size)
        self.model.layers = nn.ModuleList(Layer(c, ctx) for _ in range(c.num_hidden_layers))
        self.model.norm = RMSNorm(ctx, c.hidden_size, 1e-6)
        self.lm_head = Table(c.vocab_size, c.hidden_size, loader=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight


class Experts(nn.Module):
    """w13 [E, 2I, H] (gate rows, then up rows) and w2 [E, H, I]; this rank holds experts [first, first + local)."""

    def __init__(self, E: int, I: int, H: int, first: int, local: int):
        super().__init__()
        self.first, self.local, self.I = first, local, I
        self.w13 = nn.Parameter(torch.full((local, 2 * I, H), float("nan")), requires_grad=False)
        self.w2 = nn.Parameter(torch.full((local, H, I), float("nan")), requires_grad=False)
        mine = range(first, first + local)
        self.w13.weight_loader, self.w13.shards = self.load, tuple((e, p) for e in mine for p in ("gate", "up"))
        self.w2.weight_loader, self.w2.shards = self.load, tuple((e, "down") for e in mine)

    def load(self, param, tensor, shard):
        expert, proj = shard
        e = expert - self.first
        if not 0 <= e < self.local:
            return False
        dst = param.data[e] if proj == "down" else param.data[e, (proj == "up") * self.I :][: self.I]
        copy_checked(dst, tensor, f"expert {expert} {proj}")
        return True


class TinyMoeExperts(CausalLM):
    """Only the routed experts of a Qwen3-MoE checkpoint (everything else is ignored)."""

    mapping = WeightMapping(experts=EXPERTS, ignore=(r"(?!.*\.mlp\.experts\.\d+\.).*",))

    def __init__(self, c, rank: int = 0, ranks: int = 1):
        super().__init__()
        E, local = c.num_local_experts, c.num_local_experts // ranks
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(nn.Module() for _ in range(c.num_hidden_layers))
        for i, layer in enumerate(self.model.layers):
            if i not in c.mlp_only_layers:
                layer.mlp = nn.Module()
                layer.mlp.experts = Experts(E, c.moe_intermediate_size, c.hidden_size, rank * local, local)


# ---------------------------------------------------------------- checkpoints and helpers


@pytest.fixture(scope="module")
def ctx() -> ModelContext:
    return ModelContext(
        ops=hetero.load("cpu_ref"), parallel=Parallel(), dtype=torch.float32, device=torch.device("cpu")
    )


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> SimpleNamespace:
    """Checkpoints no test modifies (tests that edit one copy it first)."""
    root = tmp_path_factory.mktemp("ckpt")
    return SimpleNamespace(
        sharded=tiny.build("qwen3", root / "sharded", shard_size="20KB"),
        single=tiny.build("qwen3", root / "single", shard_size=None),
        tied=tiny.build("qwen3", root / "tied", shard_size="20KB", tie_word_embeddings=True),
        moe=tiny.build("qwen3_moe", root / "moe", shard_size="20KB"),
    )


def config(path: Path) -> SimpleNamespace:
    return SimpleNamespace(**json.loads((path / "config.json").read_text()))


def tensors(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in path.glob("*.safetensors"):
        out.update(load_file(f))
    return out


def edit(src: Path, dst: Path, drop=(), replace=None, add=None) -> Path:
    """Copy a checkpoint, dropping/replacing tensors in place and writing ``add`` to a new file in the index."""
    shutil.copytree(src, dst)
    index = json.loads((dst / INDEX).read_text()) if (dst / INDEX).exists() else None
    for f in sorted(dst.glob("*.safetensors")):
        data = load_file(f)
        if not set(data) & ({*drop} | set(replace or {})):
            continue
        data = {k: (replace or {}).get(k, v) for k, v in data.items() if k not in drop}
        f.unlink()
        if data:
            save_file(data, f, metadata={"format": "pt"})
    if add:
        save_file(add, dst / "extra.safetensors", metadata={"format": "pt"})
    if index is not None:
        wm = {k: v for k, v in index["weight_map"].items() if k not in drop and (dst / v).exists()}
        index["weight_map"] = {**wm, **{k: "extra.safetensors" for k in add or {}}}
        (dst / INDEX).write_text(json.dumps(index))
    return dst


# ---------------------------------------------------------------- name mapping


def test_render_pattern_reverses_the_expert_regexes():
    for pattern, _, proj in EXPERTS:
        assert render_pattern(pattern, layer=2, expert=5) == f"model.layers.2.mlp.experts.5.{proj}_proj.weight"
    assert render_pattern(r"model\.layers\.(?P<layer>\d+)\.(gate|up)_proj", layer=1) is None
    assert render_pattern(EXPERTS[0][0], layer=1) is None  # no value for "expert"
    m = WeightMapping(experts=EXPERTS)
    assert map_name(m, "model.layers.4.mlp.experts.7.up_proj.weight") == ("model.layers.4.mlp.experts.w13", (7, "up"))
    assert (
        checkpoint_name(m, "model.layers.4.mlp.experts.w2", (3, "down"))
        == "model.layers.4.mlp.experts.3.down_proj.weight"
    )


def test_packed_names_reverse():
    m = TinyQwen3.mapping
    assert map_name(m, "model.layers.0.self_attn.k_proj.weight") == ("model.layers.0.self_attn.qkv_proj.weight", "k")
    assert map_name(m, "model.layers.0.self_attn.rotary_emb.inv_freq") is None
    assert map_name(m, "x.model.layers.9.y") == ("x.model.layers.9.y", None)  # ignore rules are fullmatch
    assert (
        checkpoint_name(m, "model.layers.0.self_attn.qkv_proj.weight", "k") == "model.layers.0.self_attn.k_proj.weight"
    )
    assert checkpoint_name(m, "model.layers.1.mlp.gate_up_proj.weight", 1) == "model.layers.1.mlp.up_proj.weight"


# ---------------------------------------------------------------- loading


@pytest.mark.parametrize("which", ["sharded", "single"])
def test_loads_every_tensor_at_its_offset(ckpts, ctx, which):
    path = getattr(ckpts, which)
    c, want = config(path), tensors(path)
    model = TinyQwen3(c, ctx)
    report = load_weights(model, path)
    assert report.loaded == len(want) and not report.ignored and report.skipped_experts == 0
    assert len(report.files) == len(list(path.glob("*.safetensors"))) and (len(report.files) > 1) == (
        which == "sharded"
    )
    params = dict(model.named_parameters())
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([want[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        torch.testing.assert_close(params[p + "self_attn.qkv_proj.weight"], qkv, rtol=0, atol=0)
        gate_up = torch.cat([want[p + "mlp.gate_proj.weight"], want[p + "mlp.up_proj.weight"]])
        torch.testing.assert_close(params[p + "mlp.gate_up_proj.weight"], gate_up, rtol=0, atol=0)
    for name in want:
        if name in params:
            torch.testing.assert_close(params[name], want[name], rtol=0, atol=0)
    assert sum(n in params for n in want) == len(want) - 5 * c.num_hidden_layers


@pytest.mark.parametrize("which", ["sharded", "single"])
def test_missing_tensor_is_named_by_its_checkpoint_name(ckpts, ctx, tmp_path, which):
    src = getattr(ckpts, which)
    gone = ["model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight"]
    path = edit(src, tmp_path / "ck", drop=gone)
    with pytest.raises(MissingWeightsError) as e:
        load_weights(TinyQwen3(config(path), ctx), path)
    assert e.value.missing == sorted(gone) and not e.value.unexpected
    assert all(f"  {g}\n" in str(e.value) + "\n" for g in gone)
    assert "TinyQwen3" in str(e.value) and str(path) in str(e.value)


def test_unexpected_tensors_are_all_listed(ckpts, ctx, tmp_path):
    extra = {
        "model.zzz.weight": torch.zeros(2),
        "model.layers.0.self_attn.extra.weight": torch.zeros(2),
        "model.layers.0.mlp.gate_proj.bias": torch.zeros(2),
    }  # maps to a gate_up_proj.bias that does not exist
    path = edit(ckpts.sharded, tmp_path / "ck", add=extra)
    with pytest.raises(UnexpectedWeightsError) as e:
        load_weights(TinyQwen3(config(path), ctx), path)
    assert e.value.unexpected == sorted(extra)
    assert all(n in str(e.value) for n in extra) and "TinyQwen3" in str(e.value)


def test_all_problems_reported_at_once(ckpts, ctx, tmp_path):
    path = edit(ckpts.single, tmp_path / "ck", drop=["model.norm.weight"], add={"model.zzz": torch.zeros(1)})
    with pytest.raises(WeightLoadError) as e:
        load_weights(TinyQwen3(config(path), ctx), path)
    assert isinstance(e.value, UnexpectedWeightsError)
    assert e.value.unexpected == ["model.zzz"] and e.value.missing == ["model.norm.weight"]
    assert "model.zzz" in str(e.value) and "model.norm.weight" in str(e.value)


def test_ignored_tensors_load_fine(ckpts, ctx, tmp_path):
    extra = {
        "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(16),
        "model.layers.9.mlp.gate_proj.weight": torch.ones(2, 2),
    }  # an MTP-like layer the mapping ignores
    path = edit(ckpts.sharded, tmp_path / "ck", add=extra)
    report = load_weights(TinyQwen3(config(path), ctx), path)
    assert sorted(report.ignored) == sorted(extra)


def test_shape_mismatch_names_tensor_file_and_parameter(ckpts, ctx, tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    path = edit(ckpts.sharded, tmp_path / "ck", replace={name: torch.zeros(3, 5)})
    file = json.loads((path / INDEX).read_text())["weight_map"][name]
    with pytest.raises(WeightMismatchError) as e:
        load_weights(TinyQwen3(config(path), ctx), path)
    msg = str(e.value)
    assert name in msg and file in msg and "model.layers.0.mlp.gate_up_proj.weight" in msg and "(3, 5)" in msg
    assert not e.value.missing  # the refused tensor is not reported twice


def test_index_naming_a_missing_file(ckpts, ctx, tmp_path):
    path = shutil.copytree(ckpts.sharded, tmp_path / "ck")
    victim = sorted(path.glob("*.safetensors"))[2]
    victim.unlink()
    with pytest.raises(CheckpointFilesError, match=victim.name):
        load_weights(TinyQwen3(config(path), ctx), path)


def test_pickled_checkpoints_are_refused_unopened(ckpts, ctx, tmp_path, monkeypatch):
    def no_unpickling(*a, **k):
        raise AssertionError("torch.load called")

    monkeypatch.setattr(torch, "load", no_unpickling)
    shutil.copy(ckpts.single / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not really a pickle")
    model = TinyQwen3(config(tmp_path), ctx)
    with pytest.raises(CheckpointFilesError, match="safetensors only.*never unpickles") as e:
        load_weights(model, tmp_path)
    assert "pytorch_model.bin" in str(e.value)
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(CheckpointFilesError, match="no safetensors") as e:
        load_weights(model, tmp_path)
    assert str(tmp_path) in str(e.value)


def test_tied_embeddings_with_and_without_lm_head(ckpts, ctx, tmp_path):
    path = ckpts.tied
    c, want = config(path), tensors(path)
    assert c.tie_word_embeddings and "lm_head.weight" not in want
    model = TinyQwen3(c, ctx)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    load_weights(model, path)
    torch.testing.assert_close(model.lm_head.weight, want["model.embed_tokens.weight"], rtol=0, atol=0)

    other = edit(path, tmp_path / "ck", add={"lm_head.weight": torch.zeros_like(want["model.embed_tokens.weight"])})
    model = TinyQwen3(c, ctx)
    report = load_weights(model, other)
    assert report.ignored == ["lm_head.weight"]  # the embedding, the Parameter's first name, wins
    torch.testing.assert_close(model.lm_head.weight, want["model.embed_tokens.weight"], rtol=0, atol=0)

    only_head = edit(
        path,
        tmp_path / "ck2",
        drop=["model.embed_tokens.weight"],
        add={"lm_head.weight": want["model.embed_tokens.weight"]},
    )
    model = TinyQwen3(c, ctx)
    assert not load_weights(model, only_head).ignored
    torch.testing.assert_close(model.model.embed_tokens.weight, want["model.embed_tokens.weight"], rtol=0, atol=0)


# ---------------------------------------------------------------- experts


@pytest.mark.parametrize("rank,ranks", [(0, 1), (1, 2)])
def test_experts_stack_into_w13_and_w2(ckpts, rank, ranks):
    path = ckpts.moe
    c, want = config(path), tensors(path)
    model = TinyMoeExperts(c, rank, ranks)
    report = load_weights(model, path)
    moe_layers = [i for i in range(c.num_hidden_layers) if i not in c.mlp_only_layers]
    total = 3 * c.num_local_experts * len(moe_layers)
    assert report.loaded == total // ranks and report.skipped_experts == total - total // ranks
    for i in moe_layers:
        experts = model.model.layers[i].mlp.experts
        for e in range(c.num_local_experts // ranks):
            p = f"model.layers.{i}.mlp.experts.{e + experts.first}."
            w13 = torch.cat([want[p + "gate_proj.weight"], want[p + "up_proj.weight"]])
            torch.testing.assert_close(experts.w13[e], w13, rtol=0, atol=0)
            torch.testing.assert_close(experts.w2[e], want[p + "down_proj.weight"], rtol=0, atol=0)


def test_missing_expert_is_named_by_its_checkpoint_name(ckpts, tmp_path):
    gone = ["model.layers.2.mlp.experts.3.up_proj.weight", "model.layers.0.mlp.experts.7.down_proj.weight"]
    path = edit(ckpts.moe, tmp_path / "ck", drop=gone)
    with pytest.raises(MissingWeightsError) as e:
        load_weights(TinyMoeExperts(config(path)), path)
    assert e.value.missing == sorted(gone)
    # on rank 1 of 2 (experts 4-7), expert 3 is another rank's business
    with pytest.raises(MissingWeightsError) as e:
        load_weights(TinyMoeExperts(config(path), 1, 2), path)
    assert e.value.missing == ["model.layers.0.mlp.experts.7.down_proj.weight"]
