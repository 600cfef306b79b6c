"""The reference kv_compress (spec 1.8) against the modules it comes from: transformers'
DeepseekV4HCACompressor (no overlap), DeepseekV4CSACompressor (overlap) and its DeepseekV4Indexer's
compressor, each run on a whole prompt, while the reference runs the same prompts split into chunks
(windows split mid-way, one-token decode steps, several windows closing in one call) batched with
other sequences and a padding slot; plus the argument checks and the index validator."""

from __future__ import annotations

import types

import pytest
import torch

from hetero.errors import OpError
from hetero.spec import validate
from hetero.spec.types import AttentionMeta
from hetero_cpu_ref import compress as ref

ds = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
transformers = pytest.importorskip("transformers")

HIDDEN, D, DI, ROT, Q_LORA = 32, 64, 32, 16, 16
RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}
EPS = 1e-6


def _config():
    return transformers.DeepseekV4Config(
        hidden_size=HIDDEN, head_dim=D, num_attention_heads=2, num_key_value_heads=1, index_head_dim=DI,
        index_n_heads=2, index_topk=4, q_lora_rank=Q_LORA, compress_rates=RATES, num_hidden_layers=2,
        qk_rope_head_dim=ROT, vocab_size=64, rms_norm_eps=EPS, max_position_embeddings=4096,
        rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256,
                         "beta_fast": 32, "beta_slow": 1},
    )  # fmt: skip


def _modules(seed: int):
    """(config, hca, csa) with every parameter drawn at random (float32, kv_norm weights included)."""
    cfg = _config()
    gen = torch.Generator().manual_seed(seed)
    hca, csa = ds.DeepseekV4HCACompressor(cfg), ds.DeepseekV4CSACompressor(cfg)
    with torch.no_grad():
        for mod in (hca, csa):
            for name, p in mod.named_parameters():
                scale = 0.5 if "proj" in name else 1.0
                p.copy_(torch.randn(p.shape, generator=gen) * scale + (1.0 if "norm" in name else 0.0))
    return cfg, hca, csa


def _whole_prompt(cfg, hca, csa, h: torch.Tensor) -> dict[str, torch.Tensor]:
    """The entries transformers' modules emit for the prompt h [L, hidden], through their caches."""
    pos = torch.arange(h.shape[0])[None]
    q_res = torch.randn(1, h.shape[0], Q_LORA, generator=torch.Generator().manual_seed(9))
    hca_layer, csa_layer = ds.DeepseekV4HCACache(cfg), ds.DeepseekV4CSACache(cfg)
    with torch.no_grad():
        hca(h[None], q_res, pos, types.SimpleNamespace(layers=[hca_layer]), 0)
        csa(h[None], q_res, pos, types.SimpleNamespace(layers=[csa_layer]), 0)
    return {
        "hca": hca_layer.compressed_kv["compressor"][0],
        "csa": csa_layer.compressed_kv["compressor"][0],
        "indexer": csa_layer.compressed_kv["indexer"][0],
    }


def _compressor_args(mod, h: torch.Tensor, positions: int) -> dict:
    """kv, gate (the module's own projections) and its parameters as kv_compress takes them."""
    cos, sin = mod.rotary_emb(h, position_ids=torch.arange(positions)[None], layer_type="compress")
    with torch.no_grad():
        return {
            "kv": mod.kv_proj(h),
            "gate": mod.gate_proj(h),
            "position_bias": mod.position_bias.detach().clone(),
            "norm_weight": mod.kv_norm.weight.detach().clone(),
            "cos_sin_cache": torch.cat((cos[0], sin[0]), dim=-1),
        }


def _run_chunked(prompts: list[dict], schedules: list[list[int]], ratio: int, overlap: bool, bsc: int, seed: int):
    """Run kv_compress over the prompts (each ``_compressor_args``) in rounds: in round k sequence i
    brings its k-th chunk of ``schedules[i]`` (0 rows once done), beside a padding sequence (slot -1).
    Returns (comp_cache, block tables, the padding's block) after the last round."""
    gen = torch.Generator().manual_seed(seed)
    c, width = (2 if overlap else 1), prompts[0]["kv"].shape[1]
    d, r = width // c, c * ratio
    n_seq = len(prompts)
    per_seq = max(-(-(p["kv"].shape[0] // ratio) // bsc) for p in prompts)
    blocks = torch.randperm(n_seq * per_seq + 1, generator=gen)
    cache = torch.full((blocks.numel(), bsc, d), float("nan"))
    slots = torch.randperm(n_seq + 2, generator=gen)[:n_seq]
    kv_state = torch.full((n_seq + 2, r, width), float("nan"))  # a fresh slot is never read
    gate_state = torch.full((n_seq + 2, r, width), float("nan"))
    tables = blocks[: n_seq * per_seq].view(n_seq, per_seq)
    pad_block = int(blocks[-1])
    done = [0] * n_seq
    for k in range(max(len(s) for s in schedules)):
        lens = [s[k] if k < len(s) else 0 for s in schedules]
        kv = torch.cat([p["kv"][done[i] : done[i] + lens[i]] for i, p in enumerate(prompts)] + [torch.randn(3, width)])
        gate = torch.cat(
            [p["gate"][done[i] : done[i] + lens[i]] for i, p in enumerate(prompts)] + [torch.randn(3, width)]
        )
        done = [a + n for a, n in zip(done, lens)]
        table = torch.cat((tables, torch.full((1, per_seq), pad_block)))
        meta = AttentionMeta.build(lens + [3], done + [40], table.to(torch.int32))
        ref.kv_compress(
            kv, gate, prompts[0]["position_bias"], prompts[0]["norm_weight"], prompts[0]["cos_sin_cache"], cache,
            kv_state, gate_state, meta, torch.cat((slots, torch.tensor([-1]))).to(torch.int32),
            ratio=ratio, overlap=overlap, eps=EPS,
        )  # fmt: skip
    return cache, tables, pad_block


def _entries(cache: torch.Tensor, table: torch.Tensor, count: int) -> torch.Tensor:
    bsc = cache.shape[1]
    return torch.stack([cache[table[w // bsc], w % bsc] for w in range(count)])


# chunk schedules of a 37-token prompt (m = 4 and 8): windows split mid-way, one-token decode
# steps, a chunk closing several windows, one closing none; and 29 tokens in one call
SCHEDULES = ([3, 6, 1, 1, 5, 1, 1, 1, 17, 1], [37], [1] * 12 + [25], [8, 9, 7, 13])


@pytest.mark.parametrize("bsc", [1, 3])
def test_chunked_prefill_and_decode_write_the_whole_prompts_entries(bsc):
    cfg, hca, csa = _modules(0)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randn(37, HIDDEN, generator=gen) for _ in SCHEDULES[:3]] + [torch.randn(29, HIDDEN, generator=gen)]
    schedules = [list(SCHEDULES[0]), list(SCHEDULES[1]), list(SCHEDULES[2]), [1, 8, 3, 17]]
    want = [_whole_prompt(cfg, hca, csa, h) for h in prompts]
    for name, mod, ratio, overlap in (
        ("hca", hca, 8, False),
        ("csa", csa, 4, True),
        ("indexer", csa.indexer, 4, True),
    ):
        args = [_compressor_args(mod, h, 64) for h in prompts]
        cache, tables, pad = _run_chunked(args, schedules, ratio, overlap, bsc, seed=2)
        for i, h in enumerate(prompts):
            got = _entries(cache, tables[i], h.shape[0] // ratio)
            torch.testing.assert_close(got, want[i][name], rtol=2e-5, atol=2e-5, msg=f"{name} prompt {i}")
        written = sum(h.shape[0] // ratio for h in prompts)
        assert int((~cache.isnan().any(-1)).sum()) == written, name  # every other slot kept its NaN
        assert cache[pad].isnan().all(), name  # the padding sequence wrote nothing


def test_transformers_own_chunked_cache_agrees():
    """transformers' compressors fed chunk by chunk through their caches emit what the whole prompt
    does: the state the spec carries (the ring) is the state transformers carries (buffer + overlap)."""
    cfg, hca, csa = _modules(3)
    h = torch.randn(37, HIDDEN, generator=torch.Generator().manual_seed(4))
    want = _whole_prompt(cfg, hca, csa, h)
    hca_layer, csa_layer = ds.DeepseekV4HCACache(cfg), ds.DeepseekV4CSACache(cfg)
    at = 0
    for n in SCHEDULES[0]:
        pos = torch.arange(at, at + n)[None]
        q_res = torch.randn(1, n, Q_LORA)
        with torch.no_grad():
            hca(h[None, at : at + n], q_res, pos, types.SimpleNamespace(layers=[hca_layer]), 0)
            csa(h[None, at : at + n], q_res, pos, types.SimpleNamespace(layers=[csa_layer]), 0)
        at += n
    torch.testing.assert_close(hca_layer.compressed_kv["compressor"][0], want["hca"])
    torch.testing.assert_close(csa_layer.compressed_kv["compressor"][0], want["csa"])
    torch.testing.assert_close(csa_layer.compressed_kv["indexer"][0], want["indexer"])


def test_state_ring_holds_the_last_raw_rows():
    """After each call slot p holds token q's raw rows at q % R for the last R tokens, bit for bit;
    rows of older tokens are left as they were."""
    gen = torch.Generator().manual_seed(5)
    m, c, d = 4, 2, 8
    r, width = c * m, c * d
    kv, gate = torch.randn(19, width, generator=gen).bfloat16(), torch.randn(19, width, generator=gen).bfloat16()
    kv_state = torch.randn(2, r, width, generator=gen).bfloat16()
    gate_state = kv_state.clone()
    cache = torch.zeros(8, 2, d, dtype=torch.bfloat16)
    params = (torch.randn(m, width), torch.rand(d) + 0.5, torch.randn(64, 4))
    at = 0
    for n in (5, 1, 13):
        before = kv_state.clone()
        meta = AttentionMeta.build([n], [at + n], [list(range(8))])
        ref.kv_compress(kv[at : at + n], gate[at : at + n], *params, cache, kv_state, gate_state, meta,
                        torch.tensor([1], dtype=torch.int32), ratio=m, overlap=True, eps=EPS)  # fmt: skip
        at += n
        for q in range(max(0, at - r), at):
            assert torch.equal(kv_state[1, q % r], kv[q]) and torch.equal(gate_state[1, q % r], gate[q])
        kept = sorted(set(range(r)) - {q % r for q in range(max(at - n, at - r), at)})
        assert torch.equal(kv_state[1, kept], before[1, kept]) and torch.equal(kv_state[0], before[0])


def _small_call(**over):
    m, d = 4, 8
    args = {
        "kv": torch.randn(5, 2 * d), "gate": torch.randn(5, 2 * d), "position_bias": torch.randn(m, 2 * d),
        "norm_weight": torch.ones(d), "cos_sin_cache": torch.randn(16, 4), "comp_cache": torch.zeros(3, 2, d),
        "kv_state": torch.zeros(2, 2 * m, 2 * d), "gate_state": torch.zeros(2, 2 * m, 2 * d),
        "meta": AttentionMeta.build([3, 2], [9, 2], [[0, 1], [2, 0]]),
        "state_slots": torch.tensor([1, 0], dtype=torch.int32),
    }  # fmt: skip
    opts = {"ratio": m, "overlap": True, "eps": EPS}
    for k, v in over.items():
        (opts if k in opts else args)[k] = v
    return args, opts


@pytest.mark.parametrize(
    "over, arg",
    [
        ({"ratio": 0}, "ratio"),
        ({"ratio": 4.0}, "ratio"),
        ({"overlap": 1}, "overlap"),
        ({"eps": 0.0}, "eps"),
        ({"kv": torch.randn(5, 15)}, "kv"),  # odd width with overlap
        ({"gate": torch.randn(5, 16, dtype=torch.float64)}, "gate"),
        ({"position_bias": torch.randn(3, 16)}, "position_bias"),
        ({"norm_weight": torch.ones(8, dtype=torch.bfloat16)}, "norm_weight"),
        ({"cos_sin_cache": torch.randn(16, 3)}, "cos_sin_cache"),  # odd rot
        ({"cos_sin_cache": torch.randn(16, 10)}, "cos_sin_cache"),  # rot > D
        ({"comp_cache": torch.zeros(3, 2, 16)}, "comp_cache"),
        ({"kv_state": torch.zeros(2, 4, 16)}, "kv_state"),  # R = C*m = 8 rows
        ({"gate_state": torch.zeros(3, 8, 16)}, "gate_state"),
        ({"state_slots": torch.tensor([1], dtype=torch.int32)}, "state_slots"),
    ],
)
def test_bad_arguments_name_the_argument(over, arg):
    args, opts = _small_call(**over)
    with pytest.raises(OpError) as e:
        ref.kv_compress(**args, **opts)
    assert e.value.op == "kv_compress" and e.value.arg == arg


@pytest.mark.parametrize(
    "over, arg",
    [
        ({"state_slots": torch.tensor([2, 0], dtype=torch.int32)}, "state_slots"),
        ({"meta": AttentionMeta.build([3, 2], [9, 2], [[3, 1], [2, 0]])}, "meta.block_table"),  # entry 1 in block 3
        ({"meta": AttentionMeta.build([3, 2], [12, 2], [[0], [2]])}, "meta.block_table"),  # 3 entries, 1 column
        ({"cos_sin_cache": torch.randn(4, 4)}, "cos_sin_cache"),  # entry 1 at position 4
        ({"meta": AttentionMeta.build([3, 2], [2, 2], [[0, 1], [2, 0]])}, "meta.seq_lens"),
    ],
)
def test_bad_indices_are_caught_by_the_reference_and_the_validator(over, arg):
    args, opts = _small_call(**over)
    for check in (ref.kv_compress, validate.VALIDATORS["kv_compress"]):
        with pytest.raises(OpError) as e:
            check(**args, **opts)
        assert e.value.arg == arg


def test_padding_and_windowless_sequences_need_no_valid_blocks():
    """A slot of -1, and a sequence that closes no window, read no block id and no cos row."""
    meta = AttentionMeta.build([3, 2], [7, 2], [[-5, 99], [77, 0]])  # seq 0: tokens 4..6 close no window (m=4)
    args, opts = _small_call(meta=meta, state_slots=torch.tensor([1, -1], dtype=torch.int32))
    assert validate.VALIDATORS["kv_compress"](**args, **opts) is None
    ref.kv_compress(**args, **opts)
    assert not args["comp_cache"].any()
