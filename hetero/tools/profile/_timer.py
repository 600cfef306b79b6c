"""The op hook of ``hetero profile``: times every op call and records its byte/flop work.

On the CPU each call is bracketed by ``time.perf_counter_ns`` (the caller pauses the
garbage collector for the run). On an accelerator two timing events
(``torch.Event``) are recorded on the current stream around the call and resolved
after a synchronize (``resolve``, once per engine step): the time is what the
device spent from the op's first kernel to its last. Either way the hook's own
work (the byte/flop model, the bookkeeping) runs outside the timed span and is
summed in ``overhead``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from hetero.bench.model import Work, work
from hetero.engine.instrument import OpSite
from hetero.spec import OPS

__all__ = ["OpCall", "OpTimer", "call_work"]


@dataclass
class OpCall:
    """One op call: ``start`` and ``seconds`` on the timing clock (host, or device events), ``start``
    relative to the profile's start; ``work`` None where the byte/flop model has no figure for it."""

    op: str
    path: str
    layer: str
    phase: str
    step: int
    start: float
    seconds: float
    work: Work | None
    dtype: str


def call_work(op: str, args: tuple, kwargs: dict[str, Any]) -> tuple[Work | None, str, str]:
    """(work, dtype name, "") of one call from ``hetero.bench.model``, or (None, dtype, why not)."""
    dtype = next(
        (
            str(a.dtype).removeprefix("torch.")
            for a in (*args, *kwargs.values())
            if isinstance(a, torch.Tensor) and a.is_floating_point()
        ),
        "-",
    )
    try:
        bound = OPS[op].signature.bind(*args, **kwargs)
        return work(op, bound.arguments), dtype, ""
    except Exception as e:  # an op without a formula, or arguments it cannot read: "-", never a guess
        return None, dtype, f"{type(e).__name__}: {e}"


class OpTimer:
    """``hook(site, fn, args, kwargs)`` for ``hetero.engine.instrument``; ``kinds`` maps module paths
    to layer kinds. ``phase`` and ``step`` label the calls made until they change."""

    def __init__(self, device: torch.device, kinds: dict[str, str]):
        self.device = device
        self.kinds = kinds
        self.calls: list[OpCall] = []
        self.phase, self.step = "-", -1
        self.host_in_ops = 0.0  # host seconds inside op calls (on a device: launching them)
        self.overhead = 0.0  # host seconds the hook adds
        self.no_model: dict[str, str] = {}  # op -> why the byte/flop model gave no figure
        self._pending: list[tuple[OpCall, Any, Any]] = []
        self._events = device.type != "cpu"
        self._origin_ns = time.perf_counter_ns()
        self._origin = self._event() if self._events else None

    def _event(self) -> Any:
        event = torch.Event(device=self.device, enable_timing=True)
        event.record()
        return event

    def __call__(self, site: OpSite, fn: Callable, args: tuple, kwargs: dict[str, Any]) -> Any:
        begin = self._event() if self._events else None
        t0 = time.perf_counter_ns()
        out = fn(*args, **kwargs)
        t1 = time.perf_counter_ns()
        end = self._event() if self._events else None
        w, dtype, why = call_work(site.op, args, kwargs)
        if why:
            self.no_model.setdefault(site.op, why)
        call = OpCall(
            site.op,
            site.path,
            self.kinds.get(site.path, "other"),
            self.phase,
            self.step,
            (t0 - self._origin_ns) / 1e9,
            (t1 - t0) / 1e9,
            w,
            dtype,
        )
        if self._events:
            self._pending.append((call, begin, end))
        else:
            self.calls.append(call)
        self.host_in_ops += (t1 - t0) / 1e9
        self.overhead += (time.perf_counter_ns() - t1) / 1e9
        return out

    def resolve(self) -> None:
        """Device events: wait for them and move their calls, timed, to ``calls``."""
        if not self._pending:
            return
        torch.accelerator.synchronize(self.device)
        for call, begin, end in self._pending:
            call.start = self._origin.elapsed_time(begin) / 1e3
            call.seconds = begin.elapsed_time(end) / 1e3
            self.calls.append(call)
        self._pending = []
