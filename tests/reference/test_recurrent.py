"""The reference recurrent ops (causal_conv1d, gated_delta_rule) against independent formulations.

The independent sides: float64 recurrences written here in another form (the convolution as a
sliding window updated token by token; the delta rule per value head with explicit K x V
matrices), and transformers' own torch reference functions (Qwen3-Next's causal conv prefill
and update paths, its recurrent and chunked gated delta rule, Kimi-Linear's KDA).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hetero.errors import OpError
from hetero.spec import recurrent as spec_recurrent
from hetero.spec import validate
from hetero_cpu_ref import recurrent

ALL = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def index(lens, slots, initial):
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    return (
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor(slots, dtype=torch.int32),
        torch.tensor(initial, dtype=torch.bool),
    )


@pytest.mark.parametrize("name", ["causal_conv1d", "gated_delta_rule"])
def test_signature_matches_spec(name):
    assert getattr(spec_recurrent, name).__hetero_op__.check_signature(getattr(recurrent, name)) is None


# --------------------------------------------------------------------------- independent float64 forms


def conv_f64(x, weight, bias, state, lens, slots, initial, activation):
    """Per sequence a window of the last W-1 inputs, slid one token at a time. Returns (out, new state)."""
    x, weight, state = x.double(), weight.double(), state.double().clone()
    c, w = weight.shape
    out = torch.zeros_like(x)
    start = 0
    for n, (count, slot) in enumerate(zip(lens, slots)):
        if slot < 0 or count == 0:
            start += count
            continue
        zero = torch.zeros(c, dtype=torch.float64)
        window = [state[slot, j].clone() if initial[n] else zero for j in range(w - 1)]
        for t in range(start, start + count):
            window.append(x[t])
            y = sum(weight[:, j] * window[j] for j in range(w))
            if bias is not None:
                y = y + bias.double()
            out[t] = y * torch.sigmoid(y) if activation == "silu" else y
            window.pop(0)
        state[slot] = torch.stack(window)
        start += count
    return out, state


def gdr_f64(q, k, v, g, beta, state, lens, slots, initial, scale, l2norm):
    """Per sequence, per value head, per token, with S an explicit K x V float64 matrix."""
    q, k, v, g, beta, state = (t.double() for t in (q, k, v, g, beta, state))
    state = state.clone()
    t_all, h, kd = q.shape
    hv, vd = v.shape[1], v.shape[2]
    out = torch.zeros(t_all, hv, vd, dtype=torch.float64)
    start = 0
    for n, (count, slot) in enumerate(zip(lens, slots)):
        if slot < 0 or count == 0:
            start += count
            continue
        for i in range(hv):
            kh = i // (hv // h)
            s = state[slot, i].clone() if initial[n] else torch.zeros(kd, vd, dtype=torch.float64)
            for t in range(start, start + count):
                qt, kt = q[t, kh], k[t, kh]
                if l2norm:
                    qt, kt = qt / torch.sqrt(qt @ qt + 1e-6), kt / torch.sqrt(kt @ kt + 1e-6)
                decay = torch.exp(g[t, i])
                s = torch.diag(decay) @ s if g.ndim == 3 else decay * s
                u = beta[t, i] * (v[t, i] - s.T @ kt)
                s = s + torch.outer(kt, u)
                out[t, i] = s.T @ (scale * qt)
            state[slot, i] = s
        start += count
    return out, state


# --------------------------------------------------------------------------- inputs


def conv_args(seed, lens, slots, initial, *, c=24, w=4, num_slots=5, dtype=torch.float64, bias=True, activation="silu"):
    g = gen(seed)
    qsl, sl, his = index(lens, slots, initial)
    return dict(
        x=randn(g, sum(lens), c, dtype=dtype),
        weight=randn(g, c, w, dtype=dtype, scale=0.5),
        bias=randn(g, c, dtype=dtype) if bias else None,
        conv_state=randn(g, num_slots, w - 1, c, dtype=dtype),
        query_start_loc=qsl,
        state_slots=sl,
        has_initial_state=his,
        activation=activation,
    )


def gdr_args(
    seed, lens, slots, initial, *, h=2, kd=8, hv=4, vd=6, num_slots=5, dtype=torch.float64, kda=False, l2norm=True
):
    g = gen(seed)
    t = sum(lens)
    qsl, sl, his = index(lens, slots, initial)
    gate_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    decay = -F.softplus(randn(g, *((t, hv, kd) if kda else (t, hv)), dtype=torch.float64)) * 0.3
    k_scale = 1.0 if l2norm else kd**-0.5  # without the norm, keep |k| near 1 so the recurrence stays stable
    return dict(
        q=randn(g, t, h, kd, dtype=dtype),
        k=randn(g, t, h, kd, dtype=dtype, scale=k_scale),
        v=randn(g, t, hv, vd, dtype=dtype),
        g=decay.to(gate_dtype),
        beta=torch.sigmoid(randn(g, t, hv, dtype=torch.float64)).to(gate_dtype),
        ssm_state=randn(g, num_slots, hv, kd, vd, dtype=gate_dtype, scale=0.5),
        query_start_loc=qsl,
        state_slots=sl,
        has_initial_state=his,
        scale=kd**-0.5,
        use_qk_l2norm=l2norm,
    )


def conv_expected(a, lens, slots, initial):
    return conv_f64(a["x"], a["weight"], a["bias"], a["conv_state"], lens, slots, initial, a["activation"])


def gdr_expected(a, lens, slots, initial):
    return gdr_f64(
        a["q"], a["k"], a["v"], a["g"], a["beta"], a["ssm_state"], lens, slots, initial, a["scale"], a["use_qk_l2norm"]
    )


def clone(a):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in a.items()}


# One varlen batch: a long prefill without state, a chunk continuing a state, decodes, a sequence
# shorter than W-1, an empty one, and a padding slot.
LENS, SLOTS, INITIAL = [9, 5, 1, 1, 2, 0, 3], [3, 0, 4, 1, 2, 2, -1], [False, True, True, True, True, True, False]


# --------------------------------------------------------------------------- against float64 recurrences


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("bias, activation", [(True, "silu"), (False, None)])
def test_conv_matches_f64_window(width, bias, activation):
    a = conv_args(1, LENS, SLOTS, INITIAL, w=width, bias=bias, activation=activation)
    want, want_state = conv_expected(a, LENS, SLOTS, INITIAL)
    got = recurrent.causal_conv1d(**a)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(a["conv_state"], want_state)  # the state is copies of inputs: exact


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("l2norm", [True, False])
def test_gdr_matches_f64_recurrence(kda, ratio, l2norm):
    a = gdr_args(2, LENS, SLOTS, INITIAL, h=2, hv=2 * ratio, kda=kda, l2norm=l2norm)
    want, want_state = gdr_expected(a, LENS, SLOTS, INITIAL)
    got = recurrent.gated_delta_rule(**a)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(a["ssm_state"], want_state, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", ALL[1:])
def test_low_precision_dtypes(dtype):
    """Outputs in the input dtype, states in theirs, within a rounding of the float64 result."""
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}[dtype]
    a = conv_args(3, LENS, SLOTS, INITIAL, dtype=dtype)
    want, want_state = conv_expected(a, LENS, SLOTS, INITIAL)
    got = recurrent.causal_conv1d(**a)
    assert got.dtype == dtype and a["conv_state"].dtype == dtype
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    assert torch.equal(a["conv_state"].double(), want_state)
    b = gdr_args(4, LENS, SLOTS, INITIAL, dtype=dtype, kda=True)
    want, want_state = gdr_expected(b, LENS, SLOTS, INITIAL)
    got = recurrent.gated_delta_rule(**b)
    assert got.dtype == dtype and b["ssm_state"].dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(b["ssm_state"].double(), want_state, rtol=1e-5, atol=1e-5)  # float32 from exact inputs


# --------------------------------------------------------------------------- against transformers


def _hf(module: str, name: str):
    mod = pytest.importorskip(f"transformers.models.{module}")
    fn = getattr(mod, name, None)
    if fn is None:
        pytest.skip(f"{module}.{name} not in this transformers")
    return getattr(fn, "__wrapped__", fn)  # the torch function itself, not a hub kernel or fla


def test_conv_matches_transformers_prefill_then_update():
    """Qwen3-Next's causal_conv1d_fn (a prefill from zeros) then causal_conv1d_update (decode
    steps over its W-wide state, whose oldest column is never read)."""
    conv_fn = _hf("qwen3_next.modeling_qwen3_next", "causal_conv1d_fn")
    conv_update = _hf("qwen3_next.modeling_qwen3_next", "causal_conv1d_update")
    c, w, n = 32, 4, 11
    a = conv_args(5, [n], [1], [False], c=c, w=w, dtype=torch.float32, bias=False)
    x = a["x"]
    got = recurrent.causal_conv1d(**a)
    want = conv_fn(x.T[None], a["weight"], None, activation="silu")[0].T
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    hf_state = F.pad(x.T[None], (w - x.shape[0], 0)) if x.shape[0] < w else x.T[None, :, -w:].clone()
    torch.testing.assert_close(a["conv_state"][1], hf_state[0, :, 1:].T, rtol=0, atol=0)
    for step in range(3):
        xt = randn(gen(10 + step), 1, c)
        qsl, sl, his = index([1], [1], [True])
        got = recurrent.causal_conv1d(xt, a["weight"], None, a["conv_state"], qsl, sl, his, activation="silu")
        want = conv_update(xt.T[None], hf_state, a["weight"], None, activation="silu")[0].T
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(a["conv_state"][1], hf_state[0, :, 1:].T, rtol=0, atol=0)


def _hf_gdr(fn, a, lens, initial_state, **kw):
    """Run a transformers [B, T, H, K] function one sequence at a time; returns (out, final states)."""
    outs, states, start = [], [], 0
    for n, count in enumerate(lens):
        sl = slice(start, start + count)
        o, s = fn(
            a["q"][None, sl],
            a["k"][None, sl],
            a["v"][None, sl],
            a["g"][None, sl],
            a["beta"][None, sl],
            initial_state=initial_state[n : n + 1],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            **kw,
        )
        outs.append(o[0])
        states.append(s[0])
        start += count
    return torch.cat(outs), torch.stack(states)


@pytest.mark.parametrize(
    "name, kw", [("torch_recurrent_gated_delta_rule", {}), ("torch_chunk_gated_delta_rule", {"chunk_size": 64})]
)
@pytest.mark.parametrize("ratio", [1, 2, 4])
def test_gdr_matches_transformers_qwen3_next(name, kw, ratio):
    """Sequences across the 64-row chunk boundary, from a state and from zeros, GVA ratio 1/2/4."""
    fn = _hf("qwen3_next.modeling_qwen3_next", name)
    lens = [70, 1, 37]
    a = gdr_args(6, lens, [2, 0, 1], [True, True, False], h=2, kd=16, hv=2 * ratio, vd=8, dtype=torch.float32)
    init = a["ssm_state"][[2, 0, 1]].clone()
    init[2] = 0  # has_initial_state False: the run starts from zeros
    want, want_state = _hf_gdr(fn, a, lens, init, **kw)
    got = recurrent.gated_delta_rule(**a)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(a["ssm_state"][[2, 0, 1]], want_state, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["recurrent_kimi_delta_attention", "chunk_kimi_delta_attention"])
def test_kda_matches_transformers_kimi_linear(name):
    """Kimi-Linear's KDA: g per key channel, H = HV."""
    fn = _hf("kimi_linear.modeling_kimi_linear", name)
    lens = [67, 3]
    a = gdr_args(7, lens, [0, 1], [True, True], h=3, kd=16, hv=3, vd=16, dtype=torch.float32, kda=True)
    want, want_state = _hf_gdr(fn, a, lens, a["ssm_state"][:2].clone())
    got = recurrent.gated_delta_rule(**a)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(a["ssm_state"][:2], want_state, rtol=2e-5, atol=2e-5)


# --------------------------------------------------------------------------- state carried between calls

OPS = {
    "causal_conv1d": (recurrent.causal_conv1d, conv_args, "conv_state", ("x",)),
    "gated_delta_rule": (recurrent.gated_delta_rule, gdr_args, "ssm_state", ("q", "k", "v", "g", "beta")),
}


def _rows(a, rows: slice, per_token, lens, slots, initial):
    """The call of `a` restricted to `rows` of its (single) sequence."""
    b = {k: (v[rows] if k in per_token else v) for k, v in a.items()}
    b["query_start_loc"], b["state_slots"], b["has_initial_state"] = index(lens, slots, initial)
    return b


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunked_prefill_equals_one_pass_and_decode_continues(op, dtype):
    """A 40-row prefill in chunks 17 + 1 + 22 carrying the slot, then 3 decode steps, equals one call on all 43 rows."""
    fn, make, state, per_token = OPS[op]
    a = make(8, [43], [2], [False], dtype=dtype)
    whole = clone(a)
    want = fn(**whole)
    outs, start = [], 0
    for n, first in ((17, True), (1, False), (22, False), (1, False), (1, False), (1, False)):
        outs.append(fn(**_rows(a, slice(start, start + n), per_token, [n], [2], [not first])))
        start += n
    # the same recurrence in the same order: float32 differs at most by vectorized-versus-scalar silu/exp paths
    tol = 0 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(torch.cat(outs), want, rtol=tol, atol=tol)
    torch.testing.assert_close(a[state], whole[state], rtol=tol, atol=tol)


@pytest.mark.parametrize("op", OPS)
def test_no_initial_state_never_reads_the_slot(op):
    """has_initial_state False over a NaN-filled slot: as from zeros, the slot overwritten."""
    fn, make, state, _ = OPS[op]
    a = make(9, [4, 3], [1, 3], [False, True])
    zeros = clone(a)
    zeros[state][1] = 0
    a[state][1] = float("nan")
    got, want = fn(**a), fn(**zeros)
    assert torch.equal(got, want) and torch.equal(a[state], zeros[state])


@pytest.mark.parametrize("op", OPS)
def test_padding_slot_and_empty_sequence_are_skipped(op):
    """Slot -1: rows 0, no state touched; an empty sequence on a real slot: that slot untouched."""
    fn, make, state, _ = OPS[op]
    a = make(10, [3, 2, 0, 2], [-1, 0, 4, -1], [True, True, False, False])
    before = a[state].clone()
    got = fn(**a)
    assert torch.equal(got[:3], torch.zeros_like(got[:3])) and torch.equal(got[5:], torch.zeros_like(got[5:]))
    assert got[3:5].abs().sum() > 0
    untouched = [s for s in range(before.shape[0]) if s != 0]
    assert torch.equal(a[state][untouched], before[untouched])
    assert not torch.equal(a[state][0], before[0])


@pytest.mark.parametrize("op", OPS)
def test_no_tokens(op):
    fn, make, state, per_token = OPS[op]
    a = make(11, [0, 0], [0, 1], [False, True])
    before = a[state].clone()
    got = fn(**a)
    assert got.shape[0] == 0 and torch.equal(a[state], before)
    b = make(11, [], [], [])
    assert fn(**b).shape[0] == 0 and torch.equal(b[state], before)


# --------------------------------------------------------------------------- malformed input


def _bad(a, **changes):
    b = clone(a)
    b.update(changes)
    return b


def test_shape_and_dtype_errors():
    a = conv_args(12, [3, 2], [0, 1], [True, False], dtype=torch.float32)
    cases = [
        (_bad(a, weight=a["weight"][:, :1]), "W >= 2"),
        (_bad(a, weight=a["weight"].double()), "dtype float32"),
        (_bad(a, conv_state=a["conv_state"][:, :2]), "conv_state"),
        (_bad(a, bias=a["bias"][:3]), "bias"),
        (_bad(a, activation="gelu"), "'silu' or None"),
        (_bad(a, has_initial_state=a["has_initial_state"].int()), "has_initial_state"),
        (_bad(a, state_slots=a["state_slots"][:1]), "state_slots"),
    ]
    for args, text in cases:
        with pytest.raises(OpError, match=text):
            recurrent.causal_conv1d(**args)
    b = gdr_args(12, [3, 2], [0, 1], [True, False], dtype=torch.float32)
    cases = [
        (_bad(b, v=b["v"][:, :3]), "multiple of the 2 key heads"),
        (_bad(b, k=b["k"].half()), "dtype float32"),
        (_bad(b, g=b["g"][:, :, None]), r"per head\) or"),
        (_bad(b, g=b["g"].half()), "dtype float32"),
        (_bad(b, beta=b["beta"].half()), "beta"),
        (_bad(b, ssm_state=b["ssm_state"].bfloat16()), "ssm_state"),
        (_bad(b, ssm_state=b["ssm_state"][..., :2]), "ssm_state"),
        (_bad(b, scale=float("nan")), "finite"),
        (_bad(b, use_qk_l2norm=1), "a bool"),
    ]
    for args, text in cases:
        with pytest.raises(OpError, match=text):
            recurrent.gated_delta_rule(**args)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(
    "qsl, slots, text",
    [
        ([0, 3, 2, 5], [0, 1, 2], "non-decreasing"),
        ([1, 3, 4, 5], [0, 1, 2], "first entry 0"),
        ([0, 2, 3, 4], [0, 1, 2], "token count 5"),
        ([0, 2, 3, 5], [0, 5, 2], r"slots in \[-1, 5\)"),
        ([0, 2, 3, 5], [0, -2, 2], r"slots in \[-1, 5\)"),
    ],
)
def test_index_contents_are_checked(op, qsl, slots, text):
    """The reference and hetero.spec.validate refuse the same malformed index tensors."""
    fn, make, _, _ = OPS[op]
    a = make(13, [2, 1, 2], [0, 1, 2], [True, True, True], dtype=torch.float32)
    a["query_start_loc"] = torch.tensor(qsl, dtype=torch.int32)
    a["state_slots"] = torch.tensor(slots, dtype=torch.int32)
    for check in (fn, validate.VALIDATORS[op]):
        with pytest.raises(OpError, match=text):
            check(**a)
    a = make(13, [2, 1, 2], [0, 1, 2], [True, True, True], dtype=torch.float32)
    assert validate.VALIDATORS[op](**a) is None


@pytest.mark.parametrize("op", OPS)
def test_ascend_declines_with_a_reason(op):
    """No torch_npu operator is documented for either op: ascend leaves them to the reference, saying why."""
    support = pytest.importorskip("hetero_ascend.support")
    for triton_ok in (False, True):
        why = support.reason(op, {"dtype": "bfloat16"}, triton_ok)
        assert why and "torch_npu" in why and "never run on an NPU" in why
