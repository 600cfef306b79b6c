"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, ...) as a vLLM attention backend on hetero
``write_mla_kv`` + ``mla_attention``, over vLLM's own latent cache.

vLLM's ``MLAAttention`` layer keeps its projections and the W_UK/W_UV absorption;
the backend (``_mla_backend.HeteroMLABackend``) serves its cache write and its
attention. A layer's cache is ``[NB, BS, L + R]`` (latent, then rope key);
``cache[..., :L]`` and ``cache[..., L:]`` are hetero's ``ckv_cache`` and
``kpe_cache``, as strided views. The metadata names every token a decode token,
so vLLM hands the whole step to ``forward_mqa`` (absorbed query ``[T, H, L]``
and rope query ``[T, H, R]``), where one hetero ``mla_attention`` call serves
prefill, chunked prefill and decode rows; no MLA prefill backend runs.

Registered as the new backend ``HETERO_MLA`` (vLLM's attention backend option)
and, on the CPU platform, in place of ``CPU_MLA`` and ``AMX_MLA``, which the CPU
platform picks for MLA models. Turned off with ``-MLAAttention`` in
``compilation_config.custom_ops``: each slot then builds vLLM's own impl and
metadata builder. Refused with a NotImplementedError naming the option: a
quantized KV cache (fp8), decode/prefill context parallelism, speculative
decoding, sliding windows, and sparse MLA (DeepSeek-V3.2's DSA).

The CPU platform (without AMX) forces block size 16 and turns chunked prefill
and prefix caching off for MLA models; the route runs under those settings, and
would serve chunked prefill and cached prefixes unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from hetero_vllm import report

__all__ = ["BACKEND_NAME", "ROUTED_CLASS", "opted_out", "note_opted_out", "register"]

#: The attention backend name this module registers (``AttentionBackendEnum.HETERO_MLA``).
BACKEND_NAME = "HETERO_MLA"
#: The vLLM layer class the route serves: its report entry, and ``-MLAAttention`` turns it off.
ROUTED_CLASS = "MLAAttention"

_logger = logging.getLogger("vllm.hetero_vllm")
_MODULE = "hetero_vllm._mla_backend"
_SLOTS = (("CPU_MLA", "HeteroMLABackend"), ("AMX_MLA", "HeteroAMXSlotMLABackend"))


def _current_config(vllm_config: Any = None) -> Any:
    if vllm_config is None:
        from vllm.config import get_current_vllm_config_or_none

        vllm_config = get_current_vllm_config_or_none()
    return vllm_config


def opted_out(vllm_config: Any = None) -> bool:
    """Whether ``compilation_config.custom_ops`` of ``vllm_config`` (None: vLLM's current one) names
    ``-MLAAttention``."""
    config = _current_config(vllm_config)
    ops = getattr(getattr(config, "compilation_config", None), "custom_ops", None) or ()
    return f"-{ROUTED_CLASS}" in ops


def note_opted_out(vllm_impl: str) -> None:
    """Report an MLA layer built on vLLM's ``vllm_impl`` because the user turned the route off."""
    config = _current_config()
    if config is not None:
        config.compilation_config.disabled_custom_ops.update([ROUTED_CLASS])
    report.not_routed(ROUTED_CLASS, f"turned off by compilation_config.custom_ops: vLLM's {vllm_impl}")


def register() -> list[str]:
    """Register ``HETERO_MLA`` and, on the CPU platform, the ``CPU_MLA``/``AMX_MLA`` overrides; returns the
    backend slots now served (a slot another plugin already overrides is left to it and reported)."""
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    path = f"{_MODULE}.HeteroMLABackend"
    if BACKEND_NAME in AttentionBackendEnum.__members__:
        register_backend(AttentionBackendEnum[BACKEND_NAME], path)
    else:
        register_backend(BACKEND_NAME, path)
    routes = [f"attention:{BACKEND_NAME}"]
    if not current_platform.is_cpu():
        return routes
    for name, cls in _SLOTS:
        slot, slot_path = AttentionBackendEnum[name], f"{_MODULE}.{cls}"
        if slot.is_overridden() and slot.get_path() != slot_path:
            reason = f"another plugin already overrides it ({slot.get_path()})"
            _logger.warning("hetero-vllm: not routing attention backend %s: %s", name, reason)
            report.not_routed(f"AttentionBackend[{name}]", reason)
            continue
        register_backend(slot, slot_path)
        routes.append(f"attention:{name}")
    return routes
