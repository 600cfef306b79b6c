"""The multimodal releases (``*ForConditionalGeneration``), text only: one mechanism for every wrapper.

A release such as Qwen3.5, Qwen3.5-MoE, Kimi-K2.5 or HY4-VL nests its text model's config under
``text_config`` and stores a vision tower and a projector beside the text weights. hetero runs the text
model: a wrapper class is ``TextOfMultimodal`` ahead of its text model's class, declaring

- ``text_renames``: ``WeightMapping.renames`` from the release's text prefix to the text class's names
  (``model.language_model.`` -> ``model.``); empty where the release already uses them (HY4-VL);
- ``vision_ignore``: the vision tower's and projector's tensors, one regex per prefix the release
  stores them under. It is a list, not a catch-all: any other tensor the text model has no parameter for
  still fails loading, and a directory holding only the text tensors loads as well.

The text model is built from ``text_config`` with two of the wrapper's own fields, as transformers' wrapper
classes read them: ``tie_word_embeddings`` (the wrapper's ``lm_head`` is tied by the top-level field; a
``text_config`` often keeps its class's default) and ``quantization_config`` (the top-level one, else
``text_config``'s, where Kimi-K2.5 keeps it). A prompt holding the config's ``image_token_id`` or
``video_token_id`` is refused when it is queued (``engine/_inputs.py``), naming the model and the argument.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any, ClassVar

from hetero.engine.context import ModelContext
from hetero.engine.models.base import WeightMapping
from hetero.engine.quant.config import QuantConfig, quant_config_of

__all__ = ["TextOfMultimodal", "wrapped_text_config", "wrapper_quant_config"]


def wrapped_text_config(hf_config: Any) -> Any:
    """A copy of the wrapper config's ``text_config`` whose ``tie_word_embeddings`` is the wrapper's."""
    text = copy.copy(hf_config.get_text_config())
    text.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
    return text


def wrapper_quant_config(hf_config: Any) -> QuantConfig:
    """The QuantConfig of the wrapper's ``quantization_config``, else of its ``text_config``'s."""
    if getattr(hf_config, "quantization_config", None):
        return quant_config_of(hf_config)
    return quant_config_of(hf_config.get_text_config())


class TextOfMultimodal:
    """Mixin ahead of a ``DecoderForCausalLM`` family: its text model, built from ``text_config``, loading
    the release's checkpoint by ``text_renames`` and ignoring ``vision_ignore`` (see the module docstring)."""

    #: (regex, replacement) from the release's text names to the text class's
    text_renames: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: the vision tower's and projector's tensors, by the prefixes the release uses
    vision_ignore: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.vision_ignore:
            raise TypeError(f"{cls.__name__} must list its vision tower's tensors in vision_ignore")

    def __init__(self, hf_config: Any, ctx: ModelContext, *, quant_config: QuantConfig | None = None):
        quant_config = self._renamed_skips(quant_config or wrapper_quant_config(hf_config))
        super().__init__(wrapped_text_config(hf_config), ctx, quant_config=quant_config)  # type: ignore[call-arg]

    @classmethod
    def _renamed_skips(cls, quant_config: QuantConfig) -> QuantConfig:
        """The checkpoint's skip list names modules by the release's names (Kimi-K2.5's
        ``language_model.model.layers.N...``): literal entries get ``text_renames``, as the tensors do;
        ``re:`` patterns are the checkpoint's own and stay as written."""
        skip = getattr(quant_config, "skip", None)
        if not skip:
            return quant_config
        renamed = []
        for entry in skip:
            if not entry.startswith("re:"):
                for pattern, repl in cls.text_renames:
                    entry = re.sub(pattern, repl, entry)
            renamed.append(entry)
        return dataclasses.replace(quant_config, skip=tuple(renamed))

    def weight_mapping(self, hf_config: Any) -> WeightMapping:
        """The text class's mapping, the release's text prefix renamed first and the vision tensors ignored."""
        mapping = super().weight_mapping(hf_config)  # type: ignore[misc]
        return dataclasses.replace(
            mapping, renames=self.text_renames + mapping.renames, ignore=mapping.ignore + self.vision_ignore
        )
