"""The cheap checks of the quantized ops (spec 1.4) shared by every backend: options, ranks,
shapes, dtypes and scale forms of ``quantize_activation``, ``scaled_grouped_gemm`` and
``fused_moe``'s quantized mode. No tensor value is read (group_ends' values are
``hetero.spec.validate``'s).
"""

from __future__ import annotations

import numbers

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import check_same_device, check_tensor, scale_blocks
from hetero.spec.gemm import QMAX, SCALE_FORMATS
from hetero.spec.moe import ACT_QUANT
from hetero.spec.types import FLOAT_DTYPES

__all__ = [
    "QUANT_DTYPES",
    "SCALED_OUT_DTYPES",
    "check_quantize_inputs",
    "check_a_scale",
    "check_b_scale",
    "check_scaled_grouped",
    "check_fused_moe_quant",
]

#: The quantized dtypes: fp8 (OCP e4m3, AMD MI300's e4m3fnuz) and int8.
QUANT_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.int8)
#: Output dtypes of the scaled GEMMs.
SCALED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_F32 = (torch.float32,)


def _dt(d: object) -> str:
    return str(d).replace("torch.", "")


def check_quantize_inputs(
    op: str, x: object, dtype: object, group_size: object, scale_fmt: object, asymmetric: object
) -> tuple[int, int, int]:
    """x [M, K] floating (K >= 1), dtype in QMAX, group_size a positive int or None, scale_fmt in
    SCALE_FORMATS, asymmetric a bool (True only with int8 and scale_fmt "float"); returns (M, K, G)."""
    check_tensor(op, "x", x, ndim=2, dtypes=FLOAT_DTYPES)
    assert isinstance(x, torch.Tensor)
    rows, k = x.shape
    if not (k >= 1):
        raise OpError(op, "x", "at least one column", f"shape {list(x.shape)}")
    if dtype not in QMAX:
        raise OpError(op, "dtype", "one of " + ", ".join(_dt(d) for d in QMAX), str(_dt(dtype)))
    ok_group = group_size is None or (
        isinstance(group_size, numbers.Integral) and not isinstance(group_size, bool) and int(group_size) >= 1
    )
    if not ok_group:
        raise OpError(op, "group_size", "a positive int or None (one group per row)", repr(group_size))
    if scale_fmt not in SCALE_FORMATS:
        raise OpError(op, "scale_fmt", "one of " + ", ".join(repr(s) for s in SCALE_FORMATS), repr(scale_fmt))
    if not isinstance(asymmetric, bool):
        raise OpError(op, "asymmetric", "a bool", repr(asymmetric))
    if asymmetric:
        if not (dtype == torch.int8):
            raise OpError(op, "asymmetric", f"False with dtype {_dt(dtype)} (asymmetric is int8 only)", str(True))
        if not (scale_fmt == "float"):
            raise OpError(op, "scale_fmt", "'float' with asymmetric (ue8m0 scales are symmetric only)", repr(scale_fmt))
    groups = 1 if group_size is None else -(-k // int(group_size))
    return rows, k, groups


def _scale(
    op: str,
    arg: str,
    scale: object,
    accepted: str,
    device: torch.device,
    dtypes: tuple[torch.dtype, ...],
    owner: str = "a",
) -> torch.Tensor:
    if not isinstance(scale, torch.Tensor):
        raise OpError(op, arg, "a torch.Tensor " + accepted, type(scale).__name__)
    if scale.dtype not in dtypes:
        raise OpError(op, arg, accepted, f"dtype {_dt(scale.dtype)}")
    if not (scale.device == device):
        raise OpError(op, arg, f"device {device} (that of '{owner}')", str(scale.device))
    return scale


def check_a_scale(
    op: str, a_scale: object, m: int, k: int, device: torch.device, dtypes: tuple[torch.dtype, ...] = _F32
) -> str:
    """scaled_grouped_gemm's a_scale: "block" [M, ceil(K/128)], "row" [M, 1] or "tensor" (one element)."""
    kb = scale_blocks(k)
    accepted = (
        f"{'/'.join(_dt(d) for d in dtypes)} of one of the forms: 1x128 groups [M, ceil(K/128)] = [{m}, {kb}]; "
        f"per token [{m}, 1]; per tensor (shape [], [1] or [1, 1])"
    )
    shape = tuple(_scale(op, "a_scale", a_scale, accepted, device, dtypes).shape)
    if shape == (m, 1):
        return "row"
    if len(shape) <= 2 and all(s == 1 for s in shape):
        return "tensor"
    if shape == (m, kb):
        return "block"
    raise OpError(op, "a_scale", accepted, f"shape {list(shape)}")


def check_b_scale(
    op: str,
    arg: str,
    b_scale: object,
    groups: int,
    n: int,
    k: int,
    device: torch.device,
    dtypes: tuple[torch.dtype, ...] = _F32,
    owner: str = "a",
) -> str:
    """A grouped weight scale: "block" [G, ceil(N/128), ceil(K/128)], "row" [G, N, 1] or "group" [G]."""
    nb, kb = scale_blocks(n), scale_blocks(k)
    accepted = (
        f"{'/'.join(_dt(d) for d in dtypes)} of one of the forms: 128x128 blocks [G, ceil(N/128), ceil(K/128)] = "
        f"[{groups}, {nb}, {kb}]; per output channel [{groups}, {n}, 1]; one per group [{groups}]"
    )
    shape = tuple(_scale(op, arg, b_scale, accepted, device, dtypes, owner).shape)
    forms = {(groups, nb, kb): "block", (groups, n, 1): "row", (groups,): "group"}
    if shape not in forms:
        raise OpError(op, arg, accepted, f"shape {list(shape)}")
    return forms[shape]


def check_scaled_grouped(
    op: str,
    a: object,
    b: object,
    a_scale: object,
    b_scale: object,
    group_ends: object,
    a_zero_point: object,
    out_dtype: object,
    scale_dtypes: tuple[torch.dtype, ...] = _F32,
) -> tuple[str, str]:
    """Every cheap check of scaled_grouped_gemm (group_ends' values are the validator's);
    returns the forms (a_form, b_form). ``scale_dtypes``: float32 (the reference also takes float64)."""
    check_tensor(op, "a", a, ndim=2, dtypes=QUANT_DTYPES)
    assert isinstance(a, torch.Tensor)
    check_tensor(op, "b", b, ndim=3, dtypes=(a.dtype,))
    assert isinstance(b, torch.Tensor)
    (m, k), (groups, n, kb) = a.shape, b.shape
    if not (kb == k):
        raise OpError(
            op, "b", f"shape [G, N, K] with K = {k} (a's columns; nn.Linear layout)", f"shape {list(b.shape)}"
        )
    if not (b.device == a.device):
        raise OpError(op, "b", f"device {a.device} (that of 'a')", str(b.device))
    a_form = check_a_scale(op, a_scale, m, k, a.device, scale_dtypes)
    b_form = check_b_scale(op, "b_scale", b_scale, groups, n, k, a.device, scale_dtypes)
    check_tensor(op, "group_ends", group_ends, shape=(groups,), dtypes=(torch.int32, torch.int64))
    check_same_device(op, a=a, group_ends=group_ends)
    if a_zero_point is not None:
        if not (a.dtype == torch.int8):
            raise OpError(op, "a_zero_point", f"None with dtype {_dt(a.dtype)} (zero points are int8 only)", "a tensor")
        assert isinstance(a_scale, torch.Tensor)
        if not (tuple(a_scale.shape) == (m, 1)):
            raise OpError(
                op,
                "a_zero_point",
                f"None unless a_scale is per token [{m}, 1]",
                f"a_scale of shape {list(a_scale.shape)}",
            )
        check_tensor(op, "a_zero_point", a_zero_point, shape=(m, 1), dtypes=(torch.int32,))
        check_same_device(op, a=a, a_zero_point=a_zero_point)
    if out_dtype not in SCALED_OUT_DTYPES:
        raise OpError(op, "out_dtype", "one of " + ", ".join(_dt(d) for d in SCALED_OUT_DTYPES), str(_dt(out_dtype)))
    return a_form, b_form


def check_fused_moe_quant(
    op: str,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: object,
    w2_scale: object,
    act_quant: object,
    act_scale_fmt: object,
    scale_dtypes: tuple[torch.dtype, ...] = _F32,
) -> tuple[str, str] | None:
    """fused_moe's quantized options, after ``check_fused_moe_weights`` (w13 [E, 2I, H], w2 [E, H, I]).

    Quantized weights need both scales, float weights take neither; act_quant in ACT_QUANT or None,
    and only with quantized weights; act_scale_fmt in SCALE_FORMATS. Returns the scale forms
    (w13's, w2's), or None for float weights.
    """
    if act_scale_fmt not in SCALE_FORMATS:
        raise OpError(op, "act_scale_fmt", "one of " + ", ".join(repr(s) for s in SCALE_FORMATS), repr(act_scale_fmt))
    if not (act_quant is None or act_quant in ACT_QUANT):
        raise OpError(op, "act_quant", "None or one of " + ", ".join(repr(a) for a in ACT_QUANT), repr(act_quant))
    if w13.dtype not in QUANT_DTYPES:
        for arg, value in (("w13_scale", w13_scale), ("w2_scale", w2_scale)):
            if value is not None:
                raise OpError(
                    op, arg, f"None with {_dt(w13.dtype)} weights (scales only with quantized weights)", "a tensor"
                )
        if act_quant is not None:
            raise OpError(
                op,
                "act_quant",
                f"None with {_dt(w13.dtype)} weights (activation quantization needs quantized weights)",
                repr(act_quant),
            )
        return None
    for arg, value in (("w13_scale", w13_scale), ("w2_scale", w2_scale)):
        if not (value is not None):
            raise OpError(
                op, arg, f"a scale with {_dt(w13.dtype)} weights (w13_scale and w2_scale: both or neither)", "None"
            )
    experts, two_i, hidden = w13.shape
    f13 = check_b_scale(op, "w13_scale", w13_scale, experts, two_i, hidden, w13.device, scale_dtypes, "w13")
    f2 = check_b_scale(op, "w2_scale", w2_scale, experts, hidden, two_i // 2, w13.device, scale_dtypes, "w13")
    return f13, f2
