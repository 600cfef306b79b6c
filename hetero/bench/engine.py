"""The ``hetero bench-engine`` measurement: a seeded synthetic workload through ``LLM`` and its numbers.

``Workload.draw`` makes the requests, ``run_workload`` times them through an ``LLM``
after a warm-up, and ``summarize`` (a pure function of the outputs, the engine stats of
the measured window and the elapsed time) turns them into throughput, latency
percentiles and KV-cache figures. The report and the baseline logic are in
``hetero.bench.engine_report``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from hetero.errors import UsageError

__all__ = [
    "Workload",
    "Run",
    "parse_range",
    "percentiles",
    "request_latencies",
    "summarize",
    "run_workload",
    "model_identity",
    "PERCENTILES",
]

#: the latency percentiles reported
PERCENTILES = (50, 90, 99)

# separate random streams for the lengths, the prompt tokens and the warm-up requests, so that the
# warm-up and a re-run leave nothing in the prefix cache that a measured pass could hit
_LENGTHS, _TOKENS, _WARMUP = 0, 1, 2


def parse_range(text: str) -> tuple[int, int]:
    """``"MIN:MAX"`` (or one integer N for N:N) -> ``(MIN, MAX)``; UsageError (a ValueError) unless 1 <= MIN <= MAX."""
    parts = text.split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, -1)
    except ValueError:
        raise UsageError(f"expected MIN:MAX with integers, got {text!r}") from None
    if not 1 <= lo <= hi:
        raise UsageError(f"expected MIN:MAX with 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


@dataclass(frozen=True)
class Workload:
    """``num_requests`` requests; prompt and output lengths uniform in the inclusive ranges, seeded.

    Prompts are random token ids from the model's vocabulary; outputs are greedy with
    EOS ignored, so every request generates exactly its drawn output length.
    """

    num_requests: int = 64
    input_len: tuple[int, int] = (32, 256)
    output_len: tuple[int, int] = (32, 128)
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.num_requests, bool) or not isinstance(self.num_requests, int) or self.num_requests < 1:
            raise UsageError(
                f"Workload.num_requests must be an integer >= 1, got {self.num_requests!r}",
                arg="num_requests",
                expected="an integer >= 1",
                got=self.num_requests,
            )
        for name in ("input_len", "output_len"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise UsageError(f"Workload.{name} must be (MIN, MAX) with 1 <= MIN <= MAX, got {(lo, hi)!r}")

    @property
    def max_len(self) -> int:
        """The longest sequence the workload can draw (prompt and output)."""
        return self.input_len[1] + self.output_len[1]

    def lengths(self) -> tuple[list[int], list[int]]:
        """The drawn prompt lengths and output lengths, one each per request."""
        return _lengths(self, np.random.default_rng([self.seed, _LENGTHS]))

    def draw(self, vocab_size: int, variant: int = 0) -> tuple[list[list[int]], list[int]]:
        """The prompts (token-id lists) and output lengths, the same for the same workload.

        ``variant`` redraws the prompt tokens only: another pass over the same lengths that
        the prefix cache of an earlier pass cannot serve.
        """
        prompt_lens, output_lens = self.lengths()
        rng = np.random.default_rng([self.seed, _TOKENS, variant])
        return [rng.integers(0, vocab_size, size=n).tolist() for n in prompt_lens], output_lens

    def as_dict(self) -> dict[str, Any]:
        """The parameters as JSON-ready values (ranges as two-element lists)."""
        return {
            "num_requests": self.num_requests,
            "input_len": list(self.input_len),
            "output_len": list(self.output_len),
            "seed": self.seed,
        }


def _lengths(workload: Workload, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    n, (a, b), (c, d) = workload.num_requests, workload.input_len, workload.output_len
    prompt_lens = rng.integers(a, b, size=n, endpoint=True).tolist()
    return prompt_lens, rng.integers(c, d, size=n, endpoint=True).tolist()


def _warmup_requests(workload: Workload, n: int, vocab_size: int) -> tuple[list[list[int]], list[int]]:
    """``n`` requests of the workload's ranges from a stream of their own (no prefix shared with it)."""
    rng = np.random.default_rng([workload.seed, _WARMUP])
    prompt_lens, output_lens = _lengths(dataclasses.replace(workload, num_requests=n), rng)
    return [rng.integers(0, vocab_size, size=k).tolist() for k in prompt_lens], output_lens


@dataclass
class Run:
    """One measured pass: the outputs in request order, the engine stats of its window and its wall time."""

    outputs: list[Any]
    stats: dict[str, Any]
    elapsed: float


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """``mean`` and ``p50``/``p90``/``p99`` (numpy's linear interpolation); None for each when empty."""
    keys = ["mean"] + [f"p{q}" for q in PERCENTILES]
    if len(values) == 0:
        return dict.fromkeys(keys)
    arr = np.asarray(values, dtype=np.float64)
    return dict(zip(keys, [float(arr.mean())] + [float(v) for v in np.percentile(arr, PERCENTILES)]))


def request_latencies(outputs: Sequence[Any]) -> dict[str, list[float]]:
    """Per request, in seconds: ``ttft`` (first token - arrival), ``tpot`` ((finish - first token) /
    (output tokens - 1); requests with one output token have none) and ``e2e`` (finish - arrival)."""
    ttft, tpot, e2e = [], [], []
    for out in outputs:
        m = out.metrics
        ttft.append(m["first_token_time"] - m["arrival_time"])
        e2e.append(m["finish_time"] - m["arrival_time"])
        if len(out.token_ids) > 1:
            tpot.append((m["finish_time"] - m["first_token_time"]) / (len(out.token_ids) - 1))
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e}


def _kv_cache(stats: Mapping[str, Any]) -> dict[str, float | int | None]:
    blocks = int(stats["num_kv_blocks"])
    used = np.asarray(stats["kv_blocks_in_use"], dtype=np.float64) / max(blocks, 1)
    return {
        "num_blocks": blocks,
        "block_size": int(stats["block_size"]),
        "mean_utilization": float(used.mean()) if used.size else None,
        "peak_utilization": float(used.max()) if used.size else None,
    }


def summarize(outputs: Sequence[Any], stats: Mapping[str, Any], elapsed: float) -> dict[str, Any]:
    """The figures of one run: totals, throughputs (per second of ``elapsed``), latency percentiles in
    seconds, KV-cache utilization (blocks in use per step / ``num_kv_blocks``), preemptions,
    prefix-cache hits and steps. ``stats`` is ``LLM.stats`` restricted to the run."""
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    output_tokens = sum(len(o.token_ids) for o in outputs)
    lat = request_latencies(outputs)
    return {
        "requests": len(outputs),
        "elapsed_s": elapsed,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "request_throughput": len(outputs) / elapsed,
        "output_throughput": output_tokens / elapsed,
        "total_throughput": (prompt_tokens + output_tokens) / elapsed,
        "ttft_s": percentiles(lat["ttft"]),
        "tpot_s": percentiles(lat["tpot"]),
        "e2e_s": percentiles(lat["e2e"]),
        "kv_cache": _kv_cache(stats),
        "preemptions": int(stats["preemptions"]),
        "cached_prompt_tokens": int(stats["cached_prompt_tokens"]),
        "steps": int(stats["steps"]),
        **({"spec_decode": stats["spec_decode"].as_dict()} if "spec_decode" in stats else {}),
    }


def _stats_since(stats: Mapping[str, Any], mark: Mapping[str, Any]) -> dict[str, Any]:
    """``stats`` minus what ``mark`` (an earlier copy) already counted: list tails, counter differences."""
    window: dict[str, Any] = {}
    for key, value in stats.items():
        if isinstance(value, list):
            window[key] = value[len(mark[key]) :]
        elif key in ("num_kv_blocks", "block_size"):
            window[key] = value
        else:
            window[key] = value - mark[key]
    return window


def _greedy(output_lens: Sequence[int]) -> list[Any]:
    from hetero.engine import SamplingParams

    return [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in output_lens]


def run_workload(llm: Any, workload: Workload, warmup: int = 2, variant: int = 0) -> Run:
    """Warm up on ``warmup`` requests of the workload's ranges, then submit all the workload's
    requests (prompt tokens of ``variant``) at once, greedy with EOS ignored, and time them."""
    from hetero.engine.config import text_config

    vocab = int(text_config(llm.config.hf_config).vocab_size)
    if warmup > 0:
        prompts, lens = _warmup_requests(workload, warmup, vocab)
        llm.generate(prompts, _greedy(lens), progress=False)
    prompts, lens = workload.draw(vocab, variant)
    params = _greedy(lens)
    mark = {k: (v.copy() if hasattr(v, "copy") else v) for k, v in llm.stats.items()}
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return Run(outputs, _stats_since(llm.stats, mark), elapsed)


def model_identity(model_dir: str | Path) -> dict[str, str]:
    """What names a checkpoint in a baseline: directory name, architecture and a hash of config.json
    (its parsed content, so formatting does not count)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    arch = (config.get("architectures") or ["?"])[0]
    return {
        "name": Path(model_dir).resolve().name,
        "architecture": arch,
        "config_sha256": hashlib.sha256(canonical).hexdigest()[:16],
    }
