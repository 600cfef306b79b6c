"""Triton recurrent ops: causal_conv1d and gated_delta_rule (Gated DeltaNet and KDA).

Semantics: ``hetero.spec.recurrent``. Only the cheap checks run here (ranks, dtypes, shapes,
devices, options; ``hetero.spec._checks_recurrent``); no index value is read on the host, so
no call synchronizes with the device. The kernels mask every index they load.

Launch shapes (what a GPU runs), one launch per call, prefill, chunked prefill and decode alike:

* causal_conv1d: grid (N, ceil(C / BLOCK_C), parts). Each sequence's rows are cut into
  ``parts`` runs of whole ``BLOCK_T``-row tiles, parts = ceil(mean rows / (BLOCK_T *
  TILES_PER_PROGRAM)) (1 for decode), so a prefill spreads over the GPU while a program still
  streams several tiles. ``BLOCK_T`` shrinks to the mean sequence length (decode: tiles of
  W-1 rows), never below W-1: only part 0 reads and writes the state slot (see the kernels).
* gated_delta_rule: grid (N, HV, ceil(V / BLOCK_V)). When T <= N * RECURRENT_ROWS (decode:
  one row per sequence) the token-by-token kernel runs, otherwise the chunked one (chunks of
  ``BLOCK_T`` rows, 64 by default, as fla and vLLM use). Both keep the state block in
  registers from the sequence's first row to its last and write it once. A chunk of 64 needs
  about 130 KB of shared memory on sm90 (compiled here without a GPU): where the device has
  less (sm86/89 parts), the launch fails with OutOfResources and is retried with half the
  chunk, down to 16, remembered per device and configuration.

Per-token state slots [N, M] (spec 1.11, speculative decoding's verify calls of at most M rows per
sequence): causal_conv1d runs one part per sequence, gated_delta_rule always the token-by-token
kernel, which stores the state after every row; the [N] launches are unchanged.

Tuning entries: "causal_conv1d" (BLOCK_T, BLOCK_C, TILES_PER_PROGRAM, num_warps),
"gated_delta_rule" (chunked: BLOCK_T, BLOCK_V, DOT_PREC, RECURRENT_ROWS, num_warps,
num_stages) and "gated_delta_rule_decode" (BLOCK_V, num_warps). DOT_PREC, when the entry has
none: "tf32x3" on NVIDIA (three TF32 products on tensor cores, float32 accuracy; Triton lowers
an "ieee" float32 dot to FMA loops that spill heavily there), "ieee" elsewhere and under the
interpreter.
"""

from __future__ import annotations

import math

import torch

from hetero.kernels import _recurrent_chunk_kernels as chunk
from hetero.kernels import _recurrent_kernels as kern
from hetero.kernels._rounding import rne_bf16
from hetero.kernels._triton import triton_modules
from hetero.kernels.tuning import Tuning
from hetero.spec._checks_recurrent import L2NORM_EPS, check_causal_conv1d, check_gated_delta_rule
from hetero.spec._checks_token_slots import check_num_accepted_tokens
from hetero.spec.checks import expect

triton, tl = triton_modules()

__all__ = ["causal_conv1d", "gated_delta_rule"]

_DOT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _pow2(n: int, least: int = 1) -> int:
    return max(least, triton.next_power_of_2(max(int(n), 1)))


def _index(*tensors: torch.Tensor) -> list[torch.Tensor]:
    # [N+1] / [N] / [N, M] metadata: contiguous in practice (a no-op); has_initial_state read as bytes
    return [t.contiguous().view(torch.uint8) if t.dtype == torch.bool else t.contiguous() for t in tensors]


def _token_args(op: str, state_slots: torch.Tensor, accepted: torch.Tensor | None) -> tuple[dict, int, torch.Tensor]:
    """(the per-token constexprs, M, the num_accepted_tokens pointer): M = 1 and no tensor for [N] slots."""
    check_num_accepted_tokens(op, state_slots, accepted)
    per_token = state_slots.ndim == 2
    m = state_slots.shape[1] if per_token else 1
    consts = {"PER_TOKEN": per_token, "HAS_ACCEPTED": accepted is not None}
    return consts, m, accepted.contiguous() if accepted is not None else state_slots


# ----------------------------------------------------------------------------- causal_conv1d


def _conv_tiles(tuning: Tuning, tokens: int, seqs: int, width: int, channels: int) -> tuple[dict, dict, int]:
    """(tile constexprs, launch options, parts per sequence)."""
    meta, launch = Tuning.launch_options(tuning("causal_conv1d"))
    mean = -(-tokens // seqs)
    block_t = max(_pow2(width - 1, 2), min(_pow2(meta.get("BLOCK_T", 64)), _pow2(mean)))
    block_c = min(_pow2(meta.get("BLOCK_C", 128), 16), _pow2(channels, 16))
    parts = max(1, -(-mean // (block_t * int(meta.get("TILES_PER_PROGRAM", 4)))))
    return {"BLOCK_T": block_t, "BLOCK_C": block_c}, launch, min(parts, 65535)


def causal_conv1d(
    x,
    weight,
    bias,
    conv_state,
    query_start_loc,
    state_slots,
    has_initial_state,
    *,
    activation="silu",
    plan=None,
    num_accepted_tokens=None,
    tuning: Tuning,
) -> torch.Tensor:
    """``hetero.spec.recurrent.causal_conv1d``: one launch for the whole batch."""
    op = "causal_conv1d"
    t, c, w, s = check_causal_conv1d(
        op, x, weight, bias, conv_state, query_start_loc, state_slots, has_initial_state, activation
    )
    per_token, m, accepted = _token_args(op, state_slots, num_accepted_tokens)
    n = query_start_loc.shape[0] - 1
    out = torch.empty(t, c, dtype=x.dtype, device=x.device)
    if t == 0 or c == 0 or n == 0:
        return out.zero_()
    qsl, slots, init = _index(query_start_loc, state_slots, has_initial_state)
    tiles, launch, parts = _conv_tiles(tuning, t, n, w, c)
    if per_token["PER_TOKEN"]:  # one program per sequence and channel block writes all its states
        parts = 1
    grid = (n, triton.cdiv(c, tiles["BLOCK_C"]), parts)
    kern.causal_conv1d_kernel[grid](
        x, weight, bias if bias is not None else weight, conv_state, out, qsl, slots, init, accepted,
        *x.stride(), *weight.stride(), *conv_state.stride(), *out.stride(),
        t, s, c, m,
        W=w, W1_P=_pow2(w - 1), HAS_BIAS=bias is not None, SILU=activation == "silu",
        ACC=tl.float64 if x.dtype == torch.float64 else tl.float32, RNE_BF16=rne_bf16(x.dtype, tuning),
        **tiles, **per_token, **launch,
    )  # fmt: skip
    return out


# ----------------------------------------------------------------------------- gated_delta_rule


def _delta_params(tuning: Tuning, tokens: int, seqs: int, vdim: int, per_token: bool = False) -> tuple[str, dict, dict]:
    """(kernel name, constexprs, launch options): the token-by-token kernel for decode-like
    batches (T <= N * RECURRENT_ROWS) and per-token slots, the chunked kernel otherwise."""
    chunked, launch = Tuning.launch_options(tuning("gated_delta_rule"))
    if per_token or tokens <= seqs * int(chunked.get("RECURRENT_ROWS", 1)):
        meta, launch = Tuning.launch_options(tuning("gated_delta_rule_decode"))
        return "recurrent", {"BV": min(_pow2(meta.get("BLOCK_V", 32), 16), _pow2(vdim, 16))}, launch
    bt = _pow2(chunked.get("BLOCK_T", 64), 16)  # tl.dot needs 16 on every dimension
    nvidia = tuning.table.vendor == "nvidia" and not tuning.interpreted
    consts = {
        "BV": min(_pow2(chunked.get("BLOCK_V", 32), 16), _pow2(vdim, 16)),
        "BT": bt,
        "LOG_BT": int(math.log2(bt)),
        "DOT_PREC": str(chunked.get("DOT_PREC") or ("tf32x3" if nvidia else "ieee")),
    }
    return "chunked", consts, launch


#: (device, constexprs) -> the chunk that fitted its shared memory, when the tuned one did not
_FITTED_CHUNK: dict[tuple, int] = {}


def _launch_chunked(grid: tuple, args: tuple, consts: dict, launch: dict, device: torch.device) -> None:
    """The chunked kernel, its chunk halved (down to 16) while the device lacks the shared memory for it."""
    key = (str(device), tuple(sorted(consts.items())))
    bt = _FITTED_CHUNK.get(key, consts["BT"])
    while True:
        try:
            chunk.gdn_chunk_kernel[grid](*args, **{**consts, "BT": bt, "LOG_BT": int(math.log2(bt))}, **launch)
            break
        except triton.runtime.errors.OutOfResources:
            if bt <= 16:
                raise
            bt //= 2
    if bt != consts["BT"]:
        _FITTED_CHUNK[key] = bt


def gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    ssm_state,
    query_start_loc,
    state_slots,
    has_initial_state,
    *,
    scale,
    use_qk_l2norm=True,
    plan=None,
    num_accepted_tokens=None,
    tuning: Tuning,
) -> torch.Tensor:
    """``hetero.spec.recurrent.gated_delta_rule``: one launch for the whole batch, chunked or token by token."""
    op = "gated_delta_rule"
    t, h, kdim, hv, vdim, s = check_gated_delta_rule(
        op, q, k, v, g, beta, ssm_state, query_start_loc, state_slots, has_initial_state, scale, use_qk_l2norm
    )
    expect(
        q.dtype in _DOT_DTYPES,
        op,
        "q",
        "dtype float16, bfloat16 or float32 (the Triton kernels have no float64 path)",
        str(q.dtype).replace("torch.", ""),
    )
    per_token, m, accepted = _token_args(op, state_slots, num_accepted_tokens)
    n = query_start_loc.shape[0] - 1
    out = torch.empty(t, hv, vdim, dtype=v.dtype, device=v.device)
    if t == 0 or n == 0 or hv == 0 or vdim == 0:
        return out.zero_()
    qsl, slots, init = _index(query_start_loc, state_slots, has_initial_state)
    which, consts, launch = _delta_params(tuning, t, n, vdim, per_token["PER_TOKEN"])
    kda = g.ndim == 3
    sg = (*g.stride(), 0) if not kda else g.stride()  # per head: no key-channel stride
    grid = (n, hv, triton.cdiv(vdim, consts["BV"]))
    args = (
        q,
        k,
        v,
        g,
        beta,
        ssm_state,
        out,
        qsl,
        slots,
        init,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *sg,
        *beta.stride(),
        *ssm_state.stride(),
        *out.stride(),
        float(scale),
        L2NORM_EPS,
        t,
        s,
    )
    consts.update(
        GROUP=hv // h,
        K=kdim,
        V=vdim,
        K_P=_pow2(kdim, 16),
        KDA=kda,
        L2NORM=use_qk_l2norm,
        RNE_BF16=rne_bf16(v.dtype, tuning),
    )
    if which == "recurrent":
        head, tail = args[:10], args[10:]  # the per-token pointer after the index tensors, M after the sizes
        kern.gdn_recurrent_kernel[grid](*head, accepted, *tail, m, **consts, **per_token, **launch)
    else:
        _launch_chunked(grid, args, consts, launch, v.device)
    return out
