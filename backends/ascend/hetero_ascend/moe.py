"""Routing, permutation and expert parallelism of the ascend backend on torch_npu (npu_moe_gating_top_k,
npu_moe_init_routing_v2, npu_moe_token_unpermute, npu_moe_distribute_dispatch / _combine). Never run on an NPU;
the conversions are tested on CPU. The EP ops run the portable hetero._ep path unless the tensors are on an NPU
and the communicator is an HCCL group, so torch_npu is never imported for CPU tensors."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from hetero_ascend import common, convert, ep

__all__ = ["route", "moe_permute", "moe_unpermute", "ep_dispatch", "ep_combine"]


@common.WithTriton
def route(
    triton,
    router_logits,
    *,
    top_k,
    scoring="softmax",
    renormalize=True,
    n_group=1,
    topk_group=1,
    correction_bias=None,
    routed_scaling_factor=1.0,
    fixed_ids=None,
):
    """torch_npu.npu_moe_gating_top_k; never run on an NPU (conversions tested on CPU). Its norm_type has
    softmax and sigmoid only, and it always selects: spec 1.8's sqrtsoftplus and fixed_ids go to the
    portable route (torch)."""
    if scoring not in ("softmax", "sigmoid") or fixed_ids is not None:
        kw = dict(scoring=scoring, renormalize=renormalize, n_group=n_group, topk_group=topk_group)
        kw.update(correction_bias=correction_bias, routed_scaling_factor=routed_scaling_factor, fixed_ids=fixed_ids)
        return triton.route(router_logits, top_k=top_k, **kw)
    args = convert.gating_args(top_k, scoring, n_group, topk_group, correction_bias is not None, routed_scaling_factor)
    bias = None if correction_bias is None else correction_bias.to(router_logits.dtype)
    weights, ids, _ = common.torch_npu().npu_moe_gating_top_k(router_logits, bias=bias, **args)
    return weights.float(), ids.to(torch.int32)


def moe_permute(x, ids, num_experts):
    """torch_npu.npu_moe_init_routing_v2 (dropless, cumsum counts); never run on an NPU
    (conversions tested on CPU)."""
    x_sorted, row_idx, ends, _ = common.torch_npu().npu_moe_init_routing_v2(
        x,
        convert.safe_expert_ids(ids, num_experts),
        active_num=ids.numel(),
        expert_num=num_experts,
        drop_pad_mode=0,
        expert_tokens_num_type=0,
        expert_tokens_num_flag=True,
        row_idx_type=0,
    )
    return x_sorted, ends.to(torch.int32), convert.perm_from_row_idx(row_idx)


def moe_unpermute(y_sorted, perm, weights):
    """torch_npu.npu_moe_token_unpermute; never run on an NPU (conversions tested on CPU)."""
    y = common.torch_npu().npu_moe_token_unpermute(y_sorted.float(), convert.unpermute_indices(perm), weights.float())
    return y.to(y_sorted.dtype)


def _hccl_group(x, comm) -> Any | None:
    """The process group when this call may use torch_npu (x on an NPU, comm over an HCCL group), else None.
    Checks the device first so torch_npu is never imported for CPU tensors."""
    if getattr(x, "device", None) is None or x.device.type != "npu":
        return None
    if importlib.util.find_spec("torch_npu") is None:
        return None
    from hetero.distributed import TorchCommunicator

    if not isinstance(comm, TorchCommunicator):
        return None
    import torch.distributed as dist

    group = comm.group if comm.group is not None else dist.group.WORLD
    try:
        return group if dist.get_backend(group) == "hccl" else None
    except Exception:
        return None


def ep_dispatch(x, ids, weights, *, num_experts, comm):
    """torch_npu.npu_moe_distribute_dispatch where its documented limits hold (checked on all ranks with one
    small all_reduce), else the portable hetero._ep path; never run on an NPU (conversions tested on CPU)."""
    from hetero import ep as portable

    group = _hccl_group(x, comm)
    if group is None:
        return portable.ep_dispatch(x, ids, weights, num_experts=num_experts, comm=comm)
    stats = comm.all_reduce(ep.rank_stats(x.shape[0], ep.duplicate_ids(ids), x.device), "max").tolist()
    max_bs, min_bs, dup = int(stats[0]), -int(stats[1]), bool(stats[2])
    npu = common.torch_npu()
    product = ep.product_of(npu.npu.get_device_name(x.device.index))
    why = ep.dispatch_limit_reason(
        product=product,
        world=comm.world_size,
        num_experts=num_experts,
        top_k=ids.shape[1],
        hidden=x.shape[1],
        min_bs=min_bs,
        max_bs=max_bs,
        dtype=x.dtype,
        duplicates=dup,
        buffsize_mb=ep.hccl_buffsize_mb(),
    )
    if why is not None:  # the same on every rank: all inputs to it are rank-uniform
        return portable.ep_dispatch(x, ids, weights, num_experts=num_experts, comm=comm)
    import torch.distributed as dist

    name = group._get_backend(torch.device("npu")).get_hccl_comm_name(dist.get_rank())
    args = ep.dispatch_args(
        comm_name=name, world=comm.world_size, rank=comm.rank, num_experts=num_experts, max_bs=max_bs
    )
    ids32 = convert.safe_expert_ids(ids, num_experts)
    outs = npu.npu_moe_distribute_dispatch(x, ids32, quant_mode=0, **args)
    return ep.from_dispatch_outputs(
        tuple(outs),
        ids=ids32,
        weights=weights,
        num_tokens=x.shape[0],
        num_experts=num_experts,
        comm=comm,
        args=args,
    )


def ep_combine(y_local, dispatch):
    """torch_npu.npu_moe_distribute_combine for a dispatch made by npu_moe_distribute_dispatch, else the
    portable hetero._ep path; never run on an NPU (conversions tested on CPU)."""
    if isinstance(dispatch, ep.NpuEPDispatch):
        return common.torch_npu().npu_moe_distribute_combine(**ep.combine_args(y_local, dispatch)).to(y_local.dtype)
    from hetero import ep as portable

    return portable.ep_combine(y_local, dispatch)
