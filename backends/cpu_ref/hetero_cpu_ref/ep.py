"""Reference expert parallelism: the core's device-agnostic implementation (``hetero.ep``), bound as the oracle."""

from __future__ import annotations

import torch

from hetero import ep as portable
from hetero.spec import validate
from hetero.spec.comm import Communicator
from hetero.spec.types import EPDispatch

__all__ = ["ep_dispatch", "ep_combine"]


def ep_dispatch(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    *,
    num_experts: int,
    comm: Communicator,
) -> EPDispatch:
    portable.check_dispatch(x, ids, weights, num_experts, comm)  # shapes first, then the ids' values
    validate.ep_dispatch(x, ids, weights, num_experts=num_experts)
    return portable.ep_dispatch(x, ids, weights, num_experts=num_experts, comm=comm)


def ep_combine(y_local: torch.Tensor, dispatch: EPDispatch) -> torch.Tensor:
    return portable.ep_combine(y_local, dispatch)
