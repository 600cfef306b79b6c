"""The worker side of ``--isolate`` (``python -m hetero_conformance._isolate_worker``): one op family's cases.

Reads its config (backend, seed, catalog, quick, ids) as JSON on stdin, loads the
backend by name, rebuilds the cases from the catalog and runs them in order,
reporting on the ``hetero_conformance._worker`` protocol channel.
"""

from __future__ import annotations

import json
import sys

from hetero.registry import REFERENCE, default_registry
from hetero_conformance._worker import Channel
from hetero_conformance.runner import Runner
from hetero_conformance.suite import load_catalog, run_cases

__all__ = ["main"]


def main() -> int:
    """Run the cases the config on stdin names; 0 once every one has its result."""
    channel = Channel()
    config = json.loads(sys.stdin.read())
    registry = default_registry()
    ops = registry.load(config["backend"])
    runner = Runner(ops, registry.entry(REFERENCE).cls(), seed=config["seed"])
    by_id = {c.id: c for c in load_catalog(config["catalog"], quick=config["quick"])}
    channel.emit("ready")
    for cid in config["ids"]:
        case = by_id.get(cid)
        if case is None:
            channel.emit(
                "result",
                result={
                    "id": cid,
                    "op": cid.split("/")[0],
                    "family": "",
                    "shape": "",
                    "dtype": "",
                    "status": "error",
                    "message": f"the worker's catalog {config['catalog']} has no case {cid}",
                },
            )
            continue
        run_cases(
            runner,
            [case],
            on_start=lambda c: channel.emit("start", id=c.id),
            on_result=lambda r: channel.emit("result", result=r.as_dict()),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
