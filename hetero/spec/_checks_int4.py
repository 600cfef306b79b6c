"""Argument validation of packed int4 weights (spec 1.9, W4A16) in gemm, grouped_gemm and fused_moe.

The encoding is ``hetero.spec.gemm``'s: a uint8 weight ``[..., N, ceil(K/2)]`` (two codes a byte, the
even column in the low nibble), float32 scales ``[..., N, ceil(K/g)]``, optional uint8 zero points of
the scales' shape. Scales may be float64 only with float64 activations (the oracle's widened copies).
Every failure is a hetero.OpError naming the op, the argument, what was expected and what came. The
cheap checks read no tensor value; ``check_int4_zero_point_values`` reads the zero points (host).
"""

from __future__ import annotations

import numbers

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import check_tensor
from hetero.spec.gemm import SCALE_FORMATS
from hetero.spec.types import FLOAT_DTYPES

__all__ = [
    "PACKED_INT4",
    "INT4_OPTIONS",
    "int4_cols",
    "int4_groups",
    "check_group_size",
    "check_int4_weight",
    "check_packed_gemm",
    "check_no_int4",
    "check_int4_zero_point_values",
    "check_fused_moe_int4",
]

#: The dtype of a packed int4 weight: two 4-bit codes a byte.
PACKED_INT4 = torch.uint8
#: gemm's and grouped_gemm's options of a packed weight (fused_moe's: w13/w2_zero_point, group_size).
INT4_OPTIONS = ("b_scale", "b_zero_point", "group_size")


def _dt(d: object) -> str:
    return str(d).replace("torch.", "")


def int4_cols(k: int) -> int:
    """The bytes of a packed row of K codes: ceil(K / 2)."""
    return -(-k // 2)


def int4_groups(k: int, group_size: int) -> int:
    """The scale groups of a row of K columns: ceil(K / group_size)."""
    return -(-k // group_size)


def check_group_size(op: str, group_size: object, what: str) -> int:
    """A positive int (not a bool); ``what`` says which weight needs it."""
    ok = isinstance(group_size, numbers.Integral) and not isinstance(group_size, bool) and int(group_size) >= 1
    if not ok:
        raise OpError(
            op, "group_size", f"a positive int with {what} (32, 64 or 128 in released checkpoints)", repr(group_size)
        )
    return int(group_size)


def check_int4_weight(
    op: str,
    names: tuple[str, str, str],
    tensors: tuple[object, object, object],
    lead: tuple[int, ...],
    n: int,
    k: int,
    group_size: int,
    act: torch.Tensor,
    owner: str,
) -> None:
    """One packed weight ``names[0]`` uint8 [*lead, N, ceil(K/2)] with its scale ``names[1]`` float32
    [*lead, N, ceil(K/g)] (float64 too when ``act``, the activations named ``owner``, are float64) and
    optional zero point ``names[2]`` uint8 of the scale's shape, all on act's device. ``lead`` entries
    of -1 take any size."""
    w_arg, s_arg, z_arg = names
    w, scale, zp = tensors
    dims = [None if d < 0 else d for d in lead]
    layout = "[" + ", ".join(["*" if d is None else str(d) for d in dims] + [str(n)]) + ", ceil(K/2)]"
    check_tensor(op, w_arg, w, ndim=len(lead) + 2, dtypes=(PACKED_INT4,))
    assert isinstance(w, torch.Tensor)
    want = (*dims, n, int4_cols(k))
    if not all(d is None or d == s for d, s in zip(want, w.shape)):
        raise OpError(
            op,
            w_arg,
            f"packed int4 shape {layout} = {[('*' if d is None else d) for d in want]} (K = {k})",
            f"shape {list(w.shape)}",
        )
    if not (w.device == act.device):
        raise OpError(op, w_arg, f"device {act.device} (that of '{owner}')", str(w.device))
    groups = int4_groups(k, group_size)
    scale_shape = (*w.shape[:-1], groups)
    if scale is None:
        raise OpError(op, s_arg, f"float32 scales {list(scale_shape)} with a packed uint8 {w_arg}", "None")
    dtypes = (torch.float32, torch.float64) if act.dtype == torch.float64 else (torch.float32,)
    check_tensor(op, s_arg, scale, dtypes=dtypes)
    assert isinstance(scale, torch.Tensor)
    if not (tuple(scale.shape) == scale_shape):
        raise OpError(
            op,
            s_arg,
            f"shape {list(scale_shape)} (one scale per row and group of {group_size} of K = {k} columns)",
            f"shape {list(scale.shape)}",
        )
    if not (scale.device == act.device):
        raise OpError(op, s_arg, f"device {act.device} (that of '{owner}')", str(scale.device))
    if zp is None:
        return
    check_tensor(op, z_arg, zp, dtypes=(PACKED_INT4,))
    assert isinstance(zp, torch.Tensor)
    if not (tuple(zp.shape) == scale_shape):
        raise OpError(op, z_arg, f"shape {list(scale_shape)} (that of '{s_arg}')", f"shape {list(zp.shape)}")
    if not (zp.device == act.device):
        raise OpError(op, z_arg, f"device {act.device} (that of '{owner}')", str(zp.device))


def check_no_int4(op: str, weight: str, dtype: torch.dtype, **options: object) -> None:
    """Each of ``options`` None: they go with a packed int4 (uint8) ``weight`` only, and it is ``dtype``."""
    for arg, value in options.items():
        if value is not None:
            raise OpError(
                op,
                arg,
                f"None with a {_dt(dtype)} {weight} (it goes with a packed int4 weight: uint8 {weight})",
                type(value).__name__ if isinstance(value, torch.Tensor) else repr(value),
            )


def check_packed_gemm(
    op: str,
    a: object,
    b: object,
    options: tuple[object, object, object],
    *,
    b_ndim: int = 2,
    bias: object = None,
    out_dtype: object = None,
) -> int | None:
    """gemm's (b_ndim 2) or grouped_gemm's (3) packed int4 operands; ``options`` is (b_scale,
    b_zero_point, group_size). None when b is not a uint8 tensor (then the three options must be None,
    and the float checks are the caller's); else the group size, once a [M, K] floating, b uint8
    [(G,) N, ceil(K/2)], b_scale, b_zero_point, out_dtype (floating or None) and bias ([N] of a's dtype
    or float32, or None) are checked."""
    b_scale, b_zero_point, group_size = options
    packed = isinstance(b, torch.Tensor) and b.dtype == PACKED_INT4
    if not packed and b_scale is None and b_zero_point is None and group_size is None:
        return None  # every float call: first and cheap
    if not packed:
        if isinstance(b, torch.Tensor):
            check_no_int4(op, "b", b.dtype, b_scale=b_scale, b_zero_point=b_zero_point, group_size=group_size)
        return None
    check_tensor(op, "a", a, ndim=2, dtypes=FLOAT_DTYPES)
    assert isinstance(a, torch.Tensor)
    g = check_group_size(op, group_size, "a packed uint8 b")
    check_tensor(op, "b", b, ndim=b_ndim, dtypes=(PACKED_INT4,))
    names, tensors = ("b", "b_scale", "b_zero_point"), (b, b_scale, b_zero_point)
    check_int4_weight(op, names, tensors, (-1,) * (b_ndim - 2), b.shape[-2], a.shape[1], g, a, "a")
    if not (out_dtype is None or out_dtype in FLOAT_DTYPES):
        raise OpError(op, "out_dtype", "None or one of " + ", ".join(_dt(d) for d in FLOAT_DTYPES), _dt(out_dtype))
    if bias is not None:
        check_tensor(op, "bias", bias, shape=(b.shape[-2],), dtypes=tuple(dict.fromkeys((a.dtype, torch.float32))))
        assert isinstance(bias, torch.Tensor)
        if not (bias.device == a.device):
            raise OpError(op, "bias", f"device {a.device} (that of 'a')", str(bias.device))
    return g


def check_int4_zero_point_values(op: str, arg: str, zp: torch.Tensor | None) -> None:
    """Zero points in [0, 15] (a host read; the reference runs it on every call)."""
    if zp is None or zp.numel() == 0:
        return
    hi = int(zp.max())
    if not (hi <= 15):
        raise OpError(op, arg, "zero points in [0, 15] (4-bit codes)", f"a value {hi}")


def check_fused_moe_int4(
    op: str,
    x: object,
    w13: torch.Tensor,
    w2: object,
    biases: tuple[object, object],
    quant: tuple[object, object, object, object],
    zero_points: tuple[object, object],
    group_size: object,
) -> tuple[int, int, int]:
    """fused_moe's packed int4 experts (w13 is uint8): x [M, H] floating, w13 [E, 2I, ceil(H/2)] and w2
    [E, H, ceil(I/2)] with their scales and optional zero points, ``group_size``, the optional biases
    [E, 2I] and [E, H] of x's dtype, and ``act_quant`` None (weight-only). ``quant`` is (w13_scale,
    w2_scale, act_quant, act_scale_fmt); returns (M, H, E)."""
    check_tensor(op, "x", x, ndim=2, dtypes=FLOAT_DTYPES)
    assert isinstance(x, torch.Tensor)
    rows, hidden = x.shape
    w13_scale, w2_scale, act_quant, act_scale_fmt = quant
    if act_scale_fmt not in SCALE_FORMATS:
        raise OpError(op, "act_scale_fmt", "one of " + ", ".join(repr(s) for s in SCALE_FORMATS), repr(act_scale_fmt))
    if act_quant is not None:
        raise OpError(
            op, "act_quant", "None with packed int4 experts (W4A16 is weight-only: x stays floating)", repr(act_quant)
        )
    g = check_group_size(op, group_size, "packed uint8 experts")
    check_tensor(op, "w13", w13, ndim=3)
    experts, two_i = w13.shape[0], w13.shape[1]
    if not (two_i % 2 == 0):
        raise OpError(op, "w13", "shape [E, 2I, ceil(H/2)] with an even 2I", f"shape {list(w13.shape)}")
    inter = two_i // 2
    check_int4_weight(
        op,
        ("w13", "w13_scale", "w13_zero_point"),
        (w13, w13_scale, zero_points[0]),
        (experts,),
        two_i,
        hidden,
        g,
        x,
        "x",
    )
    check_int4_weight(
        op, ("w2", "w2_scale", "w2_zero_point"), (w2, w2_scale, zero_points[1]), (experts,), hidden, inter, g, x, "x"
    )
    for arg, bias, n in (("w13_bias", biases[0], two_i), ("w2_bias", biases[1], hidden)):
        if bias is not None:
            check_tensor(op, arg, bias, shape=(experts, n), dtypes=(x.dtype,))
    return rows, hidden, experts
