"""Sampling operators of speculative decoding: verifying draft tokens against the target model.

``rejection_sample`` (spec 1.10) takes vLLM's contract (``vllm/v1/sample/rejection_sampler.py``):
B requests, request b with k_b >= 0 draft tokens, packed request-major in a flat layout with
cumulative offsets. The target model scored 1 + k_b positions of request b: one per draft token
and a bonus position after the last. The caller samples the bonus position itself (it is an
ordinary next-token sample) and passes its token; this op sees the k_b draft positions' target
distributions only.

Randomness is part of the contract, so that every backend returns the same tokens for the same
seeds. All of it comes from one counter-based hash of 32-bit words (arithmetic mod 2**32)::

    mix(x) = x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16
    key(seed, j, s) = mix(mix(mix(mix(hi) ^ lo) ^ j) ^ s)

where ``lo``/``hi`` are the low and high 32 bits of request b's int64 ``seeds[b]`` (two's
complement), j its draft position (0-based within the request) and s a stream number. From it:

- ``u(j) = ((key(seed, j, 0) >> 8) + 1) / 2**24``, a uniform in (0, 1] with 24 bits;
- ``r(j) = ((key(seed, j, 1) >> 1) << 32) | key(seed, j, 2)``, a uniform 63-bit integer.

A request's draws depend only on its seed and positions, never on the batch it is in.
"""

from __future__ import annotations

import torch

from hetero.spec._op import Output, spec_op

__all__ = ["rejection_sample", "RECOVERED_SCALE"]

#: A residual probability r becomes the integer weight floor(r * RECOVERED_SCALE) (2**40), whose sums are exact.
RECOVERED_SCALE = 2**40


@spec_op(returns=(Output("out", compare="exact"),))
def rejection_sample(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    max_spec_len: int,
    is_greedy: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Accept or reject each request's draft tokens; return the tokens emitted, -1 padded.

    Arguments (N = sum k_b draft tokens, V the vocabulary):

    - ``draft_token_ids`` int32/int64 [N] in [0, V); request b owns
      ``[cu_num_draft_tokens[b], cu_num_draft_tokens[b+1])``;
    - ``cu_num_draft_tokens`` int32/int64 [B+1], non-decreasing from 0 to N, every k_b <= ``max_spec_len``;
    - ``target_probs`` float32 [N, V]: the target's distribution at each draft position (float64 is the
      oracle's run: its values are read as float32, which they are);
    - ``bonus_token_ids`` int32/int64 [B]: the caller's sample at each request's bonus position;
    - ``draft_probs`` float32 [N, V] or None. None is the draft-probability-free mode (n-gram
      drafting): the draft distribution is a point mass on the draft token;
    - ``max_spec_len`` int >= 0, the output's width less one;
    - ``is_greedy`` bool [B] or None (every request greedy); ``seeds`` int64 [B], given iff
      ``is_greedy`` is (a greedy request ignores its seed).

    Request b's draft positions j = 0..k_b-1 are walked in order, with x the draft token, ``p`` the
    target's row and ``q`` the draft's (float32 values throughout):

    - greedy: ``a = argmax p`` (the lowest index among equal maxima); x is accepted iff x == a;
      on rejection the emitted token is a;
    - random: x is accepted iff ``q[x] > 0`` and ``p[x] >= u(j) * q[x]`` (the exact product, which
      float64 holds: p(x)/q(x) >= u); in the draft-free mode ``q[x]`` is 1. On rejection the
      emitted token is the recovered one, drawn from the residual ``res[v] = max(p[v] - q[v], 0)``
      (the subtraction rounded to float32; draft-free: ``res = p`` with ``res[x] = 0``) by
      inverse CDF on integers: ``w[v] = floor(res[v] * RECOVERED_SCALE)``, ``W = sum w``, and the
      token is the least v with ``w[0] + ... + w[v] > r(j) mod W``; if W is 0, it is ``argmax p``.

    An accepted x is emitted and the walk goes on; a rejection emits its token and ends the
    request. When all k_b are accepted, ``bonus_token_ids[b]`` follows them. Returns ``out`` int32
    [B, max_spec_len + 1]: row b holds the emitted tokens (between 1 and k_b + 1 of them; a request
    with k_b = 0 emits its bonus token) and -1 after them. B = 0 and N = 0 are legal. Probabilities
    are meant to lie in [0, 1]; other values give undefined tokens, never an out-of-bounds access.
    """
