"""8-bit checkpoints (fp8 block, compressed-tensors fp8 / int8 per channel) on cpu_ref against transformers.

Each case is a tiny float checkpoint, its ``hetero quantize`` copy and the float checkpoint hetero's own
dequantizer writes from that copy. Weight loading is checked exactly (activation quantization off: hetero
on the 8-bit copy equals transformers on the dequantized one to float32 rounding); the full W8A8 model
against transformers on the dequantized checkpoint with every GEMM input quantized and dequantized as the
format specifies (``_quant_oracle``). The only difference left there is accumulation order, which can flip
an 8-bit rounding: a flip moves the logits by ~1e-3 (research: up to 1.8e-2 on tiny models), hence the
2e-2 tolerance and vLLM's top-k acceptance of greedy tokens.
"""

from __future__ import annotations

import json

import pytest
import torch
from _quant_oracle import PROMPTS, checkpoints, hf_logits, hf_model, rel
from safetensors import safe_open

import hetero
from hetero.engine import LLM, SamplingParams
from hetero.engine.config import load_hf_config
from hetero.engine.forward import build_model, prefill
from hetero.engine.quant import quant_config_of, weights_only

#: (architecture, scheme, quantize options)
CASES = {
    "qwen3-fp8-block-bf16": ("qwen3", "fp8-block", dict(scale_dtype=torch.bfloat16)),
    "qwen3_moe-fp8-block": ("qwen3_moe", "fp8-block", {}),
    "deepseek_v3-fp8-block": ("deepseek_v3", "fp8-block", {}),
    "deepseek_v3-fp8-block-ue8m0": ("deepseek_v3", "fp8-block", dict(scale_fmt="ue8m0")),
    "deepseek_v32-fp8-block": ("deepseek_v32", "fp8-block", {}),
    "qwen3-int8-channel": ("qwen3", "int8-channel", dict(scale_dtype=torch.bfloat16)),
    "qwen3_moe-fp8-channel": ("qwen3_moe", "fp8-channel", {}),
}
W8A8_TOL, TOP_K = 2e-2, 5


class Case:
    def __init__(self, key: str, root):
        self.arch, self.scheme, options = CASES[key]
        self.scale_fmt = options.get("scale_fmt", "float")
        self.src, self.q, self.deq = checkpoints(self.arch, self.scheme, root, **options)
        self.hf = hf_model(self.deq)
        self.ops = hetero.load("cpu_ref")
        self.model = build_model(self.q, self.ops, torch.float32)

    def oracle(self, prompts):
        return hf_logits(self.hf, prompts, self.scheme, self.scale_fmt)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory) -> Case:
    return Case(request.param, tmp_path_factory.mktemp(request.param))


def test_checkpoint_layout(case):
    """What the quantizer wrote: 8-bit weights, scales in the asked dtype and grid (partial blocks
    ceil-div), routers and lm_head in float and listed as such; the engine holds the same."""
    qc = json.loads((case.q / "config.json").read_text())["quantization_config"]
    names = {}
    for f in case.q.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            names.update({n: st.get_slice(n) for n in st.keys()})
    if case.scheme == "fp8-block":
        assert qc["weight_block_size"] == [128, 128] and "lm_head" in qc["modules_to_not_convert"]
        scale = "weight_scale_inv"
    else:
        assert qc["quant_method"] == "compressed-tensors" and "lm_head" in qc["ignore"]
        scale = "weight_scale"
    layer0 = case.model.model.layers[0]
    if case.arch == "deepseek_v32":
        indexer = layer0.self_attn.indexer
        assert indexer.wq_b.weight.dtype == torch.float8_e4m3fn and indexer.weights_proj.weight.dtype == torch.float32
    elif case.arch == "deepseek_v3":
        kv_a = "model.layers.0.self_attn.kv_a_proj_with_mqa"
        assert names[f"{kv_a}.weight"].get_shape() == [192, 192]  # 1.5 blocks each way, like V3's 576 x 7168
        assert names[f"{kv_a}.{scale}"].get_shape() == [2, 2]
        assert layer0.self_attn.kv_b_proj.dense is not None  # weights only: the absorbed path
        assert layer0.self_attn.kv_a_proj_with_mqa.weight.dtype == torch.float8_e4m3fn
    else:
        assert layer0.self_attn.qkv_proj.weight.dtype in (torch.float8_e4m3fn, torch.int8)
        assert getattr(layer0.self_attn.qkv_proj, scale).dtype == torch.float32
    last = case.model.model.layers[-1].mlp
    if hasattr(last, "experts"):
        assert last.gate.weight.dtype == torch.float32 and "weight_scale" not in dict(last.gate.named_parameters())
        assert last.experts.w13.dtype == torch.float8_e4m3fn
        form = (8, 2, 2) if case.scheme == "fp8-block" else (8, 256, 1)
        assert tuple(getattr(last.experts, f"w13_{scale}").shape) == form


def test_weights_load_exactly(case):
    """Activation quantization off: every scale, packing, partial block and expert stacking shows here."""
    model = build_model(
        case.q, case.ops, torch.float32, quant_config=weights_only(quant_config_of(load_hf_config(case.q)))
    )
    got = prefill(model, PROMPTS).logits
    ref = hf_logits(case.hf, PROMPTS)
    assert max(rel(a, b) for a, b in zip(got, ref)) < 2e-5


def test_w8a8_matches_the_fake_quantized_oracle(case):
    got = prefill(case.model, PROMPTS).logits
    ref = case.oracle(PROMPTS)
    errors = [rel(a, b) for a, b in zip(got, ref)]
    assert max(errors) < W8A8_TOL, errors
    for a, b in zip(got, ref):  # each hetero argmax among the oracle's top-k at that position
        assert (b.topk(TOP_K, dim=-1).indices == a.argmax(-1, keepdim=True)).any(-1).all()
    unquantized = hf_logits(case.hf, PROMPTS)  # the test can fail: W8A16 is far from W8A8
    assert min(rel(a, b) for a, b in zip(got, unquantized)) > 5 * max(errors)
    if case.scale_fmt == "ue8m0":  # and the power-of-two activation scales are really used
        floats = hf_logits(case.hf, PROMPTS, case.scheme, "float")
        assert min(rel(a, b) for a, b in zip(got, floats)) > 5 * max(errors)


def test_greedy_tokens_within_the_oracles_top_k(case):
    """Greedy decoding through the engine (decode steps, MLA's absorbed path): every token is in the
    oracle's top-k given the engine's own prefix (vLLM's acceptance rule)."""
    llm = LLM(str(case.q), backend="cpu_ref", dtype="float32", block_size=4)
    prompts = PROMPTS[:2]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    for p, out in zip(prompts, outs):
        seq = list(p) + list(out.token_ids)
        logits = case.oracle([seq])[0]
        for i, token in enumerate(out.token_ids):
            top = logits[len(p) - 1 + i].topk(TOP_K).indices.tolist()
            assert token in top, (p, i, token, top)


@pytest.mark.parametrize(
    "case",
    ["deepseek_v3-fp8-block", "deepseek_v32-fp8-block", "qwen3_moe-fp8-block", "qwen3-int8-channel"],
    indirect=True,
)
def test_triton_kernels_under_the_interpreter(case, triton_interpreter):
    """The cuda backend's quantizer, scaled GEMMs and quantized fused_moe inside the engine (Triton
    interpreter), against the same fake-quantized oracle; no layer's configuration falls back."""
    cuda = hetero.load("cuda")
    model = build_model(case.q, cuda, torch.float32)
    got = prefill(model, PROMPTS[:2]).logits
    errors = [rel(a, b) for a, b in zip(got, case.oracle(PROMPTS[:2]))]
    assert max(errors) < W8A8_TOL, errors
    ops = ("quantize_activation", "scaled_gemm") + (("fused_moe",) if case.arch != "qwen3" else ())
    ops += ("indexer_topk", "write_index_k") if case.arch == "deepseek_v32" else ()
    info = cuda.explain()
    assert all(info[op].origin == "backend" and not info[op].reasons for op in ops), {op: info[op] for op in ops}


@pytest.mark.parametrize("case", ["qwen3_moe-fp8-block"], indirect=True)
def test_e4m3fn_weights_run_as_fnuz_where_the_backend_computes_fnuz(case, triton_interpreter):
    """rocm on an MI300 (gfx942) declines e4m3fn and runs e4m3fnuz: the engine gives its GEMMs the same
    weights as e4m3fnuz (0x80 cleared, scales doubled) and quantizes activations to e4m3fnuz, so nothing
    falls back and the logits match the e4m3fn oracle."""
    rocm = hetero.load("rocm")
    rocm.backend.gfx = "gfx942"  # supports() as on an MI300; the interpreter computes either fp8
    assert rocm.native("scaled_gemm", dtype=torch.float8_e4m3fn)[1] is not None
    model = build_model(case.q, rocm, torch.float32)
    dense, experts = model.model.layers[0].self_attn.qkv_proj, model.model.layers[-1].mlp.experts
    assert dense.run_weight.dtype == experts.run_w13.dtype == torch.float8_e4m3fnuz
    assert torch.equal(dense.run_weight_scale_inv, 2 * dense.weight_scale_inv)
    assert torch.equal(dense.run_weight.view(torch.int8), dense.weight.view(torch.int8))  # a view, not a copy
    got = prefill(model, PROMPTS[:2]).logits
    errors = [rel(a, b) for a, b in zip(got, case.oracle(PROMPTS[:2]))]
    assert max(errors) < W8A8_TOL, errors
    info = rocm.explain()
    ops = ("quantize_activation", "scaled_gemm", "fused_moe")
    assert all(info[op].origin == "backend" and not info[op].reasons for op in ops), {op: info[op] for op in ops}
