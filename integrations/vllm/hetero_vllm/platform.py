"""The ``vllm.platform_plugins`` hook: a vLLM ``Platform`` whose device facts come from a hetero backend.

vLLM resolves its platform once per process, before any engine configuration
exists, by calling every platform plugin; ``activate()`` answers only when asked
(``HETERO_VLLM_PLATFORM=1``) and then names a Platform class built from the
backend ``HETERO_BACKEND`` names (unset: ``hetero.load()``'s choice):

- device type and name, and the ``torch.distributed`` backend: the hetero
  backend's ``device_type``, ``probe().device_name`` and ``dist_backend``;
- total and used device memory: ``device_memory()`` (torch's accelerator API on
  an accelerator, the operating system's page counts on CPU).

On a CPU backend the class is ``HeteroCpuPlatform``, a subclass of vLLM's
``CpuPlatform`` that picks the hetero attention backend and turns on the general
plugin's routing. A backend on any other device gets no platform (a logged
reason): a real chip also needs a worker and model runner, a device
communicator, graph capture, streams and events, and a torch dispatch key,
none of which a hetero backend describes (docs/vllm.md lists them).
``VLLM_TARGET_DEVICE=cpu`` makes vLLM skip every platform plugin.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

__all__ = ["PLATFORM_ENV", "BackendFacts", "activate", "backend_facts", "device_memory", "platform_requested"]

#: The environment variable that asks for the hetero platform ("1"); unset or "0": vLLM's own platform.
PLATFORM_ENV = "HETERO_VLLM_PLATFORM"
#: The platform class ``activate()`` names for a backend on CPU tensors.
CPU_PLATFORM = "hetero_vllm._cpu_platform.HeteroCpuPlatform"

_logger = logging.getLogger("vllm.hetero_vllm")


@dataclass(frozen=True)
class BackendFacts:
    """What a vLLM Platform takes from a hetero backend."""

    backend: str  #: the hetero backend's name
    device_type: str  #: torch device type of its tensors ("cpu", "cuda", "npu", ...)
    device_name: str  #: what its probe says it runs on
    dist_backend: str  #: torch.distributed backend of its collectives ("gloo", "nccl", "hccl", ...)


def platform_requested() -> bool:
    """Whether ``HETERO_VLLM_PLATFORM`` asks for the hetero platform."""
    return os.environ.get(PLATFORM_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def backend_facts(name: str | None = None) -> BackendFacts:
    """The device facts of hetero backend ``name`` (None: ``HETERO_BACKEND``, else hetero's choice)."""
    import hetero

    ops = hetero.load(name if name is not None else os.environ.get("HETERO_BACKEND") or None)
    backend = ops.backend
    probe = type(backend).probe()
    return BackendFacts(
        backend=ops.name,
        device_type=backend.device.type,
        device_name=probe.device_name or backend.device.type,
        dist_backend=type(backend).process_group_backend(),
    )


def _cpu_memory() -> tuple[int, int]:
    page = os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * page
    try:  # MemAvailable counts reclaimable page cache as free; SC_AVPHYS_PAGES does not
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024, total
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * page, total


def device_memory(device_type: str, index: int = 0) -> tuple[int, int]:
    """(free, total) bytes of device ``device_type:index``.

    CPU: the machine's physical memory (``/proc/meminfo`` MemAvailable, else
    ``os.sysconf``). Any other type: ``torch.accelerator.get_memory_info``, which
    torch and an out-of-tree device's torch extension (torch_npu, ...) provide.
    """
    if device_type == "cpu":
        return _cpu_memory()
    import torch

    free, total = torch.accelerator.get_memory_info(torch.device(device_type, index))
    return int(free), int(total)


def activate() -> str | None:
    """The ``vllm.platform_plugins`` entry: the hetero platform's qualname when asked and possible, else None."""
    if not platform_requested():
        return None
    try:
        facts = backend_facts()
    except Exception as e:  # vLLM logs a raising platform plugin only at debug level
        _logger.warning("hetero-vllm: no hetero platform: %s: %s", type(e).__name__, e)
        return None
    if facts.device_type != "cpu":
        _logger.warning(
            "hetero-vllm: no platform for backend %s on %r devices: a chip needs a worker/model runner, a device "
            "communicator, graph capture, streams/events and a dispatch key (see docs/vllm.md); keeping vLLM's "
            "platform",
            facts.backend,
            facts.device_type,
        )
        return None
    return CPU_PLATFORM
