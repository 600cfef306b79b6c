"""The server's Prometheus metrics, updated by the engine thread after every step."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hetero.engine import LLM
from hetero.engine.outputs import RequestOutput

__all__ = ["ServerMetrics", "LATENCY_BUCKETS"]

#: the latency buckets of every hetero serve histogram (seconds)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    """Gauges of the scheduler and the KV cache, TTFT and TPOT histograms of finished requests,
    counters of preemptions, requests and tokens, and of speculative decoding's drafts (vLLM's
    ``spec_decode_*`` counters, with the hetero prefix); ``render()`` is the /metrics body."""

    def __init__(self, model: str):
        self.registry = CollectorRegistry()
        label = {"labelnames": ("model_name",), "registry": self.registry}
        self.running = Gauge("hetero_num_requests_running", "Requests in the running batch", **label).labels(model)
        self.waiting = Gauge("hetero_num_requests_waiting", "Requests waiting to be scheduled", **label).labels(model)
        self.kv_usage = Gauge("hetero_kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1)", **label).labels(
            model
        )
        self.preemptions = Counter(
            "hetero_num_preemptions", "Preemptions (blocks taken back from a running request)", **label
        ).labels(model)
        self.finished = Counter(
            "hetero_request_success", "Finished requests", ("model_name", "finished_reason"), registry=self.registry
        )
        self.prompt_tokens = Counter("hetero_prompt_tokens", "Prompt tokens of finished requests", **label).labels(
            model
        )
        self.generation_tokens = Counter("hetero_generation_tokens", "Generated tokens", **label).labels(model)
        self.ttft = Histogram(
            "hetero_time_to_first_token_seconds", "Time to first token", buckets=LATENCY_BUCKETS, **label
        ).labels(model)
        self.tpot = Histogram(
            "hetero_time_per_output_token_seconds",
            "Mean time per output token after the first",
            buckets=LATENCY_BUCKETS,
            **label,
        ).labels(model)
        self.spec = {
            name: Counter(f"hetero_spec_decode_{name}", text, **label).labels(model)
            for name, text in (
                ("num_drafts", "Verified drafts (a request's draft tokens in one step)"),
                ("num_draft_tokens", "Draft tokens verified"),
                ("num_accepted_tokens", "Draft tokens accepted"),
            )
        }
        self.spec_per_pos = Counter(
            "hetero_spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, per draft position",
            ("model_name", "position"),
            registry=self.registry,
        )
        self._model = model
        self._preempted = 0
        self._spec = None

    def on_step(self, llm: LLM, outputs: list[RequestOutput]) -> None:
        """After a step, on the engine thread: the gauges, and the finished requests' latencies."""
        self.running.set(len(llm.scheduler.running))
        self.waiting.set(len(llm.scheduler.waiting))
        blocks = llm.stats["num_kv_blocks"]
        self.kv_usage.set(llm.block_manager.num_used_blocks / blocks if blocks else 0.0)
        self.preemptions.inc(llm.stats["preemptions"] - self._preempted)
        self._preempted = llm.stats["preemptions"]
        spec = llm.stats.get("spec_decode")
        if spec is not None:
            self._count_spec(spec)
        for out in outputs:
            self.generation_tokens.inc(len(out.new_token_ids))
            if out.finished:
                self._finished(out)

    def _count_spec(self, spec) -> None:
        new = spec - self._spec if self._spec is not None else spec
        for name, counter in self.spec.items():
            counter.inc(getattr(new, name))
        for pos, n in enumerate(new.accepted_per_position):
            self.spec_per_pos.labels(self._model, str(pos)).inc(n)
        self._spec = spec.copy()

    def _finished(self, out: RequestOutput) -> None:
        m = out.metrics
        self.finished.labels(self._model, out.finish_reason).inc()
        self.prompt_tokens.inc(len(out.prompt_token_ids))
        if "first_token_time" in m and "arrival_time" in m:
            self.ttft.observe(m["first_token_time"] - m["arrival_time"])
            if len(out.token_ids) > 1 and "finish_time" in m:
                self.tpot.observe((m["finish_time"] - m["first_token_time"]) / (len(out.token_ids) - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
