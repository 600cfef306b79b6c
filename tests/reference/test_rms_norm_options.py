"""The reference rms_norm's spec-1.2 options (weight_offset, gate, gate_act) against independent formulations.

The independent sides: transformers' own Qwen3-Next / Qwen3.5 norms (zero-centred
``Qwen3NextRMSNorm``, gated ``Qwen3NextRMSNormGated`` / ``Qwen3_5RMSNormGated``),
Kimi-Linear's sigmoid-gated norm, and float64 formulas written out here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hetero.errors import OpError
from hetero_cpu_ref import layers

hf_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def hf(module: torch.nn.Module, w: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
    module = module.to(w.dtype)
    with torch.no_grad():
        module.weight.copy_(w)
        return module(*args)


def f64_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps) * w.double()


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_offset_is_qwen3_next_zero_centred_norm_bit_for_bit(dtype):
    g = gen(1)
    x, w, res = 3 * randn(g, 6, 4, 64, dtype=dtype), 0.1 * randn(g, 64, dtype=dtype), randn(g, 6, 4, 64, dtype=dtype)
    want = hf(hf_next.Qwen3NextRMSNorm(64, eps=1e-6), w, x)
    assert torch.equal(layers.rms_norm(x, w, 1e-6, weight_offset=1.0), want)
    y, h = layers.rms_norm(x, w, 1e-6, residual=res, weight_offset=1.0)
    assert torch.equal(h, (x.float() + res.float()).to(dtype))
    assert torch.equal(y, hf(hf_next.Qwen3NextRMSNorm(64, eps=1e-6), w, h))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "cls", ["qwen3_next.modeling_qwen3_next.Qwen3NextRMSNormGated", "qwen3_5.modeling_qwen3_5.Qwen3_5RMSNormGated"]
)
def test_gate_is_transformers_gated_norm_bit_for_bit(dtype, cls):
    module, name = cls.rsplit(".", 1)
    gated = getattr(pytest.importorskip(f"transformers.models.{module}"), name)
    g = gen(2)
    t, hv, v = 5, 4, 128  # grouped per value head: the caller's [T, HV, V] view
    x, z, w = (
        3 * randn(g, t, hv * v, dtype=dtype),
        2 * randn(g, t, hv * v, dtype=dtype),
        1 + 0.2 * randn(g, v, dtype=dtype),
    )
    want = hf(gated(v, eps=1e-6), w, x.view(-1, v), z.view(-1, v)).view(t, hv * v)
    got = layers.rms_norm(x.view(t, hv, v), w, 1e-6, gate=z.view(t, hv, v), gate_act="silu")
    assert got.shape == (t, hv, v) and torch.equal(got.view(t, hv * v), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_gate_matches_kimi_linear_within_one_rounding(dtype):
    kimi = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    g = gen(3)
    x, z, w = 3 * randn(g, 9, 128, dtype=dtype), 2 * randn(g, 9, 128, dtype=dtype), 1 + 0.2 * randn(g, 128, dtype=dtype)
    want = hf(kimi.KimiLinearRMSNormGated(128, eps=1e-6), w, x, z)  # Kimi rounds only at the end
    got = layers.rms_norm(x, w, 1e-6, gate=z, gate_act="sigmoid")
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:
        torch.testing.assert_close(got, want, rtol=2**-7 if dtype == torch.bfloat16 else 2**-10, atol=1e-3)


@pytest.mark.parametrize("act", ["silu", "sigmoid"])
def test_float64_matches_the_formula(act):
    g = gen(4)
    x, z, w = (
        randn(g, 7, 48, dtype=torch.float64),
        randn(g, 7, 48, dtype=torch.float64),
        randn(g, 48, dtype=torch.float64),
    )
    fn = F.silu if act == "silu" else torch.sigmoid
    got = layers.rms_norm(x, w, 1e-5, weight_offset=0.5, gate=z, gate_act=act)
    torch.testing.assert_close(got, f64_norm(x, w + 0.5, 1e-5) * fn(z), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(
        layers.rms_norm(x, w, 1e-5, weight_offset=-2.0), f64_norm(x, w - 2.0, 1e-5), rtol=1e-13, atol=1e-13
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_defaults_are_the_1_1_op_and_inputs_untouched(dtype):
    g = gen(5)
    x, w, res, z = (
        randn(g, 3, 40, dtype=dtype),
        randn(g, 40, dtype=dtype),
        randn(g, 3, 40, dtype=dtype),
        randn(g, 3, 40, dtype=dtype),
    )
    copies = [t.clone() for t in (x, w, res, z)]
    assert torch.equal(
        layers.rms_norm(x, w, 1e-6, weight_offset=0.0, gate=None, gate_act="sigmoid"), layers.rms_norm(x, w, 1e-6)
    )
    a, b = layers.rms_norm(x, w, 1e-6, residual=res, weight_offset=0), layers.rms_norm(x, w, 1e-6, residual=res)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    layers.rms_norm(x, w, 1e-6, weight_offset=1.0, gate=z)
    assert all(torch.equal(t, c) for t, c in zip((x, w, res, z), copies))


def test_empty_rows():
    y = layers.rms_norm(torch.empty(0, 32, 128), torch.ones(128), 1e-6, gate=torch.empty(0, 32, 128))
    assert y.shape == (0, 32, 128)


Z, R = torch.randn(2, 16), torch.randn(2, 16)


@pytest.mark.parametrize(
    "kwargs, arg, match",
    [
        ({"gate": Z, "residual": R}, "gate", "None when 'residual' is given"),
        ({"gate": torch.randn(2, 32)}, "gate", r"shape \[2, 16\]"),
        ({"gate": Z.half()}, "gate", "float32"),
        ({"gate": Z.tolist()}, "gate", "torch.Tensor"),
        ({"gate_act": "gelu"}, "gate_act", "'silu' or 'sigmoid'"),
        ({"gate_act": "gelu", "gate": Z}, "gate_act", "'silu' or 'sigmoid'"),
        ({"weight_offset": float("nan")}, "weight_offset", "a finite number"),
        ({"weight_offset": True}, "weight_offset", "a finite number"),
        ({"weight_offset": "1"}, "weight_offset", "a finite number"),
    ],
)
def test_bad_options_raise_op_error_naming_the_argument(kwargs, arg, match):
    with pytest.raises(OpError, match=match) as info:
        layers.rms_norm(torch.randn(2, 16), torch.ones(16), 1e-6, **kwargs)
    assert info.value.arg == arg
