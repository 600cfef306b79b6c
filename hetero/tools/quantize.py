"""``hetero quantize``: write an 8-bit copy of a float Hugging Face checkpoint, or a float copy of an 8-bit one.

Schemes (every 2-D Linear ``*.weight`` except embeddings, norms, routers and lm_head):

- ``fp8-block``: DeepSeek-V3 / Qwen3-FP8 layout, ``quant_method "fp8"``: e4m3 ``weight`` and
  ``weight_scale_inv`` [ceil(N/128), ceil(K/128)], each block's scale the amax of its actual
  elements (partial edge blocks included) over 448; activations 1x128 dynamic groups;
- ``fp8-channel``: compressed-tensors ``float-quantized`` (FP8_DYNAMIC): e4m3 ``weight``,
  ``weight_scale`` [N, 1]; activations dynamic per token;
- ``int8-channel``: compressed-tensors ``int-quantized`` (W8A8): int8 ``weight`` (amax / 127),
  ``weight_scale`` [N, 1]; activations int8 dynamic per token, symmetric;
- ``w4a16-g128``, ``w4a16-g32`` (and ``-asym``: with zero points): compressed-tensors ``pack-quantized``
  W4A16, written by the compressed-tensors package itself (``_quantize_int4``); activations stay float.

``dequantize_checkpoint`` is the inverse used as an oracle: the float checkpoint holding exactly
the values the quantized one means (``weight * scale``, through the engine's own dequantizer; W4A16
checkpoints, GPTQ and AWQ included, by the spec's int4 formula).
Other files (tokenizer, generation config) are copied; shard files keep their names.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from hetero.engine.loader import INDEX, checkpoint_files
from hetero.engine.quant._qmath import FP8, dequantize, quantize_blocks, quantize_channels
from hetero.errors import UsageError
from hetero.tools._quantize_int4 import W4A16_SCHEMES, int4_config, int4_dequantizer, quantize_int4

__all__ = ["SCHEMES", "quantize_checkpoint", "dequantize_checkpoint", "is_quantizable"]

SCHEMES = ("fp8-block", "fp8-channel", "int8-channel", *W4A16_SCHEMES)
#: 2-D weights that stay in float: embeddings, the output head, MoE routers, Qwen's shared-expert gate, the
#: DSA indexer's head weights (as in DeepSeek-V3.2's own checkpoint, whose indexer wq_b and wk are fp8);
#: DeepSeek-V4's release names (``head``, ``ffn.gate``) and its compressors' projections (bf16 in its release)
_KEEP = (
    r".*embed_tokens\.weight",
    r"(.*\.)?lm_head\.weight",
    r"head\.weight",
    r".*\.(mlp|ffn)\.gate\.weight",
    r".*\.compressor\.(wkv|wgate)\.weight",
    r".*shared_expert_gate\.weight",
    r".*norm\.weight",
    r".*\.indexer\.weights_proj\.weight",
)


def is_quantizable(name: str, tensor: torch.Tensor) -> bool:
    """Whether ``hetero quantize`` quantizes checkpoint tensor ``name``: a float 2-D Linear weight not kept in float."""
    return (
        name.endswith(".weight")
        and tensor.ndim == 2
        and tensor.dtype.is_floating_point
        and tensor.dtype.itemsize >= 2
        and not any(re.fullmatch(p, name) for p in _KEEP)
    )


def _quantization_config(scheme: str, kept: list[str], scale_fmt: str) -> dict[str, Any]:
    if scheme in W4A16_SCHEMES:
        return int4_config(scheme, kept)
    if scheme == "fp8-block":
        qc = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": kept,
        }
        if scale_fmt != "float":
            qc["scale_fmt"] = scale_fmt
        return qc
    kind = "float" if scheme == "fp8-channel" else "int"
    fmt = f"{kind}-quantized"
    group = {
        "targets": ["Linear"],
        "format": fmt,
        "weights": {"num_bits": 8, "type": kind, "strategy": "channel", "symmetric": True, "dynamic": False},
        "input_activations": {"num_bits": 8, "type": kind, "strategy": "token", "symmetric": True, "dynamic": True},
    }
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "ignore": kept,
        "config_groups": {"group_0": group},
        "kv_cache_scheme": None,
    }


def _quantized(name: str, tensor: torch.Tensor, scheme: str, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    base = name.removesuffix(".weight")
    if scheme in W4A16_SCHEMES:
        return quantize_int4(name, tensor, scheme, scale_dtype)
    if scheme == "fp8-block":
        q, scale = quantize_blocks(tensor, FP8)
        return {name: q, f"{base}.weight_scale_inv": scale.to(scale_dtype)}
    q, scale = quantize_channels(tensor, FP8 if scheme == "fp8-channel" else torch.int8)
    return {name: q, f"{base}.weight_scale": scale.to(scale_dtype)}


def _rewrite(src: Path, dst: Path, convert, config_fn) -> dict[str, Any]:
    """Copy ``src`` to ``dst`` with each shard's tensors passed through ``convert(name, tensor) -> {name: tensor}``,
    the index rebuilt and config.json passed through ``config_fn(config, names_by_kind)``."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    files = checkpoint_files(src, "the source checkpoint")
    dst.mkdir(parents=True, exist_ok=True)
    weight_map, seen = {}, {"converted": [], "kept": []}
    for path in files:
        out = {}
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                produced = convert(name, f.get_tensor(name), seen)
                out.update(produced)
        save_file({k: v.contiguous() for k, v in out.items()}, str(dst / path.name), metadata={"format": "pt"})
        weight_map.update({k: path.name for k in out})
    for item in src.iterdir():
        if item.is_file() and item.name not in ("config.json", INDEX) and not item.name.endswith(".safetensors"):
            shutil.copy2(item, dst / item.name)
    if (src / INDEX).is_file():
        index = json.loads((src / INDEX).read_text())
        index["weight_map"] = dict(sorted(weight_map.items()))
        (dst / INDEX).write_text(json.dumps(index, indent=2))
    config = config_fn(json.loads((src / "config.json").read_text()), seen)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return seen


def quantize_checkpoint(
    src: str | Path, dst: str | Path, scheme: str, *, scale_dtype: torch.dtype = torch.float32, scale_fmt: str = "float"
) -> dict[str, list[str]]:
    """Write the ``scheme`` copy of float checkpoint ``src`` to ``dst``; {"converted": [...],
    "kept": [...]} module names.

    ``scale_dtype`` float32 (DeepSeek), bfloat16 or float16 (Qwen3-FP8, compressed-tensors);
    ``scale_fmt`` "ue8m0" marks an fp8-block checkpoint's activation scales as powers of two (V3.1+).
    """
    src, dst = Path(src), Path(dst)
    if scheme not in SCHEMES:
        raise UsageError(f"argument --scheme: expected one of {', '.join(SCHEMES)}, got {scheme!r}")
    if scale_fmt != "float" and scheme != "fp8-block":
        raise UsageError("argument --scale-fmt: ue8m0 applies to the fp8-block scheme only")
    config = json.loads((src / "config.json").read_text()) if (src / "config.json").is_file() else None
    if config is None:
        raise UsageError(f"quantize: {src} has no config.json (expected a Hugging Face checkpoint directory)")
    if config.get("quantization_config"):
        raise UsageError(f"quantize: {src} is already quantized ({config['quantization_config'].get('quant_method')})")

    def convert(name, tensor, seen):
        if is_quantizable(name, tensor):
            seen["converted"].append(name.removesuffix(".weight"))
            return _quantized(name, tensor, scheme, scale_dtype)
        if name.endswith(".weight") and tensor.ndim == 2 and "embed_tokens" not in name:
            seen["kept"].append(name.removesuffix(".weight"))
        return {name: tensor}

    def config_fn(cfg, seen):
        cfg["quantization_config"] = _quantization_config(scheme, sorted(seen["kept"]), scale_fmt)
        return cfg

    return _rewrite(src, dst, convert, config_fn)


def dequantize_checkpoint(src: str | Path, dst: str | Path, dtype: torch.dtype = torch.float32) -> dict[str, list[str]]:
    """Write the float (``dtype``) checkpoint that 8-bit checkpoint ``src`` means: each quantized weight times its
    scale (``weight_scale_inv`` or ``weight_scale``), the scales dropped, ``quantization_config`` removed."""
    from safetensors import safe_open

    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text()) if (src / "config.json").is_file() else {}
    int4 = int4_dequantizer(src, config.get("quantization_config"), dtype)
    scales = {}
    for path in checkpoint_files(src, "the quantized checkpoint"):
        with safe_open(str(path), framework="pt") as f:
            scales.update(
                {n.rsplit(".", 1)[0]: (path, n) for n in f.keys() if n.endswith((".weight_scale_inv", ".weight_scale"))}
            )

    def convert(name, tensor, seen):
        if name.endswith((".weight_scale_inv", ".weight_scale")):
            return {}
        base = name.removesuffix(".weight")
        if name.endswith(".weight") and base in scales:
            path, scale_name = scales[base]
            with safe_open(str(path), framework="pt") as f:
                scale = f.get_tensor(scale_name)
            seen["converted"].append(base)
            return {name: dequantize(tensor, scale, dtype)}
        return {name: tensor}

    def config_fn(cfg, seen):
        cfg.pop("quantization_config", None)
        return cfg

    return _rewrite(src, dst, int4 or convert, config_fn)
