"""A graceful stop for ``hetero serve``: the first SIGTERM (or SIGINT) drains the instance, the second stops it.

While draining, ``/health`` answers 503 and every new ``/v1/`` request gets a 503 with OpenAI's error
body, so a router (vllm-router retries 503 on another worker) sends the work elsewhere; the requests
already in the engine run to their end. Once none is left, or after ``--drain-timeout`` seconds (those
still running then end with the shutdown's error), uvicorn shuts down as on a plain signal.
"""

from __future__ import annotations

import threading
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from hetero.serve.protocol import error_body

__all__ = ["DrainingServer", "refuse_while_draining"]


def refuse_while_draining(app: FastAPI) -> None:
    """503 for health and every ``/v1/`` request once ``app.state.draining`` is set."""
    app.state.draining = False

    @app.middleware("http")
    async def draining(request: Request, call_next):
        if app.state.draining:
            if request.url.path == "/health":
                return Response("draining", status_code=503)
            if request.url.path.startswith("/v1/"):
                message = "this instance is draining: send the request elsewhere"
                return JSONResponse(error_body(message, 503, None, "ServiceUnavailableError"), 503)
        return await call_next(request)


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose first exit signal drains ``app`` (its ``state.engine``, an ``EngineLoop``) for at
    most ``timeout_s`` seconds before the usual shutdown; a second signal shuts down at once."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, timeout_s: float):
        super().__init__(config)
        self.app, self.timeout_s = app, timeout_s
        self._drain: threading.Thread | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain is not None:  # the second signal
            return super().handle_exit(sig, frame)
        self.app.state.draining = True
        self._drain = threading.Thread(target=self._wait, args=(sig, frame), name="hetero-drain", daemon=True)
        self._drain.start()

    def _wait(self, sig: int, frame: FrameType | None) -> None:
        deadline = time.monotonic() + self.timeout_s
        while self.app.state.engine.num_requests and time.monotonic() < deadline:
            time.sleep(0.05)
        super().handle_exit(sig, frame)
