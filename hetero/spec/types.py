"""Types shared by the operator families."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["AttentionMeta", "FLOAT_DTYPES"]

#: Activation dtypes every floating-point op accepts (float64 is the oracle's).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


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

    Query row i of a sequence with n query rows and KV length L sits at position
    ``L - n + i`` (causal masks align bottom-right).
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    max_query_len: int
    max_seq_len: int

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
