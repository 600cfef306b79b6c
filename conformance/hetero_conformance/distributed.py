"""``hetero conformance NAME --world-size N``: the collectives and expert parallelism on N ranks.

The parent starts N ranks (``python -m hetero_conformance._dist_rank`` through the
conformance spawner, ``_spawn``, as ``--isolate`` starts its workers; rendezvous
through a FileStore in a temporary directory). Each rank loads backend
NAME, initializes the default process group with its ``process_group_backend()``
(gloo for an interpreter), takes ``backend.communicator()`` and runs the same list of cases in the same
order. Every rank draws its inputs from (seed, case, rank), so each one can
recompute the others' inputs and check its own outputs against a single-process
reference:

* ``all_reduce`` (sum, max), ``all_gather`` and ``reduce_scatter`` (dim 0 and 1),
  ``all_to_all`` (uneven and zero splits), ``broadcast``, ``barrier``;
* ``send``/``recv`` and ``send_tensor_dict``/``recv_tensor_dict`` (``_dist_p2p``): a ring and pairs
  over six dtypes, empty and 0-dim tensors, Qwen3-8B's hidden states and residual, and a peer
  that dies (the last case: it needs spawned ranks and is skipped under torchrun);
* ``ep_dispatch`` + the rank's expert MLP (``grouped_gemm``, ``silu_and_mul``,
  ``grouped_gemm`` of the backend) + ``ep_combine``, against the reference
  ``fused_moe`` on the concatenated batch (float64 oracle, float32 reference and
  the float32 tolerance of ``tolerances.py``).

Each rank appends one JSON line per case to its own file; the parent merges the
lines into one CaseResult per case (failing if any rank failed, naming it). A
rank that dies is reported as ``crashed`` (with the end of its stderr); when no
rank finishes a case within ``timeout`` seconds the ranks are killed and the
unfinished cases are ``timeout``.

Under torchrun (``torchrun --nproc-per-node 2 -m hetero_conformance.distributed cpu_ref``)
the ranks use torchrun's environment instead, and rank 0 gathers the results and
prints the summary.

The cases live in ``_dist_case`` / ``_dist_checks``, the rank's side in ``_dist_rank``, the merge of
the ranks' records into verdicts in ``_dist_merge``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

import hetero
from hetero.distributed import init
from hetero.spec import OPS
from hetero_conformance._dist_case import DistCase
from hetero_conformance._dist_checks import dist_cases, selected_dist_cases
from hetero_conformance._dist_merge import ended, merge, read_records
from hetero_conformance._dist_rank import rank_config, run_rank
from hetero_conformance._spawn import Child, stop_all, watch
from hetero_conformance.runner import CaseResult
from hetero_conformance.suite import SelectionError, SuiteResult, build_meta

__all__ = ["DistCase", "dist_cases", "run_distributed", "run_rank", "main"]

_RANK = "hetero_conformance._dist_rank"
#: Seconds on top of ``timeout`` before the first record: spawning the ranks and importing torch.
_GRACE_S = 60.0


def _run_ranks(
    name: str, world: int, seed: int, quick: bool, patterns: Sequence[str], scratch: str, timeout: float
) -> tuple[bool, list[int | None], list[list[str]]]:
    """Start the ``world`` ranks and wait for them: (timed out, exit codes, gist of each one's stderr).

    Each rank reports through its file in ``scratch`` (its progress: the files grow with every case
    started or finished); its stdout and stderr go to its log. Exit code None: killed at the timeout
    before it recorded its end (it did not finish, it did not die)."""
    env = {"HETERO_COMM_TIMEOUT": f"{timeout:g}"}  # a collective that waits longer than a case may is a failure
    files = [Path(scratch) / f"rank{r}.jsonl" for r in range(world)]
    ranks: list[Child] = []
    timed_out = False
    try:
        for r in range(world):
            ranks.append(
                Child(
                    _RANK, rank_config(r, name, world, seed, quick, patterns, scratch, timeout), messages=False, env=env
                )
            )
        timed_out = watch(
            ranks, lambda: sum(f.stat().st_size for f in files if f.exists()), timeout=timeout, grace=_GRACE_S
        )
    finally:
        codes = stop_all(ranks)
    exits = [
        None if (timed_out and code is not None and code < 0 and not ended(files[i])) else code
        for i, code in enumerate(codes)
    ]
    stderr = [rank.stderr_gist() for rank in ranks]
    for rank in ranks:
        rank.close()
    return timed_out, exits, stderr


def run_distributed(
    name: str,
    world: int,
    *,
    seed: int = 0,
    quick: bool = False,
    patterns: Sequence[str] = (),
    timeout: float = 300.0,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Spawn ``world`` ranks, run every distributed case on them, merge the ranks' verdicts.

    ``timeout``: seconds the ranks may go without finishing a case before all are killed.
    """
    cases = selected_dist_cases(world, quick=quick, patterns=patterns)
    with tempfile.TemporaryDirectory(prefix="hetero-conformance-world") as scratch:
        timed_out, exits, stderr = _run_ranks(name, world, seed, quick, patterns, scratch, timeout)
        per_rank = [read_records(Path(scratch) / f"rank{r}.jsonl") for r in range(world)]
    results = merge(cases, per_rank, exits, timed_out, seed, stderr)
    if on_result is not None:
        for r in results:
            on_result(r)
    return results


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hetero_conformance.distributed")
    p.add_argument("name")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-k", dest="patterns", action="append", default=[])
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """``torchrun --nproc-per-node N -m hetero_conformance.distributed NAME [--quick] [--seed S]``."""
    args = _parse(argv)
    warnings.filterwarnings("ignore", message=".*is deprecated.*", category=FutureWarning)
    backend = hetero.load(args.name).backend
    comm = init(type(backend), timeout=None)
    rank, world = comm.rank, comm.world_size
    records: list[dict[str, Any]] = []
    shared = [tempfile.mkdtemp(prefix="hetero-conformance-torchrun-") if rank == 0 else None]
    dist.broadcast_object_list(shared, 0)  # the ranks of torchrun --nproc-per-node share a host
    scratch = Path(shared[0])
    run_rank(
        args.name,
        rank,
        world,
        seed=args.seed,
        quick=args.quick,
        patterns=args.patterns,
        scratch=scratch,
        emit=records.append,
    )
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, records)
    code = 0
    if rank == 0:
        results = merge(
            selected_dist_cases(world, quick=args.quick, patterns=args.patterns),
            gathered,
            [0] * world,
            False,
            args.seed,
        )
        for r in results:
            print(f"{r.status:8} {r.id}  {r.message}")
        code = 0 if all(r.status in ("pass", "skipped") for r in results) else 1
    flag = torch.tensor([code])
    dist.broadcast(flag, 0)
    dist.destroy_process_group()
    if rank == 0:
        shutil.rmtree(scratch, ignore_errors=True)
    return int(flag.item())


def run_world_suite(
    registry: Any,
    name: str,
    world: int,
    selection: Any,
    *,
    seed: int = 0,
    timeout: float = 300.0,
    console: Any = None,
    argv: Sequence[str] | None = None,
) -> Any:
    """A SuiteResult of the distributed cases on ``world`` ranks (``--world-size``), reported like any run."""
    if selection.ops or selection.dtypes:
        collectives = {name for name, spec in OPS.items() if spec.collective}
        bad = [o for o in selection.ops if o not in {c.op for c in dist_cases(world)} | collectives]
        if bad or any(d != "float32" for d in selection.dtypes):
            raise SelectionError(
                "--world-size runs the collectives and ep_dispatch+ep_combine in float32; "
                "select them with -k (e.g. -k all_reduce)"
            )
    ops = registry.load(name)  # BackendNotFound/Unavailable here, not in N ranks
    suite = SuiteResult(
        build_meta(
            registry,
            name,
            ops.device,
            seed=seed,
            selection=selection,
            isolate=False,
            timeout=timeout,
            argv=argv,
            world_size=world,
        )
    )
    start = time.perf_counter()
    patterns = tuple(selection.patterns) + tuple(f"{op}/" for op in selection.ops)
    if console is not None:
        console.print(f"spawning {world} ranks of {name}", style="dim", highlight=False)
    suite.results = run_distributed(name, world, seed=seed, quick=selection.quick, patterns=patterns, timeout=timeout)
    suite.meta["run"]["duration_s"] = round(time.perf_counter() - start, 3)
    return suite


if __name__ == "__main__":
    sys.exit(main())
