"""The portable Triton kernel of rejection_sample (spec 1.10).

Semantics and the random draws: ``hetero.spec.sampling``. ``rs_token_kernel`` (one program per
BLOCK_T draft positions, tiles of BLOCK_V vocabulary entries, BLOCK_T * BLOCK_V about the tuning
table's "elementwise" BLOCK) decides every draft position on its own: accepted or not, and the token emitted if it is
the first rejection. The walk that turns those into each request's emitted row (an accepted
prefix, then the first rejection's token or the bonus) is a few torch operations over a
[B, max_spec_len + 1] array, as in the torch backend. The kernels are in
``hetero.kernels._sampling_kernels``.
"""

from __future__ import annotations

import torch

from hetero.kernels import _sampling_kernels as kern
from hetero.kernels._triton import triton_modules
from hetero.kernels.draft_walk import draft_positions, emitted
from hetero.kernels.tuning import Tuning
from hetero.spec.checks import check_rejection_sample
from hetero.spec.sampling import RECOVERED_SCALE

triton, tl = triton_modules()

__all__ = ["rejection_sample"]


def rejection_sample(
    draft_token_ids,
    cu_num_draft_tokens,
    target_probs,
    bonus_token_ids,
    draft_probs=None,
    *,
    max_spec_len,
    is_greedy=None,
    seeds=None,
    tuning,
):
    """``hetero.spec.sampling.rejection_sample`` on the device of its tensors."""
    batch, n, vocab = check_rejection_sample(
        draft_token_ids,
        cu_num_draft_tokens,
        target_probs,
        bonus_token_ids,
        draft_probs,
        max_spec_len=max_spec_len,
        is_greedy=is_greedy,
        seeds=seeds,
    )
    device, width = target_probs.device, max_spec_len + 1
    if batch == 0:
        return torch.empty((0, width), dtype=torch.int32, device=device)
    counts, req, j = draft_positions(cu_num_draft_tokens, n, batch, max_spec_len)
    ok = torch.empty(n, dtype=torch.int8, device=device)
    token = torch.empty(n, dtype=torch.int64, device=device)
    if n:
        meta, launch = Tuning.launch_options(tuning("elementwise"))
        block, vocab_pow2 = int(meta.get("BLOCK", 1024)), triton.next_power_of_2(vocab)
        if tuning.interpreted:  # fewer, wider programs: the interpreter pays per program and per op
            block_v = min(vocab_pow2, max(16, block // 16))
            block_t = min(256, max(16, block // block_v))
        else:
            block_t, block_v = 4, min(vocab_pow2, max(16, block // 4))
        random = is_greedy is not None
        kern.rs_token_kernel[(triton.cdiv(n, block_t),)](
            target_probs, target_probs if draft_probs is None else draft_probs, draft_token_ids, req, j,
            seeds if random else req, is_greedy.to(torch.int8) if random else req, ok, token,
            n, vocab, target_probs.stride(0), (target_probs if draft_probs is None else draft_probs).stride(0),
            HAS_Q=draft_probs is not None, RANDOM=random, SCALE=RECOVERED_SCALE,
            BLOCK_T=block_t, BLOCK_V=block_v, **launch,
        )  # fmt: skip
    return emitted(ok != 0, token, draft_token_ids.to(torch.int64), bonus_token_ids, counts, req, j, width)
