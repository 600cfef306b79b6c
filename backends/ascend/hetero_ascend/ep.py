"""ep_dispatch / ep_combine on torch_npu.npu_moe_distribute_dispatch / _combine: pure conversions (tested on CPU).

Sources (facts only): Ascend/op-plugin docs/context/torch_npu-npu_moe_distribute_dispatch.md (and
hiascend Pytorch 7.0.0 apilist ptaoplist_002364):

- ``npu_moe_distribute_dispatch(x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, *,
  scales, x_active_mask, expert_scales, group_tp, tp_world_size, tp_rank_id, expert_shard_type,
  shared_expert_num, shared_expert_rank_num, quant_mode, global_bs, expert_token_nums_type)`` returns
  ``(expand_x, dynamic_scales, expand_idx, expert_token_nums, ep_recv_counts, tp_recv_counts, expand_scales)``.
- expert_ids int32 [BS, K] in [0, moe_expert_num), the K ids of a row distinct; expert_token_nums int64
  [local_expert_num]: counts per local expert (expert_token_nums_type 1, the default) or their prefix
  sums (type 0); expand_x [A, H] with A >= global_bs * min(local_expert_num, K) (a bound, not the row
  count). Rows grouped per local expert: inferred from expert_token_nums feeding grouped matmul
  (as in the doc's and vllm-ascend's use) -- unverified.
- global_bs: when ranks' BS differ, max_bs * ep_world_size; when equal, 0 or BS * ep_world_size.
- The doc says expand_idx, ep_recv_counts, tp_recv_counts and expand_scales are opaque ("pass them to
  Combine; model logic must not depend on their values"), so the EPDispatch fields built from them
  (weights, token_index, splits, send_index) are placeholders here; ``ep_combine`` of this backend
  uses the op state instead.
- Combine: ``npu_moe_distribute_combine(expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales,
  group_ep, ep_world_size, ep_rank_id, moe_expert_num, *, tp_send_counts, ..., global_bs)`` -> [BS, H];
  expert_scales [BS, K] float32 are the routing weights, applied by the op.
- The communicator name: ``group._get_backend(torch.device("npu")).get_hccl_comm_name(rank)`` (the doc's
  example, global rank) -- never run here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from hetero.kernels.limits import dtype_name
from hetero.spec.types import EPDispatch
from hetero_ascend import support

__all__ = [
    "NpuEPDispatch",
    "product_of",
    "dispatch_limit_reason",
    "hccl_buffsize_mb",
    "duplicate_ids",
    "rank_stats",
    "global_bs",
    "dispatch_args",
    "group_ends_from_token_nums",
    "from_dispatch_outputs",
    "pad_rows",
    "combine_args",
]


@dataclass(frozen=True)
class NpuEPDispatch(EPDispatch):
    """An EPDispatch whose routing state is npu_moe_distribute_dispatch's (for npu_moe_distribute_combine).

    ``x`` and ``group_ends`` follow the spec. ``weights`` (NaN), ``token_index`` (-1), the splits (empty) and
    ``send_index`` (empty) are placeholders: the op does not expose them (see the module docstring).
    """

    expand_rows: int  # A, the row count of the op's expand_x
    expert_ids: torch.Tensor  # the int32 [BS, K] ids passed to dispatch (combine needs them)
    expert_scales: torch.Tensor  # float32 [BS, K] routing weights (combine applies them)
    expand_idx: torch.Tensor
    ep_recv_counts: torch.Tensor
    tp_recv_counts: torch.Tensor | None
    args: Mapping[str, Any]  # the group/size arguments shared by dispatch and combine


def product_of(soc: str | None) -> str | None:
    """'A2' / 'A3' from torch_npu's SoC name, None if unknown (mapping unverified)."""
    if not soc:
        return None
    s = soc.replace(" ", "")
    if s.startswith("Ascend910_93") or s.startswith("Ascend910C"):
        return "A3"
    if s.startswith("Ascend910B"):
        return "A2"
    return None


def hccl_buffsize_mb(env: Mapping[str, str] | None = None) -> int:
    """HCCL_BUFFSIZE in MB (doc default 200)."""
    env = os.environ if env is None else env
    try:
        return int(env.get("HCCL_BUFFSIZE", support.HCCL_BUFFSIZE_DEFAULT_MB))
    except ValueError:
        return support.HCCL_BUFFSIZE_DEFAULT_MB


def _buffer_ok(product: str, max_bs: int, world: int, local: int, k: int, hidden: int, buf_mb: int) -> bool:
    if product == "A2":  # doc: HCCL_BUFFSIZE >= 2 * (BS * world * min(local, K) * H * sizeof(uint16) + 2MB)
        need = 2 * (max_bs * world * min(local, k) * hidden * 2 + 2 * 1024**2)
        return buf_mb * 1024**2 >= need
    # doc (A3): HCCL_BUFFSIZE >= 2 and 1024^2 * (HCCL_BUFFSIZE - 2) / 2 >= BS * 2 * (H + 128) * (world * local + K + 1)
    return buf_mb >= 2 and 1024**2 * (buf_mb - 2) // 2 >= max_bs * 2 * (hidden + 128) * (world * local + k + 1)


def dispatch_limit_reason(
    *,
    product: str | None,
    world: int,
    num_experts: int,
    top_k: int,
    hidden: int,
    min_bs: int,
    max_bs: int,
    dtype: Any,
    duplicates: bool = False,
    buffsize_mb: int = support.HCCL_BUFFSIZE_DEFAULT_MB,
) -> str | None:
    """None if npu_moe_distribute_dispatch/combine take this call (on every rank), else why not.

    ``min_bs`` / ``max_bs``: the smallest / largest token count over the ranks; ``duplicates``: whether
    any rank's ids repeat an expert within a row. ``product`` None: both products' limits must hold.
    """
    op = "npu_moe_distribute_dispatch"
    products = (product,) if product in ("A2", "A3") else ("A2", "A3")
    name = dtype_name(dtype)
    if name not in support.EP_DTYPES:
        return f"{op} takes float16 or bfloat16 tokens, not {name}"
    if not 0 < top_k <= min(support.EP_MAX_TOPK, num_experts):
        return f"{op} takes 0 < top_k <= min({support.EP_MAX_TOPK}, num_experts), not {top_k}"
    if duplicates:
        return f"{op} needs the top_k expert ids of a token to be distinct"
    if not 1 <= num_experts <= support.EP_MAX_EXPERTS or num_experts % world:
        return f"{op} takes 1..{support.EP_MAX_EXPERTS} experts divisible by the world size, not {num_experts}/{world}"
    if min_bs <= 0:
        return f"{op} takes 0 < BS on every rank; a rank has {min_bs} tokens"
    local = num_experts // world
    for p in products:
        if world not in support.EP_WORLD[p]:
            return f"{op} on {p} takes ep_world_size in {support.EP_WORLD[p]}, not {world}"
        if max_bs > support.EP_MAX_BS[p]:
            return f"{op} on {p} takes BS <= {support.EP_MAX_BS[p]}, not {max_bs}"
        if p == "A2":
            if hidden > support.EP_A2_MAX_HIDDEN or hidden % support.EP_A2_HIDDEN_MULTIPLE:
                return (
                    f"{op} on A2 takes hidden sizes up to {support.EP_A2_MAX_HIDDEN} in multiples of 32, not {hidden}"
                )
            if local > support.EP_A2_MAX_LOCAL_EXPERTS:
                return f"{op} on A2 takes at most {support.EP_A2_MAX_LOCAL_EXPERTS} experts per rank, not {local}"
        elif hidden != support.EP_A3_HIDDEN:
            return f"{op} on A3 takes hidden size {support.EP_A3_HIDDEN} only, not {hidden}"
        if not _buffer_ok(p, max_bs, world, local, top_k, hidden, buffsize_mb):
            return f"HCCL_BUFFSIZE={buffsize_mb} MB is too small for {op} on {p} with BS {max_bs}"
    return None


def duplicate_ids(ids: torch.Tensor) -> bool:
    """Whether some row of ids [M, K] names an expert twice."""
    if ids.shape[0] == 0 or ids.shape[1] < 2:
        return False
    s = torch.sort(ids, dim=1).values
    return bool((s[:, 1:] == s[:, :-1]).any())


def rank_stats(m: int, duplicates: bool, device: Any = "cpu") -> torch.Tensor:
    """This rank's [BS, -BS, duplicates] for one all_reduce(max): -> [max_bs, -min_bs, any duplicates]."""
    return torch.tensor([m, -m, int(duplicates)], dtype=torch.int64, device=device)


def global_bs(max_bs: int, world: int) -> int:
    """The doc's global_bs for possibly different BS per rank: max_bs * ep_world_size."""
    return max_bs * world


def dispatch_args(*, comm_name: str, world: int, rank: int, num_experts: int, max_bs: int) -> dict[str, Any]:
    """The size/group keyword arguments shared by dispatch and combine (no TP domain, no shared experts)."""
    return {
        "group_ep": comm_name,
        "ep_world_size": world,
        "ep_rank_id": rank,
        "moe_expert_num": num_experts,
        "expert_shard_type": 0,
        "shared_expert_rank_num": 0,
        "global_bs": global_bs(max_bs, world),
    }


def group_ends_from_token_nums(expert_token_nums: torch.Tensor, cumulative: bool = False) -> torch.Tensor:
    """expert_token_nums (counts, type 1; or prefix sums, type 0) -> hetero's int32 group_ends."""
    t = expert_token_nums.to(torch.int64)
    return (t if cumulative else torch.cumsum(t, 0)).to(torch.int32)


def from_dispatch_outputs(
    outs: tuple,
    *,
    ids: torch.Tensor,
    weights: torch.Tensor,
    num_tokens: int,
    num_experts: int,
    comm: Any,
    args: Mapping[str, Any],
) -> NpuEPDispatch:
    """The op's 7 outputs -> NpuEPDispatch (x = the first P = group_ends[-1] rows of expand_x)."""
    expand_x, _dyn, expand_idx, token_nums, ep_recv_counts, tp_recv_counts, _scales = outs
    ends = group_ends_from_token_nums(token_nums)
    p = int(ends[-1]) if ends.numel() else 0
    dev = expand_x.device
    return NpuEPDispatch(
        x=expand_x[:p],
        group_ends=ends,
        weights=torch.full((p,), float("nan"), dtype=torch.float32, device=dev),
        token_index=torch.full((p,), -1, dtype=torch.int64, device=dev),
        recv_splits=(),
        send_splits=(),
        send_index=torch.empty(0, dtype=torch.int64, device=dev),
        num_tokens=num_tokens,
        num_experts=num_experts,
        comm=comm,
        expand_rows=expand_x.shape[0],
        expert_ids=ids,
        expert_scales=weights,
        expand_idx=expand_idx,
        ep_recv_counts=ep_recv_counts,
        tp_recv_counts=tp_recv_counts,
        args=dict(args),
    )


def pad_rows(y: torch.Tensor, rows: int) -> torch.Tensor:
    """y [P, H] -> [rows, H], zero rows appended (combine takes expand_x's full A rows)."""
    if y.shape[0] >= rows:
        return y
    return torch.cat([y, y.new_zeros(rows - y.shape[0], y.shape[1])], dim=0)


def combine_args(y_local: torch.Tensor, d: NpuEPDispatch) -> dict[str, Any]:
    """Keyword arguments of npu_moe_distribute_combine for hetero's (y_local, dispatch)."""
    return {
        "expand_x": pad_rows(y_local, d.expand_rows),
        "expert_ids": d.expert_ids,
        "expand_idx": d.expand_idx,
        "ep_send_counts": d.ep_recv_counts,
        "tp_send_counts": d.tp_recv_counts,
        "expert_scales": d.expert_scales.float(),
        **d.args,
    }
