"""``hetero check-model``: one checkpoint through hetero and through transformers, compared layer by layer.

The comparison names where an error starts: the relative error of the residual
stream after the embedding and after every decoder layer, then the final norm and
the logits; then greedy generation token by token, and at the first position where
the two disagree, whether each side's token is among the other's top-k (vLLM's
end-to-end acceptance rule: a near-tie may flip, a wrong model may not).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from hetero.engine.config import media_token_ids, text_config

__all__ = [
    "LayerError",
    "Divergence",
    "ModelCheck",
    "CheckReport",
    "default_prompts",
    "greedy_generation_config",
    "TOLERANCE",
    "QUANTIZED_TOLERANCE",
]

#: relative L2 error a layer may reach before it is where "the error starts"; per compute dtype
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}
#: the same for a checkpoint with dynamic 8-bit activations: a 1e-6 accumulation-order difference flips
#: 8-bit roundings, measured up to 1.8e-2 per layer on tiny models against an exact oracle of the same math
QUANTIZED_TOLERANCE = 5e-2


@dataclass
class LayerError:
    """The error of one point of the residual stream, over all prompts (relative to transformers)."""

    name: str
    rel_l2: float
    max_abs: float
    ok: bool


@dataclass
class Divergence:
    """Greedy tokens of one prompt: where the two sides first differ, and whether each token is in the other's top-k."""

    prompt: int
    position: int | None
    hetero_token: int | None = None
    reference_token: int | None = None
    hetero_in_reference_topk: bool | None = None
    reference_in_hetero_topk: bool | None = None

    @property
    def acceptable(self) -> bool:
        return self.position is None or bool(self.hetero_in_reference_topk and self.reference_in_hetero_topk)


@dataclass
class CheckReport:
    """Everything ``check-model`` prints; ``passed`` is its exit status."""

    model: str
    reference: str
    backend: str
    dtype: str
    tolerance: float
    layers: list[LayerError]
    greedy: list[Divergence] = field(default_factory=list)
    top_k: int = 5
    num_tokens: int = 0

    @property
    def first_bad(self) -> str | None:
        """The first point of the residual stream whose error exceeds the tolerance."""
        return next((layer.name for layer in self.layers if not layer.ok), None)

    @property
    def passed(self) -> bool:
        return self.first_bad is None and all(d.acceptable for d in self.greedy)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(first_bad=self.first_bad, passed=self.passed)
        for g, div in zip(d["greedy"], self.greedy):
            g["acceptable"] = div.acceptable
        return d


def greedy_generation_config(model: Any, max_new_tokens: int):
    """A transformers GenerationConfig for exactly ``max_new_tokens`` greedy tokens, EOS never stopping it.

    ``generate()`` refills None fields from the model's own generation_config, so EOS is
    switched off there (on ``model``) as well as in the returned copy.
    """
    model.generation_config.eos_token_id = None
    config = copy.deepcopy(model.generation_config)
    config.do_sample = False
    config.max_new_tokens, config.min_new_tokens = max_new_tokens, None
    config.pad_token_id = config.pad_token_id if config.pad_token_id is not None else 0
    return config


def default_prompts(
    vocab_size: int, lengths: Sequence[int] = (7, 19, 33), seed: int = 0, exclude: Sequence[int] = ()
) -> list[list[int]]:
    """Random token prompts (no tokenizer needed), deterministic in ``seed``; an ``exclude``d id (a multimodal
    checkpoint's image placeholder) is drawn as 3 instead."""
    gen, skip = torch.Generator().manual_seed(seed), torch.tensor(list(exclude), dtype=torch.int64)
    draws = [torch.randint(3, vocab_size, (n,), generator=gen) for n in lengths]
    return [ids.masked_fill(torch.isin(ids, skip), 3).tolist() for ids in draws]


def _reference_class(model_dir: str):
    """transformers' causal LM auto class, or for a multimodal release (HY4-VL, Qwen3.5) its wrapper's."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = transformers.AutoConfig.from_pretrained(model_dir)
    if getattr(config, "vision_config", None) is None and config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return transformers.AutoModelForCausalLM
    return transformers.AutoModelForImageTextToText


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


class ModelCheck:
    """The two sides of the comparison, built once: ``run()`` computes the report.

    ``model_dir`` runs through hetero on ``backend``; ``reference_dir`` (default: the
    same checkpoint) runs through transformers on the CPU in the same dtype. An 8-bit
    checkpoint (fp8, compressed-tensors) is compared with its dequantized float copy (written
    to a temporary directory unless ``reference_dir`` is given) whose GEMM inputs are quantized
    as the engine quantizes them (``_fake_quant``), at ``QUANTIZED_TOLERANCE``. ``tolerance`` replaces
    the default bound of a layer's relative L2 error. ``parallel``: ``LLM``'s parallel
    options; greedy generation runs under torchrun's ranks (the layer comparison runs the whole model on each).
    """

    def __init__(
        self,
        model_dir: str | Path,
        backend: str | None = None,
        *,
        dtype: str = "float32",
        reference_dir: str | Path | None = None,
        block_size: int = 16,
        tolerance: float | None = None,
        **parallel: Any,
    ):

        import hetero
        from hetero.engine.forward import build_model

        self.model_dir, self.dtype = str(model_dir), getattr(torch, dtype)
        self.ops = hetero.load(backend)
        self.block_size, self.parallel = block_size, parallel
        self.model = build_model(self.model_dir, self.ops, self.dtype)
        self.quant_config = getattr(self.model, "quant_config", None)
        self.quantized = getattr(self.quant_config, "scheme", None) is not None
        self._scratch = None
        self.reference_dir = self._reference_dir(model_dir, reference_dir)
        extra = {"experts_implementation": "eager"} if self.quantized else {}
        self.reference = (
            _reference_class(self.reference_dir).from_pretrained(self.reference_dir, dtype=self.dtype, **extra).eval()
        )
        self.vocab_size = int(text_config(self.reference.config).vocab_size)
        self.media_tokens = tuple(media_token_ids(self.reference.config))
        dynamic = self.quantized and self.quant_config.scheme.act_quant is not None
        default = QUANTIZED_TOLERANCE if dynamic else TOLERANCE.get(self.dtype, 5e-2)
        self.tolerance = default if tolerance is None else tolerance

    def _reference_dir(self, model_dir, reference_dir) -> str:
        """The checkpoint transformers runs: ``reference_dir``, else a quantized one's dequantized copy, else itself."""
        if reference_dir is None and self.quantized:
            import tempfile

            from hetero.tools.quantize import dequantize_checkpoint

            self._scratch = tempfile.TemporaryDirectory(prefix="hetero-dequantized-")
            dequantize_checkpoint(model_dir, self._scratch.name)
            reference_dir = self._scratch.name
        return str(reference_dir or model_dir)

    def _reference_context(self):
        """Where transformers runs: inside the 8-bit activation emulation for a quantized checkpoint."""
        import contextlib

        if not self.quantized:
            return contextlib.nullcontext()
        import hetero
        from hetero.tools._fake_quant import quantized_inputs

        return quantized_inputs(self.reference, self.quant_config, hetero.load("cpu_ref"))

    @torch.inference_mode()
    def reference_states(self, prompt: Sequence[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """transformers' residual stream (embedding, each decoder layer, final norm) and logits for one prompt."""
        inner = self.reference.model
        inner = getattr(inner, "language_model", inner)  # a multimodal release: its text model
        seen: list[torch.Tensor] = []
        grab = lambda module, args, out: seen.append((out[0] if isinstance(out, tuple) else out)[0].float())  # noqa: E731
        modules = [inner.embed_tokens, *inner.layers, inner.norm]
        handles = [m.register_forward_hook(grab) for m in modules]
        try:
            with self._reference_context():
                logits = self.reference(torch.tensor([list(prompt)])).logits[0].float()
        finally:
            for h in handles:
                h.remove()
        return seen, logits

    def hetero_states(self, prompts: Sequence[Sequence[int]]):
        from hetero.engine.forward import prefill

        return prefill(self.model, prompts, block_size=self.block_size, capture=True)

    def layer_errors(self, prompts: Sequence[Sequence[int]]) -> list[LayerError]:
        ours = self.hetero_states(prompts)
        refs = [self.reference_states(p) for p in prompts]
        num_layers = len(refs[0][0]) - 2
        names = ["embedding"] + [f"layer {i}" for i in range(num_layers)] + ["final norm", "logits"]
        tol = self.tolerance
        rows = []
        for j, name in enumerate(names):
            a = torch.cat(
                [(ours.hidden[i][j] if j < len(names) - 1 else ours.logits[i]).cpu() for i in range(len(prompts))]
            )
            b = torch.cat([(refs[i][0][j] if j < len(names) - 1 else refs[i][1]) for i in range(len(prompts))])
            rel = _rel(a, b)
            rows.append(LayerError(name, rel, float((a - b).abs().max()), rel <= tol))
        return rows

    def hetero_greedy(self, prompts: Sequence[Sequence[int]], max_tokens: int, top_k: int = 5) -> list[Any]:
        """hetero's greedy ``RequestOutput`` per prompt, with the top-``top_k`` logprobs of every token."""
        from hetero.engine import LLM, SamplingParams

        llm = LLM(
            self.model_dir,
            backend=self.ops.name,
            dtype=str(self.dtype).removeprefix("torch."),
            block_size=self.block_size,
            **self.parallel,
        )
        params = SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=min(top_k, self.vocab_size)
        )
        return llm.generate([list(p) for p in prompts], params, progress=False)

    @torch.inference_mode()
    def reference_greedy(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        config = greedy_generation_config(self.reference, max_tokens)
        with self._reference_context():
            out = self.reference.generate(torch.tensor([list(prompt)]), generation_config=config)
        return out[0, len(prompt) :].tolist()

    def divergence(self, index: int, prompt: Sequence[int], ours: Any, theirs: list[int], top_k: int) -> Divergence:
        """Where ``ours`` (hetero's greedy ``RequestOutput``, with logprobs) and ``theirs`` first differ; hetero's
        top-k there is the one its engine reported, transformers' is recomputed on the common prefix."""
        tokens = list(ours.token_ids)
        pos = next((i for i, (a, b) in enumerate(zip(tokens, theirs)) if a != b), None)
        if pos is None:
            return Divergence(index, None)
        mine = [t for t, lp in ours.logprobs[pos].items() if lp.rank <= top_k]
        ref = self.reference_states(list(prompt) + tokens[:pos])[1][-1]
        return Divergence(
            index,
            pos,
            tokens[pos],
            theirs[pos],
            hetero_in_reference_topk=tokens[pos] in ref.topk(top_k).indices.tolist(),
            reference_in_hetero_topk=theirs[pos] in mine,
        )

    def run(
        self, prompts: Sequence[Sequence[int]] | None = None, *, max_tokens: int = 16, top_k: int = 5
    ) -> CheckReport:
        prompts = prompts or default_prompts(self.vocab_size, exclude=self.media_tokens)
        report = CheckReport(
            self.model_dir,
            self.reference_dir,
            self.ops.name,
            str(self.dtype).removeprefix("torch."),
            self.tolerance,
            self.layer_errors(prompts),
            top_k=top_k,
            num_tokens=max_tokens,
        )
        if max_tokens > 0:
            ours = self.hetero_greedy(prompts, max_tokens, top_k)
            for i, p in enumerate(prompts):
                report.greedy.append(self.divergence(i, p, ours[i], self.reference_greedy(p, max_tokens), top_k))
        return report
