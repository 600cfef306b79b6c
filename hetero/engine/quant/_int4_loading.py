"""Loading packed int4 weights (``int4``): the parameters of a weight's parts in canonical form, the conversion
of each checkpoint tensor as it loads, the checks of tensor-parallel cuts, and act-order column orders."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from hetero.engine.quant._int4math import group_index, pack_int4, unpack_int4
from hetero.engine.quant.base import QuantMethod, register_weight
from hetero.engine.quant.config import UnsupportedQuantization

__all__ = ["Int4Loading", "permuted_columns"]


class Int4Loading(QuantMethod):
    """Registering the parts of a packed int4 weight, converting checkpoint tensors as they load, and the
    checks tensor-parallel cuts need (shared by the Linear and the MoE methods)."""

    def __init__(self, scheme: Any):  # an int4.Int4Scheme
        self.scheme = scheme

    def _full(self, layer: nn.Module, shard: Any) -> tuple[int, int]:
        """(rows, columns) of the whole checkpoint weight that fills ``shard`` (before any rank cut)."""
        raise NotImplementedError

    def _register(self, layer, prefix: str, lead: tuple[int, ...], n: int, k: int, loader, shards, **attrs) -> None:
        """The weight, scale and zero point parameters of [*lead, n, k] weights, named ``{prefix}{suffix}``."""
        names, groups = self.scheme.names, -(-k // self.scheme.group(k))
        parts = {"weight": (-(-k // 2), torch.uint8), "scale": (groups, torch.float32), "zero": (groups, torch.uint8)}
        for part, (cols, dtype) in parts.items():
            if part in names:
                register_weight(
                    layer,
                    prefix + names[part],
                    layer.ctx.empty(*lead, n, cols, dtype=dtype),
                    loader=self._converting(layer, part, loader),
                    shards=shards,
                    int4_part=part,
                    **attrs,
                )

    def _local(self, layer: nn.Module, shard: Any) -> bool:
        """Whether this rank holds ``shard`` (an expert of another rank's is skipped before converting)."""
        if isinstance(shard, tuple) and shard[0] is None:
            raise ValueError("int4 experts load from per-expert tensors, not a fused tensor of every expert")
        return True

    def _converting(self, layer: nn.Module, part: str, loader: Callable) -> Callable:
        def load(param: nn.Parameter, tensor: torch.Tensor, shard: Any = None):
            if not self._local(layer, shard):
                return False
            return loader(param, self.scheme.canonical(part, tensor, *self._full(layer, shard)), shard)

        return load

    def _shape_loader(self, layer: nn.Module) -> Callable:
        """compressed-tensors' ``weight_shape`` [2]: checked against the layer's, nothing stored."""

        def load(param: nn.Parameter, tensor: torch.Tensor, shard: Any = None):
            if not self._local(layer, shard):
                return False
            want = list(self._full(layer, shard))
            if tensor.tolist() != want:
                raise ValueError(f"weight_shape: the checkpoint says {tensor.tolist()}, the layer's weight is {want}")
            return True

        return load

    def _check_cut(self, layer: nn.Module, width: int, ranks: int) -> None:
        """Refuse a cut of K into ``width`` columns a rank that splits a group or a byte, or an act-order weight."""
        g = self.scheme.group_size
        if self.scheme.desc_act:
            raise UnsupportedQuantization(
                f"{layer.prefix}: GPTQ act-order (desc_act) weights cannot be split along their input columns "
                f"over {ranks} ranks (g_idx permutes the columns among the groups); run with one rank"
            )
        if (g is not None and width % g) or width % 2:
            what = f"a group of {g} columns" if g is not None and width % g else "a byte (two columns)"
            raise UnsupportedQuantization(
                f"{layer.prefix}: splitting the input columns over {ranks} ranks leaves a shard width of {width}, "
                f"which cuts {what} (int4 group size {g or 'per channel'}; each rank's columns must be whole "
                "groups and whole bytes)"
            )

    def tp_part(self, layer, param, tensor, dim, index, count):
        part = getattr(param, "int4_part", None)
        if part in ("scale", "zero") and self.scheme.group_size is None and dim == tensor.ndim - 1:
            return tensor  # per channel: the one group spans every rank's columns
        return super().tp_part(layer, param, tensor, dim, index, count)

    def _zero_points(self, layer: nn.Module, zero: torch.Tensor | None) -> torch.Tensor | None:
        """The zero points ``apply`` passes: None for symmetric weights (GPTQ stores 8s: checked)."""
        if zero is None or not self.scheme.symmetric:
            return zero
        if not bool((zero == 8).all()):
            raise UnsupportedQuantization(
                f"{layer.prefix}: the config says sym, but the stored zero points are not all 8"
            )
        return None

    def _order(self, layer: nn.Module, g_idx: torch.Tensor, k: int, what: str) -> torch.Tensor | None:
        """The column order that makes ``g_idx``'s groups contiguous (None: already so); refused unless each
        group holds as many columns as in the canonical layout (a permutation of it)."""
        g, g_idx = self.scheme.group(k), g_idx.long()
        canonical = group_index(k, g, g_idx.device)
        if torch.equal(g_idx, canonical):
            return None
        groups = -(-k // g)
        if (
            int(g_idx.min()) < 0
            or int(g_idx.max()) >= groups
            or not torch.equal(torch.bincount(g_idx, minlength=groups), torch.bincount(canonical, minlength=groups))
        ):
            raise UnsupportedQuantization(
                f"{layer.prefix}: {what} is not a permutation of {groups} groups of {g} columns (act-order "
                "checkpoints assign each group the same number of columns)"
            )
        if not self.scheme.desc_act:
            raise UnsupportedQuantization(
                f"{layer.prefix}: {what} permutes the columns but the config says desc_act false"
            )
        return torch.argsort(g_idx, stable=True)


def permuted_columns(packed: torch.Tensor, k: int, order: torch.Tensor) -> torch.Tensor:
    """Canonical ``packed`` [..., N, ceil(k/2)] with its columns in ``order`` ([k], or [E, k]: one per expert)."""
    codes = unpack_int4(packed, k)
    index = order.unsqueeze(-2).expand(*codes.shape) if order.ndim > 1 else order.expand(*codes.shape)
    return pack_int4(codes.gather(-1, index))
