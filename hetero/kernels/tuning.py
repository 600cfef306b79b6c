"""Tuning tables: kernel launch parameters per vendor and architecture, as data.

A backend owns one :class:`TuningTable`; the kernels ask it for the parameters
of one kernel on the current architecture (``table.get(arch, "gemm")``) and get
the architecture's entry merged over the table's defaults, so a missing entry
never breaks a launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

__all__ = ["TuningTable", "Tuning", "PORTABLE_DEFAULTS", "INTERPRETER"]

#: Safe parameters every Triton target compiles: modest tiles, 4 warps, 2 stages.
PORTABLE_DEFAULTS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 2},
        "grouped_gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2},
        "scaled_gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 2},
        "fused_moe": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2},
        "scaled_grouped_gemm": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2},
        "quantize_activation": {"BLOCK_M": 4, "BLOCK_K": 128, "num_warps": 4},
        "paged_attention": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
        "varlen_attention": {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
        "mla_attention": {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
        "elementwise": {"BLOCK": 1024, "num_warps": 4},
        "rows": {"num_warps": 4},
        # recurrent ops (hetero.kernels.recurrent), untimed on hardware so far: chunk 64 as fla / vLLM; the
        # conv tile is the largest that ptxas (sm90, compiled without a GPU) fits without spilling
        "causal_conv1d": {"BLOCK_T": 32, "BLOCK_C": 128, "TILES_PER_PROGRAM": 4, "num_warps": 4},
        "gated_delta_rule": {"BLOCK_T": 64, "BLOCK_V": 32, "RECURRENT_ROWS": 1, "num_warps": 8, "num_stages": 1},
        "gated_delta_rule_decode": {"BLOCK_V": 32, "num_warps": 4},
    }
)

#: The interpreter runs each program in NumPy: bigger tiles mean fewer Python-level steps.
INTERPRETER: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 512},
        "grouped_gemm": {"BLOCK_M": 8, "BLOCK_N": 256, "BLOCK_K": 1024},
        "scaled_gemm": {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 512},
        "fused_moe": {"BLOCK_M": 4, "BLOCK_N": 4096, "BLOCK_K": 4096},
        "scaled_grouped_gemm": {"BLOCK_M": 8, "BLOCK_N": 512, "BLOCK_K": 128},
        "quantize_activation": {"BLOCK_M": 64, "BLOCK_K": 1024},
        "paged_attention": {"BLOCK_M": 32, "BLOCK_N": 64},
        "varlen_attention": {"BLOCK_M": 32, "BLOCK_N": 64},
        "mla_attention": {"BLOCK_M": 16, "BLOCK_N": 64},
        "elementwise": {"BLOCK": 16384},
        "causal_conv1d": {"BLOCK_C": 1024, "TILES_PER_PROGRAM": 64},
        "gated_delta_rule": {"BLOCK_T": 16, "BLOCK_V": 128},
        "gated_delta_rule_decode": {"BLOCK_V": 128},
    }
)


@dataclass(frozen=True)
class TuningTable:
    """``archs[arch][kernel]`` overrides ``defaults[kernel]`` key by key; ``arch`` is what the backend
    reports for its device ("sm90", "gfx942", "interpreter", ...)."""

    vendor: str
    archs: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: PORTABLE_DEFAULTS)

    def get(self, arch: str, kernel: str) -> dict[str, Any]:
        params = dict(self.defaults.get(kernel, {}))
        params.update(self.archs.get(arch, {}).get(kernel, {}))
        if arch == "interpreter":
            params.update(INTERPRETER.get(kernel, {}))
        return params


@dataclass(frozen=True)
class Tuning:
    """What a kernel wrapper receives: the table bound to one architecture, and whether the
    Triton interpreter runs the kernels (then bf16 dot operands are upcast to float32,
    since the interpreter of triton 3.9 returns garbage for a bf16 ``tl.dot``)."""

    table: TuningTable
    arch: str
    interpreted: bool = False

    def __call__(self, kernel: str) -> dict[str, Any]:
        return self.table.get(self.arch, kernel)

    @staticmethod
    def launch_options(params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Split parameters into (constexpr meta-parameters, launch options num_warps/num_stages)."""
        launch = {k: params[k] for k in ("num_warps", "num_stages") if k in params}
        meta = {k: v for k, v in params.items() if k not in launch}
        return meta, launch
