"""The multimodal releases' wrappers (``models/wrapper.py``), text only, on tiny random checkpoints written as
``Qwen3_5ForConditionalGeneration``, ``Qwen3_5MoeForConditionalGeneration`` and ``Kimi_K25ForConditionalGeneration``
(a one-layer vision tower and projector beside a two-layer text model) against transformers' own wrapper class:
prefill logits and greedy tokens; exactly the vision tensors ignored; an image or video placeholder refused by
name; a tensor under a prefix the wrapper does not list still fails loading; a directory holding only the text
part runs under ``hetero generate``. HY4-VL, on the same mechanism: ``test_hunyuan_models``."""

from __future__ import annotations

import json
import re
import shutil
from functools import lru_cache

import pytest
import torch

pytest.importorskip("transformers")

from _hf import prompts as make_prompts

import hetero
from hetero.cli import main
from hetero.engine import LLM, SamplingParams
from hetero.engine.forward import build_model, prefill
from hetero.engine.loader import UnexpectedWeightsError, load_weights
from hetero.errors import UsageError
from hetero.tools import tiny
from hetero.tools.check import greedy_generation_config

TOL = 1e-4
#: arch -> the regex of its vision tower's and projector's tensors, as the tiny checkpoint stores them
VISION = {
    "qwen3_5_vl": r"model\.visual\..*",
    "qwen3_5_moe_vl": r"model\.visual\..*",
    "kimi_k25": r"(model\.)?(vision_tower|mm_projector)\..*",
}
GREEDY = 4


@lru_cache(maxsize=4)
def _transformers(path: str):
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    return getattr(transformers, config.architectures[0]).from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def _greedy(path: str, prompts: list[list[int]]) -> list[list[int]]:
    hf = _transformers(path)
    config = greedy_generation_config(hf, GREEDY)
    return [hf.generate(torch.tensor([p]), generation_config=config)[0, len(p) :].tolist() for p in prompts]


def _tensors(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _rewrite(src, dst, tensors: dict[str, torch.Tensor], **config) -> None:
    """``dst``: ``src``'s config.json (top-level fields replaced by ``config``) and one file of ``tensors``."""
    from safetensors.torch import save_file

    dst.mkdir()
    doc = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**doc, **config}))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))


@pytest.mark.parametrize("arch", sorted(VISION))
def test_wrapper_runs_its_text_model_as_transformers_does(arch, checkpoints):
    """Prefill logits of every position within 1e-4 and greedy tokens identical to transformers' wrapper class
    on text prompts; the checkpoint's ignored tensors are exactly its vision tower's and projector's; an image
    or video placeholder in a prompt is refused, naming the model and the argument."""
    path = checkpoints(arch)
    model = build_model(path, hetero.load("cpu_ref"), torch.float32)
    assert type(model).__name__ == tiny.architecture(arch)
    assert model.lm_head.weight is not model.model.embed_tokens.weight  # untied, as the wrapper's config says
    on_disk = _tensors(path)
    assert sorted(load_weights(model, path).ignored) == sorted(n for n in on_disk if re.fullmatch(VISION[arch], n))
    prompts = make_prompts(240, (7, 1, 20), seed=3)  # below the placeholders (250-253)
    hf = _transformers(str(path))
    for p, got in zip(prompts, prefill(model, prompts).logits):
        with torch.inference_mode():
            want = hf(input_ids=torch.tensor([p])).logits[0]
        assert float((got - want).norm() / want.norm()) < TOL, (arch, len(p))
    llm = LLM(str(path), backend="cpu_ref", dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=GREEDY, ignore_eos=True)
    ours = [list(o.token_ids) for o in llm.generate(prompts, params, progress=False)]
    assert ours == _greedy(str(path), prompts)
    for token, field in ((250, "image_token_id"), (251, "video_token_id")):
        with pytest.raises(UsageError, match=rf"argument 'prompt'.*{tiny.architecture(arch)}'s {field}"):
            llm.generate([[5, 6, token, 7]], params, progress=False)


@pytest.mark.parametrize(
    "arch,extra",
    [
        ("qwen3_5_vl", "visual.merger.linear_fc1.weight"),  # the tower without Qwen's ``model.``
        ("qwen3_5_moe_vl", "model.vision_tower.blocks.0.norm1.weight"),  # another release's tower prefix
        ("kimi_k25", "model.vision_tower.patch_embed.proj.weight"),  # transformers' in-memory name, not the release's
    ],
)
def test_a_tensor_outside_the_listed_prefixes_fails_loading(arch, extra, checkpoints, tmp_path):
    """The ignore list names the release's vision prefixes, not anything unknown."""
    path = checkpoints(arch)
    _rewrite(path, tmp_path / arch, {**_tensors(path), extra: torch.randn(4, 4)})
    with pytest.raises(UnexpectedWeightsError, match=re.escape(extra)) as e:
        build_model(tmp_path / arch, hetero.load("cpu_ref"), torch.float32)
    assert e.value.unexpected == [extra]


def test_the_wrappers_own_fields_reach_the_text_model():
    """``tie_word_embeddings`` is the wrapper's (its text_config's differs); ``quantization_config`` the
    wrapper's, else text_config's (Kimi-K2.5's place for it): an unknown method there is refused by name."""
    from hetero.engine.context import ModelContext
    from hetero.engine.models import model_class
    from hetero.engine.parallel import Parallel
    from hetero.engine.quant import UnsupportedQuantization

    ctx = ModelContext(ops=hetero.load("cpu_ref"), parallel=Parallel(), dtype=torch.float32, device=torch.device("cpu"))
    config = tiny.tiny_config("qwen3_5_vl", tie_word_embeddings=True)
    assert config.text_config.tie_word_embeddings is False
    model = model_class(config.architectures)(config, ctx)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    config = tiny.tiny_config("kimi_k25")
    config.text_config.quantization_config = {"quant_method": "no-such-method"}
    with pytest.raises(UnsupportedQuantization, match="no-such-method"):
        model_class(config.architectures)(config, ctx)
    # a skip list in the release's names reaches the text model's: a skipped layer stays float
    config = tiny.tiny_config("kimi_k25")
    config.text_config.quantization_config = _w4a16(ignore=["language_model.model.layers.0.self_attn.o_proj"])
    model = model_class(config.architectures)(config, ctx)
    assert model.model.layers[0].self_attn.o_proj.weight.dtype == torch.float32
    assert model.model.layers[1].self_attn.o_proj.weight_packed.dtype == torch.uint8


def _w4a16(ignore: list[str]) -> dict:
    scheme = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 16}
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": scheme}},
        "ignore": ["lm_head", *ignore],
    }


def test_generate_on_the_text_part_of_a_release(checkpoints, tmp_path, capsys):
    """Kimi-K2.5's text tensors alone, under the release's names (``language_model.model.layers.*``,
    ``language_model.lm_head``) and its config's class name and text model_type (``KimiK25ForConditionalGeneration``,
    ``kimi_k2``), run under ``hetero generate`` to the tokens transformers' wrapper gives on the full checkpoint."""
    path = checkpoints("kimi_k25")
    text = {
        re.sub(r"^language_model\.model\.blocks\.", "language_model.model.layers.", name): tensor
        for name, tensor in _tensors(path).items()
        if name.startswith("language_model.")
    }
    doc = json.loads((path / "config.json").read_text())
    dst = tmp_path / "kimi_text"
    _rewrite(
        path,
        dst,
        text,
        architectures=["KimiK25ForConditionalGeneration"],
        text_config=dict(doc["text_config"], model_type="kimi_k2"),
    )
    shutil.copy(path / "generation_config.json", dst)
    prompts = make_prompts(240, (9, 4), seed=4)
    argv = ["generate", "--model", str(dst), "--backend", "cpu_ref", "--dtype", "float32", "--json", "--ignore-eos"]
    argv += ["--max-tokens", str(GREEDY)] + [a for p in prompts for a in ("--prompt-ids", " ".join(map(str, p)))]
    assert main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["token_ids"] for r in lines] == _greedy(str(path), prompts)
