"""Quantization methods of the engine's Linear and FusedMoE layers, and how a model picks one per layer.

``base``: the method interfaces (``LinearMethod``, ``MoEMethod``); ``unquantized``: today's
float path; ``config``: ``QuantConfig`` (prefix -> method) and ``quant_config_of`` (config.json's
``quantization_config`` -> QuantConfig). A new format (fp8 block-scaled, say) is one module
with its methods and a QuantConfig builder, registered in ``config.FORMATS``: ``fp8`` and
``compressed_tensors`` (8-bit weights, methods in ``scaled``; W4A16 ``pack-quantized``), ``gptq`` and
``awq`` (int4 weights, methods in ``int4_linear`` / ``int4_moe``); ``weights_only`` turns their
activation quantization off.
"""

from __future__ import annotations

from hetero.engine.quant._select import weights_only
from hetero.engine.quant.base import LinearMethod, MoEMethod, QuantMethod, register_weight
from hetero.engine.quant.config import FORMATS, QuantConfig, UnsupportedQuantization, quant_config_of
from hetero.engine.quant.unquantized import UnquantizedLinearMethod, UnquantizedMoEMethod

__all__ = [
    "QuantMethod",
    "LinearMethod",
    "MoEMethod",
    "register_weight",
    "UnquantizedLinearMethod",
    "UnquantizedMoEMethod",
    "QuantConfig",
    "FORMATS",
    "UnsupportedQuantization",
    "quant_config_of",
    "weights_only",
]
