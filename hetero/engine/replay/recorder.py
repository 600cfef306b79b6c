"""Recording a run's op calls through the op-call seam, bounded, for replay against the reference.

``OpRecorder`` is a hook for ``hetero.engine.instrument``: each call site (a layer's op
slot) has its first ``samples // 2`` calls recorded, then its calls number 2, 4, 8, ... (so a
long decode is still seen late) until it holds ``samples``. A recorded call keeps its
arguments as they were before the call (caches cut to the blocks it touches, ``_compact``) and
its outputs after it, on the host, in a ``TensorStore``; non-tensor arguments stay in memory.
What was not recorded is counted per op and reason.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from hetero.engine.instrument import OpSite
from hetero.engine.replay._compact import compaction
from hetero.engine.replay._store import TensorStore
from hetero.spec import OPS

__all__ = ["CallRecord", "OpRecorder", "layer_of"]

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_STORED = object()  # stands for a tensor leaf kept in the store
NOT_SAMPLED, OVER_CAP, COLLECTIVE = "not sampled", "store cap reached", "collective (runs only with its peers)"


def layer_of(path: str) -> tuple[int | None, str]:
    """(decoder layer index, module path inside it) of a module path; (None, path) outside the layers."""
    m = _LAYER.search(path)
    if m is None:
        return None, path
    return int(m.group(1)), path[m.end():] or "."


@dataclass
class CallRecord:
    """One recorded op call: ``index`` is its place among every op call of the run (recorded or not)."""

    index: int
    path: str
    op: str
    layer: int | None
    module: str
    static: dict[str, str]
    trees: dict[str, tuple[Any, list[Any]]] = field(repr=False, default_factory=dict)
    outputs: tuple[str, ...] = ()
    nbytes: int = 0

    def arguments(self, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The call's arguments rebuilt from the store's ``tensors`` (CPU)."""
        out = {}
        for name, (spec, leaves) in self.trees.items():
            filled = [tensors[f"in.{name}.{i}"] if leaf is _STORED else leaf for i, leaf in enumerate(leaves)]
            out[name] = tree_unflatten(filled, spec)
        return out


def _sampled(n: int, samples: int, recorded: int) -> bool:
    if recorded >= samples:
        return False
    return n < max(samples // 2, 1) or (n & (n - 1)) == 0


class OpRecorder:
    """The recording hook; ``records`` in call order, ``skipped`` as {(op, reason): calls}."""

    def __init__(self, store: TensorStore, samples: int = 4):
        if samples < 1:
            raise ValueError(f"OpRecorder: samples must be >= 1, got {samples}")
        self.store, self.samples = store, samples
        self.records: list[CallRecord] = []
        self.skipped: Counter[tuple[str, str]] = Counter()
        self._calls = 0
        self._seen: Counter[str] = Counter()
        self._kept: Counter[str] = Counter()

    def __call__(self, site: OpSite, fn: Callable, args: tuple, kwargs: dict[str, Any]) -> Any:
        index, key = self._calls, f"{site.path}.{site.attr}"
        self._calls += 1
        n = self._seen[key]
        self._seen[key] += 1
        spec = OPS[site.op]
        reason = COLLECTIVE if spec.collective else None if _sampled(n, self.samples, self._kept[key]) else NOT_SAMPLED
        if reason is not None:
            self.skipped[site.op, reason] += 1
            return fn(*args, **kwargs)
        bound = spec.signature.bind(*args, **kwargs)
        arguments = dict(bound.arguments)
        cut = compaction(arguments)
        record, tensors = self._inputs(index, site, cut.arguments(arguments) if cut else arguments)
        result = fn(*args, **kwargs)
        outputs = _outputs(site.op, arguments, result)
        outputs = cut.outputs(outputs) if cut else outputs
        tensors.update({f"out.{k}": v.detach().to("cpu", copy=True) for k, v in outputs.items()})
        record.outputs = tuple(outputs)
        record.nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if self.store.put(index, tensors):
            self.records.append(record)
            self._kept[key] += 1
        else:
            self.skipped[site.op, OVER_CAP] += 1
        return result

    @staticmethod
    def _inputs(index: int, site: OpSite, arguments: dict[str, Any]) -> tuple[CallRecord, dict[str, torch.Tensor]]:
        layer, module = layer_of(site.path)
        record = CallRecord(index, site.path, site.op, layer, module, static={})
        tensors: dict[str, torch.Tensor] = {}
        for name, value in arguments.items():
            leaves, spec = tree_flatten(value)
            kept = []
            for i, leaf in enumerate(leaves):
                if isinstance(leaf, torch.Tensor):
                    tensors[f"in.{name}.{i}"] = leaf.detach().to("cpu", copy=True)
                    kept.append(_STORED)
                else:
                    kept.append(leaf)
            record.trees[name] = (spec, kept)
            if not isinstance(value, torch.Tensor) and not any(isinstance(x, torch.Tensor) for x in leaves):
                record.static[name] = repr(value)
        return record, tensors


def _outputs(op: str, arguments: dict[str, Any], result: Any) -> dict[str, torch.Tensor]:
    from hetero_conformance.outputs import outputs_of

    return outputs_of(op, arguments, result)
