"""fused_moe on the CPU: hetero-torch's native expert GEMM against its grouped-GEMM path, and vLLM's
``cpu_fused_moe`` where a vLLM venv exists, side by side in one run.

    .venv/bin/python benchmarks/moe_cpu.py [--shape engine|qwen3-30b-a3b] [--tokens 1,8,32,64,512,2048]
        [--vllm-python .venv-vllm/bin/python]

Shapes: ``engine``, the engine benchmark's tiny MoE layer (benchmarks/vllm_route.py: 8 experts, top-2,
hidden 512, expert intermediate 384, float32); ``qwen3-30b-a3b``, one Qwen3-30B-A3B layer (128
experts, top-8, hidden 2048, intermediate 768, bfloat16: a decode step reads each touched expert's
9.4 MB from memory). Each cell is the mean time of one call (routing not included) after warm-up;
vLLM's weights are prepacked once as its CPU MoE layer does (AMX kernels where the CPU has AMX).
Both hetero paths are checked against the float64 reference (the engine shape) or against each
other (the Qwen3 shape, whose float64 experts would take 4.8 GB) at every size. The native column
times the kernel at every size; "fused_moe runs" says which path the op picks there (on a build
without brgemm tiles, bf16 calls past BF16_MAX_PAIRS_PER_EXPERT go to the grouped GEMMs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

#: name -> (experts, hidden, intermediate, top-k, dtype)
SHAPES = {
    "engine": (8, 512, 384, 2, torch.float32),
    "qwen3-30b-a3b": (128, 2048, 768, 8, torch.bfloat16),
}
ROOT = Path(__file__).resolve().parents[1]

_VLLM = """
import json, sys, time, torch
import vllm._custom_ops as ops
import vllm.platforms  # loads vLLM's CPU ops
E, H, I, k, dtype = {E}, {H}, {I}, {k}, torch.{dtype}
isa = "amx" if dtype == torch.bfloat16 and torch.cpu._is_amx_tile_supported() else "vec"
if isa == "amx":
    torch._C._cpu._init_amx()  # the process's permission to use AMX tiles, as vLLM's worker asks
torch.manual_seed(0)
w13, w2 = (torch.randn(E, 2 * I, H) / H ** 0.5).to(dtype), (torch.randn(E, H, I) / I ** 0.5).to(dtype)
p13, p2 = ops.cpu_prepack_moe_weight(w13, isa), ops.cpu_prepack_moe_weight(w2, isa)
out = {{}}
for t in {tokens}:
    x = torch.randn(t, H).to(dtype)
    w, ids = torch.randn(t, E).softmax(-1).topk(k)
    w, ids = (w / w.sum(-1, keepdim=True)).float(), ids.to(torch.int32)
    y = torch.empty_like(x)
    call = lambda: ops.cpu_fused_moe(y, x, p13, p2, None, None, w, ids, "silu", isa)
    for _ in range(3): call()
    n, start = 0, time.perf_counter()
    while n < 5 or time.perf_counter() - start < 1.0:
        call(); n += 1
    out[t] = (time.perf_counter() - start) / n * 1e6
print(json.dumps(out))
"""


def per_call(fn) -> float:
    """Mean microseconds of one call over at least 5 calls and 1 s, after 3 untimed."""
    for _ in range(3):
        fn()
    n, start = 0, time.perf_counter()
    while n < 5 or time.perf_counter() - start < 1.0:
        fn()
        n += 1
    return (time.perf_counter() - start) / n * 1e6


def hetero_times(shape: str, tokens: list[int]) -> dict[int, tuple[float, float, bool]]:
    """{tokens: (native us, grouped us, whether fused_moe takes the native kernel at that size)}, the
    kernel timed at every size; checked against the float64 reference or each other."""
    import hetero
    import hetero_torch._moe_native as moe_native
    import hetero_torch.moe as moe

    experts, hidden, inter, top_k, dtype = SHAPES[shape]
    ops, ref = hetero.load("torch", validate=False), hetero.load("cpu_ref")
    gen = torch.Generator().manual_seed(0)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(dtype)
    native = moe.native_fused_moe
    out = {}
    for t in tokens:
        x = torch.randn(t, hidden, generator=gen).to(dtype)
        w, ids = ref.route(torch.randn(t, experts, generator=gen), top_k=top_k)
        if dtype == torch.float32:
            want, tol = ref.fused_moe(x.double(), w13.double(), w2.double(), w.double(), ids), 2e-5
        else:
            moe.native_fused_moe = lambda *a: None
            want, tol = ops.fused_moe(x, w13, w2, w, ids).double(), 3e-2
        times, shipped = [], moe_native.BF16_MAX_PAIRS_PER_EXPERT
        takes = native(x, w13, w2, w, ids, "silu", 1.702, None, None, None) is not None
        moe_native.BF16_MAX_PAIRS_PER_EXPERT = float("inf")  # the kernel at every size, not only where it is picked
        for path in (native, lambda *a: None):  # the second declines, so the grouped GEMMs run
            moe.native_fused_moe = path
            torch.testing.assert_close(ops.fused_moe(x, w13, w2, w, ids).double(), want, atol=tol, rtol=tol)
            times.append(per_call(lambda: ops.fused_moe(x, w13, w2, w, ids)))
        moe.native_fused_moe, moe_native.BF16_MAX_PAIRS_PER_EXPERT = native, shipped
        out[t] = (times[0], times[1], takes)
    return out


def vllm_times(python: str, shape: str, tokens: list[int]) -> dict[int, float] | str:
    """{tokens: us} from vLLM's cpu_fused_moe, or why not."""
    if not Path(python).exists():
        return f"no vLLM python at {python}"
    experts, hidden, inter, top_k, dtype = SHAPES[shape]
    code = _VLLM.format(E=experts, H=hidden, I=inter, k=top_k, dtype=str(dtype).split(".")[1], tokens=tokens)
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
    return {int(t): us for t, us in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="engine")
    p.add_argument("--tokens", default="1,8,32,64,512,2048", help="comma-separated token counts")
    p.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    args = p.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",")]
    from hetero_torch._moe_native import extension

    module, why = extension()
    if module is None:
        print(f"the native expert GEMM is not available here: {why}")
        return 1
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    ours = hetero_times(args.shape, tokens)
    theirs = vllm_times(args.vllm_python, args.shape, tokens)
    if isinstance(theirs, str):
        print(f"vLLM skipped: {theirs}")
        theirs = {}
    cols = ["tokens", "native us", "grouped us", "grouped / native", "fused_moe runs", "vLLM cpu_fused_moe us"]
    print("| " + " | ".join([*cols, "vLLM / native"]) + " |")
    print("| ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for t in tokens:
        nat, grouped, takes = ours[t]
        v = theirs.get(t)
        vcells = f"{v:.0f} | {v / nat:.2f}x" if v else "- | -"
        runs = "native" if takes else "grouped"
        print(f"| {t} | {nat:.0f} | {grouped:.0f} | {grouped / nat:.2f}x | {runs} | {vcells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
