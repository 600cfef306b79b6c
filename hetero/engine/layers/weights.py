"""Copying checkpoint tensors into parameters, and naming modules by their checkpoint prefix."""

from __future__ import annotations

import torch

__all__ = ["copy_checked", "is_plain_float", "join_prefix"]


def is_plain_float(dtype: torch.dtype) -> bool:
    """A floating dtype of 16 bits or more: one value per element, no scale needed to read it.

    float8 (and packed float4) values only mean something with their scales, so they are
    quantized data, as are integer tensors.
    """
    return dtype.is_floating_point and dtype.itemsize >= 2


def copy_checked(param: torch.Tensor, tensor: torch.Tensor, what: str) -> None:
    """Copy ``tensor`` into ``param``, or raise a ValueError naming what differs.

    Shapes must be equal. Dtypes must be equal, or both plain floats (then the value is
    cast): a quantized tensor (float8, int8, packed uint8, ...) is never cast into a float
    parameter, since without its scale the numbers would be silently wrong.
    """
    if tensor.dtype != param.dtype and not (is_plain_float(tensor.dtype) and is_plain_float(param.dtype)):
        raise ValueError(
            f"{what}: the checkpoint tensor is {tensor.dtype}, the parameter expects {param.dtype}; "
            "a quantized tensor loads only into a layer whose quantization method creates "
            "parameters of its dtype (is the checkpoint's quantization_config supported?)"
        )
    if tuple(param.shape) != tuple(tensor.shape):
        raise ValueError(f"{what}: expected shape {tuple(param.shape)}, the checkpoint has {tuple(tensor.shape)}")
    param.data.copy_(tensor.to(param.dtype))


def join_prefix(prefix: str, name: str) -> str:
    """The checkpoint prefix of child ``name`` of the module at ``prefix`` ("" is the root)."""
    return f"{prefix}.{name}" if prefix else name
