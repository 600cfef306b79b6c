"""``HeteroDevicePlatform``: a vLLM platform for a hetero backend whose device is not the CPU.

``hetero_vllm.platform.activate()`` names it for a backend on "cuda" (NVIDIA, ROCm/HIP and the
vendor torch builds that present their chip as "cuda") or on the PrivateUse1 device an
out-of-tree torch extension registers ("npu", ...). ``device_platform(facts)`` builds the class
from a backend's facts; ``HeteroDevicePlatform``, the name vLLM resolves, is that class for the
backend ``HETERO_BACKEND`` names, read from the backend's class (``platform.class_facts``), built
on first access: importing this module loads neither the backend nor a vendor extension.

What it sets (the contract; docs/vllm.md lists what has not run on a device):

- an out-of-tree platform (``PlatformEnum.OOT``): vLLM's CustomOps run ``forward_oot`` (their
  torch code unless hetero routes them); device type and name the backend's; dispatch key
  "CUDA" on cuda, "PrivateUse1" otherwise; ``dist_backend`` the backend's (nccl, hccl, ...);
- the worker: vLLM's stock GPU ``Worker`` and model runner on cuda. On a PrivateUse1 device the
  stock worker cannot start (it accepts only device type "cuda"), so the user names a worker
  for the device (``parallel_config.worker_cls``) and "auto" is refused;
- eager only: no ``torch.compile`` of the model and no CUDA graphs (hetero's ops have not been
  captured in a device graph), helpers compiled with the "eager" backend;
- attention: hetero's ``HeteroAttentionBackend`` for decoder self-attention;
- collectives: ``HeteroDeviceCommunicator`` (hetero's communicator on the device group);
- refused with a ``ValueError`` naming the option: quantization (weights or KV cache), LoRA,
  MLA and the sparse attention built on it, Ray, data parallelism without a visible-devices
  variable (PrivateUse1), and the stock worker on a PrivateUse1 device.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch
from vllm.platforms.interface import Platform, PlatformEnum

from hetero_vllm import report
from hetero_vllm.platform import BackendFacts, class_facts, device_memory

__all__ = [
    "ATTENTION_BACKEND",
    "COMMUNICATOR",
    "DEFAULT_BLOCK_SIZE",
    "STOCK_WORKER",
    "HeteroDevicePlatform",
    "device_platform",
]

#: vLLM's GPU worker, which accepts only device type "cuda" (``Worker.init_device``).
STOCK_WORKER = "vllm.v1.worker.gpu_worker.Worker"
#: The device communicator the platform names.
COMMUNICATOR = "hetero_vllm._device_communicator.HeteroDeviceCommunicator"
#: The attention backend the platform picks.
ATTENTION_BACKEND = "hetero_vllm.attention.HeteroAttentionBackend"
#: The KV-cache block size when the user gave none: the documented NPU paged-attention kernels take
#: multiples of 128 (hetero_ascend.support), and the portable Triton kernels take any size.
DEFAULT_BLOCK_SIZE = 128

_logger = logging.getLogger("vllm.hetero_vllm")

#: The class vLLM resolves: ``device_platform(class_facts())``, built on first access (module ``__getattr__``).
HeteroDevicePlatform: type[Platform]


class _DevicePlatform(Platform):
    """The methods of every ``HeteroDevicePlatform``; ``device_platform`` sets the device facts."""

    _enum = PlatformEnum.OOT
    #: The hetero backend's facts this class was built from.
    hetero_facts: ClassVar[BackendFacts]
    ray_device_key: str = ""  # no Ray
    simple_compile_backend: str = "eager"

    @classmethod
    def stock_worker(cls) -> bool:
        """Whether vLLM's stock GPU worker runs this device (a torch whose device type is "cuda")."""
        return cls.device_type == "cuda"

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        from hetero.registry import default_registry

        return default_registry().availability(cls.hetero_facts.backend).device_name or cls.device_type

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return device_memory(cls.device_type, device_id)[1]

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        index = torch.device(device).index if device is not None else None
        if index is None:
            index = torch.accelerator.current_device_index()
        free, total = device_memory(cls.device_type, index)
        return float(total - free)

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.accelerator.set_device_index(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        # torch.manual_seed, which vLLM calls first, already seeds every device torch knows
        module = getattr(torch, cls.device_type, None)
        if hasattr(module, "manual_seed_all"):
            module.manual_seed_all(seed)

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(
                f"hetero-vllm: the hetero device platform runs float32, float16 and bfloat16 models; got {dtype}"
            )

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        # pinned host memory needs the device's host allocator; torch's cuda has one, a PrivateUse1 device may not
        return cls.stock_worker()

    @classmethod
    def verify_quantization(cls, quant: str) -> None:
        if quant:
            raise ValueError(
                f"hetero-vllm: quantization={quant!r} is not supported on the hetero device platform: hetero routes "
                "no quantized linear layer and vLLM's quantized kernels are built for CUDA and CPU; load an "
                "unquantized checkpoint (quantization=None)"
            )

    @classmethod
    def get_punica_wrapper(cls) -> str:
        raise NotImplementedError("hetero-vllm: LoRA is not supported on the hetero device platform (enable_lora)")

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return COMMUNICATOR

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads: int | None = None) -> str:
        """hetero's attention backend; anything it does not serve is a NotImplementedError naming the feature."""
        c = attn_selector_config
        kind = str(getattr(c.attn_type, "value", c.attn_type))
        refused = [
            name
            for name, on in (
                ("MLA", c.use_mla),
                ("sparse attention", c.use_sparse),
                (f"{kind} attention (only decoder self-attention)", kind != "decoder"),
                (f"kv_cache_dtype={c.kv_cache_dtype!r} (only 'auto')", c.kv_cache_dtype not in (None, "auto")),
            )
            if on
        ]
        if refused:
            raise NotImplementedError(
                f"hetero-vllm: the hetero device platform has no attention backend for {', '.join(refused)}"
            )
        chosen = getattr(selected_backend, "name", selected_backend)
        if chosen not in (None, "CUSTOM"):
            raise ValueError(
                f"hetero-vllm: attention backend {chosen} was asked for (attention_config.backend); the hetero "
                "device platform serves attention only through hetero's backend (CUSTOM, or leave it unset)"
            )
        return ATTENTION_BACKEND

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        """Refuse what the platform cannot run (ValueError naming each option), pick the worker, turn compilation
        and graphs off, set the block size, then turn on the general plugin's routing in this process."""
        problems = cls._refusals(vllm_config)
        if problems:
            raise ValueError(
                f"hetero-vllm: the hetero device platform ({cls.device_type}, backend {cls.hetero_facts.backend}) "
                "cannot run this configuration: " + "; ".join(problems)
            )
        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = STOCK_WORKER
        cls._eager(vllm_config)
        cache = vllm_config.cache_config
        if not cache.user_specified_block_size:
            cache.block_size = DEFAULT_BLOCK_SIZE
        import hetero_vllm

        hetero_vllm.register()
        report.set_platform(f"{cls.__module__}.{cls.__qualname__}")

    @classmethod
    def _refusals(cls, vllm_config: Any) -> list[str]:
        model = vllm_config.model_config
        parallel = vllm_config.parallel_config
        found = []
        quant = getattr(model, "quantization", None)
        if quant:
            found.append(f"quantization={quant!r}: hetero routes no quantized linear layer; use an unquantized model")
        kv_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
        if kv_dtype != "auto":
            found.append(f"kv_cache_dtype={kv_dtype!r}: hetero's attention backend keeps the model's dtype ('auto')")
        if vllm_config.lora_config is not None:
            found.append("LoRA (enable_lora): the platform has no LoRA kernels (punica wrapper)")
        if getattr(model, "use_mla", False):
            found.append("MLA (DeepSeek-style attention, and the sparse attention built on it): not wired to hetero")
        if parallel.distributed_executor_backend == "ray" or parallel.data_parallel_backend == "ray":
            found.append("Ray (distributed_executor_backend / data_parallel_backend 'ray'): use 'mp' or 'uni'")
        if parallel.data_parallel_size > 1 and cls.device_control_env_var == Platform.device_control_env_var:
            found.append(
                f"data_parallel_size={parallel.data_parallel_size}: hetero knows no visible-devices variable for "
                f"{cls.device_type!r} to give each data-parallel rank its own device; use data_parallel_size=1"
            )
        worker = parallel.worker_cls
        if not cls.stock_worker() and worker in ("auto", STOCK_WORKER):
            found.append(
                f"worker_cls={worker!r}: vLLM's stock GPU worker accepts only device type 'cuda' "
                f"(Worker.init_device), this device is {cls.device_type!r}; name a worker for it with "
                "parallel_config.worker_cls (--worker-cls), e.g. the device vendor's vLLM worker"
            )
        return found

    @classmethod
    def _eager(cls, vllm_config: Any) -> None:
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        compilation = vllm_config.compilation_config
        if compilation.mode != CompilationMode.NONE:
            _logger.warning(
                "hetero-vllm: compilation mode %s -> NONE: the hetero device platform runs eager only (hetero's "
                "ops have not been compiled or captured for this device)",
                getattr(compilation.mode, "name", compilation.mode),
            )
            compilation.mode = CompilationMode.NONE
        if compilation.cudagraph_mode != CUDAGraphMode.NONE:
            _logger.warning(
                "hetero-vllm: cudagraph_mode %s -> NONE: the hetero device platform captures no graphs",
                compilation.cudagraph_mode.name,
            )
            compilation.cudagraph_mode = CUDAGraphMode.NONE
        # the stock model runner sizes its graph buffers from these
        compilation.cudagraph_capture_sizes = []
        compilation.max_cudagraph_capture_size = 0
        if vllm_config.model_config is not None:
            vllm_config.model_config.enforce_eager = True


def device_platform(facts: BackendFacts) -> type[Platform]:
    """The ``HeteroDevicePlatform`` class for a backend with ``facts`` (a device other than the CPU)."""
    if facts.device_type == "cpu":
        raise ValueError(
            f"hetero-vllm: backend {facts.backend} runs on CPU tensors; its platform is HeteroCpuPlatform, "
            "not the device platform"
        )
    cuda = facts.device_type == "cuda"
    attrs = {
        "__module__": __name__,
        "__qualname__": "HeteroDevicePlatform",
        "__doc__": f"vLLM on hetero backend {facts.backend}: {facts.device_type} devices, {facts.dist_backend}.",
        "hetero_facts": facts,
        "device_type": facts.device_type,
        "device_name": facts.device_type,  # vLLM builds torch.device(f"{device_name}:{index}") from it
        "dispatch_key": "CUDA" if cuda else "PrivateUse1",
        "dist_backend": facts.dist_backend,
        "device_control_env_var": "CUDA_VISIBLE_DEVICES" if cuda else Platform.device_control_env_var,
    }
    return type("HeteroDevicePlatform", (_DevicePlatform,), attrs)


def __getattr__(name: str) -> Any:
    # vLLM resolves "hetero_vllm._device_platform.HeteroDevicePlatform" once per process, after activate() chose it
    if name == "HeteroDevicePlatform":
        cls = device_platform(class_facts())
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
