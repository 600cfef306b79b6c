"""The OpenAI-compatible HTTP API of ``hetero serve`` (FastAPI): completions, chat completions (both streamed
as server-sent events on ``stream=true``), models (with ``max_model_len`` and ``vocab_size``), health and
Prometheus metrics. One ``EngineLoop`` serves every request; a client that disconnects, streamed or not, has
its request aborted and its blocks freed. A bad request gets OpenAI's error body with status 400 and the server
goes on serving. With a ``pd`` role the endpoints also take ``kv_transfer_params`` (``hetero.serve.pd``).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from functools import partial
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hetero.engine import LLM
from hetero.errors import UsageError
from hetero.serve._choices import Choice, ChoiceStream, sampling_params, usage
from hetero.serve._disconnect import ClientGone, unless_gone
from hetero.serve.auth import require_api_key
from hetero.serve.drain import refuse_while_draining
from hetero.serve.engine_loop import EngineLoop
from hetero.serve.kv_events import KVEventPublisher
from hetero.serve.metrics import ServerMetrics
from hetero.serve.pd.roles import DecodeRole, PrefillRole, Unavailable, imported, prefill, wants_prefill
from hetero.serve.protocol import ChatCompletionRequest, CompletionRequest, check_limits, error_body, request_errors
from hetero.serve.worker_api import worker_routes

__all__ = ["build_app"]


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def build_app(
    llm: LLM,
    model_name: str,
    pd: PrefillRole | DecodeRole | None = None,
    metrics: ServerMetrics | None = None,
    *,
    kv_events: KVEventPublisher | None = None,
    api_key: str | None = None,
) -> FastAPI:
    """The app serving ``llm`` as ``model_name``; its engine thread runs while the app is up (lifespan).
    ``pd``: this instance's side of prefill/decode disaggregation (its counters in ``metrics``); ``kv_events``:
    where each step's KV events go (closed with the app); ``api_key``: required on the ``/v1/`` routes (``auth``)."""
    metrics = metrics or ServerMetrics(model_name)
    cache = llm.block_manager
    if kv_events is not None:
        cache.record_kv_events()

    def publish() -> None:
        if kv_events is not None:
            kv_events.publish(cache.take_kv_events())

    def on_step(llm: LLM, outputs) -> None:
        metrics.on_step(llm, outputs)
        publish()

    def reset(llm: LLM) -> int:
        evicted = cache.reset_prefix_cache()
        publish()
        return evicted

    engine = EngineLoop(llm, on_step=on_step)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        engine.start()
        yield
        engine.stop()
        if pd is not None:
            pd.close()
        if kv_events is not None:
            kv_events.close()

    app = FastAPI(title="hetero", lifespan=lifespan)
    app.state.engine, app.state.metrics, app.state.model_name = engine, metrics, model_name
    _errors(app)
    refuse_while_draining(app)
    if api_key:
        require_api_key(app, api_key)
    _routes(app, llm, engine, metrics, model_name, pd)
    worker_routes(app, llm, engine, model_name, kv_events, partial(_prompt_ids, llm), partial(_render_chat, llm), reset)
    return app


def _prompt_ids(llm: LLM, prompt) -> list[int]:
    _need_tokenizer(llm, prompt)
    return llm.encode(prompt)


def _need_tokenizer(llm: LLM, prompt) -> None:
    if isinstance(prompt, str) and llm.tokenizer is None:
        raise BadRequest("this checkpoint has no tokenizer: send the prompt as a list of token ids", "prompt")


def _errors(app: FastAPI) -> None:
    request_errors(app)

    @app.exception_handler(BadRequest)
    async def bad(_: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse(error_body(str(exc), 400, exc.param), status_code=400)

    @app.exception_handler(Unavailable)
    async def unavailable(_: Request, exc: Unavailable) -> JSONResponse:
        return JSONResponse(error_body(str(exc), 503, "kv_transfer_params", "ServiceUnavailableError"), status_code=503)

    @app.exception_handler(UsageError)
    async def usage(_: Request, exc: UsageError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), 400, getattr(exc, "arg", None)), status_code=400)


def _routes(
    app: FastAPI,
    llm: LLM,
    engine: EngineLoop,
    metrics: ServerMetrics,
    model_name: str,
    pd: PrefillRole | DecodeRole | None,
) -> None:
    max_model_len = llm.config.max_model_len
    vocab = getattr(llm.config.hf_config, "vocab_size", None)

    @app.get("/health")
    async def health() -> Response:
        if pd is not None and pd.error is not None:
            return Response(f"the KV link failed: {pd.error}", status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict:
        card = {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "hetero",
            "max_model_len": max_model_len,
            "vocab_size": vocab,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        cache = await imported(body, pd)
        prefill_only = wants_prefill(body, pd)
        _check_common(body, llm, model_name, prefill_only)
        _need_tokenizer(llm, body.prompt)
        params = sampling_params(body, body.max_tokens or 16, body.logprobs)
        if prefill_only:
            return await prefill(pd, engine, llm, llm.encode(body.prompt), request, model_name, chat=False)
        choice = Choice(llm.tokenizer, body.stop, body.return_token_ids, body.logprobs is not None, body.include_usage)
        shape = _Shape("cmpl", "text_completion", model_name, chat=False)
        return await _respond(engine, body.prompt, params, choice, shape, body.stream, request, cache)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        cache = await imported(body, pd)
        prefill_only = wants_prefill(body, pd)
        _check_common(body, llm, model_name, prefill_only)
        prompt = _render_chat(llm, body)
        limit = body.max_completion_tokens or body.max_tokens or max(1, max_model_len - len(prompt))
        top = (body.top_logprobs or 0) if body.logprobs else None
        params = sampling_params(body, limit, top)
        if prefill_only:
            return await prefill(pd, engine, llm, prompt, request, model_name, chat=True)
        choice = Choice(llm.tokenizer, body.stop, body.return_token_ids, body.logprobs, body.include_usage)
        shape = _Shape("chatcmpl", "chat.completion", model_name, chat=True)
        return await _respond(engine, prompt, params, choice, shape, body.stream, request, cache)


def _check_common(body, llm: LLM, model_name: str, prefill_only: bool) -> None:
    # a prefill request's model name is the decode instance's to check (the two may be served under others)
    if body.model is not None and body.model != model_name and not prefill_only:
        raise BadRequest(f"model {body.model!r} is not served here; this server serves {model_name!r}", "model")
    if body.n != 1:
        raise BadRequest(f"n must be 1 (got {body.n})", "n")
    check_limits(body, llm.config)
    if body.stop and llm.tokenizer is None:
        raise BadRequest("stop strings need a tokenizer, and this checkpoint has none: use stop_token_ids", "stop")


def _render_chat(llm: LLM, body: ChatCompletionRequest) -> list[int]:
    tok = llm.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise BadRequest("this checkpoint has no tokenizer with a chat template: use /v1/completions", "messages")
    messages = [m.model_dump() for m in body.messages]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    if len(ids) > llm.config.max_model_len:  # the engine's refusal would name "prompt", a field chat has not
        raise BadRequest(f"messages: {len(ids)} tokens, over max_model_len ({llm.config.max_model_len})", "messages")
    return ids


class _Shape:
    """How one endpoint's responses look: id prefix, object name, chat or text choices."""

    def __init__(self, prefix: str, obj: str, model: str, chat: bool):
        self.id, self.object, self.model, self.chat = f"{prefix}-{uuid.uuid4().hex}", obj, model, chat
        self.created = int(time.time())

    def envelope(self, choices: list[dict], chunk: bool = False, usage: dict | None = None) -> dict:
        obj = self.object + (".chunk" if chunk and self.chat else "")
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body


async def _respond(
    engine: EngineLoop, prompt, params, choice: Choice, shape: _Shape, stream: bool, request: Request, cache=None
):
    outputs = engine.generate(prompt, params, cache)
    first = await anext(outputs)  # raises UsageError for a request the engine refuses: a 400 before any byte
    if stream:
        return StreamingResponse(
            _events(first, outputs, ChoiceStream(choice, shape.chat), shape), media_type="text/event-stream"
        )
    try:
        state, out = await unless_gone(request, _whole(first, outputs, ChoiceStream(choice, shape.chat)))
    except ClientGone:  # cancelled, which aborted the request and freed its blocks
        return Response(status_code=499)
    return shape.envelope([state.result()], usage=usage(out))


async def _whole(out, outputs: AsyncIterator, state: ChoiceStream):
    try:
        while True:
            state.delta(out)
            if state.done:
                return state, out
            out = await anext(outputs)
    finally:
        await outputs.aclose()  # stopped by a stop string, or cancelled: the request is aborted


async def _events(out, outputs: AsyncIterator, state: ChoiceStream, shape: _Shape) -> AsyncIterator[str]:
    try:
        while True:
            delta = state.delta(out)
            if delta is not None:
                yield f"data: {json.dumps(shape.envelope([delta], chunk=True))}\n\n"
            if state.done:
                break
            try:
                out = await anext(outputs)
            except Exception as e:  # noqa: BLE001  (the engine failed the request: say so, never a silent cut)
                error = error_body(f"the request failed mid-stream: {e}", 500, None, "InternalServerError")
                yield f"data: {json.dumps(error)}\n\n"
                break
    finally:
        await outputs.aclose()  # a client gone mid-stream: the request is aborted, its blocks freed
    if state.done and state.choice.usage:
        yield f"data: {json.dumps(shape.envelope([], chunk=True, usage=usage(state.last)))}\n\n"
    yield "data: [DONE]\n\n"
