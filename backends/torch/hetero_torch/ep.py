"""Expert-parallel dispatch and combine: the core's device-agnostic implementation (``hetero.ep``),
whose exchanges go through the communicator, that is the device's torch.distributed backend
(gloo on the CPU, nccl on cuda, xccl on xpu, or what a PrivateUse1 device registers)."""

from __future__ import annotations

from hetero.ep import ep_combine, ep_dispatch

__all__ = ["ep_dispatch", "ep_combine"]
