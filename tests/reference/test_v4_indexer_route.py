"""DeepSeek-V4's options of spec 1.8 in the reference against transformers' modules: ``indexer_topk(compress_ratio=)``
against ``DeepseekV4Indexer`` (its scorer and causal top-k over the compressed keys it pools), ``route(scoring=
"sqrtsoftplus")`` against ``DeepseekV4TopKRouter`` and ``route(fixed_ids=)`` against ``DeepseekV4HashRouter``."""

from __future__ import annotations

import pytest
import torch

from hetero.errors import OpError
from hetero.spec import validate
from hetero.spec.types import AttentionMeta
from hetero_cpu_ref import dsa as ref_dsa
from hetero_cpu_ref import moe as ref_moe

ds = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
cfg_mod = pytest.importorskip("transformers.models.deepseek_v4.configuration_deepseek_v4")

M, HI, D, TOPK, E, K = 4, 8, 32, 5, 16, 3


def _config(**kw):
    base = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, head_dim=32, q_lora_rank=16)
    base.update(index_n_heads=HI, index_head_dim=D, index_topk=TOPK, n_routed_experts=E, num_experts_per_tok=K)
    return cfg_mod.DeepseekV4Config(**{**base, "moe_intermediate_size": 16, **kw})


def _fill(module: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + 0.1)  # mostly positive q . k: no ties at 0


def _paged(keys: torch.Tensor, bs: int, gen: torch.Generator) -> tuple[torch.Tensor, list[list[int]]]:
    """Each sequence's compressed keys [B, Tc, D] in a paged cache of random block order (NaN elsewhere)."""
    b, tc, d = keys.shape
    per = -(-tc // bs)
    nb = b * per + 2
    order = torch.randperm(nb, generator=gen).tolist()
    cache = torch.full((nb, bs, d), float("nan"))
    table = [order[i * per : (i + 1) * per] + [order[-1]] for i in range(b)]
    for i in range(b):
        for j in range(tc):
            cache[table[i][j // bs], j % bs] = keys[i, j]
    return cache, table


@pytest.mark.parametrize("seq_len,bs", [(29, 3), (16, 1), (3, 2)])
def test_indexer_over_compressed_keys_matches_deepseek_v4(seq_len, bs):
    """Prefill of two sequences: every position from 0, so rows before the first window closes see nothing."""
    gen = torch.Generator().manual_seed(seq_len)
    indexer = ds.DeepseekV4Indexer(_config())
    _fill(indexer, gen)
    seen = {}
    indexer.scorer.register_forward_hook(lambda mod, args, out: seen.update(args=args))
    h, q_res = torch.randn(2, seq_len, 32, generator=gen), torch.randn(2, seq_len, 16, generator=gen)
    with torch.no_grad():
        want = indexer(h, q_res, torch.arange(seq_len).expand(2, -1), None, 0)
        q, comp, hidden = seen["args"]  # the rotated queries and the pooled keys the indexer scored
        weights = indexer.scorer.weights_proj(hidden).float() * HI**-0.5 * D**-0.5  # the caller folds both scales
    if comp.shape[1] == 0:
        want = torch.full((2, seq_len, 0), -1)
    cache, table = _paged(comp, bs, gen)
    meta = AttentionMeta.build([seq_len, seq_len], [seq_len, seq_len], table)
    got = ref_dsa.indexer_topk(q.flatten(0, 1), weights.flatten(0, 1), cache, meta, topk=TOPK, compress_ratio=M)
    for row, (g, w) in enumerate(zip(got.tolist(), want.flatten(0, 1).tolist())):
        pos = row % seq_len
        assert sorted(x for x in g if x >= 0) == sorted(x for x in w if x >= 0), row
        assert sum(x >= 0 for x in g) == min(TOPK, (pos + 1) // M), row


def test_indexer_ratio_one_is_the_uncompressed_rule_and_decode_sees_closed_windows():
    gen = torch.Generator().manual_seed(7)
    q, w, cache = torch.randn(4, HI, D, generator=gen), torch.rand(4, HI, generator=gen), torch.randn(6, 4, D)
    meta = AttentionMeta.build([1, 3], [13, 18], [[0, 1, 2, 3, 4], [4, 5, 0, 1, 2]])
    plain = ref_dsa.indexer_topk(q, w, cache, meta, topk=TOPK)
    assert torch.equal(plain, ref_dsa.indexer_topk(q, w, cache, meta, topk=TOPK, compress_ratio=1))
    got = ref_dsa.indexer_topk(q, w, cache, meta, topk=TOPK, compress_ratio=M)
    # positions 12 | 15, 16, 17: entries visible 3 | 4, 4, 4 (window 4 closes at token 19)
    assert [sum(x >= 0 for x in r) for r in got.tolist()] == [3, 4, 4, 4]
    assert all(0 <= x < 4 for r in got.tolist() for x in r if x >= 0)


def test_indexer_compressed_meta_and_ratio_checks():
    q, w, cache = torch.randn(1, HI, D), torch.rand(1, HI), torch.randn(4, 2, D)
    short = AttentionMeta.build([1], [20], [[0, 1]])  # 20 // 4 = 5 entries need 3 blocks of 2
    for fn in (ref_dsa.indexer_topk, validate.indexer_topk):
        with pytest.raises(OpError, match="meta.block_table.*compress ratio 4"):
            fn(q, w, cache, short, topk=TOPK, compress_ratio=M)
        with pytest.raises(OpError, match="compress_ratio"):
            fn(q, w, cache, short, topk=TOPK, compress_ratio=0)
    validate.indexer_topk(q, w, cache, AttentionMeta.build([1], [23], [[0, 1, 2]]), compress_ratio=M)


def _router(cls, gen: torch.Generator):
    router = cls(_config())
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=gen))
    return router


def test_sqrtsoftplus_route_matches_deepseek_v4_top_k_router():
    gen = torch.Generator().manual_seed(3)
    router = _router(ds.DeepseekV4TopKRouter, gen)
    router.e_score_correction_bias.copy_(torch.randn(E, generator=gen) * 0.3)
    x = torch.randn(11, 32, generator=gen)
    with torch.no_grad():
        logits, want_w, want_ids = router(x)
    w, ids = ref_moe.route(
        logits,
        top_k=K,
        scoring="sqrtsoftplus",
        correction_bias=router.e_score_correction_bias,
        routed_scaling_factor=1.5,
    )
    order, want_order = ids.long().argsort(dim=1), want_ids.argsort(dim=1)
    assert torch.equal(ids.long().gather(1, order), want_ids.gather(1, want_order))
    torch.testing.assert_close(w.gather(1, order), want_w.gather(1, want_order), rtol=1e-6, atol=1e-7)


def test_fixed_ids_route_matches_deepseek_v4_hash_router():
    gen = torch.Generator().manual_seed(4)
    router = _router(ds.DeepseekV4HashRouter, gen)
    router.tid2eid.copy_(torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(64)]))
    x, tokens = torch.randn(9, 32, generator=gen), torch.randint(0, 64, (9,), generator=gen)
    with torch.no_grad():
        logits, want_w, want_ids = router(x, tokens)
    fixed = router.tid2eid[tokens].int()
    w, ids = ref_moe.route(logits, top_k=K, scoring="sqrtsoftplus", fixed_ids=fixed, routed_scaling_factor=1.5)
    assert torch.equal(ids, want_ids.int())  # the given order
    torch.testing.assert_close(w, want_w, rtol=1e-6, atol=1e-7)
    # the top-k router's choice is not what hash routing returns
    assert not torch.equal(ref_moe.route(logits, top_k=K, scoring="sqrtsoftplus")[1].sort().values, ids.sort().values)


def test_fixed_ids_argument_rules():
    logits, fixed = torch.randn(3, E), torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 15]], dtype=torch.int32)
    bad = [
        (dict(correction_bias=torch.zeros(E)), "correction_bias"),
        (dict(n_group=4, topk_group=2), "n_group"),
        (dict(fixed_ids=fixed[:, :2]), "fixed_ids"),
        (dict(fixed_ids=fixed.float()), "fixed_ids"),
        (dict(fixed_ids=fixed + 1), "fixed_ids.*\\[0, 16\\)"),
    ]
    for kw, arg in bad:
        with pytest.raises(OpError, match=arg):
            ref_moe.route(logits, top_k=K, **{"fixed_ids": fixed, **kw})
    with pytest.raises(OpError, match="fixed_ids.*values in \\[-1, 14\\]"):
        validate.route(logits, top_k=K, fixed_ids=fixed - 1)
    validate.route(logits, top_k=K, fixed_ids=fixed)


def test_ascend_declines_the_v4_options_and_hands_calls_to_the_portable_ops(monkeypatch):
    """torch_npu documents neither: supports() says why, and a call made anyway takes the portable path."""
    plugin = pytest.importorskip("hetero_ascend.plugin")
    be = plugin.AscendBackend("cpu")
    li = {"dtype": torch.bfloat16, "num_heads": 64, "head_dim": 128, "block_size": 64, "topk": 512}
    assert be.supports("indexer_topk", **li) is None
    assert "compressed key cache" in be.supports("indexer_topk", **li, compress_ratio=M)
    gating = {"dtype": torch.bfloat16, "num_experts": 256, "top_k": 6, "scoring": "sigmoid"}
    assert be.supports("route", **gating) is None
    assert "sqrtsoftplus" in be.supports("route", **{**gating, "scoring": "sqrtsoftplus"})
    assert "fixed_ids" in be.supports("route", **gating, fixed_ids=True)
    calls = []
    for op in ("indexer_topk", "route"):
        monkeypatch.setattr(
            plugin.TritonBackend, op, lambda self, *a, _op=op, **k: calls.append(k) or _op, raising=False
        )
    q, w, cache = torch.randn(1, 64, 128).bfloat16(), torch.rand(1, 64), torch.randn(2, 64, 128).bfloat16()
    meta = AttentionMeta.build([1], [40], [[0]])
    assert be.indexer_topk(q, w, cache, meta, topk=4, compress_ratio=M) == "indexer_topk"
    logits, fixed = torch.randn(2, E), torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    assert be.route(logits, top_k=K, scoring="sqrtsoftplus") == "route"
    assert be.route(logits, top_k=K, scoring="sigmoid", fixed_ids=fixed) == "route"
    assert [c.get("compress_ratio", c.get("fixed_ids")) is not None for c in calls] == [True, False, True]
