"""One MTP layer appended to a tiny checkpoint (``hetero.tools.tiny``), whose transformers classes write none.

``add_mtp(path)`` writes ``model-mtp.safetensors`` beside the shards, names its tensors in the index and
declares the layer in config.json (``num_nextn_predict_layers`` or ``mtp_num_hidden_layers`` = 1), in the
checkpoint's layout (``hetero.engine.models.mtp``):

- DeepSeek-V3 / V3.2, GLM-4.5, GLM-5: ``model.layers.{N}.*``: a decoder layer shaped as the last one (N - 1,
  a MoE layer in every tiny checkpoint, with V3.2's indexer), ``enorm``, ``hnorm``, ``eh_proj``,
  ``shared_head.norm``, and the released copies of the embedding and head (``embed_tokens``,
  ``shared_head.head``) that hetero ignores;
- Hy3: ``model.layers.{N}.*`` as DeepSeek's, with ``final_layernorm`` for ``shared_head.norm`` and no copies of
  the embedding or head; config.json also gets ``first_k_dense_replace`` (the leading dense layers of
  ``mlp_layer_types``), which released Hy3 configs carry and the MTP layer's MLP kind follows;
- Qwen3-Next / Qwen3.5: ``mtp.*``: attention and its norms shaped as the last full-attention layer, the MLP as
  layer 0 (the MTP layer's index), ``fc``, ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``, ``norm``;
- DeepSeek-V4: ``mtp.0.*`` in the release's names: attention, ``attn_norm`` and ``hc_attn_*`` shaped as a sliding
  layer's, the MoE, ``ffn_norm`` and ``hc_ffn_*`` as the last score-routed layer's, ``enorm``, ``hnorm``, ``e_proj``,
  ``h_proj``, ``hc_head_*`` and ``norm`` (the model's own, so "repeat" collapses the streams as the target does); its
  "repeat" is near, not exact: ``hnorm`` normalizes each stream alone, so the draft's logits are the target head's
  over a rescaled mix of the target's streams (its argmax the target's token where the rescaling keeps it).

``mode="random"`` draws every tensor afresh (norms around their centre, matrices at the source's scale),
the zero-acceptance case; ``mode="repeat"`` copies the source layer's tensors but zeroes its output
projections (``o_proj``, ``down_proj``), makes the norms neutral and the 2H -> H projection pass the
target's hidden state only, so the draft's logits are the target head's over the target's own last hidden
state: it proposes the token the target just emitted, again, and is accepted wherever the target repeats
a token (which needs the right hidden rows, chaining and head). The default checkpoints of
``tiny.build`` are unchanged: this is opt-in.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

__all__ = ["add_mtp", "LAYOUTS"]

#: architectures[0] -> MTP layout ("nextn": DeepSeek's ``model.layers.{N}``; "hy3": Hy3's; "qwen": ``mtp.*``;
#: "dsv4": DeepSeek-V4's ``mtp.0.*``)
LAYOUTS = {
    "DeepseekV3ForCausalLM": "nextn",
    "DeepseekV32ForCausalLM": "nextn",
    "Glm4MoeForCausalLM": "nextn",
    "GlmMoeDsaForCausalLM": "nextn",
    "HYV3ForCausalLM": "hy3",
    "DeepseekV4ForCausalLM": "dsv4",
    "Qwen3NextForCausalLM": "qwen",
    "Qwen3_5ForCausalLM": "qwen",
    "Qwen3_5MoeForCausalLM": "qwen",
    "Qwen3_5ForConditionalGeneration": "qwen",
    "Qwen3_5MoeForConditionalGeneration": "qwen",
}
INDEX = "model.safetensors.index.json"
SHARD = "model-mtp.safetensors"


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        if f.name != SHARD:
            out.update(load_file(str(f)))
    return out


def _take(tensors: dict[str, torch.Tensor], src: str, dst: str, only: str = "") -> dict[str, torch.Tensor]:
    """Every tensor under ``src`` (and ``only`` after it), renamed under ``dst``."""
    return {dst + n[len(src) :]: t for n, t in tensors.items() if n.startswith(src + only)}


def _nextn(text, tensors, prefix, centre) -> tuple[dict[str, torch.Tensor], list[str]]:
    n, h = text.num_hidden_layers, text.hidden_size
    mine = f"{prefix}layers.{n}."
    out = _take(tensors, f"{prefix}layers.{n - 1}.", mine)
    out[mine + "enorm.weight"] = torch.full((h,), centre)
    out[mine + "hnorm.weight"] = torch.full((h,), centre)
    out[mine + "eh_proj.weight"] = torch.cat([torch.zeros(h, h), torch.eye(h)], dim=1)
    out[mine + "shared_head.norm.weight"] = torch.full((h,), centre)
    out[mine + "embed_tokens.weight"] = tensors[f"{prefix}embed_tokens.weight"].clone()
    head = "lm_head.weight" if "lm_head.weight" in tensors else f"{prefix}embed_tokens.weight"
    out[mine + "shared_head.head.weight"] = tensors[head].clone()
    return out, [mine + "embed_tokens.weight", mine + "shared_head.head.weight"]


def _hy3(text, tensors, prefix, centre) -> tuple[dict[str, torch.Tensor], list[str]]:
    out, copies = _nextn(text, tensors, prefix, centre)
    mine = f"{prefix}layers.{text.num_hidden_layers}."
    out = {n: t for n, t in out.items() if n not in copies}
    out[mine + "final_layernorm.weight"] = out.pop(mine + "shared_head.norm.weight")
    return out, []


def _qwen(text, tensors, prefix, centre) -> tuple[dict[str, torch.Tensor], list[str]]:
    h = text.hidden_size
    full = max(i for i, kind in enumerate(text.layer_types) if kind == "full_attention")
    out = {}
    for part in ("self_attn.", "input_layernorm.", "post_attention_layernorm."):
        out.update(_take(tensors, f"{prefix}layers.{full}.", "mtp.layers.0.", part))
    out.update(_take(tensors, f"{prefix}layers.0.", "mtp.layers.0.", "mlp."))
    out["mtp.fc.weight"] = torch.cat([torch.zeros(h, h), torch.eye(h)], dim=1)
    out["mtp.pre_fc_norm_embedding.weight"] = torch.full((h,), centre)
    out["mtp.pre_fc_norm_hidden.weight"] = torch.full((h,), centre)
    out["mtp.norm.weight"] = torch.full((h,), centre)
    return out, []


def _dsv4(text, tensors, prefix, centre) -> tuple[dict[str, torch.Tensor], list[str]]:
    h = text.hidden_size
    sliding = text.layer_types.index("sliding_attention")
    moe = max(i for i, kind in enumerate(text.mlp_layer_types) if kind == "moe")
    out = {}
    for part in ("attn.", "attn_norm.", "hc_attn_"):
        out.update(_take(tensors, f"{prefix}layers.{sliding}.", "mtp.0.", part))
    for part in ("ffn.", "ffn_norm.", "hc_ffn_"):
        out.update(_take(tensors, f"{prefix}layers.{moe}.", "mtp.0.", part))
    out.update(_take(tensors, f"{prefix}hc_head.hc_", "mtp.0.hc_head_"))  # transformers writes model.hc_head.hc_*
    for name in ("enorm", "hnorm"):
        out[f"mtp.0.{name}.weight"] = torch.full((h,), centre)
    out["mtp.0.norm.weight"] = tensors[f"{prefix}norm.weight"].clone()
    out["mtp.0.e_proj.weight"], out["mtp.0.h_proj.weight"] = torch.zeros(h, h), torch.eye(h)
    return out, []


def _redraw(tensors: dict[str, torch.Tensor], keep: list[str], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Fresh values: 1-D tensors (norms, biases) around their mean, matrices at their own scale."""
    out = {}
    for name, t in tensors.items():
        if name in keep or not t.is_floating_point():
            out[name] = t
        elif t.ndim == 1:
            out[name] = t.mean() + 0.3 * torch.randn(t.shape, generator=gen)
        else:
            scale = float(t.std()) if t.numel() > 1 and float(t.std()) > 0 else 0.2
            out[name] = scale * torch.randn(t.shape, generator=gen)
    return out


def add_mtp(path: str | Path, *, mode: str = "random", seed: int = 0) -> Path:
    """Append one MTP layer to the tiny checkpoint at ``path`` (see the module docstring); returns ``path``."""
    from safetensors.torch import save_file

    if mode not in ("random", "repeat"):
        raise ValueError(f"add_mtp: mode must be 'random' or 'repeat', got {mode!r}")
    path = Path(path)
    raw = json.loads((path / "config.json").read_text())
    arch = raw["architectures"][0]
    if arch not in LAYOUTS:
        raise ValueError(f"add_mtp: no MTP layout for {arch}; known: {', '.join(LAYOUTS)}")
    from transformers import AutoConfig

    text = AutoConfig.from_pretrained(str(path)).get_text_config()
    tensors = _tensors(path)
    first = r"(.*)layers\.0\.(?:input_layernorm|attn_norm)\.weight"  # transformers' name, or the release's (V4)
    prefix = next(m[1] for n in sorted(tensors) if (m := re.fullmatch(first, n)))
    layout = LAYOUTS[arch]
    centre = 0.0 if layout == "qwen" else 1.0  # Qwen's norms are zero-centred: norm(x) * (1 + w)
    build = {"nextn": _nextn, "hy3": _hy3, "qwen": _qwen, "dsv4": _dsv4}[layout]
    out, keep = build(text, tensors, prefix, centre)
    if mode == "random":
        out = _redraw(out, keep, torch.Generator().manual_seed(seed))
    else:
        out = {
            n: torch.zeros_like(t) if re.search(r"\.(o_proj|down_proj|wo_b|w2)(\.weight)?$", n) else t  # V4: wo_b, w2
            for n, t in out.items()
        }
    save_file({n: t.contiguous() for n, t in out.items()}, str(path / SHARD))
    if (path / INDEX).is_file():
        index = json.loads((path / INDEX).read_text())
        index["weight_map"].update({n: SHARD for n in out})
        (path / INDEX).write_text(json.dumps(index, indent=2))
    fields = raw.get("text_config", raw)
    fields["mtp_num_hidden_layers" if layout == "qwen" else "num_nextn_predict_layers"] = 1
    if layout == "hy3" and "first_k_dense_replace" not in fields:
        kinds = fields["mlp_layer_types"]
        fields["first_k_dense_replace"] = next((i for i, k in enumerate(kinds) if k != "dense"), len(kinds))
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    return path
