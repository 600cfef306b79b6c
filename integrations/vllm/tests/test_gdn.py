"""Qwen3-Next's Gated DeltaNet layers on hetero ``causal_conv1d`` + ``gated_delta_rule`` over vLLM's state cache.

vLLM-CPU's own GDN kernels take bf16 activations only (and head dims its C++ kernels
know), so there is no float32 stock run to compare with: the reference is transformers
in float64. With the GDN layers routed, every other layer of Qwen3-Next runs in float32
on vLLM-CPU too. The engine workload (``_driver.py``) has chunked prefill, which carries
the conv and SSM states across chunks, and a prefix-cache hit, which restarts from a
state vLLM saved at a block boundary (``mamba_cache_mode="align"``).
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from _compare import EXPERT_ROUTES, LINEAR_ROUTES, assert_compiled, assert_routed

ROUTES = {
    "QwenGatedDeltaNetAttention": {"causal_conv1d", "gated_delta_rule"},
    "Attention": {"write_kv", "paged_attention"},
    **LINEAR_ROUTES,
    **EXPERT_ROUTES,
}
#: |logprob| tolerance against float64 transformers: vLLM runs float32 end to end (4 layers, MoE, lm head),
#: and transformers' chunked delta rule runs in float32 even in a float64 model; measured worst 1.9e-5.
ATOL = 1e-4


@pytest.fixture(scope="session")
def qwen3_next(models) -> Path:
    """The suite's tiny Qwen3-Next: three GDN layers, then a gated full-attention layer; MoE."""
    return models["qwen3_next"]


def _assert_matches_transformers(path: Path, got: list[dict]) -> None:
    """Teacher-forced: at every step vLLM's token is float64 transformers' argmax (unless the top two are
    closer than ATOL) and its top-k logprobs are transformers' within ATOL."""
    import _driver
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, experts_implementation="eager").eval()
    first, second = _driver.prompts(model.config.vocab_size)
    assert len(got) == len(first + second)
    for i, (prompt, seq) in enumerate(zip(first + second, got)):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + seq["tokens"]])).logits[0, len(prompt) - 1 : -1]
        logprobs = torch.log_softmax(logits, dim=-1)
        for step, (token, top) in enumerate(zip(seq["tokens"], seq["logprobs"])):
            best = logprobs[step].topk(2)
            if int(best.indices[0]) != token:
                gap = float(best.values[0] - best.values[1])
                assert gap < ATOL, f"sequence {i} step {step}: token {token}, transformers' {int(best.indices[0])}"
            for t, value in top.items():
                want = float(logprobs[step, int(t)])
                assert abs(want - value) <= ATOL, f"sequence {i} step {step} token {t}: {value} vs {want}"


def _assert_all_layers_routed(report: dict, backend: str) -> None:
    assert_routed(report, ROUTES, backend)
    assert report["instances"]["QwenGatedDeltaNetAttention"] == {"built": 3, "called": 3}
    assert not any(k.startswith("QwenGatedDeltaNetAttention") for k in report["not_routed"]), report["not_routed"]


def test_eager_cpu_ref_matches_float64_transformers(qwen3_next, runs):
    """Also vLLM's DS conv-state layout ([S, C, W-1], NIXL's), which reaches hetero as a transposed view; the
    compiled run below has the default SD layout."""
    got, report = runs(qwen3_next, backend="cpu_ref", env={"VLLM_SSM_CONV_STATE_LAYOUT": "DS"})
    _assert_all_layers_routed(report, "cpu_ref")
    _assert_matches_transformers(qwen3_next, got)


def test_compiled_torch_matches_float64_transformers(qwen3_next, runs, tmp_path_factory):
    """Compiled mode traces vLLM's projections and keeps hetero::gdn_attention_core as one opaque node."""
    env = {"VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache-gdn"))}
    got, report = runs(qwen3_next, backend="torch", compiled=True, env=env)
    assert_compiled(report)
    _assert_all_layers_routed(report, "torch")
    _assert_matches_transformers(qwen3_next, got)


#: The op test's layer: 2 key heads, 4 value heads (GVA 2), head dims 16, a 4-wide conv, 4 state slots.
H, HV, K, V, W, SLOTS = 2, 4, 16, 16, 4, 4
C = 2 * H * K + HV * V  # the conv channels: q | k | v


def _layer(dim_first: bool, packed: bool):
    """A stand-in for vLLM's layer: the attributes the op reads, vLLM's own q/k/v split, a NaN-filled cache."""
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

    conv_shape = (SLOTS, C, W - 1) if dim_first else (SLOTS, W - 1, C)
    weight = torch.randn(C, 1, W)
    conv1d = types.SimpleNamespace(weight=weight, bias=None)
    if packed:  # vLLM-CPU's bf16 packing: the weight is unusable, the plain copy is stashed
        conv1d.weight, conv1d._cpu_unpacked_conv_weight = torch.full((7,), float("nan")), weight[:, 0].clone()
    layer = types.SimpleNamespace(
        prefix="model.layers.0.linear_attn",
        kv_cache=(torch.full(conv_shape, float("nan")), torch.full((SLOTS, HV, V, K), float("nan"))),
        conv1d=conv1d,
        A_log=torch.randn(HV),
        dt_bias=torch.randn(HV),
        head_k_dim=K,
        head_v_dim=V,
        key_dim=H * K,
        value_dim=HV * V,
        tp_size=1,
    )
    layer.rearrange_mixed_qkv = types.MethodType(QwenGatedDeltaNetAttention.rearrange_mixed_qkv, layer)
    return layer, weight[:, 0]


def _meta(lens: list[int], slots: list[int], initial: list[bool], decodes: int):
    qsl = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    return types.SimpleNamespace(
        num_spec_decodes=0,
        spec_sequence_masks=None,
        num_decodes=decodes,
        num_prefills=len(lens) - decodes,
        num_decode_tokens=sum(lens[:decodes]),
        num_prefill_tokens=sum(lens[decodes:]),
        non_spec_query_start_loc=qsl,
        non_spec_state_indices_tensor=torch.tensor(slots, dtype=torch.int32),
        has_initial_state=None if decodes == len(lens) else torch.tensor(initial),
    )


def _reference(x, b, a, weight, layer):
    """One whole sequence through transformers' Qwen3-Next functions: (out [L, HV, V], final state [HV, K, V])."""
    import torch.nn.functional as F
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    y = hf.causal_conv1d_fn(x.T[None], weight, None, activation="silu")[0].T
    q, k, v = y.split([H * K, H * K, HV * V], dim=-1)
    q, k = (t.reshape(-1, H, K).repeat_interleave(HV // H, dim=1)[None] for t in (q, k))
    g = -layer.A_log.exp() * F.softplus(a + layer.dt_bias)
    out, state = hf.torch_chunk_gated_delta_rule(
        q, k, v.reshape(1, -1, HV, V), g[None], b.sigmoid()[None], output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    return out[0], state[0], x[-(W - 1) :]


@pytest.mark.parametrize("dim_first,packed", [(False, False), (True, True)])
def test_op_carries_states_in_vllm_layouts(cpu_ref, monkeypatch, dim_first, packed):
    """Two sequences over three steps (prefill, a chunked prefill continuing from its state with a decode beside
    it, then decodes) give transformers' outputs for the whole sequences, and leave transformers' final states
    in vLLM's declared layouts: conv [S, W-1, C] or [S, C, W-1], SSM [S, HV, V, K]."""
    from vllm.model_executor.layers.mamba import mamba_utils

    from hetero_vllm import _gdn_op

    monkeypatch.setattr(mamba_utils, "is_conv_state_dim_first", lambda: dim_first)
    torch.manual_seed(0)
    layer, weight = _layer(dim_first, packed)
    full = {n: (torch.randn(n, C), torch.randn(n, HV), torch.randn(n, HV)) for n in (7, 12)}
    slot = {7: 3, 12: 1}
    steps = [  # (rows of each sequence this step, decodes first)
        ([(7, 0, 6), (12, 0, 5)], 0),
        ([(7, 6, 7), (12, 5, 11)], 1),
        ([(12, 11, 12)], 1),
    ]
    outs = {n: [] for n in full}
    for rows, decodes in steps:
        lens = [e - s for _, s, e in rows]
        meta = _meta(lens, [slot[n] for n, _, _ in rows], [s > 0 for _, s, _ in rows], decodes)
        x, b, a = (torch.cat([full[n][i][s:e] for n, s, e in rows]) for i in range(3))
        out = torch.full((sum(lens) + 2, HV, V), float("nan"))  # two padding rows the op leaves alone
        _gdn_op._core(layer, meta, x, b, a, out, "QwenGatedDeltaNetAttention#0")
        assert out[sum(lens) :].isnan().all()
        for (n, s, e), part in zip(rows, out[: sum(lens)].split(lens)):
            outs[n].append(part)
    conv_cache, ssm_cache = layer.kv_cache
    for n, (x, b, a) in full.items():
        want_out, want_state, want_conv = _reference(x, b, a, weight, layer)
        torch.testing.assert_close(torch.cat(outs[n]), want_out, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ssm_cache[slot[n]], want_state.transpose(-1, -2), rtol=1e-4, atol=1e-5)
        got_conv = conv_cache[slot[n]].T if dim_first else conv_cache[slot[n]]
        assert torch.equal(got_conv, want_conv)  # exact copies of the last W-1 inputs
    assert cpu_ref.snapshot()["routed"]["QwenGatedDeltaNetAttention"] == {"causal_conv1d": 3, "gated_delta_rule": 3}


def test_unsupported_configurations_keep_vllm_path():
    from hetero_vllm.gdn import unsupported

    def layer(ssm=torch.float32, conv=torch.float32, spec=0, activation="silu"):
        return types.SimpleNamespace(
            get_state_dtype=lambda: (conv, ssm),
            model_config=types.SimpleNamespace(dtype=torch.float32),
            cache_config=types.SimpleNamespace(mamba_ssm_cache_dtype="bfloat16"),
            num_spec=spec,
            activation=activation,
        )

    plain = types.SimpleNamespace(speculative_config=None, lora_config=None)
    assert unsupported(layer(), plain) is None
    assert unsupported(layer(ssm=torch.bfloat16), plain)[0] == "ssm state torch.bfloat16"
    assert unsupported(layer(conv=torch.bfloat16), plain)[0] == "conv state torch.bfloat16"
    assert unsupported(layer(spec=2), plain)[0] == "speculative decoding"
    assert unsupported(layer(), types.SimpleNamespace(speculative_config=None, lora_config=object()))[0] == "LoRA"
    assert unsupported(layer(activation="gelu"), plain)[0] == "activation gelu"
