"""Tensor- and expert-parallel layouts, checked in one process: each rank of a group is a thread.

Every rank builds the layer with a ``Parallel`` of its rank, loads the whole checkpoint tensor (the
layer keeps its part), and runs its forward; the collectives meet in ``ThreadGroup``. What the ranks
compute together must equal what one rank computes alone, and the parts they hold must tile the
checkpoint tensor. Seconds, not the minutes of the torchrun tests (tests/engine/test_parallel.py).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Callable, Sequence

import pytest
import torch

import hetero
from hetero.engine.context import ModelContext
from hetero.engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from hetero.engine.layers.gated_deltanet import _ConvWeight
from hetero.engine.layers.linear import QKVParallelLinear
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.layers.moe_oai import OaiExperts
from hetero.engine.parallel import Parallel
from hetero.spec.comm import Communicator

OPS = hetero.load("cpu_ref")


class ThreadGroup:
    """What the ranks of one group share: a slot each and a barrier."""

    def __init__(self, size: int):
        self.size = size
        self.slots: list[object] = [None] * size
        self.barrier = threading.Barrier(size, timeout=30)

    def exchange(self, rank: int, value: object) -> list[object]:
        """Every rank's ``value``, in rank order."""
        self.slots[rank] = value
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return got


class ThreadComm(Communicator):
    def __init__(self, group: ThreadGroup, rank: int):
        self.group, self._rank = group, rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self.group.size

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        assert op == "sum"
        return torch.stack(self.group.exchange(self._rank, x.clone())).sum(0)

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return torch.cat(self.group.exchange(self._rank, x.clone()), dim=dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return self.all_reduce(x).chunk(self.group.size, dim)[self._rank]

    def all_to_all(self, x: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int]) -> torch.Tensor:
        sent = self.group.exchange(self._rank, (x.clone(), list(in_splits)))
        parts = [t.split(splits)[self._rank] for t, splits in sent]
        assert [p.shape[0] for p in parts] == list(out_splits)
        return torch.cat(parts)

    def broadcast(self, x: torch.Tensor, src: int) -> torch.Tensor:
        return self.group.exchange(self._rank, x.clone())[src]

    def barrier(self) -> None:
        self.group.exchange(self._rank, None)


def context(parallel: Parallel) -> ModelContext:
    return ModelContext(ops=OPS, parallel=parallel, dtype=torch.float32, device=torch.device("cpu"))


def on_ranks(size: int, fn: Callable[[ModelContext], object], *, expert_parallel: bool = False) -> list[object]:
    """``fn(ctx)`` on every rank of a group of ``size`` threads, in rank order (size 1: no communicator)."""
    if size == 1:
        return [fn(context(Parallel()))]
    group = ThreadGroup(size)

    def rank(r: int) -> object:
        try:
            return fn(context(Parallel(ThreadComm(group, r), expert_parallel=expert_parallel)))
        except BaseException:
            group.barrier.abort()  # the other ranks stop waiting for this one
            raise

    with ThreadPoolExecutor(size) as pool:
        futures = [pool.submit(rank, r) for r in range(size)]
        return [f.result(timeout=60) for f in futures]


def rank_only(rank: int, size: int) -> ModelContext:
    """A context at ``rank`` of ``size`` for loading alone (no collective runs)."""
    return context(Parallel(comm=SimpleNamespace(rank=rank, world_size=size)))


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- vocabulary-parallel embedding and LM head


@pytest.mark.parametrize("size", [2, 3, 4])
def test_vocab_shards_tile_the_table_when_the_vocab_does_not_divide(size):
    vocab, hidden = 10, 4
    table, ids, h = randn(vocab, hidden), torch.arange(vocab).flip(0), randn(3, hidden, seed=1)

    def run(ctx):
        emb, head = VocabParallelEmbedding(ctx, vocab, hidden), ParallelLMHead(ctx, vocab, hidden)
        emb.load_weight(emb.weight, table)
        head.load_weight(head.weight, table)
        return emb.weight[: emb.end - emb.start].clone(), emb(ids), head(h)

    out = on_ranks(size, run)
    assert torch.equal(torch.cat([rows for rows, _, _ in out]), table), "every row held once, in rank order"
    for _, looked_up, logits in out:
        assert torch.equal(looked_up, table[ids])
        torch.testing.assert_close(logits, h @ table.T)


# ---------------------------------------------------------------- attention heads and KV heads per rank


@pytest.mark.parametrize("size, kv_heads", [(2, 4), (4, 2), (4, 4)])
def test_each_rank_holds_the_kv_heads_of_its_query_heads(size, kv_heads):
    heads, head_dim, hidden = 8, 2, 6
    q, k, v = (randn(n * head_dim, hidden, seed=s) for s, n in enumerate((heads, kv_heads, kv_heads)))
    group = heads // kv_heads  # query heads per KV head
    for rank in range(size):
        layer = QKVParallelLinear(rank_only(rank, size), hidden, head_dim, heads, kv_heads)
        for shard, t in zip("qkv", (q, k, v)):
            layer.load_weight(layer.weight, t, shard)
        mine = [rank * (heads // size) + i for i in range(heads // size)]  # this rank's query heads
        want_kv = sorted({h // group for h in mine})
        rows = lambda t, hs: torch.cat([t[h * head_dim : (h + 1) * head_dim] for h in hs])  # noqa: E731
        (q_lo, q_hi), (k_lo, k_hi), (v_lo, v_hi) = (layer.shard_range(s) for s in "qkv")
        assert torch.equal(layer.weight[q_lo:q_hi], rows(q, mine))
        assert torch.equal(layer.weight[k_lo:k_hi], rows(k, want_kv)), f"rank {rank} of {size}"
        assert torch.equal(layer.weight[v_lo:v_hi], rows(v, want_kv)), f"rank {rank} of {size}"


# ---------------------------------------------------------------- MoE: expert ranges and the token shares


def _moe_checkpoint(experts: int, hidden: int, inter: int) -> dict[tuple[int, str], torch.Tensor]:
    shapes = {"gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter)}
    return {(e, p): randn(*shapes[p], seed=10 * e + i) / 2 for e in range(experts) for i, p in enumerate(shapes)}


def _moe(ctx: ModelContext, ckpt, experts: int, hidden: int, inter: int) -> tuple[FusedMoE, list[int]]:
    layer = FusedMoE(ctx, experts, hidden, inter, Routing(top_k=2))
    loaded = []
    for (e, p), t in ckpt.items():
        param = layer.w2 if p == "down" else layer.w13
        if layer.load_expert(param, t, (e, p)) and p == "gate":
            loaded.append(e)
    return layer, loaded


@pytest.mark.parametrize("expert_parallel", [True, False], ids=["ep2", "tp2"])
@pytest.mark.parametrize("tokens", [5, 1])
def test_two_ranks_of_moe_compute_what_one_does(expert_parallel, tokens):
    experts, hidden, inter = 4, 8, 6
    ckpt = _moe_checkpoint(experts, hidden, inter)
    x, logits = randn(tokens, hidden, seed=100), randn(tokens, experts, seed=101)

    def run(ctx):
        layer, loaded = _moe(ctx, ckpt, experts, hidden, inter)
        return loaded, layer(x, logits)

    [(_, want)] = on_ranks(1, run)
    out = on_ranks(2, run, expert_parallel=expert_parallel)
    if expert_parallel:
        assert [loaded for loaded, _ in out] == [[0, 1], [2, 3]], "rank r holds experts [r*E/R, (r+1)*E/R)"
    else:
        assert all(loaded == list(range(experts)) for loaded, _ in out), "every rank holds a slice of every expert"
    for _, y in out:
        torch.testing.assert_close(y, want)


def test_gpt_oss_experts_on_two_ranks_compute_what_one_does():
    experts, hidden, inter = 4, 8, 6
    gate_up, down = randn(experts, hidden, 2 * inter, seed=1) / 3, randn(experts, inter, hidden, seed=2) / 3
    gate_up_bias, down_bias = randn(experts, 2 * inter, seed=3), randn(experts, hidden, seed=4)
    x, logits = randn(5, hidden, seed=5), randn(5, experts, seed=6)

    def run(ctx):
        layer = OaiExperts(ctx, experts, hidden, inter, 2, alpha=1.702, limit=7.0, prefix="mlp.experts")
        for name, t in [
            ("gate_up_proj", gate_up),
            ("down_proj", down),
            ("gate_up_proj_bias", gate_up_bias),
            ("down_proj_bias", down_bias),
        ]:
            param = getattr(layer, name)
            param.weight_loader(param, t)
        layer.post_load()
        return layer(x, logits)

    [want] = on_ranks(1, run)
    for y in on_ranks(2, run):
        torch.testing.assert_close(y, want)


# ---------------------------------------------------------------- Gated DeltaNet: per-section rows


@pytest.mark.parametrize("size", [2, 4])
def test_each_rank_takes_its_share_of_every_conv_section(size):
    sections, width = [8, 8, 16], 4
    full = randn(sum(sections), 1, width)
    starts = [0, 8, 16]
    for rank in range(size):
        conv = _ConvWeight(rank_only(rank, size), sections, width)
        conv.weight.weight_loader(conv.weight, full)
        want = torch.cat(
            [full[s + rank * (n // size) : s + (rank + 1) * (n // size), 0] for s, n in zip(starts, sections)]
        )
        assert torch.equal(conv.weight.data, want)
