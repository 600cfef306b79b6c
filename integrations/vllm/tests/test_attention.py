"""The attention backend on its own: vLLM's cache layout, GQA, sliding window, softcap and sinks
against a naive reference."""

from __future__ import annotations

import math

import torch

from hetero_vllm import report
from hetero_vllm.attention import HeteroAttentionImpl, HeteroAttentionMetadata

HQ, HKV, D, BS, NB = 4, 2, 32, 16, 8
WINDOW, SOFTCAP = 9, 20.0


def _reference(q, k, v, pos, scale, sinks):
    """One query row [HQ, D] at position pos over keys/values [L, HKV, D]: window, softcap, sink, GQA."""
    lo = max(0, pos - WINDOW + 1)
    keys, values = k[lo : pos + 1].repeat_interleave(HQ // HKV, 1), v[lo : pos + 1].repeat_interleave(HQ // HKV, 1)
    logits = SOFTCAP * torch.tanh(torch.einsum("hd,jhd->hj", q.double(), keys.double()) * scale / SOFTCAP)
    weights = torch.softmax(torch.cat([logits, sinks.double()[:, None]], 1), 1)[:, :-1]
    return torch.einsum("hj,jhd->hd", weights, values.double())


def test_paged_attention_over_vllm_cache_layout(cpu_ref):
    torch.manual_seed(0)
    seq_lens, query_lens, tables = [12, 40], [5, 1], [[3, 5, 0], [0, 6, 2]]
    keys = [torch.randn(n, HKV, D) for n in seq_lens]
    values = [torch.randn(n, HKV, D) for n in seq_lens]
    slots = torch.tensor([tables[b][j // BS] * BS + j % BS for b, n in enumerate(seq_lens) for j in range(n)])
    sinks = torch.randn(HQ)
    impl = HeteroAttentionImpl(HQ, D, 1 / math.sqrt(D), HKV, None, WINDOW, "auto", logits_soft_cap=SOFTCAP, sinks=sinks)
    kv_cache = torch.zeros(NB, HKV, BS, 2 * D)  # vLLM's logical per-layer layout
    impl.do_kv_cache_update(None, torch.cat(keys), torch.cat(values), kv_cache, slots)
    block, off = tables[1][33 // BS], 33 % BS  # seq 1, position 33: keys in the first D channels, values in the last D
    torch.testing.assert_close(kv_cache[block, :, off, :D], keys[1][33], rtol=0, atol=0)
    torch.testing.assert_close(kv_cache[block, :, off, D:], values[1][33], rtol=0, atol=0)

    query = torch.randn(sum(query_lens), HQ, D)
    meta = HeteroAttentionMetadata(
        num_actual_tokens=query.shape[0],
        query_start_loc=torch.tensor([0, 5, 6], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=torch.tensor(tables, dtype=torch.int32),
        max_query_len=5,
        max_seq_len=40,
        slot_mapping=slots[:6],
    )
    output = torch.full((query.shape[0] + 2, HQ, D), float("nan"))  # two padding rows vLLM may add
    impl.forward(None, query, None, None, kv_cache, meta, output)
    rows = [(0, p) for p in range(7, 12)] + [(1, 39)]
    for t, (b, pos) in enumerate(rows):
        want = _reference(query[t], keys[b], values[b], pos, 1 / math.sqrt(D), sinks)
        torch.testing.assert_close(output[t].double(), want, rtol=1e-5, atol=1e-5)
    assert report.snapshot()["routed"]["Attention"] == {"write_kv": 1, "paged_attention": 1}
