// The work layout of hetero-torch's CPU paged attention: the metadata clamped into range
// (sanitize) and the (sequence, row chunk, KV heads) tasks the threads share (tasks_of).
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace hetero_attention {

constexpr int64_t QMAX = 16;  // query vectors per task (rows x heads of one KV head), at least

struct Layout {  // the sanitized metadata
  std::vector<int64_t> start;  // [B + 1] query rows
  std::vector<int64_t> len;    // [B] keys
  bool covers_all = true;      // every query row belongs to a sequence
};

inline Layout sanitize(const torch::Tensor& qsl, const torch::Tensor& seq_lens, int64_t T, int64_t max_keys) {
  const int64_t B = seq_lens.size(0);
  const int32_t* q = qsl.data_ptr<int32_t>();
  const int32_t* s = seq_lens.data_ptr<int32_t>();
  Layout out;
  out.start.resize(B + 1);
  out.len.resize(B);
  for (int64_t b = 0; b <= B; ++b) {
    const int64_t floor = b ? out.start[b - 1] : 0;
    out.start[b] = std::clamp<int64_t>(q[b], floor, std::max(floor, T));
    out.covers_all &= out.start[b] == q[b];
  }
  out.covers_all &= out.start[0] == 0 && out.start[B] == T;
  for (int64_t b = 0; b < B; ++b) out.len[b] = std::clamp<int64_t>(s[b], 0, max_keys);
  return out;
}

struct Task {
  int64_t b, kvh, r0, r1, first_pos;  // rows [r0, r1) at positions first_pos + (r - r0)
  int64_t kv_heads;                   // KV heads kvh, kvh + 1, ... done one after the other
};

// One task per (sequence, row chunk) doing every KV head in turn when that leaves enough tasks
// to share out: a cache row holds all KV heads of a position, so one task then uses each cache
// line it loads whole.
// Else one task per (sequence, KV head, row chunk).
inline std::vector<Task> tasks_of(const Layout& lay, int64_t Hkv, int64_t G) {
  const int64_t rows_per = std::max<int64_t>(1, QMAX / G);
  int64_t chunks = 0;
  for (size_t b = 0; b < lay.len.size(); ++b) chunks += (lay.start[b + 1] - lay.start[b] + rows_per - 1) / rows_per;
  const int64_t group = chunks >= 4 * at::get_num_threads() ? Hkv : 1;
  std::vector<Task> tasks;
  for (size_t b = 0; b < lay.len.size(); ++b) {
    const int64_t n = lay.start[b + 1] - lay.start[b], first = lay.len[b] - n;
    for (int64_t h = 0; h < Hkv; h += group)
      for (int64_t a = 0; a < n; a += rows_per)
        tasks.push_back({static_cast<int64_t>(b), h, lay.start[b] + a, lay.start[b] + std::min(n, a + rows_per),
                         first + a, group});
  }
  return tasks;
}

}  // namespace hetero_attention
