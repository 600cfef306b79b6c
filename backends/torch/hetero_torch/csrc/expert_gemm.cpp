// hetero-torch's CPU expert GEMM: y[p] = a[p / a_div] @ W[ids[p]].T (+ bias[ids[p]]) for every
// (token, slot) pair p, float32, with W pre-packed into column panels.
//
// torch's CPU grouped_mm (and oneDNN called once per expert) pays a library call, its thread
// fork and its own packing per expert, which at a decode step's few rows per expert costs more
// than the arithmetic. Here the pairs are bucketed by expert with a counting sort and every
// (expert, panel) tile is one task of one parallel region; a task keeps its panel (K x NR floats)
// in cache while it walks the expert's rows MR at a time, reading each row in place.
//
// Layout: packed [E, NB, K, NR] with NB = ceil(N / NR): packed[e][b][k][j] = W[e][b*NR + j][k],
// zero past N (hetero_torch/_moe_native.py packs it). Callers validate ids; the kernel checks
// every shape and id again and raises instead of reading out of bounds.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace {

#if defined(__AVX512F__)
constexpr int64_t VW = 16;  // floats per vector register
#elif defined(__AVX__)
constexpr int64_t VW = 8;
#else
constexpr int64_t VW = 4;
#endif
constexpr int64_t NR = 2 * VW;  // a panel row is two vectors
constexpr int64_t MR = 6;       // rows per micro-tile: 12 vector accumulators
typedef float vec __attribute__((vector_size(VW * sizeof(float))));

inline vec load(const float* p) {
  vec v;
  __builtin_memcpy(&v, p, sizeof(vec));
  return v;
}

template <int64_t R>
void tile(const float* const* rows, const float* panel, int64_t K, float* const* outs, int64_t cols,
          const float* bias) {
  vec acc[R][2];
  for (int64_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = vec{};
  for (int64_t k = 0; k < K; ++k) {
    const vec b0 = load(panel + k * NR), b1 = load(panel + k * NR + VW);
    for (int64_t r = 0; r < R; ++r) {
      const float a = rows[r][k];
      acc[r][0] += a * b0;
      acc[r][1] += a * b1;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float out[NR];
    __builtin_memcpy(out, &acc[r][0], sizeof(vec));
    __builtin_memcpy(out + VW, &acc[r][1], sizeof(vec));
    for (int64_t j = 0; j < cols; ++j) outs[r][j] = out[j] + (bias ? bias[j] : 0.0f);
  }
}

void tile_rows(int64_t count, const float* const* rows, const float* panel, int64_t K, float* const* outs,
               int64_t cols, const float* bias) {
  switch (count) {
    case 6: return tile<6>(rows, panel, K, outs, cols, bias);
    case 5: return tile<5>(rows, panel, K, outs, cols, bias);
    case 4: return tile<4>(rows, panel, K, outs, cols, bias);
    case 3: return tile<3>(rows, panel, K, outs, cols, bias);
    case 2: return tile<2>(rows, panel, K, outs, cols, bias);
    default: return tile<1>(rows, panel, K, outs, cols, bias);
  }
}

template <typename... Got>
void check(bool ok, const char* what, const Got&... got) {
  TORCH_CHECK(ok, "hetero_torch expert_gemm: ", what, ", got ", got...);
}

}  // namespace

int64_t panel_width() { return NR; }

// a [A, K] float32; ids [P] int32 in [0, E); packed [E, NB, K, NR]; bias [E, N] or empty.
// Row p of the result [P, N] uses a's row p / a_div (a_div >= 1, P <= A * a_div).
torch::Tensor expert_gemm(torch::Tensor a, int64_t a_div, torch::Tensor ids, torch::Tensor packed, int64_t N,
                          c10::optional<torch::Tensor> bias) {
  check(a.dim() == 2 && a.scalar_type() == torch::kFloat && a.is_contiguous() && a.device().is_cpu(),
        "a must be a contiguous 2-D float32 CPU tensor", a.sizes(), " ", a.scalar_type(), " on ", a.device());
  check(packed.dim() == 4 && packed.scalar_type() == torch::kFloat && packed.is_contiguous() &&
            packed.size(3) == NR && packed.size(2) == a.size(1),
        "packed must be contiguous float32 [E, NB, K, NR] with K = a.size(1)", packed.sizes(), " ",
        packed.scalar_type(), " for a ", a.sizes(), " and NR = ", NR);
  check(ids.dim() == 1 && ids.scalar_type() == torch::kInt && ids.is_contiguous(), "ids must be 1-D int32",
        ids.sizes(), " ", ids.scalar_type());
  const int64_t E = packed.size(0), NB = packed.size(1), K = packed.size(2), P = ids.size(0);
  check(N >= 1 && (N + NR - 1) / NR == NB, "N does not match the packed panels", "N = ", N, " for ", NB,
        " panels of ", NR);
  check(a_div >= 1 && P <= a.size(0) * a_div, "a has fewer rows than the pairs need", a.size(0), " rows, ", P,
        " pairs, a_div ", a_div);
  const float* bias_ptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    check(bias->scalar_type() == torch::kFloat && bias->is_contiguous() && bias->dim() == 2 &&
              bias->size(0) == E && bias->size(1) == N,
          "bias must be contiguous float32 [E, N]", bias->sizes(), " ", bias->scalar_type(), " for E = ", E,
          ", N = ", N);
    bias_ptr = bias->data_ptr<float>();
  }
  const int32_t* id = ids.data_ptr<int32_t>();
  std::vector<int64_t> start(E + 1, 0);
  for (int64_t p = 0; p < P; ++p) {
    check(id[p] >= 0 && id[p] < E, "an expert id is out of range", id[p], " at pair ", p, ", expected [0, ", E,
          ")");
    ++start[id[p] + 1];
  }
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  std::vector<int64_t> order(P), fill(start.begin(), start.end() - 1);
  for (int64_t p = 0; p < P; ++p) order[fill[id[p]]++] = p;  // stable: pairs in order within an expert

  auto y = torch::empty({P, N}, a.options());
  std::vector<std::pair<int64_t, int64_t>> tasks;  // (expert, panel) of experts that own pairs
  for (int64_t e = 0; e < E; ++e)
    if (start[e + 1] > start[e])
      for (int64_t b = 0; b < NB; ++b) tasks.emplace_back(e, b);
  const float* a_ptr = a.data_ptr<float>();
  const float* w_ptr = packed.data_ptr<float>();
  float* y_ptr = y.data_ptr<float>();
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t lo, int64_t hi) {
    const float* rows[MR];
    float* outs[MR];
    for (int64_t t = lo; t < hi; ++t) {
      const auto [e, b] = tasks[t];
      const float* panel = w_ptr + (e * NB + b) * K * NR;
      const int64_t col = b * NR, cols = std::min(NR, N - col);
      const float* bcol = bias_ptr ? bias_ptr + e * N + col : nullptr;
      for (int64_t i = start[e]; i < start[e + 1]; i += MR) {
        const int64_t count = std::min(MR, start[e + 1] - i);
        for (int64_t r = 0; r < count; ++r) {
          rows[r] = a_ptr + (order[i + r] / a_div) * K;
          outs[r] = y_ptr + order[i + r] * N + col;
        }
        tile_rows(count, rows, panel, K, outs, cols, bcol);
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("expert_gemm", &expert_gemm, "per-pair expert GEMM over packed float32 weights");
  m.def("panel_width", &panel_width, "NR, the packed panel width this build uses");
}
