"""The reference compressed_attention (spec 1.8) against the model it serves: transformers' DeepSeek-V4.

The oracle is transformers' own code on one sequence prefilled from position 0: its
``DeepseekV4HCACompressor`` / ``DeepseekV4CSACompressor`` (tiny config, random weights) make the
compressed entries, the ``block_bias`` and (CSA) the indexer's top-k rows with their -1 padding;
``create_sliding_window_causal_mask`` the window mask; and ``eager_attention_forward`` (gpt-oss's,
sinks as ``s_aux``) attends over ``cat(raw keys, compressed keys)``. A decode or chunked-prefill row
of the op is the same row of that prefill: attention rows are independent. Also: the sinks, lse,
the rows that see no entry yet (plain sliding-window paged attention), skipped entries, unseen NaN
slots, the comp_block_table checks and the torch backend on the same inputs.
"""

from __future__ import annotations

import re
import types

import pytest
import torch

from hetero.errors import OpError
from hetero.spec import AttentionMeta, validate
from hetero_cpu_ref import attention as ref_attention
from hetero_cpu_ref.compressed_attention import compressed_attention

ds = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

H, D, W, BS, HIDDEN = 4, 64, 8, 4, 32
RATIO = {"hca": 8, "csa": 4}
#: (query rows n, tokens L): decode past a few windows, a prefill, a chunked prefill, a prompt shorter
#: than the window, a decode whose last window just closed (L % 8 == 0), two rows.
SEQS = [(1, 21), (21, 21), (6, 19), (1, 3), (1, 16), (2, 24)]


def _config(topk: int):
    from transformers import DeepseekV4Config

    cfg = DeepseekV4Config(
        hidden_size=HIDDEN, head_dim=D, num_attention_heads=H, q_lora_rank=16, index_n_heads=2, index_head_dim=16,
        index_topk=topk, compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        sliding_window=W, num_hidden_layers=2, vocab_size=64, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, o_groups=2, o_lora_rank=8,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    return cfg


def _hf_sequence(mode: str, length: int, cfg, gen: torch.Generator):
    """transformers on one sequence of ``length`` tokens from position 0: (compressed entries [Nc, D],
    the indexer's rows [L, K] or None, the additive mask [L, L + Nc] its attention applies)."""
    from transformers.masking_utils import create_sliding_window_causal_mask

    cls = ds.DeepseekV4CSACompressor if mode == "csa" else ds.DeepseekV4HCACompressor
    compressor = cls(cfg)
    with torch.no_grad():
        for p in compressor.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
        hs = torch.randn(1, length, HIDDEN, generator=gen)
        q_residual, pid = torch.randn(1, length, 16, generator=gen), torch.arange(length)[None]
        comp, bias = compressor(hs, q_residual, pid, None, 0)
        rows = compressor.indexer(hs, q_residual, pid, None, 0)[0] if mode == "csa" else None
    sliding = create_sliding_window_causal_mask(
        config=cfg, inputs_embeds=hs.double(), attention_mask=None, cache=None, position_ids=pid
    )[0, 0]
    nc = comp.shape[2]
    bias = torch.zeros(length, nc) if bias is None else bias[0, 0]  # transformers returns None when nothing closed
    return comp[0, 0].double(), rows, torch.cat([sliding, bias.double()], dim=1)


def _paged(gen: torch.Generator, rows: list[torch.Tensor], bs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's rows [L_b, D] in a shuffled paged cache: (cache [NB, bs, D], table [B, cols])."""
    need = [max(1, -(-r.shape[0] // bs)) for r in rows]
    nb = sum(need) + 3
    ids = torch.randperm(nb, generator=gen)
    cache = torch.randn(nb, bs, D, generator=gen, dtype=torch.float64)
    table = torch.zeros(len(rows), max(need) + 1, dtype=torch.int32)
    at = 0
    for b, r in enumerate(rows):
        table[b, : need[b]] = ids[at : at + need[b]].int()
        at += need[b]
        for j in range(r.shape[0]):
            cache[table[b, j // bs], j % bs] = r[j]
    return cache, table


def _batch(mode: str, seed: int, topk: int = 3, bsc: int = 3):
    """The op's arguments for SEQS and transformers' expected rows (out [T, H, D], logits [T, H, keys] per
    sequence for lse)."""
    gen = torch.Generator().manual_seed(seed)
    cfg = _config(topk)
    raws, comps, idx, want, lse = [], [], [], [], []
    query = torch.randn(sum(n for n, _ in SEQS), H, D, generator=gen, dtype=torch.float64)
    sinks = 2.0 * torch.randn(H, generator=gen)
    module = types.SimpleNamespace(num_key_value_groups=H, sinks=sinks.double(), training=False)
    at = 0
    for n, length in SEQS:
        comp, rows, mask = _hf_sequence(mode, length, cfg, gen)
        raw = torch.randn(length, D, generator=gen, dtype=torch.float64)
        q = torch.randn(length, H, D, generator=gen, dtype=torch.float64)
        q[length - n :] = query[at : at + n]
        kv = torch.cat([raw, comp])[None, None]
        out, _ = ds.eager_attention_forward(module, q.transpose(0, 1)[None], kv, kv, mask[None, None], D**-0.5)
        logits = torch.einsum("lhd,kd->lhk", q, kv[0, 0]) * D**-0.5 + mask[:, None, :]
        want.append(out[0, length - n :])
        lse.append(torch.logsumexp(logits, dim=-1)[length - n :])
        raws.append(raw), comps.append(comp)
        if rows is not None:  # no entry closed yet: transformers' indexer returns [L, 0]
            idx.append(torch.cat([rows, rows.new_full((length, topk - rows.shape[1]), -1)], 1)[length - n :])
        at += n
    kv_cache, table = _paged(gen, raws, BS)
    comp_cache, comp_table = _paged(gen, comps, bsc)
    meta = AttentionMeta.build([n for n, _ in SEQS], [L for _, L in SEQS], table)
    args = (query, kv_cache, comp_cache, meta, comp_table)
    kw = dict(scale=D**-0.5, window=W, ratio=RATIO[mode], sinks=sinks, topk_indices=torch.cat(idx) if idx else None)
    return args, kw, torch.cat(want), torch.cat(lse).float()


@pytest.mark.parametrize("bsc", [1, 3])
@pytest.mark.parametrize("mode", ["hca", "csa"])
def test_the_reference_is_transformers_deepseek_v4_attention(mode, bsc):
    """HCA (every closed entry, m = 8 here) and CSA (the indexer's top-3 of m = 4 entries, -1 padded):
    out in float64 to 1e-12, and lse the logsumexp of transformers' masked logits (no sink)."""
    args, kw, want, want_lse = _batch(mode, seed=3 if mode == "hca" else 4, bsc=bsc)
    if mode == "csa":
        idx = kw["topk_indices"]
        assert (idx == -1).any() and (idx >= 0).sum(dim=1).max() == 3  # padding, and a top-3 that prunes
    out, lse = compressed_attention(*args, **kw, return_lse=True)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, want_lse, atol=1e-6, rtol=1e-6)


def test_sinks_only_shrink_the_output_and_stay_out_of_lse():
    args, kw, _, _ = _batch("hca", seed=5)
    plain, lse = compressed_attention(*args, **{**kw, "sinks": None}, return_lse=True)
    sinks = torch.tensor([-20.0, 0.0, 1.5, 20.0])
    sunk, lse_s = compressed_attention(*args, **{**kw, "sinks": sinks}, return_lse=True)
    factor = torch.exp(lse.double()) / (torch.exp(lse.double()) + torch.exp(sinks.double()))
    torch.testing.assert_close(sunk, plain * factor[..., None], atol=1e-12, rtol=1e-6)  # lse is float32
    assert torch.equal(lse, lse_s)


def test_rows_before_the_first_closed_window_are_sliding_window_attention():
    """HCA rows at pos < m - 1 see no compressed entry: the op is paged_attention with the window
    (W - 1, -1) and the sinks on the same raw cache as a one-head [NB, BS, 1, D] cache."""
    gen = torch.Generator().manual_seed(6)
    seqs = [(1, 7), (5, 6)]  # positions 0..6: (pos + 1) // 8 == 0
    kv = torch.randn(8, BS, D, generator=gen, dtype=torch.float64)
    comp = torch.full((2, 1, D), float("nan"), dtype=torch.float64)  # never read
    meta = AttentionMeta.build([n for n, _ in seqs], [L for _, L in seqs], [[0, 1], [2, 3]])
    q = torch.randn(6, H, D, generator=gen, dtype=torch.float64)
    sinks = torch.randn(H, generator=gen)
    got = compressed_attention(q, kv, comp, meta, torch.zeros(2, 1, dtype=torch.int32), scale=0.1, window=3,
                               ratio=8, sinks=sinks)  # fmt: skip
    cache = kv[:, :, None]
    want = ref_attention.paged_attention(q, cache, cache, meta, scale=0.1, window=(2, -1), sinks=sinks)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_padding_and_entries_a_row_cannot_see_are_skipped():
    """-1, an entry whose window has not closed, one past the cache and negative ones change nothing."""
    args, kw, _, _ = _batch("csa", seed=7)
    idx = kw["topk_indices"].long()
    pos = torch.cat([torch.arange(L - n, L) for n, L in SEQS])
    extra = torch.stack([(pos + 1) // 4, pos + 10**6, torch.full_like(pos, -5)], dim=1)
    noisy = torch.cat([idx, extra], dim=1)[:, torch.randperm(6, generator=torch.Generator().manual_seed(0))]
    want = compressed_attention(*args, **kw)
    got = compressed_attention(*args, **{**kw, "topk_indices": noisy.int()})
    assert torch.equal(got, want)


def test_bfloat16_is_the_float64_result_rounded():
    args, kw, want, _ = _batch("csa", seed=8)
    low = [a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    out = compressed_attention(*low, **kw)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("mode", ["hca", "csa"])
def test_unseen_slots_never_reach_the_output_and_torch_agrees(mode):
    """NaN in every raw slot no row sees and in every compressed slot that holds no entry (a sequence
    with none still owns a block): the reference and the torch backend stay finite and agree."""
    from hetero_torch._compressed_attention import compressed_attention as torch_op

    args, kw, _, _ = _batch(mode, seed=9)
    query, kv, comp, meta, comp_table = args
    kv = torch.full_like(kv, float("nan"))
    seen_kv = torch.zeros(kv.shape[:2], dtype=torch.bool)
    for b, (n, length) in enumerate(SEQS):
        for j in range(max(0, length - n - W + 1), length):
            seen_kv[meta.block_table[b, j // BS], j % BS] = True
    kv[seen_kv] = args[1][seen_kv]
    held = torch.zeros(comp.shape[:2], dtype=torch.bool)  # a sequence without entries still has a block
    for b, (_, length) in enumerate(SEQS):
        for w in range(length // RATIO[mode]):
            held[comp_table[b, w // 3], w % 3] = True
    comp = torch.where(held[..., None], comp, float("nan"))
    args = (query, kv, comp, meta, comp_table)
    want, want_lse = compressed_attention(*args, **kw, return_lse=True)
    got, lse = torch_op(*args, **kw, return_lse=True)
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, want_lse, atol=1e-6, rtol=1e-6)
    got32 = torch_op(query.float(), kv.float(), comp.float(), meta, comp_table, **kw)
    torch.testing.assert_close(got32.double(), want, atol=1e-5, rtol=1e-5)


def test_comp_block_table_contents_are_checked():
    args, kw, _, _ = _batch("hca", seed=10)
    query, kv, comp, meta, table = args
    validate.compressed_attention(*args, **kw)  # well formed
    bad_id = table.clone()
    bad_id[5, 0] = comp.shape[0]  # sequence 5 (24 tokens) holds 3 entries in block column 0
    short = table[:, :0]  # 3 entries need a column
    for bad, what in ((bad_id, f"block ids in [0, {comp.shape[0]})"), (short, "at least 1 columns")):
        for check in (validate.compressed_attention, compressed_attention):
            with pytest.raises(OpError, match=r"argument 'comp_block_table': expected .*" + re.escape(what)):
                check(query, kv, comp, meta, bad, **kw)
    with pytest.raises(OpError, match="'window'"):
        compressed_attention(*args, **{**kw, "window": 0})


def test_ascend_declines_with_a_reason():
    support = pytest.importorskip("hetero_ascend.support")
    for triton_ok in (False, True):
        why = support.reason("compressed_attention", {"dtype": "bfloat16"}, triton_ok)
        assert why and "torch_npu" in why
