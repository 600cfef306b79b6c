"""The ascend backend's ep_dispatch / ep_combine: pure conversions to npu_moe_distribute_* and CPU delegation.

No NPU here: the torch_npu path is never run; on CPU tensors the methods must run hetero._ep unchanged
and never import torch_npu.
"""

from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("hetero_ascend.plugin", reason="hetero-ascend is not installed (pip install -e backends/ascend)")
from hetero import ep as _ep  # noqa: E402
from hetero.spec.comm import Communicator  # noqa: E402
from hetero_ascend import ep  # noqa: E402
from hetero_ascend.plugin import AscendBackend  # noqa: E402


class SoloComm(Communicator):
    """World size 1: every collective returns its input."""

    def __init__(self):
        self.calls = []

    @property
    def rank(self):
        return 0

    @property
    def world_size(self):
        return 1

    def all_reduce(self, x, op="sum"):
        self.calls.append("all_reduce")
        return x.clone()

    def all_gather(self, x, dim=0):
        return x.clone()

    def reduce_scatter(self, x, dim=0):
        return x.clone()

    def all_to_all(self, x, out_splits, in_splits):
        self.calls.append("all_to_all")
        return x.clone()

    def broadcast(self, x, src):
        return x.clone()

    def barrier(self):
        pass


def _inputs(m=6, h=16, e=8, k=2, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]).to(torch.int32)
    w = torch.rand(m, k, generator=g)
    return x, ids, w


def _backend():
    return AscendBackend.__new__(AscendBackend)  # no device needed: the CPU path uses no state


# -- pure conversions ---------------------------------------------------------------------------------
def test_group_ends_from_counts_and_prefix_sums():
    counts = torch.tensor([3, 0, 2, 0], dtype=torch.int64)
    assert ep.group_ends_from_token_nums(counts).tolist() == [3, 3, 5, 5]
    assert ep.group_ends_from_token_nums(counts).dtype == torch.int32
    assert ep.group_ends_from_token_nums(torch.tensor([3, 3, 5, 5]), cumulative=True).tolist() == [3, 3, 5, 5]


def test_group_ends_match_spec_single_rank():
    """On one rank the spec's group_ends are the cumulative per-expert pair counts."""
    x, ids, w = _inputs()
    d = _ep.ep_dispatch(x, ids, w, num_experts=8, comm=SoloComm())
    counts = torch.bincount(ids.reshape(-1).long(), minlength=8)
    assert torch.equal(ep.group_ends_from_token_nums(counts), d.group_ends)


def test_dispatch_args_layout():
    a = ep.dispatch_args(comm_name="hccl_ep", world=16, rank=3, num_experts=64, max_bs=8)
    assert a == {
        "group_ep": "hccl_ep",
        "ep_world_size": 16,
        "ep_rank_id": 3,
        "moe_expert_num": 64,
        "expert_shard_type": 0,
        "shared_expert_rank_num": 0,
        "global_bs": 128,
    }


def test_from_dispatch_outputs_and_combine_args():
    a_rows, h = 10, 4
    expand_x = torch.arange(a_rows * h, dtype=torch.float16).reshape(a_rows, h)
    token_nums = torch.tensor([2, 0, 3], dtype=torch.int64)
    ids = torch.tensor([[0, 2], [1, 2]], dtype=torch.int32)
    w = torch.rand(2, 2)
    outs = (
        expand_x,
        None,
        torch.zeros(4, dtype=torch.int32),
        token_nums,
        torch.zeros(3, dtype=torch.int32),
        None,
        None,
    )
    args = ep.dispatch_args(comm_name="c", world=8, rank=0, num_experts=24, max_bs=2)
    d = ep.from_dispatch_outputs(outs, ids=ids, weights=w, num_tokens=2, num_experts=24, comm=SoloComm(), args=args)
    assert d.x.shape == (5, h) and torch.equal(d.x, expand_x[:5])
    assert d.group_ends.tolist() == [2, 2, 5] and d.expand_rows == a_rows
    y = torch.ones(5, h, dtype=torch.float16)
    c = ep.combine_args(y, d)
    assert c["expand_x"].shape == (a_rows, h) and c["expand_x"][5:].abs().sum() == 0
    assert c["ep_send_counts"] is d.ep_recv_counts and c["expert_ids"] is ids
    assert c["expert_scales"].dtype == torch.float32 and c["global_bs"] == 16 and c["moe_expert_num"] == 24


def test_product_of():
    assert ep.product_of("Ascend910B3") == "A2"
    assert ep.product_of("Ascend910_9382") == "A3"
    assert ep.product_of("cpu") is None and ep.product_of(None) is None


def test_duplicate_ids_and_stats():
    assert ep.duplicate_ids(torch.tensor([[1, 1]], dtype=torch.int32))
    assert not ep.duplicate_ids(torch.tensor([[1, 2], [2, 1]], dtype=torch.int32))
    assert not ep.duplicate_ids(torch.empty(0, 2, dtype=torch.int32))
    assert ep.rank_stats(5, True).tolist() == [5, -5, 1]


def test_hccl_buffsize():
    assert ep.hccl_buffsize_mb({}) == 200
    assert ep.hccl_buffsize_mb({"HCCL_BUFFSIZE": "1024"}) == 1024


_OK_A2 = dict(
    product="A2",
    world=16,
    num_experts=64,
    top_k=8,
    hidden=4096,
    min_bs=1,
    max_bs=64,
    dtype=torch.bfloat16,
    buffsize_mb=1024,
)
_OK_A3 = dict(_OK_A2, product="A3", hidden=7168, buffsize_mb=2048)


@pytest.mark.parametrize("base", [_OK_A2, _OK_A3])
def test_limits_accept(base):
    assert ep.dispatch_limit_reason(**base) is None


@pytest.mark.parametrize(
    "change,word",
    [
        (dict(top_k=9), "top_k"),
        (dict(top_k=0), "top_k"),
        (dict(dtype=torch.float32), "float16"),
        (dict(duplicates=True), "distinct"),
        (dict(num_experts=60), "divisible"),
        (dict(num_experts=1024), "experts"),
        (dict(min_bs=0), "BS"),
        (dict(max_bs=300), "BS <= 256"),
        (dict(world=8), "ep_world_size"),
        (dict(hidden=4100), "multiples of 32"),
        (dict(hidden=8192), "hidden"),
        (dict(num_experts=16 * 25), "per rank"),
        (dict(buffsize_mb=50), "HCCL_BUFFSIZE"),
    ],
)
def test_limits_refuse_a2(change, word):
    why = ep.dispatch_limit_reason(**{**_OK_A2, **change})
    assert why is not None and word in why


def test_limits_a3_and_unknown_product():
    assert "7168" in ep.dispatch_limit_reason(**{**_OK_A3, "hidden": 4096})
    assert ep.dispatch_limit_reason(**{**_OK_A3, "max_bs": 300}) is None  # A3: BS <= 512
    assert ep.dispatch_limit_reason(**{**_OK_A3, "world": 8}) is None
    # unknown product: both products' limits must hold
    assert ep.dispatch_limit_reason(**{**_OK_A3, "product": None, "world": 8}) is not None
    assert ep.dispatch_limit_reason(**{**_OK_A3, "product": None, "hidden": 4096}) is not None


# -- the methods on CPU delegate to hetero._ep ----------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_delegates_to_portable(dtype, monkeypatch):
    calls = []
    real_d, real_c = _ep.ep_dispatch, _ep.ep_combine
    monkeypatch.setattr(_ep, "ep_dispatch", lambda *a, **k: calls.append("d") or real_d(*a, **k))
    monkeypatch.setattr(_ep, "ep_combine", lambda *a, **k: calls.append("c") or real_c(*a, **k))
    b = _backend()
    x, ids, w = _inputs(dtype=dtype)
    comm = SoloComm()
    d = b.ep_dispatch(x, ids, w, num_experts=8, comm=comm)
    assert not isinstance(d, ep.NpuEPDispatch) and calls == ["d"]
    assert "all_reduce" not in comm.calls  # the npu limit check (one all_reduce) never runs on CPU
    want = real_d(x, ids, w, num_experts=8, comm=SoloComm())
    for f in ("x", "group_ends", "weights", "token_index", "send_index"):
        assert torch.equal(getattr(d, f), getattr(want, f)), f
    assert (d.recv_splits, d.send_splits) == (want.recv_splits, want.send_splits)
    y = torch.randn(d.x.shape[0], x.shape[1]).to(dtype)
    out = b.ep_combine(y, d)
    assert calls == ["d", "c"] and torch.equal(out, real_c(y, want))
    assert "torch_npu" not in sys.modules


def test_empty_rank_on_cpu():
    b = _backend()
    x, ids, w = torch.zeros(0, 8), torch.zeros(0, 2, dtype=torch.int32), torch.zeros(0, 2)
    d = b.ep_dispatch(x, ids, w, num_experts=4, comm=SoloComm())
    assert d.x.shape == (0, 8) and d.group_ends.tolist() == [0, 0, 0, 0]
    assert b.ep_combine(d.x, d).shape == (0, 8)


def test_notes_and_support():
    notes = AscendBackend.op_notes()
    for op, fn in (("ep_dispatch", "npu_moe_distribute_dispatch"), ("ep_combine", "npu_moe_distribute_combine")):
        assert f"torch_npu.{fn} where" in notes[op] and "never run on an NPU" in notes[op]
        assert "never run on an NPU" in getattr(AscendBackend, op).__doc__
        assert _backend().supports(op) is None
