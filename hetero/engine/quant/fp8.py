"""``quant_method: "fp8"``: DeepSeek-V3/R1/V3.1/V3.2 and Qwen3 "-FP8" block-scaled checkpoints.

config.json: ``{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
"weight_block_size": [128, 128]}``, optionally ``"scale_fmt": "ue8m0"`` (V3.1+: activation scales
rounded up to powers of two), ``"modules_to_not_convert"`` and DeepSeek-V4.1's ``"expert_dtype"`` (fp8
only: fp4 experts are refused by name). Each quantized Linear stores an e4m3
``weight`` and a ``weight_scale_inv`` [ceil(N/128), ceil(K/128)] (float32 for DeepSeek, bfloat16 or
float16 for Qwen3; ``W = weight * scale_inv`` per block); activations are quantized per token in
groups of 128 at run time. Routers, norms, embeddings and lm_head stay in float.
"""

from __future__ import annotations

from typing import Any

from hetero.engine.quant._qmath import BLOCK, FP8
from hetero.engine.quant._select import ScaledQuantConfig
from hetero.engine.quant.config import UnsupportedQuantization
from hetero.engine.quant.scaled import Scheme

__all__ = ["fp8_config"]


def fp8_config(qc: dict[str, Any]) -> ScaledQuantConfig:
    """The QuantConfig of an fp8 block checkpoint; any other variant is an UnsupportedQuantization naming it."""
    fmt, act = qc.get("fmt", "e4m3"), qc.get("activation_scheme", "dynamic")
    block, scale_fmt = qc.get("weight_block_size"), qc.get("scale_fmt") or "float"
    problems = []
    if fmt != "e4m3":
        problems.append(f"fmt {fmt!r} (only e4m3)")
    if act != "dynamic":
        problems.append(f"activation_scheme {act!r} (only dynamic; static activation scales are not supported)")
    if block is None or list(block) != [BLOCK, BLOCK]:
        problems.append(f"weight_block_size {block!r} (only [{BLOCK}, {BLOCK}]; per-tensor fp8 is not supported)")
    if scale_fmt not in ("float", "ue8m0"):
        problems.append(f"scale_fmt {scale_fmt!r} (float or ue8m0)")
    expert_dtype = qc.get("expert_dtype")  # DeepSeek-V4.1: the experts' own format
    if expert_dtype not in (None, "fp8", "float8_e4m3fn", "e4m3"):
        problems.append(f"expert_dtype {expert_dtype!r} (only fp8 experts, as the other weights)")
    if problems:
        raise UnsupportedQuantization("quantization_config (quant_method 'fp8'): unsupported " + "; ".join(problems))
    scheme = Scheme(FP8, "block", "weight_scale_inv", "group128", scale_fmt)
    skip = tuple(qc.get("modules_to_not_convert") or ())
    return ScaledQuantConfig(name="fp8", scheme=scheme, skip=skip)
