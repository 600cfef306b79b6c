"""CPU float32 and bfloat16 GEMMs through oneDNN's packed weight layout.

oneDNN's GEMM on its blocked layout beats MKL's on the plain one for large weights (on the
2-core build machine 1.6-3.7x at 1-64 rows and 1.1-1.2x at 560-2048 rows for 512x3072 and
1536x512, but 0.6x for a 256x512 weight at one row: ``benchmarks/packed_gemm.py``, hence
MIN_WEIGHT; vLLM's CPU linears take oneDNN's packed path at every row count too). In bfloat16
(where oneDNN has a bf16 path: AVX512-BF16 or AMX) it beats ``F.linear`` 1.4-2x at 1-64 rows on
Qwen3's decode shapes, the 151936x1024 LM head included, and ties it at 512 rows, with identical
results on most shapes (both accumulate in float32 and round once),
and per expert it beats CPU ``grouped_mm``, which runs one MKL GEMM per group (1.2-1.4x at a
decode step's 16-128 rows over 8 experts). A weight seen a second time at the same version
(``Tensor._version``) and address is packed once; the packed copy lives on the tensor itself, so
it goes with the weight, and an in-place update of the weight repacks it. The copy doubles that
weight's memory: ``HETERO_TORCH_PACK_WEIGHTS=0`` turns packing off.
"""

from __future__ import annotations

import os

import torch

from hetero_torch._opaque import opaque

__all__ = ["packed_linear", "compiled_linear", "packed_grouped", "cached_pack", "PACK_WEIGHTS", "DTYPES"]

#: whether reused CPU float32 weights are packed (read once, at import)
PACK_WEIGHTS = os.environ.get("HETERO_TORCH_PACK_WEIGHTS", "1") != "0" and torch.backends.mkldnn.is_available()
_ATTR = "_hetero_torch_packed"
#: the dtypes packed: float32, and bfloat16 where oneDNN computes it natively
DTYPES = (
    (torch.float32, torch.bfloat16)
    if PACK_WEIGHTS and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    else (torch.float32,)
)
#: packed_linear's domain: weights of at least this many elements
MIN_WEIGHT = 1 << 18
#: oneDNN builds (JIT-compiles) a primitive for every new row count, about 4 ms each on the build
#: machine: a prefill's expert groups, of every size from 1 up, built hundreds under a first request
#: (16 prompts on four Qwen3-30B-A3B layers: 2.3 s, 1.1 s rounded as here). Row counts above
#: ROW_STEP are rounded up to its multiple (AMX's tile height) so a process meets a bounded set of them.
ROW_STEP = 16


def _fits(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, compiling: bool = False) -> bool:
    return (
        PACK_WEIGHTS
        and a.device.type == "cpu"
        and a.dtype in DTYPES
        and b.dtype == a.dtype
        and b.dim() in (2, 3)
        and b.is_contiguous()
        and b.numel() > 0
        and not b.requires_grad
        and (bias is None or bias.dtype == a.dtype)
        and (compiling or not torch.compiler.is_compiling())
    )


def _linear_fits(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, compiling: bool = False) -> bool:
    # measured (benchmarks/packed_gemm.py): a small weight at a row or two is faster through MKL
    return _fits(a, b, bias, compiling) and b.numel() >= MIN_WEIGHT


def cached_pack(b: torch.Tensor, attr: str, pack, first_sight: bool = False):
    """``pack(b)``, kept on b under ``attr`` while b's version, address and shape hold; None the first
    time b is seen at that version unless ``first_sight`` (a one-off operand is not worth packing)."""
    if b.is_inference():  # made under inference_mode (a per-call operand such as a dequantized weight): no version
        return pack(b) if first_sight else None
    key = (b._version, b.data_ptr(), tuple(b.shape))
    seen = getattr(b, attr, None)
    if seen is None or seen[0] != key:
        if not first_sight:
            setattr(b, attr, (key, None))
            return None
        seen = (key, None)
    if seen[1] is None:
        seen = (key, pack(b))
        setattr(b, attr, seen)
    return seen[1]


def _onednn(b: torch.Tensor):
    """oneDNN's blocked copy of b (for b [G, N, K], one per group)."""
    pack = lambda w: torch.ops.mkldnn._reorder_linear_weight(w, 64)  # noqa: E731
    return pack(b) if b.dim() == 2 else [pack(w) for w in b]


def _packed(b: torch.Tensor, first_sight: bool = False):
    return cached_pack(b, _ATTR, _onednn, first_sight)


def packed_linear(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """a @ b.T (+ bias) from b's packed copy, or None where packing does not apply (then F.linear runs)."""
    if not _linear_fits(a, b, bias):
        return None
    packed = _packed(b)
    if packed is None:
        return None
    if a.dim() != 2:
        return _onednn_linear(a, packed, bias)
    return _rows(a, 0, a.shape[0], packed, bias)


def _onednn_linear(a: torch.Tensor, packed, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(a, packed, bias, "none", [], "")


def _rows(a: torch.Tensor, start: int, end: int, packed, bias: torch.Tensor | None) -> torch.Tensor:
    """Rows [start, end) of a (2-D) through the packed weight, the row count rounded up (ROW_STEP): the
    rows that follow stand in for the padding where a has them, else a zero-padded copy."""
    m = end - start
    rounded = m if m <= ROW_STEP else -(-m // ROW_STEP) * ROW_STEP
    if rounded == m:
        return _onednn_linear(a[start:end], packed, bias)
    if start + rounded <= a.shape[0]:
        return _onednn_linear(a[start : start + rounded], packed, bias)[:m]
    padded = a.new_zeros(rounded, a.shape[1])
    padded[:m] = a[start:end]
    return _onednn_linear(padded, packed, bias)[:m]


def _linear(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = packed_linear(a, b, bias)
    return torch.nn.functional.linear(a, b, bias) if out is None else out


_linear_op = opaque("linear", _linear, lambda a, b, bias: a.new_empty(*a.shape[:-1], b.shape[0]))


def compiled_linear(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` in a graph being compiled: an opaque call of packed_linear's where packing applies,
    since Inductor's own GEMM for a frozen weight is MKL's on the plain layout (2x slower at a decode
    step's rows; its prepacked oneDNN constants would keep graphs out of the FX cache)."""
    if _linear_fits(a, b, bias, compiling=True):
        return _linear_op(a, b, bias)
    return torch.nn.functional.linear(a, b, bias)


def packed_grouped(a: torch.Tensor, b: torch.Tensor, ends: list[int], first_sight: bool = False) -> torch.Tensor | None:
    """Rows [ends[g-1], ends[g]) of ``a @ b[g].T`` (b [G, N, K]) from each group's packed copy, one
    product per group that owns rows; rows past ends[-1] are left unwritten. None where packing
    does not apply (then torch's grouped_mm runs). ``first_sight``: pack b the first time it is seen."""
    if b.dim() != 3 or not _fits(a, b, None):
        return None
    packed = _packed(b, first_sight)
    if packed is None:
        return None
    out = a.new_empty(a.shape[0], b.shape[1])
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            out[start:end] = _rows(a, start, end, packed[g], None)
        start = end
    return out
