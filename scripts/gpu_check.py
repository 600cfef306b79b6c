#!/usr/bin/env python3
"""Time every hetero op of a backend on realistic shapes and write a Markdown table.

    python scripts/gpu_check.py [--smoke] [--backend cuda] [--conformance REPORT.json] [OUT.md]
    python scripts/gpu_check.py --list [--smoke]     # the cases and their roofline, nothing run

Each op runs through ``hetero.load(backend)`` (the bound implementation: a vendor path where the
backend has one), through the backend's Triton kernel when that differs, and through the torch
reference (cpu_ref's functions on the same device tensors). Ops that take index tensors are also
timed with validation on (``hetero.load(backend, validate=True)``: a device-to-host read of the
indices per call) beside validation off, the default on a GPU. Times are medians of
``triton.testing.do_bench`` on a GPU. The roofline of a case is max(bytes / 4.3 TB/s, flops /
790 TFLOP/s) (1580 TFLOP/s for fp8 and int8), the H200's measured copy bandwidth and dense bf16
rate. The row-wise fp8 scaled_grouped_gemm case is also timed beside torch._scaled_grouped_mm,
in a separate section (scripts/gpu_check_quant.py). ``--smoke`` runs one tiny case per op through
Triton's interpreter on the CPU (HETERO_TRITON_INTERPRET=1), timed with time.perf_counter since
do_bench needs a GPU driver: it checks that the script works, not how fast anything is. Exit 1 when an op raised.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hetero.spec.validate import VALIDATORS

HBM_BYTES_PER_S = 4.3e12
BF16_FLOPS = 790e12
PEAK = {"float8_e4m3fn": 2 * BF16_FLOPS, "float8_e4m3fnuz": 2 * BF16_FLOPS, "int8": 2 * BF16_FLOPS}
DEFAULT_OUT = "docs/perf/gpu_check.md"


@dataclass
class Row:
    op: str
    case: str
    dtype: str
    impl: str = ""
    hetero_ms: float | None = None
    kernel_ms: float | None = None
    ref_ms: float | None = None
    validated_ms: float | None = None
    roof_ms: float | None = None
    bound: str = ""
    rel_err: float | None = None
    error: str = ""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default=DEFAULT_OUT, help=f"Markdown file to write (default {DEFAULT_OUT})")
    p.add_argument("--smoke", action="store_true", help="tiny shapes through the Triton interpreter on the CPU")
    p.add_argument("--backend", default="cuda", help="backend to time (default cuda)")
    p.add_argument(
        "--conformance", metavar="JSON", help="a `hetero conformance --json` report to summarise in the header"
    )
    p.add_argument("--ops", default="", help="only these ops (comma-separated)")
    p.add_argument("--reps", type=int, default=3, help="perf_counter repetitions off a GPU (default 3)")
    p.add_argument(
        "--list", action="store_true", help="list the cases with their bytes, flops and roofline; run nothing"
    )
    return p.parse_args(argv)


def make_timer(device, reps: int) -> tuple[str, Callable[[Callable[[], Any]], float]]:
    """(description, timer returning milliseconds)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return "triton.testing.do_bench, median (ms)", lambda fn: float(do_bench(fn, return_mode="median"))

    def median_ms(fn: Callable[[], Any]) -> float:
        fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    return (
        f"time.perf_counter, median of {reps} runs on the CPU (ms; triton.testing.do_bench needs a GPU driver)",
        median_ms,
    )


def _first(out: Any):
    return out[0] if isinstance(out, (tuple, list)) else out


def rel_err(got: Any, want: Any, op: str = "") -> float | None:
    """Relative L2 error of the first output against the reference's (None for in-place ops); an output
    compared as a set per row (indexer_topk's indices) is sorted along its rows first."""
    from hetero.spec import OPS

    got, want = _first(got), _first(want)
    if got is None or want is None:
        return None
    got, want = got.detach().double(), want.detach().double()
    if op in OPS and OPS[op].returns and OPS[op].returns[0].compare == "row_set":
        got, want = got.sort(dim=-1).values, want.sort(dim=-1).values
    denom = float(want.norm())
    return float((got - want).norm()) / denom if denom > 0 else float((got - want).norm())


def kernel_of(backend: Any, op: str) -> Callable | None:
    """The backend's Triton kernel for ``op`` when a vendor path is bound over it, else None."""
    if op not in getattr(backend, "vendor_paths", {}):
        return None
    return getattr(type(backend), op).__get__(backend)


def roofline(bench: Any, flops: float, nbytes: float) -> tuple[float, str]:
    """(roofline ms, "memory" or "compute")."""
    mem_s, flop_s = nbytes / HBM_BYTES_PER_S, flops / PEAK.get(bench.dtype, BF16_FLOPS)
    return max(mem_s, flop_s) * 1e3, "memory" if mem_s >= flop_s else "compute"


def fresh_copies(op: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` with the tensors ``op`` writes in place cloned, so the reference starts from the state the op saw
    (a recurrent op's output depends on the state it reads)."""
    from hetero.spec import OPS

    written = {m.name for m in OPS[op].mutates} if op in OPS else set()
    return {k: v.clone() if k in written and hasattr(v, "clone") else v for k, v in inputs.items()}


def run_bench(bench: Any, ops: Any, vops: Any, ref: Any, timer: Callable, device) -> Row:
    row = Row(bench.op, bench.case, bench.dtype, impl=ops.explain()[bench.op].implementation)
    try:
        inputs, flops, nbytes = bench.make(device)
        row.roof_ms, row.bound = roofline(bench, flops, nbytes)
        fn, ref_fn, kernel = getattr(ops, bench.op), getattr(ref, bench.op), kernel_of(ops.backend, bench.op)
        ref_inputs = fresh_copies(bench.op, inputs)
        out = fn(**inputs)
        row.rel_err = rel_err(out, ref_fn(**ref_inputs), bench.op)
        row.hetero_ms = timer(lambda: fn(**inputs))
        row.kernel_ms = timer(lambda: kernel(**inputs)) if kernel is not None else None
        row.ref_ms = timer(lambda: ref_fn(**inputs))
        if bench.op in VALIDATORS:
            row.validated_ms = timer(lambda: getattr(vops, bench.op)(**inputs))
    except Exception as e:  # report and go on: one broken op must not hide the others
        row.error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    return row


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _ratio(num: float | None, den: float | None, pct: bool = False) -> str:
    if num is None or den is None or den <= 0:
        return "-"
    return f"{100 * num / den:.1f}%" if pct else f"{num / den:.2f}x"


def _conformance_line(path: str | None) -> str:
    if not path:
        return "- conformance: not run"
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        return f"- conformance: no report at `{path}` ({type(e).__name__})"
    s = report.get("summary", {})
    counts = ", ".join(
        f"{s[k]} {k}" for k in ("pass", "fail", "error", "skipped", "fallback", "crashed", "timeout") if s.get(k)
    )
    command = report.get("run", {}).get("command", "hetero conformance")
    return f"- conformance: `{command}`: {s.get('total', 0)} cases: {counts}; {'OK' if s.get('ok') else 'FAILED'}"


def markdown(rows: list[Row], head: dict[str, str], interpreted: bool) -> str:
    lines = [f"# hetero GPU check: {head['backend']} on {head['device']}", ""]
    lines += [f"- {k}: {v}" for k, v in head.items() if k not in ("backend", "device")]
    if interpreted:
        lines += [
            "- **interpreted**: the Triton kernels ran in Triton's interpreter on the CPU (HETERO_TRITON_INTERPRET=1) "
            "with tiny shapes; the times and the roofline columns say nothing about GPU speed"
        ]
    lines += [
        "- roofline: max(bytes / 4.3 TB/s, flops / 790 TFLOP/s bf16 or 1580 TFLOP/s fp8 / int8), the H200's ceilings;"
        " *of roofline* = roofline time / hetero time",
        "",
        "- validate on / off: the op's time with `hetero.load(backend, validate=True)` over validation off's",
        "",
        "| op | case | dtype | implementation | hetero ms | Triton kernel ms | torch ref ms | roofline ms | bound "
        "| of roofline | vs ref | validate on / off | rel err vs ref |",
        "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        err = "-" if r.rel_err is None else f"{r.rel_err:.2e}"
        hetero = f"error: {r.error}" if r.error else _ms(r.hetero_ms)
        lines.append(
            f"| {r.op} | {r.case} | {r.dtype} | `{r.impl}` | {hetero} | {_ms(r.kernel_ms)} | {_ms(r.ref_ms)} | "
            f"{_ms(r.roof_ms)} | {r.bound} | {_ratio(r.roof_ms, r.hetero_ms, pct=True)} | "
            f"{_ratio(r.ref_ms, r.hetero_ms)} | "
            f"{_ratio(r.validated_ms, r.hetero_ms)} | {err} |"
        )
    return "\n".join(lines) + "\n"


def header(args: argparse.Namespace, ops: Any, timing: str) -> dict[str, str]:
    import torch

    from hetero.registry import default_registry

    avail = default_registry().availability(args.backend)
    details = dict(avail.details)
    return {
        "backend": args.backend,
        "device": avail.device_name or str(ops.device),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "versions": f"torch {torch.__version__}, triton {details.get('triton', _triton_version())}",
        "arch": str(details.get("arch", "")),
        "vendor paths": str(getattr(ops.backend, "vendor_off", None) or "on"),
        "timing": timing,
        "shapes": "smoke (tiny)" if args.smoke else "full (realistic)",
        "conformance": _conformance_line(args.conformance).removeprefix("- conformance: "),
    }


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except Exception:
        return "not importable"


def list_cases(cases: Any, sizes: Any, wanted: set[str]) -> int:
    """Print every case with its bytes, flops and roofline, drawn on the meta device (no memory, no kernel);
    a case whose inputs need real values (block tables, expert ids) shows "-"."""
    import torch

    for bench in cases.benches(sizes):
        if wanted and bench.op not in wanted:
            continue
        try:
            _, flops, nbytes = bench.make(torch.device("meta"))
            roof, bound = roofline(bench, flops, nbytes)
            numbers = f"{nbytes / 2**20:12.1f} MiB {flops / 1e9:12.2f} GFLOP {roof:10.4g} ms {bound}"
        except Exception:  # noqa: BLE001  (listing only)
            numbers = "-"
        print(f"{bench.op:18} {bench.case:55} {bench.dtype:14} {numbers}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        os.environ["HETERO_TRITON_INTERPRET"] = "1"  # before Triton is first imported
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpu_check_cases as cases

    if args.list:
        return list_cases(
            cases, cases.SMOKE if args.smoke else cases.FULL, {o.strip() for o in args.ops.split(",") if o.strip()}
        )

    import hetero
    from hetero.registry import default_registry

    ops, vops = hetero.load(args.backend, validate=False), hetero.load(args.backend, validate=True)
    ref = default_registry().entry("cpu_ref").cls(ops.device)
    timing, timer = make_timer(ops.device, args.reps)
    wanted = {o.strip() for o in args.ops.split(",") if o.strip()}
    rows, timed = [], set()
    for bench in cases.benches(cases.SMOKE if args.smoke else cases.FULL):
        if (wanted and bench.op not in wanted) or (args.smoke and bench.op in timed):  # smoke: one case per op
            continue
        timed.add(bench.op)
        rows.append(r := run_bench(bench, ops, vops, ref, timer, ops.device))
        print(f"{r.op:18} {r.case:55} {r.error or _ms(r.hetero_ms) + ' ms'}", flush=True)
        if ops.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, header(args, ops, timing), getattr(ops.backend, "interpreted", False))
    if not wanted or "scaled_grouped_gemm" in wanted:
        import gpu_check_quant

        text += gpu_check_quant.vendor_section(cases.SMOKE if args.smoke else cases.FULL, ops, timer, ops.device)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}")
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
