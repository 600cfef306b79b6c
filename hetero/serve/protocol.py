"""The OpenAI request bodies ``hetero serve`` takes (pydantic models) and its error body.

Fields follow OpenAI's completions and chat completions APIs; vLLM's extras where they fit:
``ignore_eos``, ``stop_token_ids``, ``top_k`` and ``return_token_ids`` (each choice then carries its
generated ``token_ids``, and the prompt's as ``prompt_token_ids``), and ``kv_transfer_params``, which
a disaggregated pair's router sets (``hetero.serve.pd``). Unknown fields are ignored, as
OpenAI's own server does with fields it does not know.
"""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, Field

__all__ = ["SamplingFields", "CompletionRequest", "ChatMessage", "ChatCompletionRequest", "error_body"]


class SamplingFields(BaseModel):
    """What both endpoints share: the model, the sampling and stopping parameters, streaming."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    n: int = 1
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    stream: bool = False
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)
    return_token_ids: bool = False
    kv_transfer_params: dict | None = None  # prefill/decode disaggregation, between hetero's own servers


class CompletionRequest(SamplingFields):
    """POST /v1/completions: ``prompt`` is a string or a list of token ids."""

    prompt: Union[str, list[int]]
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions: ``messages`` rendered by the checkpoint's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)


def error_body(message: str, status: int, param: str | None = None, kind: str = "BadRequestError") -> dict:
    """OpenAI's error JSON: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
