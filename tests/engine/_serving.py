"""What the serving tests share: uvicorn in a thread, ``hetero serve`` processes, small HTTP helpers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence

import openai
import torch
import uvicorn

from hetero.distributed import free_port

TIMEOUT = 120
CHAT_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: "


def with_chat_template(checkpoint, root) -> str:
    """A copy of ``checkpoint`` at ``root`` whose tokenizer has a plain chat template."""
    import shutil

    from transformers import AutoTokenizer

    shutil.copytree(checkpoint, root)
    tok = AutoTokenizer.from_pretrained(root)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(root)
    return str(root)


class Server:
    """uvicorn serving ``app`` on a free localhost port, in a thread, until ``stop``."""

    def __init__(self, app):
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.05)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read().decode()


def offline(path, prompt_list, max_tokens: int, **engine) -> list[list[int]]:
    """The greedy tokens (EOS ignored) of one ``LLM(path, **engine)``: what a server, or a router over
    servers, must answer."""
    from hetero.engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.token_ids for o in LLM(path, **engine).generate(prompt_list, params, progress=False)]


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (4 + 3 * i,), generator=gen).tolist() for i in range(n)]


def concurrent_streams(c: openai.OpenAI, model: str, prompt_list: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Every prompt streamed at once (greedy, EOS ignored); each one's generated token ids."""
    import concurrent.futures

    def one(p):
        chunks = c.completions.create(
            model=model,
            prompt=p,
            max_tokens=max_tokens,
            stream=True,
            temperature=0.0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        return [t for ch in chunks for t in ch.choices[0].token_ids]

    with concurrent.futures.ThreadPoolExecutor(len(prompt_list)) as pool:
        return list(pool.map(one, prompt_list, timeout=TIMEOUT))


def wait_aborted(llm, message: str = "the request was not aborted") -> None:
    """Wait (60 s at most) until ``llm`` has no unfinished request."""
    deadline = time.monotonic() + 60
    while llm.scheduler.has_unfinished():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def leave_a_whole_request(port: int, llm, message: str = "the request never ran") -> None:
    """POST a long completion, not streamed, to ``port``; close the connection once ``llm`` runs it."""
    import json
    import socket

    body = json.dumps({"prompt": [9, 8, 7, 6], "max_tokens": 400, "temperature": 0.0, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        deadline = time.monotonic() + 60
        while not llm.scheduler.running:
            assert time.monotonic() < deadline, message
            time.sleep(0.01)


def healthy(url: str) -> bool:
    try:
        return get(url + "/health")[0] == 200
    except OSError:  # not listening yet, or a 503
        return False


class _Urls(list):
    procs: list[subprocess.Popen]


@contextlib.contextmanager
def command_servers(
    commands: Sequence[tuple[list[str], list[str]]], seconds: float, stop_s: float, env: dict | None = None
) -> Iterator[list[str]]:
    """``hetero serve`` processes, one per ``(launcher, args)``, all started at once on free ports; their
    URLs (their processes as ``.procs``) once every /health answers within ``seconds``. Each is terminated
    on exit and must end within ``stop_s``."""
    ports = [free_port() for _ in commands]
    procs = []
    try:
        for (launcher, args), port in zip(commands, ports):
            cmd = [*launcher, "-m", "hetero.cli", "serve", *args, "--port", str(port)]
            procs.append(
                subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}
                )
            )
        urls = _Urls(f"http://127.0.0.1:{port}" for port in ports)
        urls.procs = procs
        deadline = time.monotonic() + seconds
        for proc, url in zip(procs, urls):
            while not healthy(url):
                assert proc.poll() is None, proc.stdout.read()[-4000:]
                assert time.monotonic() < deadline, f"{' '.join(proc.args)} did not come up"
                time.sleep(0.2)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(stop_s)


def pd_ends(ident_prefill, ident_decode, secret=None, decode_secret=None, max_tokens=64, unclaimed_s=120.0, name="d"):
    """A ``KVSource`` at a free port (whole blocks of 4 tokens a payload) and a ``KVPuller`` (its secret
    ``decode_secret``, else ``secret``) that pulls from it: ``(source, pull)``, ``pull(transfer_id)``
    blocking, on the source's current engine."""
    from hetero.serve.pd.transfer import KVPuller, KVSource

    source = KVSource(f"127.0.0.1:{free_port()}", ident_prefill, secret, 4, unclaimed_s=unclaimed_s)
    puller = KVPuller(ident_decode, decode_secret if decode_secret is not None else secret, max_tokens, name)

    def pull(transfer_id: str):
        server = source.server
        return asyncio.run(puller.pull(server.host, server.port, server.engine_id, transfer_id))

    pull.puller = puller
    return source, pull


ROUTER = shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))


@contextlib.contextmanager
def router(urls: list[str], *options: str):
    """vllm-router in front of ``urls`` (``--worker-urls``, unless empty); its URL once /health answers."""
    port = free_port()
    cmd = [ROUTER, "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port())]
    cmd += ["--health-check-interval-secs", "1", *(["--worker-urls", *urls] if urls else []), *options]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not healthy(url):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
