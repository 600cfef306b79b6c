// hetero-torch's CPU write_kv, float32 (hetero.spec.attention): each token's key and value rows copied
// into their cache slots; a slot outside [0, NB * BS) (-1: padding) is skipped.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>

namespace {

template <typename... Got>
void check(bool ok, const char* what, const Got&... got) {
  TORCH_CHECK(ok, "hetero_torch write_kv: ", what, ", got ", got...);
}

}  // namespace

// k_cache[slot // BS, slot % BS] = key[t] (and v) for every t whose slot is in [0, NB * BS).
void write_kv(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor k_cache, torch::Tensor v_cache,
              const torch::Tensor& slot_mapping) {
  for (const auto* c : {&k_cache, &v_cache})
    check(c->dim() == 4 && c->scalar_type() == torch::kFloat && c->is_contiguous() && c->device().is_cpu(),
          "the caches must be contiguous float32 CPU [NB, BS, Hkv, D]", c->sizes());
  const int64_t T = slot_mapping.numel();
  check(slot_mapping.dim() == 1 && slot_mapping.scalar_type() == torch::kLong && slot_mapping.is_contiguous(),
        "slot_mapping must be contiguous int64 [T]", slot_mapping.sizes());
  for (const auto& pair : {std::make_pair(&key, &k_cache), std::make_pair(&value, &v_cache)})
    check(pair.first->dim() == 3 && pair.first->scalar_type() == torch::kFloat && pair.first->size(0) == T &&
              pair.first->size(1) == pair.second->size(2) && pair.first->size(2) == pair.second->size(3) &&
              pair.first->stride(2) == 1 && pair.first->stride(1) == pair.first->size(2),
          "key and value must be float32 [T, Hkv, D] matching the cache, each row's heads contiguous",
          pair.first->sizes(), " for ", pair.second->sizes(), " and T = ", T);
  const int64_t slots = k_cache.size(0) * k_cache.size(1);
  const int64_t krow = k_cache.size(2) * k_cache.size(3), vrow = v_cache.size(2) * v_cache.size(3);
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  const float *k = key.data_ptr<float>(), *v = value.data_ptr<float>();
  float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
  const int64_t ks = key.stride(0), vs = value.stride(0);
  at::parallel_for(0, T, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      if (slot[t] >= 0 && slot[t] < slots) {
        std::copy_n(k + t * ks, krow, kc + slot[t] * krow);
        std::copy_n(v + t * vs, vrow, vc + slot[t] * vrow);
      }
  });
}

TORCH_LIBRARY_FRAGMENT(hetero_torch_native, m) {
  m.def("write_kv(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(hetero_torch_native, CPU, m) { m.impl("write_kv", &write_kv); }
