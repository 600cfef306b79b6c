"""Hyper-connections: the residual stream held as ``hc_mult`` streams [T, N, H] (Tencent HY4, DeepSeek-V4).

Around each sublayer (attention, MLP) a ``HyperConnection`` collapses the streams into the sublayer's
input with learned per-token weights (``hc_pre``: ``x``, and the ``post`` weights that spread the
sublayer's output back over the streams, plus a Sinkhorn-normalized ``comb`` mixing for DeepSeek-V4),
then adds the output back (``hc_post``). ``HyperHead`` collapses the streams once more before the final
norm (``hc_head``). Every mixing parameter is float32 and every mix is computed in float32, as the
reference keeps them. Under tensor parallelism the streams and these parameters are replicated on every
rank: an activation of N times the hidden size per token lives on each rank (4x the residual memory of
a plain decoder, at HY4's and DeepSeek-V4's N = 4).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.weights import copy_checked, join_prefix

__all__ = ["HyperConnection", "HyperHead", "expand_streams", "entry_streams"]


def expand_streams(hidden: torch.Tensor, streams: int) -> torch.Tensor:
    """The embedding output [T, H] copied into ``streams`` identical streams [T, N, H]."""
    return hidden.unsqueeze(1).expand(-1, streams, -1).contiguous()


def entry_streams(hidden: torch.Tensor, embedded: bool, capture: list | None, streams: int) -> torch.Tensor:
    """A hyper-connection model's streams at its (pipeline stage's) start: the embedding output ``hidden``
    (appended to ``capture``) copied into ``streams`` streams when ``embedded``, else ``hidden`` as the previous
    stage sent it."""
    if not embedded:
        return hidden
    if capture is not None:
        capture.append(hidden)
    return expand_streams(hidden, streams)


def _float32_params(module: nn.Module, ctx: ModelContext, prefix: str, shapes: dict[str, tuple[int, ...]]) -> None:
    for name, shape in shapes.items():
        p = nn.Parameter(torch.empty(shape, dtype=torch.float32, device=ctx.device), requires_grad=False)
        what = join_prefix(prefix, name)
        p.weight_loader = lambda param, t, shard=None, what=what: copy_checked(param, t, what)
        p.shards = (None,)
        module.register_parameter(name, p)


class HyperConnection(nn.Module):
    """One sublayer's stream mixing; ``names``: the checkpoint's (fn, base, scale) parameter names.

    ``pre(streams) -> (x, post, comb)`` and ``post(y, streams, post, comb) -> streams``. Without Sinkhorn
    (HY4) ``fn`` is [2N, N*H] and ``scale`` [2]; with ``sinkhorn_iters`` (DeepSeek-V4) [N(N+2), N*H], [3].
    """

    def __init__(
        self,
        ctx: ModelContext,
        config: Any,
        *,
        names: tuple[str, str, str] = ("fn", "base", "scale"),
        post_mult: float = 2.0,
        post_eps: float = 0.0,
        sinkhorn_iters: int = 0,
        prefix: str = "",
    ):
        super().__init__()
        n, h = int(config.hc_mult), int(config.hidden_size)
        m = n * (n + 2) if sinkhorn_iters else 2 * n
        self.prefix, self.names = prefix, names
        _float32_params(self, ctx, prefix, dict(zip(names, ((m, n * h), (m,), (3 if sinkhorn_iters else 2,)))))
        self.options = dict(
            norm_eps=float(config.rms_norm_eps),
            hc_eps=float(config.hc_eps),
            post_mult=float(post_mult),
            post_eps=float(post_eps),
            sinkhorn_iters=int(sinkhorn_iters),
        )
        ctx.bind_op(self, "_pre", "hc_pre", sinkhorn_iters=int(sinkhorn_iters))
        ctx.bind_op(self, "_post", "hc_post")

    def pre(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        fn, base, scale = (getattr(self, name) for name in self.names)
        out = self._pre(streams, fn, scale, base, **self.options)
        return out if self.options["sinkhorn_iters"] else (*out, None)  # comb only with Sinkhorn

    def post(
        self, y: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor | None
    ) -> torch.Tensor:
        return self._post(y, streams, post, comb)


class HyperHead(nn.Module):
    """``forward(streams [T, N, H]) -> [T, H]``: the last collapse, before the model's final norm; ``names``:
    the checkpoint's (fn [N, N*H], base [N], scale [1]) parameter names."""

    def __init__(self, ctx: ModelContext, config: Any, *, names: tuple[str, str, str], prefix: str = ""):
        super().__init__()
        n, h = int(config.hc_mult), int(config.hidden_size)
        self.prefix, self.names = prefix, names
        _float32_params(self, ctx, prefix, dict(zip(names, ((n, n * h), (n,), (1,)))))
        self.options = dict(norm_eps=float(config.rms_norm_eps), hc_eps=float(config.hc_eps))
        ctx.bind_op(self, "_head", "hc_head")

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        fn, base, scale = (getattr(self, name) for name in self.names)
        return self._head(streams, fn, scale, base, **self.options)
