"""Types shared by the operator families.

``AttentionMeta`` and ``EPDispatch`` are registered as pytrees
(``torch.utils._pytree``): their tensor fields are the leaves and their host
fields (ints, splits, the communicator, a step plan) the context, so ``tree_map``
over an op's arguments reaches every tensor inside them (widening to float64,
moving to a device, recording) and rebuilds the same type. A rebuilt
``AttentionMeta`` keeps its plan, which then serves nothing: its tensors are new.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.utils._pytree as pytree

if TYPE_CHECKING:
    from hetero.spec.comm import Communicator

__all__ = ["AttentionMeta", "EPDispatch", "Plan", "FLOAT_DTYPES"]

#: Activation dtypes every floating-point op accepts (float64 is the oracle's).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True, eq=False)
class Plan:
    """One step's index metadata, checked and prepared once for every layer of the step (spec 1.6).

    Made by ``hetero.Ops.plan_attention`` (carried by ``AttentionMeta.plan``) and
    ``hetero.Ops.plan_recurrent`` (the ``plan=`` option of the recurrent ops; state slots [N] only,
    spec 1.11's per-token slots [N, M] take no plan), never per layer.

    - ``sources``: the index tensors it was made from, and ``sizes`` the host values it was made
      for (attention: T, NB, BS, max_query_len, max_seq_len; recurrent: T, S).
    - ``checked``: whether the tensors' values were checked against ``sizes`` when it was made
      (``hetero.spec.validate``'s checks, with the backend's validation on).
    - ``backend``: the name of the backend whose ``plan_*`` hook made ``data``, the hook's own
      preparation (None when the backend has no hook); only that backend reads it.

    An op uses a plan only for the very tensors and sizes it was made for (:meth:`serves`); given
    any other, or none, it computes what it computes without one. Writing into the source
    tensors after planning, as with FlashInfer's ``plan``, leaves the plan stale: undefined
    results, yet every kernel still masks each index it loads.
    """

    sources: tuple[torch.Tensor, ...] = field(repr=False)
    sizes: tuple[int, ...]
    checked: bool
    backend: str
    data: Any = field(default=None, repr=False)

    def serves(self, sources: Sequence[torch.Tensor], sizes: Sequence[int]) -> bool:
        """Whether this plan was made for exactly these tensors (the same objects) and sizes."""
        return (
            len(sources) == len(self.sources)
            and all(a is b for a, b in zip(sources, self.sources))
            and tuple(sizes) == self.sizes
        )


@dataclass(frozen=True)
class AttentionMeta:
    """Batch layout of one engine step, built once and shared by every attention layer.

    B sequences are packed token-major into T query rows.

    - ``query_start_loc`` int32 [B+1]: cumulative query lengths, starting at 0 and
      ending at T; sequence b owns query rows ``[query_start_loc[b], query_start_loc[b+1])``.
    - ``seq_lens`` int32 [B]: KV length of each sequence, its new tokens included
      (already written to the cache by ``write_kv``); ``seq_lens[b] >= `` its query length.
    - ``block_table`` int32 [B, max_blocks]: physical KV block ids; the first
      ``ceil(seq_lens[b] / BS)`` entries of row b are used, the rest is padding.
    - ``max_query_len``, ``max_seq_len``: host ints, the maxima of the two lengths.
    - ``plan``: the step's :class:`Plan` (``hetero.Ops.plan_attention``), or None; optional
      for every op (spec 1.6).

    Query row i of a sequence with n query rows and KV length L sits at position
    ``L - n + i`` (causal masks align bottom-right).
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    max_query_len: int
    max_seq_len: int
    plan: Plan | None = field(default=None, compare=False)

    def planned(self, num_tokens: int, num_blocks: int, block_size: int) -> Plan | None:
        """The plan, when it was made for this metadata over T tokens and a cache of NB blocks of BS slots."""
        sizes = (num_tokens, num_blocks, block_size, self.max_query_len, self.max_seq_len)
        plan = self.plan
        return plan if plan is not None and plan.serves(self.tensors(), sizes) else None

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query_start_loc, seq_lens, block_table): what a plan of this metadata is made from."""
        return self.query_start_loc, self.seq_lens, self.block_table

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @classmethod
    def build(
        cls,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        block_table: torch.Tensor | Sequence[Sequence[int]],
        device: torch.device | str | None = None,
    ) -> "AttentionMeta":
        """Build the metadata from host lists of per-sequence query and KV lengths."""
        qsl = [0]
        for n in query_lens:
            qsl.append(qsl[-1] + int(n))
        bt = torch.as_tensor(block_table, dtype=torch.int32, device=device)
        if bt.ndim == 1 and bt.numel() == 0:
            bt = bt.reshape(len(seq_lens), 0)
        return cls(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
            seq_lens=torch.tensor([int(s) for s in seq_lens], dtype=torch.int32, device=device),
            block_table=bt,
            max_query_len=max((int(n) for n in query_lens), default=0),
            max_seq_len=max((int(s) for s in seq_lens), default=0),
        )


@dataclass(frozen=True)
class EPDispatch:
    """What ``ep_dispatch`` returns on one rank: its experts' rows, and the routing state ``ep_combine`` needs.

    R ranks, E experts; this rank r owns the E/R experts ``[expert_offset,
    expert_offset + E/R)``. P is the number of (token, local expert) pairs this
    rank received, N the number of distinct tokens it received, S the number of
    token rows it sent.

    - ``x`` [P, H]: one row per (token, local expert) pair, grouped by local
      expert (expert order, and within an expert by source rank, then source
      token index, then top-k slot), in the dtype of the dispatched x.
    - ``group_ends`` int32 [E/R]: cumulative row counts per local expert (the
      ``grouped_gemm`` form); an expert with no rows repeats the previous end.
    - ``weights`` float32 [P]: the routing weight of each pair.
    - ``token_index`` int64 [P]: which of the N received tokens each pair came from.
    - ``recv_splits``: N split per source rank (tokens received from each rank, in rank order).
    - ``send_splits``: S split per destination rank (tokens this rank sent to each rank).
    - ``send_index`` int64 [S]: the index in this rank's x of each token it sent,
      grouped by destination rank.
    - ``num_tokens``: M, this rank's token count; ``num_experts``: E; ``comm``: the communicator used.
    """

    x: torch.Tensor
    group_ends: torch.Tensor
    weights: torch.Tensor
    token_index: torch.Tensor
    recv_splits: tuple[int, ...]
    send_splits: tuple[int, ...]
    send_index: torch.Tensor
    num_tokens: int
    num_experts: int
    comm: "Communicator"

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.comm.world_size

    @property
    def expert_offset(self) -> int:
        """The global id of this rank's first expert."""
        return self.comm.rank * self.num_local_experts


def _register_pytree(cls: type, static: tuple[str, ...]) -> None:
    """Register a frozen dataclass: the fields not in ``static`` are children, ``static`` ones the context."""
    dynamic = tuple(f.name for f in fields(cls) if f.name not in static)

    def flatten(obj: Any) -> tuple[list[Any], tuple[Any, ...]]:
        return [getattr(obj, n) for n in dynamic], tuple(getattr(obj, n) for n in static)

    def unflatten(children: Any, context: tuple[Any, ...]) -> Any:
        return cls(**dict(zip(dynamic, children)), **dict(zip(static, context)))

    def flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], tuple[Any, ...]]:
        children, context = flatten(obj)
        return [(pytree.GetAttrKey(n), c) for n, c in zip(dynamic, children)], context

    pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=flatten_with_keys,
    )


_register_pytree(AttentionMeta, static=("max_query_len", "max_seq_len", "plan"))
_register_pytree(EPDispatch, static=("recv_splits", "send_splits", "num_tokens", "num_experts", "comm"))
