"""The op-call seam (hetero.engine.instrument) on tiny Qwen3 and DeepSeek-V3 models, cpu_ref, float32.

The expected calls are derived from the model structure: one prefill step runs every
layer's forward once, and each layer calls each of its ops once, except MLA, which
takes both paths when the step has decodes and a prefill (a one-token prompt is a decode).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

pytest.importorskip("transformers")

import hetero
from hetero.engine.context import ModelContext, op_slots
from hetero.engine.forward import build_model, prefill
from hetero.engine.instrument import OpCounter, instrument, op_sites
from hetero.engine.models import model_class
from hetero.engine.parallel import Parallel
from hetero.errors import UsageError
from hetero.tools import tiny

PROMPT_LENS = (1, 7, 20)  # the one-token prompt is a decode row: MLA's absorbed path runs too


@pytest.fixture(scope="module")
def ops():
    return hetero.load("cpu_ref")


@pytest.fixture(scope="module")
def models(ops, tmp_path_factory):
    root = tmp_path_factory.mktemp("instrument")
    return {
        arch: build_model(tiny.build(arch, root / arch, shard_size=None), ops, torch.float32)
        for arch in ("qwen3", "deepseek_v3")
    }


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, 256, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def qwen3_calls(config) -> Counter:
    """(path, op) -> calls of one step: per layer 4 norms (input, post-attention, q, k), 4 gemms
    (qkv, o, gate_up, down), rope, write_kv, paged_attention and silu_and_mul; then the final norm
    and the lm_head gemm."""
    per_layer = [
        ("input_layernorm", "rms_norm"),
        ("post_attention_layernorm", "rms_norm"),
        ("self_attn.q_norm", "rms_norm"),
        ("self_attn.k_norm", "rms_norm"),
        ("self_attn.qkv_proj", "gemm"),
        ("self_attn.o_proj", "gemm"),
        ("self_attn.rotary_emb", "rotary_embedding"),
        ("self_attn.attn", "write_kv"),
        ("self_attn.attn", "paged_attention"),
        ("mlp.gate_up_proj", "gemm"),
        ("mlp.act_fn", "silu_and_mul"),
        ("mlp.down_proj", "gemm"),
    ]
    calls = Counter(
        {(f"model.layers.{i}.{sub}", op): 1 for i in range(config.num_hidden_layers) for sub, op in per_layer}
    )
    calls.update({("model.norm", "rms_norm"): 1, ("lm_head", "gemm"): 1})
    return calls


def deepseek_v3_calls(config) -> Counter:
    """As qwen3_calls for DeepSeek-V3 with q_lora_rank: MLA's low-rank projections and norms, the
    absorbed decode (two per-head grouped GEMMs around mla_attention) and the expanded prefill
    (kv_b_proj, varlen_attention); a dense MLP in the first ``first_k_dense_replace`` layers, else
    router gemm, route, fused_moe and the shared experts' MLP."""
    attn = [
        ("q_a_proj", "gemm"),
        ("q_a_layernorm", "rms_norm"),
        ("q_b_proj", "gemm"),
        ("kv_a_proj_with_mqa", "gemm"),
        ("kv_a_layernorm", "rms_norm"),
        ("rotary", "rotary_embedding"),
        ("", "write_mla_kv"),
        ("", "mla_attention"),
        ("", "varlen_attention"),
        ("kv_b_proj", "gemm"),
        ("o_proj", "gemm"),
    ]
    mlp = [("gate_up_proj", "gemm"), ("act_fn", "silu_and_mul"), ("down_proj", "gemm")]
    moe = [("gate", "gemm"), ("experts", "route"), ("experts", "fused_moe")] + [
        (f"shared_experts.{s}", op) for s, op in mlp
    ]
    calls: Counter = Counter()
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}"
        calls.update({(f"{p}.{n}", "rms_norm"): 1 for n in ("input_layernorm", "post_attention_layernorm")})
        calls.update({(f"{p}.self_attn{'.' * bool(s)}{s}", op): 1 for s, op in attn})
        calls[f"{p}.self_attn", "grouped_gemm"] += 2
        calls.update({(f"{p}.mlp.{s}", op): 1 for s, op in (mlp if i < config.first_k_dense_replace else moe)})
    calls.update({("model.norm", "rms_norm"): 1, ("lm_head", "gemm"): 1})
    return calls


EXPECTED = {"qwen3": qwen3_calls, "deepseek_v3": deepseek_v3_calls}


@pytest.mark.parametrize("arch", list(EXPECTED))
def test_counts_per_path_and_op(models, prompts, arch):
    model = models[arch]
    counter = OpCounter()
    with instrument(model, counter):
        prefill(model, prompts)
    expected = EXPECTED[arch](model.config)
    assert dict(counter.calls) == dict(expected)
    # every op family a model declares is called at least once
    assert set(counter.per_op()) == {s.op for _, s in op_sites(model)}
    if arch == "qwen3":
        layers = model.config.num_hidden_layers
        assert counter.per_op() == Counter(
            gemm=4 * layers + 1,
            rms_norm=4 * layers + 1,
            rotary_embedding=layers,
            write_kv=layers,
            paged_attention=layers,
            silu_and_mul=layers,
        )


@pytest.mark.parametrize("arch", list(EXPECTED))
def test_identity_hook_and_restore(models, prompts, arch):
    model = models[arch]
    before = {(id(m), s.attr): getattr(m, s.attr) for m, s in op_sites(model)}
    plain = prefill(model, prompts).logits
    with instrument(model, lambda site, fn, args, kwargs: fn(*args, **kwargs)) as handle:
        assert all(getattr(m, s.attr) is not before[id(m), s.attr] for m, s in op_sites(model))
        hooked = prefill(model, prompts).logits
    handle.restore()  # idempotent
    assert all(torch.equal(a, b) for a, b in zip(plain, hooked))
    assert all(getattr(m, s.attr) is before[id(m), s.attr] for m, s in op_sites(model))
    assert not any("_instrumented_ops" in vars(m) for m in model.modules())


def test_hook_error_names_the_module_path(models, prompts):
    model = models["qwen3"]
    before = model.model.layers[1].self_attn.attn._attention

    def fail_in_layer_1(site, fn, args, kwargs):
        if site.path == "model.layers.1.self_attn.attn" and site.op == "paged_attention":
            raise RuntimeError("refused")
        return fn(*args, **kwargs)

    with pytest.raises(RuntimeError, match="refused") as info:
        with instrument(model, fail_in_layer_1):
            prefill(model, prompts)
    assert any("model.layers.1.self_attn.attn" in note and "paged_attention" in note for note in info.value.__notes__)
    assert model.model.layers[1].self_attn.attn._attention is before


def test_nested_instrument_is_refused(models):
    model = models["qwen3"]
    with instrument(model, OpCounter()):
        with pytest.raises(UsageError, match="already instrumented"):
            instrument(model, OpCounter())
        with pytest.raises(UsageError, match="already instrumented"):
            instrument(model.model.layers[0], OpCounter())
    with instrument(model.model.layers[0], OpCounter()) as handle:  # restored: allowed again
        assert {s.path for s in handle.sites} >= {"self_attn.attn", "mlp.down_proj"}


@pytest.mark.parametrize("arch", list(tiny.ARCHS))
def test_every_op_a_layer_holds_is_declared(ops, arch):
    """No layer keeps a callable outside its declared slots (what the seam could not see)."""
    config = tiny.tiny_config(arch)
    ctx = ModelContext(ops=ops, parallel=Parallel(), dtype=torch.float32, device=torch.device("cpu"))
    model = model_class(config.architectures)(config, ctx)
    for path, module in model.named_modules():
        held = {
            k for k, v in vars(module).items() if callable(v) and not isinstance(v, type) and not k.startswith("__")
        }
        assert held == set(op_slots(module)), path
    assert op_sites(model)
