"""The checks of rejection_sample (spec 1.10), for ``hetero.spec.checks`` (import them from there):
each failure is an OpError naming the op, the argument, what was expected and what came.

``check_rejection_sample`` reads host metadata only (types, shapes, dtypes, devices) and runs on
every call; ``check_rejection_sample_indices`` reads the offsets and draft ids on the host (the
reference runs it on every call; ``rejection_sample`` below is the op's validator for
``hetero.spec.validate.VALIDATORS``).
"""

from __future__ import annotations

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import INDEX_DTYPES, check_cu_seqlens, check_same_device, check_tensor

__all__ = ["PROB_DTYPES", "check_rejection_sample", "check_rejection_sample_indices", "rejection_sample"]

OP = "rejection_sample"
#: Probabilities are float32 by the spec; float64 is the oracle's run.
PROB_DTYPES = (torch.float32, torch.float64)


def check_rejection_sample(
    draft_token_ids: object,
    cu_num_draft_tokens: object,
    target_probs: object,
    bonus_token_ids: object,
    draft_probs: object = None,
    *,
    max_spec_len: object,
    is_greedy: object = None,
    seeds: object = None,
) -> tuple[int, int, int]:
    """The cheap checks of a rejection_sample call; returns (B, N, V)."""
    if not (isinstance(max_spec_len, int) and not isinstance(max_spec_len, bool) and max_spec_len >= 0):
        raise OpError(OP, "max_spec_len", "an int >= 0", repr(max_spec_len))
    ids = check_tensor(OP, "draft_token_ids", draft_token_ids, ndim=1, dtypes=INDEX_DTYPES)
    cu = check_tensor(OP, "cu_num_draft_tokens", cu_num_draft_tokens, ndim=1, dtypes=INDEX_DTYPES)
    if cu.shape[0] < 1:
        raise OpError(OP, "cu_num_draft_tokens", "[B+1] entries (at least 1)", "0 entries")
    batch, n = cu.shape[0] - 1, ids.shape[0]
    p = check_tensor(OP, "target_probs", target_probs, ndim=2, dtypes=PROB_DTYPES)
    if p.shape[0] != n or p.shape[1] < 1:
        raise OpError(OP, "target_probs", f"shape [{n}, V] (a row per draft token, V >= 1)", f"shape {list(p.shape)}")
    vocab = p.shape[1]
    check_tensor(OP, "bonus_token_ids", bonus_token_ids, shape=(batch,), dtypes=INDEX_DTYPES)
    tensors = {"draft_token_ids": ids, "cu_num_draft_tokens": cu, "target_probs": p, "bonus_token_ids": bonus_token_ids}
    if draft_probs is not None:
        q = check_tensor(OP, "draft_probs", draft_probs, dtypes=PROB_DTYPES)
        if tuple(q.shape) != (n, vocab) or q.dtype != p.dtype:
            raise OpError(
                OP, "draft_probs", f"{p.dtype} [{n}, {vocab}] (target_probs' dtype and shape) or None", _desc(q)
            )
        tensors["draft_probs"] = q
    if (is_greedy is None) != (seeds is None):
        raise OpError(OP, "seeds", "given iff is_greedy is (None: every request greedy)", _desc(seeds))
    if is_greedy is not None:
        tensors["is_greedy"] = check_tensor(OP, "is_greedy", is_greedy, shape=(batch,), dtypes=(torch.bool,))
        tensors["seeds"] = check_tensor(OP, "seeds", seeds, shape=(batch,), dtypes=(torch.int64,))
    check_same_device(OP, **tensors)
    return batch, n, vocab


def _desc(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')} {list(x.shape)}"
    return repr(x)


def check_rejection_sample_indices(
    draft_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor, vocab: int, max_spec_len: int
) -> list[int]:
    """Offsets from 0 to N, non-decreasing, each k_b <= max_spec_len; draft ids in [0, V). Returns
    the offsets as a host list."""
    n = draft_token_ids.shape[0]
    cu = check_cu_seqlens(OP, "cu_num_draft_tokens", cu_num_draft_tokens, n)
    for b in range(len(cu) - 1):
        if cu[b + 1] - cu[b] > max_spec_len:
            raise OpError(
                OP, "cu_num_draft_tokens", f"at most max_spec_len={max_spec_len} drafts a request",
                f"{cu[b + 1] - cu[b]} for request {b}",
            )  # fmt: skip
    if n:
        lo, hi = int(draft_token_ids.min()), int(draft_token_ids.max())
        if not (lo >= 0 and hi < vocab):
            raise OpError(OP, "draft_token_ids", f"token ids in [0, {vocab})", f"values in [{lo}, {hi}]")
    return cu


def rejection_sample(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    bonus_token_ids: object = None,
    draft_probs: object = None,
    *,
    max_spec_len: int,
    **_: object,
) -> None:
    """The validator of rejection_sample: the index contents, after the type and rank of what it reads."""
    check_tensor(OP, "draft_token_ids", draft_token_ids, ndim=1, dtypes=INDEX_DTYPES)
    check_tensor(OP, "target_probs", target_probs, ndim=2)
    check_rejection_sample_indices(draft_token_ids, cu_num_draft_tokens, target_probs.shape[1], max_spec_len)
