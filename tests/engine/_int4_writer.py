"""GPTQ- and AWQ-format checkpoints written from known integer codes, for the W4A16 tests (there is no GPTQ or
AWQ package here). Kept apart from the loader on purpose: codes are packed into int32 words by arithmetic
(``sum(code << 4i)``), never by byte views, and the float each code means is computed here, so the test
can compare the engine's unpacking (and the oracle it writes) with values it did not produce.

Each quantizable weight W [N, K] is rounded to the nearest (asymmetric: min-max per group, zero point a
code; symmetric: amax / 7, zero point 8) with float16 scales, GPTQ's and AWQ's scale dtype. Act-order:
the columns of each weight get a random permutation, ``g_idx[perm[j]] = j // g``, shared by the
weights of one input (q/k/v, gate/up of one expert) as GPTQ's Hessian order is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hetero.tools.quantize import is_quantizable

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def pack_words(codes: torch.Tensor, order=tuple(range(8))) -> torch.Tensor:
    """codes [R, 8W] in [0, 15] -> int32 [R, W]: word w = sum_i codes[:, 8w + order[i]] << 4i."""
    c = codes.long().unflatten(-1, (-1, 8))[..., list(order)]
    word = sum(c[..., i] << (4 * i) for i in range(8))
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def _codes(w: torch.Tensor, g_idx: torch.Tensor, groups: int, symmetric: bool, lowest_zp: int):
    """(codes [N, K], zero points [N, G], float16 scales [N, G], the float32 weight they mean)."""
    index = g_idx.expand(w.shape[0], -1)

    def per_group(values, how):
        return w.new_zeros(w.shape[0], groups).scatter_reduce(1, index, values, how, include_self=False)

    if symmetric:
        scale = per_group(w.abs(), "amax") / 7
        zp = torch.full_like(scale, 8)
    else:
        lo, hi = per_group(w, "amin").clamp(max=0), per_group(w, "amax").clamp(min=0)
        scale = (hi - lo) / 15
        zp = (-lo / scale).round().clamp(lowest_zp, 15)
    scale = scale.half().float()
    full_s, full_z = scale[:, g_idx], zp[:, g_idx]
    codes = (w / full_s + full_z).round().clamp(0, 15)
    return codes.long(), zp.long(), scale.half(), (codes - full_z) * full_s


def write(src: Path, dst: Path, fmt: str, group: int, *, symmetric=False, desc_act=False, v2=False, seed=0):
    """Write ``fmt`` ("gptq" or "awq") copy of float checkpoint ``src`` (one model.safetensors) to ``dst``;
    returns {module: the float32 weight it means}."""
    gen = torch.Generator().manual_seed(seed)
    tensors, out, meant, perms = load_file(str(src / "model.safetensors")), {}, {}, {}
    for name, w in tensors.items():
        if not is_quantizable(name, w):
            out[name] = w
            continue
        base, k = name.removesuffix(".weight"), w.shape[1]
        g_idx = torch.arange(k) // group
        if desc_act:
            perm = perms.setdefault((base.rsplit(".", 1)[0], k), torch.randperm(k, generator=gen))
            g_idx = torch.empty(k, dtype=torch.long)
            g_idx[perm] = torch.arange(k) // group
        codes, zp, scale, meant[base] = _codes(w.float(), g_idx, -(-k // group), symmetric, 1 if fmt == "gptq" else 0)
        if fmt == "gptq":
            out[f"{base}.qweight"] = pack_words(codes).T.contiguous()  # [K/8, N], along K
            out[f"{base}.qzeros"] = pack_words((zp if v2 else zp - 1).T)  # [G, N/8], along N
            out[f"{base}.g_idx"] = g_idx.to(torch.int32)
        else:
            out[f"{base}.qweight"] = pack_words(codes.T, AWQ_ORDER)  # [K, N/8], along N, interleaved
            out[f"{base}.qzeros"] = pack_words(zp.T, AWQ_ORDER)
        out[f"{base}.scales"] = scale.T.contiguous()
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for item in src.iterdir():
        if item.is_file() and item.name not in ("config.json", "model.safetensors"):
            shutil.copy2(item, dst / item.name)
    config = json.loads((src / "config.json").read_text())
    if fmt == "gptq":
        qc = dict(quant_method="gptq", bits=4, group_size=group, desc_act=desc_act, sym=symmetric)
        qc["checkpoint_format"] = "gptq_v2" if v2 else "gptq"
    else:
        qc = dict(quant_method="awq", bits=4, group_size=group, zero_point=True, version="gemm")
    config["quantization_config"] = qc
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return meant
