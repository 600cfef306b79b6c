"""What index validation costs per call on the host: ``hetero.spec.validate`` alone, on
metadata of engine-sized batches (the op itself is not run).

    .venv/bin/python -m pytest benchmarks/test_validation.py --benchmark-only

On CPU tensors this is the whole cost of ``validate=True``. On an accelerator each
call adds a device-to-host copy and a stream sync on top (measured by
scripts/gpu_check.sh on a GPU). The ratio of op time with validation on to off is
in docs/perf/validation.md.
"""

from __future__ import annotations

import pytest
import torch

from hetero.spec import validate
from hetero.spec.types import AttentionMeta

BLOCK = 16


def _decode_meta(batch: int, context: int, num_blocks: int) -> AttentionMeta:
    per = -(-context // BLOCK)
    gen = torch.Generator().manual_seed(0)
    table = torch.randint(0, num_blocks, (batch, per), dtype=torch.int32, generator=gen)
    return AttentionMeta(
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32),
        seq_lens=torch.full((batch,), context, dtype=torch.int32),
        block_table=table,
        max_query_len=1,
        max_seq_len=context,
    )


@pytest.mark.parametrize("batch, context", [(8, 2048), (64, 2048), (256, 4096)])
def test_paged_decode_metadata(benchmark, batch, context):
    meta = _decode_meta(batch, context, num_blocks=batch * context // BLOCK)
    query = torch.randn(batch, 8, 64)
    cache = torch.empty(batch * context // BLOCK, BLOCK, 1, 64)
    benchmark(validate.paged_attention, query, cache, cache, meta)


@pytest.mark.parametrize("tokens, experts, top_k", [(64, 128, 8), (4096, 256, 8)])
def test_expert_ids(benchmark, tokens, experts, top_k):
    x = torch.randn(tokens, 16)
    ids = torch.randint(0, experts, (tokens, top_k), dtype=torch.int32)
    benchmark(validate.moe_permute, x, ids, experts)


@pytest.mark.parametrize("tokens", [64, 8192])
def test_slot_mapping(benchmark, tokens):
    key = torch.randn(tokens, 1, 8)
    cache = torch.empty(tokens // BLOCK + 1, BLOCK, 1, 8)
    slots = torch.randperm(tokens, dtype=torch.int64)
    benchmark(validate.write_kv, key, key, cache, cache, slots)
