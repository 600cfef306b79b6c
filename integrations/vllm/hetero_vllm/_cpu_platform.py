"""``HeteroCpuPlatform``: vLLM's CPU platform with its device facts from a CPU hetero backend.

Imported only when ``hetero_vllm.platform.activate()`` named it, so the backend
(``HETERO_BACKEND``, else hetero's choice) is loaded once, here, to fill the class
attributes vLLM reads: ``device_type``, ``dist_backend`` and, through the class
methods, the device name and memory. Everything else (worker, model runner,
communicator, compilation settings) is ``CpuPlatform``'s.
"""

from __future__ import annotations

import torch
from vllm.platforms.cpu import CpuPlatform

from hetero_vllm import report
from hetero_vllm.platform import backend_facts, device_memory

__all__ = ["HeteroCpuPlatform"]

_FACTS = backend_facts()


class HeteroCpuPlatform(CpuPlatform):
    """vLLM's CPU platform on hetero backend ``hetero_facts.backend``: hetero attention, routing on."""

    hetero_facts = _FACTS
    device_type: str = _FACTS.device_type
    device_name: str = _FACTS.device_type
    dist_backend: str = _FACTS.dist_backend

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return cls.hetero_facts.device_name

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return device_memory(cls.device_type, device_id)[1]

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        free, total = device_memory(cls.device_type)
        return float(total - free)

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads: int | None = None) -> str:
        """hetero's paged attention for decoder attention, hetero's sparse MLA for DSA (which the CPU platform
        refuses); dense MLA and non-decoder attention keep the CPU platform's choice."""
        other = str(getattr(attn_selector_config.attn_type, "value", attn_selector_config.attn_type)) != "decoder"
        if attn_selector_config.use_mla and attn_selector_config.use_sparse and not other:
            from hetero_vllm.dsa import backend_path

            return backend_path()
        if attn_selector_config.use_mla or attn_selector_config.use_sparse or other:
            return super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
        from hetero_vllm.attention import HeteroAttentionBackend

        return f"{HeteroAttentionBackend.__module__}.{HeteroAttentionBackend.__qualname__}"

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        """The CPU platform's settings, then hetero's routing in this process (the general plugin's ``register``)."""
        super().check_and_update_config(vllm_config)
        import hetero_vllm

        hetero_vllm.register()
        report.set_platform(f"{cls.__module__}.{cls.__qualname__}")
