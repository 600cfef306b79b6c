"""The ``torch`` backend: PyTorch's own batched, fused operators on whatever device the tensors live on.

For chips that reach PyTorch as a device (cuda, xpu, mps, or a PrivateUse1 device such as
``mlu`` or ``musa``) before they have a Triton compiler. Each op family is one module
(``layers``, ``gemm``, ``moe``, ``attention``, ...); a module's ``__all__`` lists the spec ops it
implements, and every other op resolves to the reference and is reported as fallback.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch

import hetero
from hetero.spec import SPEC_VERSION
from hetero_torch import _step_plan

__all__ = ["TorchBackend", "hetero_backends", "FAMILIES"]

#: the modules holding the op families this backend implements
FAMILIES = ("layers", "gemm", "moe", "attention", "recurrent", "ep", "hyper", "compressed", "sampling")
_DIST = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl"}


def _default_device() -> torch.device:
    acc = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    return torch.device(acc.type if acc is not None else "cpu")


class TorchBackend(hetero.Backend):
    """Every op it implements from torch operators, batched over sequences; its device is torch's
    current accelerator, else the CPU, or the one given (``hetero.load("torch", device="xpu:0")``)."""

    name = "torch"
    device_type = _default_device().type
    priority = -100  # above the reference, below every vendor backend
    dist_backend = _DIST.get(device_type, "gloo")
    spec_version = SPEC_VERSION

    @classmethod
    def probe(cls) -> hetero.Availability:
        device = _default_device()
        return hetero.Availability(
            ok=True,
            device_name=f"{device.type} (torch {torch.__version__})",
            details={"device": device.type, "threads": torch.get_num_threads()},
        )

    def supports(self, op: str, **static: Any) -> str | None:
        from hetero_torch import _support

        return _support.reason(op, static, self.device)

    # the step plan's hooks (spec 1.6): hetero_torch._step_plan
    plan_attention = staticmethod(_step_plan.plan_attention)
    plan_recurrent = staticmethod(_step_plan.plan_recurrent)


def _families() -> list[ModuleType]:
    """The family modules of FAMILIES that are present."""
    modules = []
    for family in FAMILIES:
        try:
            modules.append(importlib.import_module(f"hetero_torch.{family}"))
        except ModuleNotFoundError as e:
            if e.name != f"hetero_torch.{family}":
                raise
    return modules


TorchBackend.bind_from(*_families())


@hetero.hookimpl
def hetero_backends() -> list[type[hetero.Backend]]:
    return [TorchBackend]
