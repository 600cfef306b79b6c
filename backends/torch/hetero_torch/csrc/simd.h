// Vector helpers of hetero-torch's native CPU kernels: GCC vector types, so one source serves
// AVX-512, AVX2 and NEON (whatever -march=native gives).
#pragma once

#include <cstdint>
#include <type_traits>

namespace hetero_simd {

#if defined(__AVX512F__)
constexpr int64_t VW = 16;  // floats per vector register
#elif defined(__AVX__)
constexpr int64_t VW = 8;
#else
constexpr int64_t VW = 4;
#endif
typedef float vec __attribute__((vector_size(VW * sizeof(float))));
typedef int32_t ivec __attribute__((vector_size(VW * sizeof(int32_t))));

inline vec load(const float* p) {
  vec v;
  __builtin_memcpy(&v, p, sizeof(vec));
  return v;
}
inline void store(float* p, vec v) { __builtin_memcpy(p, &v, sizeof(vec)); }
inline vec splat(float x) { return vec{} + x; }

// bfloat16 as its raw bits: widening is exact (the bits move up 16); narrowing rounds to nearest
// even, as torch's bfloat16 conversion does (a NaN stays a quiet NaN).
typedef uint16_t bf16;
typedef uint16_t hvec __attribute__((vector_size(VW * sizeof(uint16_t))));
typedef uint32_t uvec __attribute__((vector_size(VW * sizeof(uint32_t))));
inline vec load(const bf16* p) {
  hvec h;
  __builtin_memcpy(&h, p, sizeof(hvec));
  return (vec)(__builtin_convertvector(h, uvec) << 16);
}
inline float widen(float x) { return x; }
inline float widen(bf16 x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}
// 16-bit lanes rounded to nearest even from each float's bits, a NaN kept quiet
inline void store(bf16* p, vec v) {
  uvec u;
  __builtin_memcpy(&u, &v, sizeof u);
  const uvec rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uvec bits = (u & 0x7fffffffu) > 0x7f800000u ? uvec{} + 0x7fc0u : rounded;
  const hvec h = __builtin_convertvector(bits, hvec);
  __builtin_memcpy(p, &h, sizeof h);
}
template <typename T>
inline T narrow(float x);
template <>
inline float narrow<float>(float x) { return x; }
template <>
inline bf16 narrow<bf16>(float x) {
  uint32_t u;
  __builtin_memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<bf16>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// e^x per lane (Cody-Waite reduction by ln 2, degree-6 polynomial; about 1 ulp); below -87.3,
// -inf included, it is 0.
inline vec vexp(vec x) {
  const vec lo = splat(-87.3365f), hi = splat(88.7228f);
  vec c = x < lo ? lo : x;
  c = c > hi ? hi : c;
  vec t = c * splat(1.44269504f) + splat(0.5f);
  vec n = __builtin_convertvector(__builtin_convertvector(t, ivec), vec);
  n = n > t ? n - splat(1.0f) : n;  // floor
  const vec r = c - n * splat(0.693359375f) + n * splat(2.12194440e-4f);
  vec p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.0f);
  const ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
  const vec y = p * (vec)bits;
  return x < lo ? splat(0.0f) : y;
}

template <int64_t W>
inline vec rotate(vec v) {  // lane i takes lane (i + W) mod VW
  ivec m;
  for (int64_t i = 0; i < VW; ++i) m[i] = (i + W) % VW;
  return __builtin_shuffle(v, m);
}

inline float hsum(vec v) {
  if constexpr (VW >= 16) v += rotate<8>(v);
  if constexpr (VW >= 8) v += rotate<4>(v);
  v += rotate<2>(v);
  v += rotate<1>(v);
  return v[0];
}

// f(std::integral_constant<int64_t, m>) with m = n clamped into [1, N]: a run-time count as a
// compile-time constant, so that a kernel's per-row accumulators stay in registers
template <int64_t N, typename F>
inline void with_constant(int64_t n, const F& f) {
  if constexpr (N > 1) {
    if (n >= N) return f(std::integral_constant<int64_t, N>{});
    return with_constant<N - 1>(n, f);
  } else {
    return f(std::integral_constant<int64_t, 1>{});
  }
}

}  // namespace hetero_simd
