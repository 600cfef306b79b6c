"""Rank 0's choice of a step's tokens: one sample per sequence, or a verified sequence's accepted drafts and
the token after them (the ``rejection_sample`` op)."""

from __future__ import annotations

from typing import Sequence as Seq

import torch

from hetero.engine.runtime.sampler import Sampler
from hetero.engine.runtime.sequence import Sequence
from hetero.ops import Ops

__all__ = ["choose_tokens"]


def choose_tokens(
    ops: Ops, sampler: Sampler, logits: torch.Tensor, seqs: Seq[Sequence], spec_lens: Seq[int] | None
) -> list[list[int]]:
    """The tokens each of ``seqs`` emits this step, from ``logits`` [rows, V]: ``1 + spec_lens[i]`` rows per
    sequence (its draft positions, then the row after its last draft); one row each without drafts.

    Every sequence's last row is sampled as usual (``sampler``, with the request's generator): that is
    the token of a sequence without drafts, and the bonus token of one whose drafts are all accepted.
    The draft rows go to ``ops.rejection_sample``: greedy requests compare with the argmax of the logits
    (passed as a one-hot distribution, so the op's argmax is the sampler's), sampled ones with
    ``Sampler.probabilities`` of their parameters, against the draft's distributions when the proposer
    sampled (``Sequence.draft_probs``) or none (n-gram). Each call draws the op's seed from the request's
    generator, so a request's draws never repeat and never depend on its batch. Logprobs, when asked,
    are those of each emitted token at its row.
    """
    spec = list(spec_lens) if spec_lens is not None else [0] * len(seqs)
    ends = torch.tensor(spec, dtype=torch.int64).add(1).cumsum(0)
    last = (ends - 1).to(logits.device)
    for seq in seqs:
        if seq.generator is None and not seq.sampling_params.greedy:
            seq.generator = sampler.generator(seq.sampling_params, seq.index, logits.device)
    params = [s.sampling_params for s in seqs]
    bonus = sampler(logits[last], params, [s.generator for s in seqs])
    emitted = [[t] for t in bonus]
    verified = [i for i, k in enumerate(spec) if k]
    if verified:
        out = _rejection_sample(ops, logits, seqs, spec, ends.tolist(), bonus, verified)
        for i, row in zip(verified, out):
            emitted[i] = [t for t in row if t >= 0]
    _logprobs(sampler, logits, seqs, ends.tolist(), emitted, spec)
    return emitted


def _rejection_sample(ops, logits, seqs, spec, ends, bonus, verified) -> list[list[int]]:
    device = logits.device
    rows = [r for i in verified for r in range(ends[i] - 1 - spec[i], ends[i] - 1)]
    target_logits = logits[torch.tensor(rows, dtype=torch.int64, device=device)]
    greedy = [seqs[i].sampling_params.greedy for i in verified]
    per_row_greedy = [g for g, i in zip(greedy, verified) for _ in range(spec[i])]
    probs = _one_hot(target_logits.max(dim=-1).indices, target_logits.shape[1])
    sampled_rows = [j for j, g in enumerate(per_row_greedy) if not g]
    if sampled_rows:
        params = [seqs[i].sampling_params for i in verified for _ in range(spec[i])]
        index = torch.tensor(sampled_rows, dtype=torch.int64, device=device)
        probs[index] = Sampler.probabilities(target_logits[index], [params[j] for j in sampled_rows])
    drafts = [t for i in verified for t in seqs[i].draft_token_ids[: spec[i]]]
    draft_ids = torch.tensor(drafts, dtype=torch.int64, device=device)
    draft_probs = None
    if any(seqs[i].draft_probs is not None for i in verified):
        q = _one_hot(draft_ids, probs.shape[1])
        at = 0
        for i in verified:
            if seqs[i].draft_probs is not None:
                q[at : at + spec[i]] = seqs[i].draft_probs[: spec[i]].to(device)
            at += spec[i]
        draft_probs = q
    cu = torch.tensor([0] + [spec[i] for i in verified], dtype=torch.int64).cumsum(0).to(device)
    kwargs = {}
    if not all(greedy):
        kwargs["is_greedy"] = torch.tensor(greedy, dtype=torch.bool, device=device)
        seeds = [_seed(seqs[i]) for i in verified]
        kwargs["seeds"] = torch.tensor(seeds, dtype=torch.int64, device=device)
    out = ops.rejection_sample(
        draft_ids,
        cu,
        probs,
        torch.tensor([bonus[i] for i in verified], dtype=torch.int64, device=device),
        draft_probs,
        max_spec_len=max(spec[i] for i in verified),
        **kwargs,
    )
    return out.tolist()


def _one_hot(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    out = torch.zeros(ids.shape[0], vocab, dtype=torch.float32, device=ids.device)
    return out.scatter_(1, ids.view(-1, 1), 1.0)


def _seed(seq: Sequence) -> int:
    if seq.sampling_params.greedy:
        return 0
    return int(torch.randint(0, 1 << 62, (1,), generator=seq.generator, device=seq.generator.device))


def _logprobs(sampler, logits, seqs, ends, emitted, spec) -> None:
    rows, who, ids = [], [], []
    for i, seq in enumerate(seqs):
        if seq.sampling_params.logprobs is None:
            continue
        first = ends[i] - 1 - spec[i]
        for j, token in enumerate(emitted[i]):
            rows.append(first + j)
            who.append(seq)
            ids.append(token)
    if not rows:
        return
    picked = logits[torch.tensor(rows, dtype=torch.int64, device=logits.device)]
    for seq, entry in zip(who, sampler.logprobs(picked, [s.sampling_params for s in who], ids)):
        seq.output_logprobs.append(entry)
