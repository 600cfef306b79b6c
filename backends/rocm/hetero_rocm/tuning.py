"""Launch parameters of the Triton kernels on AMD architectures, as data.

Keys are the gfx names ``RocmBackend.arch`` reports. AMD GPUs run 64-lane
wavefronts, so ``num_warps=4`` is 256 threads; matrix cores (MFMA) are chosen
with meta-parameters that AMD's Triton takes at launch:

- ``matrix_instr_nonkdim``: 16 selects the 16x16xK MFMA (best for most LLM
  shapes and for small M), 32 the 32x32xK one;
- ``waves_per_eu``: an occupancy hint (waves per SIMD) that caps register use;
  2 suits GEMM/attention tiles of these sizes, 0 leaves it to the compiler;
- ``num_stages=2`` is the stream-pipeliner's global-prefetch depth for GEMMs;
  tiles keep one stage of operands within 32 KB of LDS on gfx90a/gfx942 (64 KB
  per CU, so double buffering fits too) and 64 KB on gfx950 (160 KB); attention
  runs 1 stage.

Kernels on other backends ignore these keys (NVIDIA's Triton drops unknown
launch options; the interpreter drops them too).
"""

from __future__ import annotations

from hetero.kernels.tuning import TuningTable

__all__ = ["ROCM_TUNING", "GFX90A", "GFX942", "GFX950"]

_MFMA16 = {"matrix_instr_nonkdim": 16, "waves_per_eu": 2}

GFX90A = {  # MI210/MI250X: CDNA2, 64 KB LDS, no fp8
    "gemm": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 2, **_MFMA16},
    "grouped_gemm": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2, **_MFMA16},
    "scaled_gemm": {
        "BLOCK_M": 64,
        "BLOCK_N": 64,
        "BLOCK_K": 128,
        "GROUP_M": 8,
        "num_warps": 4,
        "num_stages": 2,
        **_MFMA16,
    },
    "fused_moe": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, **_MFMA16},
    "paged_attention": {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "waves_per_eu": 2},
    "varlen_attention": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, **_MFMA16},
    "mla_attention": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "waves_per_eu": 1},
    "elementwise": {"BLOCK": 1024, "num_warps": 4},
    "rows": {"num_warps": 8},
}

GFX942 = {  # MI300X/MI325X: CDNA3, 304 CUs, 64 KB LDS, fp8 = float8_e4m3fnuz
    "gemm": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 2, **_MFMA16},
    "grouped_gemm": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2, **_MFMA16},
    "scaled_gemm": {
        "BLOCK_M": 128,
        "BLOCK_N": 128,
        "BLOCK_K": 128,
        "GROUP_M": 8,
        "num_warps": 8,
        "num_stages": 2,
        **_MFMA16,
    },
    "fused_moe": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2, **_MFMA16},
    "paged_attention": {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "waves_per_eu": 2},
    "varlen_attention": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, **_MFMA16},
    "mla_attention": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "waves_per_eu": 1},
    "elementwise": {"BLOCK": 2048, "num_warps": 8},
    "rows": {"num_warps": 8},
}

GFX950 = {  # MI350X/MI355X: CDNA4, 160 KB LDS, OCP fp8 (float8_e4m3fn)
    **GFX942,
    "gemm": {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 2, **_MFMA16},
    "scaled_gemm": {
        "BLOCK_M": 256,
        "BLOCK_N": 128,
        "BLOCK_K": 128,
        "GROUP_M": 8,
        "num_warps": 8,
        "num_stages": 2,
        **_MFMA16,
    },
    "varlen_attention": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 1, **_MFMA16},
}

ROCM_TUNING = TuningTable(vendor="amd", archs={"gfx90a": GFX90A, "gfx942": GFX942, "gfx950": GFX950})
