"""What the engine's commands share: the model options, --prompt-ids parsing, the quantization line."""

from __future__ import annotations

import argparse

from rich.console import Console

from hetero.errors import UsageError

__all__ = [
    "EXIT_OK",
    "EXIT_FAIL",
    "EXIT_USAGE",
    "model_args",
    "compile_arg",
    "speculative_arg",
    "token_ids",
    "show_quantization",
]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default=None, help="backend name (default: HETERO_BACKEND, else the best available)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (generate default: the checkpoint's)")
    p.add_argument("--block-size", type=int, default=16, help="KV cache block size in tokens (default 16)")
    p.add_argument(
        "--quantization",
        default=None,
        metavar="METHOD",
        help="the quant_method the checkpoint must declare (fp8, compressed-tensors, none); "
        "a quantized checkpoint's detected format is printed to stderr either way",
    )


def compile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the forward of decode-only steps (CUDA graphs on CUDA); the registry's "
        "value checks are off for the run",
    )


def pipeline_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pipeline-parallel-size",
        type=int,
        default=1,
        metavar="P",
        help="pipeline stages the layers are split over; launch tensor x pipeline ranks with torchrun",
    )
    p.add_argument(
        "--pp-layer-partition",
        default=None,
        metavar="N,N,...",
        help="decoder layers per stage (default: an even split, the remainder before the last stage)",
    )


def speculative_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--speculative-config",
        default=None,
        metavar="JSON",
        help='speculative decoding, with vLLM\'s keys: e.g. \'{"method": "ngram", "num_speculative_tokens": 3}\' '
        "(methods: ngram with prompt_lookup_min/max, draft_model and eagle3 with model, mtp)",
    )


def token_ids(text: str) -> list[int]:
    """argparse type of --prompt-ids: a bad value is a usage error (exit 2) naming the option."""
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        ids = []
    if not ids:
        raise argparse.ArgumentTypeError(f"expected token ids (integers separated by spaces), got {text!r}")
    return ids


def show_quantization(args: argparse.Namespace) -> None:
    """Print a quantized checkpoint's format to stderr; a --quantization the checkpoint does not declare is an error."""
    from hetero.engine.config import load_hf_config
    from hetero.engine.quant.config import describe_quantization

    config = load_hf_config(args.model)
    qc = getattr(config, "quantization_config", None) or {}
    method = (qc if isinstance(qc, dict) else qc.to_dict()).get("quant_method", "none")
    wanted = getattr(args, "quantization", None)
    if wanted is not None and wanted != method:
        raise UsageError(f"argument --quantization: expected the checkpoint's {method!r}, got {wanted!r}")
    if method != "none":
        Console(stderr=True).print(f"quantization: {describe_quantization(config)}", highlight=False)
