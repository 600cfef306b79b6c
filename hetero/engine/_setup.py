"""What ``LLM`` reads before it builds its runtime: the process group, the tokenizer and the EOS ids."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hetero.engine.config import EngineConfig, text_config
from hetero.errors import UsageError

__all__ = ["TOKENIZER_FILES", "communicator", "load_tokenizer", "eos_token_ids"]

#: The files whose presence in a checkpoint directory means it has a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def communicator(cfg: EngineConfig):
    """torchrun's process group of every rank when WORLD_SIZE > 1 (checked against tensor_parallel_size x
    pipeline_parallel_size), else None."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
    sizes = f"tensor_parallel_size={tp}" + (f" x pipeline_parallel_size={pp}" if pp > 1 else "")
    if world == 1:
        if tp * pp > 1:
            raise UsageError(
                f"{sizes} needs one process per rank: launch with `torchrun --nproc-per-node {tp * pp} your_script.py`"
            )
        return None
    if world != tp * pp:
        raise UsageError(
            f"torchrun started {world} processes (WORLD_SIZE) but {sizes} makes {tp * pp}; they must be equal"
        )
    from hetero.distributed import init

    return init(cfg.backend)


def load_tokenizer(model_dir: str | os.PathLike):
    """The checkpoint's tokenizer (transformers' AutoTokenizer), or None when it has no tokenizer files."""
    if not any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def eos_token_ids(config: EngineConfig, tokenizer) -> set[int]:
    """EOS ids of config.json and generation_config.json; the tokenizer's only when neither names one."""
    ids: set[int] = set()
    sources = [getattr(text_config(config.hf_config), "eos_token_id", None)]  # a wrapper's is its text model's
    gen = Path(config.model) / "generation_config.json"
    if gen.is_file():
        sources.append(json.loads(gen.read_text()).get("eos_token_id"))
    for value in sources:
        if value is not None:
            ids.update(value if isinstance(value, (list, tuple)) else [value])
    if not ids and tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return {int(i) for i in ids}
