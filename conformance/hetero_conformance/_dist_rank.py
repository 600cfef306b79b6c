"""One rank of a ``--world-size`` run: run every selected case and record a line per event.

The parent starts ``python -m hetero_conformance._dist_rank`` per rank through the
conformance spawner (``_spawn.Child``), its config as JSON on stdin; :func:`main`
hands it to :func:`rank_main` (rendezvous through a FileStore in the scratch
directory). Under torchrun, ``hetero_conformance.distributed.main`` calls
:func:`run_rank` directly.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

import torch.distributed as dist

import hetero
from hetero.errors import CommError
from hetero.registry import REFERENCE, default_registry
from hetero_conformance._dist_case import RankContext, Skip
from hetero_conformance._dist_checks import selected_dist_cases

__all__ = ["run_rank", "rank_main", "rank_config", "main"]


def _load(name: str) -> tuple[Any, Any]:
    registry = default_registry()
    return hetero.load(name), registry.entry(REFERENCE).cls()


def run_rank(
    name: str,
    rank: int,
    world: int,
    *,
    seed: int,
    quick: bool,
    patterns: Sequence[str],
    scratch: Path,
    emit: Callable[[dict[str, Any]], None],
    spawned: bool = False,
) -> None:
    """Run every case on this rank (the process group is initialized); ``emit`` each record.

    ``spawned``: this process ends with the run (the spawner's rank), so a case may let a rank leave."""
    ops, reference = _load(name)
    comm = ops.backend.communicator()
    ctx = RankContext(ops, reference, comm, rank, world, seed, scratch, spawned)
    for case in selected_dist_cases(world, quick=quick, patterns=patterns):
        emit({"event": "start", "id": case.id})
        t0 = time.perf_counter()
        fatal = False
        try:
            problems, outputs = case.fn(ctx, case)
            status, message = ("fail" if problems else "pass"), "; ".join(problems)
        except Skip as e:
            status, message, outputs = "skipped", str(e), {}
        except Exception as e:
            fatal = isinstance(e, CommError)
            status, message, outputs = "error", traceback.format_exception_only(type(e), e)[-1].strip(), {}
        emit(
            {
                "event": "done",
                "id": case.id,
                "status": status,
                "message": message,
                "outputs": outputs,
                "seconds": time.perf_counter() - t0,
                "seed": case.seed(seed),
            }
        )
        if fatal:  # the group is unusable after a failed collective
            raise SystemExit(3)


def rank_main(
    rank: int, name: str, world: int, seed: int, quick: bool, patterns: Sequence[str], scratch: str, timeout: float
) -> None:
    """A spawned rank: join the group, run the cases into ``scratch/rank{rank}.jsonl``, exit.

    The spawner sets ``HETERO_COMM_TIMEOUT`` to ``timeout`` in the rank's environment."""
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    warnings.filterwarnings("ignore", message=".*is deprecated.*", category=FutureWarning)
    out = open(Path(scratch) / f"rank{rank}.jsonl", "a", buffering=1)

    def emit(rec: dict[str, Any]) -> None:
        out.write(json.dumps(rec) + "\n")
        out.flush()

    try:
        backend = hetero.load(name).backend
        store = dist.FileStore(str(Path(scratch) / "store"), world)
        dist.init_process_group(
            backend=type(backend).process_group_backend(),
            store=store,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout),
        )
        run_rank(
            name, rank, world, seed=seed, quick=quick, patterns=patterns, scratch=Path(scratch), emit=emit, spawned=True
        )
        emit({"event": "end"})
    except SystemExit:
        raise
    except BaseException as e:
        emit({"event": "abort", "message": traceback.format_exception_only(type(e), e)[-1].strip()})
        raise SystemExit(2)
    finally:
        out.close()
    # skip destroy_process_group: a peer may be gone; the process exits now
    os._exit(0)


def rank_config(
    rank: int, name: str, world: int, seed: int, quick: bool, patterns: Sequence[str], scratch: str, timeout: float
) -> dict[str, Any]:
    """The JSON config :func:`main` reads: :func:`rank_main`'s arguments by name."""
    return {
        "rank": rank,
        "name": name,
        "world": world,
        "seed": seed,
        "quick": quick,
        "patterns": list(patterns),
        "scratch": scratch,
        "timeout": timeout,
    }


def main() -> None:
    """``python -m hetero_conformance._dist_rank`` with a :func:`rank_config` on stdin."""
    config = json.loads(sys.stdin.read())
    rank_main(**{**config, "patterns": tuple(config["patterns"])})


if __name__ == "__main__":
    main()
