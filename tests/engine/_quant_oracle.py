"""Oracles of 8-bit checkpoints: transformers on the float checkpoint hetero's own dequantizer writes, with
each GEMM input quantized and dequantized exactly as the format specifies (the reference op).

Tiny models sized so 128-blocks matter: hidden 192 (a partial 64-column block in every K = hidden GEMM),
DeepSeek-V3's ``kv_a_proj_with_mqa`` 128 + 64 = 192 rows (a partial row block, as the real 576 rows),
moe_intermediate 128 (gate and up scales pack at block granularity), q/k/v 128 rows each.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

import hetero
from hetero.tools import tiny
from hetero.tools.quantize import dequantize_checkpoint, quantize_checkpoint

OVERRIDES = {
    "qwen3": dict(hidden_size=192, num_key_value_heads=4, intermediate_size=256),
    "qwen3_moe": dict(
        hidden_size=192, head_dim=32, num_key_value_heads=4, intermediate_size=256, moe_intermediate_size=128
    ),
    "deepseek_v3": dict(
        hidden_size=192,
        kv_lora_rank=128,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        q_lora_rank=128,
        moe_intermediate_size=128,
        intermediate_size=256,
    ),
    # kv_a_proj_with_mqa 128 + 8 rows; the indexer's wq_b [256, 128] and wk [16, 192] quantized too
    "deepseek_v32": dict(
        hidden_size=192, kv_lora_rank=128, q_lora_rank=128, moe_intermediate_size=128, intermediate_size=256
    ),
}
#: the activation quantization of each scheme: (dtype, group size), None for none
ACT = {
    "fp8-block": (torch.float8_e4m3fn, 128),
    "fp8-channel": (torch.float8_e4m3fn, None),
    "int8-channel": (torch.int8, None),
    "w4a16-g32-asym": None,  # weight-only: the activations stay float
}
PROMPTS = [[5, 7, 9, 11, 13, 2, 3, 4, 100, 17], [42], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]


def checkpoints(arch: str, scheme: str, root: Path, **options) -> tuple[Path, Path, Path]:
    """(float source, quantized copy, its dequantized float copy) of a tiny ``arch``."""
    src = tiny.build(arch, root / "src", **OVERRIDES[arch])
    quantize_checkpoint(src, root / "q", scheme, **options)
    dequantize_checkpoint(root / "q", root / "deq")
    return src, root / "q", root / "deq"


def hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, experts_implementation="eager").eval()


def _float_weights(model) -> set[int]:
    """data_ptr of the weights whose inputs stay in float: lm_head, routers, kv_b_proj (dequantized in hetero)."""
    keep = set()
    for name, p in model.named_parameters():
        if name.startswith("lm_head") or name.endswith(("mlp.gate.weight", "kv_b_proj.weight", "weights_proj.weight")):
            keep.add(p.data_ptr())
    return keep


@contextlib.contextmanager
def fake_quant_inputs(model, scheme: str, scale_fmt: str = "float"):
    """Inside: every F.linear of ``model`` but ``_float_weights`` sees its input quantized and dequantized by
    cpu_ref's ``quantize_activation`` (experts too, with transformers' eager experts)."""
    F = torch.nn.functional
    ops, (dtype, group) = hetero.load("cpu_ref"), ACT[scheme]
    keep, linear = _float_weights(model), F.linear

    def fake(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        q, s = ops.quantize_activation(flat, dtype=dtype, group_size=group, scale_fmt=scale_fmt)[:2]
        k = flat.shape[1]
        full = s.repeat_interleave(group, dim=1)[:, :k] if group else s
        return (q.to(torch.float32) * full).reshape(x.shape)

    def patched(x, weight, bias=None):
        return linear(x if weight.data_ptr() in keep else fake(x), weight, bias)

    F.linear = patched
    try:
        yield
    finally:
        F.linear = linear


@torch.no_grad()
def hf_logits(model, prompts, scheme: str | None = None, scale_fmt: str = "float") -> list[torch.Tensor]:
    ctx = fake_quant_inputs(model, scheme, scale_fmt) if scheme and ACT[scheme] else contextlib.nullcontext()
    with ctx:
        return [model(torch.tensor([p])).logits[0].float() for p in prompts]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())
