// hetero-torch's CPU fused_moe: float32 rows over float32 or bfloat16 experts (bf16 panels are
// widened as they are read), or, where the build has AVX512-BF16, bfloat16 rows over bfloat16
// experts packed in k pairs (tile_pairs); accumulation, activation and the combine are float32:
// out[m] = sum_s weights[m, s] * expert(ids[m, s], x[m]) with
// expert(e, x) = W2[e] @ act(W13[e] @ x + b13[e]) + b2[e], one call from routing to the combined rows.
//
// torch's CPU grouped_mm (and oneDNN called once per expert) pays a library call, its thread
// fork and its own packing per expert, which at a decode step's few rows per expert costs more
// than the arithmetic; the activation and the combine as separate torch ops cost tens of
// microseconds more. Here the (token, slot) pairs are bucketed by expert with a counting sort and
// every (expert, column panel) tile of a projection is one task of one parallel region; a task
// keeps its panel (K x NR floats) in cache while it walks the expert's rows MR at a time, reading
// each row in place. The first projection's task computes a gate panel and the matching up panel
// and writes act(gate, up) straight away.
//
// Layout: a packed projection is [E, NB, K, NR]: packed[e][b][k][j] = W[e][b*NR + j][k], zero past
// the last column; W13 is packed as gate panel 0, up panel 0, gate panel 1, ... so that a task
// reads one run of memory
// (hetero_torch/_moe_native.py packs them). In a bfloat16 call, an expert that owns AMX_ROWS
// pairs or more (a prefill's) runs as small GEMMs instead, oneDNN's brgemm over the same pair
// panels on its rows gathered contiguous, so one kernel and one packed copy serve every batch
// size (the micro-kernels: moe_tiles.h). The kernel checks every shape and id and raises
// (IndexError for an id out of range) instead of reading out of bounds.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "moe_tiles.h"

namespace {

using namespace hetero_simd;
using namespace hetero_moe;

enum Activation : int64_t { SILU = 0, SWIGLU_CLAMP = 1, SWIGLUOAI = 2 };  // _moe_native.ACTIVATIONS' order

template <typename... Got>
void check(bool ok, const char* what, const Got&... got) {
  TORCH_CHECK(ok, "hetero_torch fused_moe: ", what, ", got ", got...);
}

struct Pairs {  // the (token, slot) pairs bucketed by expert
  std::vector<int64_t> start, order;  // expert e owns order[start[e] .. start[e + 1])
  bool many(size_t e) const { return start[e + 1] - start[e] >= AMX_ROWS; }  // tile GEMMs' share
};

template <typename Id>
Pairs bucket(const Id* id, int64_t P, int64_t E) {
  Pairs pairs{std::vector<int64_t>(E + 1, 0), std::vector<int64_t>(P)};
  for (int64_t p = 0; p < P; ++p) {
    TORCH_CHECK_INDEX(id[p] >= 0 && id[p] < E, "an expert id is out of range: ", static_cast<int64_t>(id[p]),
                      " at pair ", p, ", expected [0, ", E, ")");
    ++pairs.start[id[p] + 1];
  }
  for (int64_t e = 0; e < E; ++e) pairs.start[e + 1] += pairs.start[e];
  std::vector<int64_t> fill(pairs.start.begin(), pairs.start.end() - 1);
  for (int64_t p = 0; p < P; ++p) pairs.order[fill[id[p]]++] = p;  // stable: pairs in order within an expert
  return pairs;
}

inline float activate(float g, float u, int64_t act, float alpha, float limit) {
  if (act != SILU) g = std::min(g, limit), u = std::clamp(u, -limit, limit);
  if (act == SWIGLUOAI) return (u + 1.0f) * g / (1.0f + std::exp(-alpha * g));
  return g / (1.0f + std::exp(-g)) * u;
}

template <typename W>
struct Projection {
  const W* packed;      // [E, NB, K, NR]
  const float* bias;    // [E, N] or null
  int64_t NB, K, N;
};

template <typename W>
Projection<W> projection(const torch::Tensor& packed, int64_t N, const c10::optional<torch::Tensor>& bias,
                         int64_t panels, int64_t K, const char* name) {
  check(packed.dim() == 4 && packed.element_size() == sizeof(W) && packed.is_contiguous() &&
            packed.size(1) == panels && packed.size(2) == K && packed.size(3) == NR,
        "a packed projection must be contiguous [E, panels, K, NR]", name, " ", packed.sizes(), " ",
        packed.scalar_type(), ", expected ", panels, " panels, K = ", K, ", NR = ", NR);
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    check(bias->scalar_type() == torch::kFloat && bias->is_contiguous() && bias->dim() == 2 &&
              bias->size(0) == packed.size(0) && bias->size(1) == N,
          "a bias must be contiguous float32 [E, N]", bias->sizes(), ", expected [", packed.size(0), ", ", N, "]");
    b = bias->data_ptr<float>();
  }
  return {static_cast<const W*>(packed.data_ptr()), b, packed.size(1), K, N};
}

// the rows a panel holds: K, or K rounded up to whole pairs in the bf16 pair layout
template <typename A>
constexpr int64_t span(int64_t K) {
  return std::is_same_v<A, bf16> ? (K + 1) / 2 * 2 : K;
}


// every (expert that owns pairs, panel < NB) tile, one parallel region: body(e, b, first, count, gemm)
// over the expert's sorted pairs, MR at a time, or AMX_RUN at a time as GEMMs where `gemm`
template <typename Body>
void over_tiles(const Pairs& pairs, int64_t NB, bool gemms, const Body& body) {
  std::vector<std::pair<int64_t, int64_t>> tasks;
  for (size_t e = 0; e + 1 < pairs.start.size(); ++e)
    if (pairs.start[e + 1] > pairs.start[e])
      for (int64_t b = 0; b < NB; ++b) tasks.emplace_back(e, b);
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const auto [e, b] = tasks[t];
      const int64_t end = pairs.start[e + 1];
      const bool gemm = gemms && pairs.many(e);
      const int64_t step = gemm ? AMX_RUN : MR;
      for (int64_t i = pairs.start[e]; i < end; i += step) body(e, b, i, std::min(step, end - i), gemm);
    }
    release();
  });
}

// Both projections: y[p] = expert(ids[p], x[p / k]) for every pair p, through hidden [P, KI] (the
// pairs in sorted order). The rows A are float32 (panels W widened as read) or bfloat16 (pair
// panels; gate, up and the hidden rounded to bfloat16 as the spec's r() does); xs, where not null,
// holds the sorted rows of the experts with AMX_ROWS pairs or more, [P, KH].
template <typename A, typename W>
void experts(const A* xp, const A* xs, const Pairs& pairs, int64_t k, int64_t H, int64_t I, const torch::Tensor& p13,
             const torch::Tensor& p2, const c10::optional<torch::Tensor>& bias13,
             const c10::optional<torch::Tensor>& bias2, int64_t act, float a, float lim, A* hp, float* yp) {
  constexpr bool GEMMS = std::is_same_v<A, bf16> && std::is_same_v<W, bf16>;
  const int64_t half = (I + NR - 1) / NR, KH = span<A>(H), KI = span<A>(I);
  const Projection<W> w13 = projection<W>(p13, 2 * I, bias13, 2 * half, KH, "p13");
  const Projection<W> w2 = projection<W>(p2, H, bias2, (H + NR - 1) / NR, KI, "p2");
  over_tiles(pairs, half, xs != nullptr, [&](int64_t e, int64_t b, int64_t first, int64_t count, bool gemm) {
    float gate[AMX_RUN][NR], up[AMX_RUN][NR];
    const int64_t col = b * NR, cols = std::min(NR, I - col);
    const W* panel = w13.packed + (e * w13.NB + 2 * b) * KH * NR;
    const float* bias = w13.bias ? w13.bias + e * 2 * I + col : nullptr;
    if constexpr (GEMMS) {
      if (gemm) {
        tile_gemm(count, KH, xs + first * KH, panel, gate[0]);
        tile_gemm(count, KH, xs + first * KH, panel + KH * NR, up[0]);
        for (int64_t r = 0; bias && r < count; ++r)
          for (int64_t j = 0; j < cols; ++j) gate[r][j] += bias[j], up[r][j] += bias[I + j];
      }
    }
    if (!gemm) {
      const A* rows[MR];
      float* g_out[MR];
      float* u_out[MR];
      for (int64_t r = 0; r < count; ++r) rows[r] = xp + (pairs.order[first + r] / k) * H, g_out[r] = gate[r], u_out[r] = up[r];
      tile_rows(count, rows, panel, H, g_out, cols, bias);
      tile_rows(count, rows, panel + KH * NR, H, u_out, cols, bias ? bias + I : nullptr);
    }
    for (int64_t r = 0; r < count; ++r) {
      A* h = hp + (first + r) * KI + col;
      for (int64_t j = 0; j < cols; ++j) {
        const float g = widen(narrow<A>(gate[r][j])), u = widen(narrow<A>(up[r][j]));
        h[j] = narrow<A>(activate(g, u, act, a, lim));
      }
    }
  });
  over_tiles(pairs, w2.NB, xs != nullptr, [&](int64_t e, int64_t b, int64_t first, int64_t count, bool gemm) {
    const int64_t col = b * NR, cols = std::min(NR, H - col);
    const W* panel = w2.packed + (e * w2.NB + b) * KI * NR;
    const float* bias = w2.bias ? w2.bias + e * H + col : nullptr;
    if constexpr (GEMMS) {
      if (gemm) {
        float c[AMX_RUN][NR];
        tile_gemm(count, KI, hp + first * KI, panel, c[0]);
        for (int64_t r = 0; r < count; ++r) {
          float* o = yp + pairs.order[first + r] * H + col;
          for (int64_t j = 0; j < cols; ++j) o[j] = c[r][j] + (bias ? bias[j] : 0.0f);
        }
        return;
      }
    }
    const A* rows[MR];
    float* outs[MR];
    for (int64_t r = 0; r < count; ++r) rows[r] = hp + (first + r) * KI, outs[r] = yp + pairs.order[first + r] * H + col;
    tile_rows(count, rows, panel, I, outs, cols, bias);
  });
}

}  // namespace

int64_t panel_width() { return NR; }
bool bf16_pairs() { return PAIRS; }
bool bf16_tiles() { return PAIRS && tiles(); }

// x [M, H] float32, or bfloat16 where bf16_pairs(); ids int32 or int64 [M, k] in [0, E); weights [M, k];
// p13 [E, 2 * ceil(I / NR), H, NR] (gate panel 0, up panel 0, gate panel 1, ...) and p2
// [E, ceil(H / NR), I, NR], both float32 or both bfloat16 (for bfloat16 x: in k pairs, H and I rounded
// up to even); biases
// [E, 2I] and [E, H] or none; act: Activation. Returns [M, H].
torch::Tensor fused_moe(const torch::Tensor& x, const torch::Tensor& ids, const torch::Tensor& weights,
                        const torch::Tensor& p13, int64_t I, const torch::Tensor& p2,
                        const c10::optional<torch::Tensor>& bias13, const c10::optional<torch::Tensor>& bias2,
                        int64_t act, double alpha, double limit) {
  check(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu(), "x must be a contiguous 2-D CPU tensor", x.sizes(),
        " on ", x.device());
  const int64_t M = x.size(0), H = x.size(1), E = p13.size(0);
  check(ids.dim() == 2 && ids.size(0) == M && ids.is_contiguous() &&
            (ids.scalar_type() == torch::kInt || ids.scalar_type() == torch::kLong),
        "ids must be contiguous int32 or int64 [M, k] for x's M", ids.sizes(), " ", ids.scalar_type(), " for M = ", M);
  check(weights.sizes() == ids.sizes() && weights.scalar_type() == torch::kFloat && weights.is_contiguous(),
        "weights must be contiguous float32 of ids' shape", weights.sizes(), " for ", ids.sizes());
  check(I >= 1 && p2.dim() == 4 && p2.size(0) == E && act >= SILU && act <= SWIGLUOAI,
        "I >= 1, E experts in both projections and a known activation", "I = ", I, ", p2 ", p2.sizes(), " for E = ",
        E, ", act ", act);
  const auto wt = p13.scalar_type();
  check(p2.scalar_type() == wt && (wt == torch::kFloat || wt == torch::kBFloat16),
        "the packed projections must both be float32 or both bfloat16", wt, " and ", p2.scalar_type());
  const auto xt = x.scalar_type();
  check(xt == torch::kFloat || (PAIRS && xt == torch::kBFloat16 && wt == torch::kBFloat16),
        "x must be float32, or bfloat16 over bfloat16 pair panels (a build with AVX512-BF16)", xt, " over ", wt);
  const int64_t k = ids.size(1), P = M * k;
  const Pairs pairs = ids.scalar_type() == torch::kInt ? bucket(ids.data_ptr<int32_t>(), P, E)
                                                       : bucket(ids.data_ptr<int64_t>(), P, E);
  const auto f32 = x.options().dtype(torch::kFloat);
  const bool pair_rows = xt == torch::kBFloat16;
  const int64_t KH = pair_rows ? span<bf16>(H) : H, KI = pair_rows ? span<bf16>(I) : I;
  auto hidden = KI > I ? torch::zeros({P, KI}, x.options()) : torch::empty({P, KI}, x.options());
  auto y = torch::empty({P, H}, f32);
  const float* wp = weights.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float a = static_cast<float>(alpha), lim = static_cast<float>(limit);
  if (xt == torch::kFloat) {
    (wt == torch::kFloat ? &experts<float, float> : &experts<float, bf16>)(
        x.data_ptr<float>(), nullptr, pairs, k, H, I, p13, p2, bias13, bias2, act, a, lim, hidden.data_ptr<float>(), yp);
  } else {
#if defined(__AVX512BF16__)  // (bf16 rows were refused above on other builds)
    const bf16* xb = static_cast<const bf16*>(x.data_ptr());
    torch::Tensor gathered;  // the sorted rows of experts with AMX_ROWS pairs or more
    bool any = false;
    for (int64_t e = 0; e < E && tiles() && !any; ++e) any = pairs.many(e);
    if (any) {
      gathered = KH > H ? torch::zeros({P, KH}, x.options()) : torch::empty({P, KH}, x.options());
      bf16* xs = static_cast<bf16*>(gathered.data_ptr());
      at::parallel_for(0, E, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t e = lo; e < hi; ++e) {
          if (!pairs.many(e)) continue;
          for (int64_t i = pairs.start[e]; i < pairs.start[e + 1]; ++i)
            std::copy_n(xb + (pairs.order[i] / k) * H, H, xs + i * KH);
        }
      });
    }
    experts<bf16, bf16>(xb, any ? static_cast<const bf16*>(gathered.data_ptr()) : nullptr, pairs, k, H, I, p13, p2,
                        bias13, bias2, act, a, lim, static_cast<bf16*>(hidden.data_ptr()), yp);
#endif
  }
  auto out = torch::empty({M, H}, f32);
  float* op = out.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) {
      float* o = op + m * H;
      std::fill(o, o + H, 0.0f);
      for (int64_t s = 0; s < k; ++s) {
        const float w = wp[m * k + s];
        const float* src = yp + (m * k + s) * H;
        for (int64_t j = 0; j < H; ++j) o[j] += w * src[j];
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fused_moe", &fused_moe, "fused_moe of float32 rows over float32 or bfloat16 packed experts, or of bfloat16 rows over bfloat16 pair panels");
  m.def("panel_width", &panel_width, "NR, the packed panel width this build uses");
  m.def("bf16_pairs", &bf16_pairs, "whether bfloat16 experts are packed in k pairs for bfloat16 rows (AVX512-BF16)");
  m.def("bf16_tiles", &bf16_tiles, "whether experts with many bfloat16 rows run as oneDNN brgemm tile GEMMs");
}
