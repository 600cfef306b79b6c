"""Engine configuration: what the user asks for, checked at once, resolved against the checkpoint's config.json."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hetero.errors import ModelNotFound, UsageError

__all__ = ["EngineConfig", "load_hf_config", "text_config", "media_token_ids", "DTYPES"]

#: dtype names the engine accepts -> torch dtype
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _bad(name: str, expected: str, got: Any) -> UsageError:
    return UsageError(f"EngineConfig.{name} must be {expected}, got {got!r}", arg=name, expected=expected, got=got)


def _int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(name, f"an integer >= {minimum}", value)


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to serve one checkpoint.

    - ``model``: checkpoint directory (config.json, safetensors, optionally a tokenizer).
    - ``backend``: hetero backend name; None lets ``hetero.load`` select one.
    - ``dtype``: "auto" (the checkpoint's ``dtype`` if float32/bfloat16/float16, else
      bfloat16), or one of those three names.
    - ``block_size``: tokens per KV block.
    - ``max_num_seqs``: sequences running at once.
    - ``max_num_batched_tokens``: tokens computed per step (decodes plus prefill chunks).
    - ``max_model_len``: longest sequence (prompt and output); None: the checkpoint's
      ``max_position_embeddings``.
    - ``num_kv_blocks``: KV blocks; None: enough for ``max_num_seqs`` sequences of
      ``max_model_len`` tokens, capped by ``kv_cache_bytes``.
    - ``enable_prefix_caching``: reuse computed KV blocks of identical prefixes.
    - ``num_state_snapshots``: for models with per-sequence state, the state slots kept
      for prefix caching (a hit needs the state at its end); None: ``max_num_seqs``
      with prefix caching, else 0. Every state slot (one per running sequence, plus
      these) comes out of ``kv_cache_bytes`` before the KV blocks do.
    - ``tensor_parallel_size`` / ``expert_parallel``: ranks (launch with torchrun) and
      whether MoE experts are split over them.
    - ``pipeline_parallel_size``: stages the decoder layers are split over (torchrun starts
      tensor_parallel_size x pipeline_parallel_size processes; ``hetero.engine.pipeline``);
      ``pp_layer_partition``: layers per stage (a list, or "12,12,8"), else an even split;
      ``pipeline_microbatches``: steps in flight at once (None: one per stage, the most; 1: no overlap).
    - ``device``: device of the backend (None: its default); ``seed``: sampling seed.
    - ``compile``: run decode-only steps through ``torch.compile`` of the model's forward
      (``hetero.engine.runtime.compiled``), with the registry's value checks off; outputs stay
      those of eager.
    - ``speculative_config``: speculative decoding (``hetero.engine.spec_decode.SpeculativeConfig``:
      a dict or JSON string with vLLM's keys, checked here); None: off.

    ``resolve()`` fills ``max_model_len`` and ``dtype`` from the checkpoint's config.
    """

    model: str | os.PathLike
    backend: str | None = None
    dtype: str = "auto"
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    num_kv_blocks: int | None = None
    kv_cache_bytes: int = 1 << 30
    enable_prefix_caching: bool = True
    num_state_snapshots: int | None = None
    tensor_parallel_size: int = 1
    expert_parallel: bool = False
    pipeline_parallel_size: int = 1
    pp_layer_partition: Any = None
    pipeline_microbatches: int | None = None
    device: str | torch.device | None = None
    seed: int = 0
    compile: bool = False
    speculative_config: Any = None
    hf_config: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)) or not str(self.model):
            raise _bad("model", "a checkpoint directory (str or path)", self.model)
        if self.backend is not None and (not isinstance(self.backend, str) or not self.backend):
            raise _bad("backend", "a backend name or None", self.backend)
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise _bad("dtype", f"'auto' or one of {', '.join(DTYPES)}", self.dtype)
        for name, minimum in (
            ("block_size", 1),
            ("max_num_seqs", 1),
            ("max_num_batched_tokens", 1),
            ("kv_cache_bytes", 1),
            ("tensor_parallel_size", 1),
            ("pipeline_parallel_size", 1),
            ("seed", 0),
        ):
            _int(name, getattr(self, name), minimum)
        for name, minimum in (
            ("max_model_len", 1),
            ("num_kv_blocks", 1),
            ("num_state_snapshots", 0),
            ("pipeline_microbatches", 1),
        ):
            if getattr(self, name) is not None:
                _int(name, getattr(self, name), minimum)
        for name in ("enable_prefix_caching", "expert_parallel", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, "True or False", getattr(self, name))
        if self.device is not None and not isinstance(self.device, (str, torch.device)):
            raise _bad("device", "a device string, a torch.device or None", self.device)
        from hetero.engine.pipeline import parse_partition
        from hetero.engine.spec_decode.config import SpeculativeConfig

        object.__setattr__(self, "pp_layer_partition", parse_partition(self.pp_layer_partition))

        object.__setattr__(self, "speculative_config", SpeculativeConfig.of(self.speculative_config))

    def resolve(self, hf_config: Any = None) -> "EngineConfig":
        """A copy with ``max_model_len`` and ``dtype`` made concrete and ``hf_config`` attached.

        ``hf_config`` defaults to ``load_hf_config(self.model)``. Raises UsageError (a ValueError) when
        ``max_model_len`` exceeds the checkpoint's ``max_position_embeddings``.
        """
        hf_config = hf_config if hf_config is not None else load_hf_config(self.model)
        limit = getattr(text_config(hf_config), "max_position_embeddings", None)
        max_model_len = self.max_model_len
        if max_model_len is None:
            if limit is None:
                raise UsageError(
                    f"EngineConfig.max_model_len must be given: {self.model} has no max_position_embeddings",
                    arg="max_model_len",
                    expected="an integer >= 1",
                    got=None,
                )
            max_model_len = int(limit)
        elif limit is not None and max_model_len > limit:
            raise _bad("max_model_len", f"<= the checkpoint's max_position_embeddings ({limit})", max_model_len)
        return dataclasses.replace(
            self, max_model_len=max_model_len, dtype=_auto_dtype(self.dtype, hf_config), hf_config=hf_config
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        """The model's torch dtype (bfloat16 for "auto" before ``resolve``)."""
        return DTYPES.get(self.dtype, torch.bfloat16)

    def state_slots(self, bytes_per_state_slot: int) -> tuple[int, int]:
        """(live slots, snapshot slots) of the state pool; (0, 0) for a model without state."""
        if bytes_per_state_slot == 0:
            return 0, 0
        snapshots = self.num_state_snapshots
        if snapshots is None:
            snapshots = self.max_num_seqs if self.enable_prefix_caching else 0
        return self.max_num_seqs, snapshots

    def kv_blocks(self, bytes_per_block: int, reserved_bytes: int = 0) -> int:
        """The number of KV blocks: ``num_kv_blocks``, else derived (see the class docstring) from
        ``kv_cache_bytes`` less ``reserved_bytes`` (the state pool)."""
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        if self.max_model_len is None:
            raise ValueError("EngineConfig.resolve() must run before kv_blocks() when num_kv_blocks is None")
        wanted = self.max_num_seqs * math.ceil(self.max_model_len / self.block_size)
        affordable = (self.kv_cache_bytes - reserved_bytes) // max(bytes_per_block, 1)
        if affordable < 1:
            raise _bad(
                "kv_cache_bytes",
                f"at least one KV block ({bytes_per_block} bytes) after the state pool ({reserved_bytes} bytes)",
                self.kv_cache_bytes,
            )
        return min(wanted, affordable)


def _auto_dtype(dtype: str, hf_config: Any) -> str:
    if dtype != "auto":
        return dtype
    found = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(found, torch.dtype):
        found = str(found).removeprefix("torch.")
    return found if found in DTYPES else "bfloat16"


def text_config(hf_config: Any) -> Any:
    """The text model's part of a checkpoint's config: ``get_text_config()`` (a multimodal release nests it),
    or the config itself."""
    get = getattr(hf_config, "get_text_config", None)
    return get() if callable(get) else hf_config


def media_token_ids(hf_config: Any) -> dict[int, str]:
    """A multimodal checkpoint's image / video placeholder ids (id -> config field); empty for a text model."""
    if getattr(hf_config, "vision_config", None) is None:
        return {}
    found = {getattr(hf_config, name, None): name for name in ("image_token_id", "video_token_id")}
    found.pop(None, None)
    return found


def load_hf_config(model_dir: str | os.PathLike) -> Any:
    """The checkpoint's transformers config (``AutoConfig.from_pretrained``).

    Raises :class:`hetero.errors.ModelNotFound` (a FileNotFoundError) for a missing
    directory or config.json, and :class:`hetero.errors.UsageError` for a config.json
    transformers cannot read or an architecture the engine has no model for.
    """
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelNotFound(
            f"model directory {str(path)!r} does not exist (expected a Hugging Face checkpoint directory)",
            arg="model",
            expected="an existing checkpoint directory",
            got=str(model_dir),
        )
    if not (path / "config.json").is_file():
        raise ModelNotFound(
            f"{str(path)!r} has no config.json; is it a Hugging Face checkpoint directory?",
            arg="model",
            expected="a Hugging Face checkpoint directory (with config.json)",
            got=str(model_dir),
        )
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.from_pretrained(str(path))
    except (ValueError, OSError) as e:  # malformed JSON, an unknown model_type: the file is the user's
        raise UsageError(f"{str(path / 'config.json')!r} is not a config transformers can read: {e}") from e
    _check_architecture(path, hf_config)
    return hf_config


def _check_architecture(path: Path, hf_config: Any) -> None:
    from hetero.engine.models import UnsupportedArchitecture, model_class

    try:
        model_class(getattr(hf_config, "architectures", None))
    except UnsupportedArchitecture as e:
        raise UsageError(f"{str(path)!r}: {e}") from e
