"""`GET /health` and Prometheus `GET /metrics`, under vLLM's metric names where they apply, so a
dashboard or autoscaler made for vLLM reads a kiln endpoint unchanged.

The counts are taken where requests meet the backend (`MeteredBackend` wraps it): requests
running and waiting (the continuous engine's own scheduler queues when the backend has one, else
requests inside the backend and 0), time to first token and the gaps between tokens of
streamed responses (a stream's delta is one token, as its usage counts it), end-to-end latency,
prompt and generated tokens; and, read from the engine at scrape time, its prefix-cache queries
and hits (tokens), preemptions and KV-cache usage, and with speculative decoding on, its drafts,
drafted and accepted tokens (in all and by position in the draft). Each replica counts its own
requests: with several replicas a scrape of /metrics reaches one of them (Ray's metrics export
covers the whole cluster).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kiln.serving.backends.backend import Backend, Job, Result

router = APIRouter()

# vLLM's buckets (seconds)
# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# fmt: on


class ServerMetrics:
    """One endpoint's metrics in their own registry (several apps may share a process)."""

    def __init__(self, model_name: str, queues=None, engine_stats=None) -> None:
        self.registry = CollectorRegistry()
        if engine_stats is not None:
            self.registry.register(EngineStatsCollector(model_name, engine_stats))
        labels = ["model_name"]
        r = self.registry
        self.in_backend = 0  # requests inside complete()/stream(): "running" without queues
        running = Gauge(
            "vllm:num_requests_running", "Requests being generated.", labels, registry=r
        )
        waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting for a slot.", labels, registry=r
        )
        # read at scrape time: the engine's queues, else the requests inside the backend
        self._queues = queues
        running.labels(model_name).set_function(lambda: self._queue_sizes()[0])
        waiting.labels(model_name).set_function(lambda: self._queue_sizes()[1])
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to the first token of a streamed response.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between two tokens of a streamed response.",
            labels,
            buckets=ITL_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Time from the request reaching the backend to its last token.",
            labels,
            buckets=E2E_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens processed.", labels, registry=r
        ).labels(model_name)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Tokens generated.", labels, registry=r
        ).labels(model_name)
        self._success = Counter(
            "vllm:request_success", "Requests finished.", [*labels, "finished_reason"], registry=r
        )
        self.model_name = model_name

    def _queue_sizes(self) -> tuple[int, int]:
        sizes = self._queues() if self._queues else None
        return sizes if sizes is not None else (self.in_backend, 0)

    def finished(self, reason: str) -> None:
        self._success.labels(self.model_name, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


# (Engine.stats() key, metric name, help, counter or gauge)
ENGINE_METRICS = (
    (
        "prefix_cache_queries",
        "vllm:prefix_cache_queries",
        "Prompt tokens looked up in the prefix cache.",
        True,
    ),
    (
        "prefix_cache_hits",
        "vllm:prefix_cache_hits",
        "Prompt tokens found in the prefix cache.",
        True,
    ),
    ("num_preemptions", "vllm:num_preemptions", "Requests preempted (to be recomputed).", True),
    ("kv_cache_usage_perc", "vllm:kv_cache_usage_perc", "Share of KV-cache blocks in use.", False),
    # speculative decoding's, present when it is on
    ("spec_decode_num_drafts", "vllm:spec_decode_num_drafts", "Rows verified with drafts.", True),
    (
        "spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_draft_tokens",
        "Tokens drafted.",
        True,
    ),
    (
        "spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens",
        "Drafted tokens accepted by the model.",
        True,
    ),
)
PER_POSITION = (
    "spec_decode_num_accepted_tokens_per_pos",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
    "Drafted tokens accepted, by position in the draft.",
)


class EngineStatsCollector:
    """The engine's own counts, read when /metrics is scraped."""

    def __init__(self, model_name: str, engine_stats) -> None:
        self.model_name = model_name
        self.engine_stats = engine_stats

    def collect(self):
        stats = self.engine_stats()
        for key, name, doc, counter in ENGINE_METRICS:
            if key not in stats:
                continue
            family = (CounterMetricFamily if counter else GaugeMetricFamily)(
                name, doc, labels=["model_name"]
            )
            family.add_metric([self.model_name], float(stats[key]))
            yield family
        key, name, doc = PER_POSITION
        if key in stats:
            family = CounterMetricFamily(name, doc, labels=["model_name", "position"])
            for position, count in enumerate(stats[key]):
                family.add_metric([self.model_name, str(position)], float(count))
            yield family


class MeteredBackend:
    """`backend` with every completion and stream counted in `metrics`; anything else passes
    through unchanged."""

    def __init__(self, backend: Backend, metrics: ServerMetrics) -> None:
        self._backend = backend
        self.metrics = metrics

    def __getattr__(self, name: str):
        return getattr(self._backend, name)

    async def complete(self, jobs: list[Job]) -> list[Result]:
        m, start = self.metrics, time.perf_counter()
        m.in_backend += len(jobs)
        try:
            results = await self._backend.complete(jobs)
        finally:
            m.in_backend -= len(jobs)
        elapsed = time.perf_counter() - start
        for job, result in zip(jobs, results, strict=False):
            prompt = result.prompt_tokens
            m.prompt_tokens.inc(prompt if prompt is not None else len(job.prompt_ids or []))
            m.generation_tokens.inc(result.completion_tokens or 0)
            m.e2e.observe(elapsed)
            m.finished(result.finish_reason)
        return results

    async def stream(self, job: Job) -> AsyncIterator[str]:
        m, start = self.metrics, time.perf_counter()
        last, tokens = None, 0
        m.in_backend += 1
        try:
            async for delta in self._backend.stream(job):
                now = time.perf_counter()
                if last is None:
                    m.ttft.observe(now - start)
                else:
                    m.itl.observe(now - last)
                last, tokens = now, tokens + 1
                yield delta
        finally:
            m.in_backend -= 1
        m.prompt_tokens.inc(len(job.prompt_ids or []))
        m.generation_tokens.inc(tokens)
        m.e2e.observe(time.perf_counter() - start)
        m.finished("length" if tokens >= job.params.max_new_tokens else "stop")


def engine_stats(backend: Backend):
    """The backend's `engine_stats()` (its engine's prefix-cache and KV counts), where it has
    one."""
    stats = getattr(backend, "engine_stats", None)
    return stats if callable(stats) else None


def engine_queues(backend: Backend):
    """The backend's `engine_queues()` ((running, waiting) of its continuous-batching engine, or
    None), where it has one."""
    queues = getattr(backend, "engine_queues", None)
    return queues if callable(queues) else None


@router.get("/health", include_in_schema=False)
async def health(request: Request) -> Response:
    """200 when the model can answer, 503 while it cannot (vLLM's /health)."""
    ready = await request.app.state.backend.ready()
    return Response(status_code=200 if ready else 503)


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition of this replica's counts."""
    body = request.app.state.metrics.render()
    return Response(body, media_type=CONTENT_TYPE_LATEST)
