"""The Triton GEMM kernels (gemm, scaled_gemm, grouped_gemm) against the CPU reference, through
Triton's interpreter. Small problems with small tiles, so that every launch has several tiles
in each direction (swizzle, masks, group boundaries inside and across tiles)."""

from __future__ import annotations

import pytest
import torch

import hetero
from hetero.kernels import Tuning, TuningTable

cpu_ref = pytest.importorskip("hetero_cpu_ref.gemm")

SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4}
TOL = {torch.float32: (2e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def small_tiles(**extra) -> Tuning:
    """Interpreted, with 16x16x16 tiles (the arch is not "interpreter", so no interpreter override)."""
    entry = {**SMALL, **extra}
    table = TuningTable(vendor="test", archs={"tiny": {k: entry for k in ("gemm", "grouped_gemm", "scaled_gemm")}})
    return Tuning(table, "tiny", interpreted=True)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    atol, rtol = TOL.get(want.dtype, (1e-5, 1e-5))
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(
        got.float(), want.float(), atol=atol * max(1.0, float(want.float().abs().max())), rtol=rtol
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemm_swizzle_bias(dtype):
    from hetero.kernels import gemm as G

    g = torch.Generator().manual_seed(0)
    a = torch.randn(70, 40, generator=g).to(dtype)  # 5 row tiles x 4 column tiles, GROUP_M=2: partial last band
    b = torch.randn(50, 40, generator=g).to(dtype)
    bias = torch.randn(50, generator=g).to(dtype)
    got = G.gemm(a, b, bias=bias, tuning=small_tiles(GROUP_M=2))
    close(got, cpu_ref.gemm(a, b, bias=bias))


def test_gemm_strided_a_out_dtype_and_empty(triton_backend):
    g = torch.Generator().manual_seed(1)
    wide = torch.randn(9, 2 * 200, generator=g, dtype=torch.float16)
    b = torch.randn(33, 200, generator=g, dtype=torch.float16)
    for a in (wide[:, ::2], wide[:, 100:300], torch.randn(200, 9, generator=g, dtype=torch.float16).T):
        assert not a.is_contiguous()
        close(triton_backend.gemm(a, b, out_dtype=torch.float32), cpu_ref.gemm(a, b, out_dtype=torch.float32))
    empty = triton_backend.gemm(wide[:0, :200], b, bias=torch.zeros(33, dtype=torch.float16))
    assert empty.shape == (0, 33) and empty.dtype == torch.float16


def test_gemm_rejects_bad_operands(triton_backend):
    a = torch.randn(4, 8)
    with pytest.raises(hetero.OpError, match="'b'"):
        triton_backend.gemm(a, torch.randn(5, 7))
    with pytest.raises(hetero.OpError, match="'b'"):
        triton_backend.gemm(a, torch.randn(5, 8, dtype=torch.float16))
    with pytest.raises(hetero.OpError, match="'bias'"):
        triton_backend.gemm(a, torch.randn(5, 8), bias=torch.randn(4))
    with pytest.raises(hetero.OpError, match="'group_ends'"):
        triton_backend.grouped_gemm(a, torch.randn(3, 5, 8), torch.tensor([1, 2], dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_gemm_empty_groups_and_tail(dtype):
    from hetero.kernels import gemm as G

    g = torch.Generator().manual_seed(2)
    # groups: 0 empty, 1 = 37 rows (3 tiles, last partial), 2-3 empty, 4 = 1 row, 5 = 20 rows, 6 empty;
    # 7 rows past the end
    ends = torch.tensor([0, 37, 37, 37, 38, 58, 58], dtype=torch.int32)
    a = torch.randn(65, 24, generator=g).to(dtype)
    b = torch.randn(7, 40, 24, generator=g).to(dtype)
    got = G.grouped_gemm(a, b, ends, tuning=small_tiles())
    close(got, cpu_ref.grouped_gemm(a, b, ends))
    assert bool((got[58:] == 0).all())
    none = G.grouped_gemm(a, b, torch.zeros(7, dtype=torch.int32), out_dtype=torch.float32, tuning=small_tiles())
    assert none.dtype == torch.float32 and bool((none == 0).all())


def _quantize_blocks(x: torch.Tensor, qdtype: torch.dtype, weight: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """128-block quantization: activations 1x128, weights 128x128 (partial blocks at the ends)."""
    rows, k = x.shape
    kb, rb = -(-k // 128), -(-rows // 128)
    qmax = float(torch.finfo(qdtype).max)
    pad = torch.nn.functional.pad(x.abs(), (0, kb * 128 - k, 0, (rb * 128 - rows) if weight else 0))
    amax = pad.reshape(rb, 128, kb, 128).amax(dim=(1, 3)) if weight else pad.reshape(rows, kb, 128).amax(dim=2)
    scale = amax.clamp_min(1e-12) / qmax
    full = scale.repeat_interleave(128, dim=1)[:, :k]
    if weight:
        full = full.repeat_interleave(128, dim=0)[:rows]
    return (x / full).clamp(-qmax, qmax).to(qdtype), scale.float().contiguous()


@pytest.mark.parametrize("qdtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_scaled_gemm_fp8_block_scales_partial_blocks(qdtype, triton_backend):
    g = torch.Generator().manual_seed(3)
    a, sa = _quantize_blocks(torch.randn(5, 300, generator=g), qdtype, weight=False)  # K = 300: 3 blocks, last partial
    b, sb = _quantize_blocks(torch.randn(200, 300, generator=g) / 17, qdtype, weight=True)  # N = 200: 2 blocks
    bias = torch.randn(200, generator=g)
    got = triton_backend.scaled_gemm(a, b, sa, sb, bias=bias, out_dtype=torch.float32)
    close(got, cpu_ref.scaled_gemm(a, b, sa, sb, bias=bias, out_dtype=torch.float32))
    got = triton_backend.scaled_gemm(a, b, sa, sb)  # bf16 out
    close(got, cpu_ref.scaled_gemm(a, b, sa, sb))


def test_scaled_gemm_int8_and_mixed_forms():
    from hetero.kernels import gemm as G

    g = torch.Generator().manual_seed(4)
    a = torch.randint(-127, 128, (21, 260), generator=g, dtype=torch.int8)
    b = torch.randint(-127, 128, (40, 260), generator=g, dtype=torch.int8)
    sa_row = torch.rand(21, 1, generator=g) / 100
    sb_tensor = torch.tensor(0.003)
    sb_block = torch.rand(1, 3, generator=g) / 100
    tune = small_tiles(BLOCK_K=64, GROUP_M=2)
    bias = torch.randn(40, generator=g)
    for sb in (sb_tensor, sb_block, torch.rand(40, 1, generator=g) / 100):
        got = G.scaled_gemm(a, b, sa_row, sb, bias=bias, out_dtype=torch.float32, tuning=tune)
        close(got, cpu_ref.scaled_gemm(a, b, sa_row, sb, bias=bias, out_dtype=torch.float32))
    exact = G.scaled_gemm(a, b, torch.ones(1), torch.ones(()), out_dtype=torch.float32, tuning=tune)
    assert torch.equal(exact, (a.long() @ b.long().T).float())  # int32 accumulation is exact
    with pytest.raises(hetero.OpError, match="'a_scale'"):
        G.scaled_gemm(a, b, torch.ones(21, 2), sb_tensor, tuning=tune)
