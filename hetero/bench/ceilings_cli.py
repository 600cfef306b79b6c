"""``hetero ceilings NAME``: measure a device's roofline ceilings and write them for ``--ceilings``.

Where no datasheet entry exists (a CPU, a new chip), ``hetero bench`` and ``hetero profile`` show
no roofline fraction. This measures the two ceilings on the backend's device with torch itself,
not with any backend's kernels: dense matmul TFLOP/s per float dtype (square products, the best
of several) and copy bandwidth (a large device-to-device copy, read + write bytes). The file it
writes is the format ``--ceilings`` / ``HETERO_BENCH_CEILINGS`` read.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from rich.console import Console

from hetero.errors import UsageError

__all__ = ["add_parser", "measure_ceilings"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _best(fn, device: torch.device, reps: int) -> float:
    from hetero.bench._timer import TimerConfig, measure

    return measure(fn, device, TimerConfig(warmup=2, reps=reps, min_time=0.0, max_reps=reps)).min


def measure_ceilings(
    device: torch.device, *, size: int, copy_mib: int, reps: int = 5, dtypes: tuple[str, ...] = tuple(_DTYPES)
) -> dict[str, Any]:
    """{"name", "tflops": {dtype: TFLOP/s}, "tb_s", "source"} measured on ``device`` (a [size, size] product
    per dtype, a ``copy_mib`` MiB copy)."""
    tflops = {}
    for name in dtypes:
        a = torch.randn(size, size, device=device).to(_DTYPES[name])
        b = torch.randn(size, size, device=device).to(_DTYPES[name])
        tflops[name] = 2 * size**3 / _best(lambda: torch.mm(a, b), device, reps) / 1e12
    src = torch.randn(copy_mib << 18, device=device)  # float32: 4 bytes each
    dst = torch.empty_like(src)
    tb_s = 2 * src.numel() * 4 / _best(lambda: dst.copy_(src), device, reps) / 1e12
    return {
        "name": "",
        "tflops": tflops,
        "tb_s": tb_s,
        "source": f"hetero ceilings: torch.mm {size}^3 per dtype and a {copy_mib} MiB copy, best of {reps}",
    }


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "ceilings",
        help="measure a device's matmul TFLOP/s and copy bandwidth for --ceilings",
        description="Measure dense matmul TFLOP/s (float32, bfloat16, float16) and copy bandwidth on the "
        "device of backend NAME with torch, and write them as a --ceilings file for "
        "hetero bench and hetero profile (where no datasheet entry exists, e.g. a CPU).",
    )
    p.add_argument("name", help="backend whose device is measured, e.g. cpu_ref or cuda")
    p.add_argument("--out", required=True, metavar="FILE.json", help="where to write the ceilings")
    p.add_argument("--size", type=int, default=None, help="matmul edge (default 1024 on a CPU, 8192 on a device)")
    p.add_argument(
        "--copy-mib", type=int, default=None, metavar="MIB", help="copy size (default 64 on a CPU, 1024 on a device)"
    )
    p.add_argument(
        "--dtypes",
        default="float32,bfloat16",
        help=f"comma-separated, of {', '.join(_DTYPES)} (default float32,bfloat16)",
    )
    p.set_defaults(func=_cmd_ceilings)


def _cmd_ceilings(args: argparse.Namespace, registry: Any, console: Console) -> int:
    from hetero.bench.devices import device_label, load_ceilings

    dtypes = tuple(d for d in args.dtypes.split(",") if d)
    bad = [d for d in dtypes if d not in _DTYPES]
    if bad or not dtypes:
        raise UsageError(f"argument --dtypes: expected some of {', '.join(_DTYPES)}, got {args.dtypes!r}")
    for option, value in (("--size", args.size), ("--copy-mib", args.copy_mib)):
        if value is not None and value < 1:
            raise UsageError(f"argument {option}: expected an integer >= 1, got {value}")
    device = registry.load(args.name).device
    cpu = device.type == "cpu"
    doc = measure_ceilings(
        device,
        size=args.size or (1024 if cpu else 8192),
        copy_mib=args.copy_mib or (64 if cpu else 1024),
        dtypes=dtypes,
    )
    doc["name"] = f"{device_label(device)} (measured)"
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    load_ceilings(args.out)  # the file reads back as --ceilings reads it
    shown = ", ".join(f"{k} {v:.3g} TFLOP/s" for k, v in doc["tflops"].items())
    console.print(f"{doc['name']}: {shown}, copy {doc['tb_s'] * 1e3:.3g} GB/s -> {args.out}", highlight=False)
    return 0
