"""Which kind of layer made an op call: attention, linear attention, MoE, dense MLP or other.

Each engine layer class below marks a kind. A module's *markers* are the marked
layers of its subtree, not counting those nested in another marked layer. An op
call belongs to the outermost module (the model itself excluded) whose markers are
one layer of one kind, or one MoE layer with dense MLPs beside it (its shared
experts); a call no such module holds (embedding, final norm, lm_head, the norms
between blocks) is "other". So a Qwen3 layer's ``self_attn`` (one ``Attention``)
is attention, its ``mlp`` (one ``SiluAndMul``) a dense MLP, and a DeepSeek
``mlp`` with routed and shared experts is MoE, shared experts included.
"""

from __future__ import annotations

from torch import nn

from hetero.engine.instrument import OpSite

__all__ = ["ATTENTION", "LINEAR_ATTENTION", "MOE", "DENSE_MLP", "OTHER", "LAYER_KINDS", "layer_kinds"]

ATTENTION, LINEAR_ATTENTION, MOE, DENSE_MLP, OTHER = "attention", "linear attention", "MoE", "dense MLP", "other"
#: the kinds in report order
LAYER_KINDS = (ATTENTION, LINEAR_ATTENTION, MOE, DENSE_MLP, OTHER)


def _marker_classes() -> tuple[tuple[type, str], ...]:
    from hetero.engine.layers.activation import SiluAndMul
    from hetero.engine.layers.attention import Attention
    from hetero.engine.layers.gated_attention import GatedAttention
    from hetero.engine.layers.gated_deltanet import DeltaRuleMixer  # Gated DeltaNet, KDA
    from hetero.engine.layers.mla import MLAttention  # and dsa.SparseMLAttention, its subclass
    from hetero.engine.layers.moe import FusedMoE
    from hetero.engine.layers.moe_oai import OaiExperts

    return (
        (FusedMoE, MOE),
        (OaiExperts, MOE),
        (DeltaRuleMixer, LINEAR_ATTENTION),
        (MLAttention, ATTENTION),
        (GatedAttention, ATTENTION),
        (Attention, ATTENTION),
        (SiluAndMul, DENSE_MLP),
    )


def _markers(module: nn.Module, classes: tuple[tuple[type, str], ...], memo: dict[int, list[str]]) -> list[str]:
    key = id(module)
    if key not in memo:
        own = next((kind for cls, kind in classes if isinstance(module, cls)), None)
        memo[key] = [own] if own else [k for child in module.children() for k in _markers(child, classes, memo)]
    return memo[key]


def _block_kind(markers: list[str]) -> str | None:
    """The kind of a module holding exactly one block, or None."""
    if len(markers) == 1:
        return markers[0]
    if markers.count(MOE) == 1 and set(markers) == {MOE, DENSE_MLP}:
        return MOE
    return None


def layer_kinds(model: nn.Module, sites: list[OpSite]) -> dict[str, str]:
    """Module path -> layer kind, for the path of every site of ``model``."""
    classes, memo = _marker_classes(), {}
    modules = dict(model.named_modules())
    out: dict[str, str] = {}
    for path in {s.path for s in sites}:
        parts = path.split(".") if path else []
        kind = OTHER
        for n in range(1, len(parts) + 1):
            found = _block_kind(_markers(modules[".".join(parts[:n])], classes, memo))
            if found is not None:
                kind = found
                break
        out[path] = kind
    return out
