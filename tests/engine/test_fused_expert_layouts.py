"""Released Qwen3.5-MoE checkpoints store every layer's experts fused (``experts.gate_up_proj [E, 2I, H]``,
``experts.down_proj [E, H, I]``), not per expert as transformers' ``save_pretrained`` writes them: the same
weights in that layout give transformers' logits, and a tensor in the other orientation is refused by its
expected shape, never transposed on a guess."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

pytest.importorskip("transformers")

from _hf import hf_model, prompts

import hetero
from hetero.engine.forward import build_model, prefill
from hetero.tools import tiny

_EXPERT = re.compile(r"(?P<head>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight")


def _fused(src, dst, *, transpose_down: bool = False):
    """A copy of ``src`` with each layer's per-expert tensors fused into the released layout."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    out, experts = {}, {}
    for name, t in load_file(str(src / "model.safetensors")).items():
        m = _EXPERT.fullmatch(name)
        if m is None:
            out[name] = t
        else:
            experts.setdefault(m["head"], {}).setdefault(int(m["e"]), {})[m["proj"]] = t
    for head, per in experts.items():
        ordered = [per[e] for e in sorted(per)]
        out[f"{head}.gate_up_proj"] = torch.stack([torch.cat([p["gate"], p["up"]]) for p in ordered])
        down = torch.stack([p["down"] for p in ordered])
        out[f"{head}.down_proj"] = down.transpose(1, 2).contiguous() if transpose_down else down
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_fused_experts_equal_transformers_and_a_transposed_tensor_is_refused(tmp_path):
    src = tiny.build("qwen3_5_moe", tmp_path / "src", shard_size=None)
    ps = prompts(256, (7, 19))
    model = build_model(_fused(src, tmp_path / "fused"), hetero.load("cpu_ref"), torch.float32)
    for p, got in zip(ps, prefill(model, ps).logits):
        with torch.inference_mode():
            want = hf_model(str(src))(torch.tensor([p])).logits[0]
        assert float((got - want).norm() / want.norm()) < 1e-4
    with pytest.raises(Exception, match=r"fused down tensor of every expert is \[8, 64, 32\]"):
        build_model(_fused(src, tmp_path / "transposed", transpose_down=True), hetero.load("cpu_ref"), torch.float32)
