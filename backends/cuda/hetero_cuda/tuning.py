"""Launch parameters of the Triton kernels on NVIDIA architectures, as data.

Keys are what ``CudaBackend.arch`` reports (``sm{major}{minor}``). An architecture
without an entry (sm86, sm89, sm120, ...) runs the portable defaults, which
compile everywhere; an entry overrides only the keys it names.

- sm80 (A100): 164 KB shared memory per SM, mma.sync tensor cores: 128x128 tiles
  with BLOCK_K 32 and 4 pipeline stages (64 KB of operand buffers in bf16).
- sm90 (H100/H200): 227 KB shared memory, wgmma wants 8 warps (two warpgroups)
  and wide N tiles: 128x256x64 with 3 stages (147 KB) for dense GEMM.
Scaled GEMM keeps BLOCK_K = 128, the block edge of DeepSeek-V3's scales, so one
K tile never straddles two scale blocks.
"""

from __future__ import annotations

from hetero.kernels.tuning import TuningTable

__all__ = ["CUDA_TUNING", "SM80", "SM90"]

SM80 = {
    "gemm": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    "grouped_gemm": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 4, "num_stages": 4},
    "scaled_gemm": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
    "fused_moe": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 4},
    "paged_attention": {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    "varlen_attention": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    "mla_attention": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
    "elementwise": {"BLOCK": 1024, "num_warps": 4},
    "rows": {"num_warps": 8},
}

SM90 = {
    "gemm": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    "grouped_gemm": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 4},
    "scaled_gemm": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    "fused_moe": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4},
    "paged_attention": {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    "varlen_attention": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
    "mla_attention": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2},
    "elementwise": {"BLOCK": 2048, "num_warps": 8},
    "rows": {"num_warps": 8},
}

CUDA_TUNING = TuningTable(vendor="nvidia", archs={"sm80": SM80, "sm90": SM90})
