"""Pipeline parallelism: which layers this process's stage owns, its peers, and the stand-ins for the rest.

The world of ``tensor_parallel_size`` x ``pipeline_parallel_size`` processes is laid out stage-major:
global rank = ``stage * tp + tp_rank``. Each stage is a tensor-parallel group of its own (EP runs
inside it); tp rank r of a stage sends its hidden states to tp rank r of the next one, and the last
stage's tp rank 0 sends the sampled tokens back to global rank 0, which owns the requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from torch import nn

from hetero.errors import UsageError
from hetero.spec.comm import Communicator

__all__ = [
    "Stage",
    "StandIn",
    "partition",
    "parse_partition",
    "stage_layers",
    "stand_in_names",
    "pipeline_groups",
    "stage_of",
]


def partition(num_layers: int, num_stages: int, override: Sequence[int] | None = None) -> list[int]:
    """Layers per stage: ``override`` when given (checked), else an even split whose remainder goes one
    layer each to the stages before the last, nearest it first (the last stage also runs the norm, the
    head and the sampler). UsageError naming ``pp_layer_partition`` or the sizes when it cannot be split."""
    if override is not None:
        counts = list(override)
        if len(counts) != num_stages or any(c < 1 for c in counts) or sum(counts) != num_layers:
            raise UsageError(
                f"EngineConfig.pp_layer_partition must give {num_stages} stage sizes, each >= 1, summing to the "
                f"model's {num_layers} layers, got {counts}",
                arg="pp_layer_partition",
                expected=f"{num_stages} integers >= 1 summing to {num_layers}",
                got=counts,
            )
        return counts
    if num_layers < num_stages:
        raise UsageError(
            f"pipeline_parallel_size={num_stages} needs at least one decoder layer per stage; the model has "
            f"{num_layers}",
            arg="pipeline_parallel_size",
            expected=f"<= {num_layers}",
            got=num_stages,
        )
    counts = [num_layers // num_stages] * num_stages
    for i in range(num_layers % num_stages):
        counts[-2 - i] += 1
    return counts


def parse_partition(value: Any) -> tuple[int, ...] | None:
    """``pp_layer_partition`` as given (a sequence of ints, or a string "12,12,8" as vLLM's
    VLLM_PP_LAYER_PARTITION), as a tuple; UsageError otherwise."""
    if value is None:
        return None
    try:
        items = value.split(",") if isinstance(value, str) else list(value)
        if any(isinstance(v, bool) or not isinstance(v, (int, str)) for v in items):
            raise ValueError
        counts = tuple(int(str(v).strip()) for v in items)
    except (TypeError, ValueError):
        raise UsageError(
            f"EngineConfig.pp_layer_partition must be layer counts per stage (e.g. [12, 12, 8] or '12,12,8'), "
            f"got {value!r}",
            arg="pp_layer_partition",
            expected="a list of integers or a comma-separated string",
            got=value,
        ) from None
    return counts


def stage_layers(counts: Sequence[int], stage: int) -> tuple[int, int]:
    """The [start, end) layer range of ``stage`` under ``counts``."""
    start = sum(counts[:stage])
    return start, start + counts[stage]


@dataclass(frozen=True)
class Stage:
    """This process's pipeline stage: ``index`` of ``size``, its decoder layers ``[start, end)``,
    ``world`` (the communicator of every rank, for the stage-to-stage transfers) and ``tp`` (the
    tensor-parallel size of every stage)."""

    index: int
    size: int
    start: int
    end: int
    world: Communicator
    tp: int

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.size - 1

    def owns(self, layer: int) -> bool:
        return self.start <= layer < self.end

    @property
    def tp_rank(self) -> int:
        return self.world.rank % self.tp

    @property
    def next_rank(self) -> int:
        """The global rank this one sends its stage's output to (the next stage's same tp rank)."""
        return self.world.rank + self.tp

    @property
    def prev_rank(self) -> int:
        return self.world.rank - self.tp

    @property
    def samples(self) -> bool:
        """Whether this rank samples (the last stage's tp rank 0)."""
        return self.last and self.tp_rank == 0


class StandIn(nn.Module):
    """What a stage holds in place of a module another stage owns (a decoder layer, the embedding, the
    final norm, the head): no parameters, no cache, and an error if called. The loader skips the
    checkpoint tensors under its name."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.what} belongs to another pipeline stage; this stage cannot run it")

    def extra_repr(self) -> str:
        return self.what


def stand_in_names(model: nn.Module) -> tuple[str, ...]:
    """The qualified names of ``model``'s stand-ins, each ending in "." (prefixes of the parameters they replace)."""
    return tuple(f"{name}." for name, m in model.named_modules() if isinstance(m, StandIn))


def pipeline_groups(world: Communicator, tp: int, pp: int, counts: Sequence[int]) -> tuple[Communicator | None, Stage]:
    """This rank's tensor-parallel group (None when ``tp`` is 1) and its ``Stage``. Every rank calls it
    together: each stage's group is created on every rank, in stage order."""
    from hetero.distributed import subgroup

    index = world.rank // tp
    groups = [list(range(s * tp, (s + 1) * tp)) for s in range(pp)]
    tp_comm = subgroup(world, groups) if tp > 1 else None
    start, end = stage_layers(counts, index)
    return tp_comm, Stage(index, pp, start, end, world, tp)


def stage_of(config: Any, num_layers: int, world: Communicator) -> tuple[Communicator | None, Stage]:
    """The tensor-parallel group and ``Stage`` of this rank under an ``EngineConfig``, for a model of
    ``num_layers`` decoder layers."""
    pp, tp = config.pipeline_parallel_size, config.tensor_parallel_size
    return pipeline_groups(world, tp, pp, partition(num_layers, pp, config.pp_layer_partition))
