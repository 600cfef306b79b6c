"""The vendor paths of the cuda and rocm backends, on CPU tensors.

torch's linear, grouped_mm and _scaled_mm run on the CPU too, so each vendor
wrapper is checked against the reference here, and so is its hand-off to the
Triton op (a spy) for the inputs the vendor library does not take. flash-attn
and aiter are replaced by a function with their varlen contract (LSE [H, T],
+inf for a row that sees no key) over the reference.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("hetero_cuda.plugin", reason="hetero-cuda is not installed (make installs it)")
pytest.importorskip("hetero_rocm.plugin", reason="hetero-rocm is not installed (make installs it)")
from hetero_cpu_ref import attention as ref_attention  # noqa: E402
from hetero_cpu_ref import gemm as ref_gemm  # noqa: E402
from hetero_cuda import vendor as cuda_vendor  # noqa: E402
from hetero_rocm import vendor as rocm_vendor  # noqa: E402


class Spy:
    """Stands in for the Triton op a vendor path hands inputs to."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return "triton"


def _close(got, want, tol):
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("make", [cuda_vendor.cublas_gemm, rocm_vendor.hipblaslt_gemm])
def test_vendor_gemm(make):
    spy = Spy()
    gemm = make(spy)
    a, b, bias = (
        torch.randn(5, 64, dtype=torch.bfloat16),
        torch.randn(24, 64, dtype=torch.bfloat16),
        torch.randn(24, dtype=torch.bfloat16),
    )
    _close(gemm(a, b, bias=bias), ref_gemm.gemm(a, b, bias=bias), 2e-2)
    _close(gemm(a[:0], b), ref_gemm.gemm(a[:0], b), 0)
    assert (
        gemm(a, b, out_dtype=torch.float32) == "triton" and gemm(a, b, bias=bias.float()) == "triton" and spy.calls == 2
    )


def test_vendor_grouped_gemm_zeroes_the_tail():
    spy = Spy()
    grouped = cuda_vendor.torch_grouped_gemm(spy)
    a, b = torch.randn(12, 32, dtype=torch.bfloat16), torch.randn(4, 16, 32, dtype=torch.bfloat16)
    ends = torch.tensor([3, 3, 7, 9], dtype=torch.int32)  # an empty group, rows 9..11 past the last group
    got = grouped(a, b, ends)
    _close(got, ref_gemm.grouped_gemm(a, b, ends), 2e-2)
    assert bool((got[9:] == 0).all())
    _close(grouped(a, b, ends, out_dtype=torch.bfloat16), ref_gemm.grouped_gemm(a, b, ends), 2e-2)
    assert grouped(a, b, ends, out_dtype=torch.float32) == "triton" and grouped(a.float(), b.float(), ends) == "triton"
    assert grouped(a[:, :30], b[:, :, :30], ends) == "triton" and spy.calls == 3


def _fp8(shape, dtype=torch.float8_e4m3fn):
    return (torch.randn(shape) * 2).to(dtype)


def test_vendor_scaled_gemm_per_tensor():
    spy = Spy()
    scaled = cuda_vendor.torch_scaled_gemm(spy, rowwise=True)
    a, b = _fp8((8, 64)), _fp8((32, 64))
    sa, sb, bias = torch.tensor(0.5), torch.tensor([0.25]), torch.randn(32)
    for kw in ({}, {"bias": bias}, {"bias": bias, "out_dtype": torch.float32}):
        _close(scaled(a, b, sa, sb, **kw), ref_gemm.scaled_gemm(a, b, sa, sb, **kw), 2e-2)
    rows, cols = torch.rand(8, 1) + 0.5, torch.rand(32, 1) + 0.5
    for sa_, sb_ in ((rows, cols), (rows, sb), (sa, cols)):  # per-token / per-channel, mixed with per-tensor
        _close(scaled(a, b, sa_, sb_), ref_gemm.scaled_gemm(a, b, sa_, sb_), 2e-2)
    assert spy.calls == 0
    assert scaled(a, b, rows, cols, bias=bias) == "triton"  # rowwise with a bias: one rounding needs the kernel
    k_blocks = _fp8((8, 256)), _fp8((32, 256))
    assert scaled(*k_blocks, torch.rand(8, 2), torch.rand(1, 2)) == "triton"  # 128-block scales
    assert scaled(a.view(torch.int8), b.view(torch.int8), sa, sb) == "triton"
    assert cuda_vendor.torch_scaled_gemm(spy, rowwise=False)(a, b, rows, cols) == "triton"  # sm89: tensorwise only


def test_rocm_scaled_gemm_takes_only_the_arch_fp8():
    spy = Spy()
    scaled = rocm_vendor.torch_scaled_gemm(spy, torch.float8_e4m3fnuz)
    assert scaled(_fp8((8, 64)), _fp8((32, 64)), torch.tensor(1.0), torch.tensor(1.0)) == "triton" and spy.calls == 1


def _varlen_inputs(d=64, dv=64):
    torch.manual_seed(0)
    cu_q, cu_k = torch.tensor([0, 10, 13], dtype=torch.int32), torch.tensor([0, 4, 20], dtype=torch.int32)
    q, k, v = (
        torch.randn(13, 4, d, dtype=torch.bfloat16),
        torch.randn(20, 2, d, dtype=torch.bfloat16),
        torch.randn(20, 2, dv, dtype=torch.bfloat16),
    )
    return (q, k, v, cu_q, cu_k, 10, 16), {"scale": d**-0.5, "causal": True}


def _flash_attn_like(empty_lse: float):
    """flash-attn's varlen contract over the reference: LSE [H, T], empty rows ``empty_lse``."""

    def fa(
        q,
        k,
        v,
        cu_q,
        cu_k,
        max_q,
        max_k,
        *,
        softmax_scale,
        causal,
        window_size,
        return_attn_probs=False,
        return_lse=False,
        softcap=0.0,
    ):
        out, lse = ref_attention.varlen_attention(
            q,
            k,
            v,
            cu_q,
            cu_k,
            max_q,
            max_k,
            scale=softmax_scale,
            causal=causal,
            window=window_size,
            softcap=softcap,
            return_lse=True,
        )
        lse = lse.masked_fill(lse == float("-inf"), empty_lse).t().contiguous()
        return (out, lse, None) if (return_attn_probs or return_lse) else out

    return fa


@pytest.mark.parametrize("wrap", [cuda_vendor.flash_attn_varlen, rocm_vendor.aiter_varlen])
def test_vendor_varlen_attention_converts_the_lse(wrap):
    spy = Spy()
    varlen = wrap(spy, _flash_attn_like(float("inf")))
    args, kw = _varlen_inputs()
    out, lse = varlen(*args, **kw, return_lse=True)
    want_out, want_lse = ref_attention.varlen_attention(*args, **kw, return_lse=True)
    assert bool(torch.isneginf(want_lse).any()), "the case needs rows that see no key"
    _close(out, want_out, 0)
    assert torch.equal(lse, want_lse)
    _close(varlen(*args, **kw), want_out, 0)
    mla_args, _ = _varlen_inputs(d=192, dv=128)
    assert varlen(*mla_args, **kw) == "triton" and spy.calls == 1  # D != Dv: MLA prefill stays on the Triton kernel


def _fake_scaled_grouped_mm(mat_a, mat_b, scale_a, scale_b, offs=None, out_dtype=None):
    """torch._scaled_grouped_mm's contract (it has no CPU kernel): b column-major [G, K, N], row-wise scales
    [M] and [G, N], int32 ends, bfloat16 out, rows past the last end unwritten (NaN here)."""
    assert (
        mat_b.stride(-2) == 1 and scale_a.shape == mat_a.shape[:1] and scale_b.shape == (mat_b.shape[0], mat_b.shape[2])
    )
    assert offs.dtype == torch.int32 and out_dtype == torch.bfloat16
    out = torch.full((mat_a.shape[0], mat_b.shape[2]), float("nan"))
    start = 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = (mat_a[start:end].float() * scale_a[start:end, None]) @ (mat_b[g].float() * scale_b[g])
        start = end
    return out.to(out_dtype)


def test_vendor_scaled_grouped_gemm_rowwise(monkeypatch):
    from hetero_cpu_ref.quant import scaled_grouped_gemm as ref

    monkeypatch.setattr(torch, "_scaled_grouped_mm", _fake_scaled_grouped_mm, raising=False)
    spy = Spy()
    grouped = cuda_vendor.torch_scaled_grouped_gemm(spy)
    a, b = _fp8((10, 64)), torch.stack([_fp8((32, 64)) for _ in range(3)])
    sa, sb = torch.rand(10, 1) + 0.5, torch.rand(3, 32, 1) + 0.5
    ends = torch.tensor([2, 2, 7], dtype=torch.int32)
    for a_s, b_s in ((sa, sb), (torch.tensor([0.7]), torch.tensor([0.5, 1.0, 2.0]))):
        _close(grouped(a, b, a_s, b_s, ends), ref(a, b, a_s, b_s, ends), 2e-2)
    assert spy.calls == 0
    assert grouped(a, b, sa, torch.rand(3, 1, 1), ends) == "triton"  # 128x128 block scales
    assert grouped(a, b, sa, sb, ends, out_dtype=torch.float32) == "triton"
    assert grouped(a, b, sa, sb, ends.long()) == "triton"
    a8, b8 = torch.randint(-5, 5, (10, 64), dtype=torch.int8), torch.randint(-5, 5, (3, 32, 64), dtype=torch.int8)
    assert grouped(a8, b8, sa, sb, ends, a_zero_point=torch.zeros(10, 1, dtype=torch.int32)) == "triton"
    assert spy.calls == 4
