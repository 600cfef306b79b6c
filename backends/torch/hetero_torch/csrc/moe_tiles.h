// hetero-torch's fused_moe micro-kernels (fused_moe.cpp): one projection's column panel against
// a few rows, widened float32 FMAs (tile) or bf16 pair dot products (tile_pairs), and against many
// rows, oneDNN's brgemm tile GEMM (tile_gemm).
#pragma once
#include <ATen/native/CPUBlas.h>

#include <cstdint>

#include "simd.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace hetero_moe {

using namespace hetero_simd;

constexpr int64_t NR = 2 * VW;  // a panel row is two vectors
constexpr int64_t MR = 6;       // rows per micro-tile: 12 vector accumulators
// panel rows prefetched ahead, every cache line of each: a decode step reads each expert panel once
// from memory, and the hardware prefetchers alone left it at 16 GB/s (the widening kernel on
// Qwen3-30B-A3B's layer at 16 tokens: 44 ms, 29 ms so; benchmarks/moe_cpu.py --shape qwen3-30b-a3b)
constexpr int64_t PF = 64;

template <int64_t R, typename W>
void tile(const float* const* rows, const W* panel, int64_t K, float* const* outs, int64_t cols,
          const float* bias) {
  // at a decode step's one or two rows an expert, two independent chains of k keep the FMA
  // pipeline busy (one chain waits on each add's latency)
  constexpr int64_t U = R <= 3 ? 2 : 1;
  vec acc[U][R][2];
  for (int64_t u = 0; u < U; ++u)
    for (int64_t r = 0; r < R; ++r) acc[u][r][0] = acc[u][r][1] = vec{};
  int64_t k = 0;
  for (; k + U <= K; k += U) {
    for (int64_t u = 0; u < U; ++u)
      for (int64_t line = 0; line < static_cast<int64_t>(NR * sizeof(W)); line += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(panel + (k + u + PF) * NR) + line);
    for (int64_t u = 0; u < U; ++u) {
      const vec b0 = load(panel + (k + u) * NR), b1 = load(panel + (k + u) * NR + VW);
      for (int64_t r = 0; r < R; ++r) {
        const float a = rows[r][k + u];
        acc[u][r][0] += a * b0;
        acc[u][r][1] += a * b1;
      }
    }
  }
  for (; k < K; ++k) {
    const vec b0 = load(panel + k * NR), b1 = load(panel + k * NR + VW);
    for (int64_t r = 0; r < R; ++r) {
      const float a = rows[r][k];
      acc[0][r][0] += a * b0;
      acc[0][r][1] += a * b1;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t u = 1; u < U; ++u) acc[0][r][0] += acc[u][r][0], acc[0][r][1] += acc[u][r][1];
    float out[NR];
    __builtin_memcpy(out, &acc[0][r][0], sizeof(vec));
    __builtin_memcpy(out + VW, &acc[0][r][1], sizeof(vec));
    for (int64_t j = 0; j < cols; ++j) outs[r][j] = out[j] + (bias ? bias[j] : 0.0f);
  }
}

template <typename W>
void tile_rows(int64_t count, const float* const* rows, const W* panel, int64_t K, float* const* outs,
               int64_t cols, const float* bias) {
  with_constant<MR>(count, [&](auto r) { tile<decltype(r)::value>(rows, panel, K, outs, cols, bias); });
}

#if defined(__AVX512BF16__)
constexpr bool PAIRS = true;
// bfloat16 rows over a bfloat16 panel packed in k pairs, [ceil(K / 2)][NR][2] (zero past K): each
// vdpbf16ps multiplies a pair of row values by 16 columns' pairs and adds both products to float32
// lanes, so the weights are neither widened nor shifted (at 4 rows an expert the widening FMAs
// were the loop's bound).
template <int64_t R>
void tile_pairs(const bf16* const* rows, const bf16* panel, int64_t K, float* const* outs, int64_t cols,
                const float* bias) {
  static_assert(NR == 32, "a pair panel row is two 512-bit vectors");
  constexpr int64_t U = R <= 3 ? 2 : 1;
  __m512 acc[U][R][2];
  for (int64_t u = 0; u < U; ++u)
    for (int64_t r = 0; r < R; ++r) acc[u][r][0] = acc[u][r][1] = _mm512_setzero_ps();
  const int64_t K2 = K / 2;  // whole pairs; an odd K's last value pairs with the panel's zero
  const auto step = [&](int64_t u, int64_t kk, const __m512i* a) {
    const bf16* p = panel + kk * 2 * NR;
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(p), b1 = (__m512bh)_mm512_loadu_si512(p + NR);
    for (int64_t r = 0; r < R; ++r) {
      acc[u][r][0] = _mm512_dpbf16_ps(acc[u][r][0], (__m512bh)a[r], b0);
      acc[u][r][1] = _mm512_dpbf16_ps(acc[u][r][1], (__m512bh)a[r], b1);
    }
  };
  int64_t kk = 0;
  for (; kk + U <= K2; kk += U) {
    for (int64_t u = 0; u < U; ++u) {
      const char* ahead = reinterpret_cast<const char*>(panel + (kk + u + PF / 2) * 2 * NR);
      __builtin_prefetch(ahead), __builtin_prefetch(ahead + 64);
    }
    for (int64_t u = 0; u < U; ++u) {
      __m512i a[R];
      for (int64_t r = 0; r < R; ++r) {
        int32_t pair;
        __builtin_memcpy(&pair, rows[r] + 2 * (kk + u), sizeof pair);
        a[r] = _mm512_set1_epi32(pair);
      }
      step(u, kk + u, a);
    }
  }
  for (; kk < (K + 1) / 2; ++kk) {
    __m512i a[R];
    for (int64_t r = 0; r < R; ++r) {
      const uint32_t lo = rows[r][2 * kk], hi = 2 * kk + 1 < K ? rows[r][2 * kk + 1] : 0;
      a[r] = _mm512_set1_epi32(static_cast<int32_t>(lo | hi << 16));
    }
    step(0, kk, a);
  }
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t u = 1; u < U; ++u)
      acc[0][r][0] = _mm512_add_ps(acc[0][r][0], acc[u][r][0]), acc[0][r][1] = _mm512_add_ps(acc[0][r][1], acc[u][r][1]);
    float out[NR];
    _mm512_storeu_ps(out, acc[0][r][0]);
    _mm512_storeu_ps(out + 16, acc[0][r][1]);
    for (int64_t j = 0; j < cols; ++j) outs[r][j] = out[j] + (bias ? bias[j] : 0.0f);
  }
}

inline void tile_rows(int64_t count, const bf16* const* rows, const bf16* panel, int64_t K, float* const* outs,
               int64_t cols, const float* bias) {
  with_constant<MR>(count, [&](auto r) { tile_pairs<decltype(r)::value>(rows, panel, K, outs, cols, bias); });
}
#else
constexpr bool PAIRS = false;
#endif

// Experts that own at least AMX_ROWS pairs in a bfloat16 call are small GEMMs, not a walk of rows:
// there they run through oneDNN's batch-reduce GEMM ukernel (torch's cpublas::brgemm, AMX tiles where
// the CPU has them) over the same pair panels, which are its VNNI layout, on the expert's rows
// gathered contiguous; runs of at most AMX_RUN rows keep the float32 tile in L1.
constexpr int64_t AMX_ROWS = 16, AMX_RUN = 64;

inline bool tiles() {
  static const bool ok = at::native::cpublas::could_pack(at::kBFloat16);
  return ok;
}

inline thread_local bool tiles_held = false;

// c [m, NR] = a [m, K] (row stride K, K even) @ one pair panel [K / 2][NR][2]
inline void tile_gemm(int64_t m, int64_t K, const bf16* a, const bf16* panel, float* c) {
  tiles_held = true;
  at::native::cpublas::brgemm(m, NR, K, K, NR, NR, false, reinterpret_cast<const at::BFloat16*>(a),
                              reinterpret_cast<const at::BFloat16*>(panel), c, true);
}

inline void release() {
  if (tiles_held) at::native::cpublas::brgemm_release(), tiles_held = false;
}
}  // namespace hetero_moe
