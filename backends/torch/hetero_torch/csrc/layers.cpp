// hetero-torch's CPU rms_norm (plain, zero-centred, with residual), silu_and_mul and
// rotary_embedding, float32 or bfloat16 rows (hetero.spec.layers): one pass over each row in
// float32, the result rounded once.
// torch's operators make a float32 copy of the rows and a temporary per step of the formula; at
// a prefill's thousands of rows those temporaries are fresh pages every call.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "simd.h"

namespace {

using namespace hetero_simd;

template <typename... Got>
void check(bool ok, const char* op, const char* what, const Got&... got) {
  TORCH_CHECK(ok, "hetero_torch ", op, ": ", what, ", got ", got...);
}

bool floating(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kBFloat16;
}

// h = x (+ residual, rounded to T), out = h / rms(h) * (w + offset), per row of H
template <typename T, typename W>
void norm_rows(const T* x, const T* res, const W* w, T* out, T* h_out, int64_t rows, int64_t H, float eps,
               float offset) {
  at::parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    std::vector<float> h(H);
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * H;
      vec sq{};
      int64_t d = 0;
      for (; d + VW <= H; d += VW) {
        vec v = load(xr + d);
        if (res) {
          store(h_out + r * H + d, v + load(res + r * H + d));
          v = load(h_out + r * H + d);  // the rounded sum is what is normalized
        }
        store(&h[d], v);
        sq += v * v;
      }
      float tail = 0.0f;
      for (; d < H; ++d) {
        float v = widen(xr[d]);
        if (res) {
          h_out[r * H + d] = narrow<T>(v + widen(res[r * H + d]));
          v = widen(h_out[r * H + d]);
        }
        h[d] = v;
        tail += v * v;
      }
      const float inv = 1.0f / std::sqrt((hsum(sq) + tail) / static_cast<float>(H) + eps);
      T* o = out + r * H;
      for (d = 0; d + VW <= H; d += VW) store(o + d, load(&h[d]) * splat(inv) * (load(w + d) + splat(offset)));
      for (; d < H; ++d) o[d] = narrow<T>(h[d] * inv * (widen(w[d]) + offset));
    }
  });
}

template <typename T>
void silu_mul_rows(const T* x, T* out, int64_t rows, int64_t I) {
  at::parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T *g = x + r * 2 * I, *u = g + I;
      T* o = out + r * I;
      int64_t d = 0;
      for (; d + VW <= I; d += VW) {
        const vec gv = load(g + d);
        store(o + d, gv / (splat(1.0f) + vexp(-gv)) * load(u + d));
      }
      for (; d < I; ++d) {
        const float gv = widen(g[d]);
        o[d] = narrow<T>(gv / (1.0f + std::exp(-gv)) * widen(u[d]));
      }
    }
  });
}

// the first rot dims of each of H heads of one row rotated by (cos, sin) [rot / 2 each], the rest copied
template <typename T>
void rotate_row(const T* x, T* o, int64_t H, int64_t D, int64_t rot, const float* cos, const float* sin,
                bool neox) {
  const int64_t half = rot / 2;
  for (int64_t h = 0; h < H; ++h, x += D, o += D) {
    int64_t i = 0;
    if (neox)
      for (; i + VW <= half; i += VW) {
        const vec x1 = load(x + i), x2 = load(x + half + i), c = load(cos + i), s = load(sin + i);
        store(o + i, x1 * c - x2 * s);
        store(o + half + i, x2 * c + x1 * s);
      }
    for (; i < half; ++i) {
      const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
      const float x1 = widen(x[a]), x2 = widen(x[b]);
      o[a] = narrow<T>(x1 * cos[i] - x2 * sin[i]);
      o[b] = narrow<T>(x2 * cos[i] + x1 * sin[i]);
    }
    std::copy(x + rot, x + D, o + rot);
  }
}

template <typename T>
void rotate(const torch::Tensor& positions, const torch::Tensor& x, torch::Tensor& out, const torch::Tensor& cache,
            bool neox) {
  const int64_t T_ = x.size(0), H = x.size(1), D = x.size(2), P = cache.size(0), rot = cache.size(1);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const float* table = cache.data_ptr<float>();
  const T* src = static_cast<const T*>(x.data_ptr());
  T* dst = static_cast<T*>(out.data_ptr());
  at::parallel_for(0, T_, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const float* row = table + std::clamp<int64_t>(pos[t], 0, P - 1) * rot;  // unchecked positions stay inside
      rotate_row(src + t * x.stride(0), dst + t * H * D, H, D, rot, row, row + rot / 2, neox);
    }
  });
}

}  // namespace

// x [R, H] and residual (or none) of one dtype, float32 or bfloat16; weight [H] of x's dtype or
// float32. Returns (out [R, H], h [R, H]: x + residual rounded, or an empty tensor without residual).
std::tuple<torch::Tensor, torch::Tensor> rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                                                  const c10::optional<torch::Tensor>& residual, double offset) {
  const char* op = "rms_norm";
  check(x.dim() == 2 && floating(x) && x.is_contiguous() && x.device().is_cpu(), op,
        "x must be contiguous float32 or bfloat16 CPU [R, H]", x.sizes(), " ", x.scalar_type());
  const int64_t R = x.size(0), H = x.size(1);
  check(weight.dim() == 1 && weight.size(0) == H && weight.is_contiguous() &&
            (weight.scalar_type() == x.scalar_type() || weight.scalar_type() == torch::kFloat),
        op, "weight must be contiguous [H] of x's dtype or float32", weight.sizes(), " ", weight.scalar_type());
  const bool has_res = residual.has_value() && residual->defined();
  if (has_res)
    check(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type() && residual->is_contiguous(),
          op, "residual must be contiguous, of x's shape and dtype", residual->sizes(), " ", residual->scalar_type());
  auto out = torch::empty_like(x);
  auto h = has_res ? torch::empty_like(x) : torch::empty({0}, x.options());
  const float e = static_cast<float>(eps), off = static_cast<float>(offset);
  const auto go = [&](auto t, auto w) {
    using T = decltype(t);
    using W = decltype(w);
    norm_rows<T, W>(static_cast<const T*>(x.data_ptr()), has_res ? static_cast<const T*>(residual->data_ptr()) : nullptr,
                    static_cast<const W*>(weight.data_ptr()), static_cast<T*>(out.data_ptr()),
                    has_res ? static_cast<T*>(h.data_ptr()) : nullptr, R, H, e, off);
  };
  const bool f32w = weight.scalar_type() == torch::kFloat;
  if (x.scalar_type() == torch::kFloat)
    go(float{}, float{});
  else if (f32w)
    go(bf16{}, float{});
  else
    go(bf16{}, bf16{});
  return {out, h};
}

// x [R, 2I] float32 or bfloat16 -> silu(x[:, :I]) * x[:, I:] [R, I]
torch::Tensor silu_and_mul(const torch::Tensor& x) {
  const char* op = "silu_and_mul";
  check(x.dim() == 2 && floating(x) && x.is_contiguous() && x.device().is_cpu() && x.size(1) % 2 == 0, op,
        "x must be contiguous float32 or bfloat16 CPU [R, 2I]", x.sizes(), " ", x.scalar_type());
  const int64_t R = x.size(0), I = x.size(1) / 2;
  auto out = torch::empty({R, I}, x.options());
  if (x.scalar_type() == torch::kFloat)
    silu_mul_rows<float>(x.data_ptr<float>(), out.data_ptr<float>(), R, I);
  else
    silu_mul_rows<bf16>(static_cast<const bf16*>(x.data_ptr()), static_cast<bf16*>(out.data_ptr()), R, I);
  return out;
}

// positions int64 [T]; q [T, Hq, D] and k [T, Hkv, D] of one dtype, float32 or bfloat16, each row's
// heads contiguous; cache float32 [P, rot] (cos, then sin), rot even and <= D. Returns new (q, k).
std::tuple<torch::Tensor, torch::Tensor> rotary_embedding(const torch::Tensor& positions, const torch::Tensor& q,
                                                          const torch::Tensor& k, const torch::Tensor& cache,
                                                          bool is_neox) {
  const char* op = "rotary_embedding";
  const int64_t T = positions.numel();
  check(positions.dim() == 1 && positions.scalar_type() == torch::kLong && positions.is_contiguous(), op,
        "positions must be contiguous int64 [T]", positions.sizes(), " ", positions.scalar_type());
  check(cache.dim() == 2 && cache.scalar_type() == torch::kFloat && cache.is_contiguous() && cache.size(0) >= 1 &&
            cache.size(1) % 2 == 0,
        op, "cos_sin_cache must be contiguous float32 [P >= 1, even rot]", cache.sizes(), " ", cache.scalar_type());
  for (const auto* x : {&q, &k})
    check(x->dim() == 3 && floating(*x) && x->scalar_type() == q.scalar_type() && x->device().is_cpu() &&
              x->size(0) == T && x->size(2) >= cache.size(1) && x->stride(2) == 1 && x->stride(1) == x->size(2),
          op, "q and k must be float32 or bfloat16 CPU [T, H, D >= rot] of one dtype, each row's heads contiguous",
          x->sizes(), " ", x->strides(), " ", x->scalar_type(), " for T = ", T, ", rot = ", cache.size(1));
  auto q_out = torch::empty(q.sizes(), q.options()), k_out = torch::empty(k.sizes(), k.options());
  if (q.scalar_type() == torch::kFloat)
    rotate<float>(positions, q, q_out, cache, is_neox), rotate<float>(positions, k, k_out, cache, is_neox);
  else
    rotate<bf16>(positions, q, q_out, cache, is_neox), rotate<bf16>(positions, k, k_out, cache, is_neox);
  return {q_out, k_out};
}

TORCH_LIBRARY_FRAGMENT(hetero_torch_native, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, Tensor? residual, float offset) -> (Tensor, Tensor)");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("rotary_embedding(Tensor positions, Tensor q, Tensor k, Tensor cache, bool is_neox) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(hetero_torch_native, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("rotary_embedding", &rotary_embedding);
}
