"""Choosing a method per layer: a ``QuantConfig`` maps checkpoint prefixes to methods, and
``quant_config_of`` builds one from a config.json's ``quantization_config``."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from hetero.engine.quant.base import LinearMethod, MoEMethod
from hetero.engine.quant.unquantized import UnquantizedLinearMethod, UnquantizedMoEMethod
from hetero.errors import UsageError

__all__ = ["QuantConfig", "FORMATS", "UnsupportedQuantization", "quant_config_of", "describe_quantization"]

#: ``quantization_config["quant_method"]`` -> "module:function" under hetero.engine.quant; the function
#: takes that dict and returns the format's QuantConfig. A format is one new module and one line here.
FORMATS: dict[str, str] = {
    "fp8": "fp8:fp8_config",
    "compressed-tensors": "compressed_tensors:compressed_tensors_config",
    "gptq": "gptq:gptq_config",
    "awq": "awq:awq_config",
}


class UnsupportedQuantization(UsageError):
    """config.json declares a quantization format the engine has no methods for."""


@dataclass(frozen=True)
class QuantConfig:
    """The method of each layer, from its checkpoint prefix ("model.layers.3.mlp.gate_up_proj").

    ``linear`` and ``moe`` are (prefix regex, method factory) pairs; the first regex that
    matches the whole prefix wins, and a layer no rule matches gets the unquantized method.
    A format puts the layers it leaves alone (``modules_to_not_convert``, routers,
    ``lm_head``) first, mapped to ``UnquantizedLinearMethod``. The default quantizes nothing.
    """

    name: str = "unquantized"
    linear: tuple[tuple[str, Callable[[], LinearMethod]], ...] = ()
    moe: tuple[tuple[str, Callable[[], MoEMethod]], ...] = ()

    def linear_method(self, prefix: str) -> LinearMethod:
        """A new method object for the Linear at ``prefix``."""
        return _pick(self.linear, prefix, UnquantizedLinearMethod)

    def moe_method(self, prefix: str) -> MoEMethod:
        """A new method object for the FusedMoE at ``prefix``."""
        return _pick(self.moe, prefix, UnquantizedMoEMethod)


def _pick(rules, prefix: str, default: Callable):
    for pattern, make in rules:
        if re.fullmatch(pattern, prefix):
            return make()
    return default()


def quant_config_of(hf_config: Any) -> QuantConfig:
    """The QuantConfig a checkpoint's config asks for: unquantized without ``quantization_config``;
    an unknown ``quant_method`` is an UnsupportedQuantization naming it (never a silent float load)."""
    qc = getattr(hf_config, "quantization_config", None)
    if not qc:
        return QuantConfig()
    if not isinstance(qc, Mapping):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else vars(qc)
    method = qc.get("quant_method")
    if method not in FORMATS:
        supported = ", ".join(sorted(FORMATS)) or "none yet, unquantized checkpoints only"
        raise UnsupportedQuantization(
            f"quantization_config.quant_method {method!r} is not supported by hetero.engine (supported: {supported})"
        )
    module, fn = FORMATS[method].split(":")
    return getattr(importlib.import_module(f"hetero.engine.quant.{module}"), fn)(dict(qc))


def describe_quantization(hf_config: Any) -> str:
    """One line saying how a checkpoint is quantized ("unquantized" without ``quantization_config``); an
    unsupported format raises UnsupportedQuantization, as loading it would."""
    config = quant_config_of(hf_config)
    describe = getattr(config, "describe", None)
    return describe() if callable(describe) else config.name
