"""Error metrics of an output against the float64 oracle."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

__all__ = ["Metrics", "compare"]


@dataclass(frozen=True)
class Metrics:
    """Errors over the elements where the oracle is finite, plus the count of
    elements whose NaN/Inf pattern differs from the oracle's."""

    rel_l2: float
    max_abs: float
    max_rel: float
    cosine: float
    nonfinite_mismatch: int
    scale: float  # max |oracle| over finite elements: what relative floors scale with
    numel: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def compare(got: torch.Tensor, want: torch.Tensor) -> Metrics:
    """Metrics of ``got`` against ``want`` (same shape), computed in float64 on the CPU."""
    g = got.detach().to("cpu", torch.float64)
    w = want.detach().to("cpu", torch.float64)
    finite = torch.isfinite(w)
    # where the oracle is -inf/+inf/NaN the output must match it exactly; elsewhere it must be finite
    same_nonfinite = (g == w) | (torch.isnan(g) & torch.isnan(w))
    mismatch = int(((~finite) & ~same_nonfinite).sum()) + int((finite & ~torch.isfinite(g)).sum())
    ok = finite & torch.isfinite(g)
    # everything finite (the usual case): the flattened tensors, without boolean-mask copies
    gf, wf = (g.reshape(-1), w.reshape(-1)) if bool(ok.all()) else (g[ok], w[ok])
    if gf.numel() == 0:
        return Metrics(0.0, 0.0, 0.0, 1.0, mismatch, 0.0, g.numel())
    diff = (gf - wf).abs()
    wnorm = float(wf.norm())
    scale = float(wf.abs().max())
    if wnorm > 0:
        rel_l2 = float((gf - wf).norm()) / wnorm
    else:  # an all-zero oracle: any difference is infinitely wrong, none is exact
        rel_l2 = float("inf") if float(diff.max()) > 0 else 0.0
    denom = wf.abs().clamp_min(max(scale, 1e-30) * 1e-3)  # relative error, not blown up by near-zeros
    gnorm = float(gf.norm())
    cosine = float((gf * wf).sum()) / (gnorm * wnorm) if gnorm > 0 and wnorm > 0 else float(gnorm == wnorm)
    return Metrics(rel_l2, float(diff.max()), float((diff / denom).max()), cosine, mismatch, scale, g.numel())
