"""DeepSeek-V4 on cpu_ref in float32 against transformers' own ``DeepseekV4ForCausalLM`` on a tiny random checkpoint:
a sliding, a CSA (ratio 2, indexer top-4) and an HCA (ratio 8) layer over a window of 8, so prompts cross several
windows and the indexer prunes; hash routing in layer 0. Prefill logits and every layer, 32 greedy tokens,
16 mixed requests (chunks that split windows, a prefix hit, preemption), TP=2 and EP=2, check-model, bfloat16, the
structure a bfloat16 model keeps, and the refusals. ``check-model --per-op``: ``test_per_op`` (every tiny arch); the
Triton kernels under the interpreter: ``test_end_to_end``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from _hf import hf_greedy, prompts
from test_qwen_models import PROMPT_LENS, assert_small, errors

import hetero
from hetero.engine import LLM, SamplingParams
from hetero.engine.forward import build_model
from hetero.engine.layers.cached import compressed_block_table
from hetero.errors import UsageError
from hetero.tools import tiny

ARCH = "deepseek_v4"


def _greedy(llm, ps, max_tokens):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [list(o.token_ids) for o in llm.generate(ps, params, progress=False)]


def _llm(path, **kw):
    return LLM(str(path), backend="cpu_ref", dtype="float32", **kw)


def test_prefill_matches_transformers(checkpoints):
    path = checkpoints(ARCH)
    model = build_model(path, hetero.load("cpu_ref"), torch.float32)
    assert type(model).__name__ == "DeepseekV4ForCausalLM"
    assert_small(errors(model, path, prompts(256, PROMPT_LENS)))


def test_greedy_tokens_and_mixed_requests_equal_transformers(checkpoints):
    """32 greedy tokens; 16 requests one at a time, together in chunks of 13 tokens over blocks of 4 (chunks end
    mid-window, and the HCA ratio 8 spans two blocks), and over 14 blocks of 8 (a prefix-cache hit served from the
    compressor state's snapshot, and preemption): the same tokens, transformers' own."""
    path = checkpoints(ARCH)
    ps = prompts(256, (5, 17, 40))
    assert _greedy(_llm(path), ps, 32) == hf_greedy(path, ps, 32)
    ps = prompts(256, [3 + 5 * i for i in range(16)], seed=1)
    ps[5] = ps[3][:10] + ps[5]
    alone = _greedy(_llm(path, max_num_seqs=1), ps, 12)
    chunked = _llm(path, max_num_seqs=16, block_size=4, max_num_batched_tokens=13)
    assert _greedy(chunked, ps, 12) == alone
    small = _llm(path, max_num_seqs=16, block_size=8, num_kv_blocks=14, max_num_batched_tokens=64)
    assert _greedy(small, ps, 12) == alone
    assert small.stats["preemptions"] > 0 and small.stats["cached_prompt_tokens"] > 0
    assert alone == hf_greedy(path, ps, 12)


def test_tp2_and_ep2_equal_transformers(checkpoints, tmp_path):
    """Query heads, sinks and head groups split over two gloo ranks (the KV head and compressors replicated);
    EP=2 holds half the experts a rank, hash-routed layer included."""
    from test_parallel import _jobs, _torchrun

    plan = [(ARCH, False), (ARCH, True)]
    jobs, want = _jobs(checkpoints, "cpu_ref", plan)
    for (arch, ep), got, expected in zip(plan, _torchrun(jobs, tmp_path), want):
        assert got == expected, f"{arch} {'EP' if ep else 'TP'}=2 differs from transformers"


def test_check_model_passes(checkpoints):
    from hetero.tools.check import ModelCheck

    report = ModelCheck(checkpoints(ARCH), "cpu_ref").run(prompts(256, (7, 19)), max_tokens=4)
    assert report.passed, report.as_dict()
    assert max(r.rel_l2 for r in report.layers) < 1e-5


def test_structure_follows_config(checkpoints):
    """Each layer type's compressor and indexer; hash routing by token id in layer 0; in a bfloat16 model the
    norms, sinks, position biases and hyper-connections stay float32 as transformers keeps them; compressed
    entries live in the blocks of their window's last token."""
    model = build_model(checkpoints(ARCH), hetero.load("cpu_ref"), torch.bfloat16)
    layers = model.model.layers
    kinds = [(a.compressor is None, a.ratio, hasattr(a.compressor, "indexer")) for a in (x.self_attn for x in layers)]
    assert kinds == [(True, 0, False), (False, 2, True), (False, 8, False)]
    assert layers[0].mlp.hashed and layers[0].mlp.gate.tid2eid.dtype == torch.int64
    assert not layers[1].mlp.hashed and layers[1].mlp.experts.correction_bias is not None
    attn = layers[1].self_attn
    float32 = [
        attn.sinks,
        attn.q_a_norm.weight,
        attn.kv_norm.weight,
        attn.compressor.position_bias,
        attn.compressor.indexer.kv_norm.weight,
        layers[1].attn_hc.fn,
        layers[1].input_layernorm.weight,
        model.model.hc_head.hc_fn,
        model.model.norm.weight,
    ]
    assert all(p.dtype == torch.float32 for p in float32) and attn.q_b_proj.weight.dtype == torch.bfloat16
    table = torch.arange(12).view(1, 12)
    assert compressed_block_table(table, 16, 4).equal(table)  # 4 entries a block of 16 tokens
    assert compressed_block_table(table, 4, 8).tolist() == [[1, 3, 5, 7, 9, 11]]  # entry w: block of token 8w+7


@pytest.mark.parametrize(
    "field, value", [("num_key_value_heads", 2), ("hidden_act", "gelu"), ("attention_bias", True), ("o_groups", 3)]
)
def test_unimplemented_config_fields_are_refused_by_name(field, value, checkpoints):
    config = tiny.tiny_config(ARCH)
    setattr(config, field, value)
    with pytest.raises(UsageError, match=field) as err:
        build_model(checkpoints(ARCH), hetero.load("cpu_ref"), torch.float32, hf_config=config)
    assert err.value.arg == field


def test_bfloat16_greedy_tokens_follow_the_top5_rule(tmp_path):
    """hetero in bfloat16 against transformers in float32: each greedy token among the reference's top-5 given
    the engine's own prefix (a bf16 rounding may flip a near-tie). The checkpoint keeps every compressed entry
    (index_topk 64): at the tiny model's 4 of up to 28, a bf16 rounding of two near-equal index scores swaps an
    entry and the logits jump (as HY4's do); the indexer's selection is checked in float32 above."""
    from _hf import hf_model

    path = tiny.build(ARCH, tmp_path / ARCH, index_topk=64)
    ps = prompts(256, (5, 17, 40), seed=5)
    outs = _greedy(LLM(str(path), backend="cpu_ref", dtype="bfloat16"), ps, 16)
    for p, out in zip(ps, outs):
        with torch.inference_mode():
            logits = hf_model(str(path))(torch.tensor([p + out])).logits[0].float()
        for i, token in enumerate(out):
            top = logits[len(p) - 1 + i].topk(5).indices.tolist()
            assert token in top, (p, i, token, top)


def test_fp8_block_checkpoint_loads_exactly_and_fp4_experts_are_refused(tmp_path):
    """``hetero quantize``'s fp8-block copy (routers, head and the compressors' projections left in bf16, as the
    release ships them): with activation quantization off it equals transformers on the dequantized copy to
    float32 rounding, so every scale, expert stacking and release name loads; V4.1's ``expert_dtype`` is read,
    and fp4 experts are refused by name."""
    import json

    from _quant_oracle import PROMPTS, hf_logits, hf_model, rel

    from hetero.engine.config import load_hf_config
    from hetero.engine.forward import prefill
    from hetero.engine.quant import quant_config_of, weights_only
    from hetero.engine.quant.config import UnsupportedQuantization
    from hetero.tools.quantize import dequantize_checkpoint, quantize_checkpoint

    src = tiny.build(ARCH, tmp_path / "src", hidden_size=192, moe_intermediate_size=128)
    q, deq = tmp_path / "q", tmp_path / "deq"
    quantize_checkpoint(src, q, "fp8-block")
    dequantize_checkpoint(q, deq)
    config = load_hf_config(q)
    model = build_model(q, hetero.load("cpu_ref"), torch.float32, quant_config=weights_only(quant_config_of(config)))
    attn = model.model.layers[1].self_attn
    assert type(attn.q_b_proj.quant_method).__name__ == "ScaledLinearMethod"
    assert type(attn.compressor.kv_proj.quant_method).__name__ == "UnquantizedLinearMethod"
    got, want = prefill(model, PROMPTS).logits, hf_logits(hf_model(deq), PROMPTS)
    assert max(rel(a, b) for a, b in zip(got, want)) < 2e-5
    qc = json.loads((q / "config.json").read_text())["quantization_config"]
    with pytest.raises(UnsupportedQuantization, match="expert_dtype 'fp4'"):
        quant_config_of(type(config)(**{**config.to_dict(), "quantization_config": {**qc, "expert_dtype": "fp4"}}))


def test_compressed_entries_move_with_their_blocks_and_pd_refuses_them(checkpoints):
    """A sequence's cache export takes entry w from the block of token (w+1)m-1 (m = 8 over blocks of 16, and
    m = 8 over blocks of 4), and an import writes it back there; prefill/decode disaggregation, whose wire
    moves one row per token, refuses a model with such entries by name."""
    from hetero.engine.runtime.cache_io import export_sequence_cache, write_sequence_cache
    from hetero.engine.runtime.kv_cache import CachePools
    from hetero.serve.pd.identity import Identity

    for block_size, table, other in ((16, [3, 1], [0, 2]), (4, [5, 2, 7, 0, 6, 1, 3, 4], [1, 0, 3, 2, 5, 4, 7, 6])):
        per_block = max(1, block_size // 8)
        pools = CachePools(block_size, {"c": torch.randn(8, per_block, 3)}, tokens_per_slot={"c": 8})
        cache = export_sequence_cache(pools, table, None, 32)
        flat = pools.paged["c"].flatten(0, 1)
        want = [flat[table[(8 * w + 7) // block_size] * per_block + (8 * w + 7) % block_size // 8] for w in range(4)]
        assert torch.equal(cache.paged["c"], torch.stack(want))
        copy = CachePools(block_size, {"c": torch.zeros(8, per_block, 3)}, tokens_per_slot={"c": 8})
        write_sequence_cache(copy, other, None, cache)
        assert torch.equal(export_sequence_cache(copy, other, None, 32).paged["c"], cache.paged["c"])
    with pytest.raises(UsageError, match="compressed entries"):
        Identity.of(_llm(checkpoints(ARCH)), "prefill")


def test_speculative_decoding_is_refused_while_the_compressors_state_cannot_roll_back(checkpoints):
    """The compressors keep raw rows per sequence (kv_compress has no per-token form): a rejected draft's rows would
    stay in that state, so speculation is refused by name rather than giving wrong tokens."""
    spec = {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(UsageError, match="Compressor"):
        LLM(str(checkpoints("deepseek_v4")), backend="torch", dtype="float32", speculative_config=spec)
