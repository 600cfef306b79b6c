"""The model registry: ``architectures[0]`` of config.json -> model class (imported on use)."""

from __future__ import annotations

import importlib

from hetero.engine.models.base import CausalLM
from hetero.errors import UsageError

__all__ = ["ARCHITECTURES", "model_class", "UnsupportedArchitecture"]

#: architectures[0] -> "module:Class" under hetero.engine.models, or a model class (an out-of-tree model)
ARCHITECTURES: dict[str, str | type[CausalLM]] = {
    "Qwen2ForCausalLM": "qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "qwen3:Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "qwen3_moe:Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM": "qwen3_next:Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM": "qwen3_5:Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM": "qwen3_5:Qwen3_5MoeForCausalLM",
    "DeepseekV2ForCausalLM": "deepseek:DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM": "deepseek:DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM": "deepseek_v32:DeepseekV32ForCausalLM",
    "DeepseekV4ForCausalLM": "deepseek_v4:DeepseekV4ForCausalLM",
    "GlmMoeDsaForCausalLM": "deepseek_v32:GlmMoeDsaForCausalLM",
    "GptOssForCausalLM": "gpt_oss:GptOssForCausalLM",
    "HunYuanDenseV1ForCausalLM": "hunyuan:HunYuanDenseV1ForCausalLM",
    "HunYuanMoEV1ForCausalLM": "hunyuan:HunYuanMoEV1ForCausalLM",
    "HYV3ForCausalLM": "hy_v3:HYV3ForCausalLM",
    "HYV4ForCausalLM": "hy_v4:HYV4ForCausalLM",
    "HYV4VLForConditionalGeneration": "hy_v4:HYV4VLForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration": "qwen3_5:Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5:Qwen3_5MoeForConditionalGeneration",
    "Kimi_K25ForConditionalGeneration": "deepseek:Kimi_K25ForConditionalGeneration",
    # the name Moonshot's own config.json gives it (its remote code's class)
    "KimiK25ForConditionalGeneration": "deepseek:Kimi_K25ForConditionalGeneration",
    "KimiLinearForCausalLM": "kimi_linear:KimiLinearForCausalLM",
    "MiniMaxM2ForCausalLM": "minimax_m2:MiniMaxM2ForCausalLM",
    "MiMoV2FlashForCausalLM": "mimo_v2:MiMoV2FlashForCausalLM",
    "Glm4MoeForCausalLM": "glm4_moe:Glm4MoeForCausalLM",
    "Ernie4_5_MoeForCausalLM": "ernie4_5:Ernie4_5_MoeForCausalLM",
}


class UnsupportedArchitecture(UsageError):
    """config.json names an architecture the engine has no model for."""


def model_class(architectures: list[str] | None) -> type[CausalLM]:
    """The model class for a config's ``architectures`` list, or UnsupportedArchitecture listing the supported ones."""
    supported = ", ".join(sorted(ARCHITECTURES))
    if not architectures:
        raise UnsupportedArchitecture(f"config.json has no 'architectures' entry; supported: {supported}")
    name = architectures[0]
    if name not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"architecture {name!r} is not supported by hetero.engine; supported: {supported}"
        )
    target = ARCHITECTURES[name]
    if isinstance(target, type):
        return target
    module, cls = target.split(":")
    return getattr(importlib.import_module(f"hetero.engine.models.{module}"), cls)
