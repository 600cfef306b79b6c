"""StepBuffers: a step's tensors are views of buffers allocated once, equal to a plain per-step
construction from the host lists, with no data of an earlier batch showing through."""

from __future__ import annotations

import pytest
import torch

from hetero.engine.step import Step
from hetero.engine.step_buffers import StepBuffers, build_step

BS = 4


def _reference(query_lens, seq_lens, tables, width, sample=None, state_slots=None) -> dict:
    """Every tensor of a step, built the straightforward way (one Python loop per field)."""

    def slot(b, p):
        return tables[b][p // BS] * BS + p % BS

    nd = 0
    while nd < len(query_lens) and query_lens[nd] == 1:
        nd += 1
    ref = {
        "positions": [],
        "slot_mapping": [],
        "qsl": [0],
        "logits": [],
        "num_decodes": nd,
        "table": [list(t) + [0] * (width - len(t)) for t in tables],
        "seq_lens": list(seq_lens),
    }
    for b, (n, length) in enumerate(zip(query_lens, seq_lens)):
        ref["positions"] += list(range(length - n, length))
        ref["slot_mapping"] += [slot(b, p) for p in range(length - n, length)]
        ref["qsl"].append(ref["qsl"][-1] + n)
        if sample is None or sample[b]:
            ref["logits"].append(ref["qsl"][-1] - 1)
    pre = range(nd, len(query_lens))
    ref["cu_q"], ref["cu_k"] = [0], [0]
    for b in pre:
        ref["cu_q"].append(ref["cu_q"][-1] + query_lens[b])
        ref["cu_k"].append(ref["cu_k"][-1] + seq_lens[b])
    ref["kv_slots"] = [slot(b, p) for b in pre for p in range(seq_lens[b])]
    if state_slots is not None:
        ref["state_slots"] = list(state_slots)
        ref["has_initial"] = [length > n for n, length in zip(query_lens, seq_lens)]
    return ref


def _assert_matches(step: Step, ref: dict, query_lens, seq_lens) -> None:
    nd = ref["num_decodes"]
    assert step.positions.tolist() == ref["positions"]
    assert step.slot_mapping.tolist() == ref["slot_mapping"]
    assert step.logits_indices.tolist() == ref["logits"]
    meta = step.meta
    assert (meta.query_start_loc.dtype, meta.seq_lens.dtype, meta.block_table.dtype) == (torch.int32,) * 3
    assert meta.query_start_loc.tolist() == ref["qsl"] and meta.seq_lens.tolist() == ref["seq_lens"]
    assert meta.block_table.tolist() == ref["table"]
    assert (meta.max_query_len, meta.max_seq_len) == (max(query_lens), max(seq_lens))
    assert step.num_decodes == nd
    if nd:
        dm = step.decode_meta
        assert dm.query_start_loc.tolist() == list(range(nd + 1)) and dm.seq_lens.tolist() == ref["seq_lens"][:nd]
        assert dm.block_table.tolist() == ref["table"][:nd]
        assert (dm.max_query_len, dm.max_seq_len) == (1, max(seq_lens[:nd]))
    else:
        assert step.decode_meta is None
    if nd == len(query_lens):
        assert step.prefill is None
    else:
        span = step.prefill
        assert (span.first_seq, span.first_token) == (nd, nd)
        assert span.cu_seqlens_q.dtype == span.cu_seqlens_k.dtype == torch.int32
        assert span.cu_seqlens_q.tolist() == ref["cu_q"] and span.cu_seqlens_k.tolist() == ref["cu_k"]
        assert (span.max_seqlen_q, span.max_seqlen_k) == (max(query_lens[nd:]), max(seq_lens[nd:]))
        assert span.kv_slots.dtype == torch.int64 and span.kv_slots.tolist() == ref["kv_slots"]
    if "state_slots" in ref:
        assert step.state_slots.tolist() == ref["state_slots"]
        assert step.has_initial_state.dtype == torch.bool and step.has_initial_state.tolist() == ref["has_initial"]
    else:
        assert step.state_slots is None and step.has_initial_state is None


# big: 2 decodes, then a chunk over cached context and a fresh prompt; small: one decode, one short prefill
BIG = dict(
    query_lens=[1, 1, 5, 7],
    seq_lens=[9, 14, 13, 7],
    tables=[[8, 3, 5], [1, 0, 2, 6], [11, 4, 10, 9], [12, 7]],
    sample=[True, True, False, True],
    state_slots=[3, 0, 2, 1],
    input_ids=list(range(100, 114)),
)
SMALL = dict(
    query_lens=[1, 2], seq_lens=[2, 2], tables=[[13], [15]], sample=None, state_slots=[5, 4], input_ids=[7, 8, 9]
)


def _fill(buffers: StepBuffers, batch: dict):
    return buffers.fill(
        batch["query_lens"],
        batch["seq_lens"],
        batch["tables"],
        sample=batch["sample"],
        state_slots=batch["state_slots"],
        input_ids=batch["input_ids"],
    )


def _buffers(**kw) -> StepBuffers:
    args = dict(max_num_tokens=32, max_num_seqs=6, max_model_len=40, block_size=BS, device="cpu", has_state=True)
    args.update(kw)
    return StepBuffers(**args)


def test_fill_twice_views_same_storage_and_matches_reference():
    buffers = _buffers()
    ptrs = []
    for batch in (BIG, SMALL, BIG):
        step, ids = _fill(buffers, batch)
        ref = _reference(
            batch["query_lens"],
            batch["seq_lens"],
            batch["tables"],
            buffers.max_blocks,
            batch["sample"],
            batch["state_slots"],
        )
        _assert_matches(step, ref, batch["query_lens"], batch["seq_lens"])
        assert ids.tolist() == batch["input_ids"]
        assert step.meta.block_table.shape[1] == buffers.max_blocks == 10 and step.meta.block_table.is_contiguous()
        tensors = (
            ids,
            step.positions,
            step.slot_mapping,
            step.logits_indices,
            step.state_slots,
            step.has_initial_state,
            step.meta.query_start_loc,
            step.meta.seq_lens,
            step.meta.block_table,
            step.prefill.cu_seqlens_q,
            step.prefill.cu_seqlens_k,
            step.prefill.kv_slots,
        )
        ptrs.append([t.data_ptr() for t in tensors])
        assert step.decode_meta.block_table.data_ptr() == step.meta.block_table.data_ptr()
    assert ptrs[0] == ptrs[1] == ptrs[2]
    assert buffers.positions.data_ptr() == ptrs[0][1] and buffers.block_table.data_ptr() == ptrs[0][8]


def test_no_stale_data_from_a_bigger_batch():
    buffers = _buffers()
    _fill(buffers, BIG)
    step, ids = _fill(buffers, SMALL)
    assert step.num_tokens == 3 and ids.shape == (3,) and step.logits_indices.shape == (2,)
    assert step.meta.block_table.tolist() == [[13] + [0] * 9, [15] + [0] * 9]  # BIG wrote 3 and 4 columns there
    assert step.prefill.kv_slots.tolist() == [60, 61] and step.prefill.cu_seqlens_q.tolist() == [0, 2]
    assert step.meta.query_start_loc.tolist() == [0, 1, 3]


def test_decode_only_and_build_agree_with_reference():
    qlens, slens, tables = [1, 1, 1], [5, 1, 8], [[2, 9], [4], [1, 7]]
    step = build_step(qlens, slens, tables, BS, "cpu", sample=[True, False, True])
    _assert_matches(step, _reference(qlens, slens, tables, 2, [True, False, True]), qlens, slens)
    assert step.prefill is None and step.decode_meta.num_seqs == 3
    # build_step keeps its old per-batch block-table width
    step = build_step(BIG["query_lens"], BIG["seq_lens"], BIG["tables"], BS, "cpu", state_slots=BIG["state_slots"])
    ref = _reference(BIG["query_lens"], BIG["seq_lens"], BIG["tables"], 4, None, BIG["state_slots"])
    _assert_matches(step, ref, BIG["query_lens"], BIG["seq_lens"])


def test_kv_slots_grows_only_when_needed():
    buffers = _buffers(kv_slots_capacity=4)
    first = buffers.kv_slots
    step, _ = _fill(buffers, SMALL)  # 2 KV positions: fits
    assert buffers.kv_slots is first and step.prefill.kv_slots.data_ptr() == first.data_ptr()
    step, _ = _fill(buffers, BIG)  # 20 KV positions: grows
    assert buffers.kv_slots.shape[0] >= 20 and step.prefill.kv_slots.data_ptr() == buffers.kv_slots.data_ptr()
    _assert_matches(
        step,
        _reference(BIG["query_lens"], BIG["seq_lens"], BIG["tables"], 10, BIG["sample"], BIG["state_slots"]),
        BIG["query_lens"],
        BIG["seq_lens"],
    )


@pytest.mark.parametrize(
    "kw, batch, match",
    [
        (dict(max_num_seqs=3), BIG, "4 sequences exceed max_num_seqs=3"),
        (dict(max_num_tokens=13), BIG, "14 tokens exceed max_num_batched_tokens=13"),
        (dict(max_model_len=12), BIG, "block table of sequence 1 has 4 blocks, more than max_blocks=3"),
        (dict(has_state=False), BIG, "state_slots given"),
        ({}, dict(BIG, input_ids=[1, 2]), "2 input_ids for 14 query rows"),
        ({}, dict(BIG, sample=[True]), "sample has 1 entries for 4 sequences"),
        ({}, dict(BIG, seq_lens=[9, 14, 13, 17]), "sequence 3 has 2 blocks, too few for seq_len 17"),
        ({}, dict(BIG, seq_lens=[9, 14, 4, 7]), "sequence 2 has query length 5 and seq_len 4"),
    ],
)
def test_overflow_and_mismatch_raise(kw, batch, match):
    with pytest.raises(ValueError, match=match):
        _fill(_buffers(**kw), batch)


def test_empty_batch():
    step, ids = _buffers().fill([], [], [], input_ids=[])
    assert step.num_tokens == 0 and ids.numel() == 0 and step.meta.block_table.shape == (0, 10)
    assert step.meta.query_start_loc.tolist() == [0] and step.decode_meta is None and step.prefill is None
