"""The device platform (``HeteroDevicePlatform``) without a device: its attention choice and refusals, the
quantization and LoRA hooks, and its device communicator over a one-rank gloo group."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase
from vllm.utils.import_utils import resolve_obj_by_qualname
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig

from hetero_vllm import _device_platform as dp
from hetero_vllm import platform

NPU = platform.BackendFacts(backend="fake_npu", device_type="npu", device_name="npu", dist_backend="hccl")
CUDA = platform.BackendFacts(backend="fake_cuda", device_type="cuda", device_name="cuda", dist_backend="nccl")
NPU_WORKER = "vendor_npu.worker.NPUWorker"  # a user's worker for the device: named, never imported here


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("HETERO_VLLM", "HETERO_BACKEND", "HETERO_VLLM_PLATFORM", "HETERO_TRITON_INTERPRET"):
        monkeypatch.delenv(name, raising=False)


# -- attention, and the platform hooks for quantization and LoRA ----------------------------------------------


def _attn(**kw) -> AttentionSelectorConfig:
    return AttentionSelectorConfig(head_size=64, dtype=torch.float16, kv_cache_dtype="auto", block_size=128, **kw)


def test_attention_is_hetero_s_backend():
    from hetero_vllm.attention import HeteroAttentionBackend

    cls = dp.device_platform(NPU)
    for selected in (None, AttentionBackendEnum.CUSTOM):
        path = cls.get_attn_backend_cls(selected, _attn(), num_heads=8)
        assert path == "hetero_vllm.attention.HeteroAttentionBackend"
        assert resolve_obj_by_qualname(path) is HeteroAttentionBackend
    with pytest.raises(ValueError, match=r"attention backend FLASH_ATTN was asked for \(attention_config.backend\)"):
        cls.get_attn_backend_cls(AttentionBackendEnum.FLASH_ATTN, _attn(), num_heads=8)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"use_mla": True}, "no attention backend for MLA"),
        ({"use_sparse": True}, "no attention backend for sparse attention"),
        ({"attn_type": "encoder_only"}, r"encoder_only attention \(only decoder self-attention\)"),
    ],
)
def test_attention_refusals(kw, message):
    with pytest.raises(NotImplementedError, match=message):
        dp.device_platform(NPU).get_attn_backend_cls(None, _attn(**kw), num_heads=8)


def test_quantization_and_lora_hooks_refuse():
    cls = dp.device_platform(CUDA)
    cls.verify_quantization(None)
    with pytest.raises(ValueError, match=r"quantization='awq' is not supported on the hetero device platform"):
        cls.verify_quantization("awq")
    with pytest.raises(NotImplementedError, match=r"LoRA is not supported .* \(enable_lora\)"):
        cls.get_punica_wrapper()


# -- the device communicator ----------------------------------------------------------------------------------


@pytest.fixture
def gloo_world():
    """A one-rank gloo process group in this process (a device group stand-in: same calls, CPU tensors)."""
    from torch.distributed import HashStore

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_the_communicator_delegates_to_hetero(monkeypatch, gloo_world):
    from hetero.spec.comm import Communicator
    from hetero_vllm._device_communicator import HeteroDeviceCommunicator

    for facts in (CUDA, NPU):
        path = dp.device_platform(facts).get_device_communicator_cls()
        assert path == "hetero_vllm._device_communicator.HeteroDeviceCommunicator"
        assert resolve_obj_by_qualname(path) is HeteroDeviceCommunicator
    assert issubclass(HeteroDeviceCommunicator, DeviceCommunicatorBase)
    assert HeteroDeviceCommunicator(cpu_group=gloo_world, device_group=None).hetero is None  # vLLM's base serves
    monkeypatch.setenv("HETERO_BACKEND", "cpu_ref")
    comm = HeteroDeviceCommunicator(cpu_group=gloo_world, device=torch.device("cpu"), device_group=gloo_world)
    assert isinstance(comm.hetero, Communicator)
    calls = []

    def spy(name, real):
        return lambda *args: calls.append(name) or real(*args)

    for name in ("all_reduce", "all_gather", "broadcast"):
        monkeypatch.setattr(comm.hetero, name, spy(name, getattr(comm.hetero, name)))
    x = torch.arange(6.0).reshape(2, 3)
    summed = comm.all_reduce(x)
    assert torch.equal(summed, x) and summed is not x  # hetero's all_reduce returns a new tensor
    assert torch.equal(comm.all_gather(x, dim=-1), x)
    assert comm.broadcast(x, 0) is x  # in place, as vLLM's contract says
    assert calls == ["all_reduce", "all_gather"]  # one rank: broadcast is vLLM's no-op
