// hetero-torch's CPU paged attention, float32 or bfloat16 (hetero.spec.attention's paged_attention:
// bf16 operands, float32 scores, softmax and accumulation, the output rounded once). The keys
// are read in place through the block table: no gathered copy of the cache, no padded batch, no
// mask tensor (the torch path's gather of a decode batch's keys cost more than its attention;
// benchmarks/attention_cpu.py times both paths).
//
// Work: tasks of (sequence, chunk of query rows), one KV head or all of them in turn (tasks_of);
// a chunk's query vectors (its rows times a KV head's query heads) share every key and value
// row they load. Keys go by tiles
// of KT with an online softmax, so memory stays bounded at any length.
//
// Metadata values are not trusted: query_start_loc is clamped monotone into [0, T], seq_lens into
// [0, block_table columns * BS] and block ids into [0, NB), so an unchecked call (validation off)
// reads nothing outside its tensors; rows a malformed layout leaves uncovered get 0.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_layout.h"
#include "simd.h"

namespace {

using namespace hetero_simd;
using namespace hetero_attention;

constexpr int64_t KT = 64;    // keys per tile, a multiple of VW
// query vectors from which a task's score pass is a small GEMM over the tile's keys, transposed
// (and widened) once and shared by all of them; below, each score is a dot product of its own
constexpr int64_t BLOCKED_MIN = 8;
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// acc[0, n) += sum over keys jj of p[jj] * v[jj][0, n), the accumulators in registers across the keys
template <typename T>
inline void accumulate(float* acc, const float* p, const T* const* v, int64_t nk, int64_t n) {
  constexpr int64_t C = 4;  // vectors of columns per pass
  int64_t d = 0;
  for (; d + C * VW <= n; d += C * VW) {
    vec a[C];
    for (int64_t c = 0; c < C; ++c) a[c] = load(acc + d + c * VW);
    for (int64_t jj = 0; jj < nk; ++jj)
      for (int64_t c = 0; c < C; ++c) a[c] += p[jj] * load(v[jj] + d + c * VW);
    for (int64_t c = 0; c < C; ++c) store(acc + d + c * VW, a[c]);
  }
  for (; d + VW <= n; d += VW) {
    vec a0 = load(acc + d), a1{};
    int64_t jj = 0;
    for (; jj + 1 < nk; jj += 2) a0 += p[jj] * load(v[jj] + d), a1 += p[jj + 1] * load(v[jj + 1] + d);
    if (jj < nk) a0 += p[jj] * load(v[jj] + d);
    store(acc + d, a0 + a1);
  }
  for (; d < n; ++d)
    for (int64_t jj = 0; jj < nk; ++jj) acc[d] += p[jj] * widen(v[jj][d]);
}

template <typename... Got>
void check(bool ok, const char* what, const Got&... got) {
  TORCH_CHECK(ok, "hetero_torch paged attention: ", what, ", got ", got...);
}

template <typename T>
struct Problem {
  const T *q, *k, *v;
  const float* sinks;
  const int32_t* table;
  T* out;
  float* lse;
  int64_t q_stride, Hq, Hkv, G, D, Dv, NB, BS, table_stride;
  float scale, softcap;
  bool causal;
  int64_t wl, wr;

  // the addresses of keys [j0, j0 + n) of sequence b, KV head h, in cache (one table lookup a block)
  void rows(int64_t b, int64_t j0, int64_t n, int64_t h, const T* cache, int64_t dim, const T** out) const {
    for (int64_t j = j0, i = 0; i < n;) {
      const int64_t blk = std::clamp<int64_t>(table[b * table_stride + j / BS], 0, NB - 1);
      const int64_t off = j % BS, run = std::min(BS - off, n - i);
      const T* base = cache + ((blk * BS + off) * Hkv + h) * dim;
      for (int64_t x = 0; x < run; ++x) out[i + x] = base + x * Hkv * dim;
      i += run, j += run;
    }
  }
};

// Scratch of one thread: per query vector its range, running max and sum, scores and accumulator
// (and in bf16 the query widened once).
template <typename T>
struct Scratch {
  std::vector<int64_t> lo, hi;
  std::vector<float> m, l, s, acc, qw, kt;
  std::vector<const float*> qp;
  const T* kv[KT];  // the tile's key rows
  const T* vv[KT];  // and value rows
  void fit(int64_t nq, int64_t d, int64_t dv) {
    lo.resize(nq), hi.resize(nq), m.resize(nq), l.resize(nq), qp.resize(nq);
    s.resize(nq * KT), acc.resize(nq * dv), qw.resize(std::is_same_v<T, float> ? 0 : nq * d);
    kt.resize(nq >= BLOCKED_MIN ? d * KT : 0);
  }
  const float* query(const T* q, int64_t i, int64_t d) {
    if constexpr (std::is_same_v<T, float>) return q;
    std::transform(q, q + d, &qw[i * d], [](T x) { return widen(x); });
    return &qw[i * d];
  }
};

// The scores of all nq query vectors against the tile as one [nq, D] x [D, KT] product: the tile's
// keys go once into kt [D, KT] as float32, then each query row accumulates KT / VW vectors of
// scores over d by broadcast multiply-adds (no horizontal sums, no per-query widening).
template <typename T>
void scores_blocked(const Problem<T>& pr, Scratch<T>& w, int64_t nq, int64_t j0, int64_t nk) {
  constexpr int64_t NV = KT / VW;
  float* kt = w.kt.data();
  for (int64_t jj = 0; jj < nk; ++jj)
    for (int64_t d = 0; d < pr.D; ++d) kt[d * KT + jj] = widen(w.kv[jj][d]);
  if (nk < KT)
    for (int64_t d = 0; d < pr.D; ++d) std::fill(kt + d * KT + nk, kt + (d + 1) * KT, 0.0f);
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t first = std::max<int64_t>(w.lo[i] - j0, 0), last = std::min<int64_t>(w.hi[i] - j0, nk - 1);
    float* s = &w.s[i * KT];
    if (first > last) {
      std::fill(s, s + KT, NEG_INF);
      continue;
    }
    vec acc[NV] = {};
    const float* q = w.qp[i];
    for (int64_t d = 0; d < pr.D; ++d) {
      const vec qd = splat(q[d]);
      const float* row = kt + d * KT;
      for (int64_t v = 0; v < NV; ++v) acc[v] += qd * load(row + v * VW);
    }
    for (int64_t v = 0; v < NV; ++v) store(s + v * VW, acc[v] * splat(pr.scale));
    std::fill(s, s + first, NEG_INF);
    std::fill(s + last + 1, s + KT, NEG_INF);
    if (pr.softcap > 0)
      for (int64_t jj = first; jj <= last; ++jj) s[jj] = pr.softcap * std::tanh(s[jj] / pr.softcap);
  }
}

// keys whose rows are asked for ahead of the one being scored (all of a tile's at once stalled the
// loop until they had all arrived)
constexpr int64_t PK = 8;

template <typename T>
inline void prefetch(const T* row, int64_t n) {
  for (int64_t d = 0; d < n; d += 64 / sizeof(T)) __builtin_prefetch(row + d);
}

// Fewer query vectors than BLOCKED_MIN (a decode step's GQA group): each key and value row is read
// and widened once for all NQ of them (per query, that widening cost as much as the dot product).
template <int64_t NQ, typename T>
void scores_shared(const Problem<T>& pr, Scratch<T>& w, int64_t j0, int64_t nk) {
  for (int64_t jj = 0; jj < nk; ++jj) {
    if (jj + PK < nk) prefetch(w.kv[jj + PK], pr.D);
    prefetch(w.vv[jj], pr.Dv);  // read by this tile's accumulate_shared
    const T* key = w.kv[jj];
    vec acc[NQ][2] = {};
    int64_t d = 0;
    for (; d + 2 * VW <= pr.D; d += 2 * VW) {
      const vec k0 = load(key + d), k1 = load(key + d + VW);
      for (int64_t i = 0; i < NQ; ++i) acc[i][0] += load(w.qp[i] + d) * k0, acc[i][1] += load(w.qp[i] + d + VW) * k1;
    }
    for (; d + VW <= pr.D; d += VW) {
      const vec k0 = load(key + d);
      for (int64_t i = 0; i < NQ; ++i) acc[i][0] += load(w.qp[i] + d) * k0;
    }
    for (int64_t i = 0; i < NQ; ++i) {
      float s = hsum(acc[i][0] + acc[i][1]);
      for (int64_t e = d; e < pr.D; ++e) s += w.qp[i][e] * widen(key[e]);
      const int64_t j = j0 + jj;
      w.s[i * KT + jj] = j >= w.lo[i] && j <= w.hi[i] ? s * pr.scale : NEG_INF;
    }
  }
  for (int64_t i = 0; i < NQ; ++i) {
    float* s = &w.s[i * KT];
    std::fill(s + nk, s + KT, NEG_INF);
    if (pr.softcap > 0)
      for (int64_t jj = 0; jj < nk; ++jj)
        if (s[jj] != NEG_INF) s[jj] = pr.softcap * std::tanh(s[jj] / pr.softcap);
  }
}

template <int64_t NQ, typename T>
void accumulate_shared(Scratch<T>& w, const T* const* v, int64_t nk, int64_t n) {
  int64_t d = 0;
  for (; d + 2 * VW <= n; d += 2 * VW) {
    vec a[NQ][2];
    for (int64_t i = 0; i < NQ; ++i) a[i][0] = load(&w.acc[i * n + d]), a[i][1] = load(&w.acc[i * n + d + VW]);
    for (int64_t jj = 0; jj < nk; ++jj) {
      const vec v0 = load(v[jj] + d), v1 = load(v[jj] + d + VW);
      for (int64_t i = 0; i < NQ; ++i) {
        const float p = w.s[i * KT + jj];
        a[i][0] += p * v0, a[i][1] += p * v1;
      }
    }
    for (int64_t i = 0; i < NQ; ++i) store(&w.acc[i * n + d], a[i][0]), store(&w.acc[i * n + d + VW], a[i][1]);
  }
  for (; d + VW <= n; d += VW) {
    vec a[NQ];
    for (int64_t i = 0; i < NQ; ++i) a[i] = load(&w.acc[i * n + d]);
    for (int64_t jj = 0; jj < nk; ++jj) {
      const vec v0 = load(v[jj] + d);
      for (int64_t i = 0; i < NQ; ++i) a[i] += w.s[i * KT + jj] * v0;
    }
    for (int64_t i = 0; i < NQ; ++i) store(&w.acc[i * n + d], a[i]);
  }
  for (; d < n; ++d)
    for (int64_t i = 0; i < NQ; ++i)
      for (int64_t jj = 0; jj < nk; ++jj) w.acc[i * n + d] += w.s[i * KT + jj] * widen(v[jj][d]);
}

template <typename T>
void tile(const Problem<T>& pr, const Task& t, Scratch<T>& w, int64_t nq, int64_t j0, int64_t nk) {
  // the cache rarely holds the tile's rows (a step reads each layer's cache once): the blocked pass
  // asks for all of them at once, the shared pass PK keys ahead of the one it scores
  pr.rows(t.b, j0, nk, t.kvh, pr.k, pr.D, w.kv);
  pr.rows(t.b, j0, nk, t.kvh, pr.v, pr.Dv, w.vv);
  if (nq >= BLOCKED_MIN) {
    for (int64_t jj = 0; jj < nk; ++jj) {
      prefetch(w.kv[jj], pr.D);
      prefetch(w.vv[jj], pr.Dv);
    }
    scores_blocked(pr, w, nq, j0, nk);
  } else {
    for (int64_t jj = 0; jj < std::min(PK, nk); ++jj) prefetch(w.kv[jj], pr.D);
    with_constant<BLOCKED_MIN - 1>(nq, [&](auto n) { scores_shared<decltype(n)::value>(pr, w, j0, nk); });
  }
  for (int64_t i = 0; i < nq; ++i) {
    float* s = &w.s[i * KT];
    const float mt = *std::max_element(s, s + KT);
    if (mt == NEG_INF) {  // no key of this tile is visible: the row's state stays
      std::fill(s, s + KT, 0.0f);
      continue;
    }
    const float m_new = std::max(w.m[i], mt);
    if (m_new != w.m[i]) {
      const float corr = std::exp(w.m[i] - m_new);  // 0 when the running max was -inf
      w.l[i] *= corr;
      for (int64_t d = 0; d < pr.Dv; ++d) w.acc[i * pr.Dv + d] *= corr;
      w.m[i] = m_new;
    }
    vec sum{};
    for (int64_t jj = 0; jj < KT; jj += VW) {
      const vec p = vexp(load(s + jj) - splat(m_new));
      store(s + jj, p);
      sum += p;
    }
    w.l[i] += hsum(sum);
  }
  // a query that has seen no key yet keeps its zero state (a value row's inf or NaN times 0 would not)
  if (nq < BLOCKED_MIN && std::all_of(w.m.begin(), w.m.begin() + nq, [](float m) { return m != NEG_INF; }))
    return with_constant<BLOCKED_MIN - 1>(nq, [&](auto n) { accumulate_shared<decltype(n)::value>(w, w.vv, nk, pr.Dv); });
  for (int64_t i = 0; i < nq; ++i)
    if (w.m[i] != NEG_INF) accumulate(&w.acc[i * pr.Dv], &w.s[i * KT], w.vv, nk, pr.Dv);
}

template <typename T>
void run_task(const Problem<T>& pr, const Task& t, int64_t len, Scratch<T>& w) {
  const int64_t nq = (t.r1 - t.r0) * pr.G;
  w.fit(nq, pr.D, pr.Dv);
  int64_t jlo = len, jhi = -1;
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t r = t.r0 + i / pr.G, h = t.kvh * pr.G + i % pr.G, pos = t.first_pos + (r - t.r0);
    w.qp[i] = w.query(pr.q + r * pr.q_stride + h * pr.D, i, pr.D);
    int64_t lo = 0, hi = len - 1;
    if (pr.causal) hi = std::min(hi, pos);
    if (pr.wl >= 0) lo = std::max(lo, pos - pr.wl);
    if (pr.wr >= 0) hi = std::min(hi, pos + pr.wr);
    w.lo[i] = lo, w.hi[i] = hi, w.m[i] = NEG_INF, w.l[i] = 0.0f;
    if (lo <= hi) jlo = std::min(jlo, lo), jhi = std::max(jhi, hi);
  }
  std::fill(w.acc.begin(), w.acc.begin() + nq * pr.Dv, 0.0f);
  for (int64_t j0 = jlo; j0 <= jhi; j0 += KT) tile(pr, t, w, nq, j0, std::min(KT, jhi + 1 - j0));
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t r = t.r0 + i / pr.G, h = t.kvh * pr.G + i % pr.G;
    T* o = pr.out + (r * pr.Hq + h) * pr.Dv;
    float denom = w.l[i];
    if (pr.sinks && w.m[i] != NEG_INF) denom += std::exp(pr.sinks[h] - w.m[i]);
    const float inv = w.l[i] > 0.0f ? 1.0f / denom : 0.0f;
    for (int64_t d = 0; d < pr.Dv; ++d) o[d] = narrow<T>(w.acc[i * pr.Dv + d] * inv);
    if (pr.lse) pr.lse[r * pr.Hq + h] = w.l[i] > 0.0f ? w.m[i] + std::log(w.l[i]) : NEG_INF;
  }
}

void check_inputs(const torch::Tensor& query, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                  const torch::Tensor& qsl, const torch::Tensor& seq_lens, const torch::Tensor& table,
                  const c10::optional<torch::Tensor>& sinks) {
  const auto dtype = query.scalar_type();
  check(query.dim() == 3 && (dtype == torch::kFloat || dtype == torch::kBFloat16) && query.device().is_cpu() &&
            query.stride(2) == 1 && query.stride(1) == query.size(2),
        "query must be float32 or bfloat16 CPU [T, Hq, D] with each row's heads contiguous", query.sizes(), " ",
        query.strides(), " ", dtype);
  for (const auto* c : {&k_cache, &v_cache})
    check(c->dim() == 4 && c->scalar_type() == dtype && c->is_contiguous() && c->device().is_cpu() &&
              c->size(0) == k_cache.size(0) && c->size(1) == k_cache.size(1) && c->size(2) == k_cache.size(2),
          "the caches must be contiguous CPU [NB, BS, Hkv, D] of the query's dtype and one NB, BS and Hkv",
          k_cache.sizes(), " and ", v_cache.sizes(), " of ", c->scalar_type(), " for ", dtype);
  check(k_cache.size(3) == query.size(2) && k_cache.size(2) >= 1 && query.size(1) % k_cache.size(2) == 0,
        "query [T, Hq, D] must match k_cache's D and have a multiple of its Hkv heads", query.sizes(), " for ",
        k_cache.sizes());
  const int64_t B = seq_lens.numel();
  check(seq_lens.dim() == 1 && seq_lens.scalar_type() == torch::kInt && seq_lens.is_contiguous(),
        "seq_lens must be contiguous int32 [B]", seq_lens.sizes());
  check(qsl.dim() == 1 && qsl.scalar_type() == torch::kInt && qsl.is_contiguous() && qsl.size(0) == B + 1,
        "query_start_loc must be contiguous int32 [B + 1]", qsl.sizes(), " for B = ", B);
  check(table.dim() == 2 && table.scalar_type() == torch::kInt && table.size(0) == B &&
            (table.stride(1) == 1 || table.size(1) <= 1),
        "block_table must be int32 [B, cols] with contiguous rows", table.sizes(), " for B = ", B);
  if (sinks.has_value() && sinks->defined())
    check(sinks->dim() == 1 && sinks->scalar_type() == torch::kFloat && sinks->is_contiguous() &&
              sinks->size(0) == query.size(1),
          "sinks must be contiguous float32 [Hq]", sinks->sizes());
}

template <typename T>
void launch(const torch::Tensor& query, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
            const torch::Tensor& block_table, const float* sinks, torch::Tensor& out, float* lse, const Layout& lay,
            float scale, float softcap, bool causal, int64_t wl, int64_t wr) {
  const int64_t Hq = query.size(1), Hkv = k_cache.size(2);
  const Problem<T> pr{static_cast<const T*>(query.data_ptr()), static_cast<const T*>(k_cache.data_ptr()),
                      static_cast<const T*>(v_cache.data_ptr()), sinks, block_table.data_ptr<int32_t>(),
                      static_cast<T*>(out.data_ptr()), lse, query.stride(0), Hq, Hkv, Hq / Hkv, query.size(2),
                      v_cache.size(3), k_cache.size(0), k_cache.size(1), block_table.stride(0), scale, softcap,
                      causal, wl, wr};
  const std::vector<Task> tasks = tasks_of(lay, Hkv, pr.G);
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t lo, int64_t hi) {
    Scratch<T> w;
    for (int64_t i = lo; i < hi; ++i)
      for (Task one = tasks[i]; one.kvh < tasks[i].kvh + tasks[i].kv_heads; ++one.kvh)
        run_task(pr, one, lay.len[one.b], w);
  });
}

}  // namespace

// out [T, Hq, Dv] and lse float32 [T, Hq] (empty [0] unless need_lse).
std::tuple<torch::Tensor, torch::Tensor> paged_attention(
    const torch::Tensor& query, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
    const torch::Tensor& query_start_loc, const torch::Tensor& seq_lens, const torch::Tensor& block_table,
    double scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const c10::optional<torch::Tensor>& sinks, bool need_lse) {
  check_inputs(query, k_cache, v_cache, query_start_loc, seq_lens, block_table, sinks);
  const int64_t T = query.size(0), Hq = query.size(1), NB = k_cache.size(0), BS = k_cache.size(1);
  const int64_t Dv = v_cache.size(3);
  const int64_t max_keys = NB > 0 && BS > 0 ? block_table.size(1) * BS : 0;
  const Layout lay = sanitize(query_start_loc, seq_lens, T, max_keys);
  auto out = lay.covers_all ? torch::empty({T, Hq, Dv}, query.options()) : torch::zeros({T, Hq, Dv}, query.options());
  const auto f32 = query.options().dtype(torch::kFloat);
  auto lse = need_lse ? torch::full({T, Hq}, -INFINITY, f32) : torch::empty({0}, f32);
  const float* sink = sinks.has_value() && sinks->defined() ? sinks->data_ptr<float>() : nullptr;
  float* lse_p = need_lse ? lse.data_ptr<float>() : nullptr;
  const auto go = query.scalar_type() == torch::kFloat ? &launch<float> : &launch<bf16>;
  go(query, k_cache, v_cache, block_table, sink, out, lse_p, lay, static_cast<float>(scale),
     static_cast<float>(softcap), causal, window_left, window_right);
  return {out, lse};
}

TORCH_LIBRARY_FRAGMENT(hetero_torch_native, m) {
  m.def("paged_attention(Tensor query, Tensor k_cache, Tensor v_cache, Tensor query_start_loc, Tensor seq_lens, "
        "Tensor block_table, float scale, bool causal, int window_left, int window_right, float softcap, "
        "Tensor? sinks, bool need_lse) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(hetero_torch_native, CPU, m) {
  m.impl("paged_attention", &paged_attention);
}
