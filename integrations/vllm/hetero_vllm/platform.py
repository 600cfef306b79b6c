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
plugin's routing. On any other device it is ``HeteroDevicePlatform``
(``_device_platform``): eager only, vLLM's stock GPU worker on a torch whose
device type is "cuda", a worker the user names on a PrivateUse1 device ("npu",
...). The device platform is chosen from the backend's class (``class_facts``):
nothing is instantiated and no probe runs (on "cuda" only
``torch.cuda.device_count()``, which NVML answers where it can), so the process
that forks the workers does not start the device. A device torch does not know
(its extension is not loaded) or a built-in torch type other than "cuda" gets no
platform (a logged reason). ``VLLM_TARGET_DEVICE=cpu`` makes vLLM skip every platform plugin.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PLATFORM_ENV",
    "BackendFacts",
    "activate",
    "backend_facts",
    "class_facts",
    "device_memory",
    "device_platform_refusal",
    "platform_requested",
]

#: The environment variable that asks for the hetero platform ("1"); unset or "0": vLLM's own platform.
PLATFORM_ENV = "HETERO_VLLM_PLATFORM"
#: The platform class ``activate()`` names for a backend on CPU tensors.
CPU_PLATFORM = "hetero_vllm._cpu_platform.HeteroCpuPlatform"
#: The platform class ``activate()`` names for a backend on a device other than the CPU.
DEVICE_PLATFORM = "hetero_vllm._device_platform.HeteroDevicePlatform"

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


def class_facts(name: str | None = None, *, registry: Any = None) -> BackendFacts:
    """The device facts of hetero backend ``name`` read from its class, without instantiating it.

    ``name``: None is ``HETERO_BACKEND``, else the available backend of highest
    priority (which runs the probes); a device index (``"cuda:1"``) is ignored.
    ``registry``: a ``hetero.registry.Registry`` (None: the process's). No probe
    runs for a given name, so ``device_name`` is the device type here (the
    platform asks the probe later, in the worker). Raises ``BackendNotFound`` for
    an unknown name and ``BackendUnavailable`` for a broken or incompatible plugin.
    """
    from hetero.errors import BackendUnavailable
    from hetero.registry import default_registry

    reg = registry if registry is not None else default_registry()
    name = name if name is not None else os.environ.get("HETERO_BACKEND") or None
    base = (name if name is not None else reg.select()).strip().split(":")[0]
    entry = reg.entry(base)
    if entry.cls is None or entry.status != "ok":
        raise BackendUnavailable(base, f"{entry.status}: {entry.problem}")
    return BackendFacts(
        backend=entry.name,
        device_type=entry.cls.device_type,
        device_name=entry.cls.device_type,
        dist_backend=entry.cls.process_group_backend(),
    )


def device_platform_refusal(facts: BackendFacts) -> str | None:
    """None when ``HeteroDevicePlatform`` can serve ``facts``'s device here, else why not.

    It serves a torch whose device type is "cuda" with a visible device (NVIDIA,
    ROCm/HIP and the vendor builds that present their chip as "cuda") and the
    PrivateUse1 device an out-of-tree torch extension registered under that name.
    """
    import torch

    kind = facts.device_type
    if kind == "cuda":
        # device_count() asks NVML (amdsmi on ROCm) first, which leaves the CUDA driver uninitialized in this
        # process: workers vLLM forks from it can still use the device
        if torch.cuda.device_count() == 0:
            return f"this torch ({torch.__version__}) sees no 'cuda' device"
        return None
    if kind == torch._C._get_privateuse1_backend_name():
        return None
    try:
        torch.device(kind)
    except RuntimeError:
        return (
            f"torch does not know device type {kind!r}: its torch extension is not loaded (install it so that "
            "torch loads it on import through the 'torch.backends' entry point, or import it before vLLM)"
        )
    return (
        f"{kind!r} is a device type built into torch, not 'cuda' or the PrivateUse1 device; the hetero device "
        "platform serves only those two"
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
    """The ``vllm.platform_plugins`` entry: the hetero platform's qualname when asked and possible, else None.

    ``CPU_PLATFORM`` for a backend whose tensors live on the CPU here, ``DEVICE_PLATFORM``
    for one on a device ``device_platform_refusal`` accepts; vLLM calls it twice per process.
    """
    if not platform_requested():
        return None
    try:
        facts = class_facts()
        if facts.device_type == "cpu" or facts.dist_backend == "gloo":
            # gloo carries CPU tensors: such a backend may run on CPU here whatever its class says (a Triton
            # backend under the interpreter); the instance knows, as it always did for the CPU platform
            facts = backend_facts(os.environ.get("HETERO_BACKEND") or facts.backend)
    except Exception as e:  # vLLM logs a raising platform plugin only at debug level
        _logger.warning("hetero-vllm: no hetero platform: %s: %s", type(e).__name__, e)
        return None
    if facts.device_type == "cpu":
        return CPU_PLATFORM
    why = device_platform_refusal(facts)
    if why is not None:
        _logger.warning(
            "hetero-vllm: no platform for backend %s on %r devices: %s; keeping vLLM's platform",
            facts.backend,
            facts.device_type,
            why,
        )
        return None
    return DEVICE_PLATFORM
