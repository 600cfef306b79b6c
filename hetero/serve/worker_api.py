"""The endpoints a router reads from a worker besides the OpenAI API, with vLLM's names and meanings.

- ``GET /get_load``: ``{"load": requests in the engine}`` (vllm-router's power_of_two);
- ``POST /flush_cache`` and ``POST /reset_prefix_cache``: evict every cached block no request uses;
- ``GET /get_server_info``, ``GET /server_info``: the model id, this instance's id and the KV block size
  (how kv_aware groups workers and cuts prompts into blocks); ``GET /get_model_info``;
- ``GET /kv_event_sources``: where this instance publishes its KV events (``kv_events``), by
  data-parallel rank;
- ``POST /v1/completions/render``, ``POST /v1/chat/completions/render``: the prompt's token ids, as the
  completion would see them; ``POST /tokenize``.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable

from fastapi import FastAPI

from hetero.engine import LLM
from hetero.serve.engine_loop import EngineLoop
from hetero.serve.protocol import ChatCompletionRequest, CompletionRequest, TokenizeRequest

__all__ = ["worker_routes"]


def worker_routes(
    app: FastAPI,
    llm: LLM,
    engine: EngineLoop,
    model_name: str,
    kv_events: Any,
    prompt_ids: Callable[[Any], list[int]],
    chat_ids: Callable[[ChatCompletionRequest], list[int]],
    reset: Callable[[LLM], int],
) -> None:
    """Add the routes above; ``prompt_ids`` / ``chat_ids`` give a request's token ids as the OpenAI routes do,
    ``reset(llm)`` evicts the idle cached blocks (on the engine's thread) and returns how many."""
    block_size, instance = llm.config.block_size, f"hetero-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    info = {
        "model_id": model_name,
        "model_path": str(llm.config.model),
        "instance_id": instance,
        "kv_block_size": block_size,
    }

    @app.get("/get_load")
    async def get_load() -> dict:
        return {"load": engine.num_requests}

    async def flush() -> dict:
        evicted = await engine.call(reset)
        return {"evicted_blocks": evicted}

    app.post("/flush_cache")(flush)
    app.post("/reset_prefix_cache")(flush)

    @app.get("/get_server_info")
    async def get_server_info() -> dict:
        return dict(info, max_model_len=llm.config.max_model_len)

    @app.get("/server_info")
    async def server_info() -> dict:
        config = {"model_config": {"model": model_name}, "cache_config": {"block_size": block_size}}
        return {"vllm_config": config, "instance_id": instance}

    @app.get("/get_model_info")
    async def get_model_info() -> dict:
        return {"model_path": str(llm.config.model), "is_generation": True}

    @app.get("/kv_event_sources")
    async def kv_event_sources() -> dict:
        return {"0": kv_events.source()} if kv_events is not None else {}

    @app.post("/v1/completions/render")
    async def render_completion(body: CompletionRequest) -> dict:
        return {"token_ids": prompt_ids(body.prompt), "model": model_name}

    @app.post("/v1/chat/completions/render")
    async def render_chat(body: ChatCompletionRequest) -> dict:
        return {"token_ids": chat_ids(body), "model": model_name}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict:
        ids = prompt_ids(body.prompt)
        return {"tokens": ids, "count": len(ids), "max_model_len": llm.config.max_model_len}
