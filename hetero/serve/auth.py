"""``--api-key`` (or ``HETERO_API_KEY``): every ``/v1/`` request and every call that changes the server's
state must carry ``Authorization: Bearer <key>``, as vLLM's flag asks; health, metrics and the read-only
worker information stay open (a router and Prometheus poll them). The key is compared in constant time;
a missing or wrong one gets a 401 with OpenAI's error body."""

from __future__ import annotations

import hmac

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from hetero.serve.protocol import error_body

__all__ = ["require_api_key", "GUARDED"]

#: path prefixes that need the key (the rest: /health, /metrics, /get_load, /get_server_info, ...)
GUARDED = ("/v1/", "/flush_cache", "/reset_prefix_cache", "/tokenize")


def require_api_key(app: FastAPI, key: str) -> None:
    """Make ``app`` refuse guarded requests that do not present ``key``."""
    expected = f"Bearer {key}".encode()

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if request.url.path.startswith(GUARDED):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                what = "missing" if not given else "wrong"
                body = error_body(
                    f"{what} API key: send 'Authorization: Bearer <key>'", 401, None, "AuthenticationError"
                )
                return JSONResponse(body, status_code=401)
        return await call_next(request)
