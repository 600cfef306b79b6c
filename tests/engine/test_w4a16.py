"""INT4 weight-only (W4A16) checkpoints of tiny Qwen3 and Qwen3-MoE against transformers on the dequantized
checkpoint (weight-only: only float summation order differs), on cpu_ref, torch and the Triton kernels
under the interpreter, with no op falling back.

Checkpoints: compressed-tensors ``pack-quantized`` written by the compressed-tensors package through
``hetero quantize`` (symmetric group 128, asymmetric group 32), GPTQ (v1 zero points with a partial last
group; gptq_v2 act-order with a permutation per weight and per expert) and AWQ, the last two written by
``_int4_writer`` from integer codes it chose. The oracle checkpoint must hold exactly what the package's
own decompressor (compressed-tensors) or the writer's codes (GPTQ, AWQ) mean.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from _int4_writer import AWQ_ORDER, pack_words, write
from _quant_oracle import OVERRIDES, PROMPTS, hf_logits, hf_model, rel
from safetensors.torch import load_file, save_file

import hetero
from hetero.cli import main
from hetero.engine.context import ModelContext
from hetero.engine.forward import build_model, prefill
from hetero.engine.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.parallel import Parallel
from hetero.engine.quant import UnsupportedQuantization, quant_config_of
from hetero.engine.quant._int4math import awq_weight, awq_zeros, ct_weight, ct_zero_point, unpack_int4
from hetero.errors import UsageError
from hetero.tools import tiny
from hetero.tools._quantize_int4 import quantize_int4
from hetero.tools.check import ModelCheck

#: (architecture, format, options): "ct" through ``hetero quantize --scheme``, else ``_int4_writer.write``
CASES = {
    "qwen3_moe-ct-g128": ("qwen3_moe", "ct", dict(scheme="w4a16-g128")),
    "qwen3-ct-g32-asym": ("qwen3", "ct", dict(scheme="w4a16-g32-asym")),
    "qwen3-gptq": ("qwen3", "gptq", dict(group=128)),  # K = 192 (OVERRIDES): a partial second group
    "qwen3_moe-gptq-act-order": ("qwen3_moe", "gptq", dict(group=32, symmetric=True, desc_act=True, v2=True)),
    "qwen3_moe-awq": ("qwen3_moe", "awq", dict(group=64)),
    "qwen3-awq": ("qwen3", "awq", dict(group=32)),
}
#: every K a whole number of 128-groups (compressed-tensors needs whole groups); two layers: MoE, then dense
SHAPES = {
    "qwen3": dict(hidden_size=128, intermediate_size=256),
    "qwen3_moe": dict(
        hidden_size=128, head_dim=32, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=2
    ),
}
EXACT = 2e-5  # float32 rounding: weight-only int4 dequantizes exactly


class Case:
    def __init__(self, key: str, root):
        self.key, (self.arch, self.fmt, opts) = key, CASES[key]
        overrides = OVERRIDES[self.arch] if key == "qwen3-gptq" else SHAPES[self.arch]
        self.src = tiny.build(self.arch, root / "src", shard_size=None, **overrides)
        self.q, self.deq = root / "q", root / "deq"
        if self.fmt == "ct":
            assert main(["quantize", str(self.src), str(self.q), "--scheme", opts["scheme"]]) == 0
            self.meant = None
        else:
            self.meant = write(self.src, self.q, self.fmt, **opts)
        assert main(["quantize", str(self.q), str(self.deq), "--dequantize"]) == 0
        self.hf = hf_model(self.deq)
        self.ref = hf_logits(self.hf, PROMPTS[:2])

    def int4_ops(self) -> tuple[str, ...]:
        """The ops a W4A16 model of this case runs its weights through (act-order experts: the grouped path)."""
        if self.arch != "qwen3_moe":
            return ("gemm",)
        if self.fmt == "gptq":
            return ("gemm", "grouped_gemm", "moe_permute", "moe_unpermute")
        return ("gemm", "fused_moe")


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory) -> Case:
    return Case(request.param, tmp_path_factory.mktemp(request.param))


def _ct_decompressed(path) -> dict[str, torch.Tensor]:
    """Every quantized module of a compressed-tensors checkpoint as the package's own decompressor reads it."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme

    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    scheme = QuantizationScheme.model_validate(qc["config_groups"]["group_0"])
    tensors, out = load_file(str(path / "model.safetensors")), {}
    for name in tensors:
        if name.endswith(".weight_packed"):
            base = name.removesuffix(".weight_packed")
            state = {k.rpartition(".")[2]: v for k, v in tensors.items() if k.rpartition(".")[0] == base}
            out[base] = BaseCompressor.get_value_from_registry(scheme.format).decompress(state, scheme)["weight"]
    return out


def _no_fallback(ops, *names: str) -> None:
    info = ops.explain()
    assert all(info[op].origin == "backend" and not info[op].reasons for op in names), {op: info[op] for op in names}


def test_the_oracle_holds_what_the_checkpoint_means(case):
    """The dequantized checkpoint equals compressed-tensors' own decompression, or the writer's codes."""
    expected = _ct_decompressed(case.q) if case.meant is None else case.meant
    deq = load_file(str(case.deq / "model.safetensors"))
    assert len(expected) >= 12 and all(torch.equal(deq[f"{base}.weight"], w) for base, w in expected.items())
    src = load_file(str(case.src / "model.safetensors"))
    assert all(not torch.equal(src[f"{base}.weight"], deq[f"{base}.weight"]) for base in expected)  # 4 bits
    qc = json.loads((case.q / "config.json").read_text())["quantization_config"]
    assert "quantization_config" not in json.loads((case.deq / "config.json").read_text())
    if case.fmt == "ct":
        assert qc["format"] == "pack-quantized" and "lm_head" in qc["ignore"]


def test_check_model_on_cpu_ref(case):
    """Every layer within check-model's float32 bound, greedy tokens within the top-5 rule; no fallback."""
    check = ModelCheck(case.q, "cpu_ref", reference_dir=case.deq)
    report = check.run(PROMPTS[:2], max_tokens=4)
    assert report.passed and max(layer.rel_l2 for layer in report.layers) < 1e-4, report.as_dict()
    qkv = check.model.model.layers[0].self_attn.qkv_proj
    assert qkv.run_weight.dtype == torch.uint8 and (qkv.column_order is not None) == ("act-order" in case.key)
    experts = check.model.model.layers[0].mlp.experts if case.arch == "qwen3_moe" else None
    if experts is not None:
        assert experts.run_w13.dtype == torch.uint8 and experts.run_w13_scale.dtype == torch.float32
    _no_fallback(check.ops, *case.int4_ops())


def test_torch_backend(case):
    ops = hetero.load("torch")
    got = prefill(build_model(case.q, ops, torch.float32), PROMPTS[:2]).logits
    assert max(rel(a, b) for a, b in zip(got, case.ref)) < EXACT
    _no_fallback(ops, *case.int4_ops())


@pytest.mark.parametrize("case", ["qwen3_moe-gptq-act-order", "qwen3_moe-awq"], indirect=True)
def test_triton_kernels_under_the_interpreter(case, triton_interpreter):
    cuda = hetero.load("cuda")
    got = prefill(build_model(case.q, cuda, torch.float32), PROMPTS[:1]).logits
    assert rel(got[0], case.ref[0]) < EXACT
    _no_fallback(cuda, *case.int4_ops())


def test_packed_layouts_read_as_compressed_tensors_reads_them():
    """The canonical conversions against compressed-tensors' own packer, and the test writer's AWQ order
    against compressed-tensors' AutoAWQ converter (a third reading of AWQ's interleaving)."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter

    gen = torch.Generator().manual_seed(0)
    n, k, groups = 13, 37, 3  # odd K (a padded last word and byte), N not a multiple of 8
    codes = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)
    assert torch.equal(unpack_int4(ct_weight(pack_to_int32(codes, 4), n, k), k), (codes + 8).to(torch.uint8))
    zp = torch.randint(-8, 8, (n, groups), generator=gen, dtype=torch.int8)
    assert torch.equal(ct_zero_point(pack_to_int32(zp, 4, packed_dim=0), n, groups), (zp + 8).to(torch.uint8))
    awq = torch.randint(0, 16, (k, 16), generator=gen)  # [K, N] codes of a 16-row weight
    qweight = pack_words(awq, AWQ_ORDER)
    theirs, _ = AutoAWQConverter.unpack_awq(qweight, None, 4)
    theirs, _ = AutoAWQConverter.reverse_awq_order(theirs, None, 4)
    assert torch.equal(theirs.long() & 0xF, awq)
    assert torch.equal(unpack_int4(awq_weight(qweight, 16, k), k), awq.T.to(torch.uint8))
    assert torch.equal(awq_zeros(qweight, 16, k), awq.T.to(torch.uint8))
    with pytest.raises(UsageError, match=r"m\.weight has 96 input columns, not a multiple of the group size 128"):
        quantize_int4("m.weight", torch.randn(4, 96), "w4a16-g128", torch.float32)  # whole groups only


def _qc(**extra):
    w = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True, "dynamic": False}
    group = {"targets": ["Linear"], "format": "pack-quantized", "weights": {**w, **extra.pop("weights", {})}}
    group.update(extra)
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": group}}


@pytest.mark.parametrize(
    "qc,match",
    [
        (_qc(weights={"num_bits": 8}), "pack-quantized.*8 bits"),
        (_qc(weights={"actorder": "group"}), "actorder 'group'"),
        (_qc(weights={"strategy": "tensor"}), "strategy 'tensor'"),
        (_qc(input_activations={"num_bits": 8, "type": "int", "dynamic": True}), "W4A8"),
        ({"quant_method": "gptq", "bits": 8}, "'gptq'.*bits 8"),
        ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "checkpoint_format 'marlin'"),
        ({"quant_method": "gptq", "bits": 4, "dynamic": {"-:.*": {}}}, "dynamic"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "version 'gemv'"),
        ({"quant_method": "awq", "bits": 4, "zero_point": False}, "zero_point false"),
    ],
)
def test_unsupported_int4_variants_are_refused_by_name(qc, match):
    with pytest.raises(UnsupportedQuantization, match=match):
        quant_config_of(SimpleNamespace(quantization_config=qc))


def context(rank: int = 0, size: int = 1, ep: bool = False) -> ModelContext:
    comm = SimpleNamespace(rank=rank, world_size=size) if size > 1 else None
    parallel = Parallel(comm=comm, expert_parallel=ep)
    return ModelContext(ops=hetero.load("cpu_ref"), parallel=parallel, dtype=torch.float32, device=torch.device("cpu"))


def test_tensor_parallel_cuts_fall_on_group_boundaries(tmp_path):
    """Rank 1 of 2 loads its rows (gate_up) and its group-aligned columns (down) of a compressed-tensors
    checkpoint exactly; a cut inside a group, or of an act-order weight, is refused by name."""
    from hetero.engine.loader import load_weights
    from hetero.engine.models.base import WeightMapping

    gen, tensors, g32 = torch.Generator().manual_seed(1), {}, _qc(weights={"group_size": 32, "symmetric": False})
    for name, shape in {"m.gate_proj": (64, 96), "m.up_proj": (64, 96), "m.down_proj": (96, 64)}.items():
        w = torch.randn(*shape, generator=gen)
        tensors.update(quantize_int4(f"{name}.weight", w, "w4a16-g32-asym", torch.float32))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": g32}))
    full, quant = _ct_decompressed(tmp_path), quant_config_of(SimpleNamespace(quantization_config=g32))
    model, ctx = torch.nn.Module(), context(1, 2)
    model.mapping = WeightMapping(packed=(("gate_proj", "gate_up_proj", 0), ("up_proj", "gate_up_proj", 1)))
    model.m = torch.nn.Module()
    model.m.gate_up_proj = MergedColumnParallelLinear(ctx, 96, [64, 64], prefix="m.gate_up_proj", quant_config=quant)
    model.m.down_proj = RowParallelLinear(ctx, 64, 96, prefix="m.down_proj", quant_config=quant)
    load_weights(model, tmp_path)
    gate_up = torch.cat([full["m.gate_proj"][32:], full["m.up_proj"][32:]])
    assert torch.equal(model.m.gate_up_proj.quant_method.dense_weight(model.m.gate_up_proj), gate_up)
    assert torch.equal(model.m.down_proj.quant_method.dense_weight(model.m.down_proj), full["m.down_proj"][:, 32:])
    g128 = quant_config_of(SimpleNamespace(quantization_config=_qc()))
    with pytest.raises(UnsupportedQuantization, match=r"m\.down_proj: .*shard width of 96.*group size 128"):
        RowParallelLinear(context(0, 2), 192, 64, prefix="m.down_proj", quant_config=g128)
    with pytest.raises(UnsupportedQuantization, match=r"layers\.1\.mlp\.experts: .*shard width of 96"):
        FusedMoE(context(0, 2), 4, 64, 192, Routing(top_k=2), prefix="model.layers.1.mlp.experts", quant_config=g128)
    act_order = quant_config_of(SimpleNamespace(quantization_config=dict(quant_method="gptq", bits=4, desc_act=True)))
    with pytest.raises(UnsupportedQuantization, match=r"m\.o_proj: GPTQ act-order"):
        RowParallelLinear(context(0, 2), 256, 64, prefix="m.o_proj", quant_config=act_order)
    FusedMoE(context(0, 2, ep=True), 4, 64, 192, Routing(top_k=2), prefix="e", quant_config=act_order)  # whole experts
