"""The cuda and rocm backend packages on a machine without a GPU.

Probes say precisely why they cannot run (a CPU build of torch, a CUDA build with
no device, a HIP build), and under HETERO_TRITON_INTERPRET=1 that they run
interpreted; supports() declines with reasons per architecture; tuning tables
fall back to the portable defaults; vendor paths are bound only on real GPUs
(faked here by patching torch.cuda; their numbers are checked in
test_backends_vendor.py); the interpreted conformance runs every op through the
Triton kernels; scripts/gpu_check.sh --smoke runs end to end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hetero.kernels.tuning import INTERPRETER, PORTABLE_DEFAULTS
from hetero.ops import Ops
from hetero.registry import Registry
from hetero.spec import OP_NAMES, OPS

pytest.importorskip("hetero_cuda.plugin", reason="hetero-cuda is not installed (make installs it)")
pytest.importorskip("hetero_rocm.plugin", reason="hetero-rocm is not installed (make installs it)")
from hetero_cpu_ref import gemm as ref_gemm  # noqa: E402
from hetero_cuda import vendor as cuda_vendor  # noqa: E402
from hetero_cuda.plugin import CudaBackend  # noqa: E402
from hetero_rocm.plugin import RocmBackend  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRITON_METHODS = "hetero.kernels.backend.TritonBackend."


@pytest.fixture
def no_interpreter(monkeypatch):
    monkeypatch.delenv("HETERO_TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("HETERO_CUDA_VENDOR", raising=False)
    monkeypatch.delenv("HETERO_ROCM_VENDOR", raising=False)


def fake_build(monkeypatch, *, cuda=None, hip=None, devices=0):
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: devices > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)


def fake_gpu(monkeypatch, *, capability=(9, 0), gfx="gfx942:sramecc+:xnack-", name="NVIDIA H200", hip=None):
    """Pretend torch is a CUDA (or HIP) build with one device of this capability / gfx arch."""
    fake_build(monkeypatch, cuda=None if hip else "12.8", hip=hip, devices=1)
    props = SimpleNamespace(total_memory=141 * 2**30, multi_processor_count=132, gcnArchName=gfx)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)


def explain(backend) -> dict[str, str]:
    return {op: info.implementation for op, info in Ops(backend, None, {}).explain().items()}


# ----------------------------------------------------------------------------- probes


def test_probes_on_a_cpu_build_of_torch(no_interpreter, monkeypatch):
    fake_build(monkeypatch)
    cuda, rocm = CudaBackend.probe(), RocmBackend.probe()
    assert not cuda.ok and cuda.reason.startswith("torch was built without CUDA")
    assert not rocm.ok and rocm.reason.startswith("torch was built without ROCm")


def test_probes_on_builds_without_a_device(no_interpreter, monkeypatch):
    fake_build(monkeypatch, cuda="12.8")
    assert CudaBackend.probe().reason.startswith("no CUDA device visible (torch")
    assert "a CUDA 12.8 build" in RocmBackend.probe().reason
    fake_build(monkeypatch, hip="6.4.1")
    assert RocmBackend.probe().reason.startswith("no ROCm (HIP) device visible")
    assert (
        "ROCm (HIP 6.4.1) build" in CudaBackend.probe().reason and "use the rocm backend" in CudaBackend.probe().reason
    )


def test_probes_with_a_device(no_interpreter, monkeypatch):
    fake_gpu(monkeypatch, capability=(9, 0))
    avail = CudaBackend.probe()
    assert avail.ok and avail.device_name == "NVIDIA H200"
    assert (
        avail.details["arch"] == "sm90"
        and avail.details["compute_capability"] == "9.0"
        and avail.details["tuning"] == "sm90"
    )
    fake_gpu(monkeypatch, capability=(7, 0), name="Tesla V100")
    assert CudaBackend.probe().reason == "Tesla V100 is sm70; Triton needs sm75+"
    fake_gpu(monkeypatch, hip="6.4.1", name="AMD Instinct MI300X")
    avail = RocmBackend.probe()
    assert avail.ok and avail.details["arch"] == "gfx942" and avail.details["fp8"] == "float8_e4m3fnuz"


def test_probes_under_the_interpreter():
    for cls in (CudaBackend, RocmBackend):
        avail = cls.probe()
        assert avail.ok and "interpreted" in avail.reason and avail.details["arch"] == "interpreter"


def _backends_json(env: dict[str, str]) -> dict[str, dict]:
    out = subprocess.run(
        [sys.executable, "-m", "hetero.cli", "backends", "--json"], env=env, capture_output=True, text=True, check=True
    )
    return {row["name"]: row for row in json.loads(out.stdout)["backends"]}


def test_hetero_backends_command():
    env = {k: v for k, v in os.environ.items() if k not in ("HETERO_TRITON_INTERPRET", "TRITON_INTERPRET")}
    plain = _backends_json(env)
    assert plain["cuda"]["status"] == plain["rocm"]["status"] == "unavailable"
    assert plain["cuda"]["reason"].startswith("torch was built without CUDA") or plain["cuda"]["reason"].startswith(
        "no CUDA device visible"
    )
    assert plain["rocm"]["reason"].startswith("torch was built without ROCm") or plain["rocm"]["reason"].startswith(
        "no ROCm (HIP) device"
    )
    interpreted = _backends_json({**env, "HETERO_TRITON_INTERPRET": "1"})
    for name in ("cuda", "rocm"):
        row = interpreted[name]
        assert row["status"] == "available" and "interpreted" in row["reason"] and row["fallback_ops"] == []
        assert row["priority"] == 100


def test_registry_loads_both_under_the_interpreter():
    registry = Registry()
    for name in ("cuda", "rocm"):
        ops = registry.load(name)
        assert ops.device.type == "cpu" and ops.backend.dist_backend == "nccl" and ops.backend.device_type == "cuda"
        assert all(impl.startswith(TRITON_METHODS) for impl in explain(ops.backend).values())


# ----------------------------------------------------------------------------- supports


def _cuda_on(capability):
    backend = CudaBackend(torch.device("meta"))
    backend.capability = capability
    return backend


def _rocm_on(gfx):
    backend = RocmBackend(torch.device("meta"))
    backend.gfx = gfx
    return backend


def test_cuda_supports_dtypes_per_capability():
    sm75, sm80, sm90 = _cuda_on((7, 5)), _cuda_on((8, 0)), _cuda_on((9, 0))
    assert sm75.supports("gemm", dtype="bfloat16") == "bfloat16 needs sm80+, this device is sm75"
    assert sm75.supports("gemm", dtype=torch.float16) is None
    assert sm80.supports("paged_attention", dtype=torch.bfloat16, head_dim=128, block_size=16) is None
    assert (
        sm80.supports("scaled_gemm", dtype="float8_e4m3fn")
        == "float8_e4m3fn needs sm89+ (fp8 tensor cores), this device is sm80"
    )
    assert sm80.supports("scaled_gemm", dtype="int8") is None
    assert sm90.supports("scaled_gemm", dtype="float8_e4m3fn") is None
    assert (
        sm90.supports("scaled_gemm", dtype="float8_e4m3fnuz")
        == "float8_e4m3fnuz is AMD's fp8 (MI300); sm90 uses float8_e4m3fn"
    )
    assert (
        sm90.supports("gemm", dtype="float8_e4m3fn")
        == "gemm takes floating tensors; float8_e4m3fn operands go through scaled_gemm"
    )
    assert "no float64" in sm90.supports("gemm", dtype="float64")
    assert sm90.supports("rms_norm", dtype="float64") is None


def test_supports_shape_limits():
    for backend in (_cuda_on((9, 0)), _rocm_on("gfx942")):
        assert (
            backend.supports("paged_attention", dtype="bfloat16", head_dim=640, head_dim_v=640, block_size=16)
            == "head_dim 640 > 576 unsupported by the Triton paged_attention kernel"
        )
        assert backend.supports("mla_attention", dtype="bfloat16", head_dim=576, head_dim_v=512, block_size=1) is None
        assert backend.supports("write_kv", head_dim=128, block_size=0).startswith("block_size 0")
        assert (
            backend.supports("fused_moe", dtype="bfloat16", activation="gelu")
            == "the fused_moe kernel applies silu, swigluoai, swiglu_clamp, not 'gelu'"
        )


def test_rocm_supports_fp8_per_arch():
    fn, fnuz = "float8_e4m3fn", "float8_e4m3fnuz"
    gfx942, gfx950, gfx90a = _rocm_on("gfx942"), _rocm_on("gfx950"), _rocm_on("gfx90a")
    assert gfx942.supports("scaled_gemm", dtype=fnuz) is None
    assert (
        gfx942.supports("scaled_gemm", dtype=fn) == "float8_e4m3fn is OCP fp8; gfx942 (MI300) computes float8_e4m3fnuz"
    )
    assert gfx950.supports("scaled_gemm", dtype=fn) is None and gfx950.supports("scaled_gemm", dtype=fnuz) is None
    assert gfx90a.supports("scaled_gemm", dtype=fn).startswith("gfx90a (MI200) has no fp8 matrix instructions")
    assert gfx90a.supports("scaled_gemm", dtype="int8") is None and gfx90a.supports("gemm", dtype="bfloat16") is None
    # spec 1.4: the quantized grouped GEMM and fused_moe's fp8 experts follow scaled_gemm; the quantizer is integer
    # arithmetic, so it writes either fp8 flavour anywhere
    assert (
        gfx942.supports("scaled_grouped_gemm", dtype=fn)
        == "float8_e4m3fn is OCP fp8; gfx942 (MI300) computes float8_e4m3fnuz"
    )
    assert gfx942.supports("scaled_grouped_gemm", dtype=fnuz) is None
    assert gfx942.supports("fused_moe", dtype="bfloat16", quant_dtype=fn).startswith("float8_e4m3fn is OCP fp8")
    assert gfx942.supports("fused_moe", dtype="bfloat16", quant_dtype="int8") is None
    assert gfx942.supports("quantize_activation", dtype="bfloat16", quant_dtype=fn) is None
    assert gfx942.supports("quantize_activation", dtype="bfloat16", quant_dtype="float16").startswith(
        "the quantize_activation kernels"
    )


def test_supports_under_the_interpreter():
    cuda, rocm = CudaBackend(), RocmBackend()
    assert cuda.capability is None and rocm.gfx is None
    assert cuda.supports("scaled_gemm", dtype="float8_e4m3fn") is None
    assert (
        cuda.supports("scaled_gemm", dtype="float8_e4m3fnuz")
        == "float8_e4m3fnuz is AMD's fp8 (MI300); NVIDIA GPUs use float8_e4m3fn"
    )
    assert (
        rocm.supports("scaled_gemm", dtype="float8_e4m3fn") is None
        and rocm.supports("scaled_gemm", dtype="float8_e4m3fnuz") is None
    )
    assert cuda.supports("gemm", dtype="bfloat16") is None
    assert cuda.supports("scaled_grouped_gemm", dtype="float8_e4m3fnuz").startswith("float8_e4m3fnuz is AMD's fp8")
    assert cuda.supports("scaled_grouped_gemm", dtype="bfloat16").startswith("scaled_grouped_gemm takes float8_e4m3fn")
    assert cuda.supports("quantize_activation", dtype="float32", quant_dtype="float8_e4m3fnuz") is None


def test_resolve_records_the_reason(no_interpreter, monkeypatch):
    fake_gpu(monkeypatch, capability=(7, 5), name="Tesla T4")
    backend = CudaBackend(torch.device("cuda"))
    ops = Ops(backend, SimpleNamespace(gemm=ref_gemm.gemm), {})
    assert ops.resolve("gemm", dtype=torch.bfloat16) is ref_gemm.gemm
    assert ops.explain()["gemm"].reasons == [
        "backend declined (dtype=torch.bfloat16): bfloat16 needs sm80+, this device is sm75"
    ]


# ----------------------------------------------------------------------------- tuning


def test_tuning_tables():
    cuda, rocm = CudaBackend.tuning, RocmBackend.tuning
    assert set(cuda.archs) == {"sm80", "sm90"} and set(rocm.archs) == {"gfx90a", "gfx942", "gfx950"}
    assert cuda.get("sm90", "gemm")["BLOCK_N"] == 256 and cuda.get("sm90", "gemm")["num_warps"] == 8
    assert cuda.get("sm86", "gemm") == dict(PORTABLE_DEFAULTS["gemm"])  # unknown arch: the portable defaults
    assert cuda.get("sm90", "no_such_kernel") == {}
    assert rocm.get("gfx942", "gemm")["matrix_instr_nonkdim"] == 16 and rocm.get("gfx942", "gemm")["waves_per_eu"] == 2
    assert rocm.get("gfx1100", "paged_attention") == dict(PORTABLE_DEFAULTS["paged_attention"])
    for table in (cuda, rocm):
        for arch, kernels in table.archs.items():
            assert set(kernels) <= set(PORTABLE_DEFAULTS), f"{arch} tunes a kernel the defaults do not know"
            for kernel, params in kernels.items():
                assert set(PORTABLE_DEFAULTS[kernel]) <= set(params) | {"GROUP_M"}, (
                    f"{arch}/{kernel} misses a default key"
                )
        interp = table.get("interpreter", "gemm")
        assert all(interp[k] == v for k, v in INTERPRETER["gemm"].items())


def test_backends_bind_their_arch(no_interpreter, monkeypatch):
    fake_gpu(monkeypatch, capability=(12, 0), name="RTX 5090")
    sm120 = CudaBackend(torch.device("cuda"))
    assert sm120.tune.arch == "sm120" and sm120.tune("gemm") == dict(PORTABLE_DEFAULTS["gemm"])
    fake_gpu(monkeypatch, hip="6.4.1", gfx="gfx950")
    gfx950 = RocmBackend(torch.device("cuda"))
    assert gfx950.tune.arch == "gfx950" and gfx950.tune("gemm")["BLOCK_N"] == 256
    assert CudaBackend(torch.device("meta")).tune.arch == "meta"


# ----------------------------------------------------------------------------- vendor paths


def test_explain_shows_vendor_paths_only_on_real_gpus(no_interpreter, monkeypatch):
    assert all(impl.startswith(TRITON_METHODS) for impl in explain(CudaBackend(torch.device("meta"))).values())
    fake_gpu(monkeypatch, capability=(9, 0))
    impls = explain(CudaBackend(torch.device("cuda")))
    assert impls["gemm"] == "hetero_cuda.vendor.cublas_gemm"
    assert impls["grouped_gemm"] == "hetero_cuda.vendor.torch_grouped_gemm"
    assert impls["scaled_gemm"] == "hetero_cuda.vendor.torch_scaled_gemm"
    assert impls["scaled_grouped_gemm"] == "hetero_cuda.vendor.torch_scaled_grouped_gemm"
    expected_varlen = (
        "hetero_cuda.vendor.flash_attn_varlen"
        if cuda_vendor._flash_attn_varlen_func()
        else TRITON_METHODS + "varlen_attention"
    )
    assert impls["varlen_attention"] == expected_varlen
    assert impls["paged_attention"] == TRITON_METHODS + "paged_attention"
    backend = CudaBackend(torch.device("cuda"))
    assert {op: OPS[op].check_signature(fn) for op, fn in backend.vendor_paths.items()} == dict.fromkeys(
        backend.vendor_paths
    )
    fake_gpu(monkeypatch, capability=(8, 0), name="NVIDIA A100")
    sm80 = CudaBackend(torch.device("cuda"))
    assert set(sm80.vendor_paths) <= {"gemm", "varlen_attention"}  # no fp8, no CUTLASS grouped GEMM before sm89/sm90
    monkeypatch.setenv("HETERO_CUDA_VENDOR", "0")
    off = CudaBackend(torch.device("cuda"))
    assert off.vendor_off == "HETERO_CUDA_VENDOR=0" and all(i.startswith(TRITON_METHODS) for i in explain(off).values())


def test_rocm_vendor_paths(no_interpreter, monkeypatch):
    fake_gpu(monkeypatch, hip="6.4.1", gfx="gfx942:sramecc+:xnack-")
    backend = RocmBackend(torch.device("cuda"))
    assert backend.gfx == "gfx942"
    impls = explain(backend)
    assert (
        impls["gemm"] == "hetero_rocm.vendor.hipblaslt_gemm"
        and impls["scaled_gemm"] == "hetero_rocm.vendor.torch_scaled_gemm"
    )
    assert all(OPS[op].check_signature(fn) is None for op, fn in backend.vendor_paths.items())
    fake_gpu(monkeypatch, hip="6.4.1", gfx="gfx90a")
    assert "scaled_gemm" not in RocmBackend(torch.device("cuda")).vendor_paths  # MI200: no fp8
    monkeypatch.setenv("HETERO_ROCM_VENDOR", "0")
    assert RocmBackend(torch.device("cuda")).vendor_paths == {}


# ----------------------------------------------------------------------------- end to end, interpreted


def _interpreted_env() -> dict[str, str]:
    return {**os.environ, "HETERO_TRITON_INTERPRET": "1", "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize("backend", ["cuda", "rocm"])
def test_interpreted_conformance_runs_every_op_natively(backend, tmp_path):
    """`hetero conformance NAME --quick` through the Triton interpreter: exit 0 and no op on the fallback. Under the
    interpreter both vendors run the same portable kernels with the same tiles, and their ``supports()`` differ only
    in the fp8 encodings (cuda declines e4m3fnuz): cuda's quick run covers every op, rocm's every e4m3fnuz case of
    the full catalog (the cases only rocm runs), and rocm's table binds every op to its kernels."""
    from hetero.kernels.limits import QUANT_OPS

    fp8_ops = sorted({*QUANT_OPS, "quantize_activation", "fused_moe"})
    only = ["--quick"] if backend == "cuda" else ["-k", "fnuz"]
    report = tmp_path / f"{backend}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "hetero.cli", "conformance", backend, *only, "--json", str(report)],
        env=_interpreted_env(),
        capture_output=True,
        text=True,
        timeout=3600,
        cwd=ROOT,
    )
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    cases = json.loads(report.read_text())["cases"]
    fallback = sorted({c["op"] for c in cases if c["status"] == "fallback"})
    failing = [
        f"{c['id']}: {c['status']}: {c['message'][:200]}" for c in cases if c["status"] not in ("pass", "skipped")
    ]
    assert not fallback, f"ops on the reference fallback: {fallback}"
    assert proc.returncode == 0, "\n".join(failing) or proc.stderr[-3000:]
    every = set(OP_NAMES) - {"ep_dispatch", "ep_combine"}  # collectives: multi-process conformance
    assert {c["op"] for c in cases} == (every if backend == "cuda" else set(fp8_ops))
    if backend == "rocm":
        code = (
            "import hetero; print(sorted(k for k, v in hetero.load('rocm').explain().items() if v.origin != 'backend'))"
        )
        bound = subprocess.run([sys.executable, "-c", code], env=_interpreted_env(), capture_output=True, text=True)
        assert bound.stdout.strip() == "[]", bound.stdout + bound.stderr[-2000:]
    skipped = {c["id"]: c["message"] for c in cases if c["status"] == "skipped"}
    if backend == "cuda":  # only AMD's fp8 is declined (fused_moe's cases name their weights "fnuz" in the shape)
        assert all("fnuz" in case_id for case_id in skipped), skipped
    else:
        assert not skipped, skipped


def test_gpu_check_smoke(tmp_path):
    """scripts/gpu_check.sh --smoke: conformance on a few ops, then ops timed on tiny shapes, Markdown written.
    Four ops are timed (a norm, a GEMM, attention, and the fp8 grouped GEMM with the vendor section): every
    kernel already runs interpreted in test_interpreted_conformance_runs_every_op_natively, and every smoke
    case binds and runs on the reference in tests/bench/test_gpu_check_cases.py."""
    out = tmp_path / "perf" / "gpu_check.md"
    timed = {"rms_norm", "gemm", "paged_attention", "scaled_grouped_gemm"}
    env = {**_interpreted_env(), "PYTHON": sys.executable, "GPU_CHECK_SMOKE_OPS": ",".join(sorted(timed))}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--smoke", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "**interpreted**" in text and "time.perf_counter" in text and "| error:" not in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| op ")]
    assert {row.split(" | ")[0].removeprefix("| ") for row in rows} >= timed
    assert (out.parent / "gpu_check.conformance.json").exists()
