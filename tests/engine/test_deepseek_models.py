"""DeepSeek-V2/V3 (MLA, MoE) on cpu_ref against transformers running the same tiny checkpoint, float32.

V3: q_lora_rank, yarn rope with mscale_all_dim, interleaved rope, sigmoid routing with
group limits and e_score_correction_bias, an MTP layer in the checkpoint. V2: no
q_lora_rank, default rope, softmax group_limited_greedy routing, routed scaling
without renormalization. Prefill (packed prompts, one of them a single token, which
takes the absorbed decode path), decode after a prefill, and a chunked prefill that
reads its cached context back through kv_slots, all over one paged cache.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import hetero
from hetero.engine.forward import build_model, prefill
from hetero.engine.loader import INDEX, UnexpectedWeightsError, load_weights, process_weights_after_loading
from hetero.engine.runtime.kv_cache import allocate_kv_cache
from hetero.engine.step_buffers import build_step
from hetero.tools import tiny

TOL = 1e-4
ARCHS = ("deepseek_v2", "deepseek_v3")
#: on top of tiny's defaults: V2 picks more experts than it keeps groups (top_k 3 > topk_group 2), so the
#: group limit changes the routing; V3's mscale != mscale_all_dim gives yarn a cos/sin factor != 1
OVERRIDES = {
    "deepseek_v2": dict(num_experts_per_tok=3),
    "deepseek_v3": dict(
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
        }
    ),
}
PROMPTS = [
    [5, 7, 9, 11, 13, 2, 3, 4, 100, 200, 17],
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22],
    [42],
    [250, 60, 61],
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def add_mtp_shard(path: Path, layer: int, hidden: int) -> str:
    """Write an extra shard holding one multi-token-prediction tensor and list it in the index."""
    name = f"model.layers.{layer}.eh_proj.weight"
    save_file({name: torch.randn(hidden, 2 * hidden)}, str(path / "model-mtp.safetensors"))
    index = json.loads((path / INDEX).read_text())
    index["weight_map"][name] = "model-mtp.safetensors"
    (path / INDEX).write_text(json.dumps(index))
    return name


class Pair:
    """A tiny checkpoint, transformers' model of it and hetero's, with transformers' logits cached per prompt."""

    def __init__(self, arch: str, path: Path):
        from transformers import AutoModelForCausalLM

        self.arch, self.path = arch, tiny.build(arch, path, **OVERRIDES[arch])
        self.hf = AutoModelForCausalLM.from_pretrained(str(self.path), dtype=torch.float32).eval()
        self.config = self.hf.config
        self.mtp = None
        if arch == "deepseek_v3":
            self.mtp = add_mtp_shard(self.path, self.config.num_hidden_layers, self.config.hidden_size)
        self.model = build_model(self.path, hetero.load("cpu_ref"), torch.float32)
        self._ref: dict[tuple[int, ...], tuple] = {}

    def reference(self, tokens) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """transformers' (logits [n, V], hidden states) of one whole sequence."""
        key = tuple(tokens)
        if key not in self._ref:
            with torch.no_grad():
                out = self.hf(torch.tensor([list(tokens)]), output_hidden_states=True)
            self._ref[key] = (out.logits[0].float(), tuple(h[0] for h in out.hidden_states))
        return self._ref[key]


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tmp_path_factory) -> Pair:
    return Pair(request.param, tmp_path_factory.mktemp(request.param))


@torch.inference_mode()
def run_steps(model, steps, *, block_size: int = 4, num_blocks: int = 32):
    """Run engine steps over one paged cache. ``steps``: per step, a list of (tokens, start, end)
    (sequence id = tokens tuple) giving the rows [start, end) of each sequence; sequences that
    decode (one row) must come first. Returns per step a list of logits [end - start, V]."""
    allocate_kv_cache(model, num_blocks, block_size, torch.float32, "cpu")
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(1)).tolist()
    tables: dict[tuple[int, ...], list[int]] = {}
    results = []
    for seqs in steps:
        qlens, slens, btables, ids = [], [], [], []
        for tokens, start, end in seqs:
            table = tables.setdefault(tuple(tokens), [])
            while len(table) * block_size < end:
                table.append(order.pop())
            qlens.append(end - start)
            slens.append(end)
            btables.append(list(table))
            ids.extend(tokens[start:end])
        step = build_step(qlens, slens, btables, block_size, "cpu")
        hidden = model(torch.tensor(ids), step)
        logits = model.compute_logits(hidden)
        out, row = [], 0
        for n in qlens:
            out.append(logits[row : row + n])
            row += n
        results.append(out)
    return results


def decode_and_chunked(pair: Pair) -> list[float]:
    """Relative errors of: prompt A decoded after an (n-1)-token prefill; prompt B's second chunk
    over its cached first chunk (same step); then both decoding in one step."""
    a, b = PROMPTS[0] + [33], PROMPTS[1] + [44]
    na, nb = len(a), len(b)
    steps = [
        [(a, 0, na - 2), (b, 0, 9)],  # prefill A[:-2], first chunk of B
        [(a, na - 2, na - 1), (b, 9, nb - 1)],  # decode A, chunked prefill of B over its cached context
        [(a, na - 1, na), (b, nb - 1, nb)],  # two decodes
    ]
    got = run_steps(pair.model, steps)
    ref_a, ref_b = pair.reference(a)[0], pair.reference(b)[0]
    return [
        rel(got[0][0], ref_a[: na - 2]),
        rel(got[0][1], ref_b[:9]),
        rel(got[1][0], ref_a[na - 2 : na - 1]),
        rel(got[1][1], ref_b[9 : nb - 1]),
        rel(got[2][0], ref_a[na - 1 :]),
        rel(got[2][1], ref_b[nb - 1 :]),
    ]


def prefill_errors(pair: Pair) -> tuple[list[float], list[list[float]]]:
    """Per prompt, the logits error and the per-layer hidden-state errors of one packed prefill step."""
    result = prefill(pair.model, PROMPTS, capture=True)
    layers = pair.config.num_hidden_layers
    logit_errors, hidden_errors = [], []
    for i, p in enumerate(PROMPTS):
        logits, hidden = pair.reference(p)
        logit_errors.append(rel(result.logits[i], logits))
        ours = result.hidden[i][:layers] + [result.hidden[i][-1]]  # HF's last entry is after the final norm
        hidden_errors.append([rel(a, b) for a, b in zip(ours, hidden, strict=True)])
    return logit_errors, hidden_errors


def test_prefill_matches_transformers(pair):
    logit_errors, hidden_errors = prefill_errors(pair)
    assert max(logit_errors) < TOL, (pair.arch, logit_errors)
    assert max(max(h) for h in hidden_errors) < TOL, (pair.arch, hidden_errors)


def test_decode_and_chunked_prefill_match_transformers(pair):
    errors = decode_and_chunked(pair)
    assert max(errors) < TOL, (pair.arch, errors)


def test_config_features(pair):
    """The tiny checkpoints exercise what they claim, and the softmax scale is transformers'."""
    c, model = pair.config, pair.model
    attn = model.model.layers[0].self_attn
    assert attn.scale == pytest.approx(pair.hf.model.layers[0].self_attn.scaling, rel=1e-12)
    moe = model.model.layers[-1].mlp
    if pair.arch == "deepseek_v3":
        assert c.q_lora_rank and c.rope_parameters["rope_type"] == "yarn" and c.rope_interleave
        assert attn.scale != pytest.approx((c.qk_nope_head_dim + c.qk_rope_head_dim) ** -0.5)
        assert (moe.experts.routing.scoring, moe.experts.routing.n_group) == ("sigmoid", c.n_group)
        assert moe.gate.e_score_correction_bias is moe.experts.correction_bias
    else:
        assert c.q_lora_rank is None and c.topk_method == "group_limited_greedy"
        r = moe.experts.routing
        assert (r.scoring, r.n_group, r.topk_group, r.renormalize) == ("softmax", c.n_group, c.topk_group, False)
    assert not attn.rotary.is_neox
    assert moe.gate.weight.dtype == torch.float32


def test_mtp_layers_ignored(pair, tmp_path):
    c = pair.config
    if pair.mtp is not None:  # V3: num_nextn_predict_layers = 1, the shard written by the fixture
        report = load_weights(pair.model, pair.path)
        assert pair.mtp in report.ignored
        return
    # V2 declares no MTP layers: a tensor past num_hidden_layers is an error, not silently dropped
    copy = Path(shutil.copytree(pair.path, tmp_path / "ckpt"))
    name = add_mtp_shard(copy, c.num_hidden_layers, c.hidden_size)
    with pytest.raises(UnexpectedWeightsError) as err:
        load_weights(pair.model, copy)
    assert name in err.value.unexpected
    load_weights(pair.model, pair.path)


@pytest.mark.parametrize("which", ["kv_b_proj", "router"])
def test_corrupted_weight_is_caught(pair, which):
    """The comparisons can fail: a small change to one weight shows in the decode errors."""
    layers = pair.model.model.layers
    if which == "kv_b_proj":  # and W_UK/W_UV of the absorbed path, rebuilt by the post-load pass
        param = layers[0].self_attn.kv_b_proj.weight
        index = (0, 0)
    else:  # the router of the last (MoE) layer
        param = layers[-1].mlp.gate.weight
        index = (0, slice(None))
    saved = param.data.clone()
    try:
        with torch.no_grad():
            param.data[index] += 0.5
        process_weights_after_loading(pair.model)
        errors = decode_and_chunked(pair)
        if which == "kv_b_proj":  # every row moved, the absorbed decodes included
            assert min(errors) > TOL, errors
        else:  # some tokens route elsewhere
            assert max(errors) > TOL, errors
    finally:
        with torch.no_grad():
            param.data.copy_(saved)
        process_weights_after_loading(pair.model)
    assert max(decode_and_chunked(pair)) < TOL
