// hetero-torch's CPU write_kv, float32 or bfloat16 (hetero.spec.attention): each token's key and value rows copied
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
  const auto dtype = k_cache.scalar_type();
  for (const auto* c : {&k_cache, &v_cache})
    check(c->dim() == 4 && (c->scalar_type() == torch::kFloat || c->scalar_type() == torch::kBFloat16) &&
              c->scalar_type() == dtype && c->is_contiguous() && c->device().is_cpu(),
          "the caches must be contiguous CPU [NB, BS, Hkv, D] both float32 or both bfloat16", c->sizes(), " ",
          c->scalar_type());
  const int64_t T = slot_mapping.numel();
  check(slot_mapping.dim() == 1 && slot_mapping.scalar_type() == torch::kLong && slot_mapping.is_contiguous(),
        "slot_mapping must be contiguous int64 [T]", slot_mapping.sizes());
  for (const auto& pair : {std::make_pair(&key, &k_cache), std::make_pair(&value, &v_cache)})
    check(pair.first->dim() == 3 && pair.first->scalar_type() == dtype && pair.first->size(0) == T &&
              pair.first->size(1) == pair.second->size(2) && pair.first->size(2) == pair.second->size(3) &&
              pair.first->stride(2) == 1 && pair.first->stride(1) == pair.first->size(2),
          "key and value must be [T, Hkv, D] of the cache's dtype and shape, each row's heads contiguous",
          pair.first->sizes(), " for ", pair.second->sizes(), " and T = ", T);
  const int64_t slots = k_cache.size(0) * k_cache.size(1);
  const int64_t krow = k_cache.size(2) * k_cache.size(3), vrow = v_cache.size(2) * v_cache.size(3);
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  const int64_t e = k_cache.element_size();  // rows move as bytes: the dtypes match
  const char *k = static_cast<const char*>(key.data_ptr()), *v = static_cast<const char*>(value.data_ptr());
  char *kc = static_cast<char*>(k_cache.data_ptr()), *vc = static_cast<char*>(v_cache.data_ptr());
  const int64_t ks = key.stride(0), vs = value.stride(0);
  at::parallel_for(0, T, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      if (slot[t] >= 0 && slot[t] < slots) {
        std::copy_n(k + t * ks * e, krow * e, kc + slot[t] * krow * e);
        std::copy_n(v + t * vs * e, vrow * e, vc + slot[t] * vrow * e);
      }
  });
}

TORCH_LIBRARY_FRAGMENT(hetero_torch_native, m) {
  m.def("write_kv(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(hetero_torch_native, CPU, m) { m.impl("write_kv", &write_kv); }
