"""How the torch backend's attention lays a batch out for batched operators: sequences cut into
padded groups.

A group of B sequences (or pieces of them) becomes queries [B, N, Hq, D] and keys
[B, L, Hkv, D], N and L the group's longest. Grouping keeps the padding cheap and the memory
bounded: pieces are sorted by query rows and key count and taken greedily while the group's
padded logits (B * N * L * Hq) stay under ``SCORE_BUDGET`` and under ``_WASTE`` times its real
ones (or ``_SMALL``), so a decode batch is one group and a mixed batch one group per long
prefill plus one for its decodes; a sequence whose logits alone pass the budget is cut into
pieces of consecutive query rows. The loop here is host bookkeeping over the lengths; every
group is computed by batched torch operators.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SCORE_BUDGET", "Batch", "plan", "rows_of", "pad", "pad_keys", "key_slots", "gather_slots", "gather_paged"]

#: The most logits (rows x heads x keys, padding included) one group holds at once.
SCORE_BUDGET = 1 << 25
#: A group's padded logits may be this many times its real ones, or _SMALL, whichever is larger.
_WASTE, _SMALL = 2, 1 << 16


@dataclass(frozen=True)
class Batch:
    """One padded group: packed row ``tok[t]`` goes to ``[seq[t], row[t]]``; padded row i of group
    sequence s (the op's sequence ``seqs[s]``) sits at position ``first_pos[s] + i`` over
    ``k_lens[s]`` keys."""

    tok: torch.Tensor  # int64 [Tg]
    seq: torch.Tensor  # int64 [Tg]
    row: torch.Tensor  # int64 [Tg]
    seqs: torch.Tensor  # int64 [Bg]
    first_pos: torch.Tensor  # int64 [Bg]
    k_lens: torch.Tensor  # int64 [Bg]
    n: int  # padded query rows
    length: int  # padded keys
    key_count: int  # sum of k_lens

    @property
    def size(self) -> int:
        return self.seqs.shape[0]

    def positions(self) -> torch.Tensor:
        """int64 [Bg, n]: the position of each padded query row."""
        return self.first_pos[:, None] + torch.arange(self.n, device=self.seq.device)[None, :]


@dataclass(frozen=True)
class _Piece:
    seq: int
    start: int  # first packed row
    rows: int
    first_pos: int
    length: int


def _pieces(starts: list[int], k_lens: list[int], heads: int) -> list[_Piece]:
    out = []
    for b, length in enumerate(k_lens):
        n = starts[b + 1] - starts[b]
        cap = max(1, SCORE_BUDGET // max(1, heads * length))
        out += [_Piece(b, starts[b] + a, min(cap, n - a), length - n + a, length) for a in range(0, n, cap)]
    return out


def _groups(pieces: list[_Piece], heads: int) -> list[list[_Piece]]:
    groups: list[list[_Piece]] = []
    cur: list[_Piece] = []
    real = n = length = 0
    for p in sorted(pieces, key=lambda p: (p.rows, p.length), reverse=True):
        n2, l2, real2 = max(n, p.rows), max(length, p.length), real + p.rows * p.length * heads
        padded = (len(cur) + 1) * n2 * l2 * heads
        if cur and (padded > SCORE_BUDGET or padded > max(_WASTE * real2, _SMALL)):
            groups.append(cur)
            cur, n2, l2, real2 = [], p.rows, p.length, p.rows * p.length * heads
        cur.append(p)
        real, n, length = real2, n2, l2
    return groups + [cur] if cur else groups


def rows_of(lens: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(seq [total], row [total]): the sequence and row of each of ``total`` packed rows of lengths ``lens``."""
    seq = torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens, output_size=total)
    first = torch.cumsum(lens, 0) - lens
    return seq, torch.arange(total, device=lens.device) - first[seq]


def _batch(group: list[_Piece], device: torch.device) -> Batch:
    info = torch.tensor(
        [[p.seq, p.start, p.first_pos, p.length, p.rows] for p in group], dtype=torch.int64, device=device
    )
    total = sum(p.rows for p in group)
    seq, row = rows_of(info[:, 4], total)
    return Batch(
        info[:, 1][seq] + row,
        seq,
        row,
        info[:, 0],
        info[:, 2],
        info[:, 3],
        max(p.rows for p in group),
        max(p.length for p in group),
        sum(p.length for p in group),
    )


def plan(starts: list[int], k_lens: list[int], heads: int, device: torch.device) -> list[Batch]:
    """The padded groups of queries delimited by ``starts`` (host, cumulative [B+1]) over
    ``k_lens`` keys (host [B]), ``heads`` query heads; sequences without query rows are left out."""
    return [_batch(g, device) for g in _groups(_pieces(starts, k_lens, heads), heads)]


def pad(x: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The group's packed rows of x [T, ...] -> zero-padded [Bg, n, ...]."""
    res = x.new_zeros((batch.size, batch.n) + tuple(x.shape[1:]))
    res[batch.seq, batch.row] = x.index_select(0, batch.tok)
    return res


def pad_keys(x: torch.Tensor, key_starts: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The group sequences' keys of packed x [Tk, ...] (sequence b's from ``key_starts[b]``) -> [Bg, length, ...]."""
    seq, row = rows_of(batch.k_lens, batch.key_count)
    res = x.new_zeros((batch.size, batch.length) + tuple(x.shape[1:]))
    res[seq, row] = x.index_select(0, key_starts[batch.seqs][seq] + row)
    return res


def key_slots(
    block_table: torch.Tensor, seqs: torch.Tensor, k_lens: torch.Tensor, length: int, num_blocks: int, block_size: int
) -> torch.Tensor:
    """int64 [B, length]: the cache slot (block * BS + offset) of key j of sequence ``seqs[b]``; keys
    past ``k_lens[b]`` repeat its last key, so every slot read holds a written key (a cache's
    unwritten slots may hold NaN, which a mask alone would carry into the output). Block ids are
    clamped into the cache, so metadata left unchecked (validation off) cannot read outside it;
    the table needs ``ceil(length / BS)`` columns."""
    last = (k_lens.to(torch.int64) - 1).clamp_(0, max(length - 1, 0))
    pos = torch.minimum(torch.arange(length, device=k_lens.device)[None, :], last[:, None])
    table = block_table.index_select(0, seqs) if seqs is not None else block_table
    blocks = table.gather(1, pos.div(block_size, rounding_mode="floor")).to(torch.int64).clamp_(0, num_blocks - 1)
    return blocks * block_size + pos.remainder(block_size)


def gather_slots(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache [NB, BS, ...] at slots int64 [B, L] -> [B, L, ...] (one index_select)."""
    flat = cache.flatten(0, 1)
    return flat.index_select(0, slots.flatten()).view(tuple(slots.shape) + tuple(cache.shape[2:]))


def gather_paged(cache: torch.Tensor, block_table: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The group sequences' first ``length`` positions of a paged cache [NB, BS, ...] -> [Bg, length, ...]
    (positions past a sequence's k_lens repeat its last key: ``key_slots``)."""
    slots = key_slots(block_table, batch.seqs, batch.k_lens, batch.length, cache.shape[0], cache.shape[1])
    return gather_slots(cache, slots)
