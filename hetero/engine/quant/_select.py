"""Which layers of a scaled checkpoint are quantized: a QuantConfig over one ``Scheme`` and its skip list."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar

from hetero.engine.quant.base import LinearMethod, MoEMethod
from hetero.engine.quant.config import QuantConfig, UnsupportedQuantization
from hetero.engine.quant.scaled import ScaledLinearMethod, ScaledMoEMethod, Scheme
from hetero.engine.quant.unquantized import UnquantizedLinearMethod, UnquantizedMoEMethod

__all__ = ["ScaledQuantConfig", "weights_only", "ALWAYS_FLOAT", "DEQUANTIZED"]

#: layers no scaled checkpoint quantizes: MoE routers (and Qwen's shared-expert gate), the output head, the
#: DSA indexer's head weights (bf16 in DeepSeek-V3.2's checkpoint, float32 in the engine); DeepSeek-V4's
#: compressor and indexer-compressor projections and its indexer's head weights (bf16 in its release)
ALWAYS_FLOAT = (
    r"(.*\.)?mlp\.gate",
    r".*\.shared_expert_gate",
    r"(.*\.)?lm_head",
    r".*\.indexer\.weights_proj",
    r".*\.compressor\.(indexer\.)?(kv_proj|gate_proj)",
    r".*\.indexer\.scorer\.weights_proj",
)
#: quantized layers run on their dequantized weight (W8A16): MLA's kv_b_proj, whose absorbed decode
#: multiplies its per-head slices by the queries and the latent output (vLLM does the same)
DEQUANTIZED = (r".*\.kv_b_proj",)
#: the engine's packed Linears and the checkpoint modules each holds
_PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _parts(prefix: str) -> list[str]:
    """The checkpoint module names behind the engine layer at ``prefix``."""
    head, _, last = prefix.rpartition(".")
    return [f"{head}.{p}" if head else p for p in _PACKED.get(last, (last,))]


def _listed(name: str, entry: str) -> bool:
    """Whether skip-list ``entry`` (a module name or suffix; compressed-tensors' ``re:`` regex) names ``name``."""
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    return name == entry or name.endswith("." + entry)


@dataclass(frozen=True)
class ScaledQuantConfig(QuantConfig):
    """Every Linear and FusedMoE quantized by ``scheme``, except ``ALWAYS_FLOAT`` and the checkpoint's
    ``skip`` list (``modules_to_not_convert`` / ``ignore``); ``DEQUANTIZED`` layers run weights only."""

    scheme: Scheme | None = None
    skip: tuple[str, ...] = ()
    #: the methods of the quantized layers, built from the scheme (a subclass for another format's)
    linear_cls: ClassVar[Callable[[Any], LinearMethod]] = ScaledLinearMethod
    moe_cls: ClassVar[Callable[[Any], MoEMethod]] = ScaledMoEMethod

    def _skipped(self, prefix: str) -> bool:
        parts = _parts(prefix)
        hits = [any(_listed(p, e) for e in self.skip) for p in parts]
        if any(hits) and not all(hits):
            raise UnsupportedQuantization(
                f"{prefix}: the checkpoint leaves only some of {', '.join(parts)} unquantized; "
                "the engine packs them into one layer of one format"
            )
        return all(hits) or any(re.fullmatch(p, prefix) for p in ALWAYS_FLOAT)

    def linear_method(self, prefix: str) -> LinearMethod:
        if self._skipped(prefix):
            return UnquantizedLinearMethod()
        scheme = self.scheme.weights_only() if any(re.fullmatch(p, prefix) for p in DEQUANTIZED) else self.scheme
        return type(self).linear_cls(scheme)

    def moe_method(self, prefix: str) -> MoEMethod:
        if self._skipped(prefix):
            return UnquantizedMoEMethod()
        if any(e.startswith(prefix + ".") for e in self.skip):
            raise UnsupportedQuantization(
                f"{prefix}: the checkpoint leaves some experts unquantized; the engine "
                "stacks every expert of a layer in one format"
            )
        return type(self).moe_cls(self.scheme)

    def describe(self) -> str:
        """One line for the command line: the format and what it quantizes."""
        skipped = f"; left in float: {', '.join(self.skip)}" if self.skip else ""
        return f"{self.name}: {self.scheme.describe()}{skipped}"


def weights_only(config: QuantConfig) -> QuantConfig:
    """``config`` with activation quantization off (W8A16: every layer on its dequantized weights), for
    checking weight loading exactly; a config without a scheme is returned as it is."""
    scheme = getattr(config, "scheme", None)
    if scheme is None:
        return config
    return replace(config, scheme=scheme.weights_only(), name=f"{config.name} (weights only)")
