"""The Triton recurrent kernels (causal_conv1d, gated_delta_rule: chunked and token by token)
against float64 recurrences written here from the spec, through Triton's interpreter on CPU tensors.

Shapes are tiny (the interpreter is slow) but cross the chunk boundaries 63/64/65/128/129.
"""

from __future__ import annotations

import math

import pytest
import torch

W_DEFAULT = 4


def _rec():
    from hetero.kernels import recurrent

    return recurrent


def _tuning(**entries):
    """The interpreter's tuning with some kernel entries replaced (small tiles, a forced kernel)."""
    from hetero.kernels.tuning import INTERPRETER, Tuning, TuningTable

    archs = {"interpreter": {k: {**INTERPRETER.get(k, {}), **v} for k, v in entries.items()}}
    return Tuning(TuningTable(vendor="test", archs=archs), "interpreter", interpreted=True)


def _batch(lens, slots, init):
    qsl = torch.tensor([0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    return qsl, torch.tensor(slots, dtype=torch.int32), torch.tensor(init, dtype=torch.bool)


# ----------------------------------------------------------------------------- float64 oracles


def conv_ref(x, weight, bias, state, qsl, slots, init, activation):
    """(out float64, new state in the state's dtype): the spec's formula, sequence by sequence."""
    out, state, w = torch.zeros(x.shape, dtype=torch.float64), state.clone(), weight.double()
    width = weight.shape[1]
    for n, p in enumerate(slots.tolist()):
        a, e = int(qsl[n]), int(qsl[n + 1])
        if p < 0 or e == a:
            continue
        prev = state[p] if init[n] else torch.zeros(width - 1, x.shape[1], dtype=x.dtype)
        xx = torch.cat([prev, x[a:e]])
        xd = xx.double()
        y = sum(w[:, j] * xd[j : j + e - a] for j in range(width)) + (bias.double() if bias is not None else 0.0)
        out[a:e] = y * torch.sigmoid(y) if activation == "silu" else y
        state[p] = xx[e - a :]
    return out, state


def delta_ref(q, k, v, g, beta, state, qsl, slots, init, scale, l2):
    """(out float64, new state float64): the spec's recurrence token by token."""
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    state = state.double().clone()
    t_, h, kd = q.shape
    hv, vd = v.shape[1:]
    out = torch.zeros(t_, hv, vd, dtype=torch.float64)
    for n, p in enumerate(slots.tolist()):
        a, e = int(qsl[n]), int(qsl[n + 1])
        if p < 0 or e == a:
            continue
        for i in range(hv):
            s = state[p, i].clone() if init[n] else torch.zeros(kd, vd, dtype=torch.float64)
            for t in range(a, e):
                qt, kt = q[t, i // (hv // h)], k[t, i // (hv // h)]
                if l2:
                    qt, kt = qt / torch.sqrt((qt * qt).sum() + 1e-6), kt / torch.sqrt((kt * kt).sum() + 1e-6)
                s = s * (torch.exp(g[t, i])[:, None] if g.ndim == 3 else torch.exp(g[t, i]))
                u = beta[t, i] * (v[t, i] - kt @ s)
                s = s + torch.outer(kt, u)
                out[t, i] = (scale * qt) @ s
            state[p, i] = s
    return out, state


def _delta_inputs(t, h=2, hv=4, kd=16, vd=16, kda=False, dtype=torch.float32, l2=True, seed=0, strong=False):
    """q, k, v as strided views of one fused projection (as a model's in_proj gives them), g, beta."""
    gen = torch.Generator().manual_seed(seed)
    fused = torch.randn(t, 2 * h * kd + hv * vd + 8, generator=gen)
    q = fused[:, : h * kd].view(t, h, kd)
    k = fused[:, h * kd : 2 * h * kd].view(t, h, kd) * (1.0 if l2 else kd**-0.5)  # unnormalized keys: |k| ~ 1
    v = fused[:, 2 * h * kd : 2 * h * kd + hv * vd].view(t, hv, vd)
    g = -torch.rand((t, hv, kd) if kda else (t, hv), generator=gen) * 0.3
    if strong:  # head 0 decays by up to e^-30 per row: exp of the chunk's cumulative sum underflows
        g[:, 0] = -torch.rand(g[:, 0].shape, generator=gen) * 30
    beta = torch.rand(t, hv, generator=gen)
    return [x.to(dtype) for x in (q, k, v)] + [g, beta.to(dtype)]


def _close(got, want, dtype):
    tol = {"atol": 3e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    torch.testing.assert_close(got.double(), want, **tol)


# ----------------------------------------------------------------------------- causal_conv1d


@pytest.mark.parametrize("width, small_tiles", [(4, False), (4, True), (2, True)])
def test_conv_varlen_matches_float64(triton_backend, width, small_tiles):
    """Sequences shorter than W-1 (old state kept), empty, skipped (-1), without initial state over NaN,
    and, with small tiles, several parts and channel blocks per sequence."""
    gen = torch.Generator().manual_seed(1)
    lens, c = [9, 1, 0, 2, 40, 3], 40
    qsl, slots, init = _batch(lens, [3, 0, 5, -1, 1, 2], [True, True, False, True, False, False])
    x = torch.randn(sum(lens), 2 * c, generator=gen)[:, ::2]  # column-strided
    weight, bias = torch.randn(c, width, generator=gen), torch.randn(c, generator=gen)
    state = torch.randn(6, width - 1, c, generator=gen)
    state[1] = state[2] = float("nan")  # slots of sequences without initial state: never read
    want, want_state = conv_ref(x, weight, bias, state, qsl, slots, init, "silu")
    tune = (
        _tuning(causal_conv1d={"BLOCK_T": 2, "BLOCK_C": 16, "TILES_PER_PROGRAM": 1})
        if small_tiles
        else triton_backend.tune
    )
    got_state = state.clone()
    out = _rec().causal_conv1d(x, weight, bias, got_state, qsl, slots, init, activation="silu", tuning=tune)
    _close(out, want, torch.float32)
    assert torch.equal(got_state, want_state)  # exact copies; slots 4 (unnamed) untouched, NaN slot 2 rewritten
    assert torch.equal(out[10:12], torch.zeros(2, c))  # the skipped sequence's rows


def test_conv_bf16_no_bias_split_into_calls(triton_backend):
    """bf16, no bias, no activation; a prefill split into calls of 5, 1, 1 rows (the last two decode
    steps with L < W-1) gives the one-pass outputs and state."""
    gen = torch.Generator().manual_seed(2)
    c, bf = 24, torch.bfloat16
    x, weight = torch.randn(7, c, generator=gen).to(bf), torch.randn(c, W_DEFAULT, generator=gen).to(bf)
    state = torch.randn(2, W_DEFAULT - 1, c, generator=gen).to(bf)
    one, s_one = _batch([7], [1], [False]), state.clone()
    want, want_state = conv_ref(x, weight, None, state, *one, None)
    got = triton_backend.causal_conv1d(x, weight, None, s_one, *one, activation=None)
    _close(got, want, bf)
    assert torch.equal(s_one, want_state)
    parts, s_split, at = [], state.clone(), 0
    for i, n in enumerate((5, 1, 1)):
        parts.append(
            triton_backend.causal_conv1d(
                x[at : at + n], weight, None, s_split, *_batch([n], [1], [i > 0]), activation=None
            )
        )
        at += n
    assert torch.equal(torch.cat(parts), got) and torch.equal(s_split, s_one)


# ----------------------------------------------------------------------------- gated_delta_rule


def _run_delta(fn, inputs, state, lens, slots, init, l2=True, **kw):
    q, k, v, g, beta = inputs
    qsl, sl, ini = _batch(lens, slots, init)
    scale = q.shape[2] ** -0.5
    want, want_state = delta_ref(q, k, v, g, beta, state, qsl, sl, ini, scale, l2)
    got_state = state.clone()
    out = fn(q, k, v, g, beta, got_state, qsl, sl, ini, scale=scale, use_qk_l2norm=l2, **kw)
    return out, got_state, want, want_state


@pytest.mark.parametrize(
    "kda, l2, dtype, gpu_tiles",
    [
        (False, True, torch.float32, False),
        (False, False, torch.float32, False),
        (True, True, torch.float32, False),
        (False, True, torch.bfloat16, False),
        (True, False, torch.float16, True),
    ],
)
def test_delta_chunked_prefill_matches_float64(triton_backend, kda, l2, dtype, gpu_tiles):
    """Lengths 63, 65, 129 (chunk boundaries 63/64/65/128/129), a one-row and an empty sequence,
    GVA 2 -> 4, with and without initial state; KDA with one strongly decaying head. Chunks of 64
    rows (the interpreter's default is 16); gpu_tiles: the portable defaults a GPU gets (BLOCK_V 32
    over V 32)."""
    from hetero.kernels.tuning import Tuning, TuningTable

    lens, vd = [63, 65, 129, 1, 0], 32 if gpu_tiles else 16
    inputs = _delta_inputs(sum(lens), vd=vd, kda=kda, dtype=dtype, l2=l2, strong=kda)
    state = torch.randn(6, 4, 16, vd, generator=torch.Generator().manual_seed(3))
    state[5] = float("nan")  # the empty sequence's slot: not read, not written
    tune = (
        Tuning(TuningTable(vendor="portable"), "generic", interpreted=True)
        if gpu_tiles
        else _tuning(gated_delta_rule={"BLOCK_T": 64})
    )
    fn = lambda *a, **kw: _rec().gated_delta_rule(*a, **kw, tuning=tune)  # noqa: E731
    out, got, want, want_state = _run_delta(
        fn, inputs, state, lens, [2, 0, 4, 1, 5], [True, False, True, True, False], l2=l2
    )
    assert out.dtype == dtype
    _close(out, want, dtype)
    torch.testing.assert_close(
        got[:5].double(), want_state[:5], atol=1e-4 if dtype == torch.float32 else 2e-2, rtol=1e-4
    )
    assert got[5].isnan().all()


@pytest.mark.parametrize("kda", [False, True])
def test_delta_decode_batch_one_launch(triton_backend, kda):
    """Every sequence one row (the token-by-token kernel), a padding slot -1 among them."""
    assert _rec()._delta_params(triton_backend.tune, 6, 6, 16)[0] == "recurrent"
    inputs = _delta_inputs(6, kda=kda, seed=4)
    state = torch.randn(7, 4, 16, 16, generator=torch.Generator().manual_seed(5))
    out, got, want, want_state = _run_delta(
        triton_backend.gated_delta_rule, inputs, state, [1] * 6, [6, 0, -1, 3, 2, 5], [True] * 6
    )
    _close(out, want, torch.float32)
    torch.testing.assert_close(got.double(), want_state, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[2], torch.zeros(4, 16)) and torch.equal(got[[1, 4]], state[[1, 4]])  # skipped, unnamed


@pytest.mark.parametrize("rows", [10**6, 0])
def test_delta_either_kernel_on_any_batch(rows):
    """The token-by-token kernel on a varlen prefill and the chunked one on a decode batch (the
    choice is only speed): both hold to the recurrence."""
    tune = _tuning(gated_delta_rule={"RECURRENT_ROWS": rows, "BLOCK_V": 16})  # BLOCK_V 16: two V blocks
    lens = [3, 70] if rows else [1, 1, 1]
    inputs = _delta_inputs(sum(lens), vd=32, kda=bool(rows), seed=6)
    state = torch.randn(3, 4, 16, 32, generator=torch.Generator().manual_seed(7))
    fn = lambda *a, **kw: _rec().gated_delta_rule(*a, **kw, tuning=tune)  # noqa: E731
    out, got, want, want_state = _run_delta(
        fn, inputs, state, lens, [2, 0, 1][: len(lens)], [True, False, True][: len(lens)]
    )
    _close(out, want, torch.float32)
    torch.testing.assert_close(got.double(), want_state, atol=1e-4, rtol=1e-4)


def test_delta_chunked_prefill_carries_state(triton_backend):
    """150 rows in one call equal 70 + 79 rows in two calls then one decode row, state carried by the slot."""
    inputs = _delta_inputs(150, seed=8)
    state = torch.full((2, 4, 16, 16), float("nan"))
    one, s_one = _batch([150], [1], [False]), state.clone()
    scale = 0.25
    want = triton_backend.gated_delta_rule(*inputs, s_one, *one, scale=scale)
    s_split, outs, at = state.clone(), [], 0
    for i, n in enumerate((70, 79, 1)):
        outs.append(
            triton_backend.gated_delta_rule(
                *(x[at : at + n] for x in inputs), s_split, *_batch([n], [1], [i > 0]), scale=scale
            )
        )
        at += n
    torch.testing.assert_close(torch.cat(outs), want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(s_split[1], s_one[1], atol=2e-5, rtol=1e-4)
    assert s_split[0].isnan().all() and s_one[0].isnan().all()  # the other slot: never read or written


def test_zero_tokens_touch_nothing(triton_backend):
    state, conv = torch.randn(2, 4, 16, 16), torch.randn(2, W_DEFAULT - 1, 8)
    s0, c0 = state.clone(), conv.clone()
    idx = _batch([0, 0], [0, 1], [False, True])
    out = triton_backend.gated_delta_rule(*_delta_inputs(0), state, *idx, scale=0.25)
    assert out.shape == (0, 4, 16) and torch.equal(state, s0)
    y = triton_backend.causal_conv1d(torch.randn(0, 8), torch.randn(8, W_DEFAULT), None, conv, *idx)
    assert y.shape == (0, 8) and torch.equal(conv, c0)


# ----------------------------------------------------------------------------- memory safety, binding


def _guarded(shape, fill, guard):
    """A tensor of ``shape`` inside a bigger one whose first and last 64 elements hold ``guard``."""
    n = math.prod(shape)
    buf = torch.full((n + 128,), guard)
    buf[64 : 64 + n] = fill.reshape(-1)
    return buf, buf[64 : 64 + n].view(shape)


def test_malformed_indices_stay_inside_the_tensors():
    """Validation off (the kernel modules read no index on the host): query_start_loc past T,
    negative or decreasing, slots past S or below -1. Inputs sit between NaN guards, states
    between sentinel guards: no read of a guard (states stay finite), no write to one."""
    rec = _rec()
    tune = _tuning()
    qsl = torch.tensor([-5, 4, 2, 10**6, 7], dtype=torch.int32)
    slots = torch.tensor([0, 10**6, -7, 1], dtype=torch.int32)
    init = torch.tensor([True, True, True, True])
    for kind in ("recurrent", "chunked"):
        q, k, v, g, beta = (_guarded(x.shape, x, float("nan"))[1] for x in _delta_inputs(7, seed=9))
        sbuf, state = _guarded((2, 4, 16, 16), torch.randn(2, 4, 16, 16), 7.0)
        tune = _tuning(gated_delta_rule={"RECURRENT_ROWS": 10**6 if kind == "recurrent" else 0})
        rec.gated_delta_rule(q, k, v, g, beta, state, qsl, slots, init, scale=0.25, tuning=tune)
        assert (sbuf[:64] == 7).all() and (sbuf[-64:] == 7).all() and state.isfinite().all(), kind
    x = _guarded((7, 8), torch.randn(7, 8), float("nan"))[1]
    cbuf, conv = _guarded((2, W_DEFAULT - 1, 8), torch.randn(2, W_DEFAULT - 1, 8), 7.0)
    rec.causal_conv1d(x, torch.randn(8, W_DEFAULT), None, conv, qsl, slots, init, activation="silu", tuning=tune)
    assert (cbuf[:64] == 7).all() and (cbuf[-64:] == 7).all() and conv.isfinite().all()


def test_chunk_halves_while_shared_memory_lacks(monkeypatch):
    """A device without the shared memory for chunk 64 (sm86/89) gets 32, and the next call goes straight there."""
    from triton.runtime.errors import OutOfResources

    rec, tried = _rec(), []

    class Fake:
        def __getitem__(self, grid):
            def launch(*args, BT, LOG_BT, **kw):
                tried.append((BT, LOG_BT))
                if BT > 32:
                    raise OutOfResources(131072, 101376, "shared memory")

            return launch

    monkeypatch.setattr(rec.chunk, "gdn_chunk_kernel", Fake())
    monkeypatch.setattr(rec, "_FITTED_CHUNK", {})
    consts = {"BT": 64, "LOG_BT": 6, "BV": 32}
    for _ in range(2):
        rec._launch_chunked((1, 1, 1), (), dict(consts), {}, torch.device("cuda", 0))
    assert tried == [(64, 6), (32, 5), (32, 5)]
    from hetero.kernels.tuning import Tuning, TuningTable

    assert rec._delta_params(_tuning(), 9, 2, 16)[1]["DOT_PREC"] == "ieee"  # interpreted: plain float32
    assert rec._delta_params(Tuning(TuningTable(vendor="nvidia"), "sm90"), 9, 2, 16)[1]["DOT_PREC"] == "tf32x3"


def test_backend_binds_and_declines(triton_backend):
    from hetero.spec import OPS

    for op in ("causal_conv1d", "gated_delta_rule"):
        assert op in type(triton_backend).native_ops()
        assert OPS[op].check_signature(getattr(triton_backend, op)) is None
        assert triton_backend.supports(op, dtype=torch.bfloat16, head_dim=128) is None
    assert "float64" in triton_backend.supports("gated_delta_rule", dtype=torch.float64)
    assert "256" in triton_backend.supports("gated_delta_rule", dtype="bfloat16", head_dim=512)
