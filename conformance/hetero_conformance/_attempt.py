"""One malformed call, made in this process: its verdict (``CallResult``) and the attempt that classifies it.

A fork-server child (``hetero_conformance._forkserver``) runs :func:`attempt`; the
parent (``hetero_conformance.robustness``) only reads the verdicts.
"""

from __future__ import annotations

import importlib
import re
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hetero.distributed import TorchCommunicator
from hetero.errors import HeteroError
from hetero.verify.calls import call as bind_call
from hetero_conformance.cases.malformed import DEFAULT, Malformed
from hetero_conformance.suite import SelectionError

__all__ = ["STATUSES", "CallResult", "acceptable", "load_calls", "one_rank_comm", "attempt"]

STATUSES = ("rejected", "silent", "unclear", "crashed", "timeout", "fallback")


@dataclass
class CallResult:
    """The verdict on one malformed call."""

    id: str
    op: str
    family: str
    defect: str
    arg: str
    index: bool
    status: str
    ok: bool
    message: str = ""
    seconds: float = 0.0

    @classmethod
    def of(cls, call: Malformed, status: str, message: str, *, validate: bool, seconds: float = 0.0) -> "CallResult":
        return cls(
            call.id,
            call.op,
            call.family,
            call.defect,
            call.arg,
            call.index,
            status,
            acceptable(status, call.index, validate),
            message,
            seconds,
        )

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def acceptable(status: str, index: bool, validate: bool) -> bool:
    """Whether ``status`` passes: rejected or fallback; silent too for an index defect with validation off.
    unclear, crashed and timeout fail in either mode."""
    return status in ("rejected", "fallback") or (status == "silent" and index and not validate)


def load_calls(ref: str = DEFAULT) -> list[Malformed]:
    """The calls of catalog ``module:function`` (the function takes no argument)."""
    module, _, func = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module), func or "catalog")
    except (ImportError, AttributeError) as e:
        raise SelectionError(f"cannot load the malformed-call catalog '{ref}': {e}") from e
    return list(fn())


def one_rank_comm(ops: Any) -> Any:
    """A communicator over a one-rank process group of the backend's process-group backend (ep ops)."""
    if not dist.is_initialized():
        if ops.device.type != "cpu" and hasattr(getattr(torch, ops.device.type, None), "set_device"):
            getattr(torch, ops.device.type).set_device(ops.device)
        pg = type(ops.backend).process_group_backend()
        dist.init_process_group(backend=pg, store=dist.HashStore(), rank=0, world_size=1)
    return TorchCommunicator(None, timeout=30.0)


def _text(e: BaseException) -> str:
    return traceback.format_exception_only(type(e), e)[-1].strip()


def _classify(call: Malformed, error: BaseException | None, validate: bool) -> tuple[str, str]:
    if error is None:
        mode = "validation on" if validate else "validation off"
        return "silent", f"returned normally ({mode}): the malformed '{call.arg}' was not rejected"
    if isinstance(error, HeteroError) and re.search(
        rf"\b{re.escape(call.op)}\b", str(error)
    ):  # "gemm" is not named by "grouped_gemm"
        return "rejected", _text(error)
    if isinstance(error, HeteroError):
        return "unclear", f"a hetero error that does not name the op '{call.op}': {_text(error)}"
    return "unclear", f"raised {_text(error)} (expected hetero.OpError naming '{call.op}')"


def attempt(ops: Any, call: Malformed, *, seed: int = 0) -> CallResult:
    """Make one malformed call on ``ops`` in this process and classify its outcome (a forked
    worker runs this: a backend that crashes takes only the worker down)."""
    validate = bool(ops.validate)
    start = time.perf_counter()
    binding, _ = ops.native(call.op)
    if binding is None:
        return CallResult.of(
            call,
            "fallback",
            "the op is not native: the reference ran, nothing of the backend was tested",
            validate=validate,
        )
    try:
        draw = call.draw(seed, ops.device, ops, lambda: one_rank_comm(ops))
        args = call.inputs(draw)
    except Exception as e:
        return CallResult.of(
            call, "unclear", f"drawing the call failed (its valid half did not run): {_text(e)}", validate=validate
        )
    error: BaseException | None = None
    try:
        bind_call(getattr(ops, call.op), call.op, args)
        if ops.device.type != "cpu" and hasattr(torch, "accelerator"):
            torch.accelerator.synchronize()  # an asynchronous device fault surfaces here, inside the call
    except Exception as e:
        error = e
    status, message = _classify(call, error, validate)
    return CallResult.of(call, status, message, validate=validate, seconds=time.perf_counter() - start)
