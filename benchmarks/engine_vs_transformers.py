"""Throughput of the reference engine against transformers' generate, side by side in one run.

    .venv/bin/python benchmarks/engine_vs_transformers.py [--requests 64] [--layers 8] [--hidden 512]

Builds a tiny-but-not-trivial random Qwen3 checkpoint, draws N requests with
prompt lengths in [16, 128) and output lengths in [16, 128) (seeded), and times:
- hetero: ``LLM.generate`` over all requests (continuous batching, paged KV cache);
- transformers, one request at a time (``generate`` per request, KV cache on);
- transformers, all requests in one left-padded batch (static batching: the batch
  runs until its longest request is done; only each request's own tokens count).
Greedy, EOS ignored, float32 on the CPU. Prints output tokens per second and the ratios.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from hetero.tools.check import greedy_generation_config


def workload(n: int, vocab: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(16, 128, (n,), generator=gen).tolist()
    out_lens = torch.randint(16, 128, (n,), generator=gen).tolist()
    prompts = [torch.randint(3, vocab, (p,), generator=gen).tolist() for p in prompt_lens]
    return prompts, out_lens


def run_hetero(path, prompts, out_lens, backend):
    from hetero.engine import LLM, SamplingParams

    llm = LLM(str(path), backend=backend, dtype="float32", max_num_seqs=64, max_num_batched_tokens=2048)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in out_lens]
    llm.generate(prompts[:2], params[:2], progress=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params, progress=False)
    return sum(len(o.token_ids) for o in outs), time.perf_counter() - start


@torch.inference_mode()
def run_hf_sequential(model, prompts, out_lens):
    start = time.perf_counter()
    for p, m in zip(prompts, out_lens):
        model.generate(torch.tensor([p]), generation_config=greedy_generation_config(model, m))
    return sum(out_lens), time.perf_counter() - start


@torch.inference_mode()
def run_hf_batched(model, prompts, out_lens):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    model.generate(ids, attention_mask=mask, generation_config=greedy_generation_config(model, max(out_lens)))
    return sum(out_lens), time.perf_counter() - start


def main() -> None:
    import transformers

    from hetero.tools import tiny

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--backend", default="cpu_ref")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = tiny.build(
            "qwen3",
            d,
            shard_size=None,
            num_hidden_layers=args.layers,
            hidden_size=args.hidden,
            intermediate_size=3 * args.hidden,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            vocab_size=4096,
            max_position_embeddings=1024,
        )
        prompts, out_lens = workload(args.requests, 4096, args.seed)
        model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        rows = [
            ("hetero LLM.generate", *run_hetero(path, prompts, out_lens, args.backend)),
            ("transformers, one at a time", *run_hf_sequential(model, prompts, out_lens)),
            ("transformers, one padded batch", *run_hf_batched(model, prompts, out_lens)),
        ]
    base = rows[0][1] / rows[0][2]
    print(
        f"{args.requests} requests, {args.layers} layers, hidden {args.hidden}, torch threads {torch.get_num_threads()}"
    )
    print("| run | output tokens | seconds | tok/s | hetero / this |\n| --- | ---: | ---: | ---: | ---: |")
    for name, tokens, seconds in rows:
        rate = tokens / seconds
        print(f"| {name} | {tokens} | {seconds:.1f} | {rate:.1f} | {base / rate:.2f}x |")


if __name__ == "__main__":
    main()
