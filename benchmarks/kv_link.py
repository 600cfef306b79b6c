"""The PD KV link alone: one cache packed, sent over gloo on localhost, received and unpacked.

    .venv/bin/python benchmarks/kv_link.py [--layers 8] [--kv-heads 2] [--head-dim 64] [--tokens 256,2048,8192]

Both ends run in this process, on two threads; the time is the best of ``--repeats`` transfers,
from packing on the sender to the last payload unpacked on the receiver.
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

from hetero.distributed import free_port
from hetero.engine.runtime.cache_io import SequenceCache
from hetero.serve.pd.identity import Identity
from hetero.serve.pd.link import connect
from hetero.serve.pd.wire import Assembly, header_of, payloads, tokens_per_payload


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
    addr, ends = f"127.0.0.1:{free_port()}", {}
    joins = [
        threading.Thread(target=lambda r: ends.__setitem__(r, connect(r, addr, ident, 60)), args=(r,))
        for r in ("decode", "prefill")
    ]
    for t in joins:
        t.start()
    for t in joins:
        t.join()
    per = tokens_per_payload(ident, args.block_size)
    print("| tokens | MiB | best ms | GiB/s |\n| ---: | ---: | ---: | ---: |")
    for n in map(int, args.tokens.split(",")):
        cache = SequenceCache(n, {name: torch.randn(n, *shape) for name, _, _ in ident.paged}, {}, list(range(n)))
        best, sent = float("inf"), 0
        for rep in range(args.repeats):
            receiver = threading.Thread(target=_receive, args=(ends["decode"], ident, n))
            receiver.start()
            start = time.perf_counter()
            header = header_of(cache, f"t{rep}", ident, per)
            sent = ends["prefill"].send(header, payloads(cache, header))
            receiver.join()
            best = min(best, time.perf_counter() - start)
        print(f"| {n} | {sent / 2**20:.1f} | {best * 1e3:.1f} | {sent / best / 2**30:.2f} |")


def _receive(link, ident: Identity, n: int) -> None:
    header = link.recv_header()
    assembly = Assembly(header, ident, n)
    for i, data in enumerate(link.recv_payloads(header)):
        assembly.take(i, data)


if __name__ == "__main__":
    main()
