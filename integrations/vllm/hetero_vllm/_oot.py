"""Registering out-of-tree CustomOp replacements: skip names another plugin owns, stay on under compilation."""

from __future__ import annotations

import logging

from hetero_vllm import _backend, report

__all__ = ["AlwaysOn", "register_oot", "dispatch_to"]

_logger = logging.getLogger("vllm.hetero_vllm")


class AlwaysOn:
    """Mixin for a replacement CustomOp: enabled even when ``custom_ops`` is ``["none"]``.

    vLLM's compiled mode defaults ``compilation_config.custom_ops`` to ``["none"]``,
    which sends every CustomOp to ``forward_native`` (vLLM's own code) and would
    bypass hetero silently. A replacement is a hetero route by choice, so it is on
    unless the user names it off (``-<vLLM class name>`` or ``-<vLLM op name>``).
    """

    @classmethod
    def enabled(cls) -> bool:
        from vllm.config import get_cached_compilation_config

        _backend.remember_config()  # vLLM builds layers under its current config: note the engine's backend choice
        ops = get_cached_compilation_config().custom_ops
        names = {cls.name, getattr(cls, "vllm_op_name", cls.name)}
        if any(f"-{n}" in ops for n in names):
            report.not_routed(cls.name, "turned off by compilation_config.custom_ops")
            return False
        return True


def dispatch_to(cls: type, method: str) -> type:
    """Point every platform's forward of ``cls`` (cpu, cuda, hip, xpu, tpu, oot) at ``method``."""
    fn = getattr(cls, method)
    for target in ("forward_cpu", "forward_cuda", "forward_hip", "forward_xpu", "forward_tpu", "forward_oot"):
        setattr(cls, target, fn)
    return cls


def register_oot(vllm_cls: type, replacement: type, routes: list[str]) -> bool:
    """Register ``replacement`` for ``vllm_cls`` (keyed by its class name, as ``CustomOp.__new__`` looks it up).

    Skips, with a logged reason, a name another plugin already registered; appends
    the name to ``routes`` when registered. Returns whether it registered.
    """
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot

    name = vllm_cls.__name__
    if name in op_registry_oot:
        if op_registry_oot[name] is replacement:
            return False
        owner = op_registry_oot[name]
        reason = f"another plugin already replaces it ({owner.__module__}.{owner.__qualname__})"
        _logger.warning("hetero-vllm: not routing %s: %s", name, reason)
        report.not_routed(name, reason)
        return False
    replacement.vllm_op_name = getattr(vllm_cls, "name", name)
    replacement.vllm_class_name = name
    replacement.hetero_route = True  # the census tells hetero's replacements from vLLM's own subclasses
    CustomOp.register_oot(replacement, name=name)
    routes.append(name)
    return True
