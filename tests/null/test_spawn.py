"""Selection works the same in worker processes started with the spawn method."""

from __future__ import annotations

import multiprocessing as mp
import os

from spawn_target import load_in_child


def test_load_inside_spawned_workers():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=load_in_child, args=(queue, "cpu_ref")) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert {r[0] for r in results} == {"cpu_ref"}
    assert all(r[1] == ["backend"] for r in results)
    assert len({r[2] for r in results} | {os.getpid()}) == 3
