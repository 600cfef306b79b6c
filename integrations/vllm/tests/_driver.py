"""Runs one vLLM engine over the test workload and writes its greedy tokens and top-k logprobs as JSON.

Usage: python _driver.py MODEL_DIR OUT.json [--compiled] [--dtype D] [--hetero-backend NAME]
Whether hetero routes the layers is the environment's business (HETERO_VLLM,
HETERO_BACKEND, HETERO_VLLM_PLATFORM, HETERO_VLLM_REPORT), so the same script gives
the stock reference; ``--hetero-backend`` passes vLLM's
``additional_config={"hetero_backend": NAME}``. The output names the vLLM platform class.
The workload: prompts of 9 to 100 tokens over block size 32 (several blocks),
``max_num_batched_tokens=64`` (chunked prefill), then a second batch that shares a
64-token prefix with the first (a prefix-cache hit, where vLLM keeps prefix caching on for the model:
its CPU platform turns it off for MLA without AMX).
"""

from __future__ import annotations

import argparse
import json
import os
import random

TOP_K = 5
MAX_TOKENS = 12


def prompts(vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """(first batch, second batch): token-id prompts; the second batch reuses the first's 64-token prefix."""
    rng = random.Random(0)
    prefix = [rng.randrange(1, vocab) for _ in range(64)]
    first = [[rng.randrange(1, vocab) for _ in range(n)] for n in (9, 40, 100)] + [prefix + [5, 6, 7]]
    second = [prefix + [rng.randrange(1, vocab) for _ in range(n)] for n in (3, 30)]
    return first, second


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--hetero-backend", default="", help="additional_config's hetero_backend")
    parser.add_argument("--custom-ops", default="", help="comma-separated compilation_config.custom_ops additions")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    extra = {}
    if args.hetero_backend:
        extra["additional_config"] = {"hetero_backend": args.hetero_backend}
    if args.custom_ops:
        extra["compilation_config"] = {"custom_ops": ["all", *args.custom_ops.split(",")]}

    llm = LLM(
        model=args.model,
        skip_tokenizer_init=True,
        dtype=args.dtype,
        enforce_eager=not args.compiled,
        block_size=32,
        max_model_len=256,
        max_num_batched_tokens=64,
        max_num_seqs=8,
        enable_prefix_caching=True,
        seed=0,
        **extra,
    )
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=TOP_K, ignore_eos=True)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    caching = llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    results = []
    for i, batch in enumerate(prompts(vocab)):
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        missed = caching and not all((o.num_cached_tokens or 0) >= 32 for o in outs)
        if i == 1 and missed:  # the workload is not what it says
            raise SystemExit(f"the second batch missed the prefix cache: {[o.num_cached_tokens for o in outs]}")
        for out in outs:
            seq = out.outputs[0]
            logprobs = [{str(t): lp.logprob for t, lp in step.items()} for step in seq.logprobs]
            results.append({"tokens": list(seq.token_ids), "logprobs": logprobs})
    with open(args.out, "w") as f:
        platform = f"{type(current_platform).__module__}.{type(current_platform).__qualname__}"
        mode = llm.llm_engine.vllm_config.compilation_config.mode  # vLLM may turn compilation off by itself
        json.dump({"pid": os.getpid(), "platform": platform, "compilation": mode.name, "sequences": results}, f)


if __name__ == "__main__":
    main()
