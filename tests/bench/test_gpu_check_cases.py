"""scripts/gpu_check.py's cases without a GPU: every op of the spec has one, the smoke cases build on the
CPU and bind to the spec's signature, and the reference runs them; ``--list`` prints them. (The whole
script runs end to end, interpreted, in tests/kernels/test_backends.py::test_gpu_check_smoke.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hetero.registry import default_registry
from hetero.spec import OP_NAMES, OPS

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
TIMED = set(OP_NAMES) - {"ep_dispatch", "ep_combine"}  # collectives: not timed on one GPU


@pytest.fixture
def cases(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import gpu_check_cases

    return gpu_check_cases


def test_every_op_has_a_case_and_files_stay_small(cases):
    for sizes in (cases.SMOKE, cases.FULL):
        assert {b.op for b in cases.benches(sizes)} == TIMED
    names = [f"{b.op} {b.case}" for b in cases.benches(cases.FULL)]
    assert len(names) == len(set(names)), "case names repeat"
    for want in (
        "indexer_topk decode B64 KV32768 Hi64 D128 top2048",
        "indexer_topk deepseek-v4 csa m4 decode B64 KV32768 Hi64 D128 top512",
        "route deepseek-v4 T8192 E256 sqrtsoftplus",
        "route deepseek-v4 T8192 E256 hash (fixed_ids)",
        "mla_attention dsa decode B64 KV32768",
        "mla_attention hy4 H32 sinks dsa decode B64 KV32768 top2048",
        "mla_attention hy4 H32 sinks decode B64 KV4096",
        "fused_moe gpt-oss-20b swigluoai+bias T256 E32 top4 H2880 I2880",
        "layer_norm T8192 H128",
        "paged_attention gpt-oss Hq64 Hkv8 D64 window128 sinks decode",
        "quantize_activation deepseek-v3 T4096 K7168 group128 fp8 ue8m0",
        "quantize_activation deepseek-v3 T4096 K7168 per-token int8",
        "scaled_grouped_gemm deepseek-v3 T4096 gate_up 128-blocks E256 rows32768 N4096 K7168",
        "scaled_grouped_gemm deepseek-v3 T4096 gate_up row-wise E256 rows32768",
        "fused_moe deepseek-v3 fp8 128-blocks T256 E256 top8 H7168 I2048",
        "kv_compress deepseek-v4 csa m4 D512 decode B64 L4096",
        "kv_compress deepseek-v4 hca m128 D512 chunked-prefill 8x2048",
        "compressed_attention deepseek-v4-flash H64 hca m128 decode B64 L4096",
        "compressed_attention deepseek-v4-pro H128 csa m4 top512 decode B64 L4096",
        "gemm kimi-k2 gate_up W4A16 g32 T4096 N4096 K7168",  # spec 1.9: packed int4
        "gemm qwen3-30b-a3b gate_up W4A16 g128 zp T1",
        "grouped_gemm kimi-k2 EP8 gate_up W4A16 g32 E48 rows4096",
        "fused_moe kimi-k2 W4A16 g32 T256 E384 top8 H7168 I2048",
        "fused_moe qwen3-30b-a3b W4A16 g128 zp T1 E128 top8 H2048 I768",
        "rejection_sample qwen3 V151936 B64 k4 mixed",  # spec 1.10
        "gated_delta_rule spec-verify B64 k3 H16 K128 HV32 V128 per-token slots",  # spec 1.11
        "causal_conv1d spec-verify B64 k3 C8192 W4",
    ):
        assert any(n.startswith(want) for n in names), want
    for path in SCRIPTS.glob("gpu_check*.py"):
        assert len(path.read_text().splitlines()) <= 300, path.name


def test_smoke_cases_bind_and_run_on_the_reference(cases):
    ref = default_registry().entry("cpu_ref").cls("cpu")
    torch.manual_seed(0)
    for bench in cases.benches(cases.SMOKE):
        inputs, flops, nbytes = bench.make(torch.device("cpu"))
        OPS[bench.op].signature.bind(**inputs)
        assert flops >= 0 and nbytes > 0, bench.case
        getattr(ref, bench.op)(**inputs)  # raises OpError on a malformed case


def test_sparse_indices_are_what_indexer_topk_returns(cases):
    import gpu_check_attention as attn

    idx = attn.sparse_indices([3, 1], [5, 9], 4, "cpu")
    assert idx.dtype == torch.int32 and idx.shape == (4, 4)
    for row, pos in zip(idx.tolist(), [2, 3, 4, 8]):
        kept = [j for j in row if j >= 0]
        assert len(kept) == len(set(kept)) == min(4, pos + 1) and all(j <= pos for j in kept)
        assert row[len(kept) :] == [-1] * (4 - len(kept))


def test_rel_err_compares_row_sets_as_sets(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import gpu_check

    got, want = torch.tensor([[3, 1, -1], [0, 2, 5]]), torch.tensor([[1, -1, 3], [5, 0, 2]])
    assert gpu_check.rel_err(got, want, "indexer_topk") == 0.0
    assert gpu_check.rel_err(got.float(), want.float(), "gemm") > 0


def test_list_prints_every_case():
    for extra in ([], ["--smoke"]):
        res = subprocess.run(
            [sys.executable, str(SCRIPTS / "gpu_check.py"), "--list", *extra],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        listed = {line.split()[0] for line in res.stdout.splitlines() if line.strip()}
        assert listed == TIMED


def test_torch_scaled_grouped_mm_arguments_mean_the_same_product(cases):
    """The side-by-side call's arguments, read as torch._scaled_grouped_mm's 2d x 3d row-wise form (rows of group g,
    up to offs[g], times mat_b[g] [K, N], scaled by scale_a per row and scale_b[g] per column), give the reference's
    product; off a GPU the section says it was skipped."""
    import gpu_check_quant as quant

    bench = next(b for b in quant.quant_benches(cases.SMOKE) if quant.VENDOR_CASE in b.case)
    inputs, _, _ = bench.make(torch.device("cpu"))
    t = quant.torch_grouped_args(inputs)
    assert t["mat_b"].shape[1:] == inputs["b"].shape[:0:-1] and t["offs"].dtype == torch.int32
    out, start = torch.zeros(t["mat_a"].shape[0], t["mat_b"].shape[2], dtype=torch.float64), 0
    for g, end in enumerate(t["offs"].tolist()):
        a = t["mat_a"][start:end].double() * t["scale_a"][start:end, None].double()
        out[start:end] = a @ (t["mat_b"][g].double() * t["scale_b"][g][None, :].double())
        start = end
    want = default_registry().entry("cpu_ref").cls("cpu").scaled_grouped_gemm(**inputs)
    torch.testing.assert_close(out.to(want.dtype), want, atol=1e-2, rtol=1e-2)
    assert "skipped" in quant.vendor_section(cases.SMOKE, None, None, torch.device("cpu"))
