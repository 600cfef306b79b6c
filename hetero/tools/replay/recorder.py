"""Recording a run's op calls through the op-call seam, bounded, for replay against the reference.

``OpRecorder`` is a hook for ``hetero.engine.instrument``. Each call site (a layer's op slot)
keeps its first ``samples // 2`` calls and, in the other half of its ``samples``, the latest of
its calls number 2, 4, 8, ... (an earlier one is dropped for a later one), so the end of a long
decode is seen as well as its start. A recorded call keeps its arguments as they were before
the call (caches cut to the blocks it touches, ``_compact``) and its outputs after it, on the
host, in a ``TensorStore``; the model's weights are stored once and shared by every call that
reads them. The cap is checked on the sizes before anything is copied. What was not recorded
is counted per op and reason.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from hetero.engine.instrument import OpSite
from hetero.spec import OPS
from hetero.tools.replay._compact import compaction
from hetero.tools.replay._store import TensorStore, nbytes
from hetero.verify.outputs import outputs_of

__all__ = ["CallRecord", "OpRecorder", "Located", "layer_of", "NOT_SAMPLED", "OVER_CAP", "COLLECTIVE"]

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_STORED = object()  # stands for a tensor leaf kept in the store
NOT_SAMPLED, OVER_CAP, COLLECTIVE = "not sampled", "store cap reached", "collective (runs only with its peers)"


def layer_of(path: str) -> tuple[int | None, str]:
    """(decoder layer index, module path inside it) of a module path; (None, path) outside the layers."""
    m = _LAYER.search(path)
    if m is None:
        return None, path
    return int(m.group(1)), path[m.end() :] or "."


class Located:
    """``layer`` and ``module`` of an object with a module ``path``."""

    path: str

    @property
    def layer(self) -> int | None:
        return layer_of(self.path)[0]

    @property
    def module(self) -> str:
        return layer_of(self.path)[1]


@dataclass
class CallRecord(Located):
    """One recorded op call: ``index`` is its place among every op call of the run (recorded or not)."""

    index: int
    path: str
    attr: str
    op: str
    static: dict[str, str]
    trees: dict[str, tuple[Any, list[Any]]] = field(repr=False, default_factory=dict)
    shared: dict[str, str] = field(repr=False, default_factory=dict)  # tensor key -> the weight's file
    outputs: tuple[str, ...] = ()

    @property
    def file(self) -> str:
        return f"call-{self.index:06d}"

    def tensors(self, store: TensorStore) -> dict[str, torch.Tensor]:
        """Its inputs (``in.<argument>.<leaf>``) and outputs (``out.<name>``) from ``store``, on the host."""
        out = store.get(self.file)
        out.update({key: store.get(name)["t"] for key, name in self.shared.items()})
        return out

    def arguments(self, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The call's arguments rebuilt from ``tensors``."""
        out = {}
        for name, (spec, leaves) in self.trees.items():
            filled = [tensors[f"in.{name}.{i}"] if leaf is _STORED else leaf for i, leaf in enumerate(leaves)]
            out[name] = tree_unflatten(filled, spec)
        return out


@dataclass
class _Site:
    op: str
    seen: int = 0
    early: list[CallRecord] = field(default_factory=list)
    late: list[CallRecord] = field(default_factory=list)


def _weight_key(t: torch.Tensor) -> tuple:
    return t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype


class OpRecorder:
    """The recording hook; ``records`` in call order, ``skipped`` as {(op, reason): calls}.

    ``model``: its parameters and buffers (and views of them) are stored once, shared by every call."""

    def __init__(self, store: TensorStore, samples: int = 4, model: nn.Module | None = None):
        if samples < 1:
            raise ValueError(f"OpRecorder: samples must be >= 1, got {samples}")
        self.store = store
        self.early, self.late = max(samples // 2, 1), samples - max(samples // 2, 1)
        self.skipped: Counter[tuple[str, str]] = Counter()
        self.sites: dict[tuple[str, str], _Site] = {}
        self._calls = 0
        tensors = [*model.parameters(), *model.buffers()] if model is not None else []
        self._weights = {t.untyped_storage().data_ptr() for t in tensors}
        self._stored_weights: dict[tuple, str] = {}

    @property
    def records(self) -> list[CallRecord]:
        return sorted((r for s in self.sites.values() for r in (*s.early, *s.late)), key=lambda r: r.index)

    def unrecorded(self) -> list[tuple[str, str]]:
        """(path, op) of every call site that ran and has no recorded call (collectives aside)."""
        return [
            (path, s.op)
            for (path, _), s in self.sites.items()
            if not s.early and not s.late and not OPS[s.op].collective
        ]

    def __call__(self, site: OpSite, fn: Callable, args: tuple, kwargs: dict[str, Any]) -> Any:
        index = self._calls
        self._calls += 1
        st = self.sites.setdefault((site.path, site.attr), _Site(site.op))
        n, st.seen = st.seen, st.seen + 1
        slot = (
            None
            if OPS[site.op].collective
            else "early"
            if len(st.early) < self.early and n < self.early
            else "late"
            if self.late and n >= self.early and n & (n - 1) == 0
            else None
        )
        if slot is None:
            self.skipped[site.op, COLLECTIVE if OPS[site.op].collective else NOT_SAMPLED] += 1
            return fn(*args, **kwargs)
        if slot == "late" and len(st.late) == self.late:
            dropped = st.late.pop(0)  # a later call takes its place
            self.store.delete(dropped.file)
            self.skipped[site.op, NOT_SAMPLED] += 1
        record, result = self._record(index, site, fn, args, kwargs)
        if record is None:
            self.skipped[site.op, OVER_CAP] += 1
        else:
            (st.early if slot == "early" else st.late).append(record)
        return result

    def _record(
        self, index: int, site: OpSite, fn: Callable, args: tuple, kwargs: dict[str, Any]
    ) -> tuple[CallRecord | None, Any]:
        arguments = dict(OPS[site.op].signature.bind(*args, **kwargs).arguments)
        cut = compaction(arguments)
        record, own, weights = self._flatten(index, site, cut.arguments(arguments) if cut else arguments)
        new_weights = {k: t for k, t in weights.items() if _weight_key(t) not in self._stored_weights}
        if not self.store.fits(nbytes(own.values()) + nbytes(new_weights.values())):
            return None, fn(*args, **kwargs)
        tensors = {k: t.detach().to("cpu", copy=True) for k, t in own.items()}  # before the call mutates them
        for key, t in weights.items():
            record.shared[key] = self._weight_file(t)
        result = fn(*args, **kwargs)
        outputs = _outputs(site.op, arguments, result)
        outputs = cut.outputs(outputs) if cut else outputs
        if not self.store.fits(nbytes(tensors.values()) + nbytes(outputs.values())):
            return None, result
        tensors.update({f"out.{k}": v.detach().to("cpu", copy=True) for k, v in outputs.items()})
        record.outputs = tuple(outputs)
        self.store.put(record.file, tensors)
        return record, result

    def _weight_file(self, t: torch.Tensor) -> str:
        key = _weight_key(t)
        if key not in self._stored_weights:
            name = f"weight-{len(self._stored_weights):05d}"
            self.store.put(name, {"t": t.detach().to("cpu", copy=True)})
            self._stored_weights[key] = name
        return self._stored_weights[key]

    def _flatten(self, index: int, site: OpSite, arguments: dict[str, Any]):
        """(record, its own tensors, the model weights it reads) by store key; tensors still on the device."""
        record = CallRecord(index, site.path, site.attr, site.op, static={})
        own: dict[str, torch.Tensor] = {}
        weights: dict[str, torch.Tensor] = {}
        mutated = OPS[site.op].mutated_names
        for name, value in arguments.items():
            leaves, spec = tree_flatten(value)
            kept = []
            for i, leaf in enumerate(leaves):
                if isinstance(leaf, torch.Tensor):
                    is_weight = name not in mutated and leaf.untyped_storage().data_ptr() in self._weights
                    (weights if is_weight else own)[f"in.{name}.{i}"] = leaf
                    kept.append(_STORED)
                else:
                    kept.append(leaf)
            record.trees[name] = (spec, kept)
            if not any(isinstance(x, torch.Tensor) for x in leaves):
                record.static[name] = repr(value)
        return record, own, weights


def _outputs(op: str, arguments: dict[str, Any], result: Any) -> dict[str, torch.Tensor]:
    return outputs_of(op, arguments, result)
