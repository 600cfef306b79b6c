#!/usr/bin/env bash
# The GPU check of the cuda backend, for a machine with an NVIDIA GPU:
#   1. the full conformance catalog (`hetero conformance cuda`), JSON + Markdown reports;
#   2. the robustness tier (`hetero conformance cuda --robustness`): every malformed call rejected with
#      validation on, and with it off (`--no-validate`) no illegal memory access, crash or hang;
#   3. every op timed on realistic shapes against the torch reference and the H200 roofline, and
#      the index-taking ops with validation on beside off (scripts/gpu_check.py), as a Markdown table;
#   4. the torch backend's conformance catalog on the GPU (`hetero conformance torch --isolate`), JSON + Markdown
#      reports next to the cuda ones (OUT's base + .torch-conformance.json/.md);
#   5. the engine side by side (benchmarks/engine_vs_vllm.py --device cuda): hetero on cuda eager and compiled
#      (CUDA graphs), hetero on torch, vLLM when the Python of --vllm-python / .venv-vllm has it, transformers
#      batched; output tok/s and token identity, dense and MoE, written to gpu_engine.md beside OUT.
#
# The timed cases include Qwen3-Next-80B's linear-attention layers (causal_conv1d, gated_delta_rule:
# decode at batch 64, prefill 8 x 4096 tokens), DeepSeek-V3.2's sparse attention (indexer_topk and
# mla_attention(topk_indices=...): decode at batch 64 over 32K, a 4096-row prefill chunk over 8K; top 2048;
# write_index_k, layer_norm) and gpt-oss-20b (fused_moe swigluoai with biases, E 32 top-4; paged_attention
# with sinks and a 128 window) and DeepSeek-V3's quantized experts (quantize_activation fp8 1x128 / ue8m0 /
# int8 per token on 4096 x 7168; scaled_grouped_gemm over the 32768 routed rows of 4096 tokens, E 256, 128x128
# blocks and row-wise, the row-wise case also beside torch._scaled_grouped_mm; fused_moe fp8 blocks) and packed
# int4 weights (W4A16, spec 1.9: gemm, grouped_gemm under EP 8 and fused_moe at Kimi-K2.5's symmetric group-32
# and Qwen3-30B-A3B's group-128 zero-point experts, hetero.kernels.int4), each against its memory / compute
# roofline. Cases: scripts/gpu_check_cases.py, gpu_check_attention.py, gpu_check_quant.py, gpu_check_int4.py,
# gpu_check_sizes.py.
#
# usage: scripts/gpu_check.sh [--smoke] [--list] [OUT.md]      (default OUT: docs/perf/gpu_check.md)
#   --smoke  tiny shapes and a few conformance ops through Triton's interpreter on the CPU
#            (HETERO_TRITON_INTERPRET=1), torch conformance on the same few ops, and the engine comparison
#            on the CPU (hetero torch, two short requests): proves the script runs end to end
#            without a GPU.
#   --list   print the timed cases with their bytes, flops and roofline, and run nothing.
# Environment: PYTHON (default .venv/bin/python, else python3); HETERO_CUDA_VENDOR=0 times the
# Triton kernels in place of the vendor paths.
# Exit status: 0 when both conformance runs and the robustness tier passed, every op ran and no engine
# configuration crashed, else 1.
set -uo pipefail
cd "$(dirname "$0")/.."

smoke=0
list=0
out=docs/perf/gpu_check.md
for arg in "$@"; do
  case "$arg" in
    --smoke) smoke=1 ;;
    --list) list=1 ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $arg" >&2; exit 2 ;;
    *) out=$arg ;;
  esac
done

if [[ -n "${PYTHON:-}" ]]; then py=$PYTHON
elif [[ -x .venv/bin/python ]]; then py=.venv/bin/python
else py=python3
fi

if (( list )); then
  if (( smoke )); then exec "$py" scripts/gpu_check.py --list --smoke; fi
  exec "$py" scripts/gpu_check.py --list
fi

bench_args=()
robustness_args=()
conformance_args=(--isolate)  # on a GPU a faulting kernel kills its worker, not the run
engine_args=(--device cuda)
if (( smoke )); then
  export HETERO_TRITON_INTERPRET=1
  bench_args+=(--smoke --reps 1)  # interpreted timings prove the script runs, not how fast: one run each
  # GPU_CHECK_SMOKE_OPS: time only these ops (the tests: every kernel already runs in interpreted conformance)
  if [[ -n "${GPU_CHECK_SMOKE_OPS:-}" ]]; then bench_args+=(--ops "$GPU_CHECK_SMOKE_OPS"); fi
  conformance_args=(--quick --ops rms_norm,silu_and_mul)
  robustness_args=(--ops write_kv,grouped_gemm)
  engine_args=(--quick --device cpu --configs hetero-torch --requests 2 --max-tokens 4)
fi

mkdir -p "$(dirname "$out")"
base=${out%.md}
echo "== conformance: hetero conformance cuda ${conformance_args[*]:-}"
"$py" -m hetero.cli conformance cuda "${conformance_args[@]}" --json "$base.conformance.json" --markdown "$base.conformance.md"
conformance_rc=$?

echo "== robustness: hetero conformance cuda --robustness ${robustness_args[*]:-} (validation on, then off)"
"$py" -m hetero.cli conformance cuda --robustness "${robustness_args[@]}" --json "$base.robustness.json" --markdown "$base.robustness.md"
robustness_rc=$?
"$py" -m hetero.cli conformance cuda --robustness --no-validate "${robustness_args[@]}" --json "$base.robustness-off.json" --markdown "$base.robustness-off.md"
(( robustness_rc |= $? ))

echo "== timing every op -> $out"
"$py" scripts/gpu_check.py "${bench_args[@]}" --conformance "$base.conformance.json" "$out"
bench_rc=$?

echo "== torch backend conformance: hetero conformance torch ${conformance_args[*]:-}"
"$py" -m hetero.cli conformance torch "${conformance_args[@]}" --json "$base.torch-conformance.json" --markdown "$base.torch-conformance.md"
torch_rc=$?

engine_out="$(dirname "$out")/gpu_engine.md"
echo "== engine side by side: benchmarks/engine_vs_vllm.py ${engine_args[*]} -> $engine_out"
"$py" benchmarks/engine_vs_vllm.py "${engine_args[@]}" --markdown "$engine_out" --json "${engine_out%.md}.json"
engine_rc=$?

echo "== conformance exit $conformance_rc, robustness exit $robustness_rc, timing exit $bench_rc," \
  "torch conformance exit $torch_rc, engine exit $engine_rc; reports: $out, $engine_out"
(( conformance_rc == 0 && robustness_rc == 0 && bench_rc == 0 && torch_rc == 0 && engine_rc == 0 ))
