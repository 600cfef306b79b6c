"""The reference MoE ops (route, moe_permute, moe_unpermute, fused_moe) against independent formulations.

Oracles: Hugging Face transformers' routers (Qwen3-MoE, DeepSeek-V2, DeepSeek-V3),
a per-token float64 re-implementation of routing in plain Python, and per-token,
per-expert float64 loops for permutation and the expert MLP.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import hetero.spec
from hetero import OpError
from hetero_cpu_ref import moe as ref

transformers = pytest.importorskip("transformers")


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float64, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def randint(low: int, high: int, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.int32)


def raises(op: str, arg: str, fn, *args, **kwargs) -> OpError:
    with pytest.raises(OpError) as info:
        fn(*args, **kwargs)
    err = info.value
    assert (err.op, err.arg) == (op, arg), str(err)
    assert str(err).startswith(f"{op}: argument '{arg}'")
    return err


def by_id(ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ids sorted ascending, with their weights in the same order (compare as sets)."""
    order = ids.long().argsort(dim=-1)
    return ids.long().gather(1, order), weights.double().gather(1, order)


def assert_same_routing(weights, ids, hf_weights, hf_ids, atol=1e-6):
    """Same expert set per token, and the same weight for each expert."""
    got_ids, got_w = by_id(ids, weights)
    want_ids, want_w = by_id(hf_ids, hf_weights)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("name", ["route", "moe_permute", "moe_unpermute", "fused_moe"])
def test_signature_is_the_spec(name):
    spec = hetero.spec.OPS[name]
    fn = getattr(ref, name)
    assert spec.check_signature(fn) is None
    assert str(inspect.signature(fn)) == str(spec.signature)


# ---------------------------------------------------------------- route


def route_f64(
    logits,
    top_k,
    scoring="softmax",
    renormalize=True,
    n_group=1,
    topk_group=1,
    bias=None,
    factor=1.0,
    masked=-math.inf,
    group_top2=None,
):
    """Routing token by token in Python floats (float64): (weights [M][k], ids [M][k]).

    `masked` is the selection score given to experts of dropped groups: -inf
    (DeepSeek, vLLM, hetero) or 0.0 (some Hugging Face routers).
    """
    group_top2 = bias is not None if group_top2 is None else group_top2
    experts = logits.shape[1]
    size = experts // n_group
    all_w, all_ids = [], []
    for row in logits.double().tolist():
        if scoring == "softmax":
            peak = max(row)
            exps = [math.exp(v - peak) for v in row]
            scores = [e / sum(exps) for e in exps]
        else:
            scores = [1.0 / (1.0 + math.exp(-v)) for v in row]
        select = [s + (float(bias[e]) if bias is not None else 0.0) for e, s in enumerate(scores)]
        if n_group > 1:
            group_score = []
            for g in range(n_group):
                members = sorted(select[g * size : (g + 1) * size], reverse=True)
                group_score.append(members[0] + members[1] if group_top2 else members[0])
            kept = sorted(range(n_group), key=lambda g: -group_score[g])[:topk_group]
            select = [s if e // size in kept else masked for e, s in enumerate(select)]
        ids = sorted(range(experts), key=lambda e: -select[e])[:top_k]
        w = [scores[e] for e in ids]
        if renormalize:
            w = [v / sum(w) for v in w]
        all_w.append([v * factor for v in w])
        all_ids.append(ids)
    return torch.tensor(all_w, dtype=torch.float64).reshape(-1, top_k), torch.tensor(all_ids).reshape(-1, top_k)


ROUTE_CASES = {
    "qwen3-softmax": dict(top_k=4),
    "softmax-no-renorm": dict(top_k=3, renormalize=False, routed_scaling_factor=1.5),
    "deepseek-v3": dict(top_k=4, scoring="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.5),
    "deepseek-v2-group-max": dict(top_k=3, n_group=8, topk_group=3, renormalize=False, routed_scaling_factor=16.0),
    "sigmoid-bias-no-groups": dict(top_k=5, scoring="sigmoid"),
    "softmax-bias-groups": dict(top_k=2, n_group=2, topk_group=1),
}


@pytest.mark.parametrize("case", list(ROUTE_CASES))
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["float32", "bfloat16", "float64"]
)
def test_route_vs_float64_reimplementation(case, dtype):
    kw = dict(ROUTE_CASES[case])
    with_bias = case in ("deepseek-v3", "sigmoid-bias-no-groups", "softmax-bias-groups")
    if dtype == torch.bfloat16:  # distinct values on a bf16-exact grid: ties would make the ids ambiguous
        gen = torch.Generator().manual_seed(51)
        logits = torch.stack([torch.randperm(32, generator=gen) * 0.25 - 4.0 for _ in range(11)]).to(dtype)
    else:
        logits = randn(11, 32, seed=51, scale=2.0, dtype=dtype)
    bias = randn(32, seed=52, scale=0.3, dtype=torch.float32) if with_bias else None
    weights, ids = ref.route(logits, correction_bias=bias, **kw)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert weights.shape == ids.shape == (11, kw["top_k"])
    want_w, want_ids = route_f64(
        logits,
        kw["top_k"],
        kw.get("scoring", "softmax"),
        kw.get("renormalize", True),
        kw.get("n_group", 1),
        kw.get("topk_group", 1),
        bias,
        kw.get("routed_scaling_factor", 1.0),
    )
    assert torch.equal(ids.long(), want_ids)  # same experts in the same (descending) order
    torch.testing.assert_close(weights.double(), want_w, rtol=1e-6, atol=1e-7)


def test_route_noncontiguous_logits():
    logits = randn(32, 7, seed=55, dtype=torch.float32).T  # [7, 32], transposed strides
    bias = randn(32, seed=56, scale=0.3, dtype=torch.float32)
    weights, ids = ref.route(logits, top_k=4, scoring="sigmoid", n_group=4, topk_group=2, correction_bias=bias)
    want_w, want_ids = route_f64(logits, 4, "sigmoid", n_group=4, topk_group=2, bias=bias)
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights.double(), want_w, rtol=1e-6, atol=1e-7)


def test_route_no_tokens():
    weights, ids = ref.route(
        torch.zeros(0, 16), top_k=2, scoring="sigmoid", n_group=4, topk_group=2, correction_bias=torch.ones(16)
    )
    assert weights.shape == ids.shape == (0, 2) and weights.dtype == torch.float32 and ids.dtype == torch.int32


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_route_vs_hf_qwen3_moe(norm_topk_prob):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(
        hidden_size=32, moe_intermediate_size=16, num_experts=16, num_experts_per_tok=4, norm_topk_prob=norm_topk_prob
    )
    block = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        block.gate.weight.copy_(randn(16, 32, seed=61, scale=0.3, dtype=torch.float32))
        hidden = randn(13, 32, seed=62, dtype=torch.float32)
        logits, hf_w, hf_ids = block.gate(hidden)
    weights, ids = ref.route(logits, top_k=4, scoring="softmax", renormalize=norm_topk_prob)
    assert_same_routing(weights, ids, hf_w, hf_ids)


def hf_deepseek_v3_gate(norm_topk_prob: bool, bias: torch.Tensor, seed: int):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = DeepseekV3Config(
        hidden_size=32,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=norm_topk_prob,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    gate = DeepseekV3TopkRouter(cfg)
    with torch.no_grad():
        gate.weight.copy_(randn(16, 32, seed=seed, scale=0.3, dtype=torch.float32))
        gate.e_score_correction_bias.copy_(bias)
    return gate


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_route_vs_hf_deepseek_v3(norm_topk_prob):
    bias = randn(16, seed=71, scale=0.2, dtype=torch.float32)
    gate = hf_deepseek_v3_gate(norm_topk_prob, bias, seed=72)
    with torch.no_grad():
        logits, hf_w, hf_ids = gate(randn(13, 32, seed=73, dtype=torch.float32))
    weights, ids = ref.route(
        logits,
        top_k=4,
        scoring="sigmoid",
        renormalize=norm_topk_prob,
        n_group=4,
        topk_group=2,
        correction_bias=bias,
        routed_scaling_factor=2.5,
    )
    assert_same_routing(weights, ids, hf_w, hf_ids)


def test_route_dropped_groups_are_minus_inf_not_zero():
    """With scores + bias negative, a 0.0 mask would pick experts of dropped groups; -inf never does."""
    bias = -2.0 + randn(16, seed=81, scale=0.1, dtype=torch.float32)  # sigmoid scores + bias < 0 everywhere
    gate = hf_deepseek_v3_gate(True, bias, seed=82)
    with torch.no_grad():
        logits, hf_w, hf_ids = gate(randn(9, 32, seed=83, dtype=torch.float32))
    kw = dict(top_k=4, scoring="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.5)
    weights, ids = ref.route(logits, correction_bias=bias, **kw)
    conf = dict(n_group=4, topk_group=2, bias=bias, factor=2.5)
    inf_w, inf_ids = route_f64(logits, 4, "sigmoid", **conf)
    zero_w, zero_ids = route_f64(logits, 4, "sigmoid", masked=0.0, **conf)
    assert torch.equal(ids.long(), inf_ids)
    torch.testing.assert_close(weights.double(), inf_w, rtol=1e-6, atol=1e-7)
    for row in range(9):  # the two rules pick disjoint experts on every token here
        assert not set(ids[row].tolist()) & set(zero_ids[row].tolist())
    # Whichever rule this transformers version's DeepSeek-V3 router uses, it is one of the two
    # (transformers 5.24 masks with -inf there, older versions and some other routers with 0.0).
    hf_sets = by_id(hf_ids, hf_w)[0]
    assert torch.equal(hf_sets, by_id(inf_ids, inf_w)[0]) or torch.equal(hf_sets, by_id(zero_ids, zero_w)[0])


def test_route_differs_from_hf_zero_mask_router():
    """A Hugging Face router that masks with 0.0 (AXK2, DeepSeek-V3-style) disagrees with hetero's -inf."""
    try:
        from transformers import AXK2Config
        from transformers.models.axk2.modeling_axk2 import AXK2TopkRouter

        cfg = AXK2Config(
            hidden_size=32,
            n_routed_experts=16,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
        )
        gate = AXK2TopkRouter(cfg)
    except Exception as e:  # the model is optional: the float64 rule above covers the semantics
        pytest.skip(f"transformers has no usable AXK2 router: {e}")
    bias = -2.0 + randn(16, seed=91, scale=0.1, dtype=torch.float32)
    with torch.no_grad():
        gate.weight.copy_(randn(16, 32, seed=92, scale=0.3, dtype=torch.float32))
        gate.e_score_correction_bias.copy_(bias)
        logits, _, hf_ids = gate(randn(9, 32, seed=93, dtype=torch.float32))
    _, ids = ref.route(logits, top_k=4, scoring="sigmoid", n_group=4, topk_group=2, correction_bias=bias)
    for row in range(9):
        assert not set(ids[row].tolist()) & set(hf_ids[row].tolist())


def test_route_vs_hf_deepseek_v2_group_max():
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    cfg = DeepseekV2Config(
        hidden_size=32,
        n_routed_experts=16,
        num_experts_per_tok=3,
        n_group=4,
        topk_group=2,
        topk_method="group_limited_greedy",
        routed_scaling_factor=16.0,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    gate = DeepseekV2TopkRouter(cfg)
    with torch.no_grad():
        gate.weight.copy_(randn(16, 32, seed=101, scale=0.3, dtype=torch.float32))
        logits, hf_w, hf_ids = gate(randn(13, 32, seed=102, dtype=torch.float32))
    weights, ids = ref.route(logits, top_k=3, renormalize=False, n_group=4, topk_group=2, routed_scaling_factor=16.0)
    assert_same_routing(weights, ids, hf_w, hf_ids, atol=1e-5)


def test_route_bad_inputs():
    op = "route"
    logits = randn(3, 16, seed=1, dtype=torch.float32)
    raises(op, "router_logits", ref.route, logits[0], top_k=2)
    raises(op, "router_logits", ref.route, logits.to(torch.int32), top_k=2)
    raises(op, "top_k", ref.route, logits, top_k=0)
    raises(op, "top_k", ref.route, logits, top_k=17)
    raises(op, "top_k", ref.route, logits, top_k=2.0)
    raises(op, "scoring", ref.route, logits, top_k=2, scoring="relu")
    raises(op, "renormalize", ref.route, logits, top_k=2, renormalize="yes")
    raises(op, "routed_scaling_factor", ref.route, logits, top_k=2, routed_scaling_factor=float("nan"))
    raises(op, "n_group", ref.route, logits, top_k=2, n_group=3)
    raises(op, "n_group", ref.route, logits, top_k=2, n_group=0)
    raises(op, "topk_group", ref.route, logits, top_k=2, n_group=4, topk_group=5)
    raises(op, "topk_group", ref.route, logits, top_k=2, n_group=4, topk_group=0)
    raises(op, "topk_group", ref.route, logits, top_k=9, n_group=4, topk_group=2)  # 2 groups of 4 < 9
    raises(op, "correction_bias", ref.route, logits, top_k=2, correction_bias=torch.ones(15))
    raises(op, "correction_bias", ref.route, logits, top_k=2, correction_bias=torch.ones(16, dtype=torch.int64))
    raises(op, "correction_bias", ref.route, logits, top_k=2, correction_bias=torch.ones(16, device="meta"))
    raises(op, "n_group", ref.route, logits, top_k=2, n_group=16, topk_group=4, correction_bias=torch.ones(16))


# ---------------------------------------------------------------- moe_permute / moe_unpermute


def test_moe_permute_small_example():
    x = randn(3, 4, seed=111, dtype=torch.float32)
    ids = torch.tensor([[2, 0], [0, 2], [1, 0]], dtype=torch.int32)
    x_sorted, group_ends, perm = ref.moe_permute(x, ids, 4)
    # flat pairs: 0->2, 1->0, 2->0, 3->2, 4->1, 5->0; stable by expert: 1 2 5 | 4 | 0 3 | (none)
    assert perm.tolist() == [1, 2, 5, 4, 0, 3] and perm.dtype == torch.int64
    assert group_ends.tolist() == [3, 4, 6, 6] and group_ends.dtype == torch.int32
    assert torch.equal(x_sorted, x[[0, 1, 2, 2, 0, 1]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_moe_permute_properties_and_round_trip(dtype):
    m, k, experts = 17, 3, 8
    x = randn(m, 12, seed=121, dtype=dtype)
    ids = randint(1, 6, (m, k), seed=122)  # experts 0, 6 and 7 stay empty
    x0 = x.clone()
    x_sorted, group_ends, perm = ref.moe_permute(x, ids, experts)
    flat = ids.reshape(-1).long()
    assert sorted(perm.tolist()) == list(range(m * k))
    assert all(flat[perm[r]] <= flat[perm[r + 1]] for r in range(m * k - 1))  # grouped by expert
    assert all(perm[r] < perm[r + 1] for r in range(m * k - 1) if flat[perm[r]] == flat[perm[r + 1]])  # stable
    assert torch.equal(group_ends, torch.bincount(flat, minlength=experts).cumsum(0).int())
    for r in range(m * k):
        assert torch.equal(x_sorted[r], x[perm[r] // k])
    weights = randn(m, k, seed=123, dtype=torch.float32).abs()
    back = ref.moe_unpermute(x_sorted, perm, weights)
    assert back.dtype == dtype
    want = x.double() * weights.double().sum(1, keepdim=True)
    torch.testing.assert_close(back.double(), want, rtol=2**-7 if dtype == torch.bfloat16 else 1e-6, atol=1e-6)
    assert torch.equal(x, x0)


def unpermute_loop(y_sorted, perm, weights):
    k = weights.shape[1]
    out = torch.zeros(weights.shape[0], y_sorted.shape[1], dtype=torch.float64)
    for r, p in enumerate(perm.tolist()):
        m, s = divmod(p, k)
        out[m] += weights[m, s].double() * y_sorted[r].double()
    return out


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["float32", "bfloat16", "float64"]
)
def test_moe_unpermute_vs_loop(dtype):
    m, k = 10, 4
    y_sorted = randn(m * k, 6, seed=131, dtype=dtype)
    perm = torch.randperm(m * k, generator=torch.Generator().manual_seed(132))
    weights = randn(m, k, seed=133, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    out = ref.moe_unpermute(y_sorted, perm, weights)
    assert out.dtype == dtype and out.shape == (m, 6)
    tol = {torch.float32: 1e-6, torch.bfloat16: 2**-8, torch.float64: 1e-13}[dtype]
    torch.testing.assert_close(out.double(), unpermute_loop(y_sorted, perm, weights), rtol=tol, atol=tol)


def test_permute_unpermute_no_tokens():
    x_sorted, group_ends, perm = ref.moe_permute(torch.ones(0, 4), torch.zeros(0, 2, dtype=torch.int32), 3)
    assert x_sorted.shape == (0, 4) and group_ends.tolist() == [0, 0, 0] and perm.shape == (0,)
    assert ref.moe_unpermute(x_sorted, perm, torch.ones(0, 2)).shape == (0, 4)


def test_moe_permute_bad_inputs():
    op = "moe_permute"
    x, ids = torch.ones(4, 8), torch.zeros(4, 2, dtype=torch.int32)
    raises(op, "x", ref.moe_permute, x[0], ids, 4)
    raises(op, "ids", ref.moe_permute, x, ids + 4, 4)
    raises(op, "ids", ref.moe_permute, x, ids - 1, 4)
    raises(op, "ids", ref.moe_permute, x, ids[:3], 4)
    raises(op, "ids", ref.moe_permute, x, ids.float(), 4)
    raises(op, "ids", ref.moe_permute, x, ids[:, :0], 4)
    raises(op, "ids", ref.moe_permute, x, ids.to("meta"), 4)
    raises(op, "num_experts", ref.moe_permute, x, ids, 0)
    raises(op, "num_experts", ref.moe_permute, x, ids, 4.0)


def test_moe_unpermute_bad_inputs():
    op = "moe_unpermute"
    y, perm, w = torch.ones(8, 3), torch.arange(8), torch.ones(4, 2)
    raises(op, "perm", ref.moe_unpermute, y, perm[:7], w)
    raises(op, "perm", ref.moe_unpermute, y, perm.int(), w)
    raises(op, "perm", ref.moe_unpermute, y, torch.tensor([0, 1, 2, 3, 4, 5, 6, 6]), w)
    raises(op, "perm", ref.moe_unpermute, y, perm + 1, w)
    raises(op, "weights", ref.moe_unpermute, y, perm, w.reshape(-1))
    raises(op, "weights", ref.moe_unpermute, y, perm, w.half())
    raises(op, "y_sorted", ref.moe_unpermute, y[:6], perm, w)
    raises(op, "y_sorted", ref.moe_unpermute, y.long(), perm, w)


# ---------------------------------------------------------------- fused_moe


def fused_moe_loop(x, w13, w2, weights, ids):
    """Token by token, slot by slot, in float64."""
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    for m in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = int(ids[m, s])
            h = w13[e].double() @ x[m].double()
            act = torch.nn.functional.silu(h[:inter]) * h[inter:]
            out[m] += float(weights[m, s]) * (w2[e].double() @ act)
    return out


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["float32", "bfloat16", "float64"]
)
def test_fused_moe_vs_loop(dtype):
    m, hidden, inter, experts, k = 9, 16, 12, 8, 2
    x = randn(hidden, m, seed=141, dtype=dtype).T  # non-contiguous [M, H]
    w13 = randn(experts, 2 * inter, hidden, seed=142, scale=0.3, dtype=dtype)
    w2 = randn(experts, hidden, inter, seed=143, scale=0.3, dtype=dtype)
    ids = torch.stack([randint(1, 4, (m,), seed=144), randint(4, 6, (m,), seed=145)], dim=1)  # 0, 6, 7 empty
    weights = randn(m, k, seed=146, dtype=torch.float32).abs()
    out = ref.fused_moe(x, w13, w2, weights, ids)
    assert out.dtype == dtype and out.shape == (m, hidden)
    want = fused_moe_loop(x, w13, w2, weights, ids)
    rel = ((out.double() - want).norm() / want.norm()).item()
    assert rel < {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float64: 1e-13}[dtype]


def test_fused_moe_no_tokens():
    out = ref.fused_moe(
        torch.ones(0, 8),
        torch.ones(3, 4, 8),
        torch.ones(3, 8, 2),
        torch.ones(0, 2),
        torch.zeros(0, 2, dtype=torch.int32),
    )
    assert out.shape == (0, 8)


def test_fused_moe_bad_inputs():
    op = "fused_moe"
    x, w13, w2 = torch.ones(3, 8), torch.ones(4, 6, 8), torch.ones(4, 8, 3)
    w, ids = torch.ones(3, 2), torch.zeros(3, 2, dtype=torch.int32)
    raises(op, "activation", ref.fused_moe, x, w13, w2, w, ids, activation="gelu")
    raises(op, "x", ref.fused_moe, x[0], w13, w2, w, ids)
    raises(op, "w13", ref.fused_moe, x, w13[:, :5], w2, w, ids)
    raises(op, "w13", ref.fused_moe, x, w13[:, :, :7], w2, w, ids)
    raises(op, "w13", ref.fused_moe, x, w13.half(), w2, w, ids)
    raises(op, "w2", ref.fused_moe, x, w13, w2[:, :, :2], w, ids)
    raises(op, "w2", ref.fused_moe, x, w13, w2[:3], w, ids)
    raises(op, "w2", ref.fused_moe, x, w13, w2.double(), w, ids)
    raises(op, "ids", ref.fused_moe, x, w13, w2, w, ids + 4)
    raises(op, "ids", ref.fused_moe, x, w13, w2, w, ids.float())
    raises(op, "ids", ref.fused_moe, x, w13, w2, w, ids[:2])
    raises(op, "weights", ref.fused_moe, x, w13, w2, w[:, :1], ids)
    raises(op, "weights", ref.fused_moe, x, w13, w2, w.half(), ids)
    raises(op, "weights", ref.fused_moe, x, w13, w2, w.to("meta"), ids)


# ---------------------------------------------------------------- fused_moe: gpt-oss and DeepSeek-V4 activations


def _experts(seed: int, e: int = 6, inter: int = 10, hidden: int = 16, m: int = 11, k: int = 3, gain: float = 6.0):
    """Expert weights and biases large enough that many gate/up values pass the clamp limits."""
    x = randn(m, hidden, seed=seed)
    w13 = randn(e, 2 * inter, hidden, seed=seed + 1, scale=gain / math.sqrt(hidden))
    w2 = randn(e, hidden, inter, seed=seed + 2, scale=1 / math.sqrt(inter))
    b13, b2 = randn(e, 2 * inter, seed=seed + 3), randn(e, hidden, seed=seed + 4)
    g = torch.Generator().manual_seed(seed + 5)
    ids = torch.stack([torch.randperm(e - 1, generator=g)[:k] + 1 for _ in range(m)]).to(torch.int32)  # expert 0 empty
    weights = torch.rand(m, k, generator=g).float()
    return x, w13, w2, b13, b2, weights, ids


def test_fused_moe_swigluoai_is_hf_gpt_oss():
    """Against transformers' GptOssExperts in float64: its checkpoint layout (W13 [E, H, 2I] with gate
    and up columns interleaved) de-interleaved into the [gate | up] halves fused_moe takes."""
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    x, w13, w2, b13, b2, weights, ids = _experts(seed=150)
    e, two_i, hidden = w13.shape
    inter = two_i // 2
    cfg = SimpleNamespace(
        intermediate_size=inter,
        num_local_experts=e,
        hidden_size=hidden,
        swiglu_alpha=1.702,
        swiglu_limit=7.0,
        _experts_implementation="eager",
    )
    hf = GptOssExperts(cfg).double()
    interleaved, interleaved_bias = (
        torch.empty(e, hidden, two_i, dtype=torch.float64),
        torch.empty(e, two_i, dtype=torch.float64),
    )
    interleaved[..., 0::2], interleaved[..., 1::2] = w13[:, :inter].transpose(1, 2), w13[:, inter:].transpose(1, 2)
    interleaved_bias[:, 0::2], interleaved_bias[:, 1::2] = b13[:, :inter], b13[:, inter:]
    with torch.no_grad():
        for p, v in (
            (hf.gate_up_proj, interleaved),
            (hf.gate_up_proj_bias, interleaved_bias),
            (hf.down_proj, w2.transpose(1, 2)),
            (hf.down_proj_bias, b2),
        ):
            p.copy_(v)
        want = hf(x, router_indices=ids.long(), routing_weights=weights.double())
    gu = torch.einsum("mh,mkih->mki", x, w13[ids.long()])
    assert (gu[..., :inter] > 7).any() and (gu[..., inter:].abs() > 7).any()  # the clamps matter here
    out = ref.fused_moe(
        x, w13, w2, weights.double(), ids, activation="swigluoai", alpha=1.702, limit=7.0, w13_bias=b13, w2_bias=b2
    )
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_fused_moe_swiglu_clamp_is_hf_deepseek_v4():
    from types import SimpleNamespace

    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Experts

    x, w13, w2, _, _, weights, ids = _experts(seed=160, gain=9.0)
    e, two_i, hidden = w13.shape
    cfg = SimpleNamespace(
        num_local_experts=e,
        hidden_size=hidden,
        intermediate_size=two_i // 2,
        hidden_act="silu",
        swiglu_limit=10.0,
        _experts_implementation="eager",
    )
    hf = DeepseekV4Experts(cfg).double()
    with torch.no_grad():
        hf.gate_up_proj.copy_(w13)
        hf.down_proj.copy_(w2)
        want = hf(x, ids.long(), weights.double())
    out = ref.fused_moe(x, w13, w2, weights.double(), ids, activation="swiglu_clamp", limit=10.0)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def fused_moe_rounded(x, w13, w2, weights, ids, act, alpha, limit, b13, b2):
    """Token by token and slot by slot in float64, rounding to x's dtype at the spec's three points."""
    inter, dt = w13.shape[1] // 2, x.dtype
    r = lambda t: t.to(dt).double()  # noqa: E731
    out = torch.zeros(x.shape, dtype=torch.float64)
    for m in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = int(ids[m, s])
            gu = r(w13[e].double() @ x[m].double() + (0 if b13 is None else b13[e].double()))
            gate, up = gu[:inter], gu[inter:]
            if act != "silu":
                gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
            h = r(
                (up + 1) * gate * torch.sigmoid(alpha * gate)
                if act == "swigluoai"
                else torch.nn.functional.silu(gate) * up
            )
            out[m] += float(weights[m, s]) * r(w2[e].double() @ h + (0 if b2 is None else b2[e].double()))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("act,limit", [("swigluoai", 7.0), ("swiglu_clamp", 10.0), ("silu", None)])
@pytest.mark.parametrize("biases", [False, True], ids=["no-bias", "bias"])
def test_fused_moe_activations_round_as_pinned(dtype, act, limit, biases):
    x, w13, w2, b13, b2, weights, ids = (
        t.to(dtype) if t.is_floating_point() and t.dtype == torch.float64 else t for t in _experts(seed=170)
    )
    b13, b2 = (b13, b2) if biases else (None, None)
    out = ref.fused_moe(x, w13, w2, weights, ids, activation=act, alpha=1.702, limit=limit, w13_bias=b13, w2_bias=b2)
    assert out.dtype == dtype
    want = fused_moe_rounded(x, w13, w2, weights, ids, act, 1.702, limit, b13, b2)
    rel = ((out.double() - want).norm() / want.norm()).item()
    assert rel < {torch.float32: 1e-6, torch.bfloat16: 4e-3}[dtype]


def test_fused_moe_bias_and_options_change_the_result():
    x, w13, w2, b13, b2, weights, ids = _experts(seed=180)
    base = ref.fused_moe(x, w13, w2, weights, ids, activation="swigluoai", limit=7.0)
    for kw in (dict(w13_bias=b13), dict(w2_bias=b2), dict(alpha=1.0), dict(limit=3.0), dict(activation="swiglu_clamp")):
        opts = {"activation": "swigluoai", "limit": 7.0, **kw}
        assert not torch.allclose(ref.fused_moe(x, w13, w2, weights, ids, **opts), base), kw


def test_fused_moe_bad_options():
    op = "fused_moe"
    x, w13, w2 = torch.ones(3, 8), torch.ones(4, 6, 8), torch.ones(4, 8, 3)
    w, ids = torch.ones(3, 2), torch.zeros(3, 2, dtype=torch.int32)
    raises(op, "limit", ref.fused_moe, x, w13, w2, w, ids, limit=7.0)
    for bad in (None, 0.0, -1.0, float("inf"), float("nan"), True, "7"):
        raises(op, "limit", ref.fused_moe, x, w13, w2, w, ids, activation="swigluoai", limit=bad)
    raises(op, "limit", ref.fused_moe, x, w13, w2, w, ids, activation="swiglu_clamp")
    for bad in (float("nan"), float("-inf"), None, False):
        raises(op, "alpha", ref.fused_moe, x, w13, w2, w, ids, activation="swigluoai", alpha=bad, limit=7.0)
    raises(op, "w13_bias", ref.fused_moe, x, w13, w2, w, ids, w13_bias=torch.ones(4, 5))
    raises(op, "w13_bias", ref.fused_moe, x, w13, w2, w, ids, w13_bias=torch.ones(4, 6, dtype=torch.float64))
    raises(op, "w13_bias", ref.fused_moe, x, w13, w2, w, ids, w13_bias=torch.ones(24))
    raises(op, "w2_bias", ref.fused_moe, x, w13, w2, w, ids, w2_bias=torch.ones(3, 8))
    raises(op, "w2_bias", ref.fused_moe, x, w13, w2, w, ids, w2_bias=torch.ones(4, 8).half())
    raises(op, "w2_bias", ref.fused_moe, x, w13, w2, w, ids, w2_bias=torch.ones(4, 8, device="meta"))
    raises(op, "w2_bias", ref.fused_moe, x, w13, w2, w, ids, w2_bias=[0.0] * 8)
