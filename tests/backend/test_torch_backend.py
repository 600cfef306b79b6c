"""The ``torch`` backend (backends/torch): conformance's full tier and robustness tier, and what it
leaves to the reference."""

from __future__ import annotations

import json

import pytest
import torch

import hetero
from hetero.cli import main

pytest.importorskip("hetero_torch")

#: the ops the torch backend does not implement yet: the reference runs them (reported as fallback)
FALLBACK: set[str] = set()


def test_full_tier_passes_and_only_the_listed_ops_fall_back():
    """The full tier, as ``hetero conformance torch`` runs it; and, against the same oracle run of each case
    (one float64 run serves both backends), the reference itself meets every full case's tolerances (its
    quick cases: tests/conformance/test_planted_bugs.py::test_reference_passes_every_quick_case)."""
    from hetero.registry import default_registry
    from hetero_conformance.cases import catalog
    from hetero_conformance.runner import Runner

    oracle, cache = default_registry().entry("cpu_ref").cls(), {}
    torch_runner = Runner(hetero.load("torch"), oracle, cache=cache)
    ref_runner = Runner(hetero.load("cpu_ref"), oracle, cache=cache)
    quick = {c.id for c in catalog(quick=True)}
    cases, reference_bad = [], []
    for case in catalog():
        r = torch_runner.run(case)
        cases.append({"op": case.op, "status": r.status, "id": case.id, "message": r.message})
        if case.id not in quick:
            ref = ref_runner.run(case)
            if ref.status != "pass":
                reference_bad.append((case.id, ref.status, ref.message))
        cache.clear()  # inputs and outputs at real-model shapes: one case's at a time
    assert reference_bad == []
    collectives = {"ep_dispatch", "ep_combine"}  # in the multi-rank tier (--world-size), not this catalog
    assert {c["op"] for c in cases if c["status"] == "fallback"} == FALLBACK - collectives
    assert [c for c in cases if c["op"] not in FALLBACK and c["status"] != "pass"] == []
    passing = {c["op"] for c in cases if c["status"] == "pass"}
    assert len(passing) == len(hetero.spec.OP_NAMES) - len(FALLBACK | collectives)
    assert set(type(hetero.load("torch").backend).native_ops()) | FALLBACK == set(hetero.spec.OP_NAMES)


def test_expert_parallel_ops_pass_the_multi_rank_tier(tmp_path):
    out = tmp_path / "world.json"
    assert main(["conformance", "torch", "--world-size", "2", "--quick", "--timeout", "60", "--json", str(out)]) == 0
    cases = json.loads(out.read_text())["cases"]
    assert {c["op"] for c in cases} >= {"ep_dispatch+ep_combine"}
    assert all(c["status"] == "pass" for c in cases), [c for c in cases if c["status"] != "pass"]


@pytest.mark.parametrize("validate", [[], ["--no-validate"]])
def test_every_malformed_call_is_rejected(validate):
    """With or without the index-content checks: the ops check what they index with themselves."""
    assert main(["conformance", "torch", "--robustness", *validate]) == 0


def test_unwritten_cache_slots_never_reach_the_output():
    """A fresh KV cache may hold anything (NaN here) past a sequence's length; masking the scores alone would
    still let NaN values through the softmax-weighted sum."""
    ops = hetero.load("torch")
    gen = torch.Generator().manual_seed(0)
    k, v = (torch.full((6, 4, 2, 16), float("nan")) for _ in range(2))
    lens, table = [5, 3], [[0, 1], [2, 3]]
    for b, n in enumerate(lens):
        for pos in range(n):
            k[table[b][pos // 4], pos % 4] = torch.randn(2, 16, generator=gen)
            v[table[b][pos // 4], pos % 4] = torch.randn(2, 16, generator=gen)
    meta = hetero.AttentionMeta.build([2, 1], lens, table)
    q = torch.randn(3, 4, 16, generator=gen)
    out = ops.paged_attention(q, k, v, meta, scale=0.25)
    ref = hetero.load("cpu_ref").paged_attention(q, k, v, meta, scale=0.25)
    assert torch.isfinite(out).all() and torch.allclose(out, ref, atol=1e-5)


def test_unwritten_compressed_entries_never_reach_the_indexer():
    """indexer_topk(compress_ratio=4) (spec 1.8) over a cache holding only the closed windows' entries (NaN
    elsewhere): a sequence of 3 tokens has none, padded groups read nothing past a sequence's entries."""
    gen = torch.Generator().manual_seed(1)
    cache = torch.full((5, 2, 16), float("nan"))
    lens, table = [3, 19, 13], [[4, 0, 1], [1, 2, 3], [0, 3, 2]]
    for b, n in enumerate(lens):
        for j in range(n // 4):
            cache[table[b][j // 2], j % 2] = torch.randn(16, generator=gen)
    meta = hetero.AttentionMeta.build([3, 1, 6], lens, table)
    q, w = torch.randn(10, 4, 16, generator=gen), torch.rand(10, 4, generator=gen)
    got = hetero.load("torch").indexer_topk(q, w, cache, meta, topk=3, compress_ratio=4)
    want = hetero.load("cpu_ref").indexer_topk(q, w, cache, meta, topk=3, compress_ratio=4)
    assert [sorted(r) for r in got.tolist()] == [sorted(r) for r in want.tolist()]
    assert got[:3].eq(-1).all() and got[4:].ne(-1).any()


def test_route_v4_options_match_the_reference():
    """route's spec 1.8 options: sqrtsoftplus with a bias, hash routing (ids given, order kept), a bad id refused."""
    gen = torch.Generator().manual_seed(2)
    logits, fixed = torch.randn(5, 64, generator=gen), torch.randperm(64, generator=gen)[:30].view(5, 6).int()
    ops, ref = hetero.load("torch"), hetero.load("cpu_ref")
    for kw in (dict(correction_bias=torch.randn(64, generator=gen) * 0.3), dict(fixed_ids=fixed)):
        got, want = (
            o.route(logits, top_k=6, scoring="sqrtsoftplus", routed_scaling_factor=1.5, **kw) for o in (ops, ref)
        )
        assert torch.equal(got[1], want[1]) and torch.allclose(got[0], want[0], rtol=1e-6, atol=1e-7)
    assert torch.equal(ops.route(logits, top_k=6, fixed_ids=fixed)[1], fixed)
    with pytest.raises(hetero.OpError, match="fixed_ids"):
        ops.route(logits, top_k=6, fixed_ids=fixed + 40)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_reused_weight_is_packed_once_and_repacked_when_it_changes(dtype):
    """gemm on a CPU float32 (or bfloat16, where oneDNN has a bf16 path) weight seen twice goes
    through its oneDNN-packed copy: the same product (float64 reference, rounded once), and an
    in-place update of the weight is seen, never a stale copy."""
    from hetero_torch import _gemm_packed
    from hetero_torch.gemm import gemm

    if dtype not in _gemm_packed.DTYPES:
        pytest.skip(f"oneDNN packing of {dtype} is off here (HETERO_TORCH_PACK_WEIGHTS=0, no mkldnn or no bf16 path)")
    gen = torch.Generator().manual_seed(0)
    k, n = 512, _gemm_packed.MIN_WEIGHT // 512  # the smallest weight it packs
    a, w, bias = (torch.randn(*shape, generator=gen).to(dtype) for shape in ((7, k), (n, k), (n,)))
    tol = 1e-4 if dtype == torch.float32 else 2.0**-8  # bf16: rounded once, half an ulp

    def check(x, packed):
        out = gemm(x, w, bias=bias)
        ref = x.double() @ w.double().T + bias.double()
        assert out.shape == ref.shape and out.dtype == dtype
        err = ((out.double() - ref).abs() / (ref.abs() + 1)).max().item() if ref.numel() else 0.0
        assert err < tol, f"rows {x.shape[0]}: max relative error {err} (packed: {packed})"
        assert (getattr(w, "_hetero_torch_packed")[1] is not None) == packed

    check(a, False)  # seen once: F.linear
    check(a, True)  # seen again: packed
    w.mul_(-2.0)  # a new version: seen once, then repacked
    check(a, False)
    check(a, True)
    check(a[:1], True)
    check(a[:0], True)
    # past ROW_STEP the row count is rounded up: a zero-padded copy here (no rows follow)
    check(torch.randn(_gemm_packed.ROW_STEP * 2 + 5, k, generator=gen).to(dtype), True)


def test_reused_expert_weights_are_packed_per_group():
    """grouped_gemm on a CPU float32 [G, N, K] seen twice runs one packed product per group that owns
    rows (an empty group and rows past the last end included): the float64 reference's result. Groups
    longer than ROW_STEP run rounded up, on the rows that follow (group 2) or a zero-padded copy (group 3)."""
    from hetero_torch import _gemm_packed
    from hetero_torch.gemm import grouped_gemm

    if not _gemm_packed.PACK_WEIGHTS:
        pytest.skip("oneDNN packing is off here (HETERO_TORCH_PACK_WEIGHTS=0 or no mkldnn)")
    gen = torch.Generator().manual_seed(0)
    assert _gemm_packed.ROW_STEP == 16  # the group sizes below straddle it
    a, b = torch.randn(60, 64, generator=gen), torch.randn(4, 48, 64, generator=gen)
    ends = torch.tensor([5, 5, 29, 52], dtype=torch.int32)
    ref = torch.zeros(60, 48, dtype=torch.float64)
    for g, (start, end) in enumerate(zip([0, 5, 5, 29], ends.tolist())):
        ref[start:end] = a[start:end].double() @ b[g].double().T
    for packed in (False, True):
        out = grouped_gemm(a, b, ends)
        assert (out.double() - ref).abs().max().item() < 1e-4
        assert isinstance(getattr(b, "_hetero_torch_packed")[1], list) == packed


def test_a_packed_weight_is_one_opaque_call_in_a_compiled_graph():
    """Under torch.compile, gemm on a weight it packs stays on the packed path, one opaque op (Inductor's
    own GEMM for it is MKL's on the plain layout, 2x slower at a decode step's rows): the float64
    reference's product, and the weight's packed copy made once and reused."""
    from hetero_torch import _gemm_packed
    from hetero_torch.gemm import gemm

    if torch.float32 not in _gemm_packed.DTYPES:
        pytest.skip("oneDNN packing is off here (HETERO_TORCH_PACK_WEIGHTS=0 or no mkldnn)")
    gen = torch.Generator().manual_seed(0)
    k, n = 512, _gemm_packed.MIN_WEIGHT // 512
    a, w = torch.randn(20, k, generator=gen), torch.randn(n, k, generator=gen)
    product = torch.compile(lambda x: gemm(x, w), fullgraph=True, dynamic=False)
    for _ in range(3):
        out = product(a)
    assert (out.double() - a.double() @ w.double().T).abs().max().item() < 1e-3
    key, packed = getattr(w, "_hetero_torch_packed")
    assert packed is not None and key[1] == w.data_ptr()


def test_the_backend_marks_constants_as_torch_does_without_importing_dynamo():
    """``hetero_torch._traced.constant_when_traced`` sets the mark ``torch.compiler.assume_constant_result``
    sets (a torch that marks otherwise fails here, not silently in a compiled graph), and an engine on this
    backend that never compiles does not pay for importing torch._dynamo."""
    import subprocess
    import sys

    from hetero_torch._traced import constant_when_traced

    def ours():
        return True

    def theirs():
        return True

    torch.compiler.assume_constant_result(theirs)
    assert constant_when_traced(ours) is ours and vars(ours) == vars(theirs) == {"_dynamo_marked_constant": True}
    code = (
        "import sys, hetero_torch._attention_native, hetero_torch._layers_native; print('torch._dynamo' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
