"""Load a Hugging Face safetensors checkpoint into a hetero model, by its declared ``WeightMapping``.

Each checkpoint name maps to (parameter name, shard), checked in this order:

1. ``mapping.ignore``: ``re.fullmatch`` (the whole name must match) -> ignored;
2. ``mapping.experts``: ``re.fullmatch`` with groups ``layer``/``expert`` (and an
   optional ``suffix``) -> (``WeightMapping.expert_param``: the template for suffix
   ``weight``, template_suffix otherwise, (int(expert), projection));
3. ``mapping.packed``: the first fragment with ``.{fragment}.`` in the name ->
   the name with ``.{parameter fragment}.`` (first occurrence), shard;
4. otherwise the same name, shard None.

The mapping is read from ``model.mapping``, so a model may set a config-dependent
one on the instance (e.g. ignoring MTP layers past ``num_hidden_layers``). A
Parameter shared under several names (tied embeddings) loads once: from its first
registered name if the checkpoint has it, else from an alias. Every problem found is
reported at once; tensors are read one at a time and nothing is ever unpickled.

Once every tensor is in, the post-load pass (``process_weights_after_loading``) lets
each layer's quantization method fix its weights up, then runs every ``post_load()``
hook (MLA's absorbed weights); it runs again after each load.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hetero.engine.layers.weights import copy_checked
from hetero.engine.models.base import WeightMapping
from hetero.engine.pipeline import stand_in_names
from hetero.errors import UsageError

__all__ = [
    "load_weights",
    "LoadReport",
    "WeightLoadError",
    "CheckpointFilesError",
    "WeightMismatchError",
    "UnexpectedWeightsError",
    "MissingWeightsError",
    "checkpoint_files",
    "map_name",
    "checkpoint_name",
    "render_pattern",
    "process_weights_after_loading",
]

INDEX = "model.safetensors.index.json"


class WeightLoadError(UsageError):
    """A checkpoint that does not fit the model; ``mismatched``, ``unexpected``, ``missing`` list every problem.
    A user error (the command prints it as one line): the message names the checkpoint's tensors."""

    def __init__(self, message: str, *, mismatched=(), unexpected=(), missing=()):
        super().__init__(message)
        self.mismatched, self.unexpected, self.missing = list(mismatched), list(unexpected), list(missing)


class CheckpointFilesError(WeightLoadError):
    """No safetensors, only pickled weights, an index naming absent files, or a tensor in two files."""


class WeightMismatchError(WeightLoadError):
    """A weight loader refused a tensor (shape mismatch, unknown shard)."""


class UnexpectedWeightsError(WeightLoadError):
    """Checkpoint tensors that map to no parameter and match no ignore rule."""


class MissingWeightsError(WeightLoadError):
    """Parameters (or shards of them) the checkpoint does not provide."""


@dataclass
class LoadReport:
    """What ``load_weights`` did: files read, tensors loaded, ignored (names), skipped as other ranks' experts,
    and skipped as other pipeline stages' (tensors under a ``StandIn``, never read)."""

    files: list[str] = field(default_factory=list)
    loaded: int = 0
    ignored: list[str] = field(default_factory=list)
    skipped_experts: int = 0
    other_stages: int = 0


def checkpoint_files(model_dir: str | Path, who: str = "the model") -> list[Path]:
    """The safetensors files of ``model_dir``: those the index names, else every ``*.safetensors``."""
    d = Path(model_dir)
    where = f"loading {who} from {d}"
    if (d / INDEX).is_file():
        names = sorted(set(json.loads((d / INDEX).read_text())["weight_map"].values()))
        absent = [n for n in names if not (d / n).is_file()]
        if absent:
            raise CheckpointFilesError(f"{where}: {INDEX} names shard file(s) missing on disk: {', '.join(absent)}")
        return [d / n for n in names]
    files = sorted(d.glob("*.safetensors"))
    if files:
        return files
    pickled = sorted(p.name for p in [*d.glob("pytorch_model*.bin"), *d.glob("*.pt")])
    if pickled:
        raise CheckpointFilesError(
            f"{where}: found only pickled weights ({', '.join(pickled)}); hetero loads safetensors "
            "only and never unpickles. Convert them first, e.g. load in transformers and "
            "save_pretrained(dir, safe_serialization=True)"
        )
    raise CheckpointFilesError(f"{where}: no safetensors files (and no {INDEX}) in {d}")


def map_name(mapping, name: str) -> tuple[str, Any] | None:
    """(parameter name, shard) of checkpoint tensor ``name``, or None when the mapping ignores it."""
    for pattern, replacement in mapping.renames:
        name = re.sub(pattern, replacement, name)
    if any(re.fullmatch(p, name) for p in mapping.ignore):
        return None
    for pattern, template, proj in mapping.experts:
        m = re.fullmatch(pattern, name)
        if m:
            expert = m.groupdict().get("expert")
            return WeightMapping.expert_param(template, m.groupdict()), (None if expert is None else int(expert), proj)
    for frag, param_frag, shard in mapping.packed:
        if f".{frag}." in name:
            return name.replace(f".{frag}.", f".{param_frag}.", 1), shard
    return name, None


_GROUP = re.compile(r"\(\?P<(\w+)>(?:[^()\\]|\\.)*\)")


def render_pattern(pattern: str, **values: Any) -> str | None:
    """The one name ``pattern`` matches once its named groups are ``values``; None if not a plain literal."""
    try:
        text = _GROUP.sub(lambda m: str(values[m[1]]), pattern.removeprefix("^").removesuffix("$"))
    except KeyError:
        return None
    out, chars = [], iter(text)
    for c in chars:
        if c == "\\":
            c = next(chars, "")
            if not c or c.isalnum():
                return None
        elif c in "[](){}*+?|^$":
            return None
        out.append(c)
    name = "".join(out)
    return name if re.fullmatch(pattern, name) else None


def checkpoint_name(mapping, param_name: str, shard: Any) -> str:
    """The checkpoint tensor that fills ``shard`` of ``param_name`` (``map_name`` reversed)."""
    if shard is None:
        return param_name
    if isinstance(shard, tuple):
        expert, proj = shard
        for pattern, template, p in mapping.experts:
            groups = p == proj and WeightMapping.expert_groups(template, param_name)
            if groups:
                values = dict(groups, expert=expert)
                return render_pattern(pattern, **values) or f"{pattern} with {values}"
    for frag, param_frag, s in mapping.packed:
        if s == shard and f".{param_frag}." in param_name:
            return param_name.replace(f".{param_frag}.", f".{frag}.", 1)
    return f"{param_name} [shard {shard!r}]"


def _default_loader(param: nn.Parameter, tensor: torch.Tensor, shard: Any = None) -> None:
    copy_checked(param, tensor, "parameter")


def _parameters(model: nn.Module) -> tuple[dict[str, nn.Parameter], dict[str, str]]:
    """Parameters by first name, and every name (aliases of shared Parameters included) -> first name."""
    first = dict(model.named_parameters())
    by_id = {id(p): n for n, p in first.items()}
    return first, {n: by_id[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}


def _tensor_files(files: list[Path], where: str) -> dict[str, Path]:
    """Checkpoint name -> the file holding it (reads headers only); a name in two files is an error."""
    from safetensors import safe_open

    found: dict[str, Path] = {}
    twice = []
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if name in found:
                    twice.append(f"{name} ({found[name].name} and {path.name})")
                found.setdefault(name, path)
    if twice:
        raise CheckpointFilesError(f"{where}: tensors stored in more than one file: {'; '.join(sorted(twice))}")
    return found


@torch.no_grad()
def load_weights(model: nn.Module, model_dir: str | Path) -> LoadReport:
    """Fill every parameter of ``model`` from the safetensors checkpoint in ``model_dir``.

    Raises a ``WeightLoadError`` subclass listing every problem: the class is that of the
    first kind found, in the order files, mismatched, unexpected, missing.
    """
    from safetensors import safe_open

    mapping, cls = model.mapping, type(model).__name__
    where = f"loading {cls} from {model_dir}"
    files = checkpoint_files(model_dir, cls)
    located = _tensor_files(files, where)
    params, canonical = _parameters(model)
    elsewhere = stand_in_names(model)
    report = LoadReport(files=[str(f) for f in files])
    filled: set[tuple[str, Any]] = set()
    mismatched, unexpected = [], []
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                target = map_name(mapping, name)
                if target is not None and target[0].startswith(elsewhere):
                    report.other_stages += 1
                    continue
                if target is not None and target[0] not in canonical:
                    unexpected.append(name)
                    continue
                if target is None or (
                    target[0] != canonical[target[0]]
                    and checkpoint_name(mapping, canonical[target[0]], target[1]) in located
                ):
                    report.ignored.append(name)
                    continue
                pname, shard = canonical[target[0]], target[1]
                param = params[pname]
                try:
                    ok = getattr(param, "weight_loader", _default_loader)(param, f.get_tensor(name), shard)
                except ValueError as e:
                    mismatched.append(f"{name} (in {path.name}) -> parameter {pname}: {e}")
                    filled.add((pname, shard))  # reported here, not again as missing
                    continue
                if ok is False:
                    report.skipped_experts += 1
                else:
                    report.loaded += 1
                    filled.update((pname, s) for s in (ok if isinstance(ok, tuple) else (shard,)))
    missing = sorted(
        checkpoint_name(mapping, n, s)
        for n, p in params.items()
        for s in getattr(p, "shards", (None,))
        if (n, s) not in filled
    )
    _raise_problems(where, mismatched, sorted(unexpected), missing)
    process_weights_after_loading(model)
    return report


@torch.no_grad()
def process_weights_after_loading(model: nn.Module) -> None:
    """The post-load pass: every layer's ``quant_method.process_weights_after_loading(layer)``, then every
    module's ``post_load()`` hook. Methods first, so a hook (MLA splitting kv_b_proj per head) reads
    processed weights; ``load_weights`` runs it after every load, so what it derives follows a reload."""
    modules = list(model.modules())
    for module in modules:
        method = vars(module).get("quant_method")
        if method is not None:
            method.process_weights_after_loading(module)
    for module in modules:
        hook = getattr(module, "post_load", None)
        if callable(hook):
            hook()


def _raise_problems(where: str, mismatched: list[str], unexpected: list[str], missing: list[str]) -> None:
    sections = [
        (WeightMismatchError, "tensor(s) the model's weight loaders refused", mismatched),
        (UnexpectedWeightsError, "checkpoint tensor(s) that match no parameter and no ignore rule", unexpected),
        (MissingWeightsError, "tensor(s) the model needs and the checkpoint lacks", missing),
    ]
    found = [(c, what, items) for c, what, items in sections if items]
    if found:
        text = "\n".join(f"{len(items)} {what}:\n" + "\n".join(f"  {i}" for i in items) for _, what, items in found)
        raise found[0][0](f"{where}:\n{text}", mismatched=mismatched, unexpected=unexpected, missing=missing)
