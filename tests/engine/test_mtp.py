"""MTP drafting (speculative_config method "mtp"): a checkpoint's own next-token layers as the draft.

Tiny checkpoints get one MTP layer from ``hetero.tools.tiny.add_mtp``: random weights, or "repeat"
weights whose draft proposes the target's last token again (so the accepted count is known exactly from the
greedy output). The draft's forward is checked against transformers running the MTP layer as a one-layer
model; greedy tokens with MTP equal tokens without; configs without MTP layers and checkpoints without
their tensors are refused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from _hf import prompts

from hetero.engine import LLM, SamplingParams
from hetero.engine.loader import MissingWeightsError
from hetero.errors import UsageError
from hetero.tools.tiny import add_mtp

pytest.importorskip("transformers")

MTP = {"method": "mtp", "num_speculative_tokens": 2}
KW = dict(backend="torch", dtype="float32", block_size=4, max_num_batched_tokens=24)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
#: the verifying target's own layers: DeepSeek-V4's CSA/HCA compressors keep rejected drafts in their state rows (the
#: target verifies no drafts there yet, n-gram's included), so its MTP runs over a target of sliding layers
VERIFIABLE = {"deepseek_v4": dict(layer_types=["sliding_attention"] * 3)}


def _with_mtp(checkpoints, arch: str, tmp_path: Path, mode: str = "random", **overrides) -> Path:
    path = tmp_path / arch
    if overrides:
        from hetero.tools import tiny

        tiny.build(arch, path, tokenizer=True, **overrides)
    else:
        shutil.copytree(checkpoints(arch), path)
    return add_mtp(path, mode=mode)


def _tokens(llm, ps):
    return [list(o.token_ids) for o in llm.generate(ps, GREEDY, progress=False)]


def _repeat_accepted(out: list[int], k: int) -> int:
    """Drafts accepted when each step drafts the last emitted token k times (the "repeat" weights), never
    more than the tokens left before max_tokens less the one the verification step emits itself."""
    accepted, i = 0, 1
    while i < len(out):
        a, room = 0, min(k, len(out) - i - 1)
        while a < room and out[i + a] == out[i - 1]:
            a += 1
        accepted, i = accepted + a, i + a + 1
    return accepted


@pytest.mark.parametrize(
    "arch, mode",
    [
        ("deepseek_v3", "repeat"),
        ("deepseek_v32", "random"),
        ("hy_v3", "repeat"),
        ("qwen3_next", "random"),  # verified through Gated DeltaNet's per-token state slots
        ("deepseek_v4", "repeat"),  # drafts from the target's captured hyper-connection streams
    ],
)
def test_greedy_tokens_equal_without_mtp(arch, mode, checkpoints, tmp_path):
    """A batch with chunked prefill; "repeat" drafts are accepted exactly where the target repeats a token."""
    path = str(_with_mtp(checkpoints, arch, tmp_path, mode, **VERIFIABLE.get(arch, {})))
    ps = prompts(256, [9, 30, 5], seed=7) + [[9, 3] * 4]
    expected = _tokens(LLM(path, **KW), ps)
    llm = LLM(path, speculative_config=MTP, **KW)
    assert _tokens(llm, ps) == expected
    stats = llm.stats["spec_decode"]
    assert stats.num_drafts > 0
    if mode == "repeat":
        assert stats.num_accepted_tokens == sum(_repeat_accepted(t, 2) for t in expected) > 0


def _oracle_logits(path: Path, arch: str, ids: list[int], hidden: torch.Tensor, weights: dict) -> torch.Tensor:
    """transformers running the MTP layer as a one-layer model over ``proj(cat(norm(embed), norm(hidden)))``."""
    import transformers

    config = json.loads((path / "config.json").read_text())
    w = weights
    emb = w["model.embed_tokens.weight"][ids[1:]]
    if arch == "qwen3_next":
        mine, proj, norms = "mtp.layers.0.", "mtp.fc", ("mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden")
        final, offset = "mtp.norm.weight", 1.0
        config.update(num_hidden_layers=1, layer_types=["full_attention"])
    else:
        n = config["num_hidden_layers"]
        mine = f"model.layers.{n}."
        proj, norms = mine + "eh_proj", (mine + "enorm", mine + "hnorm")
        final = mine + ("final_layernorm.weight" if arch == "hy_v3" else "shared_head.norm.weight")
        offset = 0.0
        config.update(num_hidden_layers=1, first_k_dense_replace=0)
        for key in ("layer_types", "mlp_layer_types", "indexer_types"):  # V3.2's per-layer lists: the MTP layer's
            if config.get(key):
                config[key] = [{"mlp_layer_types": "sparse", "indexer_types": "full"}.get(key, config[key][-1])]
        emb[0] = 0  # position 0's embedding is zeroed (vLLM's DeepSeek MTP)

    def norm(x, name):
        return (
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config["rms_norm_eps"]) * (offset + w[name + ".weight"])
        )

    x = torch.cat([norm(emb, norms[0]), norm(hidden, norms[1])], -1) @ w[proj + ".weight"].T
    one = {"model.embed_tokens.weight": w["model.embed_tokens.weight"], "lm_head.weight": w["lm_head.weight"]}
    one["model.norm.weight"] = w[final]
    skip = ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens", "final_layernorm")
    one.update({"model.layers.0." + k[len(mine) :]: t for k, t in w.items() if k.startswith(mine)})
    one = {k: t for k, t in one.items() if not any(f".0.{s}" in k for s in skip)}
    ref_dir = path.parent / "oracle"
    ref_dir.mkdir()
    (ref_dir / "config.json").write_text(json.dumps(config))
    from safetensors.torch import save_file

    save_file({k: t.contiguous() for k, t in one.items()}, str(ref_dir / "model.safetensors"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(inputs_embeds=x[None]).logits[0]


@pytest.mark.parametrize("arch", ["qwen3_next", "deepseek_v3", "deepseek_v32", "hy_v3"])
def test_draft_forward_matches_transformers(arch, checkpoints, tmp_path):
    """The draft's logits over a prompt (row p: token p+1, the target's hidden state at p) equal
    transformers' over the same input: loading by name, the norms, the (embedding, hidden) order."""
    from safetensors.torch import load_file

    import hetero
    from hetero.engine.forward import build_model, prefill
    from hetero.engine.runtime.kv_cache import allocate_kv_cache
    from hetero.engine.step_buffers import build_step

    path = _with_mtp(checkpoints, arch, tmp_path)
    model = build_model(path, hetero.load("torch"), torch.float32)
    ids = prompts(256, [11], seed=5)[0]
    hidden = prefill(model, [ids], capture=True).hidden[0][-1]
    draft = model.build_mtp(str(path))
    assert not any(n.startswith("model.embed") or "lm_head" in n for n, _ in draft.named_parameters())
    rows = len(ids) - 1
    allocate_kv_cache(draft, 4, 4, torch.float32, "cpu")
    step = build_step([rows], [rows], [[2, 0, 3]], 4, torch.device("cpu"))
    with torch.inference_mode():
        got = draft.compute_logits(draft(torch.tensor(ids[1:]), step, hidden[:-1])).float()
    weights = {}
    for f in sorted(path.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    want = _oracle_logits(path, arch, ids, hidden[:-1], weights)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_deepseek_v4_draft_forward_matches_transformers(checkpoints, tmp_path):
    """DeepSeek-V4's draft (the release's names, ``mtp.0.*``) over a prompt longer than the sliding window: its logits
    equal transformers' one-layer model of the MTP block with the layer's ``hc_head`` and ``norm``, its streams
    replaced by ``h_proj(hnorm(target streams)) + e_proj(enorm(embed))``; an MTP entry asking for a compressed
    layer is refused by field name."""
    import transformers
    from safetensors.torch import load_file, save_file

    import hetero
    from hetero.engine.forward import build_model, prefill
    from hetero.engine.runtime.kv_cache import allocate_kv_cache
    from hetero.engine.step_buffers import build_step

    path = _with_mtp(checkpoints, "deepseek_v4", tmp_path)
    model = build_model(path, hetero.load("torch"), torch.float32)
    ids = prompts(256, [13], seed=5)[0]
    streams = prefill(model, [ids], capture=True).hidden[0][-2][:-1]  # the last layer's [T, N, H]
    draft, rows = model.build_mtp(str(path)), len(ids) - 1
    allocate_kv_cache(draft, 4, 4, torch.float32, "cpu")
    step = build_step([rows], [rows], [[2, 0, 3]], 4, torch.device("cpu"))
    with torch.inference_mode():
        got = draft.compute_logits(draft(torch.tensor(ids[1:]), step, streams.flatten(1))).float()
    w = {}
    for f in sorted(path.glob("*.safetensors")):
        w.update(load_file(str(f)))
    config = json.loads((path / "config.json").read_text())
    mtp = {k[len("mtp.0.") :]: t for k, t in w.items() if k.startswith("mtp.0.")}
    own = ("enorm.", "hnorm.", "e_proj.", "h_proj.", "norm.", "hc_head_")
    one = {"model.layers.0." + k: t for k, t in mtp.items() if not k.startswith(own)}  # as transformers saves V4
    one.update({f"model.hc_head.hc_{k}": mtp[f"hc_head_{k}"] for k in ("fn", "base", "scale")})
    one.update({k: w[k] for k in ("model.embed_tokens.weight", "head.weight")})
    one["model.norm.weight"] = mtp["norm.weight"]
    ref = tmp_path / "oracle"
    ref.mkdir()
    one_layer = dict(config, num_hidden_layers=1, layer_types=["sliding_attention"], mlp_layer_types=["moe"])
    (ref / "config.json").write_text(json.dumps(one_layer))
    save_file({k: t.contiguous() for k, t in one.items()}, str(ref / "model.safetensors"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(ref), dtype=torch.float32).eval()

    def norm(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config["rms_norm_eps"]) * mtp[name + ".weight"]

    emb = w["model.embed_tokens.weight"][ids[1:]].clone()
    emb[0] = 0  # position 0's embedding is zeroed (vLLM's DeepSeek-V4 MTP)
    x = norm(streams, "hnorm") @ mtp["h_proj.weight"].T + (norm(emb, "enorm") @ mtp["e_proj.weight"].T)[:, None]
    hf.model.layers[0].register_forward_pre_hook(lambda m, a, kw: ((x[None], *a[1:]), kw), with_kwargs=True)
    with torch.no_grad():
        want = hf(inputs_embeds=torch.zeros(1, rows, config["hidden_size"])).logits[0]
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
    n = config["num_hidden_layers"]
    (path / "config.json").write_text(json.dumps(dict(config, compress_ratios=[0] * n + [4])))
    with pytest.raises(UsageError, match=rf"compress_ratios\[{n}\] = 4") as e:
        model.build_mtp(str(path))
    assert e.value.arg == "compress_ratios"


def test_refusals(checkpoints, tmp_path):
    """No MTP layers: a family without them and a config declaring none are refused by name; a config
    declaring one whose tensors the checkpoint lacks fails as missing weights, naming them; a Hy3 config
    without the field that fixes its MTP layer's MLP kind is refused by that field's name."""
    with pytest.raises(UsageError, match="no next-token") as e:
        LLM(str(checkpoints("qwen3")), speculative_config=MTP, **KW)
    assert e.value.arg == "speculative_config.method"
    path = tmp_path / "none"
    shutil.copytree(checkpoints("deepseek_v3"), path)
    with pytest.raises(MissingWeightsError, match=r"model\.layers\.3\.eh_proj\.weight"):
        LLM(str(path), speculative_config=MTP, **KW)  # transformers' config says 1 layer; none written
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, num_nextn_predict_layers=0)))
    with pytest.raises(UsageError, match="declares no MTP layers") as e:
        LLM(str(path), speculative_config=MTP, **KW)
    assert e.value.arg == "num_nextn_predict_layers"
    path = _with_mtp(checkpoints, "hy_v3", tmp_path)  # Hy3's MTP MLP kind follows first_k_dense_replace
    config = json.loads((path / "config.json").read_text())
    del config["first_k_dense_replace"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="first_k_dense_replace") as e:
        LLM(str(path), speculative_config=MTP, **KW)
    assert e.value.arg == "first_k_dense_replace"
