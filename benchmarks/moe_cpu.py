"""fused_moe on the CPU: hetero-torch's native expert GEMM against its grouped-GEMM path, and vLLM's
``cpu_fused_moe`` where a vLLM venv exists, side by side in one run.

    .venv/bin/python benchmarks/moe_cpu.py [--tokens 1,8,32,64,512,2048] [--vllm-python .venv-vllm/bin/python]

The engine benchmark's MoE layer (benchmarks/vllm_route.py: 8 experts, top-2, hidden 512, expert
intermediate 384, float32). Each cell is the mean time of one call (routing not included) after
warm-up; vLLM's weights are prepacked once as its CPU MoE layer does. Both hetero paths are
checked against the float64 reference at every size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

EXPERTS, HIDDEN, INTER, TOP_K = 8, 512, 384, 2
ROOT = Path(__file__).resolve().parents[1]

_VLLM = """
import json, sys, time, torch
import vllm._custom_ops as ops
import vllm.platforms  # loads vLLM's CPU ops
E, H, I, k = {E}, {H}, {I}, {k}
torch.manual_seed(0)
w13, w2 = torch.randn(E, 2 * I, H) / H ** 0.5, torch.randn(E, H, I) / I ** 0.5
p13, p2 = ops.cpu_prepack_moe_weight(w13, "vec"), ops.cpu_prepack_moe_weight(w2, "vec")
out = {{}}
for t in {tokens}:
    x = torch.randn(t, H)
    w, ids = torch.randn(t, E).softmax(-1).topk(k)
    w, ids = (w / w.sum(-1, keepdim=True)).float(), ids.to(torch.int32)
    y = torch.empty_like(x)
    call = lambda: ops.cpu_fused_moe(y, x, p13, p2, None, None, w, ids, "silu", "vec")
    for _ in range(5): call()
    n = max(50, 8000 // t); start = time.perf_counter()
    for _ in range(n): call()
    out[t] = (time.perf_counter() - start) / n * 1e6
print(json.dumps(out))
"""


def per_call(fn, tokens: int) -> float:
    """Mean microseconds of one call, after 5 untimed."""
    for _ in range(5):
        fn()
    n = max(50, 8000 // tokens)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def hetero_times(tokens: list[int]) -> dict[int, tuple[float, float]]:
    """{tokens: (native us, grouped us)}, each checked against the float64 reference."""
    import hetero
    import hetero_torch.moe as moe

    ops, ref = hetero.load("torch", validate=False), hetero.load("cpu_ref")
    gen = torch.Generator().manual_seed(0)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) / HIDDEN**0.5
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) / INTER**0.5
    native = moe.native_fused_moe
    out = {}
    for t in tokens:
        x = torch.randn(t, HIDDEN, generator=gen)
        w, ids = ref.route(torch.randn(t, EXPERTS, generator=gen), top_k=TOP_K)
        want = ref.fused_moe(x.double(), w13.double(), w2.double(), w.double(), ids)
        times = []
        for path in (native, lambda *a: None):  # the second declines, so the grouped GEMMs run
            moe.native_fused_moe = path
            torch.testing.assert_close(ops.fused_moe(x, w13, w2, w, ids).double(), want, atol=2e-5, rtol=2e-5)
            times.append(per_call(lambda: ops.fused_moe(x, w13, w2, w, ids), t))
        moe.native_fused_moe = native
        out[t] = (times[0], times[1])
    return out


def vllm_times(python: str, tokens: list[int]) -> dict[int, float] | str:
    """{tokens: us} from vLLM's cpu_fused_moe, or why not."""
    if not Path(python).exists():
        return f"no vLLM python at {python}"
    code = _VLLM.format(E=EXPERTS, H=HIDDEN, I=INTER, k=TOP_K, tokens=tokens)
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
    return {int(t): us for t, us in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    ours = hetero_times(tokens)
    theirs = vllm_times(args.vllm_python, tokens)
    if isinstance(theirs, str):
        print(f"vLLM skipped: {theirs}")
        theirs = {}
    print("| tokens | native us | grouped us | grouped / native | vLLM cpu_fused_moe us | vLLM / native |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in tokens:
        nat, grouped = ours[t]
        v = theirs.get(t)
        vcells = f"{v:.0f} | {v / nat:.2f}x" if v else "- | -"
        print(f"| {t} | {nat:.0f} | {grouped:.0f} | {grouped / nat:.2f}x | {vcells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
