"""``LLM.export_cache``: a running request's cache out of the pools, gathered from every tensor-parallel rank's
shard on rank 0, in a layout an engine of any tensor-parallel size imports (``runtime.cache_io``)."""

from __future__ import annotations

from hetero.engine.runtime.cache_io import SequenceCache, export_sequence_cache, gather_sequence_cache
from hetero.errors import UsageError

__all__ = ["export_running"]


def export_running(llm, request_id: str | None) -> SequenceCache | None:
    """Rank 0 names the request; every rank of the tensor-parallel group calls this together, and rank 0 gets
    the whole cache (the others None). A request rank 0 does not run is refused on rank 0 only, after the
    others learned there is nothing to export."""
    if llm.pipeline is not None:
        raise UsageError(
            "export_cache: not supported under pipeline parallelism (each stage holds its own layers' cache)",
            arg="pipeline_parallel_size",
            expected=1,
            got=llm.config.pipeline_parallel_size,
        )
    where = None
    if llm.rank == 0:
        for seq in llm.scheduler.running:
            if seq.request_id == request_id:
                slot = None if seq.state_slot is None else seq.state_slot + seq.state_column
                where = (list(seq.block_table), slot, seq.num_computed_tokens, list(seq.token_ids))
    parallel, device = llm.runner.parallel, llm.runner.device
    where = parallel.broadcast_object(where, device)
    if where is None:
        if llm.rank != 0:
            return None
        raise UsageError(
            f"export_cache: argument 'request_id': no running request {request_id!r}",
            arg="request_id",
            expected="a running request",
            got=request_id,
        )
    cache = export_sequence_cache(llm.runner.cache, *where)
    if parallel.size > 1:
        cache = gather_sequence_cache(cache, llm.runner.cache, lambda t: parallel.all_gather(t.to(device)).cpu())
    return cache if llm.rank == 0 else None
