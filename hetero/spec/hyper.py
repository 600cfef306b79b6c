"""Hyper-connections: the residual held as N parallel streams, mixed into one block input and expanded back.

DeepSeek-V4's manifold-constrained hyper-connections (mHC) and Hunyuan HY4's form of them
(transformers' ``DeepseekV4HyperConnection`` / ``DeepseekV4HyperHead`` and ``HYV4HyperConnection`` /
``HYV4HyperHead``). A decoder layer keeps ``streams`` [T, N, D] (N = ``hc_mult``, 4 in both models)
in place of the usual [T, D] residual. Before attention and before the MLP, ``hc_pre`` collapses
the streams into the block's input and computes the weights ``hc_post`` needs to expand the
block's output back into N streams; ``hc_head`` is the last collapse, before the model's final
norm. One layer's attention half is::

    x, post, comb = hc_pre(streams, fn, scale, base, ...)      # (x, post) without Sinkhorn (HY4)
    y = attention(rms_norm(x, ...))
    streams = hc_post(y, streams, post, comb)                 # comb None without Sinkhorn

The mixing parameters (``fn``, ``scale``, ``base``) and the weights (``post``, ``comb``) are float32
in both models (float64 is accepted, for the oracle's run); ``streams`` are float32, bfloat16 or
float16. Shared notation: ``flat`` = streams viewed [T, N*D]; ``r = rsqrt(mean(flat**2, -1) +
norm_eps)`` (the mean over all N*D elements of a token, an unweighted RMS norm); ``mixes = (flat @
fn^T) * r`` [T, M] (HY4's linear-then-scale equals DeepSeek-V4's scale-then-linear). All of it is
computed in float32 or wider, every result rounded once.
"""

from __future__ import annotations

import torch

from hetero.spec._op import Output, spec_op

__all__ = ["hc_pre", "hc_post", "hc_head"]


@spec_op(returns=("x", "post", Output("comb", when="sinkhorn_iters")))
def hc_pre(
    streams: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    *,
    norm_eps: float,
    hc_eps: float,
    post_mult: float = 2.0,
    post_eps: float = 0.0,
    sinkhorn_iters: int = 0,
) -> tuple[torch.Tensor, ...]:
    """Collapse the N streams into a block's input; return it with the expansion (and mixing) weights.

    streams [T, N, D] (T >= 0, N >= 1, D >= 1); fn float32 [M, N*D], base float32 [M], scale
    float32 [S]. Without Sinkhorn (``sinkhorn_iters`` 0, HY4): M = 2N, S = 2. With it
    (``sinkhorn_iters`` >= 1, DeepSeek-V4: 20): M = N*(N+2), S = 3. Any other shape is an OpError
    naming the argument, as is a ``sinkhorn_iters`` that is not an int >= 0, a ``norm_eps`` that
    is not positive and finite, or an ``hc_eps``, ``post_mult`` or ``post_eps`` that is not
    finite (``hc_eps`` also >= 0). With ``mixes`` as in the module docstring:

    - ``pre = sigmoid(mixes[:, :N] * scale[0] + base[:N]) + hc_eps`` [T, N];
    - ``post = post_mult * sigmoid(mixes[:, N:2N] * scale[1] + base[N:2N]) + post_eps`` [T, N]
      (HY4: post_mult = ``hc_magnitude``, post_eps = ``hc_eps``; DeepSeek-V4: 2.0 and 0);
    - with Sinkhorn, ``comb`` [T, N, N]: ``c = softmax(mixes[:, 2N:].view(T, N, N) * scale[2] +
      base[2N:].view(N, N), -1) + hc_eps``, then ``c = c / (c.sum(-2, keepdim=True) + hc_eps)``
      (columns), then ``sinkhorn_iters - 1`` times rows then columns: ``c = c / (c.sum(-1,
      keepdim=True) + hc_eps)``; ``c = c / (c.sum(-2, keepdim=True) + hc_eps)``;
    - ``x = sum_i pre[:, i, None] * streams[:, i, :]`` [T, D], accumulated in float32 or wider and
      rounded once to streams' dtype.

    Returns ``(x, post, comb)`` with Sinkhorn and ``(x, post)`` without; post and comb are float32
    (float64 when the parameters are). New tensors; the inputs are not modified.
    """


@spec_op(returns=("out",))
def hc_post(
    y: torch.Tensor,
    streams: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor | None = None,
) -> torch.Tensor:
    """Expand a block's output into the N streams and add the (mixed) residual streams.

    y [T, D] of streams' dtype (the attention or MLP output), streams [T, N, D], post float32
    [T, N], comb float32 [T, N, N] or None (both from ``hc_pre``). In float32 or wider, rounded
    once to streams' dtype::

        out[t, i, :] = post[t, i] * y[t, :] + sum_j comb[t, j, i] * streams[t, j, :]   # with comb
        out[t, i, :] = post[t, i] * y[t, :] + streams[t, i, :]                         # comb None

    Note the transpose: DeepSeek-V4 mixes with ``comb^T @ streams`` (comb is doubly stochastic,
    not symmetric). Returns a new tensor out [T, N, D] in streams' dtype.
    """


@spec_op(returns=("x",))
def hc_head(
    streams: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    *,
    norm_eps: float,
    hc_eps: float,
) -> torch.Tensor:
    """The final collapse of the N streams into one, before the model's last norm.

    streams [T, N, D]; fn float32 [N, N*D], base float32 [N], scale float32 [1]; norm_eps and
    hc_eps as in ``hc_pre``. With ``mixes`` as in the module docstring (M = N):
    ``pre = sigmoid(mixes * scale[0] + base) + hc_eps`` and ``x = sum_i pre[:, i, None] *
    streams[:, i, :]``, accumulated in float32 or wider and rounded once to streams' dtype.
    Returns x [T, D].
    """
