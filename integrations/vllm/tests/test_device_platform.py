"""The device platform (``HeteroDevicePlatform``) without a device: which class ``activate()`` names, the
configuration it writes on a real ``VllmConfig`` and what it refuses and why (its attention and communicator:
test_device_attention.py).

No NPU or GPU and no engine: the backend facts come from backend classes (hetero's cuda backend, a fake "npu"
one that fails if instantiated or probed), and torch's device checks are monkeypatched where a device would
answer them.
"""

from __future__ import annotations

import copy
import logging
import re
from types import SimpleNamespace

import pytest
import torch
from vllm.config import CompilationMode, LoRAConfig, VllmConfig
from vllm.config.compilation import CUDAGraphMode
from vllm.utils.import_utils import resolve_obj_by_qualname
from vllm.v1.worker.worker_base import WorkerBase

import hetero
import hetero_vllm
from hetero_vllm import _device_platform as dp
from hetero_vllm import platform, report

NPU = platform.BackendFacts(backend="fake_npu", device_type="npu", device_name="npu", dist_backend="hccl")
CUDA = platform.BackendFacts(backend="fake_cuda", device_type="cuda", device_name="cuda", dist_backend="nccl")
NPU_WORKER = "vendor_npu.worker.NPUWorker"  # a user's worker for the device: named, never imported here


class FakeNpuBackend(hetero.Backend):
    """An "npu" backend whose class alone must give the facts: building or probing it fails the test."""

    name = "fake_npu"
    device_type = "npu"
    dist_backend = "hccl"
    spec_version = hetero.SPEC_VERSION

    def __init__(self, device=None):
        raise AssertionError("the device platform's selection instantiated the backend")

    @classmethod
    def probe(cls):
        raise AssertionError("the device platform's selection probed the backend")


class FakeNpuPlugin:
    @hetero.hookimpl
    def hetero_backends(self):
        return [FakeNpuBackend]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("HETERO_VLLM", "HETERO_BACKEND", "HETERO_VLLM_PLATFORM", "HETERO_TRITON_INTERPRET"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake_npu_registry(monkeypatch):
    """hetero's process registry replaced by one holding the reference and the fake npu backend."""
    import hetero.registry
    import hetero_cpu_ref.plugin

    registry = hetero.Registry(entry_points=[], env={})
    registry.register(hetero_cpu_ref.plugin, "cpu_ref")
    registry.register(FakeNpuPlugin(), "fake_npu")
    monkeypatch.setattr(hetero.registry, "default_registry", lambda: registry)
    return registry


def _select(monkeypatch, backend: str) -> str | None:
    monkeypatch.setenv(platform.PLATFORM_ENV, "1")
    monkeypatch.setenv("HETERO_BACKEND", backend)
    first = platform.activate()
    assert platform.activate() == first  # vLLM calls it twice per process
    return first


# -- selection ----------------------------------------------------------------------------------------------


def test_cpu_backend_still_gets_the_cpu_platform(monkeypatch):
    assert _select(monkeypatch, "cpu_ref") == platform.CPU_PLATFORM


@pytest.mark.parametrize("gpus", [1, 0])
def test_cuda_backend_gets_the_device_platform_where_a_gpu_is_visible(monkeypatch, caplog, gpus):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    expected = "hetero_vllm._device_platform.HeteroDevicePlatform" if gpus else None
    assert _select(monkeypatch, "cuda") == expected
    assert ("no platform for backend cuda on 'cuda' devices: this torch" in caplog.text) == (not gpus)


def test_interpreted_cuda_backend_runs_on_cpu_and_gets_the_cpu_platform(monkeypatch):
    """Under the Triton interpreter hetero's cuda backend takes CPU tensors: the instance decides, as before."""
    pytest.importorskip("triton")
    monkeypatch.setenv("HETERO_TRITON_INTERPRET", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # hetero sets it for Triton; this undoes it after the test
    assert platform.class_facts("cuda").dist_backend == "gloo"
    assert _select(monkeypatch, "cuda") == platform.CPU_PLATFORM


def test_privateuse1_backend_gets_the_device_platform_from_its_class(monkeypatch, fake_npu_registry):
    assert platform.class_facts("fake_npu") == platform.class_facts("fake_npu:1") == NPU
    with pytest.raises(hetero.BackendNotFound, match="no_such"):
        platform.class_facts("no_such")
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "npu")  # what torch_npu's import does
    assert _select(monkeypatch, "fake_npu") == platform.DEVICE_PLATFORM


def test_a_device_torch_cannot_serve_keeps_vllms_platform(monkeypatch, fake_npu_registry, caplog):
    assert torch._C._get_privateuse1_backend_name() == "privateuseone"  # no extension renamed it to "npu"
    assert _select(monkeypatch, "fake_npu") is None
    assert "torch does not know device type 'npu': its torch extension is not loaded" in caplog.text
    why = platform.device_platform_refusal(platform.BackendFacts("x", "xpu", "xpu", "xccl"))
    assert why is not None and "'xpu' is a device type built into torch" in why


def test_the_named_class_is_built_from_the_backend_class(monkeypatch):
    """What vLLM resolves: the class for HETERO_BACKEND's backend class, built on first access, once."""
    monkeypatch.setenv("HETERO_BACKEND", "cuda")
    vars(dp).pop("HeteroDevicePlatform", None)
    try:
        cls = resolve_obj_by_qualname(platform.DEVICE_PLATFORM)
        assert f"{cls.__module__}.{cls.__qualname__}" == platform.DEVICE_PLATFORM
        assert cls.hetero_facts == platform.BackendFacts("cuda", "cuda", "cuda", "nccl")
        assert (cls.device_type, cls.dispatch_key, cls.dist_backend) == ("cuda", "CUDA", "nccl")
        assert resolve_obj_by_qualname(platform.DEVICE_PLATFORM) is cls
    finally:
        vars(dp).pop("HeteroDevicePlatform", None)


# -- the class's attributes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "facts, dispatch_key, visible, pin",
    [
        (CUDA, "CUDA", "CUDA_VISIBLE_DEVICES", True),
        (NPU, "PrivateUse1", "VLLM_DEVICE_CONTROL_ENV_VAR_PLACEHOLDER", False),
    ],
)
def test_platform_attributes(facts, dispatch_key, visible, pin):
    cls = dp.device_platform(facts)
    plat = cls()
    assert plat.is_out_of_tree() and not plat.is_cuda() and not plat.is_cpu()
    assert (cls.device_type, cls.device_name, cls.dist_backend) == (facts.device_type,) * 2 + (facts.dist_backend,)
    assert (cls.dispatch_key, cls.device_control_env_var, cls.is_pin_memory_available()) == (dispatch_key, visible, pin)
    assert (cls.ray_device_key, cls.simple_compile_backend, cls.get_compile_backend()) == ("", "eager", "eager")
    assert cls.support_static_graph_mode() is False
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        cls.check_if_supports_dtype(dtype)
    with pytest.raises(ValueError, match=r"float32, float16 and bfloat16 models; got torch.float64"):
        cls.check_if_supports_dtype(torch.float64)


def test_cpu_facts_are_not_a_device_platform():
    with pytest.raises(ValueError, match="HeteroCpuPlatform"):
        dp.device_platform(platform.BackendFacts("cpu_ref", "cpu", "cpu", "gloo"))


# -- the configuration it writes ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def _base_config():
    return VllmConfig()  # no model: this process's platform (vLLM's CPU one) has already been over it


@pytest.fixture
def vllm_config(_base_config, monkeypatch):
    """A fresh real VllmConfig as a user's would reach the platform: worker "auto", vLLM's compilation and graphs,
    no block size given. ``hetero_vllm.register`` is recorded, not run."""
    config = copy.deepcopy(_base_config)
    config.parallel_config.worker_cls = "auto"
    config.compilation_config.mode = CompilationMode.VLLM_COMPILE
    config.compilation_config.cudagraph_mode = CUDAGraphMode.PIECEWISE
    config.compilation_config.cudagraph_capture_sizes = [1, 2, 4]
    config.cache_config.block_size = 16
    config.cache_config.user_specified_block_size = False
    config.model_config = SimpleNamespace(quantization=None, use_mla=False, enforce_eager=False)
    calls = []
    monkeypatch.setattr(hetero_vllm, "register", lambda: calls.append("register"))
    config.register_calls = calls
    return config


def test_cuda_config_uses_the_stock_worker_eagerly(vllm_config, caplog):
    cls = dp.device_platform(CUDA)
    with caplog.at_level(logging.WARNING, logger="vllm.hetero_vllm"):
        cls.check_and_update_config(vllm_config)
    assert vllm_config.parallel_config.worker_cls == "vllm.v1.worker.gpu_worker.Worker"
    assert issubclass(resolve_obj_by_qualname(vllm_config.parallel_config.worker_cls), WorkerBase)
    comp = vllm_config.compilation_config
    assert (comp.mode, comp.cudagraph_mode) == (CompilationMode.NONE, CUDAGraphMode.NONE)
    assert (comp.cudagraph_capture_sizes, comp.max_cudagraph_capture_size) == ([], 0)
    assert vllm_config.model_config.enforce_eager is True
    assert vllm_config.cache_config.block_size == 128
    assert "compilation mode VLLM_COMPILE -> NONE" in caplog.text and "cudagraph_mode PIECEWISE -> NONE" in caplog.text
    assert vllm_config.register_calls == ["register"]
    assert report.snapshot()["platform"] == "hetero_vllm._device_platform.HeteroDevicePlatform"


def test_user_choices_are_kept(vllm_config):
    vllm_config.parallel_config.worker_cls = NPU_WORKER
    vllm_config.cache_config.block_size = 32
    vllm_config.cache_config.user_specified_block_size = True
    dp.device_platform(NPU).check_and_update_config(vllm_config)
    assert vllm_config.parallel_config.worker_cls == NPU_WORKER
    assert vllm_config.cache_config.block_size == 32


@pytest.mark.parametrize("worker", ["auto", "vllm.v1.worker.gpu_worker.Worker"])
def test_npu_with_the_stock_worker_is_refused(vllm_config, worker):
    vllm_config.parallel_config.worker_cls = worker
    with pytest.raises(ValueError, match=re.escape(f"worker_cls={worker!r}: vLLM's stock GPU worker accepts only")):
        dp.device_platform(NPU).check_and_update_config(vllm_config)
    assert vllm_config.parallel_config.worker_cls == worker and vllm_config.register_calls == []  # nothing written


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: setattr(c.model_config, "quantization", "fp8"), "quantization='fp8': hetero routes no quantized"),
        (lambda c: setattr(c.cache_config, "cache_dtype", "fp8"), "kv_cache_dtype='fp8'"),
        (lambda c: setattr(c, "lora_config", LoRAConfig()), r"LoRA \(enable_lora\)"),
        (lambda c: setattr(c.model_config, "use_mla", True), r"MLA \(DeepSeek-style attention, and the sparse"),
        (lambda c: setattr(c.parallel_config, "distributed_executor_backend", "ray"), r"Ray \(distributed_executor"),
    ],
    ids=["quantization", "kv-cache-dtype", "lora", "mla", "ray"],
)
def test_refusals_name_the_option(vllm_config, change, message):
    change(vllm_config)
    with pytest.raises(ValueError, match=r"the hetero device platform \(cuda, backend fake_cuda\) cannot run") as e:
        dp.device_platform(CUDA).check_and_update_config(vllm_config)
    assert re.search(message, str(e.value)), str(e.value)
    assert vllm_config.parallel_config.worker_cls == "auto" and vllm_config.register_calls == []


def test_data_parallel_needs_a_visible_devices_variable(vllm_config):
    vllm_config.parallel_config.worker_cls = NPU_WORKER
    vllm_config.parallel_config.data_parallel_size = 2
    with pytest.raises(ValueError, match=r"data_parallel_size=2: hetero knows no visible-devices variable for 'npu'"):
        dp.device_platform(NPU).check_and_update_config(vllm_config)
    dp.device_platform(CUDA).check_and_update_config(vllm_config)  # CUDA_VISIBLE_DEVICES splits the GPUs
