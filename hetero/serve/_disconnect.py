"""Waiting on something for a client that may close its connection first (a request not streamed)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Awaitable, TypeVar

from starlette.requests import Request

__all__ = ["ClientGone", "unless_gone"]

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result; if the client leaves first, ``work`` is cancelled and ``ClientGone`` raised.
    Call it after the request's body is read."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the handler itself is cancelled (shutdown): so is the work
        task.cancel()
        raise
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientGone()
    return task.result()


async def _disconnect(request: Request) -> None:
    # callers have read the body, so the only message left to come is the disconnect; a receive
    # channel that fails counts as one
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001
        return
