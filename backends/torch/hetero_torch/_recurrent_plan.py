"""The padded batches of the recurrent ops: the sequences that read or write a state slot, cut
into a few groups, each laid out [B, L, ...] with each sequence's rows first and padding after.

Built on the host from the validated index lists (``check_state_batch``), so every gather and
scatter index is in range on any device; moved to the device in one copy per index tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Batch", "plan"]

#: A group's padded rows may be this many times its real ones, or _SMALL, whichever is larger:
#: a decode batch is one group, a mixed one a group per long prefill plus one for the rest.
_WASTE, _SMALL = 2, 256


@dataclass(frozen=True)
class Batch:
    """B active sequences padded to ``length`` rows.

    rows [B*length]: the token row each padded position reads (padding repeats the sequence's
    first row); valid [B, length]: which positions are real; lens [B]; slots, initial [B];
    dst [R], src [R]: the real positions' token rows and their flat padded positions.
    """

    size: int
    length: int
    fresh: bool  # some sequence has no initial state
    rows: torch.Tensor
    valid: torch.Tensor
    lens: torch.Tensor
    slots: torch.Tensor
    initial: torch.Tensor
    dst: torch.Tensor
    src: torch.Tensor

    @property
    def decode(self) -> bool:
        """Every sequence one row: padded positions are the rows themselves."""
        return self.length == 1

    def pad(self, x: torch.Tensor, zero: bool = False) -> torch.Tensor:
        """x [T, ...] gathered to [B, length, ...]; ``zero``: padding positions set to 0."""
        xp = x.index_select(0, self.rows).view(self.size, self.length, *x.shape[1:])
        if zero and not self.decode:
            mask = self.valid.view(self.size, self.length, *(1,) * (x.ndim - 1))
            xp = torch.where(mask, xp, torch.zeros((), dtype=xp.dtype, device=xp.device))
        return xp

    def scatter(self, out: torch.Tensor, y: torch.Tensor) -> None:
        """out[row] = y at each real position; y [B, length, ...] in out's dtype."""
        flat = y.reshape(self.size * self.length, *y.shape[2:])
        out.index_copy_(0, self.dst, flat if self.decode else flat.index_select(0, self.src))

    def initial_state(self, state: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """state[slot] in ``dtype`` per sequence, 0 (never read: NaN allowed) without initial state."""
        s = state.index_select(0, self.slots).to(dtype)
        if not self.fresh:
            return s
        mask = self.initial.view(-1, *(1,) * (s.ndim - 1))
        return torch.where(mask, s, torch.zeros((), dtype=dtype, device=s.device))


def _padded(rows: int, chunk: int | None) -> int:
    """rows rounded up to a multiple of ``chunk`` when longer than one chunk."""
    return -(-rows // chunk) * chunk if chunk and rows > chunk else rows


def _groups(lens: list[int], chunk: int | None) -> list[list[int]]:
    """Indices into ``lens`` cut into groups, longest first, each padding at most _WASTE times its rows (or _SMALL)."""
    order = sorted(range(len(lens)), key=lambda i: -lens[i])
    groups: list[list[int]] = []
    for i in order:
        if groups:
            group = groups[-1]
            padded = (len(group) + 1) * _padded(lens[group[0]], chunk)
            if padded <= max(_WASTE * (sum(lens[j] for j in group) + lens[i]), _SMALL):
                group.append(i)
                continue
        groups.append([i])
    return groups


def _batch(
    starts: list[int], slots: list[int], initial: list[bool], act: list[int], device: torch.device, chunk: int | None
) -> Batch:
    """Sequences ``act`` (longest first) padded to the longest, rounded as ``_padded`` says."""
    begin = torch.tensor([starts[n] for n in act], dtype=torch.int64)
    lens = torch.tensor([starts[n + 1] - starts[n] for n in act], dtype=torch.int64)
    length = _padded(int(lens.max()), chunk)
    steps = torch.arange(length, dtype=torch.int64)
    valid = steps[None, :] < lens[:, None]
    rows = torch.where(valid, begin[:, None] + steps[None, :], begin[:, None]).flatten()
    src = valid.flatten().nonzero().flatten()
    dev = {"device": device}
    return Batch(
        len(act),
        length,
        not all(initial[n] for n in act),
        rows.to(**dev),
        valid.to(**dev),
        lens.to(**dev),
        torch.tensor([slots[n] for n in act], dtype=torch.int64, **dev),
        torch.tensor([initial[n] for n in act], dtype=torch.bool, **dev),
        rows[src].to(**dev),
        src.to(**dev),
    )


def plan(
    starts: list[int], slots: list[int], initial: list[bool], device: torch.device, chunk: int | None = None
) -> list[Batch]:
    """The sequences with a slot and at least one row, in padded groups (none when there are none):
    each padded to its longest, rounded up to a multiple of ``chunk`` when longer than one chunk."""
    act = [n for n, s in enumerate(slots) if s >= 0 and starts[n + 1] > starts[n]]
    lens = [starts[n + 1] - starts[n] for n in act]
    return [_batch(starts, slots, initial, [act[i] for i in g], device, chunk) for g in _groups(lens, chunk)]
