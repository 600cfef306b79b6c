"""The engine's host time per step: the ``LLM`` methods ``hetero profile`` wraps while it runs.

Wrapped as attributes of the one ``LLM`` instance (its class and every other
engine are untouched) and put back by ``restore``: ``step``, the scheduler's
``schedule`` and ``postprocess``, the step buffers' ``fill`` (the step metadata)
and the sampler. A step's parts, in host seconds:

- ``scheduler``: schedule + postprocess; ``metadata``: building the step tensors;
- ``op calls``: inside op calls (on a device: launching them, the device time is in the op table);
- ``device wait``: on a device, the synchronize before sampling, waiting for the step's kernels;
- ``sampling``: the sampler (tokens and their logprobs); ``profiler``: the op hook's own work
  (byte/flop model, bookkeeping);
- ``other host``: the rest of the step (plan, cache ops, embedding and glue between ops, outputs).

Phase: a step is "prefill" when its batch holds prompt chunks only (``Step.prefill``),
"decode" when every sequence has one row, "mixed" when continuous batching put decodes
and prompt chunks in one forward (their op calls are one call each, so they are not
split); a step that computes no rows is "empty".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from hetero.tools.profile._timer import OpTimer

__all__ = ["HOST_PARTS", "StepTimes", "HostClock"]

_MISSING = object()
HOST_PARTS = ("scheduler", "metadata", "op calls", "device wait", "sampling", "profiler", "other host")


@dataclass
class StepTimes:
    """One engine step: its phase, rows computed, wall seconds and their split over ``HOST_PARTS``."""

    index: int
    phase: str = "empty"
    tokens: int = 0
    seconds: float = 0.0
    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(HOST_PARTS, 0.0))


class _TimedSampler:
    """The runner's sampler, timed; on a device it first waits for the step's kernels."""

    def __init__(self, sampler: Any, clock: HostClock):
        self._sampler, self._clock = sampler, clock

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._sampler, name)
        if name == "logprobs":  # the sampled tokens' logprobs, when a request asks: sampling work too
            return self._clock.timed("sampling", value)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        clock = self._clock
        if clock.timer.device.type != "cpu":
            with clock.part("device wait"):
                torch.accelerator.synchronize(clock.timer.device)
        with clock.part("sampling"):
            return self._sampler(*args, **kwargs)


def _phase(step: Any) -> str:
    """ "prefill" (prompt chunks only), "decode" (one-row sequences only) or "mixed" (both in one batch)."""
    if step.prefill is None:
        return "decode"
    return "mixed" if step.num_decodes else "prefill"


class _Part:
    def __init__(self, clock: HostClock, name: str):
        self.clock, self.name = clock, name

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        if self.clock.current is not None:
            self.clock.current.parts[self.name] += time.perf_counter() - self.start


class HostClock:
    """Times ``llm``'s steps and their host parts into ``steps`` until ``restore()``; labels ``timer``'s calls."""

    def __init__(self, llm: Any, timer: OpTimer):
        self.timer = timer
        self.steps: list[StepTimes] = []
        self.current: StepTimes | None = None
        self._saved: list[tuple[Any, str, Any]] = []  # (owner, attribute, its own value or _MISSING)
        sched, runner = llm.scheduler, llm.runner
        self._wrap(llm, "step", self._step)
        self._wrap(sched, "schedule", lambda fn: self.timed("scheduler", fn))
        self._wrap(sched, "postprocess", lambda fn: self.timed("scheduler", fn))
        self._wrap(runner.buffers, "fill", self._fill)
        self._wrap(runner, "sampler", lambda sampler: _TimedSampler(sampler, self))

    def _wrap(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        self._saved.append((owner, attr, vars(owner).get(attr, _MISSING)))
        setattr(owner, attr, make(getattr(owner, attr)))

    def part(self, name: str) -> _Part:
        return _Part(self, name)

    def timed(self, name: str, fn: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self.part(name):
                return fn(*args, **kwargs)

        return call

    def _fill(self, fn: Callable) -> Callable:
        def fill(*args: Any, **kwargs: Any) -> Any:
            with self.part("metadata"):
                out = fn(*args, **kwargs)
            step = out[0]
            if self.current is not None:
                self.current.phase = _phase(step)
                self.current.tokens = step.num_tokens
                self.timer.phase = self.current.phase
            return out

        return fill

    def _step(self, fn: Callable) -> Callable:
        def step(*args: Any, **kwargs: Any) -> Any:
            timer = self.timer
            self.current = record = StepTimes(len(self.steps))
            timer.phase, timer.step = "-", record.index
            in_ops, overhead = timer.host_in_ops, timer.overhead
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                record.seconds = time.perf_counter() - start
                record.parts["op calls"] = timer.host_in_ops - in_ops
                record.parts["profiler"] = timer.overhead - overhead
                known = sum(v for k, v in record.parts.items() if k != "other host")
                record.parts["other host"] = max(record.seconds - known, 0.0)
                self.steps.append(record)
                self.current, timer.phase, timer.step = None, "-", -1
                timer.resolve()

        return step

    def restore(self) -> None:
        """Put back every wrapped attribute (idempotent)."""
        for owner, attr, own in reversed(self._saved):
            if own is _MISSING:
                vars(owner).pop(attr, None)  # the class's method shows through again
            else:
                setattr(owner, attr, own)
        self._saved = []
