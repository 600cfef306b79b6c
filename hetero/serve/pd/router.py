"""``hetero serve --role router``: one OpenAI-compatible endpoint in front of a prefill and a decode instance.

For each completion or chat completion the router asks the prefill instance for the prompt's cache
(the request with ``kv_transfer_params: {"do_remote_decode": true}``); the cache goes from there to
the decode instance over their KV link, and the router sends the request, with the
``kv_transfer_params`` the prefill answered, to the decode instance, relaying its answer (streamed
or whole) to the client. A client that leaves closes the decode request, which aborts it there.
"""

from __future__ import annotations

import contextlib
import json
import time

import httpx2
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from hetero.serve._disconnect import ClientGone, unless_gone
from hetero.serve.metrics import LATENCY_BUCKETS
from hetero.serve.protocol import error_body

__all__ = ["build_router"]


class _Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hetero_router_requests",
            "Requests routed, by endpoint and the client's status",
            ("endpoint", "status"),
            registry=self.registry,
        )
        self.prefill = Histogram(
            "hetero_router_prefill_seconds",
            "Prefill instance: computing and shipping a prompt's cache",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )


def build_router(prefill_url: str, decode_url: str, timeout_s: float = 600.0) -> FastAPI:
    """The router app over the instances at ``prefill_url`` and ``decode_url`` (``http://host:port``)."""
    metrics = _Metrics()
    urls = {"prefill": prefill_url.rstrip("/"), "decode": decode_url.rstrip("/")}
    client: dict[str, httpx2.AsyncClient] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        client["http"] = httpx2.AsyncClient(timeout=timeout_s, limits=httpx2.Limits(max_connections=None))
        yield
        await client["http"].aclose()

    app = FastAPI(title="hetero router", lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:
        for role, url in urls.items():
            try:
                r = await client["http"].get(url + "/health", timeout=10)
            except httpx2.HTTPError as e:
                return Response(f"{role} instance {url}: {e}", status_code=503)
            if r.status_code != 200:
                return Response(f"{role} instance {url}: {r.status_code} {r.text}", status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> Response:
        r = await client["http"].get(urls["decode"] + "/v1/models")
        return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))

    async def route(endpoint: str, request: Request) -> Response:
        response = await _route(client["http"], urls, endpoint, request, metrics)
        metrics.requests.labels(endpoint, str(response.status_code)).inc()
        return response

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await route("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await route("/v1/chat/completions", request)

    return app


async def _route(
    http: httpx2.AsyncClient, urls: dict[str, str], endpoint: str, request: Request, metrics: _Metrics
) -> Response:
    try:
        body = json.loads(await request.body())
    except ValueError as e:
        return JSONResponse(error_body(f"the request body is not JSON: {e}", 400), status_code=400)
    if not isinstance(body, dict):
        return JSONResponse(error_body("the request body must be a JSON object", 400), status_code=400)
    try:
        return await unless_gone(request, _forward(http, urls, endpoint, body, metrics))
    except ClientGone:  # the instance's request was closed, which aborts it there
        return Response(status_code=499)


async def _forward(
    http: httpx2.AsyncClient, urls: dict[str, str], endpoint: str, body: dict, metrics: _Metrics
) -> Response:
    # the whole body, so the prefill instance refuses what the decode instance's schema would
    # (a request refused before the decode instance takes its cache would leave it there)
    ask = dict(body, kv_transfer_params={"do_remote_decode": True})
    start = time.perf_counter()
    try:
        pre = await http.post(urls["prefill"] + endpoint, json=ask)
    except httpx2.HTTPError as e:
        return _unreachable("prefill", urls["prefill"], e)
    if pre.status_code != 200:  # the request's own error (a 400), as the prefill instance worded it
        return Response(pre.content, status_code=pre.status_code, media_type=pre.headers.get("content-type"))
    metrics.prefill.observe(time.perf_counter() - start)
    decode = dict(body, kv_transfer_params=pre.json()["kv_transfer_params"])
    try:
        upstream = await http.send(http.build_request("POST", urls["decode"] + endpoint, json=decode), stream=True)
    except httpx2.HTTPError as e:
        return _unreachable("decode", urls["decode"], e)
    kind = upstream.headers.get("content-type")
    if body.get("stream") and upstream.status_code == 200:
        return StreamingResponse(_relay(upstream), status_code=200, media_type=kind)
    try:
        content = await upstream.aread()
    finally:
        await upstream.aclose()
    return Response(content, status_code=upstream.status_code, media_type=kind)


async def _relay(upstream: httpx2.Response):
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    finally:
        await upstream.aclose()  # a client gone: closing the decode request aborts it there


def _unreachable(role: str, url: str, error: Exception) -> JSONResponse:
    message = f"the {role} instance at {url} did not answer: {type(error).__name__}: {error}"
    return JSONResponse(error_body(message, 502, None, "BadGatewayError"), status_code=502)
