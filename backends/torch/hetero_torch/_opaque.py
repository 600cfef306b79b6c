"""Python functions as opaque ``torch.ops.hetero_torch`` ops, so torch.compile keeps each one call in
its graph (a data-dependent size or a host read inside would otherwise break the graph).

Registered through ``torch.library.Library`` rather than ``torch.library.custom_op``: the latter's
dispatch wraps every call in Python of its own, about 20 us a call on the 2-core build machine,
which at a Qwen3-0.6B decode step's 113 GEMMs is 2 ms a step; a plain kernel registration costs
about 2 us. The ops are for inference: they have no autograd formula.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

__all__ = ["opaque"]

_NAMESPACE = "hetero_torch"
_LIBRARY = torch.library.Library(_NAMESPACE, "DEF")


def opaque(name: str, fn: Callable, fake: Callable, mutates_args: Sequence[str] = ()):
    """``torch.ops.hetero_torch.<name>``, running ``fn`` on every device; its schema from fn's
    annotations, ``fake`` its shape function for tracing."""
    _LIBRARY.define(name + torch.library.infer_schema(fn, mutates_args=tuple(mutates_args)))
    _LIBRARY.impl(name, fn, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{_NAMESPACE}::{name}", fake, lib=_LIBRARY)
    return getattr(torch.ops.hetero_torch, name)
