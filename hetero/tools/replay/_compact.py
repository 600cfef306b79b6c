"""Only the KV blocks and state slots a call touches: what makes recording an attention call cheap.

An attention op receives the whole paged cache of its layer (every block of every sequence),
a recurrent op the whole state pool; a call reads or writes only the blocks its block table
and slot mapping name (the slots its ``state_slots`` name). The recorder keeps those, in
order, and renumbers the call's block table, slot mapping and state slots to match, so the
replayed call computes exactly what the recorded one did on a cache of a few blocks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from hetero.spec.types import AttentionMeta

__all__ = ["Compaction", "compaction"]

#: the spec's paged-cache arguments (dim 0: KV blocks, dim 1: slots of a block)
PAGED = ("k_cache", "v_cache", "ckv_cache", "kpe_cache", "index_cache", "index_scale")
#: the spec's state-pool arguments (dim 0: state slots)
STATES = ("conv_state", "ssm_state")


def _used_blocks(args: dict[str, Any], block_size: int) -> torch.Tensor:
    parts = []
    meta = args.get("meta")
    if isinstance(meta, AttentionMeta):
        table, lens = meta.block_table.long(), meta.seq_lens.long()
        used = torch.arange(table.shape[1], device=table.device) < ((lens + block_size - 1) // block_size)[:, None]
        parts.append(table[used])
    slots = args.get("slot_mapping")
    if isinstance(slots, torch.Tensor):
        parts.append(slots[slots >= 0].long() // block_size)
    return torch.cat(parts).unique() if parts else torch.zeros(0, dtype=torch.long)


def _renumber(ids: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """``ids`` as positions in sorted ``kept``; ids not kept become 0 (entries the op never reads)."""
    if kept.numel() == 0:
        return torch.zeros_like(ids)
    flat = ids.long()
    pos = torch.searchsorted(kept, flat.contiguous()).clamp_max(kept.numel() - 1)
    return torch.where(kept[pos] == flat, pos, torch.zeros_like(pos)).to(ids.dtype)


@dataclasses.dataclass
class Compaction:
    """The kept block ids (sorted) of a paged call and the kept state slots of a recurrent one."""

    blocks: torch.Tensor | None
    block_size: int
    slots: torch.Tensor | None

    def arguments(self, args: dict[str, Any]) -> dict[str, Any]:
        """``args`` with caches / pools cut to the kept entries and the indices renumbered."""
        out = dict(args)
        if self.blocks is not None:
            for name in PAGED:
                if isinstance(args.get(name), torch.Tensor):
                    out[name] = args[name].index_select(0, self.blocks.to(args[name].device))
            meta = args.get("meta")
            if isinstance(meta, AttentionMeta):
                out["meta"] = dataclasses.replace(meta, block_table=_renumber(meta.block_table, self.blocks))
            slots = args.get("slot_mapping")
            if isinstance(slots, torch.Tensor):
                bs = self.block_size
                block = _renumber(torch.div(slots, bs, rounding_mode="floor"), self.blocks)
                out["slot_mapping"] = torch.where(slots >= 0, block * bs + slots.remainder(bs), slots)
        if self.slots is not None:
            for name in STATES:
                if isinstance(args.get(name), torch.Tensor):
                    out[name] = args[name].index_select(0, self.slots.to(args[name].device))
            ids = args["state_slots"]
            out["state_slots"] = torch.where(ids >= 0, _renumber(ids, self.slots), ids)
        return out

    def outputs(self, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Mutated caches / pools of a call cut the same way (returned outputs unchanged)."""
        out = dict(outputs)
        for name, t in outputs.items():
            if self.blocks is not None and name in PAGED:
                out[name] = t.index_select(0, self.blocks.to(t.device))
            elif self.slots is not None and name in STATES:
                out[name] = t.index_select(0, self.slots.to(t.device))
        return out


def compaction(args: dict[str, Any]) -> Compaction | None:
    """How to cut one call's arguments, or None when it has no paged cache or state pool."""
    cache = next((args[n] for n in PAGED if isinstance(args.get(n), torch.Tensor)), None)
    blocks = block_size = None
    if cache is not None:
        block_size = int(cache.shape[1])
        blocks = _used_blocks(args, block_size).to(cache.device)
    slots = args.get("state_slots")
    kept_slots = (
        slots[slots >= 0].long().unique()
        if isinstance(slots, torch.Tensor) and any(isinstance(args.get(n), torch.Tensor) for n in STATES)
        else None
    )
    if blocks is None and kept_slots is None:
        return None
    return Compaction(blocks, block_size or 0, kept_slots)
