"""Rotary position embedding through ``rotary_embedding``; frequencies from transformers' rope functions."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.errors import UsageError

__all__ = ["RotaryEmbedding", "rope_frequencies"]


def rope_frequencies(
    hf_config: Any, rotary_dim: int, *, ntk_alpha: bool = False, layer_type: str | None = None
) -> tuple[torch.Tensor, float]:
    """(inv_freq float32 [rotary_dim/2], attention factor) of the config's rope type.

    "default" is the plain theta^(-2i/d) schedule; every scaled type (yarn, linear,
    dynamic, llama3, longrope) comes from ``transformers.modeling_rope_utils``, so the
    engine computes exactly the frequencies the checkpoint was trained with. ``ntk_alpha``: the
    family reads "dynamic" with ``alpha`` as Hunyuan's fixed NTK-alpha table (elsewhere alpha is refused).
    ``layer_type``: the rope of that key of a config whose ``rope_parameters`` holds one per kind of
    layer (DeepSeek-V4's "main" and "compress").
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    if layer_type is not None:
        params = dict(params[layer_type])
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))
    if rope_type == "dynamic" and params.get("alpha"):
        if not ntk_alpha:  # transformers' generic dynamic rope ignores alpha; Hunyuan's classes do not
            raise UsageError(
                "rope_parameters.alpha (an NTK-alpha rope) is implemented for the Hunyuan families only",
                arg="rope_parameters.alpha",
                expected="no alpha for this architecture",
                got=params["alpha"],
            )
        return _ntk_alpha(params, theta, rotary_dim), 1.0
    if rope_type == "default":
        return _plain(theta, rotary_dim), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        known = f"default, {', '.join(ROPE_INIT_FUNCTIONS)}"
        raise UsageError(
            f"rope_type {rope_type!r} is not supported; known: {known}",
            arg="rope_parameters.rope_type",
            expected=known,
            got=rope_type,
        )
    kw = {"layer_type": layer_type} if layer_type is not None else {}
    inv_freq, factor = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"), **kw)
    if inv_freq.numel() * 2 != rotary_dim:
        raise ValueError(
            f"rope {rope_type!r}: transformers computed {inv_freq.numel() * 2} rotary dims, the model uses {rotary_dim}"
        )
    return inv_freq.float(), float(factor)


def _plain(theta: float, rotary_dim: int) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))


#: the fields a fixed NTK-alpha rope may carry, and the value each must have when it has no effect there
#: (Hunyuan's checkpoints keep yarn-style fields beside ``alpha``; transformers reads only theta and alpha)
_NTK_ALPHA_NEUTRAL = {"factor": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
_NTK_ALPHA_IGNORED = ("beta_fast", "beta_slow")  # yarn's ramp bounds: no ramp without yarn


def _ntk_alpha(params: dict, theta: float, rotary_dim: int) -> torch.Tensor:
    """Hunyuan's rope: labelled "dynamic", but a fixed ``alpha`` stretches the base once,
    ``theta * alpha ** (d / (d - 2))`` (transformers' HunYuan*RotaryEmbedding), whatever the sequence length.
    A field that would change the table elsewhere, at a value that would, is refused by name."""
    known = {"rope_type", "type", "rope_theta", "alpha", *_NTK_ALPHA_NEUTRAL, *_NTK_ALPHA_IGNORED}
    for name, value in params.items():
        if name not in known:
            raise UsageError(
                f"rope_parameters.{name} is not implemented for an NTK-alpha rope (rope_type 'dynamic' with alpha)",
                arg=f"rope_parameters.{name}",
                expected=f"only {', '.join(sorted(known))}",
                got=value,
            )
        if name in _NTK_ALPHA_NEUTRAL and value is not None and float(value) != _NTK_ALPHA_NEUTRAL[name]:
            raise UsageError(
                f"rope_parameters.{name} = {value} would scale an NTK-alpha rope, which hetero does not implement",
                arg=f"rope_parameters.{name}",
                expected=f"{_NTK_ALPHA_NEUTRAL[name]} (no effect)",
                got=value,
            )
    return _plain(theta * float(params["alpha"]) ** (rotary_dim / (rotary_dim - 2)), rotary_dim)


class RotaryEmbedding(nn.Module):
    """Rotates the first ``rotary_dim`` dims of q and k by position (neox or interleaved pairs).

    The cos/sin table [max_positions, rotary_dim] is float32, scaled by the rope's
    attention factor (yarn's mscale), built once at init.
    """

    def __init__(
        self,
        ctx: ModelContext,
        hf_config: Any,
        rotary_dim: int,
        max_positions: int,
        *,
        is_neox: bool = True,
        ntk_alpha: bool = False,
        layer_type: str | None = None,
    ):
        super().__init__()
        inv_freq, factor = rope_frequencies(hf_config, rotary_dim, ntk_alpha=ntk_alpha, layer_type=layer_type)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        cache = torch.cat([freqs.cos() * factor, freqs.sin() * factor], dim=-1)
        self.register_buffer("cos_sin_cache", cache.to(ctx.device), persistent=False)
        self.is_neox = is_neox
        ctx.bind_op(self, "_rotary", "rotary_embedding")

    def twin(self, ctx: ModelContext) -> RotaryEmbedding:
        """Another module over the same cos/sin table (no copy). Each layer holds its own twin, so
        its rotary calls carry that layer's module path (a shared module has only one)."""
        twin = RotaryEmbedding.__new__(RotaryEmbedding)
        nn.Module.__init__(twin)
        twin.register_buffer("cos_sin_cache", self.cos_sin_cache, persistent=False)
        twin.is_neox = self.is_neox
        ctx.bind_op(twin, "_rotary", "rotary_embedding")
        return twin

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._rotary(positions, q, k, self.cos_sin_cache, is_neox=self.is_neox)
