"""``hetero profile``: per-op time, achieved GB/s and TFLOP/s and roofline fraction of an engine run.

    from hetero.engine import LLM
    from hetero.bench.engine import Workload
    from hetero.tools.profile import profile_run

    report = profile_run(LLM(model_dir, backend="cpu_ref"), Workload(4, (16, 32), (4, 8)))
    report.as_dict()["ops"]["gemm"]["all"]     # calls, total_s, mean_s, pct_of_step, gb_s, tflop_s, ...
    report.write_trace("trace.json")          # open in Perfetto / chrome://tracing

``Profiler`` routes every op call of the model through a timing hook (the op-call
seam, ``hetero.engine.instrument``) and, on an ``LLM``, also times the engine's
host work per step; ``stop()`` puts back the exact callables and methods, so a
model profiled and stopped runs as one never profiled. Timing: ``perf_counter``
with the garbage collector paused on the CPU, device events on an accelerator.
"""

from __future__ import annotations

import gc
from typing import Any

import torch
from torch import nn

from hetero.bench.devices import Ceilings, device_label
from hetero.engine.instrument import Instrumented, instrument, op_sites
from hetero.tools.profile._host import HOST_PARTS, HostClock, StepTimes
from hetero.tools.profile._layers import LAYER_KINDS, layer_kinds
from hetero.tools.profile._report import ALL, PHASES, Figures, ProfileReport
from hetero.tools.profile._timer import OpCall, OpTimer

__all__ = [
    "Profiler",
    "ProfileReport",
    "Figures",
    "OpCall",
    "StepTimes",
    "profile_run",
    "HOST_PARTS",
    "LAYER_KINDS",
    "PHASES",
    "ALL",
]


def _device_of(model: nn.Module) -> torch.device:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


class Profiler:
    """Times every op call of ``target`` (an ``LLM``, or any model built from engine layers) while started.

    On an ``LLM`` the calls are labelled with their step and phase, and the host
    parts of each step are timed (``hetero.tools.profile._host``). ``ceilings``:
    the device's roofline ceilings (None: roofline fractions are "-", with
    ``ceilings_note`` saying why); ``device_name``: the accelerator's name for the label.
    """

    def __init__(
        self, target: Any, *, ceilings: Ceilings | None = None, ceilings_note: str = "", device_name: str = ""
    ):
        self.llm = target if hasattr(target, "runner") else None
        self.model: nn.Module = target.runner.model if self.llm is not None else target
        if not isinstance(self.model, nn.Module):
            raise ValueError(f"Profiler: expected an LLM or a torch.nn.Module, got {type(target).__name__}")
        self.device = self.llm.runner.device if self.llm is not None else _device_of(self.model)
        self.ceilings, self.ceilings_note = ceilings, ceilings_note
        self.label = device_label(self.device, device_name)
        self.timer: OpTimer | None = None
        self._seam: Instrumented | None = None
        self._clock: HostClock | None = None
        self._gc = False

    def start(self) -> Profiler:
        """Instrument the model (and the LLM's host steps); UsageError when it is instrumented already."""
        kinds = layer_kinds(self.model, [s for _, s in op_sites(self.model)])
        self.timer = OpTimer(self.device, kinds)
        self._seam = instrument(self.model, self.timer)
        if self.llm is not None:
            self._clock = HostClock(self.llm, self.timer)
        if self.device.type == "cpu":
            self._gc = gc.isenabled()
            gc.collect()
            gc.disable()
        return self

    def stop(self) -> None:
        """Restore the model's op slots and the LLM's methods (idempotent); pending device timings are resolved."""
        if self._gc:
            gc.enable()
            self._gc = False
        if self._clock is not None:
            self._clock.restore()
        if self._seam is not None:
            self._seam.restore()
        if self.timer is not None:
            self.timer.resolve()

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def report(self, run: dict[str, Any] | None = None) -> ProfileReport:
        """The calls and steps recorded so far; ``run`` describes the workload in the JSON form."""
        if self.timer is None:
            raise RuntimeError("Profiler.report: the profiler never started")
        return ProfileReport(
            self.label,
            list(self.timer.calls),
            list(self._clock.steps) if self._clock else [],
            self.ceilings,
            self.ceilings_note,
            "perf_counter" if self.device.type == "cpu" else "torch.Event",
            dict(self.timer.no_model),
            dict(run or {}),
        )


def profile_run(
    llm: Any,
    workload: Any,
    *,
    warmup: int = 1,
    ceilings: Ceilings | None = None,
    ceilings_note: str = "",
    device_name: str = "",
) -> ProfileReport:
    """Run ``workload`` (a ``hetero.bench.engine.Workload``) through ``llm`` under a ``Profiler``.

    First ``warmup`` requests of the workload's lengths (other prompt tokens) run unprofiled,
    then all its requests at once, greedy with EOS ignored, as ``hetero bench-engine`` runs them.
    """
    from hetero.bench.engine import run_workload
    from hetero.engine.config import text_config
    from hetero.engine.runtime.sequence import SamplingParams

    if warmup > 0:
        prompts, lens = workload.draw(int(text_config(llm.config.hf_config).vocab_size), variant=1)
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lens[:warmup]]
        llm.generate(prompts[:warmup], params, progress=False)
    with Profiler(llm, ceilings=ceilings, ceilings_note=ceilings_note, device_name=device_name) as profiler:
        run = run_workload(llm, workload, warmup=0)
    info = {
        "workload": workload.as_dict(),
        "warmup_requests": warmup,
        "elapsed_s": run.elapsed,
        "requests": len(run.outputs),
        "prompt_tokens": sum(len(o.prompt_token_ids) for o in run.outputs),
        "output_tokens": sum(len(o.token_ids) for o in run.outputs),
        "steps": int(run.stats["steps"]),
    }
    return profiler.report(info)
