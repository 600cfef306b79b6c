"""Device ceilings (peak dense TFLOP/s per dtype, HBM TB/s) for the roofline column of ``hetero bench``.

The built-in table holds vendor datasheet peaks (dense, no structured sparsity).
Datasheet peaks are rarely reached: measured ceilings (a long bf16 GEMM, a
device-to-device copy) make a truer roofline; give them with ``--ceilings
FILE.json`` or the environment variable ``HETERO_BENCH_CEILINGS=FILE.json``::

    {"name": "H200 (measured)", "tflops": {"bfloat16": 790}, "tb_s": 4.3, "source": "bf16 GEMM and copy on one H200"}

Keys given override the built-in entry of the device (the others are kept); on
a device without an entry the file alone defines the ceilings. dtype keys:
bfloat16, float16, float8, int8, float32.
"""

from __future__ import annotations

import json
import os
import platform
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import torch

from hetero.bench.model import Work

__all__ = [
    "Ceilings",
    "CeilingsError",
    "DEVICES",
    "ENV_VAR",
    "dtype_class",
    "find_ceilings",
    "load_ceilings",
    "device_label",
    "roofline",
    "override_from_env",
]

ENV_VAR = "HETERO_BENCH_CEILINGS"
_CLASSES = ("bfloat16", "float16", "float8", "int8", "float32")


@dataclass(frozen=True)
class Ceilings:
    """Peak dense TFLOP/s per dtype class and HBM bandwidth in TB/s (10^12 bytes/s) of one device."""

    name: str
    tflops: Mapping[str, float] = field(default_factory=dict)
    tb_s: float | None = None
    source: str = ""


class CeilingsError(ValueError):
    """A ceilings file that cannot be used."""


# (pattern matched against the device name, ceilings). Dense figures: the datasheets print
# the 2:4-sparsity numbers too (twice these), which no op here can use.
DEVICES: tuple[tuple[str, Ceilings], ...] = (
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): BF16/FP16 1,979 TFLOPS and FP8 3,958 TFLOPS
    # "with sparsity" (dense: half), INT8 3,958 TOPS with sparsity, FP32 67 TFLOPS, 4.8 TB/s HBM3e.
    (
        r"H200",
        Ceilings(
            "NVIDIA H200 SXM",
            {"bfloat16": 989.5, "float16": 989.5, "float8": 1979.0, "int8": 1979.0, "float32": 67.0},
            4.8,
            "NVIDIA H200 datasheet (dense = sparse / 2)",
        ),
    ),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): same tensor cores as H200, 3.35 TB/s HBM3.
    (
        r"H100",
        Ceilings(
            "NVIDIA H100 SXM",
            {"bfloat16": 989.5, "float16": 989.5, "float8": 1979.0, "int8": 1979.0, "float32": 67.0},
            3.35,
            "NVIDIA H100 datasheet, SXM5 (dense = sparse / 2)",
        ),
    ),
    # AMD Instinct MI300X data sheet: peak FP16/BF16 1,307.4 TFLOPS, FP8 2,614.9 TFLOPS, INT8 2,614.9 TOPS
    # (dense; sparsity doubles them), FP32 matrix 163.4 TFLOPS, 5.3 TB/s HBM3.
    (
        r"MI300X",
        Ceilings(
            "AMD Instinct MI300X",
            {"bfloat16": 1307.4, "float16": 1307.4, "float8": 2614.9, "int8": 2614.9, "float32": 163.4},
            5.3,
            "AMD Instinct MI300X data sheet",
        ),
    ),
    # Huawei publishes no per-chip 910B datasheet and the 910B1-B4 bins differ. Commonly reported for the
    # 910B: FP16/BF16 ~280 TFLOPS, 64 GB HBM2e at ~1.6 TB/s, no FP8. Prefer measured values (--ceilings).
    (
        r"910B",
        Ceilings(
            "Huawei Ascend 910B",
            {"bfloat16": 280.0, "float16": 280.0},
            1.6,
            "third-party reports (no Huawei per-chip datasheet): measure and override",
        ),
    ),
)


def dtype_class(dtype: str) -> str:
    """The ceilings key of a dtype name: float8_e4m3fn and float8_e4m3fnuz are "float8"."""
    return "float8" if dtype.startswith("float8") else dtype


def _positive(value: Any, what: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise CeilingsError(f"{path}: {what} must be a positive number, not {value!r}")
    return float(value)


def load_ceilings(path: str | Path) -> dict[str, Any]:
    """Read and check a ceilings override file (see the module docstring for the format)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CeilingsError(f"cannot read ceilings from {path}: {e}") from None
    if not isinstance(doc, dict) or not set(doc) <= {"name", "tflops", "tb_s", "source"}:
        raise CeilingsError(f"{path}: expected an object with keys name, tflops, tb_s, source")
    tflops = doc.get("tflops", {})
    if not isinstance(tflops, dict) or not set(tflops) <= set(_CLASSES):
        raise CeilingsError(f"{path}: 'tflops' must map some of {', '.join(_CLASSES)} to TFLOP/s")
    out: dict[str, Any] = {"tflops": {k: _positive(v, f"tflops.{k}", str(path)) for k, v in tflops.items()}}
    if "tb_s" in doc:
        out["tb_s"] = _positive(doc["tb_s"], "tb_s", str(path))
    out["name"], out["source"] = str(doc.get("name", "")), str(doc.get("source", f"measured ({path})"))
    return out


def find_ceilings(device_name: str, override: Mapping[str, Any] | None = None) -> tuple[Ceilings | None, str]:
    """(ceilings, "") for a known device or an override; (None, reason) otherwise."""
    base = next((c for pattern, c in DEVICES if re.search(pattern, device_name, re.IGNORECASE)), None)
    if override is None:
        if base is None:
            known = ", ".join(c.name for _, c in DEVICES)
            return None, (
                f"no ceilings known for '{device_name}' (built in: {known}); "
                f"give measured ones with --ceilings FILE.json or {ENV_VAR}"
            )
        return base, ""
    if base is None:
        base = Ceilings(override.get("name") or device_name)
    tflops = {**base.tflops, **override.get("tflops", {})}
    if not tflops and override.get("tb_s", base.tb_s) is None:
        return None, "the ceilings override gives neither tflops nor tb_s"
    return replace(
        base,
        name=override.get("name") or f"{base.name} (overridden)",
        tflops=tflops,
        tb_s=override.get("tb_s", base.tb_s),
        source=override.get("source") or base.source,
    ), ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_label(device: torch.device, reported: str = "") -> str:
    """ "type/name" of the device a benchmark ran on: the baseline key and the ceilings lookup.

    A CPU carries torch's thread count: timings taken with other thread counts do not compare.
    """
    if device.type == "cpu":
        threads = torch.get_num_threads()
        return f"cpu/{_cpu_model()} ({threads} thread{'' if threads == 1 else 's'})"
    return f"{device.type}/{reported or device.type}"


def roofline(w: Work, seconds: float, dtype: str, ceilings: Ceilings | None) -> tuple[float | None, str]:
    """(fraction of the roofline bound reached, "") or (None, reason).

    The bound is the larger of flops / peak TFLOP/s of the dtype and bytes /
    bandwidth; a dtype without a peak is bounded by bandwidth alone.
    """
    if ceilings is None:
        return None, "device ceilings unknown"
    peak = ceilings.tflops.get(dtype_class(dtype))
    compute = w.flops / (peak * 1e12) if peak and w.flops else 0.0
    memory = w.bytes / (ceilings.tb_s * 1e12) if ceilings.tb_s else 0.0
    if compute == 0.0 and memory == 0.0:
        return None, f"no {dtype_class(dtype)} peak and no bandwidth for {ceilings.name}"
    if seconds <= 0:
        return None, "no time measured"
    return max(compute, memory) / seconds, ""


def override_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The ceilings file named by HETERO_BENCH_CEILINGS, if set."""
    value = (os.environ if env is None else env).get(ENV_VAR, "").strip()
    return value or None
