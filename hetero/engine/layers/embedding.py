"""Token embedding and LM head, vocabulary split over tensor-parallel ranks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.weights import copy_checked

__all__ = ["VocabParallelEmbedding", "ParallelLMHead"]


class VocabParallelEmbedding(nn.Module):
    """Rank r holds rows [r*V/R, (r+1)*V/R) of the table (the last rank pads when V % R != 0).

    A rank looks up the ids it owns, zeroes the others, and the ranks sum their
    rows with one explicit all_reduce. ``prefix`` is the checkpoint name ("model.embed_tokens").
    """

    def __init__(self, ctx: ModelContext, vocab_size: int, hidden: int, *, prefix: str = ""):
        super().__init__()
        self.ctx, self.vocab_size, self.prefix = ctx, vocab_size, prefix
        size = ctx.parallel.size
        self.per_rank = -(-vocab_size // size)
        self.start = ctx.parallel.rank * self.per_rank
        self.end = min(self.start + self.per_rank, vocab_size)
        self.weight = nn.Parameter(ctx.empty(self.per_rank, hidden), requires_grad=False)
        self.weight.weight_loader, self.weight.shards = self.load_weight, (None,)

    def load_weight(self, param: nn.Parameter, tensor: torch.Tensor, shard=None) -> None:
        if tensor.shape[0] != self.vocab_size:
            raise ValueError(
                f"{type(self).__name__}: expected {self.vocab_size} rows, the checkpoint has {tensor.shape[0]}"
            )
        param.data.zero_()
        copy_checked(param.data[: self.end - self.start], tensor[self.start : self.end], type(self).__name__)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.ctx.parallel.size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.start) & (input_ids < self.end)
        rows = F.embedding(torch.where(mine, input_ids - self.start, 0), self.weight)
        return self.ctx.parallel.all_reduce(rows * mine.unsqueeze(-1).to(rows.dtype))


class ParallelLMHead(VocabParallelEmbedding):
    """logits = hidden @ W.T through ``gemm`` on this rank's vocabulary slice, gathered over ranks.

    The logits keep the model's dtype, as transformers' and vLLM's LM heads do: a bfloat16 model's
    greedy choice then breaks ties where the reference breaks them, and the 152k-row weight is not
    widened to float32 on every step. The sampler widens the rows it samples from or scores.
    """

    def __init__(self, ctx: ModelContext, vocab_size: int, hidden: int, *, prefix: str = ""):
        super().__init__(ctx, vocab_size, hidden, prefix=prefix)
        ctx.bind_op(self, "_gemm", "gemm")

    def tie(self, embedding: VocabParallelEmbedding) -> None:
        """Share the embedding table (tie_word_embeddings): one Parameter, loaded once."""
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._gemm(hidden, self.weight)
        logits = self.ctx.parallel.all_gather(logits, dim=-1)
        return logits[..., : self.vocab_size]
