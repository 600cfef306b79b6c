"""The OpenAI request bodies ``hetero serve`` takes (pydantic models), their limits, and its error body.

Fields follow OpenAI's completions and chat completions APIs; vLLM's extras where they fit:
``ignore_eos``, ``stop_token_ids``, ``top_k`` and ``return_token_ids`` (each choice then carries its
generated ``token_ids``, and the prompt's as ``prompt_token_ids``), and ``kv_transfer_params``, which
a disaggregated pair's router sets (``hetero.serve.pd``). Unknown fields are ignored, as vLLM does.
Known fields are typed strictly, as OpenAI checks them: ``"5"`` is no ``max_tokens``, ``1`` no ``stream``
(an integer is still a number); NaN and infinities are no numbers. A body that is not a JSON object gets a 400
saying so, one with a field of the wrong type or range a 400 whose ``param`` names the field (``request_errors``,
``check_limits``); a path or method not served a 404 or 405, all in OpenAI's error body.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException

from hetero.engine.config import text_config
from hetero.errors import UsageError

__all__ = [
    "SamplingFields",
    "CompletionRequest",
    "ChatMessage",
    "ChatCompletionRequest",
    "TokenizeRequest",
    "check_limits",
    "error_body",
    "request_errors",
]

_INT64_MAX = 2**63 - 1


def _utf8(text: str) -> str:
    # JSON's \ud800 escapes decode to lone surrogates, which no tokenizer (or UTF-8 response) takes
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PydanticCustomError("unicode", "not valid Unicode: a lone surrogate at position {at}", {"at": e.start})
    return text


Text = Annotated[str, AfterValidator(_utf8)]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingFields(_Body):
    """What both endpoints share: the model, the sampling and stopping parameters, streaming."""

    model: Text | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    n: int = 1
    seed: int | None = Field(default=None, ge=0, le=_INT64_MAX)
    stop: Union[Text, list[Text], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)
    return_token_ids: bool = False
    kv_transfer_params: dict | None = None  # prefill/decode disaggregation, between hetero's own servers

    @property
    def include_usage(self) -> bool:
        """A stream ends with a usage chunk (no choices), as OpenAI's ``stream_options.include_usage``."""
        return self.stream and self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingFields):
    """POST /v1/completions: ``prompt`` is a string or a list of token ids."""

    prompt: Union[Text, list[int]]
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Text


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions: ``messages`` rendered by the checkpoint's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)


class TokenizeRequest(_Body):
    """POST /tokenize (``hetero.serve.worker_api``)."""

    prompt: Union[Text, list[int]]
    add_special_tokens: bool = True


def check_limits(body: SamplingFields, config: Any) -> None:
    """UsageError naming the field unless the counts fit the model: no ``max_tokens`` (or ``max_completion_tokens``)
    above ``max_model_len``, which no prompt leaves room for (a smaller one stops at ``max_model_len``), and no
    ``logprobs`` or ``top_logprobs`` above the vocabulary."""
    vocab = getattr(text_config(config.hf_config), "vocab_size", None)
    limits = dict(max_tokens=config.max_model_len, max_completion_tokens=config.max_model_len)
    limits.update(logprobs=vocab, top_logprobs=vocab)
    for field, limit in limits.items():
        value = getattr(body, field, None)
        if limit is not None and type(value) is int and value > limit:
            raise UsageError(f"{field} must be at most {limit} for this model, got {value}", arg=field, got=value)


def error_body(message: str, status: int, param: str | None = None, kind: str = "BadRequestError") -> dict:
    """OpenAI's error JSON: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def request_errors(app: FastAPI) -> None:
    """Answer a body FastAPI cannot read (not JSON, not UTF-8) or validate, and a path or method ``app`` does not
    serve, with OpenAI's error body."""
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http)


async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = invalid_message(exc.errors())
    return JSONResponse(error_body(message, 400, param), status_code=400)


async def _http(request: Request, exc: HTTPException) -> JSONResponse:
    message = f"{request.method} {request.url.path}: {exc.detail}"
    if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI's "error parsing the body" (not UTF-8, ...)
        message = f"the request body is not valid JSON: {exc.__cause__}"
    kind = _KINDS.get(exc.status_code, "BadRequestError")
    return JSONResponse(error_body(message, exc.status_code, None, kind), exc.status_code, exc.headers)


_KINDS = {404: "NotFoundError", 405: "MethodNotAllowedError", 413: "RequestTooLargeError"}
_FIELDS = frozenset().union(
    *(m.model_fields for m in (CompletionRequest, ChatCompletionRequest, ChatMessage, TokenizeRequest))
)
_UNIONS = {"prompt": "a string or a list of token ids", "stop": "a string or a list of strings"}
_JSON_TYPES = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}


def invalid_message(errors: list[dict]) -> tuple[str, str | None]:
    """(message, param) of pydantic's errors for a request body: the first field at fault, by its path
    (``messages.0.content``), or what is wrong with the body as a whole."""
    if not errors:
        return "invalid request body", None
    first = errors[0]
    if first["type"] == "json_invalid":
        error, at = first.get("ctx", {}).get("error", "decode error"), first["loc"][-1]
        return f"the request body is not valid JSON: {error} at position {at}", None
    # a union reports one error per member (loc ends with the member's type): the deepest says most
    first = max((e for e in errors if e["loc"][:2] == first["loc"][:2]), key=lambda e: len(e["loc"]))
    path = [p for p in first["loc"][1:] if isinstance(p, int) or p in _FIELDS]
    if not path:
        return _whole_body(first), None
    where = ".".join(map(str, path))
    message = f"{where}: {first['msg']}"
    if len(path) < len(first["loc"]) - 1 and path[0] in _UNIONS:
        message += f" ({path[0]} is {_UNIONS[path[0]]})"
    return message, where


def _whole_body(error: dict) -> str:
    got = error.get("input")
    if error["type"] == "missing":
        return "the request body is empty: expected a JSON object"
    if isinstance(got, bytes):
        return "the request body is not JSON: send a JSON object with Content-Type: application/json"
    return f"the request body must be a JSON object, got {_JSON_TYPES.get(type(got), 'null')}"
