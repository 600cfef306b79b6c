"""Glue operators around attention and the MLP: normalization, rotary embedding, gated activation."""

from __future__ import annotations

import math
import numbers

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import check_same_device, check_tensor
from hetero.spec._op import Output, spec_op

__all__ = ["rms_norm", "layer_norm", "rotary_embedding", "silu_and_mul"]

#: rms_norm's gate activations (``gate_act``).
GATE_ACTS = ("silu", "sigmoid")


@spec_op(returns=("out", Output("residual", when="residual")))
def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
    weight_offset: float = 0.0,
    gate: torch.Tensor | None = None,
    gate_act: str = "silu",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Root-mean-square normalization, optionally fused with the residual add, or gated.

    x [T, H] (or any [..., H]), weight [H]; computed in float32 or wider:
    ``xn = x * rsqrt(mean(x**2, -1) + eps)``, ``w = weight + weight_offset``
    (weight widened first, then the offset added), ``y = xn * w`` rounded once to
    x's dtype. ``weight_offset=1.0`` is the zero-centred norm of Qwen3-Next and
    Qwen3.5, ``(xn * (1 + weight.float())).to(dtype)``; the default 0.0 is the
    plain norm. With ``residual`` (x's shape and dtype): ``h = x + residual``
    rounded to x's dtype, and the result is ``(rms_norm(h), h)``; the caller keeps
    ``h`` as the next residual. weight_offset applies there too.

    ``gate`` (x's shape and dtype; None: no gate) selects the gated norm of Gated
    DeltaNet (``gate_act="silu"``) and Kimi's KDA (``"sigmoid"``). With ``r()`` a
    rounding to x's dtype and ``act`` evaluated on the widened gate:
    ``y = r(r(r(xn) * w) * act(gate))``, the order of transformers'
    ``Qwen3NextRMSNormGated`` and ``Qwen3_5RMSNormGated`` (``xn.to(dtype)``, times
    the weight, rounded as the weight has x's dtype in a checkpoint, times
    ``act(gate.float())``, ``.to(dtype)``); the norm comes before the gate. Kimi-Linear's gated
    norm rounds only at the end: a backend may do that (it is within the tolerance). The norm runs over the
    last dimension only, so a norm grouped per head (Gated DeltaNet's per value
    head, V = 128) is the caller's reshape of x and gate to [..., V], with weight
    [V]. ``gate`` with ``residual`` is an OpError (no model fuses them);
    ``gate_act`` is "silu" or "sigmoid" (checked even without a gate).
    """


@spec_op(returns=("out",))
def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """Layer normalization over the last dimension, with weight and optional bias (the DSA indexer's k_norm).

    x [T, H] (or any [..., H]); weight [H] and bias [H] (or None) of x's dtype or
    float32. In float32 or wider: ``mean = mean(x, -1)``, ``var = mean((x - mean)**2, -1)``
    (biased), ``y = (x - mean) * rsqrt(var + eps) * weight + bias``, rounded once to
    x's dtype (torch.nn.LayerNorm's arithmetic). eps > 0. Returns [..., H] in x's dtype.
    """


def check_rms_norm_options(
    op: str, x: torch.Tensor, residual: object, weight_offset: object, gate: object, gate_act: object
) -> None:
    """The 1.2 options of rms_norm (after ``hetero.spec.checks.check_rms_norm`` checked x):
    raises ``hetero.OpError`` naming the argument at fault."""
    ok_offset = isinstance(weight_offset, numbers.Real) and not isinstance(weight_offset, bool)
    if not (ok_offset and math.isfinite(weight_offset)):
        raise OpError(op, "weight_offset", "a finite number", repr(weight_offset))
    if gate_act not in GATE_ACTS:
        raise OpError(op, "gate_act", " or ".join(map(repr, GATE_ACTS)), repr(gate_act))
    if gate is None:
        return
    if residual is not None:
        raise OpError(op, "gate", "None when 'residual' is given (the gated norm has no residual add)", "a tensor")
    check_tensor(op, "gate", gate, dtypes=(x.dtype,))
    assert isinstance(gate, torch.Tensor)
    if not (gate.shape == x.shape):
        raise OpError(op, "gate", f"shape {list(x.shape)} (that of 'x')", f"shape {list(gate.shape)}")
    check_same_device(op, x=x, gate=gate)


@spec_op(returns=("q", "k"))
def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``rot`` dims of every query and key head by its position's angles.

    positions int64 [T], each in [0, P); q [T, Hq, D], k [T, Hkv, D];
    cos_sin_cache [P, rot] (float32 or q's dtype) holds ``cos`` in columns
    [0, rot/2) and ``sin`` in [rot/2, rot); rot is even and <= D (dims past rot
    pass through: partial rotary). Pair i (of rot/2) is dims (i, i + rot/2) when
    ``is_neox`` (GPT-NeoX, Llama, Qwen), dims (2i, 2i+1) otherwise (GPT-J,
    DeepSeek's interleaved rope): ``(x1, x2) -> (x1*cos - x2*sin, x2*cos + x1*sin)``.
    Returns new (q, k) in their dtypes, computed in float32 or wider.
    """


@spec_op(returns=("out",))
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """The gated activation of SwiGLU MLPs: ``silu(x[..., :I]) * x[..., I:]``.

    x [T, 2I] (or any [..., 2I]); computed in float32 or wider, returns [T, I] in x's dtype.
    """
