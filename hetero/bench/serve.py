"""``hetero bench-serve``: a load generator for an OpenAI-compatible server, in the manner of
``vllm bench serve`` (same flag names where they exist).

Requests are streamed completions sent by the official ``openai`` client (asyncio). Arrivals:
``--request-rate`` R per second (inf: all at once) with gamma-distributed gaps of shape
``--burstiness`` (1: Poisson; inf: a fixed rate), under a ``--max-concurrency`` cap. Prompts are
seeded random token ids (``--dataset-name random``, ``--random-input-len`` / ``--random-output-len``
/ ``--random-range-ratio``) or the lines of a JSONL file (``--dataset-path``: ``{"prompt": str or
token ids, "output_len": int}``), or conversations that keep their history (``--dataset-name multi-turn``,
``hetero.bench.multiturn``). Per request: TTFT (send to the first chunk with a choice), TPOT ((latency - TTFT) /
(tokens - 1)), ITL (the gaps between chunks with a choice), E2E latency, and from the stream's usage chunk (asked for
with ``stream_options.include_usage``) the output tokens and the prompt tokens the server's prefix cache served
(``usage.prompt_tokens_details.cached_tokens``). No ``return_token_ids`` unless the ids are needed (multi-turn's
token format): vllm-router's kv_aware policy gives no prefix credit to a request carrying a field it does not know.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hetero.bench.engine import percentiles
from hetero.errors import UsageError

__all__ = [
    "RequestSpec",
    "RequestResult",
    "random_requests",
    "file_requests",
    "arrival_gaps",
    "stream_completion",
    "run_load",
    "summarize",
    "results_json",
]


@dataclass(frozen=True)
class RequestSpec:
    prompt: str | list[int]
    output_len: int


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float | None = None
    latency: float | None = None
    itl: list[float] = field(default_factory=list)
    error: str = ""
    cached_tokens: int | None = None  # None: the server reported no usage

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.latency is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def random_requests(
    n: int, input_len: int, output_len: int, range_ratio: float, vocab: int, seed: int
) -> list[RequestSpec]:
    """n prompts of random token ids in [1, vocab): lengths uniform in len * [1 - ratio, 1 + ratio]."""
    rng = random.Random(seed)

    def length(mean: int) -> int:
        return max(1, rng.randint(math.floor(mean * (1 - range_ratio)), math.ceil(mean * (1 + range_ratio))))

    return [
        RequestSpec([rng.randrange(1, vocab) for _ in range(length(input_len))], length(output_len)) for _ in range(n)
    ]


def file_requests(path: str, n: int, output_len: int) -> list[RequestSpec]:
    """The first n lines of a JSONL file, ``{"prompt": ..., "output_len": ...}`` (output_len optional)."""
    specs = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if len(specs) == n:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt = row["prompt"]
            ok = isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise UsageError(
                f"argument --dataset-path: line {i + 1} of {path}: expected a JSON object with a "
                f"'prompt' (text or token ids), got {line[:80]!r}"
            )
        specs.append(RequestSpec(prompt, int(row.get("output_len", output_len))))
    if len(specs) < n:
        raise UsageError(f"argument --dataset-path: expected at least {n} prompts in {path}, got {len(specs)}")
    return specs


def arrival_gaps(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds to wait before each request: 0 at rate inf; gamma(shape=burstiness, mean=1/rate)
    gaps otherwise (burstiness 1 is a Poisson process, inf a fixed rate)."""
    if math.isinf(rate):
        return [0.0] * n
    if math.isinf(burstiness):
        return [1.0 / rate] * n
    rng = random.Random(seed)
    return [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(n)]


async def stream_completion(
    client: Any, model: str, spec: RequestSpec, ignore_eos: bool, answer: list | None = None, token_ids: bool = False
) -> RequestResult:
    """One streamed completion. ``answer``, when given, collects what was generated: the text of each chunk, or with
    ``token_ids`` (sent as ``return_token_ids``, only then: vllm-router's kv_aware gives no prefix credit to a
    request with a field it does not know) the token ids. Output tokens are the usage chunk's ``completion_tokens``
    (else one a chunk, or the chunk's ids); TTFT and ITL time the chunks with a choice, whose text may be empty (a
    step's token whose text is held back or has none still comes as a chunk)."""
    prompt_len = len(spec.prompt) if isinstance(spec.prompt, list) else 0
    result = RequestResult(False, prompt_len)
    start = last = time.perf_counter()
    usage, chunks = None, 0
    try:
        stream = await client.completions.create(
            model=model,
            prompt=spec.prompt,
            max_tokens=spec.output_len,
            stream=True,
            temperature=0.0,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": ignore_eos, **({"return_token_ids": True} if token_ids else {})},
        )
        async for chunk in stream:
            usage = getattr(chunk, "usage", None) or usage
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            ids = (getattr(choice, "token_ids", None) or []) if token_ids else []
            if answer is not None:
                answer += ids if token_ids else [choice.text or ""]
            now = time.perf_counter()
            if result.ttft is None:
                result.ttft = now - start
            else:
                result.itl.append(now - last)
            last = now
            chunks += len(ids) or 1
        result.latency = time.perf_counter() - start
        result.ok = result.ttft is not None
        result.output_tokens = chunks
        if usage is not None:
            _usage(result, usage)
    except Exception as e:  # noqa: BLE001  (a failed request is counted and reported, the run goes on)
        result.error = f"{type(e).__name__}: {e}"[:300]
    return result


def _usage(result: RequestResult, usage: Any) -> None:
    cached = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None)
    result.prompt_len = usage.prompt_tokens or result.prompt_len
    result.output_tokens = usage.completion_tokens if usage.completion_tokens is not None else result.output_tokens
    result.cached_tokens = int(cached or 0)


async def run_load(
    client: Any,
    model: str,
    specs: Sequence[RequestSpec],
    gaps: Sequence[float],
    max_concurrency: int | None,
    ignore_eos: bool,
) -> tuple[list[RequestResult], float]:
    """Send every request at its arrival time (at most max_concurrency in flight); (results, seconds)."""
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def send(spec: RequestSpec) -> RequestResult:
        if limit is None:
            return await stream_completion(client, model, spec, ignore_eos)
        async with limit:
            return await stream_completion(client, model, spec, ignore_eos)

    start = time.perf_counter()
    tasks = []
    for spec, gap in zip(specs, gaps):
        await asyncio.sleep(gap)
        tasks.append(asyncio.create_task(send(spec)))
    results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


def summarize(results: Sequence[RequestResult], seconds: float, slo: dict[str, float]) -> dict[str, Any]:
    """Throughputs, TTFT/TPOT/ITL/E2E mean and percentiles (ms), goodput under ``slo`` ({"ttft": ms, "tpot": ms,
    "e2el": ms}: requests meeting every bound, per second), and the prefix-cache hit rate: the cached prompt tokens
    over the prompt tokens of the requests whose usage the server reported (None: none did)."""
    done = [r for r in results if r.ok]
    ms = lambda xs: {k: (v * 1e3 if v is not None else None) for k, v in percentiles(xs).items()}  # noqa: E731
    tokens = sum(r.output_tokens for r in done)
    good = [r for r in done if _meets(r, slo)]
    reported = [r for r in done if r.cached_tokens is not None]
    prompt, cached = sum(r.prompt_len for r in reported), sum(r.cached_tokens for r in reported)
    return {
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": seconds,
        "request_throughput": len(done) / seconds if seconds else 0.0,
        "output_throughput": tokens / seconds if seconds else 0.0,
        "total_output_tokens": tokens,
        "total_prompt_tokens": sum(r.prompt_len for r in done),
        "total_cached_tokens": cached if reported else None,
        "prefix_hit_rate": cached / prompt if prompt else None,
        "ttft_ms": ms([r.ttft for r in done]),
        "tpot_ms": ms([r.tpot for r in done if r.tpot is not None]),
        "itl_ms": ms([g for r in done for g in r.itl]),
        "e2el_ms": ms([r.latency for r in done]),
        "slo_ms": dict(slo),
        "goodput": len(good) / seconds if seconds and slo else None,
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }


def _meets(r: RequestResult, slo: dict[str, float]) -> bool:
    got = {"ttft": r.ttft, "tpot": r.tpot if r.tpot is not None else 0.0, "e2el": r.latency}
    return all(got[k] is not None and got[k] * 1e3 <= bound for k, bound in slo.items())


def results_json(results: Sequence[RequestResult]) -> list[dict]:
    return [asdict(r) | {"tpot": r.tpot} for r in results]
