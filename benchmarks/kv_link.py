"""The PD KV link alone: one cache held on the prefill side, pulled over gloo on localhost and unpacked.

    .venv/bin/python benchmarks/kv_link.py [--layers 8] [--kv-heads 2] [--head-dim 64] [--tokens 256,2048,8192]

Both ends run in this process; the time is the best of ``--repeats`` pulls, from the decode side's
request to the last payload unpacked (packing on the prefill side included; the link is dialed
before the first timed pull).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from hetero.distributed import free_port
from hetero.engine.runtime.cache_io import SequenceCache
from hetero.serve.pd.identity import Identity
from hetero.serve.pd.transfer import KVPuller, KVSource
from hetero.serve.pd.wire import tokens_per_payload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--tokens", default="256,2048,8192")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    shape = (args.kv_heads, args.head_dim)
    ident = Identity(
        "decode",
        "-",
        "0" * 32,
        tuple((f"layers.{i}.{k}", "torch.float32", shape) for i in range(args.layers) for k in ("k", "v")),
        (),
    )
    source = KVSource(f"127.0.0.1:{free_port()}", ident, None, tokens_per_payload(ident, args.block_size))
    sizes = list(map(int, args.tokens.split(",")))
    puller = KVPuller(ident, None, max(sizes), "bench")
    server = source.server

    async def pull(cache: SequenceCache) -> SequenceCache:
        return await puller.pull(server.host, server.port, server.engine_id, source.hold(cache))

    async def run() -> None:  # one event loop for every pull, as a server has
        await pull(SequenceCache(1, {name: torch.randn(1, *shape) for name, _, _ in ident.paged}, {}, [0]))  # dial
        print("| tokens | MiB | best ms | GiB/s |\n| ---: | ---: | ---: | ---: |")
        for n in sizes:
            cache = SequenceCache(n, {name: torch.randn(n, *shape) for name, _, _ in ident.paged}, {}, list(range(n)))
            sent = sum(t.nbytes for t in cache.paged.values())
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                await pull(cache)
                best = min(best, time.perf_counter() - start)
            print(f"| {n} | {sent / 2**20:.1f} | {best * 1e3:.1f} | {sent / best / 2**30:.2f} |")

    asyncio.run(run())
    puller.close()
    source.close()


if __name__ == "__main__":
    main()
