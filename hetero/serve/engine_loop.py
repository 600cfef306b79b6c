"""``EngineLoop``: an ``LLM`` stepped on its own thread, its requests added and streamed from asyncio.

The engine's ``step`` is blocking compute, so it runs on one worker thread that alone touches the
``LLM``; request handlers on the event loop hand it commands (add, abort) through a queue and
receive each request's outputs through an ``asyncio.Queue``. Between steps the thread applies the
commands, so a request added or aborted mid-step takes effect at the next step boundary. ``export``
runs a prompt only until it is computed and hands back its cache (the prefill side of
disaggregation).

Under tensor, expert or pipeline parallelism (torchrun) rank 0 serves and every other rank runs ``follow``:
before each step rank 0 broadcasts what the ranks do next ("step", "idle" or "stop"), so they step
together and an idle server still meets its followers every ``IDLE_S`` seconds.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import signal
import sys
import threading
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Sequence

from hetero.engine import LLM, SamplingParams
from hetero.engine.outputs import RequestOutput
from hetero.engine.runtime.cache_io import SequenceCache
from hetero.errors import CommError

__all__ = ["EngineLoop", "follow", "IDLE_S"]

#: how long an idle loop waits for a request before it checks in (and tells the followers) again
IDLE_S = 0.5


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue


@dataclass
class _Add:
    request_id: str
    prompt: str | Sequence[int]
    params: SamplingParams
    stream: _Stream
    added: asyncio.Future
    cache: SequenceCache | None = None
    export: bool = False  # deliver the cache once the prompt is computed, not tokens


class EngineLoop:
    """Serve ``llm`` from a worker thread. ``on_step(llm, outputs)`` runs on that thread after every
    step (the server's metrics); ``start`` / ``stop`` bound the thread's life."""

    def __init__(self, llm: LLM, on_step: Callable[[LLM, list[RequestOutput]], None] | None = None):
        self.llm = llm
        self._on_step = on_step
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._exports: set[str] = set()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="hetero-engine-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)

    async def generate(
        self, prompt: str | Sequence[int], params: SamplingParams, cache: SequenceCache | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Add a request (its first ``cache.num_tokens`` prompt tokens imported from ``cache``) and
        yield its outputs as steps produce them, the last one finished.

        Raises what ``LLM.add_request`` raises for a bad request. Closing the iterator early (a
        client that went away) aborts the request, which frees its blocks."""
        add = self._add(prompt, params, cache)
        self._send(add)
        finished = False
        try:
            await add.added  # inside: cancelled here, the request is aborted once it is added
            while not finished:
                out = await add.stream.outputs.get()
                if isinstance(out, BaseException):
                    raise out
                finished = out.finished
                yield out
        finally:
            if not finished:
                self._send(("abort", add.request_id))

    async def export(self, prompt_ids: Sequence[int]) -> SequenceCache:
        """Compute ``prompt_ids``' cache (the prefill side of disaggregation): the request runs until
        its prompt is computed, its cache is exported and the request is aborted."""
        add = self._add(list(prompt_ids), SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), export=True)
        self._send(add)
        try:
            await add.added
            got = await add.stream.outputs.get()
        except BaseException:
            self._send(("abort", add.request_id))
            raise
        if isinstance(got, BaseException):
            raise got
        return got

    def _add(self, prompt, params: SamplingParams, cache: SequenceCache | None = None, export: bool = False) -> _Add:
        loop = asyncio.get_running_loop()
        return _Add(
            f"req-{next(self._ids)}",
            prompt,
            params,
            _Stream(loop, asyncio.Queue()),
            loop.create_future(),
            cache,
            export,
        )

    @property
    def num_requests(self) -> int:
        """Requests this server has in the engine now (waiting, running or exporting): its load."""
        return len(self._streams)

    async def call(self, fn: Callable[[LLM], object]) -> object:
        """``fn(llm)`` run on the engine thread between two steps (the engine's state is that thread's);
        its result, or its exception raised here."""
        loop = asyncio.get_running_loop()
        call = _Call(fn, loop, loop.create_future())
        self._send(call)
        result = await call.done
        if isinstance(result, BaseException):
            raise result
        return result

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._apply_commands()
            stopping = self._stopping.is_set()
            pipe = self.llm.pipeline
            busy = not stopping and (self.llm.scheduler.has_unfinished() or bool(pipe and pipe.flying))
            try:
                _tell(self.llm, "stop" if stopping else "step" if busy else "idle")
                if stopping:
                    break
                if not busy:
                    self._wake.wait(IDLE_S)
                    self._wake.clear()
                    continue
                outputs = self.llm.step()
            except CommError as e:  # a rank is gone: the group cannot step again
                self._broken(e)
                return
            except Exception as e:  # noqa: BLE001  (every open request learns of it; the loop goes on)
                self._fail_all(e)
                continue
            for out in outputs:
                if out.request_id in self._exports:
                    self._export(out)
                else:
                    self._deliver(out.request_id, out, out.finished)
            if self._on_step is not None:
                self._on_step(self.llm, outputs)
        self._fail_all(RuntimeError("the server is shutting down"))

    def _broken(self, error: CommError) -> None:
        """Every open request ends with ``error``, and the server stops (SIGTERM to itself: uvicorn shuts down)."""
        self._fail_all(error)
        print(f"hetero serve: stopping, the ranks' group is broken: {error}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Call):
                try:
                    result: object = command.fn(self.llm)
                except Exception as e:  # noqa: BLE001  (the caller learns why)
                    result = e
                command.loop.call_soon_threadsafe(_settle_value, command.done, result)
                continue
            if isinstance(command, tuple):  # ("abort", request_id)
                if self._streams.pop(command[1], None) is not None:
                    self._exports.discard(command[1])
                    self.llm.abort(command[1])
                continue
            try:
                self.llm.add_request(command.prompt, command.params, command.request_id, cache=command.cache)
            except Exception as e:  # noqa: BLE001  (a bad request is the caller's error, raised there)
                command.stream.loop.call_soon_threadsafe(_settle, command.added, e)
                continue
            self._streams[command.request_id] = command.stream
            if command.export:
                self._exports.add(command.request_id)
            command.stream.loop.call_soon_threadsafe(_settle, command.added, None)

    def _export(self, out: RequestOutput) -> None:
        """An exporting request computed its prompt: hand over its cache and end it."""
        self._exports.discard(out.request_id)
        try:
            if out.finished:
                raise RuntimeError(
                    f"request {out.request_id} finished ({out.finish_reason}) before its cache was exported"
                )
            _tell(self.llm, "export")  # every rank exports its shard with rank 0
            item: object = self.llm.export_cache(out.request_id)
            self.llm.abort(out.request_id)
        except Exception as e:  # noqa: BLE001  (the exporter learns why)
            item = e
        self._deliver(out.request_id, item, True)

    def _deliver(self, request_id: str, item: object, last: bool) -> None:
        stream = self._streams.pop(request_id, None) if last else self._streams.get(request_id)
        if stream is not None:
            stream.loop.call_soon_threadsafe(stream.outputs.put_nowait, item)

    def _fail_all(self, error: BaseException) -> None:
        self._exports.clear()
        for request_id in list(self._streams):
            self.llm.abort(request_id)
            self._deliver(request_id, error, True)


def _tell(llm: LLM, what: str) -> None:
    if llm.world.size > 1:
        llm.world.broadcast_object(what, llm.runner.device)


def follow(llm: LLM) -> None:
    """A rank other than 0 of a served engine: step (or export its shard of a cache) when rank 0 says so, until it
    says stop."""
    while True:
        what = llm.world.broadcast_object(None, llm.runner.device)
        if what == "stop":
            return
        if what == "step":
            llm.step()
        elif what == "export":
            llm.export_cache()


@dataclass
class _Call:
    fn: Callable[[LLM], object]
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future


def _settle_value(future: asyncio.Future, value: object) -> None:
    if not future.done():
        future.set_result(value)


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
